//! The bundled Python agent as the embedded default's sibling program: run through the
//! environment server and the recording proxy, it shows the warm-started policy exactly the
//! tokens the in-process low-budget sibling shows it, so the two episodes are the same, token
//! for token, and the agent's turns pass the prefix check.

use std::sync::Arc;

use harness_core::{EpisodeOptions, Policy, SamplingParams, Termination, run_episode_with};
use harness_pipeline::{Progress, RunConfig, Secrets, Workbench};
use harness_pool::SiblingPool;

/// Whether `python3` runs here; under CI (`CI=true`) it must.
fn python() -> bool {
    let found = std::process::Command::new("python3")
        .arg("-c")
        .arg("")
        .status()
        .is_ok_and(|s| s.success());
    let ci = std::env::var("CI").is_ok_and(|v| matches!(v.trim(), "true" | "1"));
    assert!(
        found || !ci,
        "python3 is not on PATH and CI=true: the agent-program tests need it"
    );
    if !found {
        println!("skipping: python3 is not on PATH (under CI=true this fails)");
    }
    found
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bundled_agent_shows_the_policy_the_tokens_of_the_sibling_it_mirrors() {
    if !python() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = RunConfig {
        out: dir.path().join("run"),
        ..RunConfig::default()
    };
    cfg.policy.cache_dir = dir.path().join("cache");
    cfg.set("env.train_tasks", "12").unwrap();
    let wb = Workbench::new(cfg, Secrets::default(), Progress::hidden()).unwrap();
    assert_eq!(
        wb.programs.len(),
        1,
        "the default's pool gets the bundled agent"
    );
    let program = wb.programs[0].clone();
    assert!(program.is_external());
    let sibling = wb
        .builtin_siblings
        .iter()
        .find(|s| s.hooks.contains_key("low-budget-commit"))
        .unwrap()
        .clone();
    let pool = SiblingPool::starter(
        wb.base.clone(),
        [sibling.clone(), program.clone()],
        serde_json::Value::Null,
    )
    .unwrap();
    let policy: Arc<dyn Policy> = wb.local_policy(&wb.checkpoint, "policy").unwrap();
    let env = wb.env_for(&pool, policy.clone()).await.unwrap();
    let options = EpisodeOptions {
        sampling: SamplingParams::greedy(),
    };
    let (mut hooked, mut solved, mut turns) = (0, 0, 0);
    for (i, task) in wb.train.iter().enumerate() {
        let seed = 1000 + i as u64;
        let inside = run_episode_with(
            policy.as_ref(),
            &sibling,
            env.as_ref(),
            task,
            seed,
            &options,
        )
        .await
        .unwrap();
        let outside = run_episode_with(
            policy.as_ref(),
            &program,
            env.as_ref(),
            task,
            seed,
            &options,
        )
        .await
        .unwrap();
        let id = &task.id;
        assert_ne!(
            outside.termination,
            Termination::ProgramFailed,
            "{id}: {}",
            outside.outcome.details
        );
        assert_eq!(outside.harness_id, program.id());
        assert_eq!(inside.turns.len(), outside.turns.len(), "{id}");
        for (k, (a, b)) in inside.turns.iter().zip(&outside.turns).enumerate() {
            assert_eq!(
                a.context_tokens, b.context_tokens,
                "{id}: turn {k}'s prompt"
            );
            assert_eq!(a.tokens, b.tokens, "{id}: turn {k}'s completion");
            assert_eq!(a.logprobs, b.logprobs, "{id}: turn {k}'s log-probs");
        }
        assert_eq!(inside.reward(), outside.reward(), "{id}");
        assert_eq!(outside.counts.prefix_breaks, 0, "{id}");
        hooked += usize::from(inside.counts.hook_messages > 0);
        solved += usize::from(outside.reward() >= 1.0);
        turns += outside.turns.len();
    }
    // The hook path and the committing path are both exercised.
    assert!(hooked > 0, "the low-budget hook never fired");
    assert!(solved > 0, "no episode was solved");
    assert!(turns > wb.train.len());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_program_can_be_h0_of_the_main_job() {
    if !python() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let agent = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../external/agents/dbbench_agent.py")
        .canonicalize()
        .unwrap();
    let h0 = dir.path().join("h0.json");
    std::fs::write(
        &h0,
        serde_json::json!({
            "kind": "external",
            "name": "python-h0",
            "command": ["python3", agent.display().to_string()],
            "limits": {"max_model_calls": 4, "max_env_actions": 4, "max_context_tokens": 1024,
                       "max_output_tokens": 64, "timeout_s": 60}
        })
        .to_string(),
    )
    .unwrap();
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
        ("evolve.source", "\"builtin\""),
        ("calibration.every", "0"),
        ("train.methods", "[\"grpo\"]"),
        ("train.updates", "1"),
        ("train.group_size", "2"),
        ("train.batch_tasks", "2"),
        ("train.eval_every", "0"),
        ("train.checkpoint_every", "0"),
        ("eval.k", "1"),
    ] {
        cfg.set(path, value).unwrap();
    }
    cfg.set("external.h0", &format!("\"{}\"", h0.display()))
        .unwrap();
    harness_pipeline::run_main_job(&cfg, &Secrets::default(), &Progress::hidden())
        .await
        .unwrap();
    let out = &cfg.out;
    // H0 is the program: the pool's base, listed as a program, and every GRPO rollout ran it.
    let programs: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("programs.json")).unwrap()).unwrap();
    let pool = harness_pool::SiblingPool::load(out.join("evolve/pool")).unwrap();
    assert!(pool.base().is_external());
    assert_eq!(
        programs[pool.base_id().to_string()].as_str(),
        Some("python-h0")
    );
    let groups = std::fs::read_to_string(out.join("train/grpo/groups.jsonl")).unwrap();
    let base = pool.base_id().to_string();
    let mut rollouts = 0;
    for line in groups.lines() {
        let g: serde_json::Value = serde_json::from_str(line).unwrap();
        for h in g["retained_harnesses"].as_array().unwrap() {
            assert_eq!(h.as_str(), Some(base.as_str()));
            rollouts += 1;
        }
    }
    assert_eq!(rollouts, 2 * 2);
    let tests = std::fs::read_to_string(out.join("eval/test.jsonl")).unwrap();
    assert!(
        tests.lines().any(|l| l.contains("\"method\":\"grpo\"")),
        "{tests}"
    );
    // run.json and the report say which sandbox the program ran in.
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("run.json")).unwrap()).unwrap();
    let note = run["external_sandbox"].as_str().unwrap();
    if bwrap() {
        assert_eq!(note, "bubblewrap (own network: env server and proxy only)");
    } else {
        assert!(
            note.starts_with("none: external.sandbox = \"auto\""),
            "{note}"
        );
    }
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    assert!(report.contains(note), "{report}");

    // `auto` that finds no sandbox (no interpreter to build it with) says so in run.json,
    // with the reason, and the report puts it in bold.
    let mut bare = cfg.clone();
    bare.out = dir.path().join("bare");
    bare.set("external.python", "\"/no/such/python3\"").unwrap();
    let wb = Workbench::new(bare.clone(), Secrets::default(), Progress::hidden()).unwrap();
    assert!(wb.runner.sandbox.is_none());
    let note = wb.program_sandbox.clone().unwrap();
    assert!(
        note.starts_with("none: external.sandbox = \"auto\" found no sandbox")
            && note.contains("/no/such/python3"),
        "{note}"
    );
    harness_pipeline::write_run_config(&wb).unwrap();
    let run: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(bare.out.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["external_sandbox"].as_str(), Some(note.as_str()));
    let report = harness_pipeline::write_report(&bare).unwrap();
    let text = std::fs::read_to_string(&report[0]).unwrap();
    assert!(
        text.contains("**Agent programs ran without a sandbox**") && text.contains(&note),
        "{text}"
    );
}

