//! SVG pictures of the diversity views (Figures 1a, 1b and 5), drawn with `plotters`' SVG
//! backend.

use std::path::Path;

use plotters::prelude::*;

use crate::diversity::DiversityReport;
use crate::error::{Error, Result};

fn plot_err(file: &Path, e: impl std::fmt::Display) -> Error {
    Error::Plot {
        file: file.to_path_buf(),
        message: e.to_string(),
    }
}

fn write(file: &Path, svg: String) -> Result<()> {
    harness_core::fsutil::write_atomic(file, svg.as_bytes())?;
    Ok(())
}

fn short(name: &str) -> String {
    if name.chars().count() <= 18 {
        name.to_string()
    } else {
        format!("{}...", name.chars().take(16).collect::<String>())
    }
}

/// Figure 1a: repaired (up) and regressed (down) validation tasks per sibling against H0.
pub fn repaired_vs_regressed(report: &DiversityReport, file: &Path) -> Result<()> {
    let n = report.siblings.len().max(1);
    let top = report
        .siblings
        .iter()
        .map(|s| s.repaired.len())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let bottom = report
        .siblings
        .iter()
        .map(|s| s.regressed.len())
        .max()
        .unwrap_or(0)
        .max(1) as f64;
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (120 + 70 * n as u32, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_err(file, e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Repaired and regressed tasks vs H0 (Figure 1a)",
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(70)
            .y_label_area_size(40)
            .build_cartesian_2d(0f64..n as f64, -(bottom * 1.15)..(top * 1.15))
            .map_err(|e| plot_err(file, e))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc("tasks")
            .draw()
            .map_err(|e| plot_err(file, e))?;
        let bars = report.siblings.iter().enumerate().flat_map(|(i, s)| {
            let x = i as f64;
            [
                Rectangle::new(
                    [(x + 0.15, 0.0), (x + 0.85, s.repaired.len() as f64)],
                    GREEN.mix(0.7).filled(),
                ),
                Rectangle::new(
                    [(x + 0.15, 0.0), (x + 0.85, -(s.regressed.len() as f64))],
                    RED.mix(0.7).filled(),
                ),
            ]
        });
        chart.draw_series(bars).map_err(|e| plot_err(file, e))?;
        let labels = report.siblings.iter().enumerate().map(|(i, s)| {
            Text::new(
                format!("{} ({:+})", short(&s.name), s.delta_solved),
                (i as f64 + 0.1, -(bottom * 1.12)),
                ("sans-serif", 10).into_font(),
            )
        });
        chart.draw_series(labels).map_err(|e| plot_err(file, e))?;
        root.present().map_err(|e| plot_err(file, e))?;
    }
    write(file, svg)
}

/// Figure 1b: each sibling's success rate, the oracle union of one rollout per sibling, and
/// H0's pass@K at the same rollout count.
pub fn coverage(report: &DiversityReport, file: &Path) -> Result<()> {
    let tasks = report.tasks.max(1) as f64;
    let mut bars: Vec<(String, f64, RGBColor)> = report
        .siblings
        .iter()
        .map(|s| (short(&s.name), s.success_rate, RGBColor(90, 120, 200)))
        .collect();
    bars.push((
        "H0".into(),
        report.coverage.h0_solved as f64 / tasks,
        RGBColor(150, 150, 150),
    ));
    bars.push((
        format!("oracle union K={}", report.coverage.k),
        report.coverage.oracle_union as f64 / tasks,
        RGBColor(128, 60, 170),
    ));
    if let Some(p) = report.coverage.h0_pass_at_k {
        bars.push((
            format!("H0 pass@{}", report.coverage.k),
            p as f64 / tasks,
            RGBColor(240, 140, 40),
        ));
    }
    let n = bars.len();
    let mut svg = String::new();
    {
        let root =
            SVGBackend::with_string(&mut svg, (120 + 70 * n as u32, 420)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_err(file, e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                "Individual success, oracle union, H0 pass@K (Figure 1b)",
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(20)
            .y_label_area_size(40)
            .build_cartesian_2d(0f64..n as f64, -0.12f64..1.05)
            .map_err(|e| plot_err(file, e))?;
        chart
            .configure_mesh()
            .disable_x_mesh()
            .x_labels(0)
            .y_desc("success rate")
            .draw()
            .map_err(|e| plot_err(file, e))?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (_, v, c))| {
                Rectangle::new([(i as f64 + 0.15, 0.0), (i as f64 + 0.85, *v)], c.filled())
            }))
            .map_err(|e| plot_err(file, e))?;
        chart
            .draw_series(bars.iter().enumerate().map(|(i, (name, v, _))| {
                Text::new(
                    format!("{name} {:.0}%", v * 100.0),
                    (i as f64 + 0.05, -0.06),
                    ("sans-serif", 10).into_font(),
                )
            }))
            .map_err(|e| plot_err(file, e))?;
        root.present().map_err(|e| plot_err(file, e))?;
    }
    write(file, svg)
}

/// Figure 5: the directed overlap matrix, row sibling's repairs also supplied by the column
/// sibling, diagonal omitted.
pub fn overlap(report: &DiversityReport, file: &Path) -> Result<()> {
    let n = report.siblings.len().max(1);
    let side = (160 + 60 * n as u32).max(300);
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (side + 40, side)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| plot_err(file, e))?;
        let caption = match report.mean_overlap {
            Some(m) => format!("Shared repair coverage (Figure 5), mean {:.1}%", m * 100.0),
            None => "Shared repair coverage (Figure 5)".to_string(),
        };
        let mut chart = ChartBuilder::on(&root)
            .caption(caption, ("sans-serif", 16))
            .margin(10)
            .x_label_area_size(20)
            .y_label_area_size(110)
            .build_cartesian_2d(0f64..n as f64, n as f64..0f64)
            .map_err(|e| plot_err(file, e))?;
        chart
            .configure_mesh()
            .disable_mesh()
            .x_labels(0)
            .y_labels(0)
            .draw()
            .map_err(|e| plot_err(file, e))?;
        let cells = report.overlap.iter().enumerate().flat_map(|(i, row)| {
            row.iter().enumerate().map(move |(j, v)| {
                let colour = match v {
                    Some(v) => {
                        let shade = (255.0 - 200.0 * v) as u8;
                        RGBColor(shade, shade, 255)
                    }
                    None => RGBColor(235, 235, 235),
                };
                Rectangle::new(
                    [(j as f64, i as f64), (j as f64 + 1.0, i as f64 + 1.0)],
                    colour.filled(),
                )
            })
        });
        chart.draw_series(cells).map_err(|e| plot_err(file, e))?;
        let texts = report.overlap.iter().enumerate().flat_map(|(i, row)| {
            row.iter().enumerate().filter_map(move |(j, v)| {
                v.map(|v| {
                    Text::new(
                        format!("{:.0}%", v * 100.0),
                        (j as f64 + 0.25, i as f64 + 0.4),
                        ("sans-serif", 11).into_font(),
                    )
                })
            })
        });
        chart.draw_series(texts).map_err(|e| plot_err(file, e))?;
        let names = report.siblings.iter().enumerate().map(|(i, s)| {
            Text::new(
                short(&s.name),
                (-1.6, i as f64 + 0.4),
                ("sans-serif", 10).into_font(),
            )
        });
        chart.draw_series(names).map_err(|e| plot_err(file, e))?;
        root.present().map_err(|e| plot_err(file, e))?;
    }
    write(file, svg)
}
