//! The whole loop on a reduced configuration: every output file is written, and the report's
//! figures agree with the run files they are made from (read back here, not recomputed by the
//! code under test).

use std::path::Path;

use harness_pipeline::{Method, Progress, RunConfig, Secrets, Workbench, run_main_job};
use serde_json::Value;

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// A reduced configuration of the embedded default, small enough for a debug test.
pub fn reduced(dir: &Path) -> RunConfig {
    let mut cfg = RunConfig {
        out: dir.join("run"),
        ..RunConfig::default()
    };
    cfg.policy.cache_dir = dir.join("cache");
    for (path, value) in [
        ("policy.warm_start_preset", "\"tiny\""),
        ("env.train_tasks", "16"),
        ("env.validation_tasks", "4"),
        ("env.test_tasks", "4"),
        ("evolve.proposal_budgets", "[2]"),
        ("evolve.train_tasks_per_round", "4"),
        ("evolve.local_eval_tasks", "4"),
        ("evolve.local_eval_controls", "2"),
        ("calibration.every", "1"),
        ("train.updates", "2"),
        ("train.group_size", "2"),
        ("train.batch_tasks", "2"),
        ("train.eval_every", "1"),
        ("train.eval_k", "1"),
        ("train.checkpoint_every", "1"),
        ("eval.k", "1"),
        ("eval.ranks", "2"),
        ("rollout.concurrency", "8"),
    ] {
        cfg.set(path, value).unwrap();
    }
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_whole_loop_writes_every_output_and_the_tables_match_the_run_files() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = reduced(dir.path());
    // Evolution of the reduced run writes its reports; its barely trained policy finds too
    // few valid children for a Top-2 router, so the loop then trains on the environment's
    // built-in siblings.
    let mut evolved = cfg.clone();
    evolved.out = dir.path().join("evolved");
    let wb = Workbench::new(evolved, Secrets::default(), Progress::hidden()).unwrap();
    let pool = harness_pipeline::stages::evolve(&wb).await.unwrap();
    assert_eq!(pool.base_id(), &wb.base.id());
    for file in [
        "pool/pool.json",
        "rounds.json",
        "round-1.json",
        "diversity.json",
        "figure1b.svg",
    ] {
        assert!(
            wb.layout.evolve().join(file).is_file(),
            "evolve/{file} missing"
        );
    }
    cfg.set("evolve.source", "\"builtin\"").unwrap();
    let summary = run_main_job(&cfg, &Secrets::default(), &Progress::hidden())
        .await
        .unwrap();
    let out = &cfg.out;
    for file in [
        "run.json",
        "report.md",
        "report.html",
        "eval/test.jsonl",
        "eval/rank.jsonl",
    ] {
        assert!(out.join(file).is_file(), "{file} missing");
    }
    assert!(out.join("calibration/calibration-0000.json").is_file());
    for m in &cfg.train.methods {
        let run = out.join("train").join(m.name());
        for file in [
            "metrics.jsonl",
            "groups.jsonl",
            "trajectories.jsonl",
            "cost.json",
        ] {
            assert!(run.join(file).is_file(), "{}/{file} missing", m.name());
        }
        assert!(run.join("final/config.json").is_file());
    }
    assert!(
        summary
            .files
            .iter()
            .any(|f| f.extension().is_some_and(|e| e == "svg"))
    );

    // Table 1's H0 Avg@k of each method is the mean reward of its test episodes.
    let tests = jsonl(&out.join("eval/test.jsonl"));
    let report = std::fs::read_to_string(out.join("report.md")).unwrap();
    for record in tests.iter().filter(|r| r["mode"] == "h0") {
        let per_task = record["per_task"].as_array().unwrap();
        let successes: f64 = per_task
            .iter()
            .map(|t| t["successes"].as_f64().unwrap())
            .sum();
        let attempts: f64 = per_task
            .iter()
            .map(|t| t["attempts"].as_f64().unwrap())
            .sum();
        let solved = per_task
            .iter()
            .filter(|t| t["successes"].as_u64() > Some(0))
            .count();
        let avg = successes / attempts;
        let pass = solved as f64 / per_task.len() as f64;
        assert!((record["avg_at_k"].as_f64().unwrap() - avg).abs() < 1e-9);
        assert!((record["pass_at_k"].as_f64().unwrap() - pass).abs() < 1e-9);
        // The method's whole Table 1 row, not just a number somewhere in the report.
        let row = format!(
            "| {} | {:.2} | {:.2} |",
            record["label"].as_str().unwrap(),
            100.0 * pass,
            100.0 * avg
        );
        assert!(
            report.contains(&row),
            "report.md lacks the Table 1 row `{row}`"
        );
    }

    // Table 9's training rollouts of each method are its update records' base and rescue
    // rollouts; Table 2's rescue counts are the rescue-origin records of groups.jsonl.
    for m in &cfg.train.methods {
        let run = out.join("train").join(m.name());
        let updates: Vec<Value> = jsonl(&run.join("metrics.jsonl"))
            .into_iter()
            .filter(|r| r["kind"] == "update")
            .collect();
        assert_eq!(updates.len() as u64, cfg.train.updates, "{}", m.name());
        let rollouts: u64 = updates
            .iter()
            .map(|u| u["rollouts_base"].as_u64().unwrap() + u["rollouts_rescue"].as_u64().unwrap())
            .sum();
        // The label every table uses names the strategy the update records say ran.
        let strategy = updates[0]["strategy"].as_str().unwrap();
        assert!(updates.iter().all(|u| u["strategy"] == strategy));
        let k = cfg.train.group_size;
        let alloc = match strategy.strip_prefix("router_top_") {
            Some("k") => Some(format!("Top-{k}")),
            Some(mxn) => {
                let (a, b) = mxn.split_once('x').unwrap();
                Some(format!("Top-{a} x {b}"))
            }
            None => None,
        };
        let label = match (m, &alloc) {
            (Method::HarnessS, Some(a)) => format!("Harness-S ({a}, adaptive)"),
            (Method::HarnessSFixed, Some(a)) => format!("{a}, fixed profiles"),
            _ => m.label().to_string(),
        };
        assert_eq!(alloc.is_some(), m.uses_router(), "{}: {strategy}", m.name());
        let test_label = tests
            .iter()
            .find(|r| r["method"] == m.name() && r["mode"] == "h0")
            .map(|r| r["label"].as_str().unwrap().to_string());
        assert_eq!(test_label.as_deref(), Some(label.as_str()), "{}", m.name());
        assert!(
            !report.contains("Top-K"),
            "a table names Top-K for {strategy}"
        );
        let row = format!("| {label} | {} | {rollouts} |", cfg.train.updates);
        assert!(
            report.contains(&row),
            "report.md lacks the Table 9 row `{row}`"
        );

        let groups = jsonl(&run.join("groups.jsonl"));
        let rescued: Vec<&Value> = groups.iter().filter(|g| g["origin"] == "rescue").collect();
        let saved = rescued
            .iter()
            .filter(|g| {
                g["rescue_rewards"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|r| r.as_f64() >= Some(1.0))
            })
            .count();
        if *m != Method::Grpo {
            // One stage per update here: the stages' "(successes/triggers)" add up to the file's.
            let cells: Vec<(usize, usize)> = report
                .lines()
                .filter(|l| l.starts_with("| Rescue success, updates"))
                .map(|l| {
                    let col = cfg.train.methods.iter().position(|x| x == m).unwrap() + 2;
                    let cell = l.split('|').nth(col).unwrap();
                    let inner = cell.split('(').nth(1).unwrap().trim_end_matches([')', ' ']);
                    let (a, b) = inner.split_once('/').unwrap();
                    (a.trim().parse().unwrap(), b.trim().parse().unwrap())
                })
                .collect();
            let (s, t) = cells
                .iter()
                .fold((0, 0), |acc, c| (acc.0 + c.0, acc.1 + c.1));
            assert_eq!(
                (s, t),
                (saved, rescued.len()),
                "{}: Table 2 counts",
                m.name()
            );
        } else {
            assert!(rescued.is_empty());
        }

        // The diagnostics line of the method agrees with groups.jsonl: every group counted
        // under a family, the groups with an H0 success among their initial rollouts, and the
        // rescue rollouts of the retained rescued groups.
        let diagnostics = jsonl(&out.join("eval/diagnostics.jsonl"));
        let line = diagnostics
            .iter()
            .find(|d| d["method"] == m.name())
            .unwrap_or_else(|| panic!("eval/diagnostics.jsonl has no line for {}", m.name()));
        let families = line["families"].as_object().unwrap();
        let count =
            |field: &str| -> u64 { families.values().map(|f| f[field].as_u64().unwrap()).sum() };
        assert_eq!(count("groups"), groups.len() as u64, "{}", m.name());
        let with_h0_success = groups
            .iter()
            .filter(|g| {
                g["origin"] != "mixture"
                    && g["base_rewards"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .any(|r| r.as_f64() >= Some(1.0))
            })
            .count() as u64;
        assert_eq!(
            count("groups_with_h0_success"),
            with_h0_success,
            "{}",
            m.name()
        );
        let retained_rescues: Vec<&&Value> =
            rescued.iter().filter(|g| g["retained"] == true).collect();
        let rescue_rollouts: u64 = retained_rescues
            .iter()
            .map(|g| g["rescue_rewards"].as_array().unwrap().len() as u64)
            .sum();
        assert_eq!(
            line["rescue_rollouts"].as_u64(),
            Some(rescue_rollouts),
            "{}",
            m.name()
        );
        assert!(line["tokens_before"].as_u64() <= line["policy_tokens"].as_u64());
        let i = &line["interventions"];
        assert_eq!(
            i["prompt"].as_u64().unwrap()
                + i["message"].as_u64().unwrap()
                + i["none"].as_u64().unwrap(),
            rescue_rollouts,
            "{}: every rescue rollout has one first difference",
            m.name()
        );
    }
    assert!(report.contains("Rescue diagnostics: pre-intervention credit"));
    assert!(report.contains("Rescue diagnostics: GRPO's own signal"));
    assert!(report.contains("Rescue diagnostics: context lock"));
}

/// `env.execution_limits = "paper"` puts Table 8's limits on every harness the run executes:
/// H0 and the built-in siblings, evolution's children (which inherit them), the agent
/// programs that mirror H0, the harness Meta-Harness searches from and keeps, and every
/// harness a training group ran under (a harness's id covers its limits, so the recorded ids
/// name harnesses with these limits).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn table_8_limits_reach_every_harness_a_paper_limits_run_executes() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = reduced(dir.path());
    for (path, value) in [
        ("env.execution_limits", "\"paper\""),
        ("evolve.proposal_budgets", "[1]"),
        ("train.methods", "[\"harness_s\", \"meta_harness\"]"),
        ("train.updates", "1"),
        ("train.eval_every", "0"),
        ("train.checkpoint_every", "0"),
        ("search.proposals", "1"),
    ] {
        cfg.set(path, value).unwrap();
    }
    let table8 = cfg.env.execution_limits.limits().unwrap();
    assert_eq!(
        (table8.max_model_calls, table8.max_env_actions),
        (32, 30),
        "Table 8: 32 model calls and 30 environment actions"
    );
    let wb = Workbench::new(cfg.clone(), Secrets::default(), Progress::hidden()).unwrap();
    assert_eq!(wb.base.limits, table8);
    assert!(!wb.builtin_siblings.is_empty());
    for h in wb.builtin_siblings.iter().chain(&wb.programs) {
        assert_eq!(h.limits, table8, "{}", h.name);
    }
    drop(wb);
    run_main_job(&cfg, &Secrets::default(), &Progress::hidden())
        .await
        .unwrap();

    let pool = harness_pool::SiblingPool::load(cfg.out.join("evolve/pool")).unwrap();
    let mut ids = std::collections::BTreeSet::new();
    for h in pool.members() {
        assert_eq!(h.limits, table8, "pool member {}", h.name);
        ids.insert(h.id().to_string());
    }
    let h_best: harness_core::Harness = serde_json::from_str(
        &std::fs::read_to_string(
            cfg.out
                .join("train")
                .join(Method::MetaHarness.name())
                .join("h_best.json"),
        )
        .unwrap(),
    )
    .unwrap();
    assert_eq!(h_best.limits, table8, "Meta-Harness's H_best");
    let searched = jsonl(
        &cfg.out
            .join("train")
            .join(Method::MetaHarness.name())
            .join("search.jsonl"),
    );
    assert_eq!(
        searched[0]["candidates"][0]["id"].as_str(),
        Some(pool.base_id().to_string().as_str()),
        "the search starts from the run's H0"
    );
    let groups = jsonl(
        &cfg.out
            .join("train")
            .join(Method::HarnessS.name())
            .join("groups.jsonl"),
    );
    let ran: Vec<&str> = groups
        .iter()
        .flat_map(|g| g["retained_harnesses"].as_array().unwrap())
        .map(|h| h.as_str().unwrap())
        .collect();
    assert!(!ran.is_empty());
    for id in ran {
        assert!(
            ids.contains(id),
            "a training group ran {id}, not a pool member"
        );
    }
}
