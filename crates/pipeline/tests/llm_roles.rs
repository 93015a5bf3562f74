//! The LLM roles through the `roles.llm` path, against the project's own OpenAI-compatible
//! server (the `serve` stage on the run's own tiny checkpoint): evolution's analyst and
//! editor, the router's profiler and voters and Table 3's labeller all send chat requests
//! there, and the run completes whatever the tiny model answers (malformed answers are
//! rejected and logged).

use std::net::SocketAddr;

use harness_pipeline::serve::{ServeSettings, serve};
use harness_pipeline::{Method, Progress, RunConfig, Secrets, Workbench, run_main_job, stages};
use serde_json::Value;

fn reduced(dir: &std::path::Path) -> RunConfig {
    let mut cfg = RunConfig {
        out: dir.join("run"),
        ..RunConfig::default()
    };
    cfg.policy.cache_dir = dir.join("cache");
    for (path, value) in [
        ("policy.warm_start_preset", "\"tiny\""),
        // Room for the roles' long prompts (the episodes keep their own 1,024-token limit).
        ("policy.warm_start.model.max_position_embeddings", "8192"),
        ("env.train_tasks", "8"),
        ("env.validation_tasks", "2"),
        ("env.test_tasks", "2"),
        ("evolve.proposal_budgets", "[1]"),
        ("evolve.train_tasks_per_round", "2"),
        ("evolve.local_eval_tasks", "2"),
        ("evolve.local_eval_controls", "1"),
        ("calibration.every", "1"),
        ("train.methods", "[\"harness_s\"]"),
        ("train.updates", "1"),
        ("train.group_size", "2"),
        ("train.batch_tasks", "2"),
        ("train.eval_every", "0"),
        ("train.checkpoint_every", "0"),
        ("eval.k", "1"),
        ("eval.ranks", "2"),
        ("roles.voters", "2"),
        ("rollout.concurrency", "8"),
    ] {
        cfg.set(path, value).unwrap();
    }
    cfg
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_llm_roles_run_against_the_projects_own_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = reduced(dir.path());
    // The served model: the run's own warm-started checkpoint.
    let wb = Workbench::new(cfg.clone(), Secrets::default(), Progress::hidden()).unwrap();
    let server = serve(
        &wb.checkpoint,
        &ServeSettings {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            served_model: "tiny".into(),
            max_batch: 8,
            api_key: None,
            reload_root: None,
        },
    )
    .await
    .unwrap();
    cfg.roles.llm = Some(format!("{}/v1", server.base_url()));
    cfg.roles.llm_model = "tiny".into();
    let secrets = Secrets {
        llm_api_key: Some("test-key".into()),
        engine_api_key: None,
        tinker_api_key: None,
    };

    // Evolution with the LLM analyst and editor.
    let mut evolved = cfg.clone();
    evolved.out = dir.path().join("evolved");
    let wb = Workbench::new(evolved, secrets.clone(), Progress::hidden()).unwrap();
    stages::evolve(&wb).await.unwrap();
    let usage: Value = serde_json::from_str(
        &std::fs::read_to_string(wb.layout.evolve().join("usage.json")).unwrap(),
    )
    .unwrap();
    let tokens = |v: &Value| v["calls"].as_u64().unwrap_or(0);
    let analyst: u64 = usage.as_object().unwrap().values().map(tokens).sum();
    assert!(analyst > 0, "evolution sent no LLM request: {usage}");

    // The loop with the LLM profiler and voters (on the built-in siblings, so Top-2 exists),
    // and the rule router, which reads validation outcomes and never a profile.
    cfg.set("evolve.source", "\"builtin\"").unwrap();
    cfg.set("train.methods", "[\"harness_s\", \"rule_router\"]")
        .unwrap();
    run_main_job(&cfg, &secrets, &Progress::hidden())
        .await
        .unwrap();
    let cost: Value = serde_json::from_str(
        &std::fs::read_to_string(
            cfg.out
                .join("train")
                .join(Method::HarnessS.name())
                .join("cost.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let text = cost.to_string();
    assert!(
        text.contains("voter") || text.contains("profiler"),
        "no LLM role usage in cost.json: {text}"
    );
    // What the voters answered, and what was done with the malformed answers.
    let stats: harness_router::RouterStats = serde_json::from_str(
        &std::fs::read_to_string(
            cfg.out
                .join("train")
                .join(Method::HarnessS.name())
                .join(stages::ROUTER_STATS_FILE),
        )
        .unwrap(),
    )
    .unwrap();
    assert!(stats.selections > 0, "{stats:?}");
    // Every voter asked per selection ends in a valid ballot or a dropped one.
    assert_eq!(
        stats.ballots + stats.dropped,
        stats.selections * cfg.roles.voters as u64,
        "{stats:?}"
    );
    assert!(stages::voter_summary(&stats).contains("malformed answers rejected"));
    // The rule router pays for no LLM profile: its re-anchorings profile with the built-in
    // labellers, and Table 10 charges it the first calibration's rollouts without the LLM
    // profiler's tokens, which the router with voters is charged.
    let stage_cost = |dir: std::path::PathBuf| -> Value {
        serde_json::from_str(&std::fs::read_to_string(dir.join("stage_cost.json")).unwrap())
            .unwrap()
    };
    let calls = |cost: &Value| -> u64 {
        cost["tokens"].as_object().map_or(0, |t| {
            t.values().map(|u| u["calls"].as_u64().unwrap()).sum()
        })
    };
    // Which profiler each re-anchoring used, from its calibration file.
    let profilers = |method: Method| -> Vec<String> {
        let dir = cfg
            .out
            .join("train")
            .join(method.name())
            .join("calibrations");
        let mut files: Vec<_> = std::fs::read_dir(&dir)
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "json"))
            .collect();
        files.sort();
        files
            .iter()
            .map(|f| {
                let v: Value = serde_json::from_str(&std::fs::read_to_string(f).unwrap()).unwrap();
                v["profiler"]["profiler"].as_str().unwrap().to_string()
            })
            .collect()
    };
    let rule_profilers = profilers(Method::RuleRouter);
    assert!(!rule_profilers.is_empty());
    assert!(
        rule_profilers.iter().all(|p| p == "builtin"),
        "{rule_profilers:?}"
    );
    let routed = profilers(Method::HarnessS);
    assert!(!routed.is_empty());
    assert!(routed.iter().all(|p| p == "llm"), "{routed:?}");
    let rule = stage_cost(cfg.out.join("train").join(Method::RuleRouter.name()));
    assert_eq!(calls(&rule), 0, "{rule}");
    assert!(rule["rollouts"]["calibration"].as_u64() > Some(0), "{rule}");
    let table = harness_report::table10(&harness_report::read_run(&cfg.out).unwrap());
    let row = |method: &str| {
        table
            .rows
            .iter()
            .find(|r| r.method == method)
            .unwrap_or_else(|| panic!("no Table 10 row for {method}: {table:?}"))
    };
    assert_eq!(
        row(Method::RuleRouter.name()).api_tokens.mean,
        0.0,
        "{table:?}"
    );
    assert!(
        row(Method::HarnessS.name()).api_tokens.mean > 0.0,
        "{table:?}"
    );
    // Table 3's LLM labeller read every H0 test attempt of both checkpoints: each attempt has
    // LLM labels, or an empty map when the tiny model's answers stayed unusable, and the
    // report shows its table beside the rule labeller's.
    let usage = std::fs::read_to_string(cfg.out.join("eval/labeller.jsonl")).unwrap();
    let usage: Vec<Value> = usage
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let methods: Vec<&str> = usage
        .iter()
        .map(|u| u["method"].as_str().unwrap())
        .collect();
    assert_eq!(
        methods,
        ["initial", "harness_s", "rule_router"],
        "{usage:?}"
    );
    assert!(
        usage.iter().all(|u| u["requests"].as_u64() >= Some(2)),
        "{usage:?}"
    );
    let episodes = std::fs::read_to_string(cfg.out.join("eval/episodes.jsonl")).unwrap();
    let mut unlabelled = 0;
    for line in episodes.lines() {
        let line: Value = serde_json::from_str(line).unwrap();
        for a in line["attempts"].as_array().unwrap() {
            let llm = a["llm_labels"]
                .as_object()
                .expect("every attempt went to the labeller");
            if llm.is_empty() {
                unlabelled += 1;
            } else {
                let rules = a["labels"].as_object().unwrap();
                assert!(llm.keys().all(|k| rules.contains_key(k)), "{a}");
            }
        }
    }
    let reported: u64 = usage
        .iter()
        .map(|u| u["unlabelled"].as_u64().unwrap())
        .sum();
    assert_eq!(unlabelled, reported);
    let report = std::fs::read_to_string(cfg.out.join("report.md")).unwrap();
    assert!(report.contains("Table 3 (LLM labels)"), "{report}");
    assert!(
        report.contains(&format!(
            "{unlabelled} attempts whose answers stayed unusable"
        )),
        "{report}"
    );
    server.shutdown().await.unwrap();
}

/// Evolution that keeps no child (the usual outcome with a tiny LLM as analyst and editor)
/// leaves a pool of H0 alone: the run still completes, trains what needs no sibling, and the
/// report names the sibling method it could not train.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_h0_alone_skips_the_sibling_methods_and_the_run_completes() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = reduced(dir.path());
    cfg.set("train.methods", "[\"grpo\", \"harness_s\"]")
        .unwrap();
    // No agent program joins it either.
    cfg.set("external.python_sibling", "false").unwrap();
    let wb = Workbench::new(cfg.clone(), Secrets::default(), Progress::hidden()).unwrap();
    let mut pool = harness_pool::SiblingPool::new(wb.base.clone()).unwrap();
    pool.freeze();
    let pool_dir = dir.path().join("h0-pool");
    pool.save(&pool_dir).unwrap();
    cfg.pool = Some(pool_dir);
    let summary = run_main_job(&cfg, &Secrets::default(), &Progress::hidden())
        .await
        .unwrap();
    let train = cfg.out.join("train");
    assert!(train.join(Method::Grpo.name()).is_dir());
    assert!(!train.join(Method::HarnessS.name()).exists());
    let report = std::fs::read_to_string(cfg.out.join("report.md")).unwrap();
    assert!(
        report.contains("Not trained in") && report.contains("harness_s"),
        "{report}"
    );
    assert!(!summary.tables.is_empty());
}
