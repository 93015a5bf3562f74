//! The environment conformance suite: episode-protocol checks every [`Environment`] must pass,
//! written once and run against each implementation (like burn's backend tests).
//!
//! [`check_environment`] runs them all and returns every violation found, so a failing test
//! prints the whole list:
//!
//! - the same task and seed give the same tools and initial observation;
//! - tool names are unique and non-empty, and every tool's parameters are an object schema
//!   whose `required` names are among its `properties`;
//! - an oracle solver scores 1.0 on every task given;
//! - a policy that finishes at once, or calls a submit tool with empty arguments, scores 0;
//! - concurrent episodes do not interfere (each equals its sequential run);
//! - unknown tools, malformed arguments, oversized inputs and steps after the end give error
//!   observations or errors, never panics.

use std::panic::AssertUnwindSafe;

use futures::FutureExt;
use harness_core::{
    EnvSession, Environment, Harness, Observation, Policy, Result, Task, ToolCall, ToolKind,
    ToolSpec, Trajectory, run_episode,
};
use serde_json::{Value, json};

use crate::ScriptedPolicy;

/// Makes a fresh oracle policy for a task (oracles may keep per-episode state).
pub type OracleFactory<'a> = dyn Fn(&Task) -> Box<dyn Policy> + Send + Sync + 'a;

/// Settings of the suite.
#[derive(Debug, Clone)]
pub struct ConformanceConfig {
    /// The harness episodes run under (its action format must suit the environment).
    pub harness: Harness,
    /// Episodes run at once in the isolation check.
    pub concurrency: usize,
    /// Size of the oversized string argument, in bytes.
    pub oversized_bytes: usize,
    /// The episode seed.
    pub seed: u64,
}

impl Default for ConformanceConfig {
    fn default() -> Self {
        ConformanceConfig {
            harness: Harness::new("conformance", "Solve the task with the tools provided."),
            concurrency: 16,
            oversized_bytes: 1 << 20,
            seed: 7,
        }
    }
}

/// What the suite ran.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Episodes run.
    pub episodes: usize,
    /// Direct tool calls made by the robustness check.
    pub probes: usize,
    /// Every violation, each naming the task and the check.
    pub failures: Vec<String>,
}

async fn guarded<T>(
    label: String,
    fut: impl std::future::Future<Output = Result<T>>,
) -> std::result::Result<T, String> {
    match AssertUnwindSafe(fut).catch_unwind().await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(e)) => Err(format!("{label}: error: {e}")),
        Err(_) => Err(format!("{label}: panicked")),
    }
}

/// Run every check on `tasks`.
pub async fn check_environment(
    env: &dyn Environment,
    tasks: &[Task],
    oracle: &OracleFactory<'_>,
    config: &ConformanceConfig,
) -> Report {
    let mut report = Report::default();
    if tasks.is_empty() {
        report
            .failures
            .push("no tasks were given to the conformance suite".into());
        return report;
    }
    check_tool_specs(env, &tasks[0], config.seed, &mut report).await;
    for task in tasks {
        check_deterministic_reset(env, task, config.seed, &mut report).await;
        check_oracle(env, task, oracle, config, &mut report).await;
        check_immediate_finish(env, task, config, &mut report).await;
    }
    check_isolation(env, tasks, oracle, config, &mut report).await;
    check_robust_steps(env, &tasks[0], config, &mut report).await;
    report
}

async fn tools_and_initial(
    env: &dyn Environment,
    task: &Task,
    seed: u64,
) -> Result<(Vec<ToolSpec>, String)> {
    let session = env.reset(task, seed).await?;
    Ok((session.tools(), session.initial_observation()))
}

/// The same task and seed give the same tools and initial observation.
pub async fn check_deterministic_reset(
    env: &dyn Environment,
    task: &Task,
    seed: u64,
    report: &mut Report,
) {
    let label = format!("{}: deterministic reset", task.id);
    let first = guarded(label.clone(), tools_and_initial(env, task, seed)).await;
    let second = guarded(label.clone(), tools_and_initial(env, task, seed)).await;
    match (first, second) {
        (Ok(a), Ok(b)) if a == b => {}
        (Ok(_), Ok(_)) => report.failures.push(format!("{label}: two resets differ")),
        (Err(e), _) | (_, Err(e)) => report.failures.push(e),
    }
}

