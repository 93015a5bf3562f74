//! A summary of each seed's evolution (`evolve/rounds.json` and `evolve/diversity.json`):
//! rounds, proposals, valid children, and the pool's repair diversity.

use serde::{Deserialize, Serialize};

use crate::layout::Run;
use crate::render::TextTable;

/// One seed's evolution.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvolutionRow {
    /// The seed's name.
    pub seed: String,
    /// Rounds run (`None` without rounds.json).
    pub rounds: Option<usize>,
    /// Proposals over all rounds.
    pub proposed: Option<usize>,
    /// Valid children over all rounds.
    pub valid: Option<usize>,
    /// Validation tasks compared (`None` without diversity.json).
    pub tasks: Option<usize>,
    /// Siblings compared.
    pub siblings: Option<usize>,
    /// H0 failures some sibling repairs.
    pub union_repaired: Option<usize>,
    /// Mean directed repair overlap (Figure 5).
    pub mean_overlap: Option<f64>,
}

/// The summary rows; empty when no seed has `evolve/`.
pub fn evolution(run: &Run) -> Vec<EvolutionRow> {
    let shared = run
        .shared_evolve
        .as_ref()
        .map(|e| ("all seeds (shared evolve/)".to_string(), e));
    shared
        .into_iter()
        .chain(
            run.seeds
                .iter()
                .filter_map(|s| Some((s.name(), s.evolve.as_ref()?))),
        )
        .map(|(seed, e)| {
            let rounds = e.rounds.as_ref();
            let d = e.diversity.as_ref();
            EvolutionRow {
                seed,
                rounds: rounds.map(Vec::len),
                proposed: rounds.map(|r| r.iter().map(|r| r.proposed).sum()),
                valid: rounds.map(|r| r.iter().map(|r| r.valid).sum()),
                tasks: d.map(|d| d.tasks),
                siblings: d.map(|d| d.siblings.len()),
                union_repaired: d.map(|d| d.union_repaired),
                mean_overlap: d.and_then(|d| d.mean_overlap),
            }
        })
        .collect()
}

/// As text.
pub fn evolution_text(rows: &[EvolutionRow]) -> TextTable {
    let n = |v: Option<usize>| v.map_or("—".into(), |v| v.to_string());
    TextTable {
        title: "Evolution and sibling diversity".into(),
        header: vec![
            "Seed".into(),
            "Rounds".into(),
            "Proposed".into(),
            "Valid".into(),
            "Validation tasks".into(),
            "Siblings".into(),
            "Union of repairs".into(),
            "Mean overlap".into(),
        ],
        rows: rows
            .iter()
            .map(|r| {
                vec![
                    r.seed.clone(),
                    n(r.rounds),
                    n(r.proposed),
                    n(r.valid),
                    n(r.tasks),
                    n(r.siblings),
                    n(r.union_repaired),
                    r.mean_overlap
                        .map_or("—".into(), |m| format!("{:.2}", m * 100.0)),
                ]
            })
            .collect(),
        notes: vec![if rows.is_empty() {
            "Evolution not run: no evolve/ folder.".into()
        } else {
            "From evolve/rounds.json and evolve/diversity.json (—: file absent). Mean overlap: |R_i ∩ R_j| / |R_i| over distinct ordered sibling pairs, in percent.".into()
        }],
    }
}

/// One sibling of the pool: its repair direction and what it repairs and breaks against H0 on
/// the validation tasks (Figure 1a).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiblingRow {
    /// The seed's name (or "all seeds" for a shared evolution).
    pub seed: String,
    /// The sibling's name.
    pub name: String,
    /// Its parent's name.
    pub parent: String,
    /// Its direction's causes, joined with `+`.
    pub direction: String,
    /// The components its edit touched.
    pub components: Vec<String>,
    /// Validation tasks solved.
    pub solved: usize,
    /// H0 failures it solves.
    pub repaired: usize,
    /// H0 successes it fails.
    pub regressed: usize,
}

/// Every valid child of every round, with its repairs and regressions; empty without
/// `rounds.json`.
pub fn siblings(run: &Run) -> Vec<SiblingRow> {
    let shared = run
        .shared_evolve
        .as_ref()
        .map(|e| ("all seeds".to_string(), e));
    let mut out = Vec::new();
    for (seed, e) in shared.into_iter().chain(
        run.seeds
            .iter()
            .filter_map(|s| Some((s.name(), s.evolve.as_ref()?))),
    ) {
        for c in e.rounds.iter().flatten().flat_map(|r| &r.candidates) {
            if let harness_evolve::round::CandidateOutcome::Valid {
                name,
                validation_solved,
                repaired_vs_h0,
                regressed_vs_h0,
                ..
            } = &c.outcome
            {
                out.push(SiblingRow {
                    seed: seed.clone(),
                    name: name.clone(),
                    parent: c.parent_name.clone(),
                    direction: c.causes.join("+"),
                    components: c.components.clone(),
                    solved: *validation_solved,
                    repaired: repaired_vs_h0.len(),
                    regressed: regressed_vs_h0.len(),
                });
            }
        }
    }
    out
}

/// The siblings as text.
pub fn siblings_text(rows: &[SiblingRow]) -> TextTable {
    let directions: std::collections::BTreeSet<&str> =
        rows.iter().map(|r| r.direction.as_str()).collect();
    let repairing = rows.iter().filter(|r| r.repaired > 0).count();
    let mut notes = vec![
        "Every valid child of evolution (evolve/rounds.json): the causes its direction targets, the components it edited, and on the validation tasks the H0 failures it solves (repaired) and the H0 successes it fails (regressed), Figure 1a's locality.".to_string(),
    ];
    if rows.is_empty() {
        notes.push("Evolution not run: no evolve/rounds.json.".into());
    } else {
        notes.push(format!(
            "{} siblings, {} distinct directions, {} repairing at least one H0 failure.",
            rows.len(),
            directions.len(),
            repairing
        ));
    }
    TextTable {
        title: "Siblings: directions, repairs and regressions".into(),
        header: vec![
            "Seed".into(),
            "Sibling".into(),
            "Parent".into(),
            "Direction".into(),
            "Components".into(),
            "Solved".into(),
            "Repaired".into(),
            "Regressed".into(),
        ],
        rows: rows
            .iter()
            .map(|r| {
                vec![
                    r.seed.clone(),
                    r.name.clone(),
                    r.parent.clone(),
                    r.direction.clone(),
                    r.components.join(", "),
                    r.solved.to_string(),
                    r.repaired.to_string(),
                    r.regressed.to_string(),
                ]
            })
            .collect(),
        notes,
    }
}
