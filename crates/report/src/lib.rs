//! # harness-report
//!
//! The paper-shaped tables and plots of a harness-s main-job run, made only from the files the
//! run wrote: `run.json`, harness-evolve's `evolve/` reports, harness-rollout's
//! `train/<method>/` run folders (`metrics.jsonl`, `groups.jsonl`, `cost.json`) and the test
//! and Rank-r evaluations in `eval/`. It sits at the end of the pipeline, above
//! `harness-rollout`, `harness-router` and `harness-evolve`, whose serde types it reads the
//! files with, so a change in their format breaks the report loudly instead of silently.
//!
//! - Table 1 ([`tables::table1`]): test Pass@k / Avg@k under H0 and Rank-1 per method.
//! - Table 2 ([`tables::table2`]): rescue success in four training stages, final test scores.
//! - Table 5 ([`tables::table5`]): H0 and Rank-1..3 before and after training, and the
//!   Rank-1 choices by task family ([`tables::behaviour::routing_by_family`]).
//! - Table 3 ([`tables::behaviour::table3`]): the good and the planted choice at each decision
//!   point of the H0 test episodes, before and after training.
//! - Table 3b ([`tables::behaviour::table3b`]): the probability of the good decision at each
//!   decision point under H0, read from each checkpoint on fixed contexts.
//! - Table 4 ([`tables::table4`]): behaviour transfer cases from training rescues to held-out
//!   instances under H0.
//! - Table 9 ([`tables::table9`]): training rollouts and seconds beside H0 test Avg@k.
//! - Table 10 ([`tables::table10`]): each method's whole pipeline: search, training and
//!   calibration rollouts and seconds, external tokens per role.
//! - Figure 4's view ([`tables::cross`]): Pass@k under harnesses outside the training pool.
//! - The pool's agent programs ([`tables::programs`]): each method's training rollouts under
//!   them and the recording proxy's prefix-break counts.
//! - The claimed directions ([`tables::directions`]), reported whichever way they fall.
//! - The rescue diagnostics ([`tables::diagnostics`]): pre-intervention credit, GRPO's own
//!   signal per family, and the context lock (the good decision under H0 and under each
//!   sibling's context), which say why a direction falls as it does.
//! - A sweep's grid report ([`sweep`]): several multi-seed runs (organism variants x rescue
//!   objectives) side by side, each method's H0 Avg@k against GRPO with intervals, and a plot.
//! - Figure 3's panels ([`plots::figure3`]) and the evolution's diversity views, as SVG
//!   (plotters' SVG backend only: PNG is not rendered).
//!
//! With several seeds (`<out>/seed-<s>/` folders) every cell is the mean ± the sample standard
//! deviation (n - 1) over seeds. Missing optional parts (no `evolve/`, no `eval/rank.jsonl`)
//! give tables that say "not run"; a malformed line is an [`Error::Parse`] naming the file and
//! the line.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let out = tempfile::tempdir()?;
//! std::fs::create_dir_all(out.path().join("eval"))?;
//! std::fs::write(out.path().join("run.json"), r#"{"seed": 7}"#)?;
//! std::fs::write(
//!     out.path().join("eval/test.jsonl"),
//!     r#"{"method": "grpo", "label": "GRPO", "mode": "h0", "k": 3, "tasks": 20, "pass_at_k": 0.45, "avg_at_k": 0.31, "rollouts": 60, "seconds": 12.5, "per_task": []}"#,
//! )?;
//! let text = harness_report::render_tables(out.path())?;
//! assert!(text.contains("| GRPO | 45.00 | 31.00 | — | — |"));
//! assert!(text.contains("Rank-r evaluation not run"));
//!
//! let files = harness_report::write_report(out.path())?;
//! assert!(files.markdown.ends_with("report.md") && files.html.is_file());
//! # Ok(())
//! # }
//! ```

pub mod error;
pub mod layout;
pub mod plots;
pub mod render;
pub mod stats;
pub mod sweep;
pub mod tables;

use std::path::{Path, PathBuf};

