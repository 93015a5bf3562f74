//! Table 2: rescue success by training stage, and the final test performance, per method.
//!
//! A run of `U` updates is cut into four stages of `ceil(U / 4)` updates (the paper's steps
//! 1-10, ..., 31-40 for `U = 40`; the last stage may be shorter, and with `U < 4` there are
//! fewer than four). A stage's rescue success is, over the `groups.jsonl` records of its
//! updates that triggered a rescue (origin `rescue`), the fraction with at least one successful
//! rescue rollout (`rescue_rewards` holding a reward `>= 1`): each record is one task of one
//! update, so a task rescued in two updates counts twice, as the per-update `rescue_success`
//! of `metrics.jsonl` counts it.

use harness_rollout::GroupRecord;
use serde::{Deserialize, Serialize};

use crate::layout::{EvalMode, MethodRun, Run};
use crate::render::TextTable;
use crate::stats::{Stat, pct};

/// A training stage: updates `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct StageSpan {
    /// Its first update (1-based).
    pub first: u64,
    /// Its last update.
    pub last: u64,
}

impl StageSpan {
    /// "updates a–b".
    pub fn label(&self) -> String {
        format!("updates {}–{}", self.first, self.last)
    }
}

/// The (up to) four stages of a run of `updates` updates, each `ceil(updates / 4)` long.
pub fn stage_spans(updates: u64) -> Vec<StageSpan> {
    if updates == 0 {
        return Vec::new();
    }
    let size = updates.div_ceil(4);
    (0..4)
        .map(|i| StageSpan {
            first: i * size + 1,
            last: ((i + 1) * size).min(updates),
        })
        .filter(|s| s.first <= s.last)
        .collect()
}

/// Rescue-triggering records and those with a successful rescue rollout, in `span`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RescueCount {
    /// Records (task x update) that triggered a rescue.
    pub triggered: usize,
    /// Of which at least one rescue rollout succeeded.
    pub succeeded: usize,
}

impl RescueCount {
    /// `succeeded / triggered` (`None` when nothing triggered).
    pub fn rate(&self) -> Option<f64> {
        (self.triggered > 0).then(|| self.succeeded as f64 / self.triggered as f64)
    }
}

/// Count rescues in the records whose update lies in `first..=last`.
pub fn rescue_count(groups: &[GroupRecord], first: u64, last: u64) -> RescueCount {
    let rescued: Vec<&GroupRecord> = groups
        .iter()
        .filter(|g| (first..=last).contains(&g.update) && g.rescued())
        .collect();
    RescueCount {
        triggered: rescued.len(),
        succeeded: rescued
            .iter()
            .filter(|g| g.rescue_rewards.iter().any(|r| *r >= 1.0))
            .count(),
    }
}

/// Whether a method rescues: a rescue strategy by name or by its records.
pub fn is_rescue_method(method: &str, run: Option<&MethodRun>) -> bool {
    let by_name = matches!(
        method,
        "h0_rescue"
            | "random_harness"
            | "rule_router"
            | "router_4x2"
            | "harness_s"
            | "harness_s_fixed"
    );
    let by_records = run.is_some_and(|r| {
        r.groups
            .iter()
            .any(|g| g.rescued() || !g.rescue_rewards.is_empty())
            || r.updates.iter().any(|u| {
                u.rescue_trigger_rate > 0.0
                    || u.strategy == "h0_rescue"
                    || u.strategy == "random_harness"
                    || u.strategy.starts_with("router_")
            })
    });
    by_name || by_records
}

/// One method's column.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table2Column {
    /// The method.
    pub method: String,
    /// Its display label.
    pub label: String,
    /// Whether it rescues (`false`: the stage cells are "—").
    pub rescue: bool,
    /// Whether some seed has its training run (`false`: the stage cells are "not run").
    pub trained: bool,
    /// Rescue success per stage index, over the seeds whose stage triggered a rescue.
    pub stages: Vec<Option<Stat>>,
    /// Per stage index, the counts summed over seeds.
    pub counts: Vec<RescueCount>,
    /// Final test Pass@k under H0.
    pub final_pass: Option<Stat>,
    /// Final test Avg@k under H0.
    pub final_avg: Option<Stat>,
}

/// Table 2 of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table2 {
    /// The stages of the first seed's first trained method (the labels).
    pub stages: Vec<StageSpan>,
    /// Whether some method or seed was cut into other stages (other update counts).
    pub uneven_stages: bool,
    /// One column per method except `initial`, in display order.
    pub columns: Vec<Table2Column>,
    /// Seeds in the run.
    pub seeds: usize,
    /// `k` of the test evaluations.
    pub k: usize,
}

