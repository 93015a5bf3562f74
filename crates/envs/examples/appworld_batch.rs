//! Run a batch of app-world episodes and print success rates per template and difficulty.
//!
//! ```text
//! cargo run -p harness-envs --example appworld_batch -- [train|validation|test] [oracle|oracle5|first-page]
//! ```
//!
//! `oracle` runs the scripted solver (it must score 1.0 everywhere), `oracle5` the same solver
//! keeping the APIs' default page size of 5 (the action counts a careful agent needs); `first-page` runs the
//! oracle with every listing cut to its first page of five (the paper's single-pass failure).

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{
    Environment, Harness, Policy, PolicyRequest, PolicyTurn, Result, Split, Task, Trajectory,
    run_episode,
};
use harness_envs::appworld::{AppWorld, OraclePolicy, base_harness};

/// The oracle, but every page request is rewritten to the first page of the default size.
struct FirstPageOnly(OraclePolicy);

#[async_trait]
impl Policy for FirstPageOnly {
    fn name(&self) -> &str {
        "first-page-only"
    }

    async fn generate(&self, request: PolicyRequest) -> Result<PolicyTurn> {
        let mut turn = self.0.generate(request).await?;
        turn.text = turn
            .text
            .replace("\"page_size\":20", "\"page_size\":5")
            .replace("\"page\":2,", "\"page\":1,");
        Ok(turn)
    }
}

async fn batch(
    env: Arc<AppWorld>,
    tasks: &[Task],
    harness: &Harness,
    mode: &str,
) -> Vec<Trajectory> {
    let handles: Vec<_> = tasks
        .iter()
        .cloned()
        .map(|task| {
            let env = Arc::clone(&env);
            let harness = harness.clone();
            let mode = mode.to_string();
            tokio::spawn(async move {
                let oracle = OraclePolicy::new(&task);
                let policy: Box<dyn Policy> = match mode.as_str() {
                    "first-page" => Box::new(FirstPageOnly(oracle)),
                    "oracle5" => Box::new(oracle.with_page_size(5)),
                    _ => Box::new(oracle),
                };
                run_episode(policy.as_ref(), &harness, env.as_ref(), &task, 1).await
            })
        })
        .collect();
    let mut out = Vec::new();
    for handle in handles {
        match handle.await {
            Ok(Ok(t)) => out.push(t),
            Ok(Err(e)) => eprintln!("episode failed: {e}"),
            Err(e) => eprintln!("episode panicked: {e}"),
        }
    }
    out
}

fn report(name: &str, tasks: &[Task], trajectories: &[Trajectory]) {
    let mut table: BTreeMap<(String, u64), (usize, usize, u32)> = BTreeMap::new();
    for (task, t) in tasks.iter().zip(trajectories) {
        let key = (
            task.metadata["template"]
                .as_str()
                .unwrap_or("?")
                .to_string(),
            task.metadata["difficulty"].as_u64().unwrap_or(0),
        );
        let entry = table.entry(key).or_default();
        entry.0 += usize::from(t.is_success());
        entry.1 += 1;
        entry.2 += t.counts.env_actions;
    }
    println!("== {name}");
    println!(
        "{:<20} {:>5} {:>9} {:>12}",
        "template", "level", "solved", "mean actions"
    );
    for ((template, level), (ok, n, actions)) in &table {
        println!(
            "{template:<20} {level:>5} {:>9} {:>12.1}",
            format!("{ok}/{n}"),
            f64::from(*actions) / *n as f64
        );
    }
    let solved = trajectories.iter().filter(|t| t.is_success()).count();
    println!("overall: {solved}/{}\n", trajectories.len());
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> std::result::Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let split = match args.first().map(String::as_str) {
        None | Some("validation") => Split::Validation,
        Some("train") => Split::Train,
        Some("test") => Split::Test,
        Some(other) => {
            return Err(
                format!("unknown split `{other}`; expected train, validation or test").into(),
            );
        }
    };
    let mode = args.get(1).map_or("oracle", String::as_str);
    let env = Arc::new(AppWorld::new());
    let tasks = env.tasks(split)?;
    if !["oracle", "oracle5", "first-page"].contains(&mode) {
        return Err(
            format!("unknown mode `{mode}`; expected oracle, oracle5 or first-page").into(),
        );
    }
    let t = batch(Arc::clone(&env), &tasks, &base_harness(), mode).await;
    report(&format!("{mode} under H0 on {split}"), &tasks, &t);
    Ok(())
}
