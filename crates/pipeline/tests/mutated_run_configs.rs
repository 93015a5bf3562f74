//! `RunConfig::load` + `validate` on hostile copies of a valid run configuration, TOML and JSON
//! (issue 25 item 5): cuts, bit flips, huge and negative numbers and nesting bombs are errors
//! naming the file, never panics (a stack overflow would abort the process), and reading stays
//! within a memory budget.

use std::path::Path;

use harness_pipeline::RunConfig;
use harness_testkit::mutate::{self, Mutant, MutantOutcome, TrackingAlloc};

#[global_allocator]
static ALLOC: TrackingAlloc = TrackingAlloc;

/// A configuration that sets something in every section, so that mutants reach every part of
/// the reader and of `validate`.
const VALID: &str = r#"preset = "quick"
seed = 7
seeds = 2
out = "runs/mutated"

[env]
name = "default"
train_tasks = 48
validation_tasks = 12
test_tasks = 16

[policy]
warm_start_preset = "tiny"
learning_rate = 0.001

[policy.warm_start]
seed = 3

[roles]
llm_model = "gpt-4o-mini"
llm_key_env = "OPENAI_API_KEY"
voters = 3
max_tokens = 512
timeout_s = 60
llm_roles = ["analyst", "voters"]

[rollout]
engine = "local"
temperature = 1.0
concurrency = 4

[evolve]
source = "builtin"
proposal_budgets = [2, 3]
parent_slots = 2
train_tasks_per_round = 8
local_eval_tasks = 6
local_eval_controls = 2
revisions = 1
analyst_batch = 10

[calibration]
every = 4
rollouts_per_task = 1
task_features = "text"

[train]
methods = ["grpo", "harness_s"]
updates = 4
group_size = 4
batch_tasks = 2
eval_every = 2
eval_k = 2
checkpoint_every = 2

[eval]
k = 2
ranks = 2
"#;

/// Generous for a file of a few kilobytes (the presets and the warm start's settings are built
/// on every load); the TOML parser's tokens add a few dozen bytes per byte of input.
const BUDGET: usize = 16 << 20;
const PER_BYTE: usize = 32;

fn load(file: &Path) -> harness_pipeline::Result<RunConfig> {
    let cfg = RunConfig::load(file)?;
    cfg.validate(Some(file))?;
    // What the job derives from the counts right away.
    let _ = cfg.seed_list();
    Ok(cfg)
}

fn run(file: &Path, valid: &[u8], mutants: &[Mutant]) -> usize {
    let mut refused = 0;
    for Mutant { what, bytes } in mutants {
        assert!(bytes != valid, "{what}: not a mutant");
        std::fs::write(file, bytes).unwrap();
        let budget = BUDGET + PER_BYTE * bytes.len();
        match mutate::check(what, file, budget, || load(file)) {
            MutantOutcome::Refused(_) => refused += 1,
            // Depth bombs are refused by the parsers' recursion limits.
            MutantOutcome::Loaded => assert!(!what.contains("deep"), "{what}: loaded"),
        }
    }
    refused
}

#[test]
fn mutated_toml_run_configs_are_errors_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mutated.toml");
    std::fs::write(&file, VALID).unwrap();
    let cfg = load(&file).expect("the valid configuration loads");
    assert_eq!((cfg.seed, cfg.train.group_size), (7, 4));

    let mut mutants = mutate::text_mutants(VALID.as_bytes(), 25);
    mutants.extend(mutate::toml_depth_bombs());
    for (what, from, to) in [
        ("seeds past u64", "seed = 7", "seed = 18446744073709551615"),
        ("a trillion seeds", "seeds = 2", "seeds = 1099511627776"),
        ("a negative count", "voters = 3", "voters = -3"),
        (
            "an infinite rate",
            "learning_rate = 0.001",
            "learning_rate = inf",
        ),
        (
            "a NaN temperature",
            "temperature = 1.0",
            "temperature = nan",
        ),
    ] {
        assert!(VALID.contains(from), "{from}");
        mutants.push(Mutant::new(what, VALID.replace(from, to)));
    }
    let refused = run(&file, VALID.as_bytes(), &mutants);
    assert!(
        refused * 2 > mutants.len(),
        "{refused} of {}",
        mutants.len()
    );

    // The huge counts are refused by name, before anything is sized by them.
    for (from, to, field) in [
        ("seeds = 2", "seeds = 1099511627776", "seeds"),
        ("seed = 7", "seed = 18446744073709551615", "seeds"),
    ] {
        std::fs::write(&file, VALID.replace(from, to)).unwrap();
        let e = load(&file).unwrap_err().to_string();
        assert!(e.contains(field) && e.contains("mutated.toml"), "{e}");
    }
}

#[test]
fn mutated_json_run_configs_are_errors_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let toml_file = dir.path().join("valid.toml");
    std::fs::write(&toml_file, VALID).unwrap();
    let doc = harness_pipeline::config::document(&toml_file).unwrap();
    let valid = serde_json::to_vec_pretty(&doc).unwrap();
    let file = dir.path().join("mutated.json");
    std::fs::write(&file, &valid).unwrap();
    load(&file).expect("the valid configuration loads");

    let mut mutants = mutate::text_mutants(&valid, 26);
    mutants.extend(mutate::json_depth_bombs());
    let refused = run(&file, &valid, &mutants);
    assert!(
        refused * 2 > mutants.len(),
        "{refused} of {}",
        mutants.len()
    );
}
