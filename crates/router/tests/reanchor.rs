//! Re-anchoring end to end on the scripted environment: paired calibration, saved and loaded
//! calibrations, the ranking changing when the policy's per-harness success changes, the
//! fixed-profile and rule-router baselines, the random selector, Rank-r evaluation and the
//! test-split guard.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};

use common::*;
use harness_core::{
    Calibrate, CalibrationPoint, HarnessId, HarnessSelector, Policy, SelectionMode,
    SelectionRequest, Split, TrajectoryLabeller,
};
use harness_router::{
    AdaptiveRouter, BuiltinProfiler, BuiltinVoter, Calibration, Calibrator, CalibratorSettings,
    EvidenceCell, FeatureSource, RankEvalSettings, ReanchorMode, RouterSettings, RuleRouter, Voter,
    calibration_file_name, evaluate_ranks,
};

struct Setup {
    pool: Arc<harness_pool::SiblingPool>,
    phase: Arc<AtomicU8>,
    calibrator: Calibrator,
    router: AdaptiveRouter,
    dir: tempfile::TempDir,
}

fn setup(mode: ReanchorMode) -> Setup {
    let pool = Arc::new(pool());
    let phase = Arc::new(AtomicU8::new(0));
    let policy: Arc<dyn Policy> = Arc::new(phased_policy(phase.clone(), default_script));
    let labeller: Arc<dyn TrajectoryLabeller> = Arc::new(ScriptedLabeller);
    let dir = tempfile::tempdir().unwrap();
    let evidence = EvidenceCell::new();
    let calibrator = Calibrator::new(
        pool.clone(),
        policy,
        envs(),
        validation_tasks(),
        Arc::new(BuiltinProfiler::new([labeller])),
        evidence.clone(),
        CalibratorSettings {
            mode,
            dir: Some(dir.path().to_path_buf()),
            // These tests route on the scripted tasks' `category` label.
            features: FeatureSource::Metadata,
            ..CalibratorSettings::default()
        },
    )
    .unwrap();
    let voters: Vec<Arc<dyn Voter>> = BuiltinVoter::panel(3, 7)
        .into_iter()
        .map(|v| Arc::new(v) as Arc<dyn Voter>)
        .collect();
    let router = AdaptiveRouter::new(evidence, voters, RouterSettings::default()).unwrap();
    Setup {
        pool,
        phase,
        calibrator,
        router,
        dir,
    }
}

fn point(index: u32, update: u64) -> CalibrationPoint {
    CalibrationPoint {
        index,
        update,
        is_final: false,
        seed: 11,
        checkpoint: None,
    }
}

async fn top(
    selector: &dyn HarnessSelector,
    family: &str,
    k: usize,
    mode: SelectionMode,
) -> Vec<HarnessId> {
    selector
        .select(&SelectionRequest {
            task: task(&format!("train-{family}"), Split::Train, family, 99),
            k,
            mode,
            seed: 5,
        })
        .await
        .unwrap()
}

