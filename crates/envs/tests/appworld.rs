//! Integration tests of the app world: conformance, oracle coverage, failure modes and hooks.

use harness_core::{
    Environment, Harness, Policy, Role, Source, Split, Task, ToolCall, Trajectory, run_episode,
};
use harness_envs::appworld::{
    AppWorld, OraclePolicy, Template, base_harness, table7_siblings, tool,
};
use harness_testkit::conformance::{ConformanceConfig, check_environment};
use harness_testkit::{FnPolicy, ScriptedPolicy};
use serde_json::{Value, json};

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    futures::executor::block_on(f)
}

fn run(policy: &dyn Policy, harness: &Harness, env: &AppWorld, task: &Task) -> Trajectory {
    block_on(run_episode(policy, harness, env, task, 11)).expect("the episode runs")
}

fn template_of(task: &Task) -> String {
    task.metadata["template"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

fn difficulty_of(task: &Task) -> u64 {
    task.metadata["difficulty"].as_u64().unwrap_or_default()
}

#[test]
fn oracle_solves_every_builtin_task() {
    let env = AppWorld::new();
    let harness = base_harness();
    let mut failures = Vec::new();
    let mut total = 0;
    for split in Split::ALL {
        for task in env.tasks(split).expect("tasks") {
            total += 1;
            let oracle = OraclePolicy::new(&task);
            let t = run(&oracle, &harness, &env, &task);
            if !t.is_success() {
                failures.push(format!(
                    "{}: {:?} {}",
                    task.id, t.termination, t.outcome.details
                ));
            }
        }
    }
    assert!(total >= 500, "only {total} tasks");
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}
