//! Figure 4's view (RQ6): every evaluated policy's test Pass@k under harnesses that were never
//! in its training pool (`eval/cross.jsonl`), beside its H0 Pass@k, each with its difference
//! to the initial policy and to plain GRPO (the paper annotates its gains against GRPO) under
//! the same harness, in points.

use serde::{Deserialize, Serialize};

use crate::layout::{EvalMode, Run};
use crate::render::TextTable;
use crate::stats::{Stat, fmt_stat, pct};

/// One cell: a method's Pass@k under a harness over seeds, and its difference to the initial
/// policy's in the same seeds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrossCell {
    /// Pass@k.
    pub pass: Stat,
    /// Pass@k minus the initial policy's, per seed.
    pub vs_initial: Option<Stat>,
    /// Pass@k minus plain GRPO's, per seed (`None` for GRPO itself, the initial policy, or a
    /// run without GRPO).
    #[serde(default)]
    pub vs_grpo: Option<Stat>,
}

/// One method's row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrossRow {
    /// The method (`initial` is the checkpoint before training).
    pub method: String,
    /// Its label.
    pub label: String,
    /// Under H0 (`eval/test.jsonl`).
    pub h0: Option<CrossCell>,
    /// Under each unseen harness, in [`CrossTable::harnesses`] order.
    pub unseen: Vec<Option<CrossCell>>,
    /// The mean over the unseen harnesses it was evaluated under.
    pub mean_unseen: Option<CrossCell>,
}

/// The cross-harness table of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrossTable {
    /// The unseen harnesses' names, in first-seen order.
    pub harnesses: Vec<String>,
    /// One row per method with a cross-harness evaluation.
    pub rows: Vec<CrossRow>,
    /// `k` of the evaluations.
    pub k: usize,
    /// Seeds in the run.
    pub seeds: usize,
}

/// Compute the table from every seed's `eval/cross.jsonl` and `eval/test.jsonl`.
pub fn cross_harness(run: &Run) -> CrossTable {
    let mut harnesses: Vec<String> = Vec::new();
    for line in run.seeds.iter().flat_map(|s| s.cross.iter().flatten()) {
        if !harnesses.contains(&line.harness_name) {
            harnesses.push(line.harness_name.clone());
        }
    }
    // Per seed: the Pass@k of `method` under `harness` (`None`: H0), and the mean over the
    // unseen harnesses.
    let pass =
        |seed: &crate::layout::SeedRun, method: &str, harness: Option<&str>| -> Option<f64> {
            match harness {
                None => seed.test_eval(method, EvalMode::H0).map(|t| t.pass_at_k),
                Some(h) => seed
                    .cross
                    .iter()
                    .flatten()
                    .find(|c| c.test.method == method && c.harness_name == h)
                    .map(|c| c.test.pass_at_k),
            }
        };
    let mean = |seed: &crate::layout::SeedRun, method: &str| -> Option<f64> {
        let v: Vec<f64> = harnesses
            .iter()
            .filter_map(|h| pass(seed, method, Some(h)))
            .collect();
        (v.len() == harnesses.len() && !v.is_empty())
            .then(|| v.iter().sum::<f64>() / v.len() as f64)
    };
    let cell = |get: &dyn Fn(&crate::layout::SeedRun, &str) -> Option<f64>, method: &str| {
        let values: Vec<f64> = run.seeds.iter().filter_map(|s| get(s, method)).collect();
        let diffs = |to: &str| -> Option<Stat> {
            if method == to || method == "initial" {
                return None;
            }
            let d: Vec<f64> = run
                .seeds
                .iter()
                .filter_map(|s| Some(get(s, method)? - get(s, to)?))
                .collect();
            Stat::of(&d)
        };
        Some(CrossCell {
            pass: Stat::of(&values)?,
            vs_initial: diffs("initial"),
            vs_grpo: diffs("grpo"),
        })
    };
    let rows = run
        .methods()
        .into_iter()
        .filter(|m| {
            run.seeds
                .iter()
                .flat_map(|s| s.cross.iter().flatten())
                .any(|c| &c.test.method == m)
        })
        .map(|m| CrossRow {
            label: run.label(&m),
            h0: cell(&|s, method| pass(s, method, None), &m),
            unseen: harnesses
                .iter()
                .map(|h| cell(&|s, method| pass(s, method, Some(h)), &m))
                .collect(),
            mean_unseen: cell(&mean, &m),
            method: m,
        })
        .collect();
    let k = run
        .seeds
        .iter()
        .flat_map(|s| s.cross.iter().flatten())
        .map(|c| c.test.k)
        .next()
        .unwrap_or(3);
    CrossTable {
        harnesses,
        rows,
        k,
        seeds: run.seeds.len(),
    }
}

impl CrossTable {
    /// As text, in percent, the difference to the initial policy in points in parentheses.
    pub fn to_text(&self) -> TextTable {
        let n = self.seeds;
        let signed = |d: &Stat| {
            format!(
                "{}{}",
                if d.mean >= 0.0 { "+" } else { "" },
                fmt_stat(Some(d), 100.0, 2, n)
            )
        };
        let show = |c: &Option<CrossCell>| match c {
            None => "—".to_string(),
            Some(c) => {
                let mut parts = Vec::new();
                if let Some(d) = &c.vs_initial {
                    parts.push(format!("{} vs initial", signed(d)));
                }
                if let Some(d) = &c.vs_grpo {
                    parts.push(format!("{} vs GRPO", signed(d)));
                }
                if parts.is_empty() {
                    pct(Some(&c.pass), n)
                } else {
                    format!("{} ({})", pct(Some(&c.pass), n), parts.join("; "))
                }
            }
        };
        let mut header = vec!["Method".to_string(), format!("H0 Pass@{}", self.k)];
        header.extend(
            self.harnesses
                .iter()
                .map(|h| format!("{h} Pass@{}", self.k)),
        );
        header.push(format!("Mean unseen Pass@{}", self.k));
        let rows = self
            .rows
            .iter()
            .map(|r| {
                let mut cells = vec![r.label.clone(), show(&r.h0)];
                cells.extend(r.unseen.iter().map(show));
                cells.push(show(&r.mean_unseen));
                cells
            })
            .collect();
        let mut notes = vec![format!(
            "Test Pass@{k} of each policy under harnesses that were never in its training pool (eval.harnesses; eval/cross.jsonl), beside H0; in parentheses the difference to the initial policy and to plain GRPO under the same harness, in points (the paper annotates Figure 4's gains against GRPO). The paper's Figure 4 evaluates under Claude Code and OpenClaw; here the unseen harnesses are the ones named in the table.",
            k = self.k
        )];
        if n > 1 {
            notes.push(format!(
                "Mean ± sample standard deviation (n - 1) over {n} seeds."
            ));
        }
        if self.rows.is_empty() {
            notes.push(
                "Not run: no eval/cross.jsonl (set eval.harnesses, e.g. [\"builtin\"]).".into(),
            );
        }
        TextTable {
            title: "Figure 4 (RQ6). Test Pass@k under harnesses outside the training pool".into(),
            header,
            rows,
            notes,
        }
    }
}