#[tokio::test]
async fn reanchoring_changes_the_ranking_when_per_harness_success_changes() {
    let s = setup(ReanchorMode::Adaptive);
    let a = id_of(&s.pool, "S-A");
    let b = id_of(&s.pool, "S-B");
    let c = id_of(&s.pool, "S-C");
    let d = id_of(&s.pool, "S-D");
    let h0 = s.pool.base_id().clone();

    // Routing before any calibration is an error, not a guess.
    assert!(
        s.router
            .select(&SelectionRequest {
                task: task("x", Split::Train, "mail", 1),
                k: 1,
                mode: SelectionMode::Rescue,
                seed: 0,
            })
            .await
            .is_err()
    );

    let summary = s.calibrator.calibrate(&point(0, 0)).await.unwrap();
    assert_eq!(
        summary.rollouts,
        5 * 8,
        "every member on every task, paired"
    );
    assert_eq!(summary.validation_success[&a], 0.5);
    assert_eq!(summary.validation_success[&h0], 0.0);
    assert_eq!(
        top(&s.router, "mail", 1, SelectionMode::Rescue).await,
        vec![a.clone()]
    );
    assert_eq!(
        top(&s.router, "pay", 1, SelectionMode::Rescue).await,
        vec![b.clone()]
    );

    // The profile says why: S-A fetches more pages on the mail family, and fails nowhere H0
    // succeeds.
    let cal0 = s.router.evidence().get().unwrap().calibration.clone();
    let profile = &cal0.profiles[&a];
    assert_eq!(profile.prefer.len(), 1, "{profile:?}");
    assert_eq!(profile.prefer[0].when, "scripted, category mail");
    assert!(
        profile.prefer[0]
            .behavior
            .contains("more listing pages fetched than H0")
    );
    assert_eq!(profile.prefer[0].support.len(), 4);
    assert!(profile.avoid.is_empty());

    // The policy learns: other siblings now help. Re-anchoring follows it.
    s.phase.store(1, Ordering::SeqCst);
    let before = top(&s.router, "mail", 1, SelectionMode::Rescue).await;
    assert_eq!(
        before,
        vec![a.clone()],
        "routing uses the latest calibration until the next"
    );
    s.calibrator.calibrate(&point(1, 10)).await.unwrap();
    assert_eq!(
        top(&s.router, "mail", 1, SelectionMode::Rescue).await,
        vec![c.clone()]
    );
    assert_eq!(
        top(&s.router, "pay", 1, SelectionMode::Rescue).await,
        vec![d.clone()]
    );
    let cal1 = s.router.evidence().get().unwrap().calibration.clone();
    assert_eq!(cal1.index, 1);
    assert_eq!(cal1.update, 10);
    assert!(
        !cal1.profiles[&a].avoid.is_empty(),
        "S-A now hurts where it helped"
    );

    // Rescue returns K distinct siblings, never H0; inference may rank H0.
    let rescue = top(&s.router, "mail", 4, SelectionMode::Rescue).await;
    assert_eq!(rescue.len(), 4);
    assert!(!rescue.contains(&h0));
    assert_eq!(rescue.iter().collect::<BTreeSet<_>>().len(), 4);
    let inference = top(&s.router, "mail", 5, SelectionMode::Inference).await;
    assert!(inference.contains(&h0));
    assert_eq!(inference[0], c);
    assert!(s.router.stats().selections >= 6);
    assert_eq!(s.router.stats().dropped, 0);

    // Both calibrations are on disk, with their paired trajectories, and load back validated.
    for index in [0, 1] {
        let path = s.dir.path().join(calibration_file_name(index));
        let loaded = Calibration::load(&path).unwrap();
        assert_eq!(loaded.index, index);
        assert!(
            s.dir
                .path()
                .join(format!("trajectories-{index:04}.jsonl"))
                .exists()
        );
    }
    assert_eq!(
        Calibration::load_latest(s.dir.path()).unwrap().unwrap(),
        cal1
    );

    // A snapshot restores the evidence into a fresh calibrator's cell.
    let snapshot = s.calibrator.snapshot().unwrap();
    let fresh = setup(ReanchorMode::Adaptive);
    fresh.calibrator.restore(&snapshot).unwrap();
    assert_eq!(
        top(&fresh.router, "mail", 1, SelectionMode::Rescue).await,
        vec![c]
    );
}

#[tokio::test]
async fn fixed_profiles_never_reanchor_and_the_rule_router_follows_similar_tasks() {
    let s = setup(ReanchorMode::Fixed);
    let a = id_of(&s.pool, "S-A");
    let b = id_of(&s.pool, "S-B");
    let rule = RuleRouter::new(s.router.evidence().clone(), 3);
    s.calibrator.calibrate(&point(0, 0)).await.unwrap();
    assert_eq!(
        top(&rule, "mail", 1, SelectionMode::Rescue).await,
        vec![a.clone()]
    );
    assert_eq!(
        top(&rule, "pay", 1, SelectionMode::Rescue).await,
        vec![b.clone()]
    );

    s.phase.store(1, Ordering::SeqCst);
    let later = s.calibrator.calibrate(&point(1, 10)).await.unwrap();
    assert_eq!(
        later.rollouts, 0,
        "the fixed-profile baseline measures nothing later"
    );
    assert_eq!(later.index, 0);
    assert_eq!(
        top(&s.router, "mail", 1, SelectionMode::Rescue).await,
        vec![a.clone()]
    );
    assert_eq!(top(&rule, "mail", 1, SelectionMode::Rescue).await, vec![a]);
    assert!(!s.dir.path().join(calibration_file_name(1)).exists());
}

