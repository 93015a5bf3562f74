//! `harness-s train --learner tinker` against SkyRL's real Tinker server (`skyrl-tx` 0.3.0,
//! JAX on the CPU), on the recovery-hooks organism's checkpoint (seed 42): three updates of GRPO
//! with a SIGKILL after the first checkpoint and `--resume`, then `eval`.
//!
//! Needs `HARNESS_TINKER_PYTHON` (`.ci/run` installs the venv and sets it; without it, and
//! without `CI=true`, the test says so and passes). Checked:
//! 1. each update ran once, the policy version advanced with each, and every sync (saved on
//!    the server, downloaded, merged from the initial weights) passed the probe: the server's
//!    log-probs and the merged policy's agree within `tinker.check_tolerance`;
//! 2. rollouts after an update sampled the updated weights: the last update's rollouts, which
//!    record version 2, are scored by the server with the update-2 checkpoint loaded, and
//!    their recorded log-probs match within 1e-3, while the base model's differ;
//! 3. the killed run resumed from its checkpoint, and `eval` scores the trained policy with
//!    the server gone.

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{fresh_dir, jsonl};
use harness_core::{Group, GroupOrigin, Trajectory};
use harness_tinker::{ServerKind, TinkerClient, TinkerConfig, TinkerLearner, TinkerLearnerConfig};

#[path = "../crates/tinker/examples/support/skyrl.rs"]
mod skyrl;

const TOLERANCE: f64 = 1e-3;

fn harness_s() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_harness-s"));
    cmd.env("RUST_LOG", "error");
    cmd
}

