//! External Python siblings take part in a reduced rescue run: under H0 the policy commits a
//! wrong answer on every task, so every group fails and is rescued; the router's allocation
//! sends one rescue rollout to each of the pool's two siblings, the standard-library Python
//! agent keeping its history exactly and the same agent keeping it as plain text, which solve
//! the tasks through the recording proxy and the environment server; the second one's turns
//! are counted as prefix breaks. An external H0 trains with plain GRPO the same way.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{
    Environment, Group, Learner, Role, Split, Task, ToolCall, Trajectory, UpdateReport,
};
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

fn python() -> Option<&'static str> {
    let found = std::process::Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if found {
        return Some("python3");
    }
    let ci = std::env::var("CI").is_ok_and(|v| matches!(v.trim(), "true" | "1"));
    assert!(
        !ci,
        "python3 is not on PATH and CI=true: the external-harness tests need it"
    );
    println!("skipping: python3 is not on PATH (under CI=true this fails)");
    None
}

/// Counts updates; trains nothing.
#[derive(Default)]
struct CountingLearner {
    groups: Arc<std::sync::Mutex<Vec<Group>>>,
}

#[async_trait]
impl Learner for CountingLearner {
    async fn update(&mut self, groups: &[Group]) -> harness_core::Result<UpdateReport> {
        self.groups.lock().unwrap().extend(groups.iter().cloned());
        Ok(UpdateReport::default())
    }

    fn save_checkpoint(&self, _dir: &Path) -> harness_core::Result<()> {
        Ok(())
    }

    fn load_checkpoint(&mut self, _dir: &Path) -> harness_core::Result<()> {
        Ok(())
    }
}

fn local_env() -> DbBench {
    DbBench::generated(&GeneratorConfig {
        seed: 33,
        train: 3,
        validation: 1,
        test: 1,
    })
}

/// Under DBBench's H0 (its system prompt asks "to help a user") the policy commits a wrong
/// answer at once; under the Python agent's prompt it plays the task's oracle.
fn acting_policy(env: &DbBench) -> Arc<dyn harness_core::Policy> {
    let oracles: Vec<(String, Vec<String>)> = env
        .all_tasks()
        .iter()
        .map(|t| {
            (
                t.instruction.clone(),
                dbbench::oracle_turns(t, false).unwrap(),
            )
        })
        .collect();
    Arc::new(FnPolicy::new("oracle", move |request| {
        let system = &request.messages[0].content;
        if system.contains("to help a user") {
            return ToolCall::new(dbbench::COMMIT_TOOL, json!({"answers": ["wrong"]}))
                .to_tool_call_block();
        }
        let asked = request
            .messages
            .iter()
            .find(|m| m.role == Role::User)
            .map(|m| m.content.clone())
            .unwrap_or_default();
        let done = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        oracles
            .iter()
            .find(|(instruction, _)| asked.starts_with(instruction.as_str()))
            .and_then(|(_, turns)| turns.get(done).cloned())
            .unwrap_or_else(|| "I do not know this task.".into())
    }))
}

fn agent(python: &str) -> ExternalHarness {
    let path: PathBuf = Path::new(env!("CARGO_MANIFEST_DIR")).join("agents/dbbench_agent.py");
    ExternalHarness {
        kind: ExternalKind::External,
        name: "python-dbbench-agent".into(),
        description: "agents/dbbench_agent.py".into(),
        command: vec![python.into(), path.display().to_string()],
        env: [("AGENT_HISTORY".to_string(), "exact".to_string())].into(),
        limits: ProgramLimits {
            max_model_calls: dbbench::MAX_ROUNDS,
            max_env_actions: dbbench::MAX_ROUNDS,
            timeout_s: 60.0,
            ..ProgramLimits::default()
        },
    }
}

