//! One training run per run folder: the train stage holds the folder's lock file, and a
//! second run on the same folder (two `harness-s train --resume`) is refused at once.

use harness_core::fsutil::DirLock;
use harness_pipeline::{Method, Progress, RunConfig, Secrets, Workbench, stages};
use harness_pool::SiblingPool;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_training_run_on_one_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RunConfig {
        out: dir.path().join("run"),
        ..RunConfig::default()
    };
    cfg.policy.cache_dir = dir.path().join("cache");
    for (path, value) in [
        ("policy.warm_start_preset", "\"tiny\""),
        ("env.train_tasks", "4"),
        ("env.validation_tasks", "2"),
        ("env.test_tasks", "2"),
        ("train.methods", "[\"grpo\"]"),
    ] {
        cfg.set(path, value).unwrap();
    }
    let wb = Workbench::new(cfg, Secrets::default(), Progress::hidden()).unwrap();
    let pool = SiblingPool::new(wb.base.clone()).unwrap();
    let run_dir = wb.layout.train(Method::Grpo);
    // The other run: it holds the folder's lock for its life.
    let other = DirLock::acquire(&run_dir).unwrap();
    let Err(err) = stages::train(&wb, &pool, Method::Grpo, true).await else {
        panic!("a second run on a locked folder trained");
    };
    let err = err.to_string();
    assert!(err.contains(&run_dir.display().to_string()), "{err}");
    assert!(err.contains("another run holds this folder"), "{err}");
    // Refused before it wrote anything but the lock file.
    let names: Vec<_> = std::fs::read_dir(&run_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [DirLock::FILE]);
    drop(other);
}
