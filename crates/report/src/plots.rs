//! The plots, as SVG only (plotters' SVG backend; no PNG is rendered, so no font or image
//! crates): Figure 3's three panels, one line per method over updates, and the evolution's
//! diversity views (Figures 1a, 1b and 5), redrawn from `evolve/diversity.json` with
//! harness-evolve's own plot functions, or copied from the SVGs evolution drew.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::layout::{EVOLVE_SVGS, Run};
use crate::stats::mean;

/// One line of a panel.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// The legend entry.
    pub label: String,
    /// `(update, value)`, by update; with several seeds, the mean over the seeds that have the
    /// update.
    pub points: Vec<(u64, f64)>,
    /// Drawn as the secondary line of its method: thin with crosses (Pass@k beside Avg@k).
    pub dashed: bool,
}

/// Figure 3's panels as data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure3 {
    /// (a) `eg_rate` per update.
    pub eg_rate: Vec<Series>,
    /// (b) `effective_token_share` per update.
    pub effective_token_share: Vec<Series>,
    /// (c) validation under H0: the eval records' `avg_at_k` (thick) and `pass_at_k` (thin)
    /// by the updates applied before them.
    pub validation: Vec<Series>,
}

fn mean_by_update(points: impl IntoIterator<Item = (u64, f64)>) -> Vec<(u64, f64)> {
    let mut by: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for (u, v) in points {
        by.entry(u).or_default().push(v);
    }
    by.into_iter()
        .filter_map(|(u, v)| mean(v).map(|m| (u, m)))
        .collect()
}

/// Figure 3 from every trained method's `metrics.jsonl`.
pub fn figure3(run: &Run) -> Figure3 {
    let mut fig = Figure3 {
        eg_rate: Vec::new(),
        effective_token_share: Vec::new(),
        validation: Vec::new(),
    };
    for m in run.methods() {
        let runs: Vec<_> = run.seeds.iter().filter_map(|s| s.methods.get(&m)).collect();
        if runs.is_empty() {
            continue;
        }
        let label = run.label(&m);
        let updates = |f: fn(&harness_rollout::UpdateRecord) -> f64| {
            mean_by_update(
                runs.iter()
                    .flat_map(|r| r.updates.iter().map(move |u| (u.update, f(u)))),
            )
        };
        let evals = |f: fn(&harness_rollout::EvalRecord) -> f64| {
            mean_by_update(
                runs.iter()
                    .flat_map(|r| r.evals.iter().map(move |e| (e.update, f(e)))),
            )
        };
        let push = |v: &mut Vec<Series>, label: String, points: Vec<(u64, f64)>, dashed| {
            if !points.is_empty() {
                v.push(Series {
                    label,
                    points,
                    dashed,
                });
            }
        };
        push(
            &mut fig.eg_rate,
            label.clone(),
            updates(|u| u.eg_rate),
            false,
        );
        push(
            &mut fig.effective_token_share,
            label.clone(),
            updates(|u| u.effective_token_share),
            false,
        );
        let k = runs
            .iter()
            .flat_map(|r| r.evals.first())
            .map(|e| e.k)
            .next()
            .unwrap_or(3);
        push(
            &mut fig.validation,
            format!("{label} Avg@{k}"),
            evals(|e| e.avg_at_k),
            false,
        );
        push(
            &mut fig.validation,
            format!("{label} Pass@{k}"),
            evals(|e| e.pass_at_k),
            true,
        );
    }
    fig
}

/// The plots' colour cycle.
pub(crate) const COLOURS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
];

