//! The rescue diagnostics: why a direction falls as it does (from every seed's
//! `eval/diagnostics.jsonl` and the sibling probes of `eval/behaviour.jsonl`).
//!
//! - **Pre-intervention credit**: of each rescue method's rescue rollouts, the share of policy
//!   tokens generated before the sibling's first difference from H0's context (all, and those
//!   with positive advantage), where the rollouts first departed (prompt, harness message,
//!   never), and per family how many successful rescues made the planted mistake before it.
//!   Tokens before the intervention were sampled in an H0-identical context: what a successful
//!   rescue rewards there, mistakes included, is rewarded under H0.
//! - **GRPO's own signal**: per family, the training groups whose initial H0 rollouts held a
//!   success (the groups where plain GRPO has a gradient without any rescue).
//! - **Context lock**: each checkpoint's probability of the good decision at each family's
//!   decision point under H0 and under each declarative sibling's context: does training move
//!   the decision only where a sibling's message is present?
//!
//! Counts are pooled over seeds (sums), probabilities are means over seeds.

use std::collections::{BTreeMap, BTreeSet};

use crate::layout::{DiagnosticsLine, FamilyDiagnostics, Run};
use crate::render::TextTable;
use crate::stats::Stat;

/// The diagnostics of a run, as data.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Diagnostics {
    /// Per method (display order), the lines of every seed summed.
    pub methods: Vec<DiagnosticsLine>,
    /// The context lock: `(family, context)` rows, context `H0` or a sibling's name, each with
    /// a probability per method (`None`: not probed).
    pub context_lock: Vec<ContextLockRow>,
    /// The methods of the context lock's columns (`initial` first) and their labels.
    pub lock_methods: Vec<(String, String)>,
}

/// One row of the context lock.
#[derive(Debug, Clone, PartialEq)]
pub struct ContextLockRow {
    /// The task family.
    pub family: String,
    /// `H0` or a sibling's name.
    pub context: String,
    /// The good decision's probability per method, over seeds.
    pub p_good: Vec<Option<Stat>>,
    /// Seeds of the run (how cells are written).
    pub seeds: usize,
}

fn add(into: &mut DiagnosticsLine, line: &DiagnosticsLine) {
    into.rescue_rollouts += line.rescue_rollouts;
    into.successful_rescues += line.successful_rescues;
    into.policy_tokens += line.policy_tokens;
    into.tokens_before += line.tokens_before;
    into.positive_tokens += line.positive_tokens;
    into.positive_tokens_before += line.positive_tokens_before;
    into.interventions.prompt += line.interventions.prompt;
    into.interventions.message += line.interventions.message;
    into.interventions.none += line.interventions.none;
    for (family, f) in &line.families {
        let to: &mut FamilyDiagnostics = into.families.entry(family.clone()).or_default();
        to.groups += f.groups;
        to.groups_with_h0_success += f.groups_with_h0_success;
        to.rescued_groups += f.rescued_groups;
        to.successful_rescues += f.successful_rescues;
        to.planted_before_intervention += f.planted_before_intervention;
    }
}

