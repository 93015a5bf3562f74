//! Table 1: test Pass@k and Avg@k per method under H0, and under Rank-1 for the methods that
//! were also evaluated with the router's per-task top harness.

use serde::{Deserialize, Serialize};

use crate::layout::{EvalMode, Run};
use crate::render::TextTable;
use crate::stats::{Stat, pct};

/// One method's row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table1Row {
    /// The method (`initial` is the warm start before training).
    pub method: String,
    /// Its display label.
    pub label: String,
    /// Attempts per task (of its first evaluation).
    pub k: usize,
    /// Pass@k under H0 over seeds.
    pub h0_pass: Option<Stat>,
    /// Avg@k under H0 over seeds.
    pub h0_avg: Option<Stat>,
    /// Pass@k under Rank-1 over seeds (`None` without a `rank1` line).
    pub rank1_pass: Option<Stat>,
    /// Avg@k under Rank-1 over seeds.
    pub rank1_avg: Option<Stat>,
    /// Pass@k under the method's searched H_best over seeds (`None` without an `hbest` line).
    pub hbest_pass: Option<Stat>,
    /// Avg@k under H_best over seeds.
    pub hbest_avg: Option<Stat>,
}

/// Table 1 of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table1 {
    /// One row per method with a test evaluation, in display order.
    pub rows: Vec<Table1Row>,
    /// Seeds in the run.
    pub seeds: usize,
    /// Seeds that have `eval/test.jsonl`.
    pub seeds_with_test: usize,
}

/// Compute Table 1 from every seed's `eval/test.jsonl`.
pub fn table1(run: &Run) -> Table1 {
    let stat = |method: &str, mode: EvalMode, pick: fn(&crate::layout::TestEval) -> f64| {
        Stat::of_present(
            run.seeds
                .iter()
                .map(|s| s.test_eval(method, mode).map(pick)),
        )
    };
    let rows = run
        .methods()
        .into_iter()
        .filter_map(|method| {
            let first = run
                .seeds
                .iter()
                .find_map(|s| s.test.iter().flatten().find(|t| t.method == method))?;
            Some(Table1Row {
                label: run.label(&method),
                k: first.k,
                h0_pass: stat(&method, EvalMode::H0, |t| t.pass_at_k),
                h0_avg: stat(&method, EvalMode::H0, |t| t.avg_at_k),
                rank1_pass: stat(&method, EvalMode::Rank1, |t| t.pass_at_k),
                rank1_avg: stat(&method, EvalMode::Rank1, |t| t.avg_at_k),
                hbest_pass: stat(&method, EvalMode::HBest, |t| t.pass_at_k),
                hbest_avg: stat(&method, EvalMode::HBest, |t| t.avg_at_k),
                method,
            })
        })
        .collect();
    Table1 {
        rows,
        seeds: run.seeds.len(),
        seeds_with_test: run.seeds.iter().filter(|s| s.test.is_some()).count(),
    }
}

impl Table1 {
    /// As text, in percent.
    pub fn to_text(&self) -> TextTable {
        let k = self.rows.first().map_or(3, |r| r.k);
        let mixed_k = self.rows.iter().any(|r| r.k != k);
        let dash_or = |r: &Table1Row, s: &Option<Stat>| {
            if r.rank1_pass.is_none() && r.rank1_avg.is_none() {
                "—".to_string()
            } else {
                pct(s.as_ref(), self.seeds)
            }
        };
        let any_hbest = self.rows.iter().any(|r| r.hbest_pass.is_some());
        let rows = self
            .rows
            .iter()
            .map(|r| {
                // A method evaluated under Rank-1 or H_best alone (Harness-S (HE only),
                // Meta-Harness, WHALE) has no H0 cells.
                let h0 = |s: &Option<Stat>| {
                    if r.h0_pass.is_none()
                        && r.h0_avg.is_none()
                        && (r.rank1_pass.is_some() || r.hbest_pass.is_some())
                    {
                        "—".to_string()
                    } else {
                        pct(s.as_ref(), self.seeds)
                    }
                };
                let mut cells = vec![
                    r.label.clone(),
                    h0(&r.h0_pass),
                    h0(&r.h0_avg),
                    dash_or(r, &r.rank1_pass),
                    dash_or(r, &r.rank1_avg),
                ];
                if any_hbest {
                    let hbest = |s: &Option<Stat>| {
                        if r.hbest_pass.is_none() && r.hbest_avg.is_none() {
                            "—".to_string()
                        } else {
                            pct(s.as_ref(), self.seeds)
                        }
                    };
                    cells.push(hbest(&r.hbest_pass));
                    cells.push(hbest(&r.hbest_avg));
                }
                cells
            })
            .collect();
        let mut notes = vec![format!(
            "Test Pass@{k} (tasks with at least one success in {k} attempts) and Avg@{k} (mean success over all attempts) from eval/test.jsonl, in percent; Rank-1 rows use the router's top harness per task (\"—\": no evaluation in that mode)."
        )];
        if self.seeds > 1 {
            notes.push(format!(
                "Mean ± sample standard deviation (n - 1) over {} seeds.",
                self.seeds
            ));
        }
        if mixed_k {
            notes.push("Methods were evaluated with different k.".into());
        }
        if self.seeds_with_test == 0 {
            notes.push("Test evaluation not run: no eval/test.jsonl.".into());
        } else if self.seeds_with_test < self.seeds {
            notes.push(format!(
                "Only {} of {} seeds have eval/test.jsonl.",
                self.seeds_with_test, self.seeds
            ));
        }
        let mut header = vec![
            "Method".into(),
            format!("H0 Pass@{k}"),
            format!("H0 Avg@{k}"),
            format!("Rank-1 Pass@{k}"),
            format!("Rank-1 Avg@{k}"),
        ];
        if any_hbest {
            header.push(format!("H_best Pass@{k}"));
            header.push(format!("H_best Avg@{k}"));
            notes.push("H_best rows (Meta-Harness, WHALE) run every test task under the one harness their search selected on training tasks.".into());
        }
        TextTable {
            title: "Table 1. Test performance under H0 and Rank-1".into(),
            header,
            rows,
            notes,
        }
    }
}