/// Whether bubblewrap runs here.
fn bwrap() -> bool {
    std::process::Command::new("bwrap")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn the_programs_request_bounds_are_settings_checked_by_name() {
    let defaults = RunConfig::default();
    assert_eq!(defaults.external.requests_in_flight, 4);
    assert_eq!(defaults.external.request_timeout_s, 600.0);
    // Defaults stay out of run.json (a run saved before the settings existed still matches).
    let saved = serde_json::to_value(&defaults).unwrap();
    assert!(saved["external"].get("requests_in_flight").is_none());
    assert!(saved["external"].get("request_timeout_s").is_none());
    let mut cfg = RunConfig::preset(harness_pipeline::Preset::Quick);
    cfg.set("external.requests_in_flight", "8").unwrap();
    cfg.set("external.request_timeout_s", "30").unwrap();
    cfg.validate(None).unwrap();
    assert_eq!(
        serde_json::to_value(&cfg).unwrap()["external"]["requests_in_flight"],
        8
    );
    for (field, value, expected) in [
        ("external.requests_in_flight", "0", "at least 1"),
        ("external.request_timeout_s", "0", "above zero"),
        ("external.request_timeout_s", "-3", "above zero"),
    ] {
        let mut cfg = RunConfig::preset(harness_pipeline::Preset::Quick);
        cfg.set(field, value).unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains(field) && e.contains(expected), "{e}");
    }
}