/// Compute the diagnostics of `run`.
pub fn diagnostics(run: &Run) -> Diagnostics {
    let order = run.methods();
    let mut by_method: BTreeMap<String, DiagnosticsLine> = BTreeMap::new();
    for seed in &run.seeds {
        for line in seed.diagnostics.iter().flatten() {
            let sum = by_method
                .entry(line.method.clone())
                .or_insert_with(|| DiagnosticsLine {
                    method: line.method.clone(),
                    label: line.label.clone(),
                    ..DiagnosticsLine::default()
                });
            add(sum, line);
        }
    }
    let mut methods: Vec<DiagnosticsLine> = by_method.into_values().collect();
    methods.sort_by_key(|l| order.iter().position(|m| *m == l.method));

    // The context lock, from the probes of eval/behaviour.jsonl.
    let mut lock_methods: Vec<(String, String)> = Vec::new();
    // (family, context) -> method -> values over seeds
    let mut cells: BTreeMap<(String, String), BTreeMap<String, Vec<f64>>> = BTreeMap::new();
    for seed in &run.seeds {
        for line in seed.behaviour.iter().flatten() {
            if line.probe.is_empty() && line.probe_siblings.is_empty() {
                continue;
            }
            if !lock_methods.iter().any(|(m, _)| *m == line.method) {
                let label = line
                    .label
                    .clone()
                    .unwrap_or_else(|| run.label(&line.method));
                lock_methods.push((line.method.clone(), label));
            }
            let contexts = std::iter::once(("H0".to_string(), &line.probe)).chain(
                line.probe_siblings
                    .iter()
                    .map(|(name, probe)| (name.clone(), probe)),
            );
            for (context, probe) in contexts {
                for (family, cell) in probe {
                    cells
                        .entry((family.clone(), context.clone()))
                        .or_default()
                        .entry(line.method.clone())
                        .or_default()
                        .push(cell.p_good);
                }
            }
        }
    }
    lock_methods.sort_by_key(|(m, _)| {
        if m == "initial" {
            0
        } else {
            1 + order.iter().position(|o| o == m).unwrap_or(order.len())
        }
    });
    let families: BTreeSet<&String> = cells.keys().map(|(f, _)| f).collect();
    let mut context_lock = Vec::new();
    for family in families {
        // H0 first, then the siblings by name.
        let mut contexts: Vec<&String> = cells
            .keys()
            .filter(|(f, _)| f == family)
            .map(|(_, c)| c)
            .collect();
        contexts.sort_by_key(|c| (c.as_str() != "H0", c.to_string()));
        for context in contexts {
            let per_method = &cells[&(family.clone(), context.clone())];
            context_lock.push(ContextLockRow {
                family: family.clone(),
                context: context.clone(),
                p_good: lock_methods
                    .iter()
                    .map(|(m, _)| per_method.get(m).and_then(|v| Stat::of(v)))
                    .collect(),
                seeds: run.seeds.len(),
            });
        }
    }
    Diagnostics {
        methods,
        context_lock,
        lock_methods,
    }
}

fn share(part: usize, whole: usize) -> String {
    if whole == 0 {
        "—".into()
    } else {
        format!(
            "{:.1}% ({part} / {whole})",
            100.0 * part as f64 / whole as f64
        )
    }
}

impl Diagnostics {
    /// Pre-intervention credit: one row per method with rescue rollouts.
    pub fn credit_text(&self) -> TextTable {
        let families: BTreeSet<&String> = self
            .methods
            .iter()
            .flat_map(|l| l.families.iter())
            .filter(|(_, f)| f.successful_rescues > 0)
            .map(|(name, _)| name)
            .collect();
        let mut header: Vec<String> = [
            "Method",
            "Rescue rollouts (successful)",
            "Tokens before intervention",
            "Positive-advantage tokens before",
            "First difference: prompt / message / none",
        ]
        .map(String::from)
        .to_vec();
        header.extend(
            families
                .iter()
                .map(|f| format!("{f}: planted mistake before / successful")),
        );
        let rows: Vec<Vec<String>> = self
            .methods
            .iter()
            .filter(|l| l.rescue_rollouts > 0)
            .map(|l| {
                let mut cells = vec![
                    l.label.clone(),
                    format!("{} ({})", l.rescue_rollouts, l.successful_rescues),
                    share(l.tokens_before, l.policy_tokens),
                    share(l.positive_tokens_before, l.positive_tokens),
                    format!(
                        "{} / {} / {}",
                        l.interventions.prompt, l.interventions.message, l.interventions.none
                    ),
                ];
                cells.extend(families.iter().map(|f| match l.families.get(*f) {
                    Some(d) if d.successful_rescues > 0 => {
                        format!(
                            "{} / {}",
                            d.planted_before_intervention, d.successful_rescues
                        )
                    }
                    _ => "—".into(),
                }));
                cells
            })
            .collect();
        let mut notes = vec![
            "A sibling intervenes where its context first differs from what H0 would show: at token 0 when its first prompt differs from H0's (prompt rules, skills, tool view), else at its first harness message after the first policy turn (a hook). Tokens before that point were sampled in an H0-identical context, so a successful rescue rewards them, planted mistakes included, under H0 (paper Eqs. 13-16 score every rescue token in its generating context). Advantage: Eq. 6 within the rescue group. Planted mistake: the family's bad choice at a DBBench decision point made before the intervention. Pooled over seeds.".to_string(),
        ];
        if rows.is_empty() {
            notes.push(
                "No rescue rollouts: no method with rescue was trained, or no eval/diagnostics.jsonl."
                    .into(),
            );
        }
        TextTable {
            title: "Rescue diagnostics: pre-intervention credit".into(),
            header,
            rows,
            notes,
        }
    }