/// Draw `series` as lines of a fraction (0..1) over updates into `file`.
pub fn line_plot(file: &Path, title: &str, y_desc: &str, series: &[Series]) -> Result<()> {
    let max_x = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .max()
        .unwrap_or(1)
        .max(1);
    let err = |e: &dyn std::fmt::Display| Error::plot(file, e);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (720, 440)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..max_x as f64, 0f64..1.05)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc("update")
            .y_desc(y_desc)
            .draw()
            .map_err(|e| err(&e))?;
        // Dashed series share their solid sibling's colour (same method).
        let mut colour_of: BTreeMap<String, RGBColor> = BTreeMap::new();
        for s in series {
            let key = s
                .label
                .rsplit_once(' ')
                .filter(|_| s.label.contains('@'))
                .map_or(s.label.clone(), |(m, _)| m.to_string());
            let next = COLOURS[colour_of.len() % COLOURS.len()];
            let colour = *colour_of.entry(key).or_insert(next);
            let points: Vec<(f64, f64)> = s.points.iter().map(|(u, v)| (*u as f64, *v)).collect();
            // Lines are drawn as path elements: plotters' `line_series` feature is left off
            // (the workspace keeps plotters to its SVG backend). Pass@k is the thin line with
            // crosses, Avg@k the thick line with dots.
            let width = if s.dashed { 1 } else { 2 };
            chart
                .draw_series(std::iter::once(PathElement::new(
                    points.clone(),
                    colour.stroke_width(width),
                )))
                .map_err(|e| err(&e))?
                .label(s.label.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], colour.stroke_width(width))
                });
            if s.dashed {
                chart
                    .draw_series(
                        points
                            .iter()
                            .map(|p| Cross::new(*p, 3, colour.stroke_width(1))),
                    )
                    .map_err(|e| err(&e))?;
            } else {
                chart
                    .draw_series(points.iter().map(|p| Circle::new(*p, 2, colour.filled())))
                    .map_err(|e| err(&e))?;
            }
        }
        if !series.is_empty() {
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(SeriesLabelPosition::LowerRight)
                .draw()
                .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    std::fs::write(file, svg).map_err(|e| Error::io(file, e))
}

/// A picture the report shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Figure {
    /// Its caption.
    pub caption: String,
    /// The SVG file, under `plots/`.
    pub path: PathBuf,
}

/// Draw Figure 3's panels into `plots`; a panel without data is skipped.
pub fn write_figure3(fig: &Figure3, plots: &Path) -> Result<Vec<Figure>> {
    let mut out = Vec::new();
    for (name, caption, y, series) in [
        (
            "figure3a_eg_rate.svg",
            "Figure 3a. Effective-group (EG) rate per update",
            "EG rate",
            &fig.eg_rate,
        ),
        (
            "figure3b_effective_token_share.svg",
            "Figure 3b. Effective training-token share per update",
            "effective token share",
            &fig.effective_token_share,
        ),
        (
            "figure3c_validation.svg",
            "Figure 3c. Validation success under H0 (Avg@k thick, Pass@k thin with crosses)",
            "validation success",
            &fig.validation,
        ),
    ] {
        if series.is_empty() {
            continue;
        }
        let path = plots.join(name);
        line_plot(&path, caption, y, series)?;
        out.push(Figure {
            caption: caption.into(),
            path,
        });
    }
    Ok(out)
}