pub use error::{Error, Result};
pub use layout::{EvalMode, MethodRun, RankLine, RankStage, Run, SeedRun, TestEval, read_run};
pub use plots::{Figure, Figure3, Series, figure3};
pub use render::TextTable;
pub use stats::Stat;
pub use tables::behaviour::{
    FamilyRouting, Nonstationarity, ProbeRow, Table3, Table3b, nonstationarity, routing_by_family,
    table3, table3b,
};
pub use tables::cross::{CrossCell, CrossRow, CrossTable, cross_harness};
pub use tables::diagnostics::{ContextLockRow, Diagnostics, diagnostics};
pub use tables::directions::{DirectionRow, Verdict, directions};
pub use tables::evolution::{EvolutionRow, SiblingRow, evolution, siblings};
pub use tables::labels::{
    LabelCell, LabelRow, LabelSource, LabelTable, label_table, llm_label_table,
};
pub use tables::programs::{ProgramCalibration, ProgramRow, ProgramTable, programs};
pub use tables::table1::{Table1, Table1Row, table1};
pub use tables::table2::{RescueCount, StageSpan, Table2, Table2Column, stage_spans, table2};
pub use tables::table4::{Table4, table4};
pub use tables::table5::{RankCells, Table5, Table5Row, table5};
pub use tables::table9::{CostSource, Table9, Table9Row, table9};
pub use tables::table10::{Table10, Table10Row, seed_pipeline_cost, table10};

/// The Markdown report's file name, in the run directory.
pub const MARKDOWN_FILE: &str = "report.md";
/// The HTML report's file name, in the run directory.
pub const HTML_FILE: &str = "report.html";
/// The folder of the SVG plots, in the run directory.
pub const PLOTS_DIR: &str = "plots";

/// Every table of a run, as data.
#[derive(Debug, Clone, PartialEq)]
pub struct Tables {
    /// Table 1.
    pub table1: Table1,
    /// Table 2.
    pub table2: Table2,
    /// Table 5, one per method with Rank-r reports (empty: not run).
    pub table5: Vec<Table5>,
    /// Table 9.
    pub table9: Table9,
    /// Table 10.
    pub table10: Table10,
    /// Table 4: behaviour transfer cases.
    pub table4: Table4,
    /// Table 3 from the labellers: labelled behaviours of the H0 test attempts.
    pub labels: LabelTable,
    /// The same from the LLM labeller, when one ran.
    pub llm_labels: Option<LabelTable>,
    /// Figure 4's view: Pass@k under harnesses outside the training pool.
    pub cross: CrossTable,
    /// The claimed directions.
    pub directions: Vec<DirectionRow>,
    /// The evolution summary (empty: not run).
    pub evolution: Vec<EvolutionRow>,
    /// Table 3: behaviour at the decision points under H0.
    pub table3: Table3,
    /// Table 3b: probability of the good decision at the decision points under H0.
    pub table3b: Table3b,
    /// The router's Rank-1 choices by task family.
    pub routing: Vec<FamilyRouting>,
    /// The pool's siblings with their directions, repairs and regressions.
    pub siblings: Vec<SiblingRow>,
    /// Figure 1c: the siblings' paired outcomes against H0 at each calibration.
    pub nonstationarity: Vec<Nonstationarity>,
    /// The pool's agent programs: training rollouts and the prefix check.
    pub programs: ProgramTable,
    /// The rescue diagnostics: pre-intervention credit, GRPO's own signal, context lock.
    pub diagnostics: Diagnostics,
}

/// Compute every table of `run`.
pub fn tables(run: &Run) -> Tables {
    Tables {
        table1: table1(run),
        table2: table2(run),
        table5: table5(run),
        table9: table9(run),
        table10: table10(run),
        table4: table4(run),
        labels: label_table(run),
        llm_labels: llm_label_table(run),
        cross: cross_harness(run),
        directions: directions(run),
        evolution: evolution(run),
        table3: table3(run),
        table3b: table3b(run),
        routing: routing_by_family(run),
        siblings: siblings(run),
        nonstationarity: nonstationarity(run),
        programs: programs(run),
        diagnostics: diagnostics(run),
    }
}

