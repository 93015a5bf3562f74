//! Stage 5: the report (harness-report): the paper-shaped tables and plots of every seed of
//! the run, made only from its files.

use crate::config::RunConfig;
use crate::error::{Result, StageExt};

/// Write `report.md`, `report.html` and `plots/` for the run in `cfg.out` (every seed).
pub fn write_report(cfg: &RunConfig) -> Result<Vec<std::path::PathBuf>> {
    let written = harness_report::write_report(&cfg.out).at("report")?;
    let mut files = vec![written.markdown, written.html];
    files.extend(written.plots);
    Ok(files)
}

/// The paper-shaped tables of the run in `cfg.out`, as text for the terminal.
pub fn render_tables(cfg: &RunConfig) -> Result<String> {
    harness_report::render_tables(&cfg.out).at("report")
}
