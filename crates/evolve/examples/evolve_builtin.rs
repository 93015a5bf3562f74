//! Directional Harness Evolution on the built-in environments (AppWorld-style apps and DBBench),
//! with the paper's Table 8 settings, the built-in rule analyst and repair-operator editor, and
//! a *heuristic* executor policy (no trained model is needed or used): each environment's
//! reference solver with planted, harness-sensitive mistakes. A mistake goes away only when the
//! harness's own text (rules, skills, hook messages, tool docs) addresses it, the way the
//! paper's siblings elicit behaviours a policy shows only when prompted. One side effect is
//! planted too: a rule to economise on actions also makes the solver stop paging after two
//! pages, so that edit regresses long listings (the paper's locality, Figure 1a).
//!
//! ```text
//! cargo run --release -p harness-evolve --example evolve_builtin -- [--out DIR] [--env appworld|dbbench|all] [--quick]
//! ```
//!
//! Writes, per environment, `DIR/<env>/pool/` (the frozen Sibling Harness Pool), one JSON report
//! per round, the diversity views as JSON and SVG, the lineage tree and the token use per role.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use async_trait::async_trait;
use harness_core::{
    ActionParser, ChatMessage, Environment, Harness, ParsedAction, Policy, PolicyRequest,
    PolicyTurn, Role, SamplingParams, Split, Task, ToolCall, ToolCallParser,
};
use harness_envs::{appworld, dbbench};
use harness_evolve::exec::{Executor, PolicySource};
use harness_evolve::meta_harness::{
    AnalystEditorProposer, DEFAULT_MAX_UNSCORED_IN_A_ROW, MetaHarnessSearch,
};
use harness_evolve::report::{round_summary, write_reports};
use harness_evolve::{BuiltinEditor, Evolution, EvolveSettings, RuleAnalyst, diversity};
use serde_json::json;

/// Turns the flawed policy makes itself (not the reference solver's) start with this marker,
/// so the solver's own view of the episode can leave them out.
const MARK: &str = "<think>(improvising)</think>\n";

#[derive(Debug, Clone, Copy, PartialEq)]
enum Flaw {
    /// Completes the task instead of reading page 2 of a listing.
    StopsPaging,
    /// Reads documentation three times before every real call (and so runs out of actions).
    Dawdles,
    /// Calls a wrong API again and again.
    RepeatsFailingCall,
    /// Answers in prose instead of committing or completing.
    AnswersInText,
    /// Queries a column that does not exist, then gives up (DBBench).
    GuessesColumn,
}

impl Flaw {
    /// Words of the harness text that cure the flaw (the built-in repairs use them).
    fn cures(self) -> &'static [&'static str] {
        match self {
            Flaw::StopsPaging => &["keep requesting pages"],
            Flaw::Dawdles => &[
                "keep one action for the completion call",
                "plan within the action budget",
            ],
            Flaw::RepeatsFailingCall => &["do not repeat it"],
            Flaw::AnswersInText => &["does not count"],
            Flaw::GuessesColumn => &[
                "exact table and column names",
                "names that exist",
                "does not exist",
            ],
        }
    }
}