    /// GRPO's own signal: per method and family, the groups whose H0 rollouts held a success.
    pub fn signal_text(&self) -> TextTable {
        let families: BTreeSet<&String> = self
            .methods
            .iter()
            .flat_map(|l| l.families.keys())
            .collect();
        let mut header = vec!["Method".to_string()];
        header.extend(families.iter().map(|f| f.to_string()));
        let rows: Vec<Vec<String>> = self
            .methods
            .iter()
            .map(|l| {
                let mut cells = vec![l.label.clone()];
                cells.extend(families.iter().map(|f| match l.families.get(*f) {
                    Some(d) => share(d.groups_with_h0_success, d.groups),
                    None => "—".into(),
                }));
                cells
            })
            .collect();
        let mut notes = vec!["Training groups whose initial H0 rollouts held at least one success, per task family (pooled over seeds): there plain GRPO has a gradient of its own; rescue only acts on the rest. Fixed mixtures' groups have no H0-only initial rollouts and count as without.".to_string()];
        if rows.is_empty() {
            notes.push("No eval/diagnostics.jsonl.".into());
        }
        TextTable {
            title: "Rescue diagnostics: GRPO's own signal".into(),
            header,
            rows,
            notes,
        }
    }

    /// The context lock.
    pub fn lock_text(&self) -> TextTable {
        let mut header = vec!["Family".to_string(), "Context".to_string()];
        header.extend(self.lock_methods.iter().map(|(_, label)| label.clone()));
        let rows: Vec<Vec<String>> = self
            .context_lock
            .iter()
            .map(|r| {
                let mut cells = vec![r.family.clone(), r.context.clone()];
                cells.extend(
                    r.p_good
                        .iter()
                        .map(|s| crate::stats::pct(s.as_ref(), r.seeds)),
                );
                cells
            })
            .collect();
        let mut notes = vec!["The probability (%) of the good decision at each family's decision point, read from each checkpoint on the demonstration script's fixed contexts, under H0 and under each declarative sibling's context (its prompt, and its hook messages where they fire before the decision), mean ± std over seeds. Training that moves the sibling rows but not H0's has learned the decision only where the sibling's message is present.".to_string()];
        if rows.is_empty() {
            notes.push(
                "No probe: the decision-point probe runs on the embedded default only.".into(),
            );
        }
        TextTable {
            title: "Rescue diagnostics: context lock".into(),
            header,
            rows,
            notes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{BehaviourLine, InterventionCounts, ProbeCell, SeedRun};

    fn line(
        method: &str,
        before: usize,
        positive_before: usize,
        planted: usize,
    ) -> DiagnosticsLine {
        DiagnosticsLine {
            method: method.into(),
            label: method.to_uppercase(),
            rescue_rollouts: 8,
            successful_rescues: 4,
            policy_tokens: 200,
            tokens_before: before,
            positive_tokens: 100,
            positive_tokens_before: positive_before,
            interventions: InterventionCounts {
                prompt: 2,
                message: 5,
                none: 1,
            },
            families: BTreeMap::from([(
                "recheck".to_string(),
                FamilyDiagnostics {
                    groups: 10,
                    groups_with_h0_success: 1,
                    rescued_groups: 2,
                    successful_rescues: 4,
                    planted_before_intervention: planted,
                },
            )]),
        }
    }

    fn probe(p: f64) -> BTreeMap<String, ProbeCell> {
        BTreeMap::from([(
            "recheck".to_string(),
            ProbeCell {
                tasks: 3,
                p_good: p,
                ..ProbeCell::default()
            },
        )])
    }

    fn behaviour(method: &str, h0: f64, sibling: f64) -> BehaviourLine {
        BehaviourLine {
            method: method.into(),
            label: None,
            mode: "h0".into(),
            episodes: BTreeMap::new(),
            choices: BTreeMap::new(),
            probe: probe(h0),
            probe_siblings: BTreeMap::from([("low-budget".to_string(), probe(sibling))]),
        }
    }

    fn seed(s: u64, diag: Vec<DiagnosticsLine>, behaviour: Vec<BehaviourLine>) -> SeedRun {
        SeedRun {
            dir: format!("seed-{s}").into(),
            seed: Some(s),
            diagnostics: Some(diag),
            behaviour: Some(behaviour),
            ..SeedRun::default()
        }
    }

    #[test]
    fn counts_are_pooled_over_seeds_and_the_lock_compares_contexts() {
        let run = Run {
            dir: "r".into(),
            seeds: vec![
                seed(
                    1,
                    vec![line("harness_s", 120, 60, 3)],
                    vec![
                        behaviour("initial", 0.1, 0.8),
                        behaviour("harness_s", 0.2, 0.9),
                    ],
                ),
                seed(
                    2,
                    vec![line("harness_s", 80, 40, 1)],
                    vec![
                        behaviour("initial", 0.3, 0.6),
                        behaviour("harness_s", 0.4, 0.9),
                    ],
                ),
            ],
            shared_evolve: None,
        };
        let d = diagnostics(&run);
        assert_eq!(d.methods.len(), 1);
        let credit = d.credit_text();
        // (120 + 80) / 400 tokens, (60 + 40) / 200 positive tokens, 4 / 8 planted of successful.
        assert_eq!(credit.rows[0][1], "16 (8)");
        assert_eq!(credit.rows[0][2], "50.0% (200 / 400)");
        assert_eq!(credit.rows[0][3], "50.0% (100 / 200)");
        assert_eq!(credit.rows[0][4], "4 / 10 / 2");
        assert_eq!(credit.rows[0][5], "4 / 8");
        let signal = d.signal_text();
        assert_eq!(signal.rows[0][1], "10.0% (2 / 20)");
        let lock = d.lock_text();
        assert_eq!(lock.header.len(), 4);
        assert_eq!(lock.header[2], run.label("initial"));
        assert_eq!(lock.rows.len(), 2);
        assert_eq!(lock.rows[0][1], "H0");
        assert_eq!(lock.rows[1][1], "low-budget");
        // Means over the two seeds: initial 20% under H0, 70% under the sibling.
        assert!(lock.rows[0][2].starts_with("20.00"), "{:?}", lock.rows[0]);
        assert!(lock.rows[1][2].starts_with("70.00"), "{:?}", lock.rows[1]);
        assert!(lock.rows[1][3].starts_with("90.00"), "{:?}", lock.rows[1]);
    }

    #[test]
    fn without_files_the_tables_say_so() {
        let d = diagnostics(&Run {
            dir: "r".into(),
            seeds: vec![SeedRun::default()],
            shared_evolve: None,
        });
        assert!(d.credit_text().rows.is_empty());
        assert!(
            d.credit_text()
                .notes
                .iter()
                .any(|n| n.contains("No rescue rollouts"))
        );
        assert!(d.lock_text().notes.iter().any(|n| n.contains("No probe")));
    }
}
