//! `harness-s sweep --jobs N`: the sweep's unfinished cell-seeds in child processes of this
//! program, N at a time, each `harness-s sweep FILE --out ROOT --cell I --quiet`.
//!
//! A child runs one cell-seed and writes no report; this process waits for them all and writes
//! the report. Unless `RAYON_NUM_THREADS` is set, each child gets the cores divided by N, or
//! the cells' `policy.threads` where that is fewer (one for the embedded policy), for its
//! decoding and its training steps alike.

use std::collections::VecDeque;
use std::path::Path;
use std::process::{Child, Command};
use std::time::Duration;

use anyhow::{Context, Result};
use harness_pipeline::sweep::{CellRun, SweepConfig};

/// A failed cell-seed: organism, objective, seed and what went wrong.
pub type Failure = (String, String, u64, String);

/// Run every unfinished cell-seed of `sweep` in child processes, `jobs` at once, and return
/// the failures. A finished folder of another configuration stops it before any job starts.
pub fn run(file: &Path, sweep: &SweepConfig, jobs: usize) -> Result<Vec<Failure>> {
    let cells = sweep.cells(file)?;
    let total = cells.len();
    let mut queue = VecDeque::new();
    for (i, cell) in cells.iter().enumerate() {
        if !cell.is_finished()? {
            queue.push_back(i);
        }
    }
    let skipped = total - queue.len();
    let exe = std::env::current_exe().context("cannot find this program to start the jobs")?;
    let wanted = harness_pipeline::sweep::cpu_threads(&cells);
    let threads = std::env::var_os("RAYON_NUM_THREADS").is_none().then(|| {
        let cores = std::thread::available_parallelism().map_or(1, usize::from);
        let share = (cores / jobs).max(1);
        wanted.map_or(share, |n| n.min(share))
    });
    let mut running: Vec<(usize, Child)> = Vec::new();
    let mut failed = Vec::new();
    while !queue.is_empty() || !running.is_empty() {
        while running.len() < jobs
            && let Some(i) = queue.pop_front()
        {
            let mut cmd = Command::new(&exe);
            cmd.arg("sweep")
                .arg(file)
                .arg("--out")
                .arg(&sweep.out)
                .arg("--cell")
                .arg((i + 1).to_string())
                .arg("--quiet");
            if let Some(n) = threads {
                cmd.env("RAYON_NUM_THREADS", n.to_string());
            }
            match cmd.spawn() {
                Ok(child) => running.push((i, child)),
                Err(e) => failed.push(failure(&cells[i], format!("cannot start its job: {e}"))),
            }
        }
        std::thread::sleep(Duration::from_millis(200));
        let mut still = Vec::with_capacity(running.len());
        for (i, mut child) in running {
            match child.try_wait() {
                Ok(None) => still.push((i, child)),
                Ok(Some(status)) if status.success() => {}
                Ok(Some(status)) => failed.push(failure(
                    &cells[i],
                    format!("its job ({status}) failed; its error is printed above"),
                )),
                Err(e) => failed.push(failure(&cells[i], format!("cannot wait for its job: {e}"))),
            }
        }
        running = still;
    }
    println!(
        "sweep: {total} cell-seeds in {jobs} jobs at a time, {} failed, {skipped} already finished",
        failed.len()
    );
    Ok(failed)
}

fn failure(cell: &CellRun, message: String) -> Failure {
    (
        cell.organism.clone(),
        cell.objective.label().to_string(),
        cell.seed,
        message,
    )
}

/// An error naming every failed cell-seed, or `Ok` when none failed.
pub fn fail_on(failed: &[Failure]) -> Result<()> {
    if failed.is_empty() {
        return Ok(());
    }
    let lines: Vec<String> = failed
        .iter()
        .map(|(o, ob, s, e)| format!("{o} / {ob} / seed {s}: {e}"))
        .collect();
    anyhow::bail!("some cell-seeds failed:\n{}", lines.join("\n"))
}
