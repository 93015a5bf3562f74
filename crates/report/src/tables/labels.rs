//! Table 3 from the labellers: how often each labelled behaviour occurs in the H0 test attempts
//! of the initial policy and of each method's trained policy (every seed's
//! `eval/episodes.jsonl`), for any environment with a labeller. A feature whose values are all
//! 0 or 1 is a flag and shows the share of attempts that have it, with counts; any other is a
//! count and shows its mean per attempt. When an LLM labeller ran (`roles.llm` set: the
//! paper's Table 3 is LLM-labelled), [`llm_label_table`] gives its table beside the rule
//! labeller's, over the attempts it labelled.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::layout::{AttemptRecord, Run};
use crate::render::TextTable;

/// One method's figures for one feature, pooled over seeds.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct LabelCell {
    /// Sum of the feature's values over the attempts.
    pub sum: f64,
    /// Attempts with a value above zero.
    pub present: usize,
    /// Attempts.
    pub attempts: usize,
}

/// One feature's row.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabelRow {
    /// The label.
    pub feature: String,
    /// Every value seen is 0 or 1.
    pub flag: bool,
    /// Per method, in [`LabelTable::methods`] order (`None`: no episodes of that method).
    pub cells: Vec<Option<LabelCell>>,
}

/// Who labelled the attempts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LabelSource {
    /// The environment's rule labeller (`labels` of each attempt).
    Rules,
    /// The LLM labeller (`llm_labels` of each attempt; unlabelled attempts left out).
    Llm,
}

/// The labelled-behaviour table of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabelTable {
    /// Who labelled.
    pub source: LabelSource,
    /// Attempts left out: the LLM labeller's answers stayed unusable (0 for the rules, whose
    /// table counts every attempt).
    pub unlabelled: usize,
    /// `(method, label)` in display order, the initial policy first.
    pub methods: Vec<(String, String)>,
    /// One row per feature, in name order.
    pub rows: Vec<LabelRow>,
}

/// Compute the rule labeller's table from every seed's `eval/episodes.jsonl`.
pub fn label_table(run: &Run) -> LabelTable {
    table_of(run, LabelSource::Rules)
}

/// The LLM labeller's table, when it ran on any attempt (an attempt it could not label has an
/// empty `llm_labels` and is counted in [`LabelTable::unlabelled`]).
pub fn llm_label_table(run: &Run) -> Option<LabelTable> {
    let any = run
        .seeds
        .iter()
        .flat_map(|s| s.episodes.iter().flatten())
        .any(|l| l.attempts.iter().any(|a| a.llm_labels.is_some()));
    any.then(|| table_of(run, LabelSource::Llm))
}

fn labels_of(a: &AttemptRecord, source: LabelSource) -> Option<&BTreeMap<String, f64>> {
    match source {
        LabelSource::Rules => Some(&a.labels),
        LabelSource::Llm => a.llm_labels.as_ref().filter(|m| !m.is_empty()),
    }
}

fn table_of(run: &Run, source: LabelSource) -> LabelTable {
    let lines: Vec<&crate::layout::EpisodeLine> = run
        .seeds
        .iter()
        .flat_map(|s| s.episodes.iter().flatten())
        .collect();
    let present: BTreeSet<&str> = lines.iter().map(|l| l.method.as_str()).collect();
    let methods: Vec<(String, String)> = run
        .methods()
        .into_iter()
        .filter(|m| present.contains(m.as_str()))
        .map(|m| {
            let label = run.label(&m);
            (m, label)
        })
        .collect();
    let features: BTreeSet<&String> = lines
        .iter()
        .flat_map(|l| l.attempts.iter().filter_map(|a| labels_of(a, source)))
        .flat_map(BTreeMap::keys)
        .collect();
    let unlabelled = match source {
        LabelSource::Rules => 0,
        LabelSource::Llm => lines
            .iter()
            .flat_map(|l| &l.attempts)
            .filter(|a| a.llm_labels.as_ref().is_some_and(BTreeMap::is_empty))
            .count(),
    };
    let rows = features
        .into_iter()
        .map(|feature| {
            let mut flag = true;
            let cells = methods
                .iter()
                .map(|(m, _)| {
                    let mut cell = LabelCell {
                        sum: 0.0,
                        present: 0,
                        attempts: 0,
                    };
                    for a in lines
                        .iter()
                        .filter(|l| &l.method == m)
                        .flat_map(|l| &l.attempts)
                        .filter_map(|a| labels_of(a, source))
                    {
                        let v = a.get(feature).copied().unwrap_or(0.0);
                        flag &= v == 0.0 || v == 1.0;
                        cell.sum += v;
                        cell.present += usize::from(v > 0.0);
                        cell.attempts += 1;
                    }
                    (cell.attempts > 0).then_some(cell)
                })
                .collect();
            LabelRow {
                feature: feature.clone(),
                flag,
                cells,
            }
        })
        .collect();
    LabelTable {
        source,
        unlabelled,
        methods,
        rows,
    }
}

impl LabelTable {
    /// As text.
    pub fn to_text(&self) -> TextTable {
        let mut header = vec!["Behaviour label".to_string()];
        header.extend(self.methods.iter().map(|(_, l)| l.clone()));
        let rows = self
            .rows
            .iter()
            .map(|r| {
                let mut cells = vec![r.feature.clone()];
                cells.extend(r.cells.iter().map(|c| match c {
                    None => "—".to_string(),
                    Some(c) if r.flag => format!(
                        "{:.1}% ({}/{})",
                        100.0 * c.present as f64 / c.attempts as f64,
                        c.present,
                        c.attempts
                    ),
                    Some(c) => {
                        format!("{:.2} ({} attempts)", c.sum / c.attempts as f64, c.attempts)
                    }
                }));
                cells
            })
            .collect();
        let mut notes = vec![match self.source {
            LabelSource::Rules => "Every H0 test attempt of each checkpoint (eval/episodes.jsonl, pooled over seeds), labelled by the environment's labeller (harness-envs' labels; decision:<point>=<choice> marks the choice at a DBBench decision point). A flag shows the share of attempts with it and the counts; a count feature its mean per attempt.".to_string(),
            LabelSource::Llm => format!(
                "The same H0 test attempts labelled by an LLM (the paper's Table 3 labeller; `roles.llm`), which read each complete trajectory and said for each of the environment labeller's behaviours whether it occurs (a count feature: at least once), so every row is a share of attempts. {} attempts whose answers stayed unusable are left out; eval/labeller.jsonl has the requests and tokens. Compare with the rule labeller's table above.",
                self.unlabelled
            ),
        }];
        if self.rows.is_empty() {
            notes.push(match self.source {
                LabelSource::Rules => "No eval/episodes.jsonl with labels.".into(),
                LabelSource::Llm => "No attempt got usable LLM labels.".into(),
            });
        }
        let title = match self.source {
            LabelSource::Rules => "Table 3 (labels)",
            LabelSource::Llm => "Table 3 (LLM labels)",
        };
        TextTable {
            title: format!(
                "{title}. Labelled behaviours of H0 test attempts, before and after training"
            ),
            header,
            rows,
            notes,
        }
    }
}
