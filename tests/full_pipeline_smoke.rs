//! Smoke test of `examples/full_pipeline.rs`: the example binary, built by cargo in this test's
//! profile, runs a reduced configuration (DBBench only, one validation task, one rollout per
//! task, a one-step warm start and one GRPO update of the tiny built-in policy) end to end, and
//! writes the files its docs promise. It takes well under a minute in a debug build.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

/// The cargo profile this test was built with, from its own path (`<target>/<dir>/deps/<exe>`).
fn profile_args() -> Vec<String> {
    let exe = std::env::current_exe().expect("test executable path");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .and_then(Path::file_name)
        .and_then(|d| d.to_str())
        .unwrap_or("debug")
        .to_string();
    match dir.as_str() {
        "debug" => vec![],
        "release" => vec!["--release".into()],
        other => vec!["--profile".into(), other.into()],
    }
}

/// Builds the example (a no-op when `cargo test --workspace` already built it: `--workspace`
/// resolves features as that command does, so no dependency is rebuilt with other features) and
/// returns its path, as cargo reports it.
fn example_binary() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let output = Command::new(cargo)
        .args([
            "build",
            "--offline",
            "--workspace",
            "--example",
            "full_pipeline",
            "--message-format",
            "json",
        ])
        .args(profile_args())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "building the example failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == "full_pipeline")
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .expect("cargo reports the example's executable")
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON value per line"))
        .collect()
}

#[test]
fn full_pipeline_runs_a_reduced_configuration() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("full_pipeline_smoke");
    if out.exists() {
        std::fs::remove_dir_all(&out).expect("clear the previous run");
    }
    std::fs::create_dir_all(&out).expect("output folder");
    let config = json!({
        "seed": 7,
        "out": out.join("run"),
        "envs": ["dbbench"],
        "eval_tasks": 1,
        "k": 1,
        "warm_start_steps": 1,
        "warm_start_tasks": 1,
        // The first DBBench demonstration is longer than the default 1536 tokens.
        "warm_start_max_tokens": 2048,
        "grpo_steps": 1,
        "batch_tasks": 1,
        // One short call per episode: a 1,500-token prompt's prefill is most of the run's time
        // (grpo-candle runs at opt-level 0 in test builds).
        "max_model_calls": 1,
        "max_output_tokens": 8,
        "concurrency": 4
    });
    let config_path = out.join("run.json");
    std::fs::write(&config_path, config.to_string()).expect("write the config");

    let run = Command::new(example_binary())
        .arg("--config")
        .arg(&config_path)
        .env("RUST_LOG", "warn")
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "full_pipeline failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );

    let run_dir = out.join("run");
    let metrics = jsonl(&run_dir.join("metrics.jsonl"));
    let stages: Vec<&str> = metrics.iter().filter_map(|m| m["stage"].as_str()).collect();
    for stage in ["warm_start", "before training", "grpo", "after training"] {
        assert!(stages.contains(&stage), "no `{stage}` record in {stages:?}");
    }
    // Evaluation under H0 and the sibling, before and after training.
    let evaluations = metrics
        .iter()
        .filter(|m| m["pass_at_k"].is_number())
        .count();
    assert_eq!(evaluations, 4, "{metrics:?}");
    let grpo = metrics
        .iter()
        .find(|m| m["stage"] == "grpo")
        .expect("grpo record");
    assert_eq!(grpo["metrics"]["groups"], 1, "{grpo}");
    assert_eq!(grpo["metrics"]["updates"], 1, "{grpo}");
    assert!(
        grpo["metrics"]["policy_tokens"].as_u64() > Some(0),
        "{grpo}"
    );

    // 2 evaluation episodes (H0 and the sibling) before training, 1 rollout, 2 after; every
    // turn records the sampling settings the trainer checked.
    let trajectories =
        harness_core::read_jsonl(run_dir.join("trajectories.jsonl")).expect("trajectories read");
    assert_eq!(trajectories.len(), 5);
    assert!(
        trajectories
            .iter()
            .flat_map(|t| &t.turns)
            .all(|turn| turn.sampling.is_some())
    );
    for file in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(
            run_dir.join("checkpoint").join(file).exists(),
            "checkpoint lacks {file}"
        );
    }
    assert!(stdout.contains("GRPO under H0"), "{stdout}");
}
