//! The directions the paper claims, checked on this run and reported whichever way they fall:
//!
//! - EG rate: Harness-S > GRPO (H0 rescue) > GRPO (Figure 3a), each the mean of `eg_rate` over
//!   the method's update records;
//! - H0 test Avg@k: Harness-S > GRPO (Table 1);
//! - after training, Rank-1 >= H0 in Pass@k and in Avg@k (Table 5's "after" report of
//!   `eval/rank.jsonl`, or Harness-S's `rank1` and `h0` test lines without one);
//! - rescue success over the whole run: adaptive profiles (`harness_s`) > fixed profiles
//!   (`harness_s_fixed`) (Table 2).
//!
//! With several seeds a row gives the means and how many seeds the direction holds in; the
//! verdict is on the means.

use serde::{Deserialize, Serialize};

use crate::layout::{EvalMode, RankStage, Run, SeedRun};
use crate::render::TextTable;
use crate::stats::{Stat, mean, pct};
use crate::tables::table2::rescue_count;

/// Whether a direction holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Verdict {
    /// It holds (on the means).
    Holds,
    /// It does not.
    DoesNotHold,
    /// A compared value is missing.
    NotRun,
}

/// One compared quantity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Compared {
    /// What it is ("Harness-S").
    pub label: String,
    /// Its value over seeds.
    pub value: Option<Stat>,
}

/// One claimed direction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DirectionRow {
    /// The claim, e.g. "EG rate: Harness-S > GRPO (H0 rescue) > GRPO".
    pub claim: String,
    /// The values in the claim's order, each required to exceed (or, `strict == false`, to
    /// reach) the next.
    pub compared: Vec<Compared>,
    /// `>` or `>=`.
    pub strict: bool,
    /// Seeds where every value is present and the direction holds.
    pub seeds_holding: usize,
    /// Seeds where every value is present.
    pub seeds_compared: usize,
    /// On the means.
    pub verdict: Verdict,
    /// Where the values came from.
    pub source: String,
}

fn ordered(values: &[f64], strict: bool) -> bool {
    values
        .windows(2)
        .all(|w| if strict { w[0] > w[1] } else { w[0] >= w[1] })
}

/// Build a row from per-seed values of each compared quantity.
fn row(
    claim: String,
    series: Vec<(String, Vec<Option<f64>>)>,
    strict: bool,
    source: String,
) -> DirectionRow {
    let seeds = series.first().map_or(0, |(_, v)| v.len());
    let mut holding = 0;
    let mut compared = 0;
    for s in 0..seeds {
        let v: Option<Vec<f64>> = series.iter().map(|(_, vals)| vals[s]).collect();
        if let Some(v) = v {
            compared += 1;
            holding += usize::from(ordered(&v, strict));
        }
    }
    let stats: Vec<Compared> = series
        .iter()
        .map(|(label, vals)| Compared {
            label: label.clone(),
            value: Stat::of_present(vals.iter().copied()),
        })
        .collect();
    let means: Option<Vec<f64>> = stats.iter().map(|c| c.value.map(|s| s.mean)).collect();
    let verdict = match means {
        None => Verdict::NotRun,
        Some(m) if ordered(&m, strict) => Verdict::Holds,
        Some(_) => Verdict::DoesNotHold,
    };
    DirectionRow {
        claim,
        compared: stats,
        strict,
        seeds_holding: holding,
        seeds_compared: compared,
        verdict,
        source,
    }
}

/// Mean `eg_rate` over a method's update records in one seed.
pub fn mean_eg_rate(seed: &SeedRun, method: &str) -> Option<f64> {
    mean(seed.methods.get(method)?.updates.iter().map(|u| u.eg_rate))
}

/// Rescue success over all of a method's updates in one seed (pooled over records).
pub fn overall_rescue_success(seed: &SeedRun, method: &str) -> Option<f64> {
    rescue_count(&seed.methods.get(method)?.groups, 1, u64::MAX).rate()
}

/// After training: H0's and Rank-1's (Pass@k, Avg@k) in one seed, and their source.
struct AfterTraining {
    h0: (f64, f64),
    rank1: (f64, f64),
    source: &'static str,
}

fn after_training(seed: &SeedRun) -> Option<AfterTraining> {
    let afters: Vec<_> = seed
        .rank
        .iter()
        .flatten()
        .filter(|r| r.stage == RankStage::After)
        .collect();
    let rank = afters
        .iter()
        .find(|r| r.method == "harness_s")
        .or(afters.first());
    if let Some(r) = rank {
        let get = |label: &str| {
            r.report
                .rows
                .iter()
                .find(|row| row.label == label)
                .map(|row| (row.pass_at_k, row.avg_at_k))
        };
        if let (Some(h0), Some(r1)) = (get("H0"), get("Rank-1")) {
            return Some(AfterTraining {
                h0,
                rank1: r1,
                source: "eval/rank.jsonl (after)",
            });
        }
    }
    let h0 = seed.test_eval("harness_s", EvalMode::H0)?;
    let r1 = seed.test_eval("harness_s", EvalMode::Rank1)?;
    Some(AfterTraining {
        h0: (h0.pass_at_k, h0.avg_at_k),
        rank1: (r1.pass_at_k, r1.avg_at_k),
        source: "eval/test.jsonl (harness_s)",
    })
}