fn hash(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// Which flaw a task gets: by template, for about 70% of the tasks.
fn flaw_of(task: &Task) -> Option<Flaw> {
    if hash(&task.id) % 10 >= 7 {
        return None;
    }
    if task.env == dbbench::ENV_NAME {
        return Some(if hash(&task.id).is_multiple_of(2) {
            Flaw::AnswersInText
        } else {
            Flaw::GuessesColumn
        });
    }
    match task.metadata["template"].as_str()? {
        "mail_count" | "returns_window" => Some(Flaw::StopsPaging),
        "transfer_readback" | "playlist_build" => Some(Flaw::Dawdles),
        "account_recovery" => Some(Flaw::RepeatsFailingCall),
        "liked_intersection" => Some(Flaw::AnswersInText),
        _ => None,
    }
}

/// A reference solver with one planted flaw.
struct FlawedSolver {
    inner: Box<dyn Policy>,
    flaw: Option<Flaw>,
    table: String,
}

/// The harness's own text as the policy sees it: system prompt, injected messages, tool docs.
fn harness_text(request: &PolicyRequest) -> String {
    let mut out = String::new();
    let mut users = 0;
    for m in &request.messages {
        let counts = match m.role {
            Role::System => true,
            Role::User => {
                users += 1;
                users > 1
            }
            _ => false,
        };
        if counts {
            out.push_str(&m.content.to_lowercase());
            out.push('\n');
        }
    }
    for t in &request.tools {
        out.push_str(&t.description.to_lowercase());
        out.push('\n');
    }
    out
}

/// The request without the flawed policy's own turns and what answered them.
fn solver_view(request: &PolicyRequest) -> PolicyRequest {
    let mut messages: Vec<ChatMessage> = Vec::new();
    let mut skipping = false;
    for m in &request.messages {
        if m.role == Role::Assistant {
            skipping = m.content.starts_with(MARK);
        }
        if !skipping {
            messages.push(m.clone());
        }
    }
    PolicyRequest {
        messages,
        ..request.clone()
    }
}

fn own_turns_since_solver(request: &PolicyRequest) -> usize {
    request
        .messages
        .iter()
        .rev()
        .filter(|m| m.role == Role::Assistant)
        .take_while(|m| m.content.starts_with(MARK))
        .count()
}

fn own(call: ToolCall) -> String {
    format!("{MARK}{}", call.to_tool_call_block())
}

#[async_trait]
impl Policy for FlawedSolver {
    fn name(&self) -> &str {
        "flawed-reference-solver"
    }

    async fn generate(&self, request: PolicyRequest) -> harness_core::Result<PolicyTurn> {
        let text = harness_text(&request);
        let cured = |f: Flaw| self.flaw != Some(f) || f.cures().iter().any(|k| text.contains(k));
        let max = request.max_new_tokens;
        let made = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        if !cured(Flaw::RepeatsFailingCall) {
            // It reads the documentation first, then insists on an API that does not exist.
            let call = if made == 0 {
                ToolCall::new("api_docs_list_apis", json!({"app": "supervisor"}))
            } else {
                ToolCall::new(
                    "call_api",
                    json!({"app": "supervisor", "api": "show_passwords", "arguments": {}}),
                )
            };
            return Ok(PolicyTurn::text_only(own(call), max));
        }
        if !cured(Flaw::Dawdles) && own_turns_since_solver(&request) < 3 {
            return Ok(PolicyTurn::text_only(
                own(ToolCall::new("api_docs_list_apps", json!({}))),
                max,
            ));
        }
        if self.flaw == Some(Flaw::GuessesColumn) && made == 0 && !cured(Flaw::GuessesColumn) {
            let query = format!("SELECT name FROM `{}` WHERE name_of_item = 'x'", self.table);
            return Ok(PolicyTurn::text_only(
                own(ToolCall::new(dbbench::SQL_TOOL, json!({"query": query}))),
                max,
            ));
        }
        if self.flaw == Some(Flaw::GuessesColumn) && !cured(Flaw::GuessesColumn) {
            let call = ToolCall::new(dbbench::COMMIT_TOOL, json!({"answers": []}));
            return Ok(PolicyTurn::text_only(own(call), max));
        }
        let turn = self.inner.generate(solver_view(&request)).await?;
        if let ParsedAction::Calls(calls) = ToolCallParser.parse(&turn.text, &[]) {
            let call = &calls[0];
            let page = call
                .arguments
                .pointer("/arguments/page")
                .and_then(|p| p.as_u64())
                .unwrap_or(1);
            // A side effect planted on purpose (the paper's locality): told to economise on
            // actions, the solver also stops paging after two pages, unless told to keep
            // paging, so the budget rule regresses long listings that H0 got right.
            let economise = text.contains("plan within the action budget")
                && !text.contains("keep requesting pages");
            if (page >= 2 && !cured(Flaw::StopsPaging)) || (page >= 3 && economise) {
                let done = ToolCall::new(appworld::tool::COMPLETE_TASK, json!({"answer": "0"}));
                return Ok(PolicyTurn::text_only(own(done), max));
            }
            let submit =
                call.name == dbbench::COMMIT_TOOL || call.name == appworld::tool::COMPLETE_TASK;
            if submit && !cured(Flaw::AnswersInText) {
                let answer = call
                    .arguments
                    .get("answers")
                    .or(call.arguments.get("answer"))
                    .cloned()
                    .unwrap_or_default();
                return Ok(PolicyTurn::text_only(
                    format!("{MARK}The answer is {answer}."),
                    max,
                ));
            }
        }
        Ok(turn)
    }
}

/// Per-task flawed solvers.
struct Solvers;

impl PolicySource for Solvers {
    fn policy_for(&self, task: &Task) -> harness_evolve::Result<Arc<dyn Policy>> {
        let (inner, table): (Box<dyn Policy>, String) = if task.env == dbbench::ENV_NAME {
            let table = dbbench::db_task(task)
                .map_err(harness_core::Error::from)?
                .tables[0]
                .name
                .clone();
            (Box::new(dbbench::OraclePolicy::new(task)?), table)
        } else {
            (
                Box::new(appworld::OraclePolicy::new(task).with_page_size(5)),
                String::new(),
            )
        };
        Ok(Arc::new(FlawedSolver {
            inner,
            flaw: flaw_of(task),
            table,
        }))
    }

    fn name(&self) -> String {
        "flawed reference solvers (heuristic, no trained model)".into()
    }
}

struct Args {
    out: PathBuf,
    envs: Vec<String>,
    quick: bool,
}

fn args() -> anyhow::Result<Args> {
    let mut out = PathBuf::from("target/evolve-builtin");
    let mut envs = vec!["appworld".to_string(), "dbbench".to_string()];
    let mut quick = false;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--out" => out = it.next().context("--out needs a directory")?.into(),
            "--env" => {
                let v = it.next().context("--env needs appworld, dbbench or all")?;
                envs = match v.as_str() {
                    "all" => vec!["appworld".into(), "dbbench".into()],
                    "appworld" | "dbbench" => vec![v],
                    other => bail!(
                        "--env: unknown environment `{other}`; expected appworld, dbbench or all"
                    ),
                };
            }
            "--quick" => quick = true,
            other => bail!("unknown argument `{other}`; expected --out DIR, --env NAME, --quick"),
        }
    }
    Ok(Args { out, envs, quick })
}

