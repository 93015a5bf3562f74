//! The rescue loop against scripted policies, environments, selectors and learners: Eq. 5,
//! every strategy's allocation, strict selector checks, seeds, calibration and the run files.

mod common;

use std::sync::{Arc, Mutex};

use common::*;
use harness_core::{GroupOrigin, HarnessId, SelectionMode, Source};
use harness_pool::SiblingPool;
use harness_rollout::{
    GroupRecord, RandomSelector, RescueConfig, RescueTrainer, TrainingSetup, UpdateRecord,
    run_training,
};

struct Fixture {
    cfg: RescueConfig,
    pool: SiblingPool,
    env: Arc<CountingEnv>,
    seen: Arc<Mutex<Vec<Vec<harness_core::Group>>>>,
    dir: tempfile::TempDir,
}

fn fixture(strategy: &str, updates: u64) -> Fixture {
    let cfg = RescueConfig::from_json(
        &format!(
            r#"{{"seed": 11, "updates": {updates}, "group_size": 4, "batch_tasks": 3, "concurrency": 5,
                 "strategy": {strategy}, "checkpoint_every": 0}}"#
        ),
        None,
    )
    .unwrap();
    Fixture {
        cfg,
        pool: pool(5),
        env: Arc::new(CountingEnv::new()),
        seen: Arc::default(),
        dir: tempfile::tempdir().unwrap(),
    }
}

impl Fixture {
    fn setup(
        &self,
        policy: Arc<dyn harness_core::Policy>,
        selector: Option<Arc<dyn harness_core::HarnessSelector>>,
    ) -> TrainingSetup {
        TrainingSetup {
            policy,
            environments: vec![self.env.clone()],
            pool: self.pool.clone(),
            train_tasks: tasks(3),
            validation_tasks: Vec::new(),
            learner: Box::new(ScriptedLearner {
                seen: self.seen.clone(),
                ..ScriptedLearner::default()
            }),
            selector,
            calibrator: None,
            weight_sync: None,
        }
    }

    fn groups(&self) -> Vec<GroupRecord> {
        jsonl(&self.dir.path().join("groups.jsonl"))
            .into_iter()
            .map(|v| serde_json::from_value(v).unwrap())
            .collect()
    }

    fn metrics(&self) -> Vec<UpdateRecord> {
        jsonl(&self.dir.path().join("metrics.jsonl"))
            .into_iter()
            .filter(|v| v["kind"] == "update")
            .map(|v| serde_json::from_value(v).unwrap())
            .collect()
    }

    fn id(&self, name: &str) -> HarnessId {
        self.pool
            .members()
            .iter()
            .find(|h| h.name == name)
            .unwrap()
            .id()
    }
}

/// t0: H0 succeeds on some seeds; t1 and t2: H0 always fails, siblings S2 and S4 succeed.
fn mixed_policy() -> Arc<dyn harness_core::Policy> {
    oracle(|h, t, s| match (h, t) {
        ("H0", "t0") => s % 2 == 0,
        ("H0", _) => false,
        ("S2" | "S4", "t1" | "t2") => true,
        _ => false,
    })
}

fn reverse_selector(
    pool: &SiblingPool,
) -> Arc<
    ScriptedSelector<
        impl Fn(&harness_core::SelectionRequest) -> Vec<HarnessId> + Send + Sync + use<>,
    >,
> {
    let aux: Vec<HarnessId> = pool
        .auxiliaries()
        .map(|h| h.id())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .collect();
    Arc::new(ScriptedSelector::new(
        move |r: &harness_core::SelectionRequest| aux.iter().take(r.k).cloned().collect(),
    ))
}

