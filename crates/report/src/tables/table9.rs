//! Table 9: training cost per method (rollouts, with their share of GRPO's, and seconds) beside
//! the H0 test Avg@k.
//!
//! Rollouts are `cost.json`'s `training_rollouts.total` (discarded base attempts included), or,
//! without `cost.json`, the sum of `rollouts_base + rollouts_rescue` over the update records.
//! Seconds are the rollout, update and calibration seconds of `cost.json` (or of the update
//! records), wall-clock rather than the paper's GPU-hours.

use serde::{Deserialize, Serialize};

use crate::layout::{EvalMode, MethodRun, Run};
use crate::render::TextTable;
use crate::stats::{Stat, fmt_stat, pct};

/// Where a method's cost figures came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CostSource {
    /// `cost.json` in every seed.
    CostJson,
    /// The update records of `metrics.jsonl` in at least one seed.
    Metrics,
}

/// One seed's cost figures of a method.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SeedCost {
    /// Updates.
    pub updates: u64,
    /// Training rollouts.
    pub rollouts: u64,
    /// What plain GRPO spends on the same updates (`cost.json` only).
    pub plain_grpo_rollouts: Option<u64>,
    /// Seconds in training rollouts.
    pub rollout_seconds: f64,
    /// Seconds in updates and weight syncs.
    pub update_seconds: f64,
    /// Seconds in calibration.
    pub calibration_seconds: f64,
    /// Where the figures came from.
    pub source: CostSource,
}

impl SeedCost {
    /// Rollout + update + calibration seconds.
    pub fn training_seconds(&self) -> f64 {
        self.rollout_seconds + self.update_seconds + self.calibration_seconds
    }
}

/// A method's cost in one seed (`None` when it left neither `cost.json` nor update records).
pub fn seed_cost(run: &MethodRun) -> Option<SeedCost> {
    if let Some(c) = &run.cost {
        return Some(SeedCost {
            updates: c.updates,
            rollouts: c.training_rollouts.total,
            plain_grpo_rollouts: Some(c.plain_grpo_rollouts),
            rollout_seconds: c.rollout_seconds,
            update_seconds: c.update_seconds,
            calibration_seconds: c.calibration_seconds,
            source: CostSource::CostJson,
        });
    }
    if run.updates.is_empty() {
        return None;
    }
    let u = &run.updates;
    Some(SeedCost {
        updates: run.update_count(),
        rollouts: u
            .iter()
            .map(|r| (r.rollouts_base + r.rollouts_rescue) as u64)
            .sum(),
        plain_grpo_rollouts: None,
        rollout_seconds: u.iter().map(|r| r.rollout_seconds).sum(),
        update_seconds: u.iter().map(|r| r.update_seconds).sum(),
        calibration_seconds: u.iter().map(|r| r.calibration_seconds).sum(),
        source: CostSource::Metrics,
    })
}

/// One method's row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table9Row {
    /// The method.
    pub method: String,
    /// Its display label.
    pub label: String,
    /// Updates.
    pub updates: Stat,
    /// Training rollouts.
    pub rollouts: Stat,
    /// Rollouts / the same seed's GRPO run's rollouts (`None` without a GRPO run).
    pub relative_to_grpo: Option<Stat>,
    /// Rollouts / `cost.json`'s plain-GRPO count for the same updates.
    pub relative_to_plain_grpo: Option<Stat>,
    /// Seconds in training rollouts.
    pub rollout_seconds: Stat,
    /// Seconds in updates.
    pub update_seconds: Stat,
    /// Seconds in calibration.
    pub calibration_seconds: Stat,
    /// Their sum.
    pub training_seconds: Stat,
    /// H0 test Avg@k.
    pub h0_avg: Option<Stat>,
    /// `CostJson` when every seed had `cost.json`.
    pub source: CostSource,
}

/// Table 9 of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Table9 {
    /// One row per trained method, in display order.
    pub rows: Vec<Table9Row>,
    /// Seeds in the run.
    pub seeds: usize,
    /// `k` of the test evaluations.
    pub k: usize,
}

