//! Writing an evolution run to disk: the frozen pool, one JSON report per round, the diversity
//! views as JSON and SVG, the lineage tree and the token use per role.
//!
//! ```text
//! out/
//!   pool/                 the Sibling Harness Pool (harness-pool's directory format)
//!   rounds.json           every RoundReport
//!   round-<g>.json        one RoundReport each
//!   diversity.json        Figures 1a, 1b and 5 as data
//!   figure1a.svg figure1b.svg figure5.svg
//!   lineage.txt           the pool's lineage tree
//!   usage.json            external tokens per role (analyst, editor)
//! ```

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::diversity::DiversityReport;
use crate::error::Result;
use crate::plot;
use crate::round::{CandidateOutcome, EvolutionResult, RoundReport};

fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value)
        .unwrap_or_else(|_| unreachable!("reports are plain data"));
    text.push('\n');
    harness_core::fsutil::write_atomic(path, text.as_bytes())?;
    Ok(())
}

/// Write the run into `dir`; returns the files written.
pub fn write_reports(
    dir: &Path,
    result: &EvolutionResult,
    diversity: &DiversityReport,
) -> Result<Vec<PathBuf>> {
    let mut written = Vec::new();
    let pool_dir = dir.join("pool");
    result.pool.save(&pool_dir)?;
    written.push(pool_dir);
    let rounds = dir.join("rounds.json");
    write_json(&rounds, &result.rounds)?;
    written.push(rounds);
    for round in &result.rounds {
        let path = dir.join(format!("round-{}.json", round.round));
        write_json(&path, round)?;
        written.push(path);
    }
    let path = dir.join("diversity.json");
    write_json(&path, diversity)?;
    written.push(path);
    let path = dir.join("usage.json");
    write_json(&path, &result.usage)?;
    written.push(path);
    let path = dir.join("lineage.txt");
    harness_core::fsutil::write_atomic(&path, result.pool.render_lineage().as_bytes())?;
    written.push(path);
    for (name, draw) in [
        (
            "figure1a.svg",
            plot::repaired_vs_regressed as fn(&DiversityReport, &Path) -> Result<()>,
        ),
        ("figure1b.svg", plot::coverage),
        ("figure5.svg", plot::overlap),
    ] {
        let path = dir.join(name);
        draw(diversity, &path)?;
        written.push(path);
    }
    Ok(written)
}

/// A readable summary of one round: proposals, validity with reasons, each valid child's
/// local figures and its repaired/regressed validation tasks against H0, the parents chosen
/// and their coverage, and the tokens per role.
pub fn round_summary(round: &RoundReport, validation_tasks: usize) -> String {
    let mut out = String::new();
    let invalid: usize = round.invalid.values().sum();
    let _ = writeln!(
        out,
        "round {} (seed {}): budget {}, proposed {}, valid {}, invalid {}{}, no proposal {}",
        round.round,
        round.seed,
        round.budget,
        round.proposed,
        round.valid,
        invalid,
        if round.invalid.is_empty() {
            String::new()
        } else {
            format!(" {:?}", round.invalid)
        },
        round.no_proposal
    );
    for p in &round.parents {
        let causes: Vec<String> = p
            .analysis
            .causes
            .iter()
            .map(|c| format!("{} x{}", c.kind, c.tasks.len()))
            .collect();
        let _ = writeln!(
            out,
            "  parent {} [{}]: {}/{} training tasks solved; causes: {}; unresolved {}; reported only: {}",
            p.name,
            p.id,
            p.solved,
            p.tasks,
            if causes.is_empty() {
                "none".into()
            } else {
                causes.join(", ")
            },
            p.analysis.unresolved.len(),
            if p.reported.is_empty() {
                "none".to_string()
            } else {
                p.reported
                    .iter()
                    .map(|r| r.kind.clone())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
    }
    for c in &round.candidates {
        match &c.outcome {
            CandidateOutcome::NoProposal => {
                let _ = writeln!(
                    out,
                    "  {} ({}): no proposal",
                    c.direction,
                    c.causes.join("+")
                );
            }
            CandidateOutcome::Invalid { rejection } => {
                let _ = writeln!(
                    out,
                    "  {} ({}): invalid at {:?}: {}",
                    c.direction,
                    c.causes.join("+"),
                    rejection.stage,
                    rejection.reason
                );
            }
            CandidateOutcome::Valid {
                name,
                local_eval,
                revised,
                validation_solved,
                repaired_vs_h0,
                regressed_vs_h0,
                ..
            } => {
                let _ = writeln!(
                    out,
                    "  {} -> {name} [{}]{}: local +{} -{} of {} ({} targeted, {} controls); validation {}/{validation_tasks}, vs H0 +{} -{}",
                    c.direction,
                    c.components.join(","),
                    if *revised { " (revised)" } else { "" },
                    local_eval.repaired.len(),
                    local_eval.regressed.len(),
                    local_eval.tasks,
                    local_eval.targeted_failures,
                    local_eval.controls,
                    validation_solved,
                    repaired_vs_h0.len(),
                    regressed_vs_h0.len()
                );
            }
        }
    }
    if round.selected_names.is_empty() {
        let _ = writeln!(
            out,
            "  selected (Eq. 3): none, no valid child; the parents stay"
        );
    } else {
        let _ = writeln!(
            out,
            "  selected (Eq. 3): {} covering {}/{validation_tasks} validation tasks ({:?})",
            round.selected_names.join(", "),
            round.selection.covered,
            round.selection.method
        );
    }
    let usage: Vec<String> = round
        .usage
        .iter()
        .map(|(role, u)| {
            format!(
                "{role} {} tokens in {} calls ({} malformed, {} skipped)",
                u.total_tokens(),
                u.calls,
                u.malformed,
                u.skipped
            )
        })
        .collect();
    let _ = writeln!(out, "  external tokens: {}", usage.join("; "));
    out
}
