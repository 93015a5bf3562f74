//! Checks the DBBench verifier against a task file: for every task, replays the gold SQL of
//! INSERT/UPDATE/DELETE tasks and compares the table hash, and submits the label of question
//! tasks as the answer. Every task should be reproduced; anything less is a verifier bug.
//!
//! ```text
//! cargo run -p harness-envs --example dbbench_check -- path/to/dbbench/dev.jsonl
//! ```

use std::collections::BTreeMap;
use std::process::ExitCode;

use harness_core::{Environment, Split, ToolCall};
use harness_envs::dbbench::{self, COMMIT_TOOL, DbBench, QuestionType, SQL_TOOL};
use serde_json::json;

fn main() -> ExitCode {
    let Some(path) = std::env::args().nth(1) else {
        eprintln!("usage: dbbench_check <file.jsonl>");
        return ExitCode::from(2);
    };
    let env = match DbBench::from_jsonl(&path, Split::Test) {
        Ok(env) => env,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    match futures::executor::block_on(check(&env)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

async fn check(env: &DbBench) -> harness_core::Result<bool> {
    // type -> (reproduced, total)
    let mut counts: BTreeMap<String, (usize, usize)> = BTreeMap::new();
    for task in env.all_tasks() {
        let db_task = dbbench::db_task(task)?;
        let mut session = env.reset(task, 0).await?;
        let answers = if db_task.is_modification() {
            let gold = db_task.gold_sql.clone().unwrap_or_default();
            let observation = session
                .step(&ToolCall::new(SQL_TOOL, json!({ "query": gold })))
                .await?;
            if observation.error {
                println!("{}: the gold SQL failed: {}", task.id, observation.text);
            }
            json!([])
        } else {
            json!(db_task.label)
        };
        session
            .step(&ToolCall::new(COMMIT_TOOL, json!({ "answers": answers })))
            .await?;
        let outcome = session.verify(None).await?;
        let entry = counts.entry(db_task.kind.clone()).or_default();
        entry.1 += 1;
        if outcome.is_success() {
            entry.0 += 1;
        } else {
            println!(
                "{} ({}): not reproduced: {}",
                task.id, db_task.kind, outcome.details
            );
        }
    }
    let order = |kind: &str| {
        QuestionType::parse(kind)
            .and_then(|t| QuestionType::ALL.iter().position(|k| *k == t))
            .unwrap_or(usize::MAX)
    };
    let mut kinds: Vec<&String> = counts.keys().collect();
    kinds.sort_by_key(|k| (order(k), (*k).clone()));
    let (mut ok, mut total) = (0, 0);
    for kind in kinds {
        let (x, y) = counts[kind];
        println!("{kind}: reproduced {x}/{y}");
        ok += x;
        total += y;
    }
    println!("reproduced {ok}/{total}");
    Ok(ok == total)
}
