//! End to end with the tiny candle policy: two updates of the `router` strategy with the
//! seeded random selector, trained by grpo-candle's `CandleLearner` on the very weights the
//! episodes sample from.

mod common;

use std::sync::Arc;

use candle_core::{DType, Device};
use common::CoinEnv;
use grpo_candle::learner::CandleLearner;
use grpo_candle::trainer::TrainerConfig;
use grpo_candle::{CandlePolicy, PolicyModel, PolicyOptions, TinySpec};
use harness_core::{Harness, Split, Task};
use harness_pool::SiblingPool;
use harness_rollout::{RandomSelector, RescueConfig, RescueTrainer, TrainingSetup};

fn harness(name: &str) -> Harness {
    let mut h = Harness::new(name, format!("You are {name}. Call submit."));
    h.limits.max_model_calls = 2;
    h.limits.max_output_tokens = 6;
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_router_updates_with_the_tiny_candle_policy_write_the_run_files() {
    let model = PolicyModel::tiny(
        &TinySpec {
            num_merges: 16,
            hidden_size: 32,
            num_layers: 1,
            intermediate_size: 64,
            ..TinySpec::default()
        },
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let policy = Arc::new(CandlePolicy::new(model, PolicyOptions::default()));
    let pool = SiblingPool::starter(
        harness("H0"),
        (1..=4).map(|i| harness(&format!("S{i}"))),
        serde_json::Value::Null,
    )
    .unwrap();
    let tasks: Vec<Task> = (0..4)
        .map(|i| Task::new(format!("c{i}"), "coin", Split::Train, "Submit.", i))
        .collect();
    let cfg = RescueConfig::from_json(
        r#"{"seed": 5, "updates": 2, "group_size": 4, "batch_tasks": 2, "checkpoint_every": 1,
            "strategy": {"kind": "router", "allocation": {"kind": "top_k"}}}"#,
        None,
    )
    .unwrap();
    let setup = TrainingSetup {
        policy: policy.clone(),
        environments: vec![Arc::new(CoinEnv)],
        selector: Some(Arc::new(RandomSelector::new(&pool))),
        pool,
        train_tasks: tasks,
        validation_tasks: Vec::new(),
        learner: Box::new(CandleLearner::new(policy, TrainerConfig::default()).unwrap()),
        calibrator: None,
        weight_sync: None,
    };
    let dir = tempfile::tempdir().unwrap();
    let mut trainer = RescueTrainer::new(cfg, setup, dir.path()).unwrap();
    let cost = trainer.run().await.unwrap();
    assert_eq!(cost.updates, 2);

    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    let metrics: Vec<serde_json::Value> = read("metrics.jsonl")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(metrics.len(), 2);
    for m in &metrics {
        let loss = m["loss"].as_f64().unwrap();
        assert!(loss.is_finite(), "{m}");
        assert!(m["grad_norm"].as_f64().unwrap().is_finite());
        // Only policy tokens reach the loss: the learner scored exactly the retained groups'
        // generated tokens.
        assert_eq!(m["learner_tokens"], m["policy_tokens"]);
        assert!(m["policy_tokens"].as_u64().unwrap() > 0);
    }
    assert_eq!(metrics[1]["policy_version"], 2);
    assert_eq!(read("groups.jsonl").lines().count(), 4);
    let trajectories = harness_core::read_jsonl(dir.path().join("trajectories.jsonl")).unwrap();
    assert!(trajectories.len() >= 16);
    assert!(
        trajectories
            .iter()
            .all(|t| t.turns.iter().all(|turn| !turn.context_tokens.is_empty()))
    );
    let (ckpt, state) = harness_rollout::latest_checkpoint(dir.path())
        .unwrap()
        .unwrap();
    assert!(state.finished);
    assert!(
        ckpt.join("learner/config.json").is_file(),
        "HF weights in the checkpoint"
    );
}
