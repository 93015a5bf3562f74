//! The main job with `learner = "tinker"` against harness-tinker's in-process fake server:
//! versions advance with each update and every sync reaches the acting policy; an unreachable
//! server, a model it does not train, a sync that fails, a server that restarts mid-run and
//! resumes the server or the run cannot honour are each a clear error, and `eval` and `report`
//! need no server. The fake has no model (its log-probs are synthetic), so the probe is off
//! here; `tests/tinker_skyrl.rs` at the workspace root runs it against SkyRL's server.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use harness_pipeline::config::LearnerKind;
use harness_pipeline::{Method, Progress, RunConfig, Secrets, Workbench, stages};
use harness_tinker::fake::{AdapterSpec, Fake, FakeOptions, Fault, Reduction};
use serde_json::Value;

const BASE: &str = "tiny-base";

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A reduced run of the embedded default (tiny warm start, builtin pool, GRPO, 3 updates).
fn reduced(dir: &Path) -> RunConfig {
    let mut cfg = RunConfig {
        out: dir.join("run"),
        ..RunConfig::default()
    };
    cfg.policy.cache_dir = dir.join("cache");
    for (path, value) in [
        ("policy.warm_start_preset", "\"tiny\""),
        ("env.train_tasks", "8"),
        ("env.validation_tasks", "2"),
        ("env.test_tasks", "2"),
        ("evolve.source", "\"builtin\""),
        ("external.python_sibling", "false"),
        ("train.methods", "[\"grpo\"]"),
        ("train.updates", "3"),
        ("train.group_size", "2"),
        ("train.batch_tasks", "2"),
        ("train.eval_every", "0"),
        ("train.checkpoint_every", "1"),
        ("eval.k", "1"),
        ("eval.ranks", "1"),
        ("rollout.concurrency", "4"),
    ] {
        cfg.set(path, value).unwrap();
    }
    cfg
}

/// The LoRA modules of the checkpoint at `dir`, as the fake's adapters target them.
fn adapter_spec(dir: &Path) -> AdapterSpec {
    let c: Value =
        serde_json::from_slice(&std::fs::read(dir.join("config.json")).unwrap()).unwrap();
    let n = |k: &str| c[k].as_u64().unwrap() as usize;
    let (hidden, inter, heads, kv, hd) = (
        n("hidden_size"),
        n("intermediate_size"),
        n("num_attention_heads"),
        n("num_key_value_heads"),
        n("head_dim"),
    );
    let mut modules = Vec::new();
    for l in 0..n("num_hidden_layers") {
        let p = format!("model.layers.{l}");
        modules.push((format!("{p}.self_attn.q_proj"), heads * hd, hidden));
        modules.push((format!("{p}.self_attn.k_proj"), kv * hd, hidden));
        modules.push((format!("{p}.self_attn.v_proj"), kv * hd, hidden));
        modules.push((format!("{p}.self_attn.o_proj"), hidden, heads * hd));
        modules.push((format!("{p}.mlp.gate_proj"), inter, hidden));
        modules.push((format!("{p}.mlp.up_proj"), inter, hidden));
        modules.push((format!("{p}.mlp.down_proj"), hidden, inter));
    }
    AdapterSpec {
        modules,
        alpha: 32.0,
    }
}

struct Setup {
    _dir: tempfile::TempDir,
    cfg: RunConfig,
    fake: Fake,
    checkpoint: PathBuf,
}

/// The warm start (once per test), then a fake server for it and the Tinker learner's config.
async fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let cfg = reduced(dir.path());
    let checkpoint = Workbench::new(cfg.clone(), Secrets::default(), Progress::hidden())
        .unwrap()
        .checkpoint
        .clone();
    let fake = Fake::start_with(
        Reduction::Skyrl,
        FakeOptions {
            supported_models: vec![BASE.into()],
            adapter: Some(adapter_spec(&checkpoint)),
        },
    )
    .await;
    let mut cfg = cfg;
    cfg.learner = LearnerKind::Tinker;
    cfg.tinker.url = Some(fake.url());
    cfg.tinker.base_model = Some(BASE.into());
    cfg.tinker.lora_rank = 4;
    cfg.tinker.check_sync = false;
    cfg.tinker.attempts = 1;
    Setup {
        _dir: dir,
        cfg,
        fake,
        checkpoint,
    }
}

