//! End to end with the tiny candle policy: two updates of the `router` strategy with the
//! seeded random selector, trained by grpo-candle's `CandleLearner` on the very weights the
//! episodes sample from; and a run broken after its first checkpoint and resumed in a fresh
//! policy ending with bit-identical weights and run files.

mod common;

use std::path::Path;
use std::sync::Arc;

use candle_core::{DType, Device};
use common::CoinEnv;
use grpo_candle::train::learner::CandleLearner;
use grpo_candle::train::trainer::{TrainableLm, TrainerConfig};
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

fn tiny_policy() -> Arc<CandlePolicy> {
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
    Arc::new(CandlePolicy::new(model, PolicyOptions::default()))
}

fn config() -> RescueConfig {
    RescueConfig::from_json(
        r#"{"seed": 5, "updates": 2, "group_size": 4, "batch_tasks": 2, "checkpoint_every": 1,
            "strategy": {"kind": "router", "allocation": {"kind": "top_k"}}}"#,
        None,
    )
    .unwrap()
}

/// One episode at a time: the candle sampler's log-probs can differ in the last bit with the
/// batch a row is decoded in, and concurrent episodes batch by arrival time.
fn sequential() -> RescueConfig {
    RescueConfig {
        concurrency: 1,
        ..config()
    }
}

fn setup(policy: &Arc<CandlePolicy>) -> TrainingSetup {
    let pool = SiblingPool::starter(
        harness("H0"),
        (1..=4).map(|i| harness(&format!("S{i}"))),
        serde_json::Value::Null,
    )
    .unwrap();
    let tasks: Vec<Task> = (0..4)
        .map(|i| Task::new(format!("c{i}"), "coin", Split::Train, "Submit.", i))
        .collect();
    TrainingSetup {
        policy: policy.clone(),
        environments: vec![Arc::new(CoinEnv)],
        selector: Some(Arc::new(RandomSelector::new(&pool))),
        pool,
        train_tasks: tasks,
        validation_tasks: Vec::new(),
        learner: Box::new(CandleLearner::new(policy.clone(), TrainerConfig::default()).unwrap()),
        calibrator: None,
        weight_sync: None,
    }
}

fn weights(policy: &CandlePolicy) -> Vec<(String, Vec<f32>)> {
    let mut vars = TrainableLm::trainable_vars(policy.model());
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    vars.into_iter()
        .map(|(name, v)| {
            (
                name,
                v.as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap(),
            )
        })
        .collect()
}

