//! A reduced rescue run with external Python siblings, printed: DBBench served over HTTP, the
//! recording proxy in front of a scripted policy, and a pool of DBBench's H0 plus two
//! external members, the standard-library agent `agents/dbbench_agent.py` keeping its history
//! exactly and the same agent keeping it as plain text.
//!
//! ```sh
//! cargo run --release -p harness-external --example byoh_rescue -- --tasks 6 --updates 2
//! ```
//!
//! The policy is scripted so that the run says something about the plumbing, not about a
//! model: under H0's prompt it commits a wrong answer (every H0 group fails), under the
//! agent's prompt it plays the task's reference solution. Every group is therefore rescued by
//! the two siblings, whose rescue successes are printed with the proxy's prefix-check counts.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use anyhow::{Context, Result};
use async_trait::async_trait;
use harness_core::{Environment, Group, Learner, Role, Split, ToolCall, UpdateReport};
use harness_envs::dbbench::{self, DbBench, GeneratorConfig};
use harness_external::envserver::server::EnvServerConfig;
use harness_external::program::{
    ExternalHarness, ExternalKind, ProgramEnv, ProgramEnvConfig, ProgramLimits, RunnerSettings,
};
use harness_external::proxy::ProxyConfig;
use harness_pool::SiblingPool;
use harness_rollout::{RandomSelector, RescueConfig, RescueTrainer, TrainingSetup};
use harness_testkit::FnPolicy;
use serde_json::{Value, json};

struct NoUpdate;

#[async_trait]
impl Learner for NoUpdate {
    async fn update(&mut self, _groups: &[Group]) -> harness_core::Result<UpdateReport> {
        Ok(UpdateReport::default())
    }
    fn save_checkpoint(&self, _dir: &Path) -> harness_core::Result<()> {
        Ok(())
    }
    fn load_checkpoint(&mut self, _dir: &Path) -> harness_core::Result<()> {
        Ok(())
    }
}

