//! Smoke test of `examples/full_pipeline.rs`: the example binary, built by cargo in this test's
//! profile, runs a reduced configuration (DBBench only, one validation task, one rollout per
//! task, a one-step warm start and one GRPO update of the tiny built-in policy) end to end, and
//! writes the files its docs promise. It takes well under a minute in a debug build.

mod common;

use std::process::Command;

use common::{example_binary, fresh_dir, jsonl};
use serde_json::json;

#[test]
fn full_pipeline_runs_a_reduced_configuration() {
    let out = fresh_dir("full_pipeline_smoke");
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

    let run = Command::new(example_binary("full_pipeline"))
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
