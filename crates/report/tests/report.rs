//! The report of fixture runs written with the real record types of harness-rollout,
//! harness-router and harness-evolve (so a format change breaks these tests), every table
//! value checked against numbers computed by hand.

use std::collections::BTreeSet;
use std::path::Path;

use harness_core::{GroupOrigin, HarnessId, UpdateReport};
use harness_evolve::diversity::diversity;
use harness_report::layout::{EvalMode, RankLine, RankStage, TestEval};
use harness_report::{
    CostSource, Error, Stat, Verdict, directions, figure3, read_run, render_tables, stage_spans,
    table1, table2, table5, table9, write_report,
};
use harness_rollout::metrics::summarize;
use harness_rollout::{Cost, EvalRecord, GroupRecord, UpdateRecord};
use harness_router::{RankReport, RankRow};

const K: usize = 4;
const TASKS: usize = 3;
const UPDATES: u64 = 4;

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

fn assert_stat(s: Option<Stat>, mean: f64) {
    let s = s.expect("a value");
    assert!(close(s.mean, mean), "{} != {mean}", s.mean);
}

fn write_jsonl<T: serde::Serialize>(path: &Path, records: &[T]) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let text: String = records
        .iter()
        .map(|r| serde_json::to_string(r).unwrap() + "\n")
        .collect();
    std::fs::write(path, text).unwrap();
}

fn write_json<T: serde::Serialize>(path: &Path, value: &T) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, serde_json::to_string_pretty(value).unwrap()).unwrap();
}

fn rewards(success: bool) -> Vec<f32> {
    let mut r = vec![0.0; K];
    if success {
        r[0] = 1.0;
    }
    r
}

/// Rescue outcomes of tasks t1 and t2 per update (`None`: the method does not rescue).
fn rescue_plan(method: &str) -> Option<[[bool; 2]; 4]> {
    match method {
        "harness_s" => Some([[true, false], [true, true], [false, false], [true, false]]),
        "harness_s_fixed" => Some([[false, false], [true, false], [false, false], [true, false]]),
        "h0_rescue" => Some([
            [true, false],
            [false, false],
            [false, false],
            [false, false],
        ]),
        _ => None,
    }
}

/// Each update: t1 and t2 fail all K base rollouts (a rescue, when the method rescues, of K
/// rollouts), t3's base group has one success.
fn groups(method: &str, update: u64) -> Vec<GroupRecord> {
    let plan = rescue_plan(method);
    (0..TASKS)
        .map(|t| {
            let base = rewards(t == 2);
            let (origin, rescue_harnesses, rescue_rewards, retained_rewards) = match (plan, t) {
                (Some(p), 0 | 1) => {
                    let r = rewards(p[update as usize - 1][t]);
                    (
                        GroupOrigin::Rescue,
                        vec![HarnessId(format!("s{t}")); K],
                        r.clone(),
                        r,
                    )
                }
                _ => (GroupOrigin::Base, vec![], vec![], base.clone()),
            };
            GroupRecord {
                update,
                task_id: format!("t{}", t + 1),
                draw: update * TASKS as u64 + t as u64,
                origin,
                base_rewards: base,
                retained_harnesses: vec![HarnessId("h0".into()); K],
                rescue_harnesses,
                rescue_rewards,
                retained: true,
                retained_rewards,
                policy_tokens: 100 * (t + 1),
                policy_version: update - 1,
            }
        })
        .collect()
}