/// Compute Table 9.
pub fn table9(run: &Run) -> Table9 {
    let rows = run
        .methods()
        .into_iter()
        .filter_map(|m| {
            let mut costs = Vec::new();
            let mut rel_grpo = Vec::new();
            let mut rel_plain = Vec::new();
            for s in &run.seeds {
                let Some(c) = s.methods.get(&m).and_then(seed_cost) else {
                    continue;
                };
                let grpo = s.methods.get("grpo").and_then(seed_cost);
                if let Some(g) = grpo.filter(|g| g.rollouts > 0) {
                    rel_grpo.push(c.rollouts as f64 / g.rollouts as f64);
                }
                if let Some(p) = c.plain_grpo_rollouts.filter(|p| *p > 0) {
                    rel_plain.push(c.rollouts as f64 / p as f64);
                }
                costs.push(c);
            }
            let stat = |f: fn(&SeedCost) -> f64| Stat::of(&costs.iter().map(f).collect::<Vec<_>>());
            Some(Table9Row {
                label: run.label(&m),
                updates: stat(|c| c.updates as f64)?,
                rollouts: stat(|c| c.rollouts as f64)?,
                relative_to_grpo: Stat::of(&rel_grpo),
                relative_to_plain_grpo: Stat::of(&rel_plain),
                rollout_seconds: stat(|c| c.rollout_seconds)?,
                update_seconds: stat(|c| c.update_seconds)?,
                calibration_seconds: stat(|c| c.calibration_seconds)?,
                training_seconds: stat(SeedCost::training_seconds)?,
                h0_avg: Stat::of_present(
                    run.seeds
                        .iter()
                        .map(|s| s.test_eval(&m, EvalMode::H0).map(|t| t.avg_at_k)),
                ),
                source: if costs.iter().all(|c| c.source == CostSource::CostJson) {
                    CostSource::CostJson
                } else {
                    CostSource::Metrics
                },
                method: m,
            })
        })
        .collect();
    let k = run
        .seeds
        .iter()
        .flat_map(|s| s.test.iter().flatten())
        .map(|t| t.k)
        .next()
        .unwrap_or(3);
    Table9 {
        rows,
        seeds: run.seeds.len(),
        k,
    }
}

impl Table9 {
    /// As text.
    pub fn to_text(&self) -> TextTable {
        let n = self.seeds;
        let num = |s: &Stat, d: usize| fmt_stat(Some(s), 1.0, d, n);
        let rows = self
            .rows
            .iter()
            .map(|r| {
                vec![
                    r.label.clone(),
                    num(&r.updates, 0),
                    num(&r.rollouts, 0),
                    r.relative_to_grpo
                        .as_ref()
                        .map_or("no GRPO run".into(), |s| format!("{}%", pct(Some(s), n))),
                    r.relative_to_plain_grpo
                        .as_ref()
                        .map_or("—".into(), |s| format!("{}%", pct(Some(s), n))),
                    num(&r.rollout_seconds, 1),
                    num(&r.update_seconds, 1),
                    num(&r.calibration_seconds, 1),
                    num(&r.training_seconds, 1),
                    pct(r.h0_avg.as_ref(), n),
                    match r.source {
                        CostSource::CostJson => "cost.json".into(),
                        CostSource::Metrics => "metrics.jsonl".into(),
                    },
                ]
            })
            .collect();
        let mut notes = vec![
            "Training rollouts: cost.json training_rollouts.total (base attempts, discarded ones included, plus rescue and mixture rollouts), or the update records' rollouts_base + rollouts_rescue without cost.json. \"vs GRPO run\": rollouts / the same seed's grpo rollouts; \"vs plain GRPO\": rollouts / cost.json's updates x tasks x K.".to_string(),
            "Seconds are wall-clock seconds of the run (rollouts, updates with weight sync, calibration), not GPU-hours.".to_string(),
        ];
        if n > 1 {
            notes.push(format!(
                "Mean ± sample standard deviation (n - 1) over {n} seeds."
            ));
        }
        if self.rows.is_empty() {
            notes.push(
                "Training not run: no train/<method>/ with cost.json or metrics.jsonl.".into(),
            );
        }
        TextTable {
            title: "Table 9. Training cost and H0 test performance".into(),
            header: vec![
                "Method".into(),
                "Updates".into(),
                "Training rollouts".into(),
                "vs GRPO run".into(),
                "vs plain GRPO".into(),
                "Rollout s".into(),
                "Update s".into(),
                "Calibration s".into(),
                "Training s".into(),
                format!("H0 test Avg@{}", self.k),
                "Source".into(),
            ],
            rows,
            notes,
        }
    }
}
