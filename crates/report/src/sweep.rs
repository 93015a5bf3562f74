//! A sweep's report: one grid of cells (an organism variant x a rescue objective), each a
//! multi-seed run (`<cell>/seed-<s>/`), reported side by side.
//!
//! Per cell: every claimed direction of [`crate::directions`] over the cell's seeds, the H0 test
//! Avg@k of each trained method against plain GRPO (a paired bootstrap interval over seeds and
//! test tasks, [`crate::tables::directions::h0_avg_direction`]), and the rescue diagnostics
//! ([`crate::diagnostics`]). One plot shows each method's H0 Avg@k minus GRPO's across the grid,
//! with its interval.
//!
//! A cell of a non-paper rescue objective may train only the methods the objective changes; its
//! comparison methods (GRPO, GRPO with H0 rescue, the initial policy) are then read from a
//! reference cell's run of the same seed ([`with_reference`]), which the report names.

use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::layout::{EvalMode, Run};
use crate::render::TextTable;
use crate::stats::Stat;
use crate::tables::diagnostics::{Diagnostics, diagnostics};
use crate::tables::directions::{
    DirectionRow, Verdict, directions, directions_text, h0_avg_differences, h0_avg_direction,
    test_k,
};

/// The comparison method every cell's methods are set against.
pub const REFERENCE_METHOD: &str = "grpo";

/// One cell of the grid, as run.
#[derive(Debug, Clone)]
pub struct SweepCell {
    /// The organism variant's name (the sweep file's key).
    pub organism: String,
    /// The rescue objective.
    pub objective: String,
    /// The cell's folder (`seed-<s>/` inside).
    pub dir: PathBuf,
    /// The cell's seeds' runs (`None`: no seed finished).
    pub run: Option<Run>,
    /// Where methods the cell did not train were read from (empty: none borrowed).
    pub borrowed_from: Option<PathBuf>,
    /// The methods read from there ([`with_reference`]); they are compared in their own cell,
    /// not again in this one.
    pub borrowed_methods: Vec<String>,
    /// Seeds that failed or were refused, with the reason.
    pub failures: Vec<(u64, String)>,
}

/// One cell's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepCellReport {
    /// The organism variant.
    pub organism: String,
    /// The rescue objective.
    pub objective: String,
    /// The cell's folder.
    pub dir: PathBuf,
    /// Seeds with results.
    pub seeds: Vec<u64>,
    /// Each trained method's H0 Avg@k against GRPO's, with its interval.
    pub versus_grpo: Vec<DirectionRow>,
    /// For each row of `versus_grpo`, the mean of its paired differences (method minus GRPO
    /// per seed and test task), `None` without paired units.
    pub mean_differences: Vec<Option<f64>>,
    /// Every claimed direction on the cell.
    pub directions: Vec<DirectionRow>,
    /// Where borrowed comparison methods came from.
    pub borrowed_from: Option<PathBuf>,
    /// Seeds that failed or were refused, with the reason.
    pub failures: Vec<(u64, String)>,
}

/// A whole sweep's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepReport {
    /// The cells in grid order.
    pub cells: Vec<SweepCellReport>,
    /// The test `k` of the evaluations.
    pub k: usize,
}

/// Copy into `run` the methods `methods` (their test lines, training runs, behaviour and
/// diagnostics lines) from `reference`'s seed of the same number, where `run`'s seed lacks
/// them. Seeds without a counterpart are left as they are. Returns the methods whose test
/// lines were borrowed.
pub fn with_reference(run: &mut Run, reference: &Run, methods: &[&str]) -> Vec<String> {
    let mut borrowed: Vec<String> = Vec::new();
    for seed in &mut run.seeds {
        let Some(other) = reference.seeds.iter().find(|s| s.seed == seed.seed) else {
            continue;
        };
        for &m in methods {
            let has_test = seed.test.iter().flatten().any(|t| t.method == m);
            if !has_test && let Some(lines) = &other.test {
                let add: Vec<_> = lines.iter().filter(|t| t.method == m).cloned().collect();
                if !add.is_empty() && !borrowed.iter().any(|b| b == m) {
                    borrowed.push(m.to_string());
                }
                seed.test.get_or_insert_with(Vec::new).extend(add);
            }
            if !seed.methods.contains_key(m)
                && let Some(r) = other.methods.get(m)
            {
                seed.methods.insert(m.to_string(), r.clone());
            }
            let has_behaviour = seed.behaviour.iter().flatten().any(|b| b.method == m);
            if !has_behaviour && let Some(lines) = &other.behaviour {
                let add: Vec<_> = lines.iter().filter(|b| b.method == m).cloned().collect();
                seed.behaviour.get_or_insert_with(Vec::new).extend(add);
            }
            let has_diagnostics = seed.diagnostics.iter().flatten().any(|d| d.method == m);
            if !has_diagnostics && let Some(lines) = &other.diagnostics {
                let add: Vec<_> = lines.iter().filter(|d| d.method == m).cloned().collect();
                seed.diagnostics.get_or_insert_with(Vec::new).extend(add);
            }
        }
    }
    borrowed
}