fn write_method(seed_dir: &Path, method: &str, with_cost: bool) -> Vec<UpdateRecord> {
    let dir = seed_dir.join("train").join(method);
    let rescue = rescue_plan(method).is_some();
    let mut all_groups = Vec::new();
    let mut updates = Vec::new();
    let mut cost = Cost {
        strategy: method.into(),
        ..Cost::default()
    };
    for u in 1..=UPDATES {
        let g = groups(method, u);
        let mut rec = summarize(u, method, &g, &UpdateReport::default());
        rec.rollout_seconds = if rescue { 15.0 } else { 10.0 };
        rec.update_seconds = 2.0;
        cost.add_update(&rec, false, K, TASKS);
        all_groups.extend(g);
        updates.push(rec);
    }
    if method == "harness_s" {
        cost.calibration_seconds = 30.0;
    }
    let evals: Vec<EvalRecord> = [(0, 0.2, 0.3), (UPDATES, 0.4, 0.6)]
        .iter()
        .map(|&(update, avg, pass)| EvalRecord {
            kind: "eval".into(),
            update,
            k: 3,
            tasks: 10,
            pass_at_k: pass,
            avg_at_k: avg + if rescue { 0.1 } else { 0.0 },
            eval_seconds: 1.0,
        })
        .collect();
    let mut metrics: Vec<serde_json::Value> = vec![serde_json::to_value(&evals[0]).unwrap()];
    metrics.extend(updates.iter().map(|u| serde_json::to_value(u).unwrap()));
    metrics.push(serde_json::to_value(&evals[1]).unwrap());
    write_jsonl(&dir.join("metrics.jsonl"), &metrics);
    write_jsonl(&dir.join("groups.jsonl"), &all_groups);
    if with_cost {
        write_json(&dir.join("cost.json"), &cost);
    }
    updates
}

fn test_eval(method: &str, mode: EvalMode, pass: f64, avg: f64) -> TestEval {
    TestEval {
        method: method.into(),
        label: (method == "grpo").then(|| "GRPO".into()),
        mode,
        k: 3,
        tasks: 20,
        pass_at_k: pass,
        avg_at_k: avg,
        rollouts: 60,
        seconds: 12.5,
        per_task: vec![harness_report::layout::TestTaskOutcome {
            task: "dbbench-test-3".into(),
            harness: HarnessId("h0".into()),
            successes: 1,
            attempts: 3,
        }],
    }
}

fn rank_report(rows: &[(&str, f64, f64, Option<f64>)]) -> RankReport {
    RankReport {
        rows: rows
            .iter()
            .map(|&(label, pass_at_k, avg_at_k, h0_rate)| RankRow {
                label: label.into(),
                pass_at_k,
                avg_at_k,
                h0_rate,
            })
            .collect(),
        tasks: 20,
        attempts: 3,
        rankings: Default::default(),
    }
}

fn write_evolve(seed_dir: &Path) {
    let set = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    let report = diversity(
        (&HarnessId("h0".into()), &set(&["a", "b"])),
        &[
            (HarnessId("s1".into()), "S1".into(), set(&["a", "c", "d"])),
            (HarnessId("s2".into()), "S2".into(), set(&["a", "b", "c"])),
        ],
        5,
        Some(3),
    );
    write_json(&seed_dir.join("evolve/diversity.json"), &report);
}

/// A full single-seed run: four methods, test and rank evaluations, evolution.
fn full_run(dir: &Path, h0_avg_harness_s: f64, grpo_avg: f64, with_rank: bool) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("run.json"), r#"{"seed": 1, "updates": 4}"#).unwrap();
    write_method(dir, "grpo", true);
    write_method(dir, "h0_rescue", true);
    write_method(dir, "harness_s", true);
    write_method(dir, "harness_s_fixed", false);
    write_jsonl(
        &dir.join("eval/test.jsonl"),
        &[
            test_eval("initial", EvalMode::H0, 0.30, 0.20),
            test_eval("grpo", EvalMode::H0, 0.45, grpo_avg),
            test_eval("h0_rescue", EvalMode::H0, 0.50, 0.35),
            test_eval("harness_s", EvalMode::H0, 0.60, h0_avg_harness_s),
            test_eval("harness_s", EvalMode::Rank1, 0.65, 0.47),
            test_eval("harness_s_fixed", EvalMode::H0, 0.55, 0.38),
        ],
    );
    if with_rank {
        write_jsonl(
            &dir.join("eval/rank.jsonl"),
            &[
                RankLine {
                    stage: RankStage::Before,
                    method: "harness_s".into(),
                    report: rank_report(&[
                        ("H0", 0.30, 0.20, None),
                        ("Rank-1", 0.50, 0.38, Some(0.05)),
                        ("Rank-2", 0.45, 0.33, Some(0.10)),
                        ("Rank-3", 0.40, 0.30, Some(0.10)),
                    ]),
                },
                RankLine {
                    stage: RankStage::After,
                    method: "harness_s".into(),
                    report: rank_report(&[
                        ("H0", 0.60, 0.42, None),
                        ("Rank-1", 0.62, 0.47, Some(0.25)),
                        ("Rank-2", 0.58, 0.40, Some(0.15)),
                        ("Rank-3", 0.55, 0.39, Some(0.15)),
                    ]),
                },
            ],
        );
    }
    write_evolve(dir);
}

