//! Your own environment: implement [`Environment`] and [`EnvSession`], check it with the
//! conformance suite, and run an episode on it.
//!
//! ```text
//! cargo run --release --example custom_environment
//! ```
//!
//! The world here is a stock room: a task asks how many units of an item the warehouses hold
//! together; the tools list the warehouses, look up one warehouse's stock and submit the total.
//! An environment owns its tasks, its tools and its verifier, and never calls a model: the
//! agent loop ([`harness_core::run_episode`]) sits between it and the policy.
//!
//! [`harness_testkit::conformance::check_environment`] runs the episode-protocol checks every
//! environment must pass (deterministic resets, well-formed tool schemas, an oracle that scores
//! 1, a policy that gives up scoring 0, concurrent episodes that do not interfere, bad calls
//! that come back as error observations instead of panics). Run it in your environment's tests.

use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{
    EnvSession, Environment, Harness, Observation, Outcome, PolicyRequest, Result, Role, Split,
    Task, ToolCall, ToolKind, ToolSpec, Trajectory, run_episode,
};
use harness_testkit::conformance::{ConformanceConfig, Report, check_environment};
use harness_testkit::{FnPolicy, ScriptedPolicy};
use serde_json::{Value, json};

/// The warehouses every episode has.
const WAREHOUSES: [&str; 3] = ["north", "south", "east"];
/// The items tasks ask about.
const ITEMS: [&str; 4] = ["bolts", "hinges", "gaskets", "washers"];

/// The stock room: one value serves every episode; each `reset` makes an independent session.
pub struct StockRoom;

impl StockRoom {
    /// Units of `item` in `warehouse`, fixed by the task's seed (so a task is the same world on
    /// every reset).
    pub fn units(task_seed: u64, warehouse: usize, item: &str) -> u64 {
        let item_code: u64 = item.bytes().map(u64::from).sum();
        (task_seed * 7 + warehouse as u64 * 13 + item_code) % 20
    }

    /// The right answer of a task: the item's units over every warehouse.
    pub fn total(task: &Task) -> u64 {
        let item = task.metadata["item"].as_str().unwrap_or_default();
        (0..WAREHOUSES.len())
            .map(|w| StockRoom::units(task.seed, w, item))
            .sum()
    }

    fn tools() -> Vec<ToolSpec> {
        let object = |props: Value, required: Value| json!({"type": "object", "properties": props, "required": required});
        vec![
            ToolSpec::new(
                "list_warehouses",
                "List the warehouses.",
                object(json!({}), json!([])),
            )
            .with_kind(ToolKind::Lookup),
            ToolSpec::new(
                "stock",
                "Units of an item in one warehouse.",
                object(
                    json!({"warehouse": {"type": "string"}, "item": {"type": "string"}}),
                    json!(["warehouse", "item"]),
                ),
            )
            .with_kind(ToolKind::Lookup),
            ToolSpec::new(
                "submit",
                "Submit the total and end the episode.",
                object(json!({"total": {"type": "integer"}}), json!(["total"])),
            )
            .with_kind(ToolKind::Submit),
        ]
    }
}

#[async_trait]
impl Environment for StockRoom {
    fn name(&self) -> &str {
        "stockroom"
    }

    async fn reset(&self, task: &Task, _seed: u64) -> Result<Box<dyn EnvSession>> {
        // A task this environment did not make is an error, not a panic.
        let Some(item) = task.metadata["item"].as_str() else {
            return Err(harness_core::Error::invalid(
                "task.metadata.item",
                format!("task `{}` names no item", task.id),
            ));
        };
        Ok(Box::new(StockSession {
            task_seed: task.seed,
            item: item.to_string(),
            expected: StockRoom::total(task),
            submitted: None,
        }))
    }

    fn tasks(&self, split: Split) -> Result<Vec<Task>> {
        let offset = match split {
            Split::Train => 0,
            Split::Validation => 100,
            Split::Test => 200,
        };
        Ok((0..ITEMS.len() as u64)
            .map(|i| {
                let item = ITEMS[i as usize];
                let mut task = Task::new(
                    format!("stockroom/{split}-{i}"),
                    "stockroom",
                    split,
                    format!("How many {item} do the warehouses hold together? Submit the total."),
                    offset + i,
                );
                task.metadata = json!({ "item": item });
                task
            })
            .collect())
    }
}

/// One episode: its own state, dropped when the episode ends.
struct StockSession {
    task_seed: u64,
    item: String,
    expected: u64,
    submitted: Option<u64>,
}

#[async_trait]
impl EnvSession for StockSession {
    fn tools(&self) -> Vec<ToolSpec> {
        StockRoom::tools()
    }