/// The trained methods of `run` other than GRPO, the initial policy and `borrowed`, in the
/// run's order.
fn compared_methods(run: &Run, borrowed: &[String]) -> Vec<String> {
    run.methods()
        .into_iter()
        .filter(|m| m != REFERENCE_METHOD && m != "initial" && !borrowed.contains(m))
        .filter(|m| {
            run.seeds
                .iter()
                .any(|s| s.test_eval(m, EvalMode::H0).is_some())
        })
        .collect()
}

/// Compute every cell's results.
pub fn sweep_report(cells: &[SweepCell]) -> SweepReport {
    let mut k = None;
    let cells = cells
        .iter()
        .map(|cell| {
            let (seeds, versus_grpo, mean_differences, directions) = match &cell.run {
                Some(run) => {
                    k = k.or(Some(test_k(run)));
                    let methods = compared_methods(run, &cell.borrowed_methods);
                    (
                        run.seeds.iter().filter_map(|s| s.seed).collect(),
                        methods
                            .iter()
                            .map(|m| h0_avg_direction(run, m, REFERENCE_METHOD))
                            .collect(),
                        methods
                            .iter()
                            .map(|m| {
                                let d: Vec<f64> = h0_avg_differences(run, m, REFERENCE_METHOD)
                                    .into_iter()
                                    .flatten()
                                    .collect();
                                (!d.is_empty()).then(|| d.iter().sum::<f64>() / d.len() as f64)
                            })
                            .collect(),
                        directions(run),
                    )
                }
                None => (Vec::new(), Vec::new(), Vec::new(), Vec::new()),
            };
            SweepCellReport {
                organism: cell.organism.clone(),
                objective: cell.objective.clone(),
                dir: cell.dir.clone(),
                seeds,
                versus_grpo,
                mean_differences,
                directions,
                borrowed_from: cell.borrowed_from.clone(),
                failures: cell.failures.clone(),
            }
        })
        .collect();
    SweepReport {
        cells,
        k: k.unwrap_or(3),
    }
}

fn points(stat: Option<&Stat>) -> String {
    stat.map_or("—".into(), |s| match s.std {
        Some(std) => format!("{:.2} ± {:.2}", s.mean * 100.0, std * 100.0),
        None => format!("{:.2}", s.mean * 100.0),
    })
}

impl SweepReport {
    /// The grid table: one row per cell and compared method, its H0 Avg@k and GRPO's, the
    /// difference's interval and the verdict.
    pub fn grid_text(&self) -> TextTable {
        let mut rows = Vec::new();
        for cell in &self.cells {
            if cell.versus_grpo.is_empty() {
                rows.push(vec![
                    cell.organism.clone(),
                    cell.objective.clone(),
                    "—".into(),
                    "0".into(),
                    "—".into(),
                    "—".into(),
                    "—".into(),
                    failures_text(&cell.failures).unwrap_or_else(|| "not run".into()),
                ]);
            }
            for (row, diff) in cell.versus_grpo.iter().zip(&cell.mean_differences) {
                let interval = row.intervals.first().cloned().flatten();
                rows.push(vec![
                    cell.organism.clone(),
                    cell.objective.clone(),
                    row.compared[0].label.clone(),
                    row.seeds_compared.to_string(),
                    points(row.compared[0].value.as_ref()),
                    points(row.compared[1].value.as_ref()),
                    match (diff, interval) {
                        (Some(d), Some(i)) => format!(
                            "{:+.2} [{:+.2}, {:+.2}]",
                            d * 100.0,
                            i.low * 100.0,
                            i.high * 100.0
                        ),
                        _ => "no per-task data".into(),
                    },
                    {
                        let mut v = row.verdict.as_str().to_string();
                        if let Some(f) = failures_text(&cell.failures) {
                            v.push_str(&format!("; {f}"));
                        }
                        v
                    },
                ]);
            }
        }
        TextTable {
            title: format!(
                "Sweep: H0 test Avg@{} of each method against GRPO, per organism and rescue objective",
                self.k
            ),
            header: [
                "organism",
                "objective",
                "method",
                "seeds",
                "method Avg@k",
                "GRPO Avg@k",
                "difference [95% interval]",
                "verdict (method > GRPO)",
            ]
            .map(String::from)
            .to_vec(),
            rows,
            notes: vec![
                "Values in points (mean ± sample std over seeds); the difference is the mean of the paired differences (method minus GRPO on the same seed and test task), its interval a paired bootstrap over seeds and test tasks (4,000 replicates).".into(),
                "`holds`: the interval lies above zero; `does not hold`: below zero; `within noise`: it includes zero.".into(),
            ],
        }
    }