#[test]
fn single_seed_tables_match_hand_computed_values() {
    let tmp = tempfile::tempdir().unwrap();
    full_run(tmp.path(), 0.42, 0.31, true);
    let run = read_run(tmp.path()).unwrap();
    assert_eq!(run.seeds.len(), 1);
    assert_eq!(run.seeds[0].seed, Some(1));

    // Table 1.
    let t1 = table1(&run);
    let methods: Vec<&str> = t1.rows.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(
        methods,
        [
            "initial",
            "grpo",
            "h0_rescue",
            "harness_s_fixed",
            "harness_s"
        ]
    );
    let hs = t1.rows.iter().find(|r| r.method == "harness_s").unwrap();
    assert_eq!(hs.label, "Harness-S");
    assert_stat(hs.h0_pass, 0.60);
    assert_stat(hs.h0_avg, 0.42);
    assert_stat(hs.rank1_pass, 0.65);
    assert_stat(hs.rank1_avg, 0.47);
    assert_eq!(hs.h0_avg.unwrap().std, None);
    let grpo = &t1.rows[1];
    assert_eq!(grpo.label, "GRPO");
    assert_stat(grpo.h0_avg, 0.31);
    assert_eq!(grpo.rank1_pass, None);

    // Table 2: stages of ceil(4 / 4) = 1 update; rescues of t1 and t2 per update.
    let t2 = table2(&run);
    assert_eq!(t2.stages, stage_spans(4));
    assert_eq!(t2.stages[3].label(), "updates 4–4");
    let col = |m: &str| t2.columns.iter().find(|c| c.method == m).unwrap();
    let rates =
        |m: &str| -> Vec<Option<f64>> { col(m).stages.iter().map(|s| s.map(|s| s.mean)).collect() };
    assert_eq!(
        rates("harness_s"),
        [Some(0.5), Some(1.0), Some(0.0), Some(0.5)]
    );
    assert_eq!(
        rates("harness_s_fixed"),
        [Some(0.0), Some(0.5), Some(0.0), Some(0.5)]
    );
    assert_eq!(
        rates("h0_rescue"),
        [Some(0.5), Some(0.0), Some(0.0), Some(0.0)]
    );
    assert!(!col("grpo").rescue);
    assert_eq!(col("harness_s").counts[1].succeeded, 2);
    assert_eq!(col("harness_s").counts[1].triggered, 2);
    assert_stat(col("harness_s_fixed").final_avg, 0.38);
    assert_stat(col("grpo").final_pass, 0.45);
    // The same numbers from the records themselves: each update's metrics.jsonl
    // rescue_success is the stage's rate (stages are one update long here).
    for m in ["harness_s", "harness_s_fixed", "h0_rescue"] {
        let from_metrics: Vec<Option<f64>> = run.seeds[0].methods[m]
            .updates
            .iter()
            .map(|u| u.rescue_success)
            .collect();
        assert_eq!(rates(m), from_metrics, "{m}");
    }

    // Table 5.
    let t5 = table5(&run);
    assert_eq!(t5.len(), 1);
    assert_eq!(t5[0].method, "harness_s");
    let labels: Vec<&str> = t5[0].rows.iter().map(|r| r.label.as_str()).collect();
    assert_eq!(labels, ["H0", "Rank-1", "Rank-2", "Rank-3"]);
    let r1 = &t5[0].rows[1];
    assert!(close(r1.before.unwrap().avg.mean, 0.38));
    assert!(close(r1.after.unwrap().pass.mean, 0.62));
    assert!(close(r1.after.unwrap().h0_rate.unwrap().mean, 0.25));
    assert_eq!(t5[0].rows[0].before.unwrap().h0_rate, None);

    // Table 9: grpo 4 x 3 x 4 = 48 rollouts; rescue methods 48 + 2 x 4 x 4 = 80.
    let t9 = table9(&run);
    let row = |m: &str| t9.rows.iter().find(|r| r.method == m).unwrap();
    assert!(close(row("grpo").rollouts.mean, 48.0));
    assert!(close(row("harness_s").rollouts.mean, 80.0));
    assert_stat(row("harness_s").relative_to_grpo, 80.0 / 48.0);
    assert_stat(row("harness_s").relative_to_plain_grpo, 80.0 / 48.0);
    assert_stat(row("grpo").relative_to_grpo, 1.0);
    // 4 x (10 + 2) and 4 x (15 + 2) + 30 calibration seconds.
    assert!(close(row("grpo").training_seconds.mean, 48.0));
    assert!(close(row("harness_s").training_seconds.mean, 98.0));
    assert!(close(row("harness_s").calibration_seconds.mean, 30.0));
    assert_stat(row("harness_s").h0_avg, 0.42);
    // Without cost.json the figures come from the update records.
    let fixed = row("harness_s_fixed");
    assert_eq!(fixed.source, CostSource::Metrics);
    assert!(close(fixed.rollouts.mean, 80.0));
    assert!(close(fixed.training_seconds.mean, 68.0));
    assert_eq!(fixed.relative_to_plain_grpo, None);
    assert_eq!(row("grpo").source, CostSource::CostJson);

    // Directions. EG rates: harness_s (2/3 + 1 + 1/3 + 2/3) / 4 = 2/3, h0_rescue
    // (2/3 + 1/3 + 1/3 + 1/3) / 4 = 5/12, grpo 1/3.
    let d = directions(&run);
    assert_eq!(d.len(), 5);
    let eg: Vec<f64> = d[0]
        .compared
        .iter()
        .map(|c| c.value.unwrap().mean)
        .collect();
    assert!(close(eg[0], 2.0 / 3.0) && close(eg[1], 5.0 / 12.0) && close(eg[2], 1.0 / 3.0));
    let mean_eg = |m: &str| {
        let u = &run.seeds[0].methods[m].updates;
        u.iter().map(|u| u.eg_rate).sum::<f64>() / u.len() as f64
    };
    assert!(close(eg[0], mean_eg("harness_s")));
    for row in &d {
        assert_eq!(row.means_ordered, Some(true), "{}", row.claim);
        assert_eq!((row.seeds_holding, row.seeds_compared), (1, 1));
        assert_eq!(row.intervals.len(), row.compared.len() - 1, "{}", row.claim);
    }
    // Paired by (update, task), Harness-S minus H0 rescue is 1 on three of the twelve groups
    // (t1 and t2 at update 2, t1 at update 4) and 0 elsewhere: a resample without any of
    // the three has probability (9/12)^12 = 3.2% > 2.5%, so the interval starts at 0 and the
    // direction is within noise although the means are in order.
    let eg_hs = d[0].intervals[0].unwrap();
    assert_eq!(eg_hs.units, 12);
    assert!(close(eg_hs.low, 0.0), "{eg_hs:?}");
    assert!(eg_hs.high > 0.25 && eg_hs.high <= 0.5 + 1e-12, "{eg_hs:?}");
    assert_eq!(d[0].verdict, Verdict::WithinNoise);
    // The test lines hold one task with the same outcome for every method: a zero interval.
    let avg = d[1].intervals[0].unwrap();
    assert_eq!((avg.low, avg.high, avg.units), (0.0, 0.0, 1));
    assert_eq!(d[1].verdict, Verdict::WithinNoise);
    // Rescue success is unpaired: 4 of 8 rescues against 2 of 8.
    assert_eq!(d[4].intervals[0].unwrap().units, 16);
    assert!(d[2].source.contains("rank.jsonl"));
    let rescue: Vec<f64> = d[4]
        .compared
        .iter()
        .map(|c| c.value.unwrap().mean)
        .collect();
    assert_eq!(rescue, [0.5, 0.25]);

    // Figure 3 comes straight from the update and eval records.
    let fig = figure3(&run);
    let hs_eg = fig.eg_rate.iter().find(|s| s.label == "Harness-S").unwrap();
    let from_file: Vec<(u64, f64)> = run.seeds[0].methods["harness_s"]
        .updates
        .iter()
        .map(|u| (u.update, u.eg_rate))
        .collect();
    assert_eq!(hs_eg.points, from_file);
    assert_eq!(fig.effective_token_share.len(), 4);
    let val = fig
        .validation
        .iter()
        .find(|s| s.label == "Harness-S Avg@3")
        .unwrap();
    assert_eq!(val.points, [(0, 0.2 + 0.1), (UPDATES, 0.4 + 0.1)]);
}

