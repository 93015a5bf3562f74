//! The main job's quick default, on the recovery-hooks organism, over three seeds grows a pool
//! worth routing and routes by task. Slow (about half an hour on two cores):
//!
//! ```sh
//! HARNESS_SLOW_TESTS=1 cargo test --release -p harness-pipeline --test slow_default
//! ```
//!
//! With `HARNESS_SLOW_RUN_DIR=<dir>` the test runs (or, where its files are complete, only
//! re-reads) the job in that directory instead of a temporary one, so a finished
//! `full_pipeline -- --seeds 3 --out <dir>` run can be checked without running it again.
//! Cargo runs the test in `crates/pipeline`: give an absolute path.
//!
//! What it asserts is the pool and the routing, not the training outcome, which the run
//! measures and reports whichever way it falls:
//! - every seed's evolution keeps at least K valid siblings, of at least three distinct
//!   directions, and each planted failure (`no-commit-after-change`,
//!   `rerun-instead-of-commit`, `unknown-schema-name`) has a sibling whose direction targets it;
//! - the first round leaves parents for the next, and the next round proposes children;
//! - the siblings together repair more validation tasks than any one of them;
//! - on the first calibration (the pool and the router before any training update, so the
//!   property does not depend on how training falls), the router's most chosen Rank-1 harness
//!   is not the same for every task family (families come from the task generator and are
//!   used only to check this). After training the run reports the same view; it is measured,
//!   not asserted, as the trained policy may need no sibling's help in some families.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use harness_evolve::round::CandidateOutcome;
use harness_pipeline::{Progress, RunConfig, Secrets, run_main_job};
use harness_report::{RankStage, read_run};

const PLANTED: [&str; 3] = [
    "no-commit-after-change",
    "rerun-instead-of-commit",
    "unknown-schema-name",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_seeds_grow_a_pool_worth_routing_and_route_by_task() {
    if std::env::var_os("HARNESS_SLOW_TESTS").is_none() {
        eprintln!("skipped: set HARNESS_SLOW_TESTS=1 (and use --release) to run");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (out, cache) = match std::env::var_os("HARNESS_SLOW_RUN_DIR") {
        Some(dir) => {
            let out = PathBuf::from(dir);
            let cache = out.parent().unwrap_or(&out).join("cache");
            (out, cache)
        }
        None => (tmp.path().join("run"), tmp.path().join("cache")),
    };
    let mut cfg = RunConfig {
        out: out.clone(),
        seeds: 3,
        ..RunConfig::default()
    };
    cfg.policy.cache_dir = cache;
    // The organism whose planted failures this test names (the main job's default until the
    // rescue sweep had run; the prompt-rules default plants no recheck family).
    cfg.policy.warm_start["organism"] = "recovery_hooks".into();
    let k = cfg.train.group_size;
    run_main_job(&cfg, &Secrets::default(), &Progress::hidden())
        .await
        .unwrap();

    let run = read_run(&out).unwrap();
    assert_eq!(run.seeds.len(), 3);
    for seed in &run.seeds {
        let name = seed.name();
        let evolve = seed.evolve.as_ref().or(run.shared_evolve.as_ref()).unwrap();
        let rounds = evolve.rounds.as_ref().unwrap();
        let mut directions: BTreeMap<String, usize> = BTreeMap::new();
        let mut repairs: Vec<BTreeSet<String>> = Vec::new();
        let mut targeted = BTreeSet::new();
        for c in rounds.iter().flat_map(|r| &r.candidates) {
            if let CandidateOutcome::Valid { repaired_vs_h0, .. } = &c.outcome {
                *directions.entry(c.causes.join("+")).or_default() += 1;
                repairs.push(repaired_vs_h0.iter().cloned().collect());
                targeted.extend(c.causes.iter().cloned());
            }
        }
        let valid: usize = directions.values().sum();
        assert!(valid >= k, "{name}: {valid} valid siblings for K = {k}");
        assert!(directions.len() >= 3, "{name}: directions {directions:?}");
        for cause in PLANTED {
            assert!(
                targeted.contains(cause),
                "{name}: no sibling targets {cause}: {targeted:?}"
            );
        }
        assert!(
            !rounds[0].selection.parents.is_empty(),
            "{name}: round 1 leaves no parent"
        );
        if rounds.len() > 1 {
            assert!(rounds[1].proposed > 0, "{name}: round 2 proposed nothing");
        }
        let union: BTreeSet<&String> = repairs.iter().flatten().collect();
        let best = repairs.iter().map(BTreeSet::len).max().unwrap_or(0);
        assert!(
            union.len() > best,
            "{name}: the union repairs {} tasks, the best sibling {best}",
            union.len()
        );

        let routing = seed.routing.as_ref().unwrap();
        let mut by_family: BTreeMap<&str, BTreeMap<&str, usize>> = BTreeMap::new();
        for r in routing.iter().filter(|r| r.stage == RankStage::Before) {
            *by_family
                .entry(r.family.as_str())
                .or_default()
                .entry(r.rank1_name.as_str())
                .or_default() += 1;
        }
        let firsts: BTreeSet<&str> = by_family
            .values()
            .filter_map(|choices| {
                choices
                    .iter()
                    .max_by(|a, b| a.1.cmp(b.1).then_with(|| b.0.cmp(a.0)))
                    .map(|(n, _)| *n)
            })
            .collect();
        assert!(
            firsts.len() >= 2,
            "{name}: the same Rank-1 harness leads every family: {by_family:?}"
        );
    }
}