    fn initial_observation(&self) -> String {
        format!("The stock room tracks {}.", ITEMS.join(", "))
    }

    async fn step(&mut self, call: &ToolCall) -> Result<Observation> {
        // Misuse is an observation the policy reads; `Err` is for the environment failing.
        if self.submitted.is_some() {
            return Ok(Observation::error("The episode has already ended."));
        }
        Ok(match call.name.as_str() {
            "list_warehouses" => Observation::ok(WAREHOUSES.join(", ")),
            "stock" => {
                let warehouse = call.arguments.get("warehouse").and_then(Value::as_str);
                let item = call.arguments.get("item").and_then(Value::as_str);
                match (warehouse, item) {
                    (Some(w), Some(item)) => match WAREHOUSES.iter().position(|x| *x == w) {
                        Some(index) if ITEMS.contains(&item) => Observation::ok(format!(
                            "{w}: {} {item}",
                            StockRoom::units(self.task_seed, index, item)
                        )),
                        Some(_) => Observation::error(format!(
                            "unknown item; expected one of {}",
                            ITEMS.join(", ")
                        )),
                        None => Observation::error(format!(
                            "unknown warehouse; expected one of {}",
                            WAREHOUSES.join(", ")
                        )),
                    },
                    _ => Observation::error("`warehouse` and `item` must be strings"),
                }
            }
            "submit" => match call.arguments.get("total").and_then(Value::as_u64) {
                Some(total) => {
                    self.submitted = Some(total);
                    Observation::ok("Submitted.").finished()
                }
                None => Observation::error("`total` must be a non-negative integer"),
            },
            other => Observation::error(format!("unknown tool `{other}`")),
        })
    }

    async fn verify(&mut self, final_answer: Option<&str>) -> Result<Outcome> {
        let given = self
            .submitted
            .or_else(|| final_answer.and_then(|a| a.trim().parse().ok()));
        let details = json!({"item": self.item, "expected": self.expected, "given": given});
        Ok(if given == Some(self.expected) {
            Outcome::success(details)
        } else {
            Outcome::failure(details)
        })
    }
}

/// A policy that works the tools: list the warehouses, read each one's stock, add up and submit.
/// It reads only the conversation, so one value serves concurrent episodes.
fn counting_policy() -> FnPolicy<impl Fn(&PolicyRequest) -> String + Send + Sync> {
    FnPolicy::new("counter", |request: &PolicyRequest| {
        let item = ITEMS
            .iter()
            .find(|i| request.messages[1].content.contains(*i))
            .copied()
            .unwrap_or("bolts");
        let results: Vec<&str> = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Tool)
            .map(|m| m.content.as_str())
            .collect();
        let call = match results.len() {
            0 => ToolCall::new("list_warehouses", json!({})),
            n if n <= WAREHOUSES.len() => ToolCall::new(
                "stock",
                json!({"warehouse": WAREHOUSES[n - 1], "item": item}),
            ),
            _ => {
                let total: u64 = results[1..]
                    .iter()
                    .filter_map(|r| r.split_whitespace().nth(1)?.parse::<u64>().ok())
                    .sum();
                ToolCall::new("submit", json!({ "total": total }))
            }
        };
        call.to_tool_call_block()
    })
}

/// Run the conformance suite on the stock room, then one episode of the counting policy.
pub async fn run() -> anyhow::Result<(Report, Trajectory)> {
    let env = StockRoom;
    let tasks = env.tasks(Split::Train)?;
    // The suite's oracle: a reference solver per task (here it knows the answer).
    let oracle = |task: &Task| -> Box<dyn harness_core::Policy> {
        let submit = ToolCall::new("submit", json!({ "total": StockRoom::total(task) }));
        Box::new(ScriptedPolicy::new(vec![submit.to_tool_call_block()]))
    };
    let report = check_environment(&env, &tasks, &oracle, &ConformanceConfig::default()).await;

    let harness = Harness::new("H0", "You answer stock questions with the tools provided.");
    let policy = Arc::new(counting_policy());
    let trajectory = run_episode(policy.as_ref(), &harness, &env, &tasks[0], 1).await?;
    Ok((report, trajectory))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (report, trajectory) = run().await?;
    println!(
        "conformance: {} episodes, {} direct tool calls, {} violations",
        report.episodes,
        report.probes,
        report.failures.len()
    );
    for failure in &report.failures {
        println!("  {failure}");
    }
    println!(
        "episode on {}: reward {} after {} tool calls; verifier details {}",
        trajectory.task_id,
        trajectory.reward(),
        trajectory.counts.env_actions,
        trajectory.outcome.details
    );
    anyhow::ensure!(
        report.failures.is_empty(),
        "the environment broke the protocol"
    );
    Ok(())
}