#[test]
fn rendered_tables_and_html_hold_the_values_and_the_svgs() {
    let tmp = tempfile::tempdir().unwrap();
    full_run(tmp.path(), 0.42, 0.31, true);
    let text = render_tables(tmp.path()).unwrap();
    assert!(
        text.contains("| Harness-S | 60.00 | 42.00 | 65.00 | 47.00 |"),
        "{text}"
    );
    assert!(text.contains("| GRPO | 45.00 | 31.00 | — | — |"));
    assert!(
        text.contains(
            "| Rescue success, updates 2–2 | — | 0.00 (0/2) | 50.00 (1/2) | 100.00 (2/2) |"
        )
    );
    assert!(text.contains("| Rank-1 | 50.00 | 38.00 | 5.00 | 62.00 | 47.00 | 25.00 |"));
    assert!(text.contains(
        "| Harness-S | 4 | 80 | 166.67% | 166.67% | 60.0 | 8.0 | 30.0 | 98.0 | 42.00 | cost.json |"
    ));
    assert!(
        text.contains("| within noise; means in the claimed order |"),
        "{text}"
    );
    assert!(text.contains("[+0.00, +0.00]"), "{text}");
    assert!(text.contains("PNG is not rendered"));

    let files = write_report(tmp.path()).unwrap();
    if let Some(keep) = std::env::var_os("HARNESS_REPORT_KEEP") {
        // For a look at a fixture report: copy it out.
        let keep = Path::new(&keep);
        std::fs::create_dir_all(keep.join("plots")).unwrap();
        for f in [&files.markdown, &files.html]
            .into_iter()
            .chain(&files.plots)
        {
            std::fs::copy(f, keep.join(f.strip_prefix(tmp.path()).unwrap())).unwrap();
        }
    }
    let html = std::fs::read_to_string(&files.html).unwrap();
    assert!(html.contains("<h3>Table 1. Test performance under H0 and Rank-1</h3>"));
    assert!(
        html.contains("<td>Harness-S</td><td>60.00</td><td>42.00</td><td>65.00</td><td>47.00</td>")
    );
    assert!(html.contains("Table 9."));
    for name in [
        "figure3a_eg_rate.svg",
        "figure3b_effective_token_share.svg",
        "figure3c_validation.svg",
        "figure1a.svg",
        "figure1b.svg",
        "figure5.svg",
    ] {
        assert!(
            html.contains(&format!("<img src=\"plots/{name}\"")),
            "{name}"
        );
        let svg = std::fs::read_to_string(tmp.path().join("plots").join(name)).unwrap();
        assert!(svg.contains("<svg"), "{name}");
    }
    assert_eq!(files.plots.len(), 6);
    let md = std::fs::read_to_string(&files.markdown).unwrap();
    assert!(md.contains(
        "![Figure 3a. Effective-group (EG) rate per update](plots/figure3a_eg_rate.svg)"
    ));
    assert!(md.contains("| Harness-S | 60.00 | 42.00 | 65.00 | 47.00 |"));
}

