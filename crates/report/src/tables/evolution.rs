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