fn take(mut tasks: Vec<Task>, n: usize) -> Vec<Task> {
    tasks.truncate(n);
    tasks
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    println!(
        "executor policy: heuristic (each environment's reference solver with planted, harness-sensitive mistakes); no trained model is used"
    );
    println!(
        "analyst: built-in rule analyst; editor: built-in repair operators; settings: Table 8 preset"
    );
    for env_name in &args.envs {
        let (env, base, limits): (Arc<dyn Environment>, Harness, bool) = match env_name.as_str() {
            "appworld" => (
                Arc::new(appworld::AppWorld::new()),
                appworld::base_harness(),
                true,
            ),
            _ => (
                Arc::new(dbbench::DbBench::new()),
                dbbench::base_harness(),
                false,
            ),
        };
        let mut settings = EvolveSettings::paper();
        // DBBench keeps AgentBench's 15 rounds; the app world takes Table 8's limits.
        if !limits {
            settings.limits = None;
        }
        let (train_n, val_n) = if args.quick { (24, 24) } else { (120, 60) };
        settings.train_tasks_per_round = if args.quick { 24 } else { 40 };
        let evolution = Evolution {
            settings,
            executor: Executor {
                policy: Arc::new(Solvers),
                env: Arc::clone(&env),
                sampling: SamplingParams::greedy(),
                concurrency: 8,
            },
            analyst: Arc::new(RuleAnalyst),
            editor: Arc::new(BuiltinEditor),
            train: take(env.tasks(Split::Train)?, train_n),
            validation: take(env.tasks(Split::Validation)?, val_n),
        };
        let started = std::time::Instant::now();
        let result = evolution.run(base).await?;
        let views = diversity::measure(
            &evolution.executor,
            &result.pool,
            &result.validation_solved,
            &evolution.validation,
            evolution.validation_seed(),
            &SamplingParams::default(),
        )
        .await?;
        let dir = args.out.join(env_name);
        let written = write_reports(&dir, &result, &views)?;
        println!(
            "\n== {env_name}: {} training / {} validation tasks, {:.1}s",
            evolution.train.len(),
            evolution.validation.len(),
            started.elapsed().as_secs_f64()
        );
        for round in &result.rounds {
            print!("{}", round_summary(round, evolution.validation.len()));
        }
        println!(
            "pool: {} members (H0 + {} siblings), frozen; H0 solves {}/{} validation tasks; oracle union of the siblings {}/{}; H0 pass@{} {}; siblings repair {} H0 failures together; mean directed overlap {}",
            result.pool.len(),
            result.pool.len() - 1,
            views.coverage.h0_solved,
            views.tasks,
            views.coverage.oracle_union,
            views.tasks,
            views.coverage.k,
            views
                .coverage
                .h0_pass_at_k
                .map_or("n/a".into(), |p| p.to_string()),
            views.union_repaired,
            views
                .mean_overlap
                .map_or("n/a".into(), |m| format!("{:.1}%", m * 100.0)),
        );
        print!("{}", result.pool.render_lineage());
        println!("wrote {} files under {}", written.len(), dir.display());

        // Meta-Harness with the same budgets, executor and verifier: one H_best by training score.
        let search = MetaHarnessSearch {
            settings: evolution.settings.clone(),
            max_unscored_in_a_row: DEFAULT_MAX_UNSCORED_IN_A_ROW,
            executor: evolution.executor.clone(),
            proposer: Arc::new(AnalystEditorProposer {
                analyst: Arc::new(RuleAnalyst),
                editor: Arc::new(BuiltinEditor),
                settings: evolution.settings.clone(),
            }),
            train: evolution.round_tasks(1),
        };
        let meta = search.run(result.pool.base().clone()).await?;
        let best_runs = evolution
            .executor
            .run(
                &meta.best,
                &evolution.validation,
                evolution.validation_seed(),
            )
            .await?;
        let best_val = best_runs.iter().filter(|t| t.is_success()).count();
        let best_sibling = views.siblings.iter().map(|s| s.solved).max().unwrap_or(0);
        let meta_best = meta.candidates.iter().find(|c| c.id == meta.best.id());
        println!(
            "Meta-Harness: {} candidates scored, {} rejected; H_best {} solves {}/{} training and {best_val}/{} validation tasks (best single evolved sibling {best_sibling}/{}, sibling oracle union {}/{})",
            meta.candidates.len(),
            meta.rejected.len(),
            meta.best.name,
            meta_best.map_or(0, |c| c.solved),
            meta_best.map_or(0, |c| c.tasks),
            views.tasks,
            views.tasks,
            views.coverage.oracle_union,
            views.tasks,
        );
    }
    Ok(())
}