#[test]
fn several_seeds_give_mean_and_sample_std() {
    let tmp = tempfile::tempdir().unwrap();
    // Harness-S H0 Avg@3 .40, .42, .47 and GRPO .31, .45, .35: the direction holds on the
    // means (.43 > .37) and in seeds 1 and 3 only.
    for (s, hs, grpo) in [(1, 0.40, 0.31), (2, 0.42, 0.45), (3, 0.47, 0.35)] {
        let dir = tmp.path().join(format!("seed-{s}"));
        full_run(&dir, hs, grpo, s != 3);
        std::fs::write(dir.join("run.json"), format!("{{\"seed\": {s}}}")).unwrap();
    }
    // An evolution shared by the seeds, of which only the SVGs are left: they are copied.
    std::fs::create_dir_all(tmp.path().join("evolve")).unwrap();
    std::fs::write(
        tmp.path().join("evolve/figure1b.svg"),
        "<svg xmlns=\"http://www.w3.org/2000/svg\"/>",
    )
    .unwrap();
    let run = read_run(tmp.path()).unwrap();
    assert_eq!(
        run.seeds.iter().map(|s| s.seed).collect::<Vec<_>>(),
        [Some(1), Some(2), Some(3)]
    );
    let t1 = table1(&run);
    let hs = t1.rows.iter().find(|r| r.method == "harness_s").unwrap();
    let avg = hs.h0_avg.unwrap();
    assert!(close(avg.mean, 0.43));
    // sqrt(((-.03)^2 + (-.01)^2 + .04^2) / (3 - 1)) = sqrt(.0013).
    assert!(close(avg.std.unwrap(), 0.0013f64.sqrt()));
    assert_eq!(avg.n, 3);
    assert!(close(hs.h0_pass.unwrap().std.unwrap(), 0.0));

    let d = directions(&run);
    let h0_avg = &d[1];
    assert_eq!(h0_avg.means_ordered, Some(true));
    assert_eq!((h0_avg.seeds_holding, h0_avg.seeds_compared), (2, 3));
    // Three seeds of one paired test task each, all with equal outcomes.
    assert_eq!(h0_avg.intervals[0].unwrap().units, 3);
    assert_eq!(h0_avg.verdict, Verdict::WithinNoise);
    // Seed 3 has no rank.jsonl: the Rank-1 direction falls back to its test lines.
    assert_eq!(d[2].seeds_compared, 3);
    assert!(d[2].source.contains("rank.jsonl") && d[2].source.contains("test.jsonl"));

    let t5 = table5(&run);
    assert_eq!(t5[0].rows[1].after.unwrap().pass.n, 2);

    let text = render_tables(tmp.path()).unwrap();
    assert!(text.contains("43.00 ± 3.61"), "{text}");
    assert!(text.contains("(2 of 3 seeds)"));
    assert!(
        text.contains("within noise; means in the claimed order; 2/3 seeds"),
        "{text}"
    );
    assert!(text.contains("sample standard deviation (n - 1) over 3 seeds"));
    let files = write_report(tmp.path()).unwrap();
    assert!(
        files
            .plots
            .iter()
            .any(|p| p.ends_with("figure5-seed-2.svg"))
    );
    assert!(tmp.path().join("report.html").is_file());
}

