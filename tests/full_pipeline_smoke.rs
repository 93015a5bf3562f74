//! Smoke test of `examples/full_pipeline.rs`: the example binary, built by cargo in this test's
//! profile, runs the whole loop on a reduced configuration of the embedded default (the tiny
//! warm-start preset, a few tasks, two updates per method) and writes the files its docs
//! promise.

mod common;

use std::process::Command;

use common::{example_binary, fresh_dir, jsonl};

#[test]
fn full_pipeline_runs_the_whole_loop_on_a_reduced_configuration() {
    let out = fresh_dir("full_pipeline_smoke");
    let config = out.join("run.toml");
    std::fs::write(
        &config,
        format!(
            r#"seed = 7
out = {run:?}

[env]
train_tasks = 8
validation_tasks = 3
test_tasks = 3

[policy]
cache_dir = {cache:?}
warm_start_preset = "tiny"

[rollout]
concurrency = 8

[evolve]
source = "builtin"

[train]
methods = ["grpo", "harness_s"]
updates = 2
group_size = 2
batch_tasks = 2
eval_every = 1
eval_k = 1
checkpoint_every = 0

[calibration]
every = 1

[eval]
k = 1
ranks = 2
"#,
            run = out.join("run").display().to_string(),
            cache = out.join("cache").display().to_string(),
        ),
    )
    .unwrap();

    let run = Command::new(example_binary("full_pipeline"))
        .args(["--quiet", "--config"])
        .arg(&config)
        .env("RUST_LOG", "error")
        .output()
        .expect("the example runs");
    let stdout = String::from_utf8_lossy(&run.stdout);
    assert!(
        run.status.success(),
        "full_pipeline failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let run_dir = out.join("run");
    for file in [
        "report.md",
        "report.html",
        "eval/test.jsonl",
        "eval/rank.jsonl",
        "run.json",
    ] {
        assert!(run_dir.join(file).is_file(), "{file} missing");
    }
    let tests = jsonl(&run_dir.join("eval/test.jsonl"));
    let modes: Vec<(String, String)> = tests
        .iter()
        .map(|r| {
            (
                r["method"].as_str().unwrap().into(),
                r["mode"].as_str().unwrap().into(),
            )
        })
        .collect();
    for want in [
        ("initial", "h0"),
        ("grpo", "h0"),
        ("harness_s", "h0"),
        ("harness_s", "rank1"),
    ] {
        assert!(
            modes.iter().any(|(m, k)| m == want.0 && k == want.1),
            "no {want:?} test record in {modes:?}"
        );
    }
    assert!(stdout.contains("Table 1"), "{stdout}");
    assert!(stdout.contains("Table 9"), "{stdout}");
}
