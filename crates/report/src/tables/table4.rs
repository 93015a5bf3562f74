//! Table 4: behaviour transfer cases (RQ4), from every seed's `eval/transfer.jsonl`: a kind
//! (task family) a method rescued in training, traced to a held-out test instance that its
//! trained policy solves under H0 where the initial policy failed every attempt, with the
//! behaviour labels on which the trained success differs from the initial failure in the
//! direction the training rescue rollout also did. harness-pipeline finds the cases; this
//! module only lays them out.

use crate::layout::{BehaviourDiff, Run, TransferCase};
use crate::render::TextTable;

/// Behaviours shown per case (the largest changes; the file holds all).
pub const BEHAVIOURS_SHOWN: usize = 3;

/// Table 4 of a run: every case of every seed, in method display order.
#[derive(Debug, Clone, PartialEq)]
pub struct Table4 {
    /// `(seed name, case)`.
    pub cases: Vec<(String, TransferCase)>,
    /// Seeds with `eval/transfer.jsonl`.
    pub seeds_with_file: usize,
    /// Whether plain GRPO was evaluated (Table 4's cases are ones where it fails too; without
    /// it the pipeline writes no cases).
    pub grpo_evaluated: bool,
}

/// Collect the cases.
pub fn table4(run: &Run) -> Table4 {
    let order = run.methods();
    let mut cases: Vec<(String, TransferCase)> = run
        .seeds
        .iter()
        .flat_map(|s| {
            s.transfer
                .iter()
                .flatten()
                .map(move |c| (s.name(), c.clone()))
        })
        .collect();
    cases.sort_by_key(|(_, c)| order.iter().position(|m| *m == c.method));
    Table4 {
        cases,
        seeds_with_file: run.seeds.iter().filter(|s| s.transfer.is_some()).count(),
        grpo_evaluated: order.iter().any(|m| m == "grpo"),
    }
}

fn value(v: f64) -> String {
    if v.fract() == 0.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.2}")
    }
}

fn behaviour(b: &BehaviourDiff) -> String {
    format!(
        "{}: rescue {}, trained {}, initial {}",
        b.feature,
        value(b.rescue),
        value(b.trained),
        value(b.initial)
    )
}

impl Table4 {
    /// As text: one row per case.
    pub fn to_text(&self, seeds: usize) -> TextTable {
        let rows = self
            .cases
            .iter()
            .map(|(seed, c)| {
                let mut cells = Vec::new();
                if seeds > 1 {
                    cells.push(seed.clone());
                }
                cells.extend([
                    c.label.clone(),
                    c.family.clone(),
                    format!("{} / {}", c.h0_training_successes, c.h0_training_attempts),
                    format!(
                        "{} at update {}{} under {} ({} rescued groups)",
                        c.rescue.task,
                        c.rescue.update,
                        c.rescue
                            .policy_version
                            .map_or(String::new(), |v| format!(" (applied: policy v{v})")),
                        c.rescue.harness_name,
                        c.rescued_groups
                    ),
                ]);
                match &c.test_task {
                    Some(task) => {
                        cells.push(task.clone());
                        cells.push(format!("{} / {}", c.initial_successes, c.attempts));
                        cells.push(
                            c.grpo_successes
                                .map_or("—".into(), |g| format!("{g} / {}", c.attempts)),
                        );
                        cells.push(format!("{} / {}", c.trained_successes, c.attempts));
                        let shown: Vec<String> = c
                            .behaviours
                            .iter()
                            .take(BEHAVIOURS_SHOWN)
                            .map(behaviour)
                            .collect();
                        cells.push(if shown.is_empty() {
                            "no label differs".into()
                        } else {
                            shown.join("; ")
                        });
                    }
                    None => {
                        cells.push("no held-out instance qualifies".into());
                        cells.extend(["—".to_string(), "—".into(), "—".into(), "—".into()]);
                    }
                }
                cells
            })
            .collect();
        let mut header = Vec::new();
        if seeds > 1 {
            header.push("Seed".to_string());
        }
        header.extend(
            [
                "Method",
                "Kind (family)",
                "H0 successes in training",
                "Training rescue",
                "Held-out instance",
                "Initial",
                "GRPO",
                "Trained",
                "Behaviour (rescue, trained success, initial failure)",
            ]
            .map(String::from),
        );
        let mut notes = vec![
            "A case is a family the method rescued in training (all K initial H0 attempts failed, a sibling's rollout succeeded and its group entered an update the learner applied, by the update's metrics.jsonl line), traced to a held-out test instance of that family which the trained policy solves under H0 while the initial policy and plain GRPO failed every attempt (same episode seeds); \"H0 successes in training\" counts the method's own H0 attempts on the family (0: the kind was never solved under H0 in training). Up to three instances per family, the first in test order.".to_string(),
            format!("Behaviour: the labels (the environment labeller's features; decision:<point>=<choice> flags for DBBench) on which the trained success differs from the initial policy's failed attempt with the same seed, in the direction the training rescue rollout also differs; the {BEHAVIOURS_SHOWN} largest changes, all of them in eval/transfer.jsonl."),
        ];
        let held_out = self
            .cases
            .iter()
            .filter(|(_, c)| c.test_task.is_some())
            .count();
        let strict = self
            .cases
            .iter()
            .filter(|(_, c)| c.test_task.is_some() && c.h0_training_successes == 0)
            .count();
        notes.push(format!(
            "{held_out} held-out cases; {strict} of them of a kind the method's H0 attempts never solved in training."
        ));
        if self.seeds_with_file == 0 {
            notes.push(if self.grpo_evaluated {
                "No eval/transfer.jsonl: no rescue-trained method was evaluated under H0 after the initial policy.".into()
            } else {
                "Not computed: a case is one where plain GRPO fails too, and this run did not evaluate it (add grpo to train.methods).".into()
            });
        }
        TextTable {
            title:
                "Table 4. Behaviour transfer from training rescues to held-out instances under H0"
                    .into(),
            header,
            rows,
            notes,
        }
    }
}