#[test]
fn missing_optional_parts_are_not_run() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("run.json"), r#"{"seed": 4}"#).unwrap();
    write_method(tmp.path(), "grpo", true);
    let text = render_tables(tmp.path()).unwrap();
    assert!(text.contains("Rank-r evaluation not run: no eval/rank.jsonl."));
    assert!(text.contains("Test evaluation not run: no eval/test.jsonl."));
    assert!(text.contains("Evolution not run: no evolve/ folder."));
    assert!(text.contains("| not run |"));
    // A rescue method with a test line but no training run.
    write_jsonl(
        &tmp.path().join("eval/test.jsonl"),
        &[test_eval("harness_s", EvalMode::H0, 0.5, 0.4)],
    );
    let text = render_tables(tmp.path()).unwrap();
    assert!(
        text.contains("| Rescue success, updates 1–1 | — | not run |"),
        "{text}"
    );
    assert!(text.contains("| EG rate: Harness-S > GRPO (H0 rescue) > GRPO | Harness-S not run vs GRPO (H0 rescue) not run vs GRPO 33.33 | no per-unit data; no per-unit data | not run |"), "{text}");
    let files = write_report(tmp.path()).unwrap();
    // Figure 3 only: no evolution views.
    assert_eq!(files.plots.len(), 3);
}