/// Compute Table 2 from `groups.jsonl`, `metrics.jsonl` and `eval/test.jsonl`.
pub fn table2(run: &Run) -> Table2 {
    // A method without a rescue-training run and without an H0 score (Harness-S (HE only),
    // evaluated under Rank-1 alone; Meta-Harness and WHALE, under their H_best) has no cell
    // here.
    let rescue_trained = |r: &MethodRun| r.update_count() > 0 || r.cost.is_some();
    let methods: Vec<String> = run
        .methods()
        .into_iter()
        .filter(|m| m != "initial")
        .filter(|m| {
            run.seeds.iter().any(|s| {
                s.methods.get(m).is_some_and(rescue_trained)
                    || s.test_eval(m, EvalMode::H0).is_some()
            })
        })
        .collect();
    let mut stages: Option<Vec<StageSpan>> = None;
    let mut uneven = false;
    for s in &run.seeds {
        for m in &methods {
            if let Some(mr) = s.methods.get(m) {
                let spans = stage_spans(mr.update_count());
                if spans.is_empty() {
                    continue;
                }
                match &stages {
                    None => stages = Some(spans),
                    Some(first) if *first != spans => uneven = true,
                    Some(_) => {}
                }
            }
        }
    }
    let stages = stages.unwrap_or_default();
    let columns = methods
        .iter()
        .map(|m| {
            let rescue = run
                .seeds
                .iter()
                .any(|s| is_rescue_method(m, s.methods.get(m)));
            let n = stages.len();
            let mut per_stage: Vec<Vec<f64>> = vec![Vec::new(); n];
            let mut counts = vec![RescueCount::default(); n];
            for s in &run.seeds {
                let Some(mr) = s.methods.get(m) else { continue };
                for (i, span) in stage_spans(mr.update_count()).iter().enumerate().take(n) {
                    let c = rescue_count(&mr.groups, span.first, span.last);
                    counts[i].triggered += c.triggered;
                    counts[i].succeeded += c.succeeded;
                    per_stage[i].extend(c.rate());
                }
            }
            let test = |pick: fn(&crate::layout::TestEval) -> f64| {
                Stat::of_present(
                    run.seeds
                        .iter()
                        .map(|s| s.test_eval(m, EvalMode::H0).map(pick)),
                )
            };
            Table2Column {
                method: m.clone(),
                label: run.label(m),
                rescue,
                trained: run
                    .seeds
                    .iter()
                    .any(|s| s.methods.get(m).is_some_and(rescue_trained)),
                stages: per_stage.iter().map(|v| Stat::of(v)).collect(),
                counts: if rescue { counts } else { Vec::new() },
                final_pass: test(|t| t.pass_at_k),
                final_avg: test(|t| t.avg_at_k),
            }
        })
        .collect();
    let k = run
        .seeds
        .iter()
        .flat_map(|s| s.test.iter().flatten())
        .map(|t| t.k)
        .next()
        .unwrap_or(3);
    Table2 {
        stages,
        uneven_stages: uneven,
        columns,
        seeds: run.seeds.len(),
        k,
    }
}

impl Table2 {
    /// As text, in percent; a single-seed cell also shows `succeeded/triggered`.
    pub fn to_text(&self) -> TextTable {
        let mut header = vec!["".to_string()];
        header.extend(self.columns.iter().map(|c| c.label.clone()));
        let mut rows = Vec::new();
        for (i, span) in self.stages.iter().enumerate() {
            let name = if self.uneven_stages {
                format!("stage {} ({} in the first run)", i + 1, span.label())
            } else {
                span.label()
            };
            let mut row = vec![format!("Rescue success, {name}")];
            for c in &self.columns {
                row.push(if !c.trained {
                    "not run".into()
                } else if !c.rescue {
                    "—".into()
                } else {
                    match (&c.stages.get(i).copied().flatten(), c.counts.get(i)) {
                        (Some(s), Some(n)) => {
                            format!(
                                "{} ({}/{})",
                                pct(Some(s), self.seeds),
                                n.succeeded,
                                n.triggered
                            )
                        }
                        _ => "n/a (no rescue triggered)".into(),
                    }
                });
            }
            rows.push(row);
        }
        for (name, pick) in [
            (
                format!("Final test Pass@{} (H0)", self.k),
                (|c: &Table2Column| c.final_pass) as fn(&Table2Column) -> Option<Stat>,
            ),
            (format!("Final test Avg@{} (H0)", self.k), |c| c.final_avg),
        ] {
            let mut row = vec![name];
            row.extend(
                self.columns
                    .iter()
                    .map(|c| pct(pick(c).as_ref(), self.seeds)),
            );
            rows.push(row);
        }
        let mut notes = vec![
            "Rescue success: of the groups.jsonl records (task x update) in the stage that triggered a rescue, the fraction with at least one successful rescue rollout, in percent; (successes/triggers) summed over seeds. \"—\": the method does not rescue.".to_string(),
        ];
        if self.seeds > 1 {
            notes.push(format!(
                "Mean ± sample standard deviation (n - 1) over the {} seeds' per-stage rates (a seed whose stage triggered no rescue is left out of that cell).",
                self.seeds
            ));
        }
        if self.stages.is_empty() {
            notes.push("Training not run: no update records.".into());
        }
        if self.uneven_stages {
            notes.push(
                "Methods or seeds ran different numbers of updates; each is cut into its own four stages."
                    .into(),
            );
        }
        TextTable {
            title: "Table 2. Rescue success by training stage and final test performance".into(),
            header,
            rows,
            notes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stages_are_ceil_quarters() {
        let spans = |u| {
            stage_spans(u)
                .iter()
                .map(|s| (s.first, s.last))
                .collect::<Vec<_>>()
        };
        assert_eq!(spans(40), vec![(1, 10), (11, 20), (21, 30), (31, 40)]);
        assert_eq!(spans(10), vec![(1, 3), (4, 6), (7, 9), (10, 10)]);
        assert_eq!(spans(9), vec![(1, 3), (4, 6), (7, 9)]);
        assert_eq!(spans(3), vec![(1, 1), (2, 2), (3, 3)]);
        assert_eq!(spans(0), vec![]);
        assert_eq!(stage_spans(40)[1].label(), "updates 11–20");
    }
}
