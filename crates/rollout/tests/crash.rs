//! Crash safety with real processes: a child training run is killed with SIGKILL during an
//! update and again while it writes a checkpoint; after each kill it resumes from the latest
//! complete checkpoint, and the finished run's files and learner state equal those of a run
//! that was never stopped. The checkpoint it resumes from after the first kill sits at an epoch
//! boundary of the task order, and no task is skipped or repeated.
//!
//! The child is this test binary itself, re-run on the ignored `crash_child` test with its
//! instructions in an environment variable.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use harness_rollout::{
    RandomSelector, RescueConfig, RescueTrainer, TrainingSetup, latest_checkpoint,
};
use serde::{Deserialize, Serialize};

const CHILD_ENV: &str = "HARNESS_ROLLOUT_CRASH_CHILD";
const TASKS: usize = 4;

#[derive(Serialize, Deserialize)]
struct ChildSpec {
    run_dir: PathBuf,
    pauses: Pauses,
}

fn config() -> RescueConfig {
    // 4 tasks, 2 per update: every second update ends an epoch; checkpoints every 2 updates
    // therefore sit at epoch boundaries.
    RescueConfig::from_json(
        r#"{"seed": 99, "updates": 9, "group_size": 4, "batch_tasks": 2, "checkpoint_every": 2,
            "calibrate_every": 2, "strategy": {"kind": "router"}}"#,
        None,
    )
    .unwrap()
}

fn setup(pauses: Pauses) -> TrainingSetup {
    let pool = pool(5);
    TrainingSetup {
        policy: oracle(hashed(3, 0.3, 0.4)),
        environments: vec![Arc::new(CountingEnv::new())],
        selector: Some(Arc::new(RandomSelector::new(&pool))),
        pool,
        train_tasks: tasks(TASKS),
        validation_tasks: Vec::new(),
        learner: Box::new(ScriptedLearner {
            pauses,
            ..ScriptedLearner::default()
        }),
        calibrator: Some(Arc::new(RecordingCalibrator::default())),
        weight_sync: None,
    }
}

fn train(run_dir: &Path, pauses: Pauses) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut t = RescueTrainer::resume(config(), setup(pauses), run_dir).unwrap();
        t.run().await.unwrap();
    });
}

#[test]
#[ignore = "the child process of the SIGKILL tests; does nothing without its instructions"]
fn crash_child() {
    // invariant-exception: a test binary reading its child-process instructions.
    let Ok(spec) = std::env::var(CHILD_ENV) else {
        return;
    };
    let spec: ChildSpec = serde_json::from_str(&spec).unwrap();
    train(&spec.run_dir, spec.pauses);
}

/// Run the child; with a marker, wait for it to appear and SIGKILL the child.
fn child(run_dir: &Path, pauses: Pauses) {
    let spec = serde_json::to_string(&ChildSpec {
        run_dir: run_dir.to_path_buf(),
        pauses: pauses.clone(),
    })
    .unwrap();
    let mut process = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "crash_child",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD_ENV, spec)
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    match &pauses.marker {
        None => assert!(process.wait().unwrap().success(), "the child run failed"),
        Some(marker) => {
            let started = Instant::now();
            while !marker.exists() {
                if let Some(status) = process.try_wait().unwrap() {
                    panic!("the child exited ({status}) before reaching its pause");
                }
                assert!(
                    started.elapsed() < Duration::from_secs(120),
                    "the child never paused"
                );
                std::thread::sleep(Duration::from_millis(20));
            }
            process.kill().unwrap(); // SIGKILL on Unix
            let status = process.wait().unwrap();
            assert!(!status.success());
        }
    }
}

fn files(dir: &Path) -> Vec<Vec<serde_json::Value>> {
    ["metrics.jsonl", "groups.jsonl", "trajectories.jsonl"]
        .iter()
        .map(|f| without_timings(jsonl(&dir.join(f))))
        .collect()
}

fn final_learner(dir: &Path) -> LearnerState {
    let (ckpt, state) = latest_checkpoint(dir).unwrap().unwrap();
    assert!(state.finished);
    serde_json::from_str(&std::fs::read_to_string(ckpt.join("learner/learner.json")).unwrap())
        .unwrap()
}

#[test]
fn a_run_killed_during_an_update_and_during_a_checkpoint_write_resumes_bit_identically() {
    let reference = tempfile::tempdir().unwrap();
    train(reference.path(), Pauses::default());

    let scratch = tempfile::tempdir().unwrap();
    let run = scratch.path().join("run");
    // First kill: inside the learner's 5th update (checkpoints 2 and 4 are complete; the
    // calibration before update 5 has already written its line).
    child(
        &run,
        Pauses {
            in_update: Some(5),
            marker: Some(scratch.path().join("marker-1")),
            ..Pauses::default()
        },
    );
    let (_, state) = latest_checkpoint(&run).unwrap().unwrap();
    assert_eq!(state.update, 4);
    assert_eq!(
        state.cursor.index, TASKS,
        "the checkpoint sits at the end of an epoch"
    );
    assert!(std::fs::metadata(run.join("metrics.jsonl")).unwrap().len() > state.offsets.metrics);

    // Second kill: while the checkpoint after update 6 is being written.
    child(
        &run,
        Pauses {
            in_checkpoint: Some(6),
            marker: Some(scratch.path().join("marker-2")),
            ..Pauses::default()
        },
    );
    assert!(run.join("checkpoints/.update-00000006.partial").exists());
    let (dir, state) = latest_checkpoint(&run).unwrap().unwrap();
    assert_eq!(
        state.update, 4,
        "the previous checkpoint loads after a kill mid-write"
    );
    assert!(dir.ends_with("update-00000004"));

    // Resume to the end.
    child(&run, Pauses::default());

    assert_eq!(files(&run), files(reference.path()));
    assert_eq!(final_learner(&run), final_learner(reference.path()));
    let cost = |d: &Path| {
        without_timings(vec![
            serde_json::from_str(&std::fs::read_to_string(d.join("cost.json")).unwrap()).unwrap(),
        ])
    };
    assert_eq!(cost(&run), cost(reference.path()));

    // Every epoch of the task order draws each task exactly once, across both resumes.
    let groups = jsonl(&run.join("groups.jsonl"));
    let draws: Vec<u64> = groups.iter().map(|g| g["draw"].as_u64().unwrap()).collect();
    assert_eq!(draws, (0..18).collect::<Vec<_>>());
    let ids: Vec<String> = groups
        .iter()
        .map(|g| g["task_id"].as_str().unwrap().to_string())
        .collect();
    for epoch in ids.chunks(TASKS).filter(|c| c.len() == TASKS) {
        let mut e = epoch.to_vec();
        e.sort();
        assert_eq!(e, vec!["t0", "t1", "t2", "t3"]);
    }
}