async fn program_env(env: &DbBench, policy: Arc<dyn harness_core::Policy>) -> Arc<ProgramEnv> {
    Arc::new(
        ProgramEnv::serve(
            Arc::new(env.clone()),
            policy,
            ProgramEnvConfig {
                proxy: ProxyConfig::new("policy"),
                env_server: EnvServerConfig::default(),
                runner: RunnerSettings {
                    path: std::env::var("PATH").unwrap_or_default(),
                    ..RunnerSettings::default()
                },
            },
        )
        .await
        .unwrap(),
    )
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn config(strategy: &str, group_size: usize) -> RescueConfig {
    RescueConfig::from_json(
        &format!(
            r#"{{"seed": 3, "updates": 1, "group_size": {group_size}, "batch_tasks": 3, "strategy": {strategy}, "checkpoint_every": 0}}"#
        ),
        None,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_python_sibling_rescues_every_failed_group() {
    let Some(python) = python() else { return };
    let local = local_env();
    let policy = acting_policy(&local);
    let env = program_env(&local, policy.clone()).await;
    let sibling = agent(python).to_harness();
    let sibling_id = sibling.id();
    let mut text = agent(python);
    text.name = "python-dbbench-agent-text-history".into();
    text.env.insert("AGENT_HISTORY".into(), "text".into());
    let text_id = text.id();
    assert_ne!(text_id, sibling_id);
    let mut pool = SiblingPool::new(dbbench::base_harness()).unwrap();
    pool.add(sibling).unwrap();
    pool.add(text.to_harness()).unwrap();
    pool.freeze();
    // The external member is stored and loaded like any other.
    let saved = tempfile::tempdir().unwrap();
    pool.save(saved.path()).unwrap();
    let loaded = SiblingPool::load(saved.path()).unwrap();
    assert_eq!(loaded.get(&sibling_id), pool.get(&sibling_id));
    assert!(loaded.get(&sibling_id).unwrap().is_external());
    let train_tasks: Vec<Task> = local.tasks(Split::Train).unwrap();
    let learner = CountingLearner::default();
    let seen = learner.groups.clone();
    let dir = tempfile::tempdir().unwrap();
    let setup = TrainingSetup {
        policy,
        environments: vec![env.clone() as Arc<dyn Environment>],
        selector: Some(Arc::new(RandomSelector::new(&pool))),
        pool,
        train_tasks,
        validation_tasks: Vec::new(),
        learner: Box::new(learner),
        calibrator: None,
        weight_sync: None,
    };
    let cfg = config(
        r#"{"kind": "router", "allocation": {"kind": "top_m_x_n", "m": 2, "n": 1}}"#,
        2,
    );
    let mut trainer = RescueTrainer::new(cfg, setup, dir.path()).unwrap();
    trainer.run().await.unwrap();

    let groups = jsonl(&dir.path().join("groups.jsonl"));
    assert_eq!(groups.len(), 3);
    for g in &groups {
        assert_eq!(g["origin"], "rescue", "{g}");
        assert_eq!(g["base_rewards"], json!([0.0, 0.0]), "{g}");
        let mut rescuers: Vec<String> =
            serde_json::from_value(g["rescue_harnesses"].clone()).unwrap();
        rescuers.sort();
        let mut expected = vec![sibling_id.0.clone(), text_id.0.clone()];
        expected.sort();
        assert_eq!(rescuers, expected, "{g}");
        assert_eq!(g["rescue_rewards"], json!([1.0, 1.0]), "{g}");
        assert_eq!(g["retained"], true);
    }
    let update = jsonl(&dir.path().join("metrics.jsonl"))
        .into_iter()
        .find(|m| m["kind"] == "update")
        .unwrap();
    assert_eq!(update["rescue_trigger_rate"], 1.0, "{update}");
    assert_eq!(update["rescue_success"], 1.0, "{update}");
    // The run's metrics count the text-history sibling's drift: one break per later turn.
    let written: Vec<Trajectory> =
        harness_core::read_jsonl(dir.path().join("trajectories.jsonl")).unwrap();
    let drift: u64 = written
        .iter()
        .filter(|t| t.harness_id == text_id)
        .map(|t| t.turns.len() as u64 - 1)
        .sum();
    assert!(drift >= 3);
    assert_eq!(update["prefix_breaks"], drift, "{update}");
    assert!(written.iter().all(|t| {
        u64::from(t.counts.prefix_breaks)
            == t.outcome.details["external"]["prefix_breaks"]
                .as_u64()
                .unwrap_or(0)
    }));
    for id in [&sibling_id, &text_id] {
        assert_eq!(update["rescue_use"][&id.0]["successes"], 3, "{update}");
    }

    // The learner got the rescued groups with the tokens the proxy recorded.
    let seen = seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 3);
    for group in &seen {
        for t in &group.trajectories {
            assert!(t.is_success());
            assert!(!t.turns.is_empty() && t.turns.iter().all(|turn| !turn.tokens.is_empty()));
            let breaks = &t.outcome.details["external"]["prefix_breaks"];
            if t.harness_id == sibling_id {
                assert_eq!(breaks, 0, "{}", t.transcript());
            } else {
                // Every turn after the first follows a history the policy never produced.
                assert_eq!(t.harness_id, text_id);
                assert_eq!(breaks, t.turns.len() - 1, "{}", t.transcript());
                assert!(t.turns.len() > 1);
            }
        }
    }
    assert_eq!(written.len(), 12, "6 base and 6 rescue rollouts");
    let stats = env.proxy().stats();
    assert_eq!(stats.episodes, 6);
    assert_eq!(stats.episodes_with_breaks, 3);
    assert!(stats.prefix_breaks >= 3, "{stats:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_external_h0_trains_with_plain_grpo() {
    let Some(python) = python() else { return };
    let local = local_env();
    let policy = acting_policy(&local);
    let env = program_env(&local, policy.clone()).await;
    let base = agent(python).to_harness();
    let base_id = base.id();
    let mut pool = SiblingPool::new(base).unwrap();
    pool.freeze();
    let dir = tempfile::tempdir().unwrap();
    let setup = TrainingSetup {
        policy,
        environments: vec![env.clone() as Arc<dyn Environment>],
        selector: None,
        pool,
        train_tasks: local.tasks(Split::Train).unwrap(),
        validation_tasks: Vec::new(),
        learner: Box::new(CountingLearner::default()),
        calibrator: None,
        weight_sync: None,
    };
    let mut trainer =
        RescueTrainer::new(config(r#"{"kind": "grpo"}"#, 2), setup, dir.path()).unwrap();
    trainer.run().await.unwrap();
    let groups = jsonl(&dir.path().join("groups.jsonl"));
    assert_eq!(groups.len(), 3);
    for g in &groups {
        assert_eq!(g["origin"], "base");
        assert_eq!(g["base_rewards"], json!([1.0, 1.0]), "{g}");
        assert_eq!(
            g["retained_harnesses"],
            json!([base_id.0, base_id.0]),
            "{g}"
        );
    }

    // An environment that cannot run programs refuses an external harness by name.
    let err = harness_core::run_episode(
        acting_policy(&local).as_ref(),
        &agent(python).to_harness(),
        &local,
        &local.tasks(Split::Train).unwrap()[0],
        1,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("python-dbbench-agent") && err.contains("ProgramEnv"),
        "{err}"
    );
}