/// The diversity views of the shared evolution and of every seed's into `plots` (a seed's
/// suffixed `-seed-<s>` when there are several seeds): redrawn from `diversity.json` when present, else copied from the SVGs
/// evolution wrote.
pub fn write_diversity(run: &Run, plots: &Path) -> Result<Vec<Figure>> {
    let captions = [
        "Figure 1a. Repaired and regressed validation tasks per sibling vs H0",
        "Figure 1b. Individual success, oracle union and H0 pass@K",
        "Figure 5. Shared repair coverage (directed overlap)",
    ];
    let mut out = Vec::new();
    let several = run.seeds.len() > 1 || run.shared_evolve.is_some();
    let shared = run
        .shared_evolve
        .as_ref()
        .map(|e| (String::new(), String::new(), e));
    let per_seed = run.seeds.iter().enumerate().filter_map(|(i, seed)| {
        let evolve = seed.evolve.as_ref()?;
        Some(if several {
            (
                format!("-seed-{}", seed.seed.unwrap_or(i as u64)),
                format!(" ({})", seed.name()),
                evolve,
            )
        } else {
            (String::new(), String::new(), evolve)
        })
    });
    type Draw = fn(&harness_evolve::DiversityReport, &Path) -> harness_evolve::Result<()>;
    let draws: [Draw; 3] = [
        harness_evolve::plot::repaired_vs_regressed,
        harness_evolve::plot::coverage,
        harness_evolve::plot::overlap,
    ];
    for (suffix, of_seed, evolve) in shared.into_iter().chain(per_seed) {
        for ((name, caption), draw) in EVOLVE_SVGS.iter().zip(captions).zip(draws) {
            let stem = name.trim_end_matches(".svg");
            let path = plots.join(format!("{stem}{suffix}.svg"));
            if let Some(d) = &evolve.diversity {
                draw(d, &path).map_err(|e| Error::plot(&path, e))?;
            } else {
                let src = evolve.dir.join(name);
                if !src.is_file() {
                    continue;
                }
                std::fs::copy(&src, &path).map_err(|e| Error::io(&src, e))?;
            }
            out.push(Figure {
                caption: format!("{caption}{of_seed}"),
                path,
            });
        }
    }
    Ok(out)
}

/// Figure 4's view: one group of bars per harness (H0, then each unseen harness), one bar per
/// method (its Pass@k, the mean over seeds), into `plots/figure4_cross_harness.svg`; nothing
/// without cross-harness evaluations.
pub fn write_figure4(table: &crate::CrossTable, plots: &Path) -> Result<Vec<Figure>> {
    if table.rows.is_empty() {
        return Ok(Vec::new());
    }
    let caption = format!(
        "Figure 4. Test Pass@{} under H0 and under harnesses outside the training pool",
        table.k
    );
    let file = plots.join("figure4_cross_harness.svg");
    let groups: Vec<String> = std::iter::once("H0".to_string())
        .chain(table.harnesses.iter().cloned())
        .collect();
    let n = table.rows.len();
    let err = |e: &dyn std::fmt::Display| Error::plot(&file, e);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (860, 480)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(&caption, ("sans-serif", 18))
            .margin(12)
            .x_label_area_size(10)
            .y_label_area_size(50)
            .build_cartesian_2d(0f64..groups.len() as f64, -0.1f64..1.05)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .disable_x_axis()
            .y_desc(format!("Pass@{}", table.k))
            .draw()
            .map_err(|e| err(&e))?;
        for (g, name) in groups.iter().enumerate() {
            chart
                .draw_series(std::iter::once(Text::new(
                    name.clone(),
                    (g as f64 + 0.05, -0.06),
                    ("sans-serif", 12),
                )))
                .map_err(|e| err(&e))?;
        }
        let width = 0.8 / n as f64;
        for (i, row) in table.rows.iter().enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let cells = std::iter::once(&row.h0).chain(row.unseen.iter());
            let bars: Vec<Rectangle<(f64, f64)>> = cells
                .enumerate()
                .filter_map(|(g, c)| {
                    let v = c.as_ref()?.pass.mean;
                    let x0 = g as f64 + 0.1 + i as f64 * width;
                    Some(Rectangle::new(
                        [(x0, 0.0), (x0 + width, v)],
                        colour.filled(),
                    ))
                })
                .collect();
            chart
                .draw_series(bars)
                .map_err(|e| err(&e))?
                .label(row.label.clone())
                .legend(move |(x, y)| {
                    Rectangle::new([(x, y - 5), (x + 12, y + 5)], colour.filled())
                });
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
    std::fs::write(&file, svg).map_err(|e| Error::io(&file, e))?;
    Ok(vec![Figure {
        caption,
        path: file,
    }])
}