fn lines(dir: &Path, name: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join(name))
        .unwrap()
        .lines()
        .map(|l| {
            let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
            if let Some(o) = v.as_object_mut() {
                o.retain(|k, _| !k.ends_with("seconds"));
            }
            v
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_router_updates_with_the_tiny_candle_policy_write_the_run_files() {
    let policy = tiny_policy();
    let cfg = config();
    let setup = setup(&policy);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resumed_candle_run_ends_with_the_same_weights_and_files_as_an_unbroken_one() {
    let unbroken = tempfile::tempdir().unwrap();
    let a = tiny_policy();
    RescueTrainer::new(sequential(), setup(&a), unbroken.path())
        .unwrap()
        .run()
        .await
        .unwrap();

    let broken = tempfile::tempdir().unwrap();
    {
        // One update and its checkpoint, then the process "dies" (the trainer and the policy
        // are dropped).
        let b = tiny_policy();
        let mut t = RescueTrainer::new(sequential(), setup(&b), broken.path()).unwrap();
        t.step().await.unwrap();
    }
    // A new process: fresh initial weights, restored from the checkpoint.
    let c = tiny_policy();
    assert_ne!(weights(&c), weights(&a));
    RescueTrainer::resume(sequential(), setup(&c), broken.path())
        .unwrap()
        .run()
        .await
        .unwrap();
    for name in ["groups.jsonl", "trajectories.jsonl", "metrics.jsonl"] {
        let (x, y) = (lines(broken.path(), name), lines(unbroken.path(), name));
        assert_eq!(x.len(), y.len(), "{name}");
        for (i, (p, q)) in x.iter().zip(&y).enumerate() {
            if p != q {
                let (ps, qs) = (p.to_string(), q.to_string());
                let at = ps
                    .bytes()
                    .zip(qs.bytes())
                    .position(|(a, b)| a != b)
                    .unwrap_or(0);
                panic!(
                    "{name} line {i} differs at {at}: {} | {}",
                    &ps[at.saturating_sub(200)..(at + 100).min(ps.len())],
                    &qs[at.saturating_sub(200)..(at + 100).min(qs.len())]
                );
            }
        }
    }
    let (wc, wa) = (weights(&c), weights(&a));
    for ((n, x), (_, y)) in wc.iter().zip(&wa) {
        let d = x
            .iter()
            .zip(y)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        assert!(d == 0.0, "{n}: max |diff| {d}");
    }
}

/// H0 and four siblings that differ from it only by a warn hook after a turn that does not
/// parse (the tiny policy's usual turn): a rescued rollout is H0's until the hook speaks.
fn hook_setup(policy: &Arc<CandlePolicy>, objective: &str) -> (RescueConfig, TrainingSetup) {
    let siblings = (1..=4).map(|i| {
        let mut h = harness("H0");
        h.name = format!("S{i}");
        h.hooks.insert(
            format!("nudge{i}"),
            serde_json::from_value(serde_json::json!({
                "action": "warn", "condition": "always", "event": "on_error",
                "message": format!("Nudge {i}: call submit."), "parameters": {}
            }))
            .unwrap(),
        );
        h
    });
    let pool = SiblingPool::starter(harness("H0"), siblings, serde_json::Value::Null).unwrap();
    let cfg = RescueConfig::from_json(
        &format!(
            r#"{{"seed": 3, "updates": 3, "group_size": 2, "batch_tasks": 2, "checkpoint_every": 0,
                "concurrency": 1, "rescue_objective": "{objective}",
                "strategy": {{"kind": "random_harness"}}}}"#
        ),
        None,
    )
    .unwrap();
    let base = setup(policy);
    let setup = TrainingSetup {
        selector: Some(Arc::new(RandomSelector::new(&pool))),
        pool,
        ..base
    };
    (cfg, setup)
}

/// Each rescue objective runs end to end with grpo-candle's learner, and `metrics.jsonl` says
/// which ran with its figures: `masked` leaves the pre-hook turns out of the learner's tokens,
/// `h0` scores every rescued token under H0's context with a Guide gamma; the paper's objective
/// (the control) scores every retained token and reports no rescue figures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_rescue_objective_runs_with_the_candle_learner_and_is_recorded() {
    for objective in ["generating", "masked", "h0"] {
        let policy = tiny_policy();
        let (cfg, setup) = hook_setup(&policy, objective);
        let dir = tempfile::tempdir().unwrap();
        RescueTrainer::new(cfg, setup, dir.path())
            .unwrap()
            .run()
            .await
            .unwrap();
        let metrics = lines(dir.path(), "metrics.jsonl");
        let updates: Vec<&serde_json::Value> =
            metrics.iter().filter(|m| m["kind"] == "update").collect();
        assert_eq!(updates.len(), 3);
        let rescued: Vec<&&serde_json::Value> = updates
            .iter()
            .filter(|m| m["rescue_trigger_rate"].as_f64().unwrap() > 0.0)
            .collect();
        assert!(!rescued.is_empty(), "{objective}: no rescue in {updates:?}");
        let figure =
            |m: &serde_json::Value, k: &str| m["rescue_figures"][k].as_f64().unwrap_or(0.0);
        for m in &updates {
            assert_eq!(m["rescue_objective"], objective, "{m}");
            let (scored, retained) = (
                m["learner_tokens"].as_f64().unwrap(),
                m["policy_tokens"].as_f64().unwrap(),
            );
            match objective {
                "masked" => assert_eq!(scored, retained - figure(m, "rescue_masked_tokens"), "{m}"),
                _ => assert_eq!(scored, retained, "{m}"),
            }
        }
        let total = |k: &str| updates.iter().map(|m| figure(m, k)).sum::<f64>();
        match objective {
            "generating" => assert!(updates.iter().all(|m| m.get("rescue_figures").is_none())),
            "masked" => assert!(total("rescue_masked_tokens") > 0.0, "{updates:?}"),
            _ => {
                assert!(total("rescue_h0_tokens") > 0.0, "{updates:?}");
                assert!(rescued.iter().all(|m| figure(m, "rescue_h0_gamma") > 0.0));
            }
        }
    }
}

/// `h0` needs a policy that re-renders prompts: one that cannot is refused before sampling,
/// naming the setting; the same policy runs the paper's objective (the control).
#[tokio::test]
async fn h0_is_refused_for_a_policy_that_cannot_rerender() {
    let candle = tiny_policy();
    let scripted: Arc<dyn harness_core::Policy> =
        Arc::new(harness_testkit::ScriptedPolicy::new(vec![
            "<tool_call>{\"name\": \"submit\", \"arguments\": {}}</tool_call>".into(),
        ]));
    for (objective, refused) in [("h0", true), ("generating", false)] {
        let (cfg, setup) = hook_setup(&candle, objective);
        let setup = TrainingSetup {
            policy: scripted.clone(),
            ..setup
        };
        let dir = tempfile::tempdir().unwrap();
        match RescueTrainer::new(cfg, setup, dir.path()) {
            Ok(_) => assert!(!refused, "{objective} was accepted"),
            Err(e) => {
                let e = e.to_string();
                assert!(refused, "{objective}: {e}");
                assert!(
                    e.contains("rescue_objective") && e.contains("render"),
                    "{e}"
                );
            }
        }
    }
}
