//! The conformance suite passes on the scripted environment and catches broken environments.

use async_trait::async_trait;
use futures::executor::block_on;
use harness_core::{
    EnvSession, Environment, Observation, Outcome, Policy, PolicyRequest, Result, Role, Split,
    Task, ToolCall, ToolSpec,
};
use harness_testkit::conformance::{ConformanceConfig, check_environment};
use harness_testkit::{FnPolicy, ScriptedEnv};
use serde_json::json;

/// Reads every page, counts the items, submits the count.
fn counting_oracle(_task: &Task) -> Box<dyn Policy> {
    Box::new(FnPolicy::new("oracle", |req: &PolicyRequest| {
        let pages: Vec<&str> = req
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .map(|m| m.content.as_str())
            .collect();
        let next = pages.len() + 1;
        let total: usize = req.messages[2]
            .content
            .split_whitespace()
            .nth(3)
            .and_then(|n| n.parse().ok())
            .unwrap_or(1);
        if next <= total {
            ToolCall::new("list_items", json!({"page": next})).to_tool_call_block()
        } else {
            let count: usize = pages.iter().map(|p| p.split(", ").count()).sum();
            ToolCall::new("submit", json!({"answer": count.to_string()})).to_tool_call_block()
        }
    }))
}

#[test]
fn scripted_env_conforms() {
    let env = ScriptedEnv::new(3);
    let tasks = env.tasks(Split::Validation).expect("tasks");
    let report = block_on(check_environment(
        &env,
        &tasks,
        &counting_oracle,
        &ConformanceConfig::default(),
    ));
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
    assert!(report.episodes >= 16 * 2 + tasks.len() * 3);
    assert!(report.probes > 10);
}

/// Accepts anything, ignores errors, panics on unknown tools, and leaks state across episodes.
struct Broken {
    shared: std::sync::Arc<std::sync::Mutex<u32>>,
}

struct BrokenSession {
    shared: std::sync::Arc<std::sync::Mutex<u32>>,
}

#[async_trait]
impl Environment for Broken {
    fn name(&self) -> &str {
        "broken"
    }
    async fn reset(&self, _task: &Task, _seed: u64) -> Result<Box<dyn EnvSession>> {
        Ok(Box::new(BrokenSession {
            shared: self.shared.clone(),
        }))
    }
}

#[async_trait]
impl EnvSession for BrokenSession {
    fn tools(&self) -> Vec<ToolSpec> {
        ScriptedEnv::tool_specs()
    }
    fn initial_observation(&self) -> String {
        let mut n = self.shared.lock().expect("lock");
        *n += 1;
        format!("episode number {n}")
    }
    async fn step(&mut self, call: &ToolCall) -> Result<Observation> {
        if call.name == "no_such_tool_xyz" {
            panic!("unknown tool");
        }
        Ok(Observation::ok("ok"))
    }
    async fn verify(&mut self, _final_answer: Option<&str>) -> Result<Outcome> {
        Ok(Outcome::success(json!(null)))
    }
}

#[test]
fn broken_env_is_caught() {
    let env = Broken {
        shared: Default::default(),
    };
    let tasks = vec![Task::new("b-1", "broken", Split::Test, "anything", 0)];
    let report = block_on(check_environment(
        &env,
        &tasks,
        &counting_oracle,
        &ConformanceConfig::default(),
    ));
    let all = report.failures.join("\n");
    assert!(all.contains("two resets differ"), "{all}");
    assert!(all.contains("instead of 0"), "{all}");
    assert!(all.contains("unknown tool: panicked"), "{all}");
}