#[test]
fn malformed_lines_name_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("run.json"), r#"{"seed": 4}"#).unwrap();
    let updates = write_method(tmp.path(), "grpo", true);
    let metrics = tmp.path().join("train/grpo/metrics.jsonl");
    let mut bad = serde_json::to_value(&updates[0]).unwrap();
    bad["eg_rate"] = serde_json::json!("high");
    let good = serde_json::to_string(&updates[1]).unwrap();
    std::fs::write(&metrics, format!("{good}\n\n{bad}\n")).unwrap();
    let err = read_run(tmp.path()).unwrap_err();
    assert!(matches!(err, Error::Parse { line: 3, .. }), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("train/grpo/metrics.jsonl:3:"), "{msg}");
    assert!(
        msg.contains("eg_rate") && msg.contains("UpdateRecord"),
        "{msg}"
    );

    // A line cut off in the middle of the file is an error; the same cut as the last line
    // (a crash while writing it, no newline after it) is skipped with a warning.
    std::fs::write(
        &metrics,
        format!("{good}\n{{\"kind\": \"update\", \"update\"\n{good}\n"),
    )
    .unwrap();
    let msg = read_run(tmp.path()).unwrap_err().to_string();
    assert!(
        msg.contains("metrics.jsonl:2: expected one JSON object per line"),
        "{msg}"
    );
    std::fs::write(
        &metrics,
        format!("{good}\n{{\"kind\": \"update\", \"update\""),
    )
    .unwrap();
    let run = read_run(tmp.path()).unwrap();
    assert_eq!(run.seeds[0].methods["grpo"].updates.len(), 1);

    std::fs::write(&metrics, format!("{good}\n{{\"kind\": \"checkpoint\"}}\n")).unwrap();
    let msg = read_run(tmp.path()).unwrap_err().to_string();
    assert!(
        msg.contains("metrics.jsonl:2: expected `kind` to be"),
        "{msg}"
    );
    std::fs::write(&metrics, format!("{good}\n")).unwrap();

    let test = tmp.path().join("eval/test.jsonl");
    let line = serde_json::to_string(&test_eval("grpo", EvalMode::H0, 0.4, 0.3)).unwrap();
    std::fs::create_dir_all(test.parent().unwrap()).unwrap();
    std::fs::write(
        &test,
        format!("{line}\n{}\n", line.replace("\"h0\"", "\"rank9\"")),
    )
    .unwrap();
    let msg = read_run(tmp.path()).unwrap_err().to_string();
    assert!(
        msg.contains("eval/test.jsonl:2:") && msg.contains("mode"),
        "{msg}"
    );
    std::fs::write(&test, format!("{line}\n{line}\n")).unwrap();
    let msg = read_run(tmp.path()).unwrap_err().to_string();
    assert!(
        msg.contains("eval/test.jsonl:2: a second evaluation"),
        "{msg}"
    );
    std::fs::remove_file(&test).unwrap();

    let cost = tmp.path().join("train/grpo/cost.json");
    std::fs::write(
        &cost,
        "{\n  \"strategy\": \"grpo\",\n  \"updates\": \"four\"\n}",
    )
    .unwrap();
    let msg = read_run(tmp.path()).unwrap_err().to_string();
    assert!(
        msg.contains("cost.json:3:") && msg.contains("updates"),
        "{msg}"
    );

    let empty = tempfile::tempdir().unwrap();
    let msg = read_run(empty.path()).unwrap_err().to_string();
    assert!(msg.contains("expected a run directory"), "{msg}");
}