/// Tool names are unique and non-empty; parameters are `{"type": "object", ...}` schemas whose
/// `required` names are declared in `properties`.
pub async fn check_tool_specs(env: &dyn Environment, task: &Task, seed: u64, report: &mut Report) {
    let label = format!("{}: tool specs", task.id);
    let tools = match guarded(label.clone(), tools_and_initial(env, task, seed)).await {
        Ok((tools, _)) => tools,
        Err(e) => return report.failures.push(e),
    };
    for (i, tool) in tools.iter().enumerate() {
        let name = &tool.name;
        if name.trim().is_empty() {
            report
                .failures
                .push(format!("{label}: tool #{i} has an empty name"));
        }
        if tools[..i].iter().any(|t| t.name == *name) {
            report
                .failures
                .push(format!("{label}: tool `{name}` is offered twice"));
        }
        let params = &tool.parameters;
        if params.get("type").and_then(Value::as_str) != Some("object") {
            report.failures.push(format!(
                "{label}: `{name}` parameters must be a JSON schema with \"type\": \"object\""
            ));
        }
        let props = params.get("properties").and_then(Value::as_object);
        let required = params.get("required").and_then(Value::as_array);
        for req in required.into_iter().flatten() {
            let declared = req
                .as_str()
                .is_some_and(|r| props.is_some_and(|p| p.contains_key(r)));
            if !declared {
                report.failures.push(format!(
                    "{label}: `{name}` requires {req}, which is not among its properties"
                ));
            }
        }
    }
}

async fn episode(
    env: &dyn Environment,
    policy: &dyn Policy,
    harness: &Harness,
    task: &Task,
    seed: u64,
    label: String,
) -> std::result::Result<Trajectory, String> {
    guarded(label, run_episode(policy, harness, env, task, seed)).await
}

/// The oracle solves the task.
pub async fn check_oracle(
    env: &dyn Environment,
    task: &Task,
    oracle: &OracleFactory<'_>,
    config: &ConformanceConfig,
    report: &mut Report,
) {
    let policy = oracle(task);
    let label = format!("{}: oracle", task.id);
    report.episodes += 1;
    match episode(
        env,
        policy.as_ref(),
        &config.harness,
        task,
        config.seed,
        label.clone(),
    )
    .await
    {
        Ok(t) if t.is_success() => {}
        Ok(t) => report.failures.push(format!(
            "{label}: reward {} (ended by {:?}); verifier said {}",
            t.reward(),
            t.termination,
            t.outcome.details
        )),
        Err(e) => report.failures.push(e),
    }
}

/// Minimal arguments for a tool: each required property gets an empty value of its type.
pub fn empty_arguments(tool: &ToolSpec) -> Value {
    let props = tool.parameters.get("properties").and_then(Value::as_object);
    let required = tool.parameters.get("required").and_then(Value::as_array);
    let mut args = serde_json::Map::new();
    for name in required.into_iter().flatten().filter_map(Value::as_str) {
        let ty = props
            .and_then(|p| p.get(name))
            .and_then(|p| p.get("type"))
            .and_then(Value::as_str);
        let value = match ty {
            Some("string") => json!(""),
            Some("integer") | Some("number") => json!(0),
            Some("boolean") => json!(false),
            Some("array") => json!([]),
            Some("object") => json!({}),
            _ => Value::Null,
        };
        args.insert(name.to_string(), value);
    }
    Value::Object(args)
}

/// Finishing at once, or submitting empty arguments, scores 0.
pub async fn check_immediate_finish(
    env: &dyn Environment,
    task: &Task,
    config: &ConformanceConfig,
    report: &mut Report,
) {
    let mut attempts = vec![(
        "final answer".to_string(),
        "I cannot solve this task.".to_string(),
    )];
    if let Ok((tools, _)) = tools_and_initial(env, task, config.seed).await {
        for tool in tools.iter().filter(|t| t.kind == ToolKind::Submit) {
            let call = ToolCall::new(tool.name.clone(), empty_arguments(tool));
            attempts.push((format!("empty `{}`", tool.name), call.to_tool_call_block()));
        }
    }
    for (what, text) in attempts {
        let policy = ScriptedPolicy::new(vec![text]);
        let mut harness = config.harness.clone();
        harness.limits.max_model_calls = 1;
        let label = format!("{}: immediate {what}", task.id);
        report.episodes += 1;
        match episode(env, &policy, &harness, task, config.seed, label.clone()).await {
            Ok(t) if t.reward() == 0.0 => {}
            Ok(t) => report
                .failures
                .push(format!("{label}: scored {} instead of 0", t.reward())),
            Err(e) => report.failures.push(e),
        }
    }
}