fn config(dir: &Path, url: &str) -> PathBuf {
    let text = format!(
        r#"seed = 42
out = {out:?}
learner = "tinker"

[tinker]
url = {url:?}
lora_rank = 4
learning_rate = 2e-2
weight_decay = 0.0

[env]
train_tasks = 12
validation_tasks = 2
test_tasks = 4

[policy]
cache_dir = {cache:?}

# The recovery-hooks organism, whose first groups on these tasks hold something to learn.
[policy.warm_start]
organism = "recovery_hooks"

[rollout]
concurrency = 4

[evolve]
source = "builtin"

[external]
python_sibling = false

[train]
methods = ["grpo"]
updates = 3
group_size = 4
batch_tasks = 3
eval_every = 0
checkpoint_every = 1

[eval]
k = 1
ranks = 1
"#,
        out = dir.join("run").display().to_string(),
        cache = dir.join("cache").display().to_string(),
    );
    let path = dir.join("run.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn run_ok(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{what} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The server's log-probs of `groups`' policy tokens after loading the checkpoint at
/// `learner_dir` (or the base model when `None`), with the recorded ones.
async fn scored(
    url: &str,
    base: &str,
    learner_dir: Option<&Path>,
    groups: &[Group],
) -> (Vec<f64>, Vec<f64>) {
    let mut tcfg = TinkerConfig::new(url);
    tcfg.future_timeout = Duration::from_secs(600);
    let client = TinkerClient::new(tcfg).unwrap();
    let mut cfg = TinkerLearnerConfig::new(base, ServerKind::SkyrlTx);
    cfg.lora.rank = 4;
    cfg.adam.learning_rate = 2e-2;
    cfg.adam.weight_decay = 0.0;
    let mut learner = TinkerLearner::connect(client, cfg).await.unwrap();
    if let Some(dir) = learner_dir {
        tokio::task::block_in_place(|| {
            harness_core::Learner::load_checkpoint(&mut learner, dir).unwrap()
        });
    }
    let (batch, server) = learner.score(groups).await.unwrap();
    let recorded = batch
        .sequences
        .iter()
        .flat_map(|s| s.rollout_logp.clone())
        .collect();
    (server, recorded)
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn harness_s_trains_on_skyrl_resumes_after_a_kill_and_samples_the_servers_weights() {
    let Some(python) = std::env::var(skyrl::VAR).ok().filter(|p| !p.is_empty()) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but {} is not set: .ci/run installs SkyRL's server and sets it",
            skyrl::VAR
        );
        eprintln!(
            "skipped: {} is not set; set it to the python of a venv with skyrl-tx 0.3.0 and CPU JAX",
            skyrl::VAR
        );
        return;
    };
    let dir = fresh_dir("tinker_skyrl");
    // The warm start first: the server is started on the checkpoint it writes.
    let placeholder = config(&dir, "http://127.0.0.1:9");
    run_ok(
        harness_s()
            .args(["evolve", "--quiet", "--config"])
            .arg(&placeholder),
        "evolve",
    );
    let checkpoint = std::fs::read_dir(dir.join("cache"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.join("config.json").is_file())
        .expect("the warm start's checkpoint");
    let base = std::fs::canonicalize(&checkpoint)
        .unwrap()
        .display()
        .to_string();
    let work = dir.join("server");
    std::fs::create_dir_all(&work).unwrap();
    let (mut server, url) = skyrl::start_server(&python, Path::new(&base), &work);
    skyrl::wait_healthy(&url, &mut server).await;
    let config = config(&dir, &url);
    let run_dir = dir.join("run/train/grpo");

    // Train; kill -9 once the first update's checkpoint is complete.
    let mut child = harness_s()
        .args(["train", "--quiet", "--method", "grpo", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(900);
    while harness_rollout::latest_checkpoint(&run_dir)
        .ok()
        .flatten()
        .is_none()
    {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!(
                "train ended ({status}) before it could be killed:\n{err}\nserver log:\n{}",
                std::fs::read_to_string(&server.log).unwrap_or_default()
            );
        }
        assert!(Instant::now() < deadline, "no checkpoint within 15 minutes");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!run_dir.join("final").exists(), "finished before the kill");
    let started = Instant::now();
    let out = harness_s()
        .args([
            "train", "--quiet", "--resume", "--method", "grpo", "--config",
        ])
        .arg(&config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "resume failed:\n{}\nserver log:\n{}",
        String::from_utf8_lossy(&out.stderr),
        std::fs::read_to_string(&server.log).unwrap_or_default()
    );
    eprintln!("resumed run: {:.0}s", started.elapsed().as_secs_f64());

    // 1. Updates once each, versions advancing, every sync probed.
    let metrics: Vec<_> = jsonl(&run_dir.join("metrics.jsonl"))
        .into_iter()
        .filter(|m| m["kind"] == "update")
        .collect();
    let updates: Vec<u64> = metrics
        .iter()
        .map(|m| m["update"].as_u64().unwrap())
        .collect();
    assert_eq!(updates, vec![1, 2, 3], "each update exactly once");
    let versions: Vec<u64> = metrics
        .iter()
        .map(|m| m["policy_version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, vec![1, 2, 3]);
    let syncs = jsonl(&run_dir.join("sampler/syncs.jsonl"));
    for v in 0..=3 {
        assert!(
            syncs.iter().any(|s| s["version"] == v),
            "version {v} never synced: {syncs:?}"
        );
    }
    for s in &syncs {
        let d = s["probe_max_diff"].as_f64().expect("the probe ran");
        assert!(d < TOLERANCE, "probe difference {d} at {s}");
        eprintln!(
            "sync v{}: save {:.2}s download {:.2}s merge {:.2}s probe {:.2}s, max diff {d:.1e}",
            s["version"],
            s["save_seconds"].as_f64().unwrap(),
            s["download_seconds"].as_f64().unwrap(),
            s["merge_seconds"].as_f64().unwrap(),
            s["probe_seconds"].as_f64().unwrap(),
        );
    }
    for m in &metrics {
        eprintln!(
            "update {}: rollouts {:.2}s, update {:.2}s",
            m["update"],
            m["rollout_seconds"].as_f64().unwrap(),
            m["update_seconds"].as_f64().unwrap()
        );
    }

    assert!(
        metrics
            .iter()
            .take(2)
            .any(|m| m["eg_rate"].as_f64().unwrap() > 0.0),
        "no effective group before version 2: nothing to learn from"
    );

    // 2. The last update's rollouts came from version 2's weights.
    let last: Vec<Trajectory> = jsonl(&run_dir.join("trajectories.jsonl"))
        .into_iter()
        .map(|v| serde_json::from_value::<Trajectory>(v).unwrap())
        .filter(|t| t.policy_version == Some(2))
        .collect();
    assert!(!last.is_empty(), "no rollout records version 2");
    let groups: Vec<Group> = last
        .into_iter()
        .map(|t| Group {
            task: harness_core::Task::new(
                t.task_id.clone(),
                t.env.clone(),
                harness_core::Split::Train,
                "",
                t.seed,
            ),
            trajectories: vec![t],
            origin: GroupOrigin::Base,
        })
        .collect();
    // Two checkpoints are kept: those of updates 2 and 3.
    let at2 = harness_rollout::checkpoint::learner_dir_at(&run_dir, 2)
        .expect("the update-2 checkpoint was not kept");
    let (at_v2, recorded) = scored(&url, &base, Some(&at2), &groups).await;
    let diff = max_diff(&at_v2, &recorded);
    eprintln!(
        "{} tokens of version-2 rollouts: max |recorded - server at v2| = {diff:.2e}",
        at_v2.len()
    );
    assert!(
        diff < TOLERANCE,
        "rollouts did not sample version 2: {diff}"
    );
    let (base_scores, _) = scored(&url, &base, None, &groups).await;
    let moved = max_diff(&base_scores, &recorded);
    eprintln!("max |recorded - base model| = {moved:.2e}");
    assert!(
        moved > TOLERANCE,
        "version 2 is indistinguishable from the base model ({moved}): the updates did not reach the sampler"
    );

    // 3. The evaluation needs no server.
    drop(server);
    run_ok(
        harness_s()
            .args(["eval", "--quiet", "--method", "grpo", "--config"])
            .arg(&config),
        "eval",
    );
}