#[test]
fn routed_methods_are_labelled_by_the_allocation_that_ran() {
    let tmp = tempfile::tempdir().unwrap();
    full_run(tmp.path(), 0.42, 0.31, true);
    std::fs::write(
        tmp.path().join("run.json"),
        r#"{"seed": 1, "train": {"group_size": 4}}"#,
    )
    .unwrap();
    // Rewrite the two routed methods' update records with the strategies a run records.
    for (method, strategy) in [
        ("harness_s", "router_top_2x2"),
        ("harness_s_fixed", "router_top_k"),
    ] {
        let path = tmp.path().join("train").join(method).join("metrics.jsonl");
        let text = std::fs::read_to_string(&path).unwrap();
        let lines: Vec<serde_json::Value> = text
            .lines()
            .map(|l| {
                let mut v: serde_json::Value = serde_json::from_str(l).unwrap();
                if v["kind"] == "update" {
                    v["strategy"] = serde_json::json!(strategy);
                }
                v
            })
            .collect();
        write_jsonl(&path, &lines);
    }
    let run = read_run(tmp.path()).unwrap();
    assert_eq!(run.label("harness_s"), "Harness-S (Top-2 x 2, adaptive)");
    assert_eq!(run.label("harness_s_fixed"), "Top-4, fixed profiles");
    assert_eq!(run.label("grpo"), "GRPO");
    let t1 = table1(&run);
    let hs = t1.rows.iter().find(|r| r.method == "harness_s").unwrap();
    assert_eq!(hs.label, "Harness-S (Top-2 x 2, adaptive)");
    let text = render_tables(tmp.path()).unwrap();
    assert!(!text.contains("Top-K"), "{text}");
    assert_eq!(
        harness_report::layout::allocation_label("router_top_3x1", None).as_deref(),
        Some("Top-3 x 1")
    );
    assert_eq!(
        harness_report::layout::allocation_label("grpo", Some(4)),
        None
    );
}

#[test]
fn the_sandbox_agent_programs_ran_in_is_reported_and_none_stands_out() {
    let cases = [
        (
            Some("bubblewrap (own network: env server and proxy only)"),
            Some(
                "- Agent programs' sandbox in seed 4: bubblewrap (own network: env server and proxy only)",
            ),
        ),
        (
            Some("none: external.sandbox = \"auto\" found no sandbox (bwrap is missing)"),
            Some(
                "- **Agent programs ran without a sandbox** in seed 4: none: external.sandbox = \"auto\" found no sandbox (bwrap is missing)",
            ),
        ),
        // A run without agent programs records nothing and reports nothing.
        (None, None),
    ];
    for (note, line) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let mut run = serde_json::json!({"seed": 4});
        if let Some(note) = note {
            run["external_sandbox"] = serde_json::Value::from(note);
        }
        write_json(&tmp.path().join("run.json"), &run);
        write_method(tmp.path(), "grpo", true);
        let files = write_report(tmp.path()).unwrap();
        let text = std::fs::read_to_string(&files.markdown).unwrap();
        match line {
            Some(line) => assert!(text.contains(line), "{text}"),
            None => assert!(
                !text.contains("Agent programs' sandbox")
                    && !text.contains("ran without a sandbox"),
                "{text}"
            ),
        }
    }
}
