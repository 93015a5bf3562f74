//! The `harness-s` command line: every subcommand's `--help`, a directory of bad run
//! configurations each refused with its message, `train --resume` after a kill, and a sweep's
//! cell-seeds in child processes (`sweep --jobs`).

#[allow(dead_code)]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{fresh_dir, jsonl};

fn harness_s() -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_harness-s"));
    cmd.env("RUST_LOG", "error");
    cmd
}

/// Run `cmd` and assert that it succeeded, showing `what` and its output when it did not.
fn succeeds(cmd: &mut Command, what: &str) -> std::process::Output {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{what} failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

#[test]
fn every_subcommand_documents_its_flags_and_every_setting() {
    for sub in [
        "run",
        "evolve",
        "calibrate",
        "train",
        "eval",
        "report",
        "serve",
    ] {
        let out = harness_s().args([sub, "--help"]).output().expect("runs");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{sub} --help failed: {text}");
        for needle in [
            "--config",
            "--set",
            "train.group_size",
            "roles.llm",
            "rollout.engine",
        ] {
            assert!(
                text.contains(needle),
                "`{sub} --help` lacks {needle}:\n{text}"
            );
        }
    }
    let out = harness_s()
        .args(["train", "--help"])
        .output()
        .expect("runs");
    assert!(String::from_utf8_lossy(&out.stdout).contains("--resume"));
}

#[test]
fn every_bad_configuration_is_refused_with_its_message() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/configs/bad");
    let expected: toml::Table =
        toml::from_str(&std::fs::read_to_string(dir.join("expected.toml")).unwrap()).unwrap();
    let mut seen = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if name == "expected.toml" {
            continue;
        }
        let want = expected
            .get(&name)
            .and_then(|v| v.as_str())
            .unwrap_or_else(|| panic!("{name} has no entry in expected.toml"));
        let out = harness_s()
            .args(["train", "--quiet", "--config"])
            .arg(&path)
            .output()
            .expect("runs");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} was accepted");
        assert!(
            stderr.contains(want) && stderr.contains(&name),
            "{name}: expected a message naming the file and containing `{want}`, got:\n{stderr}"
        );
        seen += 1;
    }
    assert_eq!(
        seen,
        expected.len(),
        "expected.toml lists files that are not there"
    );
}