#[tokio::test]
async fn rank_r_evaluation_ranks_before_running_and_reports_h0_rates() {
    let s = setup(ReanchorMode::Adaptive);
    s.calibrator.calibrate(&point(0, 0)).await.unwrap();
    let tests: Vec<_> = (0..4)
        .map(|i| {
            let family = if i % 2 == 0 { "mail" } else { "pay" };
            task(&format!("test-{family}-{i}"), Split::Test, family, 100 + i)
        })
        .collect();
    let policy = phased_policy(s.phase.clone(), default_script);
    let report = evaluate_ranks(
        &s.router,
        &policy,
        &s.pool,
        &envs(),
        &tests,
        &RankEvalSettings {
            ranks: 3,
            attempts: 2,
            ..RankEvalSettings::default()
        },
    )
    .await
    .unwrap();
    let labels: Vec<&str> = report.rows.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(labels, vec!["H0", "Rank-1", "Rank-2", "Rank-3"]);
    // H0 solves nothing; the router's first choice solves every task (S-A on mail, S-B on pay).
    assert_eq!(report.rows[0].pass_at_k, 0.0);
    assert_eq!(report.rows[0].h0_rate, None);
    assert_eq!(report.rows[1].pass_at_k, 1.0);
    assert_eq!(report.rows[1].avg_at_k, 1.0);
    assert_eq!(report.rows[1].h0_rate, Some(0.0));
    assert!(report.rows[2].pass_at_k < 1.0);
    let h0_rates: f64 = report.rows[1..].iter().filter_map(|r| r.h0_rate).sum();
    let h0_placed = report
        .rankings
        .values()
        .filter(|r| r.contains(s.pool.base_id()))
        .count() as f64
        / tests.len() as f64;
    assert!((h0_rates - h0_placed).abs() < 1e-12);
    assert!(
        report
            .to_markdown()
            .contains("| Rank-1 | 100.00 | 100.00 | 0.00 |")
    );
}

#[test]
fn test_tasks_never_feed_the_router() {
    let pool = Arc::new(pool());
    let policy: Arc<dyn Policy> =
        Arc::new(phased_policy(Arc::new(AtomicU8::new(0)), default_script));
    let mut tasks = validation_tasks();
    tasks.push(task("held-out-7", Split::Test, "mail", 7));
    let err = Calibrator::new(
        pool,
        policy,
        envs(),
        tasks,
        Arc::new(BuiltinProfiler::new([])),
        EvidenceCell::new(),
        CalibratorSettings::default(),
    )
    .err()
    .expect("a test task is refused")
    .to_string();
    assert!(
        err.contains("`held-out-7`") && err.contains("test task"),
        "{err}"
    );
}

#[tokio::test]
async fn a_calibration_file_that_lies_is_refused_with_file_and_field() {
    let s = setup(ReanchorMode::Adaptive);
    s.calibrator.calibrate(&point(0, 0)).await.unwrap();
    let path = s.dir.path().join(calibration_file_name(0));
    let good: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let a = id_of(&s.pool, "S-A").0;
    type Corrupt = Box<dyn Fn(&mut serde_json::Value)>;
    let cases: Vec<(&str, Corrupt)> = vec![
        (
            "validation_success",
            Box::new(move |v| v["validation_success"][&a] = 0.9.into()),
        ),
        (
            "tasks[0]",
            Box::new(|v| v["tasks"][0]["split"] = "test".into()),
        ),
        ("format", Box::new(|v| v["format"] = 7.into())),
        (
            "checkpoint.sha256",
            Box::new(|v| v["checkpoint"] = serde_json::json!({"path": "/x", "sha256": "nothex"})),
        ),
        (
            "profiles",
            Box::new(|v| {
                let base = v["base"].as_str().unwrap().to_string();
                v["profiles"][base] = serde_json::json!({"prefer": [], "avoid": []});
            }),
        ),
        ("index", Box::new(|v| v["index"] = "one".into())),
    ];
    for (field, corrupt) in cases {
        let mut bad = good.clone();
        corrupt(&mut bad);
        let file = s.dir.path().join("bad.json");
        std::fs::write(&file, bad.to_string()).unwrap();
        let err = Calibration::load(&file).unwrap_err().to_string();
        assert!(err.contains(field), "{field}: {err}");
        assert!(
            err.contains("bad.json") || err.contains("test task"),
            "{field}: {err}"
        );
    }
}

