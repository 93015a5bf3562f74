//! A reduced sweep (the prompt-rules organism under the paper's and the masked rescue
//! objective, one seed, two updates): both cells run, a second call skips them, and the
//! report's interval of Harness-S against GRPO is recomputed here from the run files; the
//! compact export writes the same report.

use std::collections::BTreeMap;
use std::path::Path;

use harness_pipeline::sweep::{
    CELL_FILE, JSON_FILE, PLOT_FILE, REPORT_FILE, SweepConfig, export_sweep, run_sweep,
    write_sweep_report,
};
use harness_pipeline::{Progress, Secrets};
use harness_report::stats::{BootstrapSettings, paired_bootstrap};
use serde_json::Value;

/// Per test task, successes / attempts of `method`'s H0 evaluation in `dir/eval/test.jsonl`.
fn h0_per_task(dir: &Path, method: &str) -> BTreeMap<String, f64> {
    let text = std::fs::read_to_string(dir.join("eval/test.jsonl")).unwrap();
    let line: Value = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|v| v["method"] == method && v["mode"] == "h0")
        .unwrap_or_else(|| panic!("no h0 line of {method} in {}", dir.display()));
    line["per_task"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["attempts"].as_f64().unwrap() > 0.0)
        .map(|t| {
            (
                t["task"].as_str().unwrap().to_string(),
                t["successes"].as_f64().unwrap() / t["attempts"].as_f64().unwrap(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reduced_sweep_runs_resumes_and_its_intervals_come_from_the_files() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("sweep");
    let file = dir.path().join("sweep.toml");
    let text = format!(
        r#"
out = "{}"
seeds = [5]
methods = ["grpo", "harness_s"]
objectives = ["generating", "masked"]

[set]
"policy.warm_start_preset" = "tiny"
"policy.cache_dir" = "{}"
"evolve.source" = "builtin"
"external.python_sibling" = false
"env.train_tasks" = 16
"env.validation_tasks" = 4
"env.test_tasks" = 6
"calibration.every" = 1
"train.updates" = 2
"train.group_size" = 2
"train.batch_tasks" = 2
"train.eval_every" = 1
"train.eval_k" = 1
"train.checkpoint_every" = 1
"eval.k" = 2
"eval.ranks" = 2
"rollout.concurrency" = 8

[[organism]]
name = "rules"
set = {{ "policy.warm_start.organism" = "prompt_rules", "policy.warm_start.unprompted_good_rate" = 0.0 }}
"#,
        root.display(),
        dir.path().join("cache").display()
    );
    std::fs::write(&file, text).unwrap();
    let sweep = SweepConfig::load(&file).unwrap();
    let outcome = run_sweep(&sweep, &file, &Secrets::default(), &Progress::hidden())
        .await
        .unwrap();
    assert!(outcome.failed.is_empty(), "{:?}", outcome.failed);
    assert_eq!((outcome.ran.len(), outcome.skipped), (2, 0));
    let generating = root.join("rules/generating/seed-5");
    let masked = root.join("rules/masked/seed-5");
    for d in [&generating, &masked] {
        assert!(d.join(CELL_FILE).is_file(), "{}", d.display());
        assert!(d.join("report.md").is_file(), "{}", d.display());
    }
    // The masked cell trained Harness-S only, under its objective.
    let run: Value =
        serde_json::from_str(&std::fs::read_to_string(masked.join("run.json")).unwrap()).unwrap();
    assert_eq!(run["train"]["rescue_objective"], "masked", "{run}");
    assert!(!masked.join("train/grpo").exists());
    for f in [REPORT_FILE, JSON_FILE, PLOT_FILE] {
        assert!(root.join(f).is_file(), "{f}");
    }

    // The masked cell's Harness-S against GRPO (borrowed from the generating cell of the same
    // seed), recomputed from the two evaluation files.
    let report: Value =
        serde_json::from_str(&std::fs::read_to_string(root.join(JSON_FILE)).unwrap()).unwrap();
    let cell = report["cells"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["objective"] == "masked")
        .unwrap();
    assert!(
        cell["borrowed_from"]
            .as_str()
            .unwrap()
            .ends_with("rules/generating")
    );
    let row = &cell["versus_grpo"][0];
    let hs = h0_per_task(&masked, "harness_s");
    let grpo = h0_per_task(&generating, "grpo");
    let diffs: Vec<f64> = hs
        .iter()
        .filter_map(|(t, a)| grpo.get(t).map(|b| a - b))
        .collect();
    assert!(!diffs.is_empty());
    let mean_diff = diffs.iter().sum::<f64>() / diffs.len() as f64;
    assert!((cell["mean_differences"][0].as_f64().unwrap() - mean_diff).abs() < 1e-12);
    let expected = paired_bootstrap(&[diffs], &BootstrapSettings::default()).unwrap();
    let got = &row["intervals"][0];
    assert!(
        (got["low"].as_f64().unwrap() - expected.low).abs() < 1e-12,
        "{got}"
    );
    assert!(
        (got["high"].as_f64().unwrap() - expected.high).abs() < 1e-12,
        "{got}"
    );
    assert_eq!(got["units"].as_u64().unwrap() as usize, expected.units);
    let mean = |m: &BTreeMap<String, f64>| m.values().sum::<f64>() / m.len() as f64;
    let value = row["compared"][0]["value"]["mean"].as_f64().unwrap();
    assert!((value - mean(&hs)).abs() < 1e-9, "{value} vs {}", mean(&hs));

    let md = std::fs::read_to_string(root.join(REPORT_FILE)).unwrap();
    assert!(
        md.contains("rules / masked") && md.contains("are read from"),
        "{md}"
    );
    assert!(md.contains("Wall time per cell-seed"));

    // A second call finds both cell-seeds finished.
    let again = run_sweep(&sweep, &file, &Secrets::default(), &Progress::hidden())
        .await
        .unwrap();
    assert_eq!((again.ran.len(), again.skipped), (0, 2));

    // The compact export: only compressed report inputs and the cell records, from which the
    // same report is written.
    let export = dir.path().join("export");
    let dirs = export_sweep(&sweep, &file, &export).unwrap();
    assert_eq!(
        dirs,
        vec![
            export.join("rules/generating/seed-5"),
            export.join("rules/masked/seed-5")
        ]
    );
    assert!(!export.join("rules/generating/seed-5.partial").exists());
    let mut files = Vec::new();
    let mut stack = vec![export.clone()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                files.push(e.path());
            }
        }
    }
    assert!(files.iter().any(|f| f.ends_with("eval/test.jsonl.gz")));
    assert!(
        files
            .iter()
            .any(|f| f.ends_with("calibrations/calibration-0000.json.gz"))
    );
    for f in &files {
        let name = f.file_name().unwrap().to_string_lossy();
        assert!(
            name.ends_with(".gz") || name == CELL_FILE,
            "{}",
            f.display()
        );
        assert!(
            !name.contains("trajectories") && !name.contains("safetensors"),
            "{name}"
        );
    }
    let mut from_export = sweep.clone();
    from_export.out = export.clone();
    write_sweep_report(&from_export, &file, &[]).unwrap();
    let strip = |path: &Path| -> Value {
        let mut v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        for c in v["cells"].as_array_mut().unwrap() {
            c["dir"] = Value::Null;
            c["borrowed_from"] = Value::Null;
        }
        v
    };
    assert_eq!(strip(&export.join(JSON_FILE)), strip(&root.join(JSON_FILE)));
    let md = std::fs::read_to_string(export.join(REPORT_FILE)).unwrap();
    let original = std::fs::read_to_string(root.join(REPORT_FILE)).unwrap();
    assert_eq!(
        md.replace(&export.display().to_string(), "ROOT"),
        original.replace(&root.display().to_string(), "ROOT")
    );
}