impl Tables {
    /// The tables as text, in report order.
    pub fn to_text(&self, seeds: usize) -> Vec<TextTable> {
        let mut out = vec![self.table1.to_text(), self.table2.to_text()];
        if self.table5.is_empty() {
            out.push(Table5::not_run());
        } else {
            out.extend(self.table5.iter().map(Table5::to_text));
        }
        out.push(tables::behaviour::routing_text(&self.routing));
        out.push(self.table3.to_text());
        out.push(self.table3b.to_text());
        out.push(self.labels.to_text());
        if let Some(llm) = &self.llm_labels {
            out.push(llm.to_text());
        }
        out.push(self.table4.to_text(seeds));
        out.extend(tables::behaviour::nonstationarity_text(
            &self.nonstationarity,
        ));
        out.push(self.cross.to_text());
        out.push(self.table9.to_text());
        out.push(self.table10.to_text());
        out.push(tables::directions::directions_text(&self.directions, seeds));
        out.push(self.diagnostics.credit_text());
        out.push(self.diagnostics.signal_text());
        out.push(self.diagnostics.lock_text());
        out.push(tables::evolution::evolution_text(&self.evolution));
        out.push(tables::evolution::siblings_text(&self.siblings));
        out.push(self.programs.to_text());
        out
    }
}

/// The files [`write_report`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReportFiles {
    /// `report.md`.
    pub markdown: PathBuf,
    /// `report.html`.
    pub html: PathBuf,
    /// The SVGs under `plots/`.
    pub plots: Vec<PathBuf>,
}

fn summary(run: &Run) -> Vec<String> {
    let seeds: Vec<String> = run.seeds.iter().map(SeedRun::name).collect();
    let methods: Vec<String> = run
        .methods()
        .iter()
        .map(|m| format!("{} ({m})", run.label(m)))
        .collect();
    let mut lines = vec![
        format!("Run directory: {}", run.dir.display()),
        format!("Seeds: {} ({})", seeds.len(), seeds.join(", ")),
        format!(
            "Methods: {}",
            if methods.is_empty() {
                "none".to_string()
            } else {
                methods.join(", ")
            }
        ),
        "Every number comes from the run's files. Plots are SVG (plotters' SVG backend); PNG is not rendered.".into(),
    ];
    // Which task features the router read (every calibration records it).
    let mut features: Vec<&str> = run
        .seeds
        .iter()
        .flat_map(|s| {
            s.first_calibration
                .iter()
                .chain(s.methods.values().flat_map(|m| &m.checkpoints))
        })
        .map(|c| c.features.as_str())
        .collect();
    features.sort_unstable();
    features.dedup();
    if !features.is_empty() {
        lines.push(format!(
            "Router task features: {} (text: the task's environment and instruction; metadata: also the generator's labels), from the calibration files",
            features.join(", ")
        ));
    }
    // Which sandbox the agent programs ran in (run.json's `external_sandbox`); a run whose
    // `auto` found none says so in bold, with the reason.
    for seed in &run.seeds {
        let Some(note) = seed
            .config
            .as_ref()
            .and_then(|c| c.get("external_sandbox"))
            .and_then(serde_json::Value::as_str)
        else {
            continue;
        };
        lines.push(if note.starts_with("none") {
            format!(
                "**Agent programs ran without a sandbox** in {}: {note}",
                seed.name()
            )
        } else {
            format!("Agent programs' sandbox in {}: {note}", seed.name())
        });
    }
    // Methods the run was configured with that left no training record (the main job skips a
    // method whose rescue needs more siblings than evolution kept).
    for seed in &run.seeds {
        let configured = seed
            .config
            .as_ref()
            .and_then(|c| c.pointer("/train/methods"))
            .and_then(serde_json::Value::as_array);
        let missing: Vec<&str> = configured
            .into_iter()
            .flatten()
            .filter_map(serde_json::Value::as_str)
            .filter(|m| !seed.methods.contains_key(*m))
            // A method that updates no weights has a test evaluation and no training run.
            .filter(|m| !seed.test.iter().flatten().any(|t| t.method == *m))
            .collect();
        if !missing.is_empty() {
            lines.push(format!(
                "Not trained in {}: {} (configured in run.json, no train/<method>/ record; the run log says why)",
                seed.name(),
                missing.join(", ")
            ));
        }
    }
    lines
}