#[tokio::test]
async fn rescue_triggers_iff_all_base_rollouts_fail_and_the_retained_group_is_eq5() {
    let f = fixture(r#"{"kind": "router"}"#, 3);
    let selector = reverse_selector(&f.pool);
    let mut t = RescueTrainer::new(
        f.cfg.clone(),
        f.setup(mixed_policy(), Some(selector.clone())),
        f.dir.path(),
    )
    .unwrap();
    t.run().await.unwrap();
    let groups = f.groups();
    assert_eq!(groups.len(), 9);
    let order: Vec<HarnessId> = f
        .pool
        .auxiliaries()
        .map(|h| h.id())
        .collect::<Vec<_>>()
        .into_iter()
        .rev()
        .take(4)
        .collect();
    let seen = f.seen.lock().unwrap();
    for (i, g) in groups.iter().enumerate() {
        let any_success = g.base_rewards.iter().any(|r| *r >= 1.0);
        assert_eq!(g.base_rewards.len(), 4);
        assert_eq!(g.rescued(), !any_success, "{g:?}");
        let learner_group = &seen[i / 3][i % 3];
        assert_eq!(learner_group.task.id, g.task_id);
        if any_success {
            assert_eq!(g.origin, GroupOrigin::Base);
            assert_eq!(g.retained_rewards, g.base_rewards);
            assert!(g.rescue_harnesses.is_empty());
            assert!(
                learner_group
                    .trajectories
                    .iter()
                    .all(|t| t.harness_id == *f.pool.base_id())
            );
        } else {
            // Eq. 5: the rescue group replaces the failed one, in the selector's order.
            assert_eq!(g.origin, GroupOrigin::Rescue);
            assert_eq!(g.rescue_harnesses, order);
            assert_eq!(g.retained_harnesses, order);
            assert_eq!(g.retained_rewards, g.rescue_rewards);
            assert!(!g.retained_harnesses.contains(f.pool.base_id()));
            let ids: Vec<HarnessId> = learner_group
                .trajectories
                .iter()
                .map(|t| t.harness_id.clone())
                .collect();
            assert_eq!(ids, order);
        }
    }
    // t1 and t2 always fail under H0; S2 and S4 rescue them.
    assert!(
        groups
            .iter()
            .filter(|g| g.task_id != "t0")
            .all(|g| g.rescued())
    );
    let m = f.metrics();
    assert!(m.iter().all(|m| m.rescue_success == Some(1.0)));
    let requests = selector.requests.lock().unwrap();
    assert_eq!(
        requests.len(),
        groups.iter().filter(|g| g.rescued()).count()
    );
    assert!(
        requests
            .iter()
            .all(|r| r.mode == SelectionMode::Rescue && r.k == 4)
    );
}

#[tokio::test]
async fn each_rollout_starts_from_a_fresh_session_and_rescue_never_reuses_a_base_seed() {
    let f = fixture(r#"{"kind": "h0_rescue"}"#, 2);
    let mut t =
        RescueTrainer::new(f.cfg.clone(), f.setup(mixed_policy(), None), f.dir.path()).unwrap();
    t.run().await.unwrap();
    let groups = f.groups();
    let rollouts: usize = groups
        .iter()
        .map(|g| g.base_rewards.len() + g.rescue_rewards.len())
        .sum();
    let resets = f.env.resets.lock().unwrap().clone();
    assert_eq!(
        resets.len(),
        rollouts,
        "one environment session per rollout"
    );
    let trajectories = harness_core::read_jsonl(f.dir.path().join("trajectories.jsonl")).unwrap();
    assert_eq!(trajectories.len(), rollouts);
    let mut seeds: Vec<u64> = trajectories.iter().map(|t| t.seed).collect();
    seeds.sort();
    seeds.dedup();
    assert_eq!(
        seeds.len(),
        rollouts,
        "every rollout of the run has its own seed"
    );
    // h0_rescue: K fresh H0 rollouts for every all-failure task.
    for g in groups.iter().filter(|g| g.rescued()) {
        assert_eq!(g.rescue_harnesses, vec![f.pool.base_id().clone()]);
        assert_eq!(g.retained_harnesses, vec![f.pool.base_id().clone(); 4]);
    }
    assert!(groups.iter().any(|g| g.rescued()));
}

#[tokio::test]
async fn run_training_refuses_a_folder_another_run_holds_and_runs_once_it_is_free() {
    let f = fixture(r#"{"kind": "grpo"}"#, 1);
    let held = harness_core::fsutil::DirLock::acquire(f.dir.path()).unwrap();
    let err = run_training(
        f.cfg.clone(),
        f.setup(mixed_policy(), None),
        f.dir.path(),
        false,
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(err.contains("another run holds this folder"), "{err}");
    assert!(
        f.metrics().is_empty(),
        "nothing is written while the folder is held"
    );
    drop(held);
    let cost = run_training(
        f.cfg.clone(),
        f.setup(mixed_policy(), None),
        f.dir.path(),
        false,
    )
    .await
    .unwrap();
    assert_eq!(cost.training_rollouts.total, 3 * 4);
}

#[tokio::test]
async fn plain_grpo_keeps_every_initial_group() {
    let f = fixture(r#"{"kind": "grpo"}"#, 2);
    let mut t =
        RescueTrainer::new(f.cfg.clone(), f.setup(mixed_policy(), None), f.dir.path()).unwrap();
    let cost = t.run().await.unwrap();
    assert!(
        f.groups()
            .iter()
            .all(|g| g.origin == GroupOrigin::Base && g.retained_rewards == g.base_rewards)
    );
    assert!(
        f.metrics()
            .iter()
            .all(|m| m.rescue_trigger_rate == 0.0 && m.all_fail_rate > 0.0)
    );
    assert_eq!(cost.training_rollouts.total, 2 * 3 * 4);
    assert_eq!(cost.rollouts_relative_to_plain_grpo, 1.0);
}

#[tokio::test]
async fn top_m_x_n_gives_n_rollouts_to_each_of_m_harnesses() {
    let f = fixture(
        r#"{"kind": "router", "allocation": {"kind": "top_m_x_n", "m": 2, "n": 2}}"#,
        2,
    );
    let selector = reverse_selector(&f.pool);
    let mut t = RescueTrainer::new(
        f.cfg.clone(),
        f.setup(mixed_policy(), Some(selector.clone())),
        f.dir.path(),
    )
    .unwrap();
    t.run().await.unwrap();
    let (a, b) = (f.id("S5"), f.id("S4"));
    let rescued: Vec<GroupRecord> = f.groups().into_iter().filter(|g| g.rescued()).collect();
    assert!(!rescued.is_empty());
    for g in rescued {
        assert_eq!(g.rescue_harnesses, vec![a.clone(), b.clone()]);
        assert_eq!(
            g.retained_harnesses,
            vec![a.clone(), a.clone(), b.clone(), b.clone()]
        );
    }
    assert!(selector.requests.lock().unwrap().iter().all(|r| r.k == 2));
}

#[tokio::test]
async fn fixed_mixture_honours_its_counts_on_every_task_without_waiting_for_failure() {
    let f = fixture(
        r#"{"kind": "fixed_mixture", "mixture": [{"harness": "base", "rollouts": 1}, {"harness": "S3", "rollouts": 3}]}"#,
        2,
    );
    let mut t =
        RescueTrainer::new(f.cfg.clone(), f.setup(mixed_policy(), None), f.dir.path()).unwrap();
    let cost = t.run().await.unwrap();
    let s3 = f.id("S3");
    for g in f.groups() {
        assert_eq!(g.origin, GroupOrigin::Mixture);
        assert_eq!(
            g.retained_harnesses,
            vec![f.pool.base_id().clone(), s3.clone(), s3.clone(), s3.clone()]
        );
        assert!(g.rescue_harnesses.is_empty());
    }
    assert_eq!(cost.training_rollouts.mixture, 2 * 3 * 4);
    assert_eq!(cost.rollouts_relative_to_plain_grpo, 1.0);
}

#[tokio::test]
async fn random_harness_rescues_with_k_distinct_auxiliaries() {
    let f = fixture(r#"{"kind": "random_harness"}"#, 3);
    let mut t =
        RescueTrainer::new(f.cfg.clone(), f.setup(mixed_policy(), None), f.dir.path()).unwrap();
    t.run().await.unwrap();
    let rescued: Vec<GroupRecord> = f.groups().into_iter().filter(|g| g.rescued()).collect();
    assert!(!rescued.is_empty());
    let mut orders = std::collections::HashSet::new();
    for g in rescued {
        let mut ids = g.rescue_harnesses.clone();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), 4);
        assert!(
            ids.iter()
                .all(|id| id != f.pool.base_id() && f.pool.contains(id))
        );
        orders.insert(g.rescue_harnesses);
    }
    assert!(orders.len() > 1, "draws differ between tasks and updates");
}

#[tokio::test]
async fn dynamic_sampling_keeps_only_groups_with_reward_variance_and_draws_more_tasks() {
    let f = fixture(r#"{"kind": "dynamic_sampling", "max_batches": 3}"#, 2);
    let mut t =
        RescueTrainer::new(f.cfg.clone(), f.setup(mixed_policy(), None), f.dir.path()).unwrap();
    t.run().await.unwrap();
    let groups = f.groups();
    for g in &groups {
        let mixed =
            g.base_rewards.iter().any(|r| *r >= 1.0) && g.base_rewards.iter().any(|r| *r < 1.0);
        if g.retained {
            assert!(mixed, "{g:?}");
        } else {
            assert!(g.retained_rewards.is_empty());
        }
    }
    // Only t0 can have mixed rewards, so every update draws the bound of 3 batches.
    let m = f.metrics();
    assert!(m.iter().all(|m| m.tasks == 9 && m.eg_rate == 1.0), "{m:?}");
}

#[tokio::test]
async fn dynamic_sampling_draws_extra_tasks_from_its_own_stream_so_updates_stay_paired() {
    // Every update's first batch of dynamic sampling is plain GRPO's batch of that update: the
    // same tasks with the same draw numbers (and so the same episode seeds). Its extra draws
    // come from a stream of their own, with draw numbers no main draw has.
    let mut runs = Vec::new();
    for strategy in [
        r#"{"kind": "grpo"}"#,
        r#"{"kind": "dynamic_sampling", "max_batches": 3}"#,
    ] {
        let f = fixture(strategy, 3);
        RescueTrainer::new(f.cfg.clone(), f.setup(mixed_policy(), None), f.dir.path())
            .unwrap()
            .run()
            .await
            .unwrap();
        runs.push(f);
    }
    let (grpo, dynamic) = (&runs[0], &runs[1]);
    let (g, d) = (grpo.groups(), dynamic.groups());
    for update in 1..=3 {
        let of = |groups: &[GroupRecord]| -> Vec<(String, u64)> {
            groups
                .iter()
                .filter(|r| r.update == update)
                .map(|r| (r.task_id.clone(), r.draw))
                .collect()
        };
        let (plain, dyn_all) = (of(&g), of(&d));
        assert_eq!(plain.len(), 3);
        assert_eq!(dyn_all.len(), 9, "three batches per update");
        assert_eq!(dyn_all[..3], plain[..], "update {update}: first batch");
        assert!(
            dyn_all[3..]
                .iter()
                .all(|(_, draw)| *draw >= harness_rollout::order::EXTRA_DRAW_BASE),
            "update {update}: {dyn_all:?}"
        );
    }
}

async fn bad_answer(answer: impl Fn(&SiblingPool) -> Vec<HarnessId>) -> String {
    let f = fixture(r#"{"kind": "router"}"#, 1);
    let ids = answer(&f.pool);
    let selector = Arc::new(ScriptedSelector::new(
        move |_: &harness_core::SelectionRequest| ids.clone(),
    ));
    let mut t = RescueTrainer::new(
        f.cfg.clone(),
        f.setup(mixed_policy(), Some(selector)),
        f.dir.path(),
    )
    .unwrap();
    let err = t.run().await.unwrap_err().to_string();
    assert!(err.contains("scripted-selector"), "{err}");
    err
}

#[tokio::test]
async fn bad_selector_answers_are_errors_naming_the_selector_and_its_answer() {
    let aux = |p: &SiblingPool| p.auxiliaries().map(|h| h.id()).collect::<Vec<_>>();
    let err = bad_answer(|p| aux(p)[..3].to_vec()).await;
    assert!(err.contains("3 harnesses instead of 4"), "{err}");
    let err = bad_answer(|p| [vec![p.base_id().clone()], aux(p)[..3].to_vec()].concat()).await;
    assert!(err.contains("is the base harness H0"), "{err}");
    let err = bad_answer(|p| {
        let a = aux(p);
        vec![a[0].clone(), a[1].clone(), a[2].clone(), a[0].clone()]
    })
    .await;
    assert!(err.contains("appears twice"), "{err}");
    let err = bad_answer(|p| {
        [
            aux(p)[..3].to_vec(),
            vec![HarnessId("feedfacefeedface".into())],
        ]
        .concat()
    })
    .await;
    assert!(
        err.contains("`feedfacefeedface` is not a member of the pool"),
        "{err}"
    );
    let err = bad_answer(|p| aux(p)).await;
    assert!(err.contains("5 harnesses instead of 4"), "{err}");
}

#[tokio::test]
async fn rescue_trajectories_reach_the_learner_in_their_own_generating_context() {
    let f = fixture(r#"{"kind": "router"}"#, 1);
    let selector = Arc::new(RandomSelector::new(&f.pool));
    let mut t = RescueTrainer::new(
        f.cfg.clone(),
        f.setup(mixed_policy(), Some(selector)),
        f.dir.path(),
    )
    .unwrap();
    t.run().await.unwrap();
    let seen = f.seen.lock().unwrap();
    let mut checked = 0;
    for g in seen
        .iter()
        .flatten()
        .filter(|g| g.origin == GroupOrigin::Rescue)
    {
        for tr in &g.trajectories {
            let sibling = f.pool.get(&tr.harness_id).unwrap();
            assert_ne!(sibling.name, "H0");
            for turn in &tr.turns {
                // The scripted policy's context tokens are the rendered prompt's bytes.
                let context =
                    String::from_utf8(turn.context_tokens.iter().map(|t| *t as u8).collect())
                        .unwrap();
                assert!(
                    context.contains(&format!("harness={}.", sibling.name)),
                    "{context}"
                );
                assert!(!context.contains("harness=H0."));
                let i = turn.message_index.unwrap();
                assert_eq!(tr.messages[i].source, Source::Policy);
                checked += 1;
            }
        }
    }
    assert!(checked > 0);
}

#[tokio::test]
async fn calibration_runs_before_training_when_due_and_with_the_final_policy() {
    let mut f = fixture(r#"{"kind": "router"}"#, 5);
    f.cfg.calibrate_every = 2;
    let calibrator = Arc::new(RecordingCalibrator::default());
    let mut setup = f.setup(mixed_policy(), Some(Arc::new(RandomSelector::new(&f.pool))));
    setup.calibrator = Some(calibrator.clone());
    let mut t = RescueTrainer::new(f.cfg.clone(), setup, f.dir.path()).unwrap();
    let cost = t.run().await.unwrap();
    let points = calibrator.points.lock().unwrap();
    let at: Vec<(u32, u64, bool)> = points
        .iter()
        .map(|p| (p.index, p.update, p.is_final))
        .collect();
    assert_eq!(
        at,
        vec![(0, 0, false), (1, 2, false), (2, 4, false), (3, 5, true)]
    );
    assert_eq!(cost.calibration_rollouts, 16);
    assert_eq!(cost.external_llm_tokens["profiler"].prompt_tokens, 400);
    let lines = jsonl(&f.dir.path().join("metrics.jsonl"));
    assert_eq!(
        lines.iter().filter(|l| l["kind"] == "calibration").count(),
        4
    );
}

#[tokio::test]
async fn the_router_strategy_without_a_selector_and_a_too_small_pool_are_config_errors() {
    let f = fixture(r#"{"kind": "router"}"#, 1);
    let err = RescueTrainer::new(f.cfg.clone(), f.setup(mixed_policy(), None), f.dir.path())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("`strategy`") && err.contains("selector"),
        "{err}"
    );
    let mut setup = f.setup(mixed_policy(), Some(Arc::new(RandomSelector::new(&f.pool))));
    setup.pool = pool(3);
    let err = RescueTrainer::new(f.cfg.clone(), setup, f.dir.path())
        .err()
        .unwrap()
        .to_string();
    assert!(
        err.contains("needs 4 distinct auxiliary harnesses but the pool has 3"),
        "{err}"
    );
}

#[tokio::test]
async fn the_run_files_carry_the_documented_fields() {
    let mut f = fixture(r#"{"kind": "router"}"#, 2);
    f.cfg.eval_every = 1;
    let mut setup = f.setup(mixed_policy(), Some(Arc::new(RandomSelector::new(&f.pool))));
    setup.validation_tasks = tasks(2)
        .into_iter()
        .map(|mut t| {
            t.split = harness_core::Split::Validation;
            t
        })
        .collect();
    let mut t = RescueTrainer::new(f.cfg.clone(), setup, f.dir.path()).unwrap();
    t.run().await.unwrap();
    let lines = jsonl(&f.dir.path().join("metrics.jsonl"));
    let update = lines.iter().find(|l| l["kind"] == "update").unwrap();
    for field in [
        "update",
        "strategy",
        "eg_rate",
        "effective_token_share",
        "rescue_trigger_rate",
        "rescue_success",
        "rescue_use",
        "base_reward_mean",
        "retained_reward_mean",
        "rollouts_base",
        "rollouts_rescue",
        "policy_tokens",
        "loss",
        "grad_norm",
        "clip_frac_low",
        "clip_frac_high",
        "weight_mean",
        "weight_clipped_frac",
        "lr",
        "rollout_seconds",
        "update_seconds",
        "calibration_seconds",
    ] {
        assert!(
            update.get(field).is_some(),
            "metrics.jsonl lacks `{field}`: {update}"
        );
    }
    let eval = lines.iter().find(|l| l["kind"] == "eval").unwrap();
    assert_eq!(eval["k"], 3);
    assert!(eval["pass_at_k"].is_number() && eval["avg_at_k"].is_number());
    let group = &jsonl(&f.dir.path().join("groups.jsonl"))[0];
    for field in [
        "update",
        "task_id",
        "origin",
        "base_rewards",
        "rescue_harnesses",
        "retained_rewards",
        "retained_harnesses",
        "policy_tokens",
    ] {
        assert!(
            group.get(field).is_some(),
            "groups.jsonl lacks `{field}`: {group}"
        );
    }
    let cost: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f.dir.path().join("cost.json")).unwrap())
            .unwrap();
    for field in [
        "training_rollouts",
        "rollouts_relative_to_plain_grpo",
        "rollout_seconds",
        "update_seconds",
        "calibration_seconds",
        "external_llm_tokens",
    ] {
        assert!(
            cost.get(field).is_some(),
            "cost.json lacks `{field}`: {cost}"
        );
    }
    // A fresh run refuses a directory that holds one.
    let again = RescueTrainer::new(
        f.cfg.clone(),
        f.setup(mixed_policy(), Some(Arc::new(RandomSelector::new(&f.pool)))),
        f.dir.path(),
    );
    assert!(
        again
            .err()
            .unwrap()
            .to_string()
            .contains("already holds a run")
    );
}

#[tokio::test]
async fn selection_and_task_order_are_reproducible_from_the_seed() {
    let run = || async {
        let f = fixture(r#"{"kind": "random_harness"}"#, 3);
        let mut t = RescueTrainer::new(
            f.cfg.clone(),
            f.setup(oracle(hashed(5, 0.2, 0.5)), None),
            f.dir.path(),
        )
        .unwrap();
        t.run().await.unwrap();
        (
            without_timings(jsonl(&f.dir.path().join("metrics.jsonl"))),
            jsonl(&f.dir.path().join("groups.jsonl")),
        )
    };
    assert_eq!(run().await, run().await);
}

/// A weight sync failing its first `fail` attempts, recording every attempt's version.
struct FlakySync {
    fail: usize,
    attempts: Mutex<Vec<u64>>,
}

#[async_trait::async_trait]
impl harness_rollout::WeightSync for FlakySync {
    fn name(&self) -> &str {
        "flaky"
    }

    async fn sync(&self, version: u64) -> harness_core::Result<()> {
        let mut attempts = self.attempts.lock().unwrap();
        attempts.push(version);
        if attempts.len() <= self.fail {
            return Err(harness_core::Error::Policy {
                policy: "engine".into(),
                message: "reload refused".into(),
            });
        }
        Ok(())
    }
}

#[tokio::test]
async fn weights_are_synced_after_each_update_with_retries_and_rollouts_record_their_version() {
    let mut f = fixture(r#"{"kind": "grpo"}"#, 3);
    f.cfg.sync_retry = harness_rollout::SyncRetry {
        attempts: 3,
        backoff_ms: 1,
    };
    let sync = Arc::new(FlakySync {
        fail: 2,
        attempts: Mutex::new(Vec::new()),
    });
    let mut setup = f.setup(mixed_policy(), None);
    setup.weight_sync = Some(sync.clone());
    let mut t = RescueTrainer::new(f.cfg.clone(), setup, f.dir.path()).unwrap();
    t.run().await.unwrap();
    assert_eq!(*sync.attempts.lock().unwrap(), vec![1, 1, 1, 2, 3]);
    let versions: Vec<u64> = f.groups().iter().map(|g| g.policy_version).collect();
    assert_eq!(versions, vec![0, 0, 0, 1, 1, 1, 2, 2, 2]);
    assert_eq!(t.policy_version(), 3);
}

#[tokio::test]
async fn a_weight_sync_that_keeps_failing_stops_the_run_with_a_clear_error() {
    let mut f = fixture(r#"{"kind": "grpo"}"#, 3);
    f.cfg.sync_retry = harness_rollout::SyncRetry {
        attempts: 2,
        backoff_ms: 1,
    };
    let mut setup = f.setup(mixed_policy(), None);
    setup.weight_sync = Some(Arc::new(FlakySync {
        fail: usize::MAX,
        attempts: Mutex::new(Vec::new()),
    }));
    let mut t = RescueTrainer::new(f.cfg.clone(), setup, f.dir.path()).unwrap();
    let err = t.run().await.unwrap_err().to_string();
    assert!(
        err.contains("weight sync `flaky` failed for policy version 1 after 2 attempts")
            && err.contains("stale weights")
            && err.contains("reload refused"),
        "{err}"
    );
    // Nothing was sampled from the stale weights: the run stopped at the first update.
    assert_eq!(f.groups().len(), 0);
}

#[tokio::test]
async fn a_resumed_run_pushes_the_checkpoint_weights_before_it_samples() {
    let mut f = fixture(r#"{"kind": "grpo"}"#, 2);
    f.cfg.checkpoint_every = 1;
    f.cfg.final_calibration = false;
    let first = Arc::new(FlakySync {
        fail: 0,
        attempts: Mutex::new(Vec::new()),
    });
    let mut setup = f.setup(mixed_policy(), None);
    setup.weight_sync = Some(first.clone());
    let mut t = RescueTrainer::new(f.cfg.clone(), setup, f.dir.path()).unwrap();
    t.step().await.unwrap();
    t.step().await.unwrap();
    let version = t.policy_version();
    assert!(version > 0);
    drop(t);
    let groups_before = f.groups().len();

    // A restarted engine holds its launch weights: the resumed run must push the checkpoint's
    // before its first rollout.
    let resumed = Arc::new(FlakySync {
        fail: 0,
        attempts: Mutex::new(Vec::new()),
    });
    let mut cfg = f.cfg.clone();
    cfg.updates = 3;
    let mut setup = f.setup(mixed_policy(), None);
    setup.weight_sync = Some(resumed.clone());
    let mut t = RescueTrainer::resume(cfg, setup, f.dir.path()).unwrap();
    assert_eq!(t.policy_version(), version);
    assert!(resumed.attempts.lock().unwrap().is_empty());
    t.step().await.unwrap();
    let attempts = resumed.attempts.lock().unwrap().clone();
    assert_eq!(attempts[0], version, "{attempts:?}");
    let new_groups: Vec<u64> = f.groups()[groups_before..]
        .iter()
        .map(|g| g.policy_version)
        .collect();
    assert!(new_groups.iter().all(|&v| v == version), "{new_groups:?}");
}

#[tokio::test]
async fn calibrations_name_the_checkpoint_of_the_policy_they_measure() {
    let mut f = fixture(r#"{"kind": "router"}"#, 4);
    f.cfg.calibrate_every = 2;
    f.cfg.checkpoint_every = 2;
    let calibrator = Arc::new(RecordingCalibrator::default());
    let mut setup = f.setup(mixed_policy(), Some(Arc::new(RandomSelector::new(&f.pool))));
    setup.calibrator = Some(calibrator.clone());
    let mut t = RescueTrainer::new(f.cfg.clone(), setup, f.dir.path()).unwrap();
    t.run().await.unwrap();
    let points = calibrator.points.lock().unwrap();
    let at: Vec<(u64, Option<String>)> = points
        .iter()
        .map(|p| {
            let rel = p.checkpoint.as_ref().map(|c| {
                c.strip_prefix(f.dir.path())
                    .unwrap()
                    .to_string_lossy()
                    .into_owned()
            });
            (p.update, rel)
        })
        .collect();
    assert_eq!(
        at,
        vec![
            (0, None),
            (2, Some("checkpoints/update-00000002/learner".into())),
            (4, Some("checkpoints/update-00000004/learner".into())),
        ]
    );
}

/// A selector whose every answer costs 10 prompt and 2 completion tokens of a `voter` role.
struct CostlySelector {
    inner: RandomSelector,
    calls: Mutex<u64>,
}

#[async_trait::async_trait]
impl harness_core::HarnessSelector for CostlySelector {
    fn name(&self) -> &str {
        "costly"
    }
    async fn select(
        &self,
        request: &harness_core::SelectionRequest,
    ) -> harness_core::Result<Vec<HarnessId>> {
        *self.calls.lock().unwrap() += 1;
        self.inner.select(request).await
    }
    fn usage(&self) -> std::collections::BTreeMap<String, harness_core::Usage> {
        let calls = *self.calls.lock().unwrap();
        std::collections::BTreeMap::from([(
            "voter".to_string(),
            harness_core::Usage {
                prompt_tokens: 10 * calls,
                completion_tokens: 2 * calls,
            },
        )])
    }
}

#[tokio::test]
async fn the_selectors_llm_tokens_reach_cost_json() {
    let f = fixture(r#"{"kind": "router"}"#, 3);
    let selector = Arc::new(CostlySelector {
        inner: RandomSelector::new(&f.pool),
        calls: Mutex::new(0),
    });
    let setup = f.setup(mixed_policy(), Some(selector.clone()));
    let mut t = RescueTrainer::new(f.cfg.clone(), setup, f.dir.path()).unwrap();
    t.run().await.unwrap();
    let rescues = f
        .groups()
        .iter()
        .filter(|g| g.origin == GroupOrigin::Rescue)
        .count() as u64;
    assert!(rescues > 0);
    assert_eq!(*selector.calls.lock().unwrap(), rescues);
    let cost: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(f.dir.path().join("cost.json")).unwrap())
            .unwrap();
    assert_eq!(
        cost["external_llm_tokens"]["voter"],
        serde_json::json!({"prompt_tokens": 10 * rescues, "completion_tokens": 2 * rescues})
    );
}

/// A policy that reports the weights version a sync last gave it.
struct Versioned {
    inner: Arc<dyn harness_core::Policy>,
    version: Arc<std::sync::atomic::AtomicU64>,
}

#[async_trait::async_trait]
impl harness_core::Policy for Versioned {
    fn name(&self) -> &str {
        "versioned"
    }

    async fn generate(
        &self,
        request: harness_core::PolicyRequest,
    ) -> harness_core::Result<harness_core::PolicyTurn> {
        self.inner.generate(request).await
    }

    fn weights_version(&self) -> Option<u64> {
        Some(self.version.load(std::sync::atomic::Ordering::SeqCst))
    }
}

/// A sync that brings `version` to the policy, or, once `lose_from` is reached, says it did
/// without doing it.
struct VersionSync {
    version: Arc<std::sync::atomic::AtomicU64>,
    lose_from: u64,
}

#[async_trait::async_trait]
impl harness_rollout::WeightSync for VersionSync {
    fn name(&self) -> &str {
        "version-sync"
    }

    async fn sync(&self, version: u64) -> harness_core::Result<()> {
        if version < self.lose_from {
            self.version
                .store(version, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }
}

/// A versioned policy at version 0 and a sync that moves it, losing versions from `lose_from`.
fn versioned_setup(f: &Fixture, lose_from: u64) -> TrainingSetup {
    let version = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let policy = Arc::new(Versioned {
        inner: mixed_policy(),
        version: version.clone(),
    });
    let mut setup = f.setup(policy, None);
    setup.weight_sync = Some(Arc::new(VersionSync { version, lose_from }));
    setup
}

#[tokio::test]
async fn a_policy_whose_weights_lag_the_learner_stops_the_run_before_it_samples() {
    // Synced versions: updates go on, each group records the version it sampled.
    let f = fixture(r#"{"kind": "grpo"}"#, 2);
    let mut t =
        RescueTrainer::new(f.cfg.clone(), versioned_setup(&f, u64::MAX), f.dir.path()).unwrap();
    t.run().await.unwrap();
    let versions: Vec<u64> = f.groups().iter().map(|g| g.policy_version).collect();
    assert_eq!(versions, vec![0, 0, 0, 1, 1, 1]);
    let stamped: Vec<u64> = jsonl(&f.dir.path().join("trajectories.jsonl"))
        .iter()
        .map(|t| t["policy_version"].as_u64().unwrap())
        .collect();
    assert_eq!(
        stamped,
        [vec![0; 12], vec![1; 12]].concat(),
        "every rollout records its version"
    );

    // A sync that reports success but leaves the weights behind: the update after it stops.
    let f = fixture(r#"{"kind": "grpo"}"#, 3);
    let mut t = RescueTrainer::new(f.cfg.clone(), versioned_setup(&f, 2), f.dir.path()).unwrap();
    t.step().await.unwrap();
    let err = t.step().await.unwrap_err().to_string();
    assert!(
        err.contains("version 1") && err.contains("version 2") && err.contains("stale"),
        "{err}"
    );
    assert_eq!(
        f.metrics().len(),
        1,
        "the update whose sync was lost is not recorded"
    );

    // A policy ahead of (or behind) the learner from the start samples nothing.
    let f = fixture(r#"{"kind": "grpo"}"#, 1);
    let policy = Arc::new(Versioned {
        inner: mixed_policy(),
        version: Arc::new(std::sync::atomic::AtomicU64::new(5)),
    });
    let mut t = RescueTrainer::new(f.cfg.clone(), f.setup(policy, None), f.dir.path()).unwrap();
    let err = t.step().await.unwrap_err().to_string();
    assert!(err.contains("weights version 5"), "{err}");
    assert!(f.env.resets.lock().unwrap().is_empty(), "no episode ran");
}
