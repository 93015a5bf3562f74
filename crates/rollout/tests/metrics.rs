//! Property test: over random success patterns, every number in `metrics.jsonl` equals a direct
//! computation from the trajectories the run wrote.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;

use common::*;
use harness_core::{HarnessId, Trajectory};
use harness_rollout::{RandomSelector, RescueConfig, RescueTrainer, TrainingSetup, UpdateRecord};
use proptest::prelude::*;

const K: usize = 4;
const TASKS: usize = 3;
const UPDATES: u64 = 2;

fn run(
    strategy: &str,
    salt: u64,
    p_base: f64,
    p_sibling: f64,
) -> (Vec<UpdateRecord>, Vec<Trajectory>, HarnessId) {
    let cfg = RescueConfig::from_json(
        &format!(
            r#"{{"seed": {salt}, "updates": {UPDATES}, "group_size": {K}, "batch_tasks": {TASKS}, "strategy": {strategy}, "checkpoint_every": 0}}"#
        ),
        None,
    )
    .unwrap();
    let pool = pool(5);
    let base = pool.base_id().clone();
    let dir = tempfile::tempdir().unwrap();
    let setup = TrainingSetup {
        policy: oracle(hashed(salt, p_base, p_sibling)),
        environments: vec![Arc::new(CountingEnv::new())],
        selector: Some(Arc::new(RandomSelector::new(&pool))),
        pool,
        train_tasks: tasks(TASKS),
        validation_tasks: Vec::new(),
        learner: Box::new(ScriptedLearner::default()),
        calibrator: None,
        weight_sync: None,
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut t = RescueTrainer::new(cfg, setup, dir.path()).unwrap();
        t.run().await.unwrap();
    });
    let metrics = jsonl(&dir.path().join("metrics.jsonl"))
        .into_iter()
        .filter(|v| v["kind"] == "update")
        .map(|v| serde_json::from_value(v).unwrap())
        .collect();
    let trajectories = harness_core::read_jsonl(dir.path().join("trajectories.jsonl")).unwrap();
    (metrics, trajectories, base)
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-12
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn every_metric_equals_a_direct_computation(
        salt in any::<u64>(),
        p_base in 0.0f64..0.6,
        p_sibling in 0.0f64..1.0,
        which in 0usize..3,
    ) {
        let (strategy, rescues) = [
            (r#"{"kind": "router"}"#, true),
            (r#"{"kind": "h0_rescue"}"#, true),
            (r#"{"kind": "grpo"}"#, false),
        ][which];
        let (metrics, trajectories, base) = run(strategy, salt, p_base, p_sibling);
        prop_assert_eq!(metrics.len(), UPDATES as usize);
        let mut rest = trajectories.iter();
        for m in &metrics {
            let (mut effective, mut retained_tokens, mut effective_tokens) = (0usize, 0usize, 0usize);
            let (mut all_fail, mut rescued, mut rescued_ok) = (0usize, 0usize, 0usize);
            let (mut base_rewards, mut retained_rewards) = (Vec::new(), Vec::new());
            let mut uses: BTreeMap<HarnessId, (usize, usize)> = BTreeMap::new();
            let mut rescue_rollouts = 0;
            for _ in 0..TASKS {
                let base_group: Vec<&Trajectory> = rest.by_ref().take(K).collect();
                prop_assert!(base_group.iter().all(|t| t.harness_id == base && t.task_id == base_group[0].task_id));
                let failed = !base_group.iter().any(|t| t.is_success());
                base_rewards.extend(base_group.iter().map(|t| t.reward()));
                all_fail += usize::from(failed);
                let retained = if failed && rescues {
                    let rescue: Vec<&Trajectory> = rest.by_ref().take(K).collect();
                    rescued += 1;
                    rescue_rollouts += K;
                    rescued_ok += usize::from(rescue.iter().any(|t| t.is_success()));
                    for t in &rescue {
                        let u = uses.entry(t.harness_id.clone()).or_default();
                        u.0 += 1;
                        u.1 += usize::from(t.is_success());
                    }
                    rescue
                } else {
                    base_group
                };
                let successes = retained.iter().filter(|t| t.is_success()).count();
                let tokens: usize = retained.iter().map(|t| t.policy_tokens()).sum();
                retained_tokens += tokens;
                if successes > 0 && successes < retained.len() {
                    effective += 1;
                    effective_tokens += tokens;
                }
                retained_rewards.extend(retained.iter().map(|t| t.reward()));
            }
            let mean = |v: &[f32]| v.iter().map(|x| f64::from(*x)).sum::<f64>() / v.len() as f64;
            prop_assert!(close(m.eg_rate, effective as f64 / TASKS as f64));
            prop_assert!(close(m.effective_token_share, effective_tokens as f64 / retained_tokens as f64));
            prop_assert!(close(m.all_fail_rate, all_fail as f64 / TASKS as f64));
            prop_assert!(close(m.rescue_trigger_rate, rescued as f64 / TASKS as f64));
            prop_assert_eq!(m.rescue_success, (rescued > 0).then(|| rescued_ok as f64 / rescued as f64));
            prop_assert!(close(m.base_reward_mean, mean(&base_rewards)));
            prop_assert!(close(m.retained_reward_mean, mean(&retained_rewards)));
            prop_assert_eq!(m.rollouts_base, TASKS * K);
            prop_assert_eq!(m.rollouts_rescue, rescue_rollouts);
            prop_assert_eq!(m.policy_tokens, retained_tokens);
            prop_assert_eq!(m.learner_tokens, retained_tokens);
            let got: BTreeMap<HarnessId, (usize, usize)> =
                m.rescue_use.iter().map(|(k, v)| (k.clone(), (v.rollouts, v.successes))).collect();
            prop_assert_eq!(got, uses);
        }
        prop_assert!(rest.next().is_none());
    }
}