fn markdown(run: &Run, tables: &[TextTable], figures: Option<&[Figure]>) -> String {
    let mut out = String::from("# Harness-S run report\n\n");
    for line in summary(run) {
        out.push_str(&format!("- {line}\n"));
    }
    out.push('\n');
    for t in tables {
        out.push_str(&t.to_markdown());
        out.push('\n');
    }
    if let Some(figures) = figures {
        out.push_str("## Figures\n\n");
        if figures.is_empty() {
            out.push_str("No figures: no update, eval or evolution records.\n");
        }
        for f in figures {
            out.push_str(&format!(
                "![{}]({})\n\n*{}*\n\n",
                f.caption,
                relative(run, &f.path),
                f.caption
            ));
        }
    }
    out
}

fn relative(run: &Run, path: &Path) -> String {
    path.strip_prefix(&run.dir)
        .unwrap_or(path)
        .to_string_lossy()
        .replace('\\', "/")
}

fn html(run: &Run, tables: &[TextTable], figures: &[Figure]) -> String {
    use render::html_escape as esc;
    let mut out = String::from(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>Harness-S run report</title>\n<style>\nbody { font-family: sans-serif; max-width: 1100px; margin: 2em auto; }\ntable { border-collapse: collapse; margin: 0.5em 0; }\nth, td { border: 1px solid #bbb; padding: 0.25em 0.6em; text-align: right; }\nth:first-child, td:first-child { text-align: left; }\n.notes { color: #555; font-size: 0.9em; }\nfigure img { max-width: 100%; }\n</style>\n</head>\n<body>\n<h1>Harness-S run report</h1>\n<ul>\n",
    );
    for line in summary(run) {
        out.push_str(&format!("<li>{}</li>\n", esc(&line)));
    }
    out.push_str("</ul>\n<h2>Tables</h2>\n");
    for t in tables {
        out.push_str(&t.to_html());
    }
    out.push_str("<h2>Figures</h2>\n");
    if figures.is_empty() {
        out.push_str("<p>No figures: no update, eval or evolution records.</p>\n");
    }
    for f in figures {
        out.push_str(&format!(
            "<figure>\n<img src=\"{}\" alt=\"{}\">\n<figcaption>{}</figcaption>\n</figure>\n",
            esc(&relative(run, &f.path)),
            esc(&f.caption),
            esc(&f.caption)
        ));
    }
    out.push_str("</body>\n</html>\n");
    out
}

/// The tables of the run in `out` as Markdown, for the terminal.
pub fn render_tables(out: &Path) -> Result<String> {
    let run = read_run(out)?;
    let text = tables(&run).to_text(run.seeds.len());
    Ok(markdown(&run, &text, None))
}

/// Write `report.md`, `report.html` and `plots/*.svg` into `out` (one seed's run, or
/// `seed-<s>/` folders, aggregated).
pub fn write_report(out: &Path) -> Result<ReportFiles> {
    let run = read_run(out)?;
    let text = tables(&run).to_text(run.seeds.len());
    let plots_dir = out.join(PLOTS_DIR);
    std::fs::create_dir_all(&plots_dir).map_err(|e| Error::io(&plots_dir, e))?;
    let mut figures = plots::write_figure3(&figure3(&run), &plots_dir)?;
    figures.extend(plots::write_figure4(&cross_harness(&run), &plots_dir)?);
    figures.extend(plots::write_diversity(&run, &plots_dir)?);
    let md_path = out.join(MARKDOWN_FILE);
    std::fs::write(&md_path, markdown(&run, &text, Some(&figures)))
        .map_err(|e| Error::io(&md_path, e))?;
    let html_path = out.join(HTML_FILE);
    std::fs::write(&html_path, html(&run, &text, &figures))
        .map_err(|e| Error::io(&html_path, e))?;
    Ok(ReportFiles {
        markdown: md_path,
        html: html_path,
        plots: figures.into_iter().map(|f| f.path).collect(),
    })
}

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
