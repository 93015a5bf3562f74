//! Table 5: H0 and the router's Rank-1..R harnesses before and after training, from
//! `eval/rank.jsonl` (harness-router's Rank-r reports).

use serde::{Deserialize, Serialize};

use crate::layout::{RankStage, Run};
use crate::render::TextTable;
use crate::stats::{Stat, pct};

/// One stage's cells of a row.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct RankCells {
    /// Pass@k.
    pub pass: Stat,
    /// Avg@k.
    pub avg: Stat,
    /// Fraction of tasks placing H0 at this rank (`None` for the H0 row).
    pub h0_rate: Option<Stat>,
}

/// One row: `H0` or `Rank-r`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table5Row {
    /// The report's row label.
    pub label: String,
    /// Before training (`None` when not run).
    pub before: Option<RankCells>,
    /// After training.
    pub after: Option<RankCells>,
}

/// Table 5 of one method.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table5 {
    /// The method.
    pub method: String,
    /// Its display label.
    pub label: String,
    /// Attempts per task and harness.
    pub k: u32,
    /// H0, then Rank-1..R, in the first report's order.
    pub rows: Vec<Table5Row>,
    /// Seeds in the run.
    pub seeds: usize,
}

/// Compute Table 5, one per method found in any seed's `eval/rank.jsonl` (empty: not run).
pub fn table5(run: &Run) -> Vec<Table5> {
    let mut methods: Vec<String> = run
        .seeds
        .iter()
        .flat_map(|s| s.rank.iter().flatten().map(|r| r.method.clone()))
        .collect();
    methods.sort_by_key(|m| crate::layout::method_rank(m));
    methods.dedup();
    methods
        .into_iter()
        .map(|method| {
            let reports = |stage: RankStage| {
                run.seeds
                    .iter()
                    .filter_map(|s| {
                        s.rank
                            .iter()
                            .flatten()
                            .find(|r| r.method == method && r.stage == stage)
                    })
                    .map(|r| &r.report)
                    .collect::<Vec<_>>()
            };
            let (before, after) = (reports(RankStage::Before), reports(RankStage::After));
            let mut labels: Vec<String> = Vec::new();
            for r in before.iter().chain(&after) {
                for row in &r.rows {
                    if !labels.contains(&row.label) {
                        labels.push(row.label.clone());
                    }
                }
            }
            let cells = |reports: &[&harness_router::RankReport], label: &str| {
                let rows: Vec<&harness_router::RankRow> = reports
                    .iter()
                    .filter_map(|r| r.rows.iter().find(|row| row.label == label))
                    .collect();
                let stat = |f: fn(&harness_router::RankRow) -> Option<f64>| {
                    Stat::of_present(rows.iter().map(|r| f(r)))
                };
                Some(RankCells {
                    pass: stat(|r| Some(r.pass_at_k))?,
                    avg: stat(|r| Some(r.avg_at_k))?,
                    h0_rate: stat(|r| r.h0_rate),
                })
            };
            let k = before
                .iter()
                .chain(&after)
                .map(|r| r.attempts)
                .next()
                .unwrap_or(3);
            Table5 {
                label: run.label(&method),
                k,
                rows: labels
                    .iter()
                    .map(|l| Table5Row {
                        label: l.clone(),
                        before: cells(&before, l),
                        after: cells(&after, l),
                    })
                    .collect(),
                seeds: run.seeds.len(),
                method,
            }
        })
        .collect()
}

impl Table5 {
    /// As text, in percent.
    pub fn to_text(&self) -> TextTable {
        let k = self.k;
        let stage = |c: &Option<RankCells>| match c {
            None => vec!["not run".to_string(); 3],
            Some(c) => vec![
                pct(Some(&c.pass), self.seeds),
                pct(Some(&c.avg), self.seeds),
                c.h0_rate
                    .as_ref()
                    .map_or("—".into(), |h| pct(Some(h), self.seeds)),
            ],
        };
        let rows = self
            .rows
            .iter()
            .map(|r| {
                let mut row = vec![r.label.clone()];
                row.extend(stage(&r.before));
                row.extend(stage(&r.after));
                row
            })
            .collect();
        let mut notes = vec![format!(
            "From eval/rank.jsonl: each harness gets {k} attempts per task; H0 rate is the fraction of tasks whose ranking puts H0 at that rank (—: the fixed H0 baseline). Percent."
        )];
        if self.seeds > 1 {
            notes.push(format!(
                "Mean ± sample standard deviation (n - 1) over {} seeds.",
                self.seeds
            ));
        }
        TextTable {
            title: format!(
                "Table 5. Router ranks before and after training ({})",
                self.label
            ),
            header: vec![
                "Harness".into(),
                format!("Before Pass@{k}"),
                format!("Before Avg@{k}"),
                "Before H0 rate".into(),
                format!("After Pass@{k}"),
                format!("After Avg@{k}"),
                "After H0 rate".into(),
            ],
            rows,
            notes,
        }
    }

    /// The "not run" table for a run without `eval/rank.jsonl`.
    pub fn not_run() -> TextTable {
        TextTable {
            title: "Table 5. Router ranks before and after training".into(),
            notes: vec!["Rank-r evaluation not run: no eval/rank.jsonl.".into()],
            ..TextTable::default()
        }
    }
}