    /// The whole report as Markdown: the grid, then per cell its directions and diagnostics.
    pub fn to_markdown(&self, cells: &[SweepCell]) -> String {
        let mut out = String::from("# Sweep report\n\n");
        out.push_str(&self.grid_text().to_markdown());
        out.push_str("\n![H0 Avg@k minus GRPO across the grid](sweep_h0_vs_grpo.svg)\n");
        for (cell, input) in self.cells.iter().zip(cells) {
            out.push_str(&format!(
                "\n## {} / {} ({})\n\n",
                cell.organism,
                cell.objective,
                cell.dir.display()
            ));
            if let Some(from) = &cell.borrowed_from {
                out.push_str(&format!(
                    "GRPO, GRPO (H0 rescue) and the initial policy are read from `{}` (same organism and seeds; this objective changes only the sibling-rescue methods).\n\n",
                    from.display()
                ));
            }
            if let Some(f) = failures_text(&cell.failures) {
                out.push_str(&format!("{f}\n\n"));
            }
            let Some(run) = &input.run else {
                out.push_str("No seed finished.\n");
                continue;
            };
            out.push_str(&directions_text(&cell.directions, run.seeds.len()).to_markdown());
            let diag: Diagnostics = diagnostics(run);
            out.push('\n');
            out.push_str(&diag.credit_text().to_markdown());
            out.push('\n');
            out.push_str(&diag.signal_text().to_markdown());
            out.push('\n');
            out.push_str(&diag.lock_text().to_markdown());
        }
        out
    }
}

fn failures_text(failures: &[(u64, String)]) -> Option<String> {
    (!failures.is_empty()).then(|| {
        failures
            .iter()
            .map(|(s, why)| format!("seed {s} did not finish: {why}"))
            .collect::<Vec<_>>()
            .join("; ")
    })
}

/// The plot: per cell (x) each compared method's H0 Avg@k minus GRPO's in points (the mean
/// paired difference) with its interval as a bar, into `file` (SVG).
pub fn write_sweep_plot(report: &SweepReport, file: &Path) -> Result<()> {
    let err = |e: &dyn std::fmt::Display| Error::plot(file, e);
    let methods: Vec<String> = {
        let mut m: Vec<String> = Vec::new();
        for c in &report.cells {
            for r in &c.versus_grpo {
                if !m.contains(&r.compared[0].label) {
                    m.push(r.compared[0].label.clone());
                }
            }
        }
        m
    };
    let mut lo: f64 = -5.0;
    let mut hi: f64 = 5.0;
    for c in &report.cells {
        for r in &c.versus_grpo {
            if let Some(Some(i)) = r.intervals.first() {
                lo = lo.min(i.low * 100.0);
                hi = hi.max(i.high * 100.0);
            }
        }
    }
    let n = report.cells.len().max(1);
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (200 + 140 * n as u32, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!("H0 test Avg@{} minus GRPO (points, 95% interval)", report.k),
                ("sans-serif", 18),
            )
            .margin(12)
            .x_label_area_size(60)
            .y_label_area_size(50)
            .build_cartesian_2d(-0.5f64..n as f64 - 0.5, (lo - 2.0)..(hi + 2.0))
            .map_err(|e| err(&e))?;
        let names: Vec<String> = report
            .cells
            .iter()
            .map(|c| format!("{} / {}", c.organism, c.objective))
            .collect();
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(n)
            .x_label_formatter(&|x| {
                let i = x.round();
                if (x - i).abs() < 1e-6 && i >= 0.0 {
                    names.get(i as usize).cloned().unwrap_or_default()
                } else {
                    String::new()
                }
            })
            .y_desc("method minus GRPO (points)")
            .draw()
            .map_err(|e| err(&e))?;
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(-0.5, 0.0), (n as f64 - 0.5, 0.0)],
                BLACK.stroke_width(1),
            )))
            .map_err(|e| err(&e))?;
        let width = 0.6 / methods.len().max(1) as f64;
        for (mi, method) in methods.iter().enumerate() {
            let colour = crate::plots::COLOURS[mi % crate::plots::COLOURS.len()];
            let mut marks = Vec::new();
            let mut bars = Vec::new();
            for (ci, c) in report.cells.iter().enumerate() {
                let Some(at) = c
                    .versus_grpo
                    .iter()
                    .position(|r| &r.compared[0].label == method)
                else {
                    continue;
                };
                let (Some(Some(i)), Some(d)) = (
                    c.versus_grpo[at].intervals.first(),
                    c.mean_differences.get(at).copied().flatten(),
                ) else {
                    continue;
                };
                let x = ci as f64 - 0.3 + width * (mi as f64 + 0.5);
                marks.push(Circle::new((x, d * 100.0), 4, colour.filled()));
                bars.push(PathElement::new(
                    vec![(x, i.low * 100.0), (x, i.high * 100.0)],
                    colour.stroke_width(2),
                ));
            }
            chart.draw_series(bars).map_err(|e| err(&e))?;
            chart
                .draw_series(marks)
                .map_err(|e| err(&e))?
                .label(method.clone())
                .legend(move |(x, y)| Circle::new((x + 6, y), 4, colour.filled()));
        }
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperRight)
            .draw()
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    }
    std::fs::write(file, svg).map_err(|e| Error::io(file, e))
}

/// The verdict of a cell's Harness-S row against GRPO, if the cell has one.
pub fn harness_s_verdict(cell: &SweepCellReport) -> Option<Verdict> {
    cell.versus_grpo
        .iter()
        .find(|r| r.compared[0].label.starts_with("Harness-S"))
        .map(|r| r.verdict)
}