fn workbench(cfg: &RunConfig) -> Workbench {
    Workbench::new(cfg.clone(), Secrets::default(), Progress::hidden()).unwrap()
}

fn updates(run_dir: &Path) -> Vec<u64> {
    jsonl(&run_dir.join("metrics.jsonl"))
        .iter()
        .filter(|m| m["kind"] == "update")
        .map(|m| m["update"].as_u64().unwrap())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_job_trains_on_the_server_and_rollouts_follow_each_version() {
    let s = setup().await;
    harness_pipeline::run_main_job(&s.cfg, &Secrets::default(), &Progress::hidden())
        .await
        .unwrap();
    let run_dir = s.cfg.out.join("train/grpo");
    let metrics: Vec<Value> = jsonl(&run_dir.join("metrics.jsonl"))
        .into_iter()
        .filter(|m| m["kind"] == "update")
        .collect();
    let versions: Vec<u64> = metrics
        .iter()
        .map(|m| m["policy_version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, vec![1, 2, 3], "one version per applied update");
    // Each update's groups were sampled from the version before it.
    let sampled: Vec<(u64, u64)> = jsonl(&run_dir.join("groups.jsonl"))
        .iter()
        .map(|g| {
            (
                g["update"].as_u64().unwrap(),
                g["policy_version"].as_u64().unwrap(),
            )
        })
        .collect();
    assert!(!sampled.is_empty());
    assert!(
        sampled.iter().all(|&(u, v)| v + 1 == u),
        "groups sampled from stale weights: {sampled:?}"
    );
    // Every version, the initial one included, went save -> download -> merge.
    let syncs = jsonl(&run_dir.join("sampler/syncs.jsonl"));
    let synced: Vec<u64> = syncs
        .iter()
        .map(|r| r["version"].as_u64().unwrap())
        .collect();
    assert_eq!(synced, vec![0, 1, 2, 3]);
    assert!(
        syncs
            .iter()
            .all(|r| r["tinker_path"].as_str().unwrap().starts_with("tinker://"))
    );
    assert_eq!(s.fake.requests("save_weights_for_sampler").len(), 4);
    assert!(s.fake.requests("archive").len() >= 4);
    // The merged weights moved away from the initial checkpoint (the fake's B grows with
    // each step), and the final checkpoint holds them.
    let final_dir = s.cfg.out.join("train/grpo/final");
    let read = |d: &Path| std::fs::read(d.join("model.safetensors")).unwrap();
    assert_ne!(read(&final_dir), read(&s.checkpoint));
    // Checkpoints hold the server's path and the merged weights of their version.
    let latest = harness_rollout::latest_checkpoint(&run_dir)
        .unwrap()
        .unwrap()
        .0
        .join("learner");
    assert!(latest.join("tinker_learner.json").is_file());
    assert!(latest.join("model.safetensors").is_file());
    // The evaluation and the report read local files only: with the server gone they still
    // run.
    drop(s.fake);
    let wb = workbench(&s.cfg);
    let pool = stages::load_pool(&wb).unwrap();
    assert!(stages::has_test_record(&wb, &pool, Some(Method::Grpo)).unwrap());
    let test = s.cfg.out.join("eval/test.jsonl");
    let kept: String = std::fs::read_to_string(&test)
        .unwrap()
        .lines()
        .filter(|l| !l.contains("\"method\":\"grpo\""))
        .map(|l| format!("{l}\n"))
        .collect();
    std::fs::write(&test, kept).unwrap();
    assert!(!stages::has_test_record(&wb, &pool, Some(Method::Grpo)).unwrap());
    stages::evaluate(&wb, &pool, Some(Method::Grpo))
        .await
        .unwrap();
    harness_pipeline::write_report(&s.cfg).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_server_or_an_unknown_model_stops_the_job_before_any_rollout() {
    let s = setup().await;
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut cfg = s.cfg.clone();
    cfg.tinker.url = Some(format!("http://127.0.0.1:{port}"));
    let err = harness_pipeline::run_main_job(&cfg, &Secrets::default(), &Progress::hidden())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tinker.url") && err.contains("cannot reach"),
        "{err}"
    );
    assert!(!cfg.out.join("evolve").exists(), "evolution ran: {err}");
    assert!(!cfg.out.join("train").exists());

    let mut cfg = s.cfg.clone();
    cfg.out = s._dir.path().join("run-unknown-model");
    cfg.tinker.base_model = Some("Qwen/Qwen3-4B".into());
    let err = harness_pipeline::run_main_job(&cfg, &Secrets::default(), &Progress::hidden())
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tinker.base_model") && err.contains(BASE) && err.contains("Qwen/Qwen3-4B"),
        "{err}"
    );
    assert!(!cfg.out.join("train").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sync_that_fails_stops_training_before_a_rollout_samples_stale_weights() {
    for fault in [Fault::CorruptArchive, Fault::Status(500)] {
        let s = setup().await;
        let wb = workbench(&s.cfg);
        let pool = stages::evolve(&wb).await.unwrap();
        for _ in 0..4 {
            s.fake.inject("archive", fault.clone());
        }
        let err = stages::train(&wb, &pool, Method::Grpo, false)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("syncing weights version 0"),
            "{fault:?}: {err}"
        );
        let run_dir = s.cfg.out.join("train/grpo");
        assert!(
            !run_dir.join("trajectories.jsonl").exists(),
            "{fault:?}: a rollout ran on weights that never arrived"
        );
    }
}

/// Run the training stage until its first checkpoint, then `interrupt`; the stage's error.
async fn train_until_first_checkpoint(s: &Setup, interrupt: impl AsyncFnOnce(&Fake)) -> String {
    let wb = workbench(&s.cfg);
    let pool = stages::evolve(&wb).await.unwrap();
    let run_dir = s.cfg.out.join("train/grpo");
    // The stage's future is not `Send`: it runs on a thread of its own, as in the binary.
    let task = {
        let cfg = s.cfg.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let wb = workbench(&cfg);
                let pool = stages::load_pool(&wb).unwrap();
                stages::train(&wb, &pool, Method::Grpo, false)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            })
        })
    };
    drop(pool);
    let deadline = Instant::now() + Duration::from_secs(300);
    while harness_rollout::latest_checkpoint(&run_dir)
        .ok()
        .flatten()
        .is_none()
    {
        assert!(
            !task.is_finished(),
            "training ended before its first checkpoint"
        );
        assert!(Instant::now() < deadline, "no checkpoint in 5 minutes");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    interrupt(&s.fake).await;
    match task.join().unwrap() {
        Ok(()) => String::new(),
        Err(e) => e,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restart_mid_run_stops_it_and_the_run_resumes_from_its_checkpoint() {
    let mut s = setup().await;
    // Enough updates that one asks the server for pi_old after the fault is injected.
    s.cfg.train.updates = 8;
    let err = train_until_first_checkpoint(&s, async |fake: &Fake| {
        fake.inject("forward", Fault::Restart);
    })
    .await;
    let run_dir = s.cfg.out.join("train/grpo");
    assert!(
        err.contains("Model not found") && err.contains("--resume"),
        "{err}"
    );
    assert!(!run_dir.join("final").exists());
    // The same command with resume: a new model loads the checkpoint and the run ends.
    let models_before = s.fake.requests("create_model").len();
    let wb = workbench(&s.cfg);
    let pool = stages::load_pool(&wb).unwrap();
    stages::train(&wb, &pool, Method::Grpo, true).await.unwrap();
    assert_eq!(
        updates(&run_dir),
        (1..=8).collect::<Vec<_>>(),
        "each update exactly once"
    );
    assert!(run_dir.join("final/config.json").is_file());
    assert_eq!(s.fake.requests("create_model").len(), models_before + 1);
    assert_eq!(
        s.fake.requests("load_weights").len(),
        1,
        "the resume did not restore the server's checkpoint"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_the_server_or_the_run_cannot_honour_are_refused_with_the_reason() {
    let s = setup().await;
    let err = train_until_first_checkpoint(&s, async |fake: &Fake| {
        fake.inject("forward", Fault::Status(400));
    })
    .await;
    assert!(!err.is_empty(), "training was not interrupted");
    let resume = |cfg: RunConfig| async move {
        let wb = workbench(&cfg);
        let pool = stages::load_pool(&wb).unwrap();
        stages::train(&wb, &pool, Method::Grpo, true)
            .await
            .unwrap_err()
            .to_string()
    };

    // With the other learner.
    let mut candle = s.cfg.clone();
    candle.learner = LearnerKind::Candle;
    let err = resume(candle).await;
    assert!(err.contains("learner = \"tinker\""), "{err}");

    // With another LoRA rank.
    let mut rank = s.cfg.clone();
    rank.tinker.lora_rank = 8;
    let err = resume(rank).await;
    assert!(err.contains("lora.rank"), "{err}");

    // After the server lost its checkpoints.
    s.fake.forget_checkpoints();
    let err = resume(s.cfg.clone()).await;
    assert!(err.contains("no longer holds"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_probe_that_disagrees_with_the_server_stops_training_before_any_rollout() {
    // The fake's log-probs are synthetic: no merged model matches them.
    let mut s = setup().await;
    s.cfg.tinker.check_sync = true;
    let wb = workbench(&s.cfg);
    let pool = stages::evolve(&wb).await.unwrap();
    let err = stages::train(&wb, &pool, Method::Grpo, false)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("syncing weights version 0") && err.contains("differ from the server's"),
        "{err}"
    );
    assert!(!s.cfg.out.join("train/grpo/trajectories.jsonl").exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_checkpoint_whose_versions_or_weights_disagree_with_the_server_is_not_resumed() {
    let mut s = setup().await;
    s.cfg.train.updates = 8;
    let err = train_until_first_checkpoint(&s, async |fake: &Fake| {
        fake.inject("forward", Fault::Status(400));
    })
    .await;
    assert!(!err.is_empty(), "training was not interrupted");
    let run_dir = s.cfg.out.join("train/grpo");
    let (dir, state) = harness_rollout::latest_checkpoint(&run_dir)
        .unwrap()
        .unwrap();
    let learner = dir.join("learner");
    let resume = || async {
        let wb = workbench(&s.cfg);
        let pool = stages::load_pool(&wb).unwrap();
        stages::train(&wb, &pool, Method::Grpo, true)
            .await
            .unwrap_err()
            .to_string()
    };

    // The learner's state names another version than the run's.
    let file = learner.join("tinker_learner.json");
    let saved = std::fs::read_to_string(&file).unwrap();
    let mut edited: Value = serde_json::from_str(&saved).unwrap();
    edited["policy_version"] = (state.policy_version + 1).into();
    std::fs::write(&file, serde_json::to_vec(&edited).unwrap()).unwrap();
    let err = resume().await;
    assert!(
        err.contains("policy version") && err.contains("inconsistent"),
        "{err}"
    );
    std::fs::write(&file, saved).unwrap();

    // The merged weights the checkpoint saved are not what the server serves for its version.
    std::fs::copy(
        s.checkpoint.join("model.safetensors"),
        learner.join("model.safetensors"),
    )
    .unwrap();
    let err = resume().await;
    assert!(
        err.contains("differ from the run's checkpoint") && err.contains("refusing to resume"),
        "{err}"
    );
    assert!(!run_dir.join("final").exists());
}