fn flag(args: &[String], name: &str, default: u64) -> Result<u64> {
    match args.iter().position(|a| a == name) {
        None => Ok(default),
        Some(i) => args
            .get(i + 1)
            .with_context(|| format!("{name}: expected a number after it"))?
            .parse()
            .with_context(|| format!("{name}: expected a whole number")),
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tasks = flag(&args, "--tasks", 6)? as usize;
    let updates = flag(&args, "--updates", 2)?;
    let local = DbBench::generated(&GeneratorConfig {
        seed: 42,
        train: tasks,
        validation: 1,
        test: 1,
    });
    let oracles: Vec<(String, Vec<String>)> = local
        .all_tasks()
        .iter()
        .map(|t| Ok((t.instruction.clone(), dbbench::oracle_turns(t, false)?)))
        .collect::<Result<_>>()?;
    let policy: Arc<dyn harness_core::Policy> = Arc::new(FnPolicy::new("scripted", move |r| {
        if r.messages[0].content.contains("to help a user") {
            return ToolCall::new(dbbench::COMMIT_TOOL, json!({"answers": ["wrong"]}))
                .to_tool_call_block();
        }
        let asked = r.messages.iter().find(|m| m.role == Role::User);
        let done = r
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        oracles
            .iter()
            .find(|(i, _)| asked.is_some_and(|m| m.content.starts_with(i.as_str())))
            .and_then(|(_, turns)| turns.get(done).cloned())
            .unwrap_or_default()
    }));
    let env = Arc::new(
        ProgramEnv::serve(
            Arc::new(local.clone()),
            policy.clone(),
            ProgramEnvConfig {
                proxy: ProxyConfig::new("policy"),
                env_server: EnvServerConfig::default(),
                runner: RunnerSettings {
                    path: std::env::var("PATH").unwrap_or_default(),
                    ..RunnerSettings::default()
                },
            },
        )
        .await?,
    );
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("agents/dbbench_agent.py");
    let member = |name: &str, history: &str| ExternalHarness {
        kind: ExternalKind::External,
        name: name.into(),
        description: format!("agents/dbbench_agent.py with AGENT_HISTORY={history}"),
        command: vec!["python3".into(), script.display().to_string()],
        env: [("AGENT_HISTORY".to_string(), history.to_string())].into(),
        limits: ProgramLimits {
            max_model_calls: dbbench::MAX_ROUNDS,
            max_env_actions: dbbench::MAX_ROUNDS,
            timeout_s: 60.0,
            ..ProgramLimits::default()
        },
    };
    let mut pool = SiblingPool::new(dbbench::base_harness())?;
    let mut names = BTreeMap::new();
    for m in [
        member("python-agent-exact-history", "exact"),
        member("python-agent-text-history", "text"),
    ] {
        names.insert(m.id().0, m.name.clone());
        pool.add(m.to_harness())?;
    }
    pool.freeze();
    let dir = tempfile::tempdir()?;
    let cfg = RescueConfig::from_json(
        &format!(
            r#"{{"seed": 42, "updates": {updates}, "group_size": 2, "batch_tasks": {tasks}, "checkpoint_every": 0,
                 "strategy": {{"kind": "router", "allocation": {{"kind": "top_m_x_n", "m": 2, "n": 1}}}}}}"#
        ),
        None,
    )?;
    let setup = TrainingSetup {
        policy,
        environments: vec![env.clone() as Arc<dyn Environment>],
        selector: Some(Arc::new(RandomSelector::new(&pool))),
        pool,
        train_tasks: local.tasks(Split::Train)?,
        validation_tasks: Vec::new(),
        learner: Box::new(NoUpdate),
        calibrator: None,
        weight_sync: None,
    };
    RescueTrainer::new(cfg, setup, dir.path())?.run().await?;

    let read = |file: &str| -> Result<Vec<Value>> {
        std::fs::read_to_string(dir.path().join(file))?
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| Ok(serde_json::from_str(l)?))
            .collect()
    };
    println!(
        "update  rescue trigger  rescue success  prefix breaks  rescue rollouts (successes) by member"
    );
    for m in read("metrics.jsonl")?
        .iter()
        .filter(|m| m["kind"] == "update")
    {
        let uses: Vec<String> = m["rescue_use"]
            .as_object()
            .into_iter()
            .flatten()
            .map(|(id, u)| {
                format!(
                    "{} {} ({})",
                    names.get(id).map_or(id.as_str(), String::as_str),
                    u["rollouts"],
                    u["successes"]
                )
            })
            .collect();
        println!(
            "{:>6}  {:>14}  {:>14}  {:>13}  {}",
            m["update"].to_string(),
            m["rescue_trigger_rate"].to_string(),
            m["rescue_success"].to_string(),
            m["prefix_breaks"].to_string(),
            uses.join(", ")
        );
    }
    let mut per_member: BTreeMap<String, (usize, usize, u64, usize)> = BTreeMap::new();
    for t in harness_core::read_jsonl(dir.path().join("trajectories.jsonl"))? {
        let row = per_member.entry(t.harness_name.clone()).or_default();
        row.0 += 1;
        row.1 += usize::from(t.is_success());
        row.2 += u64::from(t.counts.prefix_breaks);
        row.3 += t.turns.len();
    }
    println!("\nmember                        episodes  successes  turns  prefix breaks");
    for (name, (episodes, successes, breaks, turns)) in &per_member {
        println!("{name:<28}  {episodes:>8}  {successes:>9}  {turns:>5}  {breaks:>13}");
    }
    let stats = env.proxy().stats();
    println!(
        "\nproxy: {} episodes, {} turns, {} prefix breaks in {} episodes, {} masked, {} refused calls",
        stats.episodes,
        stats.turns,
        stats.prefix_breaks,
        stats.episodes_with_breaks,
        stats.masked_episodes,
        stats.refused_calls
    );
    Ok(())
}