#[tokio::test]
async fn paired_executions_share_tasks_seeds_and_limits() {
    // A sibling that edits its limits still runs under H0's limits in calibration.
    let mut generous = harness("S-A");
    generous.limits.max_env_actions = 30;
    let mut base = harness("H0");
    base.limits.max_env_actions = 2;
    let pool =
        harness_pool::SiblingPool::starter(base, [generous], serde_json::Value::Null).unwrap();
    let phase = Arc::new(AtomicU8::new(0));
    let policy = phased_policy(phase, default_script);
    let tasks = validation_tasks();
    let settings = harness_router::PairedSettings {
        rollouts_per_task: 2,
        ..harness_router::PairedSettings::default()
    };
    let run = harness_router::run_paired(&policy, &pool, &envs(), &tasks, 5, &settings)
        .await
        .unwrap();
    assert_eq!(run.rollouts(), 2 * tasks.len() * 2);
    let s_a = id_of(&pool, "S-A");
    for task in &tasks {
        let h0 = run.of(pool.base_id(), &task.id);
        let sib = run.of(&s_a, &task.id);
        assert_eq!(h0.len(), 2);
        let seeds = |ts: &[harness_core::Trajectory]| ts.iter().map(|t| t.seed).collect::<Vec<_>>();
        assert_eq!(seeds(h0), seeds(sib), "{}: paired seeds", task.id);
        assert_ne!(h0[0].seed, h0[1].seed, "attempts differ");
        // S-A fetches two pages before submitting on mail tasks: with H0's two actions it runs
        // out of budget instead of succeeding.
        assert!(sib.iter().all(|t| t.counts.env_actions <= 2));
    }
    let mail = &tasks[0];
    assert_eq!(
        run.of(&s_a, &mail.id)[0].termination,
        harness_core::Termination::MaxEnvActions
    );
    let own = harness_router::PairedSettings {
        limits: harness_router::PairedLimits::Own,
        ..settings
    };
    let run = harness_router::run_paired(&policy, &pool, &envs(), &tasks[..1], 5, &own)
        .await
        .unwrap();
    assert!(
        run.of(&s_a, &mail.id)[0].is_success(),
        "its own limits let it finish"
    );
}

#[tokio::test]
async fn a_calibration_records_the_checkpoint_it_measured_with_a_content_hash() {
    let s = setup(ReanchorMode::Adaptive);
    let checkpoint = s.dir.path().join("checkpoint-10");
    std::fs::create_dir_all(checkpoint.join("sub")).unwrap();
    std::fs::write(checkpoint.join("model.safetensors"), b"weights v1").unwrap();
    std::fs::write(checkpoint.join("sub/config.json"), b"{}").unwrap();
    let with = |path: &std::path::Path| CalibrationPoint {
        checkpoint: Some(path.to_path_buf()),
        ..point(0, 10)
    };
    s.calibrator.calibrate(&with(&checkpoint)).await.unwrap();
    let first = s
        .router
        .evidence()
        .get()
        .unwrap()
        .calibration
        .checkpoint
        .clone()
        .unwrap();
    assert_eq!(first.path, checkpoint);
    assert_eq!(first.sha256.len(), 64);
    assert_eq!(
        harness_router::CheckpointRef::of(&checkpoint).unwrap(),
        first
    );
    std::fs::write(checkpoint.join("model.safetensors"), b"weights v2").unwrap();
    s.calibrator.calibrate(&with(&checkpoint)).await.unwrap();
    let second = s
        .router
        .evidence()
        .get()
        .unwrap()
        .calibration
        .checkpoint
        .clone()
        .unwrap();
    assert_ne!(first.sha256, second.sha256, "new weights, new hash");
    let missing = s
        .calibrator
        .calibrate(&with(&s.dir.path().join("nope")))
        .await;
    assert!(missing.unwrap_err().to_string().contains("nope"));
}

/// A selector that names the same harness at every rank.
struct Repeating(HarnessId);

#[async_trait::async_trait]
impl HarnessSelector for Repeating {
    fn name(&self) -> &str {
        "repeating"
    }
    async fn select(&self, request: &SelectionRequest) -> harness_core::Result<Vec<HarnessId>> {
        Ok(vec![self.0.clone(); request.k])
    }
}

#[tokio::test]
async fn rank_r_evaluation_refuses_a_ranking_that_repeats_a_harness() {
    let pool = pool();
    let tests = vec![task("test-mail-0", Split::Test, "mail", 100)];
    let policy = phased_policy(Arc::new(AtomicU8::new(0)), default_script);
    let err = evaluate_ranks(
        &Repeating(pool.base_id().clone()),
        &policy,
        &pool,
        &envs(),
        &tests,
        &RankEvalSettings {
            ranks: 3,
            attempts: 1,
            ..RankEvalSettings::default()
        },
    )
    .await
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("repeating") && err.contains("distinct"),
        "{err}"
    );
}