/// Concurrent episodes give the same trajectories as sequential ones.
pub async fn check_isolation(
    env: &dyn Environment,
    tasks: &[Task],
    oracle: &OracleFactory<'_>,
    config: &ConformanceConfig,
    report: &mut Report,
) {
    let picks: Vec<&Task> = (0..config.concurrency)
        .map(|i| &tasks[i % tasks.len()])
        .collect();
    let mut sequential = Vec::new();
    for (i, task) in picks.iter().enumerate() {
        let policy = oracle(task);
        let label = format!("{}: isolation (sequential #{i})", task.id);
        sequential.push(
            episode(
                env,
                policy.as_ref(),
                &config.harness,
                task,
                config.seed,
                label,
            )
            .await,
        );
    }
    let policies: Vec<Box<dyn Policy>> = picks.iter().map(|t| oracle(t)).collect();
    let concurrent = futures::future::join_all(picks.iter().zip(&policies).enumerate().map(
        |(i, (task, policy))| {
            let label = format!("{}: isolation (concurrent #{i})", task.id);
            episode(
                env,
                policy.as_ref(),
                &config.harness,
                task,
                config.seed,
                label,
            )
        },
    ))
    .await;
    report.episodes += 2 * picks.len();
    for (i, (seq, conc)) in sequential.into_iter().zip(concurrent).enumerate() {
        match (seq, conc) {
            (Ok(a), Ok(b)) => {
                if a.reward() != b.reward() || a.messages != b.messages {
                    report.failures.push(format!(
                        "{}: concurrent episode #{i} differs from its sequential run (rewards {} vs {})",
                        a.task_id,
                        a.reward(),
                        b.reward()
                    ));
                }
            }
            (Err(e), _) | (_, Err(e)) => report.failures.push(e),
        }
    }
}

async fn probe(
    session: &mut dyn EnvSession,
    call: &ToolCall,
    label: String,
    report: &mut Report,
) -> Option<Observation> {
    report.probes += 1;
    match AssertUnwindSafe(session.step(call)).catch_unwind().await {
        Ok(Ok(observation)) => Some(observation),
        // An `Err` is allowed (infrastructure refused the call); a panic is not.
        Ok(Err(_)) => None,
        Err(_) => {
            report.failures.push(format!("{label}: panicked"));
            None
        }
    }
}

/// Bad calls give error observations or errors, never panics or silent successes.
pub async fn check_robust_steps(
    env: &dyn Environment,
    task: &Task,
    config: &ConformanceConfig,
    report: &mut Report,
) {
    let id = &task.id;
    let Ok(mut session) = env.reset(task, config.seed).await else {
        report
            .failures
            .push(format!("{id}: robustness: reset failed"));
        return;
    };
    let tools = session.tools();
    let unknown = ToolCall::new("no_such_tool_xyz", json!({}));
    if let Some(obs) = probe(
        session.as_mut(),
        &unknown,
        format!("{id}: unknown tool"),
        report,
    )
    .await
        && !obs.error
    {
        report.failures.push(format!(
            "{id}: an unknown tool was not reported as an error"
        ));
    }
    let big = "x".repeat(config.oversized_bytes);
    for tool in tools.iter().filter(|t| t.kind != ToolKind::Submit) {
        for (what, args) in [
            ("non-object arguments", json!(42)),
            ("wrongly typed arguments", wrong_types(tool)),
            ("oversized arguments", oversized(tool, &big)),
        ] {
            let label = format!("{id}: `{}` with {what}", tool.name);
            probe(
                session.as_mut(),
                &ToolCall::new(tool.name.clone(), args),
                label,
                report,
            )
            .await;
        }
    }
    // Steps after the end of an episode.
    for tool in tools.iter().filter(|t| t.kind == ToolKind::Submit) {
        let Ok(mut session) = env.reset(task, config.seed).await else {
            continue;
        };
        let submit = ToolCall::new(tool.name.clone(), empty_arguments(tool));
        let first = probe(session.as_mut(), &submit, format!("{id}: submit"), report).await;
        if first.is_some_and(|o| o.done) {
            for call in [&submit, &unknown] {
                let label = format!("{id}: `{}` after the episode ended", call.name);
                if let Some(obs) = probe(session.as_mut(), call, label.clone(), report).await
                    && !obs.error
                {
                    report
                        .failures
                        .push(format!("{label}: accepted instead of an error"));
                }
            }
        }
    }
}

fn wrong_types(tool: &ToolSpec) -> Value {
    let mut args = serde_json::Map::new();
    if let Some(props) = tool.parameters.get("properties").and_then(Value::as_object) {
        for (name, schema) in props {
            let wrong = match schema.get("type").and_then(Value::as_str) {
                Some("string") => json!([1, 2, 3]),
                Some("integer") | Some("number") => json!("not a number"),
                Some("array") => json!({"not": "an array"}),
                _ => json!(-1),
            };
            args.insert(name.clone(), wrong);
        }
    }
    Value::Object(args)
}

fn oversized(tool: &ToolSpec, big: &str) -> Value {
    let mut args = empty_arguments(tool);
    if let (Some(map), Some(props)) = (
        args.as_object_mut(),
        tool.parameters.get("properties").and_then(Value::as_object),
    ) {
        for (name, schema) in props {
            if schema.get("type").and_then(Value::as_str) == Some("string") {
                map.insert(name.clone(), json!(big));
            }
        }
    }
    args
}