/// Check every direction on the run.
pub fn directions(run: &Run) -> Vec<DirectionRow> {
    let per_seed = |f: &dyn Fn(&SeedRun) -> Option<f64>| -> Vec<Option<f64>> {
        run.seeds.iter().map(f).collect()
    };
    let l = |m: &str| run.label(m);
    let mut rows = Vec::new();
    rows.push(row(
        format!(
            "EG rate: {} > {} > {}",
            l("harness_s"),
            l("h0_rescue"),
            l("grpo")
        ),
        ["harness_s", "h0_rescue", "grpo"]
            .iter()
            .map(|m| (l(m), per_seed(&|s| mean_eg_rate(s, m))))
            .collect(),
        true,
        "metrics.jsonl: mean eg_rate over update records".into(),
    ));
    let avg = |m: &'static str| move |s: &SeedRun| s.test_eval(m, EvalMode::H0).map(|t| t.avg_at_k);
    let k = run
        .seeds
        .iter()
        .flat_map(|s| s.test.iter().flatten())
        .map(|t| t.k)
        .next()
        .unwrap_or(3);
    rows.push(row(
        format!("H0 test Avg@{k}: {} > {}", l("harness_s"), l("grpo")),
        vec![
            (l("harness_s"), per_seed(&avg("harness_s"))),
            (l("grpo"), per_seed(&avg("grpo"))),
        ],
        true,
        "eval/test.jsonl (mode h0)".into(),
    ));
    let mut source: Vec<&str> = run
        .seeds
        .iter()
        .filter_map(|s| after_training(s).map(|a| a.source))
        .collect();
    source.sort_unstable();
    source.dedup();
    let source = if source.is_empty() {
        "eval/rank.jsonl or eval/test.jsonl".to_string()
    } else {
        source.join(", ")
    };
    for (metric, pick) in [
        (
            format!("Pass@{k}"),
            (|p: (f64, f64)| p.0) as fn((f64, f64)) -> f64,
        ),
        (format!("Avg@{k}"), |p| p.1),
    ] {
        rows.push(row(
            format!("After training, Rank-1 {metric} >= H0 {metric}"),
            vec![
                (
                    "Rank-1".into(),
                    per_seed(&|s| after_training(s).map(|a| pick(a.rank1))),
                ),
                (
                    "H0".into(),
                    per_seed(&|s| after_training(s).map(|a| pick(a.h0))),
                ),
            ],
            false,
            source.clone(),
        ));
    }
    rows.push(row(
        format!(
            "Rescue success (whole run): {} > {}",
            l("harness_s"),
            l("harness_s_fixed")
        ),
        ["harness_s", "harness_s_fixed"]
            .iter()
            .map(|m| (l(m), per_seed(&|s| overall_rescue_success(s, m))))
            .collect(),
        true,
        "groups.jsonl: rescued records with a successful rescue rollout / rescued records".into(),
    ));
    rows
}

/// The directions as text.
pub fn directions_text(rows: &[DirectionRow], seeds: usize) -> TextTable {
    let text_rows = rows
        .iter()
        .map(|r| {
            let values = r
                .compared
                .iter()
                .map(|c| format!("{} {}", c.label, pct(c.value.as_ref(), seeds)))
                .collect::<Vec<_>>()
                .join(" vs ");
            let verdict = match r.verdict {
                Verdict::Holds => "holds",
                Verdict::DoesNotHold => "does not hold",
                Verdict::NotRun => "not run",
            };
            let verdict = if seeds > 1 && r.verdict != Verdict::NotRun {
                format!(
                    "{verdict} on the means; {}/{} seeds",
                    r.seeds_holding, r.seeds_compared
                )
            } else {
                verdict.to_string()
            };
            vec![r.claim.clone(), values, verdict, r.source.clone()]
        })
        .collect();
    let mut notes = vec![
        "The paper's claimed directions, checked on this run's files and reported whichever way they fall. Values in percent.".to_string(),
    ];
    if seeds > 1 {
        notes.push(format!(
            "Mean ± sample standard deviation (n - 1) over {seeds} seeds; the verdict is on the means, with the count of seeds in which the direction holds."
        ));
    }
    TextTable {
        title: "Claimed directions".into(),
        header: vec![
            "Direction".into(),
            "Compared values".into(),
            "Verdict".into(),
            "Source".into(),
        ],
        rows: text_rows,
        notes,
    }
}
