//! Replays every task's gold actions through the retail world's tools and the scripted
//! customer (the oracle policy: it asks for the customer's details, asks for confirmation
//! before each write, says what must be communicated), prints each task's reward and the
//! total, and with `--dump-db` writes each task's final database as one JSON line
//! (`{"task_id": ..., "db": {...}}`) to compare with the benchmark's own implementation.
//! `db.json`, `policy.md` and `split_tasks.json` are read from the task file's folder; every
//! task of the file is checked, whatever its split.
//!
//! Each task runs twice: once through the agent loop (`run_episode` under H0), whose reward
//! is printed, and once call by call on a session, whose final database is dumped; a task
//! counts as reproduced when both score 1.
//!
//! ```text
//! cargo run --release -p harness-envs --example tau_check -- "$(scripts/fetch-data.sh tau2-retail)/tasks.json" --dump-db /tmp/tau.jsonl
//! ```

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use harness_core::{
    ActionParser, EnvSession, Outcome, ParsedAction, Split, Task, ToolCallParser, run_episode,
};
use harness_envs::tau_retail::{self, OraclePolicy, TauRetail};

fn main() -> ExitCode {
    match futures::executor::block_on(run()) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(2)
        }
    }
}

async fn run() -> Result<bool> {
    let mut args = std::env::args().skip(1);
    let mut tasks_file: Option<PathBuf> = None;
    let mut dump: Option<PathBuf> = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--dump-db" => dump = Some(args.next().context("--dump-db needs a file")?.into()),
            other if other.starts_with("--") => bail!("unknown flag {other}"),
            other => tasks_file = Some(other.into()),
        }
    }
    let Some(tasks_file) = tasks_file else {
        bail!("usage: tau_check <tasks.json> [--dump-db <file>]");
    };
    let env = load(&tasks_file)?;
    let h0 = env.base_harness();
    let mut out = match &dump {
        Some(path) => Some(std::io::BufWriter::new(
            std::fs::File::create(path).with_context(|| path.display().to_string())?,
        )),
        None => None,
    };
    let (mut solved, mut total) = (0, 0);
    for task in env.all_tasks() {
        total += 1;
        let oracle = OraclePolicy::new(&task)?;
        let trajectory = run_episode(&oracle, &h0, &env, &task, 0).await?;
        let (outcome, db) = replay(&env, &task).await?;
        if trajectory.is_success() && outcome.is_success() {
            solved += 1;
            println!("{}: reward {}", task.id, trajectory.reward());
        } else {
            println!(
                "{}: reward {} (ended by {:?}; call by call: {}): {}",
                task.id,
                trajectory.reward(),
                trajectory.termination,
                outcome.reward,
                trajectory.outcome.details
            );
        }
        if let Some(out) = out.as_mut() {
            let id = tau_retail::retail_task(&task)?.id;
            writeln!(
                out,
                "{}",
                serde_json::json!({"task_id": id, "db": db.to_value()})
            )?;
        }
    }
    if let Some(mut out) = out {
        out.flush()?;
    }
    println!("{solved}/{total}");
    Ok(solved == total)
}

/// The world of the task file's folder, every task of the file in it.
fn load(tasks_file: &Path) -> Result<TauRetail> {
    let dir = tasks_file.parent().unwrap_or(Path::new("."));
    let db = tau_retail::db::RetailDb::load(&dir.join("db.json"))?;
    let policy_path = dir.join("policy.md");
    let policy =
        std::fs::read_to_string(&policy_path).with_context(|| policy_path.display().to_string())?;
    let text =
        std::fs::read_to_string(tasks_file).with_context(|| tasks_file.display().to_string())?;
    let tasks = tau_retail::tasks::parse_tasks(&text, tasks_file)?;
    let splits_path = dir.join("split_tasks.json");
    let mut splits = match std::fs::read_to_string(&splits_path) {
        Ok(text) => tau_retail::tasks::parse_splits(&text, &splits_path)?,
        Err(_) => Default::default(),
    };
    for task in &tasks {
        splits.entry(task.id.clone()).or_insert(Split::Test);
    }
    let data = tau_retail::RetailData::from_parts(db, policy, tasks, &splits, &splits_path)?;
    Ok(TauRetail::from_data(data))
}

/// The oracle's turns sent call by call to a session: its outcome and final database.
async fn replay(env: &TauRetail, task: &Task) -> Result<(Outcome, tau_retail::RetailDb)> {
    let mut session = env.session(task)?;
    let retail = tau_retail::retail_task(task)?;
    let mut closing = None;
    'turns: for turn in tau_retail::oracle_turns(&retail) {
        match ToolCallParser.parse(&turn, &[]) {
            ParsedAction::Calls(calls) => {
                for call in calls {
                    if session.step(&call).await?.done {
                        break 'turns;
                    }
                }
            }
            _ => {
                closing = Some(turn);
                break;
            }
        }
    }
    let outcome = session.verify(closing.as_deref()).await?;
    Ok((outcome, session.database().clone()))
}