/// A reduced run configuration of the embedded default (tiny warm start, few tasks, two
/// updates), written into `dir`.
pub fn reduced_config(dir: &Path) -> PathBuf {
    let text = format!(
        r#"seed = 5
out = {out:?}

[env]
train_tasks = 16
validation_tasks = 4
test_tasks = 4

[policy]
cache_dir = {cache:?}
warm_start_preset = "tiny"

[rollout]
concurrency = 8

[evolve]
source = "builtin"
proposal_budgets = [2]
train_tasks_per_round = 4
local_eval_tasks = 4
local_eval_controls = 2

[calibration]
every = 1

[train]
methods = ["grpo", "harness_s"]
updates = 3
group_size = 2
batch_tasks = 2
eval_every = 1
eval_k = 1
checkpoint_every = 1

[eval]
k = 1
ranks = 2
"#,
        out = dir.join("run").display().to_string(),
        cache = dir.join("cache").display().to_string(),
    );
    let path = dir.join("run.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn train_resume_continues_a_killed_run() {
    let dir = fresh_dir("cli_resume");
    let config = reduced_config(&dir);
    succeeds(
        harness_s()
            .args(["evolve", "--quiet", "--config"])
            .arg(&config),
        "evolve",
    );
    let run_dir = dir.join("run/train/grpo");

    let mut child = harness_s()
        .args(["train", "--quiet", "--method", "grpo", "--config"])
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starts");
    // Kill it once the first update's checkpoint is complete.
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let done = std::fs::read_to_string(run_dir.join("metrics.jsonl"))
            .map(|t| {
                t.lines()
                    .filter(|l| l.contains("\"kind\":\"update\""))
                    .count()
            })
            .unwrap_or(0);
        if done >= 1
            && harness_rollout::latest_checkpoint(&run_dir)
                .ok()
                .flatten()
                .is_some()
        {
            break;
        }
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
            panic!("train ended ({status}) before it could be killed:\n{err}");
        }
        assert!(Instant::now() < deadline, "no checkpoint within 10 minutes");
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(
        !run_dir.join("final").exists(),
        "the run finished before the kill"
    );

    // Without --resume the run directory is refused; with it the run completes.
    let out = harness_s()
        .args(["train", "--quiet", "--method", "grpo", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("resume"));
    succeeds(
        harness_s()
            .args([
                "train", "--quiet", "--resume", "--method", "grpo", "--config",
            ])
            .arg(&config),
        "resume",
    );
    let updates: Vec<u64> = jsonl(&run_dir.join("metrics.jsonl"))
        .iter()
        .filter(|m| m["kind"] == "update")
        .map(|m| m["update"].as_u64().unwrap())
        .collect();
    assert_eq!(updates, vec![1, 2, 3], "each update exactly once");
    assert!(run_dir.join("final/config.json").is_file());
}

#[test]
fn serve_reads_its_api_key_only_from_an_api_key_variable() {
    let help = harness_s()
        .args(["serve", "--help"])
        .output()
        .expect("runs");
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in ["--api-key-env", "--api-key", "--reload-root"] {
        assert!(help.contains(flag), "`serve --help` lacks {flag}:\n{help}");
    }
    let cases: [(&[&str], &str); 3] = [
        (&["--api-key-env", "HOME"], "_API_KEY"),
        (
            &["--api-key-env", "HARNESS_S_SURELY_UNSET_API_KEY"],
            "not set",
        ),
        (&["--api-key", ""], "empty"),
    ];
    for (args, expected) in cases {
        let out = harness_s()
            .arg("serve")
            .args(args)
            .env_remove("HARNESS_S_SURELY_UNSET_API_KEY")
            .output()
            .expect("runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(err.contains(expected), "{args:?}: {err}");
    }
}

/// A two-cell sweep file (the prompt-rules organism under the paper's and the masked rescue
/// objective, one seed) on [`reduced_config`], with its root at `root`.
fn reduced_sweep(dir: &Path, root: &Path) -> PathBuf {
    let text = format!(
        r#"out = {root:?}
config = {config:?}
seeds = [5]
methods = ["grpo", "harness_s"]
objectives = ["generating", "masked"]

[set]
"external.python_sibling" = false

[[organism]]
name = "rules"
set = {{ "policy.warm_start.organism" = "prompt_rules", "policy.warm_start.unprompted_good_rate" = 0.0 }}
"#,
        root = root.display().to_string(),
        config = reduced_config(dir).display().to_string(),
    );
    let path = dir.join(format!(
        "{}.toml",
        root.file_name().unwrap().to_string_lossy()
    ));
    std::fs::write(&path, text).unwrap();
    path
}

/// The test evaluations of a cell-seed folder without their timings.
fn evaluations(cell: &Path) -> Vec<serde_json::Value> {
    let mut lines = jsonl(&cell.join("eval/test.jsonl"));
    for l in &mut lines {
        l["seconds"] = serde_json::Value::Null;
    }
    lines
}

#[test]
fn sweep_jobs_run_cells_in_child_processes_with_the_results_of_one_process() {
    let dir = fresh_dir("cli-sweep-jobs");
    let parallel = dir.join("jobs");
    let file = reduced_sweep(&dir, &parallel);
    let out = succeeds(
        harness_s().args(["sweep", file.to_str().unwrap(), "--jobs", "2", "--quiet"]),
        "sweep --jobs 2",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("2 cell-seeds in 2 jobs at a time, 0 failed"),
        "{text}"
    );
    assert!(parallel.join("sweep.md").is_file() && parallel.join("sweep.json").is_file());

    // One cell-seed by position: it has finished, so nothing runs; a position past the grid
    // is refused.
    let again = succeeds(
        harness_s().args(["sweep", file.to_str().unwrap(), "--cell", "2", "--quiet"]),
        "sweep --cell 2",
    );
    assert!(String::from_utf8_lossy(&again.stdout).contains("cell-seed 2 had finished"));
    let past = harness_s()
        .args(["sweep", file.to_str().unwrap(), "--cell", "3", "--quiet"])
        .output()
        .unwrap();
    assert!(!past.status.success());
    assert!(
        String::from_utf8_lossy(&past.stderr).contains("there is no cell-seed 3 in a grid of 2")
    );

    // The same grid in one process, one cell-seed after another, evaluates the same episodes.
    let serial = dir.join("serial");
    let serial_file = reduced_sweep(&dir, &serial);
    succeeds(
        harness_s().args(["sweep", serial_file.to_str().unwrap(), "--quiet"]),
        "sweep",
    );
    for cell in ["rules/generating/seed-5", "rules/masked/seed-5"] {
        let (a, b) = (
            evaluations(&parallel.join(cell)),
            evaluations(&serial.join(cell)),
        );
        assert!(!a.is_empty());
        assert_eq!(a, b, "{cell}");
    }
}
