//! A sweep: the main job over a grid of organism variants x rescue objectives x seeds, each
//! cell-seed its own run folder under one root, resumable, with one report
//! ([`harness_report::sweep`]).
//!
//! The sweep file (TOML) gives the grid:
//!
//! ```toml
//! out = "runs/sweep"                  # the root; cells go to <out>/<organism>/<objective>/seed-<s>
//! # config = "my-run.toml"            # the run configuration every cell starts from (default: the quick preset)
//! seeds = [42, 43, 44, 45, 46]
//! methods = ["grpo", "h0_rescue", "harness_s"]   # trained in the cells of the paper's objective
//! objectives = ["generating", "masked", "h0"]    # train.rescue_objective per cell
//! objective_methods = ["harness_s"]              # retrained in the cells of the other objectives
//!
//! [set]                               # settings of every cell, by dotted path (TOML values)
//! "evolve.source" = "builtin"
//!
//! [[organism]]
//! name = "recovery_hooks"
//! set = { "policy.warm_start.organism" = "recovery_hooks" }
//!
//! [[organism]]
//! name = "prompt_rules_u0"
//! set = { "policy.warm_start.organism" = "prompt_rules", "policy.warm_start.unprompted_good_rate" = 0.0 }
//! ```
//!
//! A cell of another objective than the paper's trains only `objective_methods` (an objective
//! changes nothing for a method that never rescues with a sibling); the report reads GRPO, GRPO
//! with H0 rescue and the initial policy from the organism's `generating` cell of the same seed
//! and says so. A cell-seed that finished writes `sweep-cell.json` (its configuration and wall
//! time) and is not run again; an unfinished one continues where it stopped (the main job
//! resumes its stages). Every seed of an organism starts from one warm start, that of the first
//! seed (or of `policy.warm_start.seed`), as the main job's seeds do; it is cached per organism
//! under `policy.cache_dir`. A
//! cell-seed that fails (an objective a pool cannot run, say) is recorded with its error and the
//! sweep goes on; the command then exits with an error naming every failure.

use std::path::{Path, PathBuf};
use std::time::Instant;

use harness_core::RescueObjective;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::{Method, Preset, RunConfig};
use crate::error::{Error, Result};
use crate::methods::StrategyKind;
use crate::setup::{Progress, Secrets};

/// The marker a finished cell-seed writes into its folder.
pub const CELL_FILE: &str = "sweep-cell.json";
/// The sweep's Markdown report, under its root.
pub const REPORT_FILE: &str = "sweep.md";
/// The sweep's results as JSON, under its root.
pub const JSON_FILE: &str = "sweep.json";
/// The sweep's plot, under its root.
pub const PLOT_FILE: &str = "sweep_h0_vs_grpo.svg";

/// Methods the report borrows from the paper objective's cell when a cell lacks them.
const BORROWED: [&str; 3] = ["grpo", "h0_rescue", "initial"];

/// One organism variant of the grid.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct OrganismSpec {
    /// Its name (a folder name: letters, digits, `_` and `-`).
    pub name: String,
    /// Settings by dotted path, applied after the sweep's `set`.
    #[serde(default)]
    pub set: toml::Table,
}

/// A sweep file.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct SweepConfig {
    /// The root folder.
    pub out: PathBuf,
    /// The run configuration every cell starts from (relative to the sweep file).
    #[serde(default)]
    pub config: Option<PathBuf>,
    /// The preset the cells start from without `config` (default quick).
    #[serde(default)]
    pub preset: Option<String>,
    /// The seeds of every cell.
    pub seeds: Vec<u64>,
    /// Methods trained in the cells of the paper's objective.
    #[serde(default = "default_methods")]
    pub methods: Vec<String>,
    /// The rescue objectives of the grid.
    #[serde(default = "default_objectives")]
    pub objectives: Vec<String>,
    /// Methods retrained in the cells of the other objectives.
    #[serde(default = "default_objective_methods")]
    pub objective_methods: Vec<String>,
    /// Settings of every cell, by dotted path.
    #[serde(default)]
    pub set: toml::Table,
    /// The organism variants.
    #[serde(default)]
    pub organism: Vec<OrganismSpec>,
}

fn default_methods() -> Vec<String> {
    ["grpo", "h0_rescue", "harness_s"]
        .map(String::from)
        .to_vec()
}

fn default_objectives() -> Vec<String> {
    vec!["generating".into()]
}

fn default_objective_methods() -> Vec<String> {
    vec!["harness_s".into()]
}

/// One cell-seed to run.
#[derive(Debug, Clone)]
pub struct CellRun {
    /// The organism variant's name.
    pub organism: String,
    /// The rescue objective.
    pub objective: RescueObjective,
    /// The seed.
    pub seed: u64,
    /// Its run configuration (`out` is its folder).
    pub config: RunConfig,
}

/// What a finished cell-seed wrote.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CellRecord {
    /// The organism variant.
    pub organism: String,
    /// The rescue objective.
    pub objective: String,
    /// The seed.
    pub seed: u64,
    /// Wall seconds of the main job on this cell-seed (this process's share when resumed).
    pub seconds: f64,
    /// The run configuration, as written to `run.json`.
    pub config: Value,
}

/// A cell-seed's folder under the sweep root `root`.
fn cell_dir(root: &Path, organism: &str, objective: RescueObjective, seed: u64) -> PathBuf {
    root.join(organism)
        .join(objective.label())
        .join(format!("seed-{seed}"))
}

/// Whether `method`'s training depends on the rescue objective (it rescues with siblings).
fn objective_sensitive(method: Method) -> bool {
    matches!(
        method.spec().strategy,
        StrategyKind::RandomHarness | StrategyKind::Router { .. } | StrategyKind::Mixture { .. }
    )
}

fn objective_of(name: &str) -> Option<RescueObjective> {
    RescueObjective::ALL.into_iter().find(|o| o.label() == name)
}

fn toml_text(value: &toml::Value) -> String {
    match value {
        toml::Value::Table(t) => {
            let inner: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{} = {}", toml::Value::String(k.clone()), toml_text(v)))
                .collect();
            format!("{{ {} }}", inner.join(", "))
        }
        other => other.to_string(),
    }
}

impl SweepConfig {
    /// Read and check a sweep file; relative paths in it are taken from the file's folder.
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::Config {
            file: path.to_path_buf(),
            field: String::new(),
            message: format!("cannot read the sweep file: {e}"),
        })?;
        let mut cfg: SweepConfig = toml::from_str(&text).map_err(|e| Error::Config {
            file: path.to_path_buf(),
            field: String::new(),
            message: format!("not a sweep file: {}", e.message()),
        })?;
        let dir = path.parent().unwrap_or(Path::new("."));
        if let Some(c) = &cfg.config
            && c.is_relative()
        {
            cfg.config = Some(dir.join(c));
        }
        cfg.cells(path)?;
        Ok(cfg)
    }

    /// Every cell-seed of the grid in order (organisms, then objectives, then seeds), each
    /// with its validated run configuration. `file` names the sweep file in errors.
    pub fn cells(&self, file: &Path) -> Result<Vec<CellRun>> {
        let bad = |field: &str, message: String| Error::Config {
            file: file.to_path_buf(),
            field: field.to_string(),
            message,
        };
        if self.seeds.is_empty() {
            return Err(bad("seeds", "expected at least one seed".into()));
        }
        let mut seen = self.seeds.clone();
        seen.sort_unstable();
        seen.dedup();
        if seen.len() != self.seeds.len() {
            return Err(bad("seeds", "a seed is listed twice".into()));
        }
        if self.organism.is_empty() {
            return Err(bad(
                "organism",
                "expected at least one [[organism]] with a name".into(),
            ));
        }
        for (i, o) in self.organism.iter().enumerate() {
            let ok = !o.name.is_empty()
                && o.name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !ok {
                return Err(bad(
                    &format!("organism[{i}].name"),
                    format!(
                        "`{}`: expected a folder name of letters, digits, `_` and `-`",
                        o.name
                    ),
                ));
            }
            if self.organism[..i].iter().any(|p| p.name == o.name) {
                return Err(bad(
                    &format!("organism[{i}].name"),
                    format!("`{}` is listed twice", o.name),
                ));
            }
        }
        let methods = |field: &str, names: &[String]| -> Result<Vec<Method>> {
            if names.is_empty() {
                return Err(bad(field, "expected at least one method".into()));
            }
            names
                .iter()
                .map(|n| {
                    Method::parse(n).ok_or_else(|| {
                        bad(field, format!("`{n}`: expected one of {}", Method::names()))
                    })
                })
                .collect()
        };
        let paper_methods = methods("methods", &self.methods)?;
        let other_methods = methods("objective_methods", &self.objective_methods)?;
        if let Some(m) = other_methods.iter().find(|m| !objective_sensitive(**m)) {
            return Err(bad(
                "objective_methods",
                format!(
                    "`{}` never rescues with a sibling, so the rescue objective changes nothing for it: expected sibling-rescue methods (harness_s, harness_s_fixed, random_harness, rule_router, router_4x2, the mixtures)",
                    m.name()
                ),
            ));
        }
        if self.objectives.is_empty() {
            return Err(bad("objectives", "expected at least one objective".into()));
        }
        let mut objectives = Vec::new();
        for name in &self.objectives {
            let o = objective_of(name).ok_or_else(|| {
                bad(
                    "objectives",
                    format!("`{name}`: expected generating, masked or h0"),
                )
            })?;
            if objectives.contains(&o) {
                return Err(bad("objectives", format!("`{name}` is listed twice")));
            }
            objectives.push(o);
        }
        let preset = self
            .preset
            .as_deref()
            .map(str::parse::<Preset>)
            .transpose()
            .map_err(|e| bad("preset", e.to_string()))?;
        let base = RunConfig::load_with_preset(self.config.as_deref(), preset)?;
        let mut out = Vec::new();
        for (oi, organism) in self.organism.iter().enumerate() {
            for &objective in &objectives {
                let methods = if objective.is_paper() {
                    &paper_methods
                } else {
                    &other_methods
                };
                for &seed in &self.seeds {
                    let mut cfg = base.clone();
                    for (path, value) in &self.set {
                        cfg.set(path, &toml_text(value))
                            .map_err(|e| bad(&format!("set.\"{path}\""), e.to_string()))?;
                    }
                    for (path, value) in &organism.set {
                        cfg.set(path, &toml_text(value)).map_err(|e| {
                            bad(&format!("organism[{oi}].set.\"{path}\""), e.to_string())
                        })?;
                    }
                    // Every seed starts from the warm start of the first seed (or of
                    // `policy.warm_start.seed`), as the main job's seeds do.
                    cfg.seed = self.seeds[0];
                    let mut cfg = cfg.with_seed(seed);
                    cfg.out = cell_dir(&self.out, &organism.name, objective, seed);
                    cfg.train.methods = methods.clone();
                    cfg.train.rescue_objective = objective;
                    let checked = cfg.validate(None).and_then(|()| {
                        if cfg.env.name == "default" {
                            crate::organism::settings(&cfg).map(|_| ())
                        } else {
                            Ok(())
                        }
                    });
                    checked.map_err(|e| {
                        bad(
                            &format!("organism[{oi}]"),
                            format!(
                                "the cell {} / {} does not make a valid run configuration: {e}",
                                organism.name,
                                objective.label()
                            ),
                        )
                    })?;
                    out.push(CellRun {
                        organism: organism.name.clone(),
                        objective,
                        seed,
                        config: cfg,
                    });
                }
            }
        }
        Ok(out)
    }
}

/// The record of a finished cell-seed in `dir`, if it finished.
pub fn finished(dir: &Path) -> Result<Option<CellRecord>> {
    let path = dir.join(CELL_FILE);
    if !path.is_file() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::input("sweep", &path, format!("cannot read: {e}")))?;
    serde_json::from_str(&text)
        .map(Some)
        .map_err(|e| Error::input("sweep", &path, format!("not a cell record: {e}")))
}

/// What [`run_sweep`] did.
#[derive(Debug, Clone)]
pub struct SweepOutcome {
    /// Cell-seeds run now (organism, objective, seed, seconds).
    pub ran: Vec<(String, String, u64, f64)>,
    /// Cell-seeds found finished.
    pub skipped: usize,
    /// Cell-seeds that failed, with the error.
    pub failed: Vec<(String, String, u64, String)>,
    /// The report's files.
    pub files: Vec<PathBuf>,
}

/// What became of one cell-seed in [`run_cell`].
#[derive(Debug, Clone, PartialEq)]
pub enum CellOutcome {
    /// It had finished before: not run again.
    Skipped,
    /// It ran now and finished in these seconds.
    Ran(f64),
    /// It ran now and failed with this error.
    Failed(String),
}

impl CellRun {
    /// Whether this cell-seed has finished: its folder holds a cell record of this
    /// configuration. A record of another configuration is an error.
    pub fn is_finished(&self) -> Result<bool> {
        let dir = &self.config.out;
        let Some(record) = finished(dir)? else {
            return Ok(false);
        };
        let expected = serde_json::to_value(&self.config).unwrap_or(Value::Null);
        if crate::comparable(record.config) != crate::comparable(expected) {
            return Err(Error::input(
                "sweep",
                dir.join(CELL_FILE),
                "this folder holds a finished run of another configuration: move it away or give the sweep another `out`",
            ));
        }
        Ok(true)
    }
}

/// The CPU threads of a process that runs `cells` one after another: their
/// [`PolicyConfig::cpu_threads`](crate::config::PolicyConfig::cpu_threads) where they all
/// agree, else `None` (every core).
pub fn cpu_threads(cells: &[CellRun]) -> Option<usize> {
    let (first, rest) = cells.split_first()?;
    let threads = first.config.policy.cpu_threads();
    rest.iter()
        .all(|c| c.config.policy.cpu_threads() == threads)
        .then_some(threads)?
}

/// Run the cell-seed at `index` of `sweep`'s grid (0-based, in [`SweepConfig::cells`]'s
/// order) unless it has finished ([`CellRun::is_finished`]); writes its `sweep-cell.json` when
/// it finishes, no report. Cell-seeds share nothing but the warm-start cache (whose folders
/// appear atomically), so separate processes may run different indices of one sweep at once
/// (`harness-s sweep --jobs`).
pub async fn run_cell(
    sweep: &SweepConfig,
    file: &Path,
    index: usize,
    secrets: &Secrets,
    progress: &Progress,
) -> Result<CellOutcome> {
    let cells = sweep.cells(file)?;
    let cell = cells.get(index).ok_or_else(|| {
        Error::input(
            "sweep",
            file,
            format!(
                "there is no cell-seed {} in a grid of {}",
                index + 1,
                cells.len()
            ),
        )
    })?;
    run_one(cell, index, cells.len(), secrets, progress).await
}

/// [`run_cell`] on a cell-seed of the grid: `index` and `total` are for the progress lines.
async fn run_one(
    cell: &CellRun,
    index: usize,
    total: usize,
    secrets: &Secrets,
    progress: &Progress,
) -> Result<CellOutcome> {
    if cell.is_finished()? {
        return Ok(CellOutcome::Skipped);
    }
    let dir = &cell.config.out;
    progress.println(format!(
        "sweep {}/{total}: {} / {} / seed {} -> {}",
        index + 1,
        cell.organism,
        cell.objective.label(),
        cell.seed,
        dir.display()
    ));
    let started = Instant::now();
    match crate::run_main_job(&cell.config, secrets, progress).await {
        Ok(_) => {
            let record = CellRecord {
                organism: cell.organism.clone(),
                objective: cell.objective.label().into(),
                seed: cell.seed,
                seconds: started.elapsed().as_secs_f64(),
                config: serde_json::to_value(&cell.config).unwrap_or(Value::Null),
            };
            let path = dir.join(CELL_FILE);
            let text = serde_json::to_string_pretty(&record).unwrap_or_default();
            harness_core::fsutil::write_atomic(&path, text.as_bytes())
                .map_err(|e| Error::input("sweep", &path, format!("cannot write: {e}")))?;
            progress.println(format!(
                "sweep {}/{total}: finished in {:.0}s",
                index + 1,
                record.seconds
            ));
            Ok(CellOutcome::Ran(record.seconds))
        }
        Err(e) => {
            progress.println(format!("sweep {}/{total}: failed: {e}", index + 1));
            Ok(CellOutcome::Failed(e.to_string()))
        }
    }
}

/// Run every cell-seed of `sweep` that has not finished, one after another, then write the
/// report. `file` names the sweep file in errors.
pub async fn run_sweep(
    sweep: &SweepConfig,
    file: &Path,
    secrets: &Secrets,
    progress: &Progress,
) -> Result<SweepOutcome> {
    let cells = sweep.cells(file)?;
    let mut outcome = SweepOutcome {
        ran: Vec::new(),
        skipped: 0,
        failed: Vec::new(),
        files: Vec::new(),
    };
    for (i, cell) in cells.iter().enumerate() {
        let objective = cell.objective.label().to_string();
        match run_one(cell, i, cells.len(), secrets, progress).await? {
            CellOutcome::Skipped => outcome.skipped += 1,
            CellOutcome::Ran(seconds) => {
                outcome
                    .ran
                    .push((cell.organism.clone(), objective, cell.seed, seconds))
            }
            CellOutcome::Failed(e) => {
                outcome
                    .failed
                    .push((cell.organism.clone(), objective, cell.seed, e))
            }
        }
    }
    outcome.files = write_sweep_report(sweep, file, &outcome.failed)?;
    Ok(outcome)
}

/// The cells of `sweep` as the report reads them: each cell's finished seeds, with the
/// comparison methods borrowed from the paper objective's cell where a cell lacks them; and
/// the record of every finished cell-seed, in grid order.
pub fn read_cells(
    sweep: &SweepConfig,
    file: &Path,
    failed: &[(String, String, u64, String)],
) -> Result<(Vec<harness_report::sweep::SweepCell>, Vec<CellRecord>)> {
    let cells = sweep.cells(file)?;
    let mut records = Vec::new();
    let mut out: Vec<harness_report::sweep::SweepCell> = Vec::new();
    for cell in &cells {
        let dir = cell
            .config
            .out
            .parent()
            .unwrap_or(Path::new("."))
            .to_path_buf();
        let entry = match out.iter_mut().find(|c| c.dir == dir) {
            Some(e) => e,
            None => {
                out.push(harness_report::sweep::SweepCell {
                    organism: cell.organism.clone(),
                    objective: cell.objective.label().into(),
                    dir: dir.clone(),
                    run: None,
                    borrowed_from: None,
                    borrowed_methods: Vec::new(),
                    failures: Vec::new(),
                });
                out.last_mut()
                    .unwrap_or_else(|| unreachable!("just pushed"))
            }
        };
        if let Some((.., why)) = failed.iter().find(|(o, ob, s, _)| {
            *o == cell.organism && ob == cell.objective.label() && *s == cell.seed
        }) {
            entry.failures.push((cell.seed, why.clone()));
        }
        let Some(record) = finished(&cell.config.out)? else {
            continue;
        };
        records.push(record);
        let seed_run =
            harness_report::read_run(&cell.config.out).map_err(|e| Error::stage("sweep", e))?;
        let run = entry.run.get_or_insert_with(|| harness_report::Run {
            dir: dir.clone(),
            seeds: Vec::new(),
            shared_evolve: None,
        });
        run.seeds.extend(seed_run.seeds);
    }
    // Borrow the comparison methods from the paper objective's cell of the same organism.
    let references: Vec<(String, PathBuf, Option<harness_report::Run>)> = out
        .iter()
        .filter(|c| c.objective == RescueObjective::Generating.label())
        .map(|c| (c.organism.clone(), c.dir.clone(), c.run.clone()))
        .collect();
    for cell in &mut out {
        if cell.objective == RescueObjective::Generating.label() {
            continue;
        }
        let Some((_, ref_dir, Some(reference))) =
            references.iter().find(|(o, _, _)| *o == cell.organism)
        else {
            continue;
        };
        if let Some(run) = &mut cell.run {
            cell.borrowed_methods =
                harness_report::sweep::with_reference(run, reference, &BORROWED);
            cell.borrowed_from = Some(ref_dir.clone());
        }
    }
    Ok((out, records))
}

/// Copy every finished cell-seed of `sweep` to `dest` (same layout), keeping only what the
/// report reads, each file gzip-compressed ([`harness_report::layout::export_seed`]), and the cell's
/// record: a compact copy (about 100 kB per cell-seed instead of tens of MB) from which
/// `harness-s sweep --report-only --out <dest>` writes the same report. Returns the cell-seed
/// folders written, in grid order.
pub fn export_sweep(sweep: &SweepConfig, file: &Path, dest: &Path) -> Result<Vec<PathBuf>> {
    let io = |path: &Path, what: &str, e: std::io::Error| {
        Error::input("sweep", path, format!("cannot {what}: {e}"))
    };
    let mut out = Vec::new();
    for cell in sweep.cells(file)? {
        let src = &cell.config.out;
        if finished(src)?.is_none() {
            continue;
        }
        let target = cell_dir(dest, &cell.organism, cell.objective, cell.seed);
        // Written beside the target first, so that a failure leaves an earlier copy whole.
        let staging = target.with_extension("partial");
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(|e| io(&staging, "remove", e))?;
        }
        harness_report::layout::export_seed(src, &staging).map_err(|e| Error::stage("sweep", e))?;
        std::fs::copy(src.join(CELL_FILE), staging.join(CELL_FILE))
            .map_err(|e| io(&staging.join(CELL_FILE), "write", e))?;
        if target.exists() {
            std::fs::remove_dir_all(&target).map_err(|e| io(&target, "replace", e))?;
        }
        std::fs::rename(&staging, &target).map_err(|e| io(&target, "write", e))?;
        out.push(target);
    }
    Ok(out)
}

/// Write `sweep.md`, `sweep.json` and the plot under the sweep's root from its cells' files.
pub fn write_sweep_report(
    sweep: &SweepConfig,
    file: &Path,
    failed: &[(String, String, u64, String)],
) -> Result<Vec<PathBuf>> {
    let (cells, records) = read_cells(sweep, file, failed)?;
    let report = harness_report::sweep::sweep_report(&cells);
    std::fs::create_dir_all(&sweep.out)
        .map_err(|e| Error::input("sweep", &sweep.out, format!("cannot create: {e}")))?;
    let md = sweep.out.join(REPORT_FILE);
    let json = sweep.out.join(JSON_FILE);
    let plot = sweep.out.join(PLOT_FILE);
    let mut text = report.to_markdown(&cells);
    text.push_str(&wall_times(&records));
    harness_core::fsutil::write_atomic(&md, text.as_bytes())
        .map_err(|e| Error::input("sweep", &md, format!("cannot write: {e}")))?;
    let body = serde_json::to_string_pretty(&report).unwrap_or_default();
    harness_core::fsutil::write_atomic(&json, body.as_bytes())
        .map_err(|e| Error::input("sweep", &json, format!("cannot write: {e}")))?;
    harness_report::sweep::write_sweep_plot(&report, &plot)
        .map_err(|e| Error::stage("sweep", e))?;
    Ok(vec![md, json, plot])
}

/// The wall time of each finished cell-seed, as a Markdown section.
fn wall_times(records: &[CellRecord]) -> String {
    let mut out = String::from(
        "\n## Wall time per cell-seed\n\n| organism | objective | seed | seconds |\n| --- | --- | --- | --- |\n",
    );
    for r in records {
        out.push_str(&format!(
            "| {} | {} | {} | {:.0} |\n",
            r.organism, r.objective, r.seed, r.seconds
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Vec<CellRun>> {
        let cfg: SweepConfig = toml::from_str(text).map_err(|e| Error::Config {
            file: "s.toml".into(),
            field: String::new(),
            message: e.to_string(),
        })?;
        cfg.cells(Path::new("s.toml"))
    }

    const GOOD: &str = r#"
out = "runs/s"
seeds = [1, 2]
objectives = ["generating", "masked"]
[set]
"train.updates" = 3
[[organism]]
name = "hooks"
set = { "policy.warm_start.organism" = "recovery_hooks", "policy.warm_start.unprompted_good_rate" = 0.0 }
[[organism]]
name = "rules"
set = { "policy.warm_start.organism" = "prompt_rules", "policy.warm_start.unprompted_good_rate" = 0.0 }
"#;

    #[test]
    fn the_grid_is_organisms_by_objectives_by_seeds_with_settings_applied() {
        let cells = parse(GOOD).unwrap();
        assert_eq!(cells.len(), 2 * 2 * 2);
        let c = &cells[7];
        assert_eq!(
            (c.organism.as_str(), c.objective, c.seed),
            ("rules", RescueObjective::Masked, 2)
        );
        assert_eq!(c.config.out, Path::new("runs/s/rules/masked/seed-2"));
        assert_eq!(c.config.train.updates, 3);
        assert_eq!(
            c.config.train.methods,
            vec![Method::parse("harness_s").unwrap()]
        );
        assert_eq!(c.config.policy.warm_start["organism"], "prompt_rules");
        assert_eq!(cells[0].config.train.methods.len(), 3);
        // Each organism's settings apply together, whatever their order.
        assert_eq!(
            cells[0].config.policy.warm_start["organism"],
            "recovery_hooks"
        );
        assert_eq!(
            cells[0].config.policy.warm_start["unprompted_good_rate"],
            0.0
        );
        // Every seed from the first seed's warm start.
        assert!(cells.iter().all(|c| c.config.warm_start_seed() == 1));
    }

    #[test]
    fn a_sweeps_threads_are_its_cells_where_they_agree() {
        let sweep = |text: &str| {
            let cfg: SweepConfig = toml::from_str(text).unwrap();
            cpu_threads(&cfg.cells(Path::new("s.toml")).unwrap())
        };
        assert_eq!(sweep(GOOD), Some(1));
        let two = GOOD.replace("[set]\n", "[set]\n\"policy.threads\" = 2\n");
        assert_eq!(sweep(&two), Some(2));
        let mixed = GOOD.replace(
            "name = \"rules\"\nset = { ",
            "name = \"rules\"\nset = { \"policy.threads\" = 2, ",
        );
        assert_ne!(mixed, GOOD);
        assert_eq!(sweep(&mixed), None);
    }

    #[test]
    fn bad_sweep_files_name_the_field() {
        for (edit, field) in [
            (GOOD.replace("seeds = [1, 2]", "seeds = []"), "seeds"),
            (GOOD.replace("seeds = [1, 2]", "seeds = [1, 1]"), "seeds"),
            (GOOD.replace("\"masked\"", "\"hinted\""), "objectives"),
            (
                GOOD.replace("name = \"rules\"", "name = \"a/b\""),
                "organism[1].name",
            ),
            (
                GOOD.replace("\"train.updates\" = 3", "\"train.updatez\" = 3"),
                "set.\"train.updatez\"",
            ),
            (
                GOOD.replace(
                    "out = \"runs/s\"",
                    "out = \"runs/s\"\nobjective_methods = [\"grpo\"]",
                ),
                "objective_methods",
            ),
            (
                GOOD.replace(
                    "\"prompt_rules\", \"policy.warm_start.unprompted_good_rate\" = 0.0",
                    "\"prompt_rules\", \"policy.warm_start.unprompted_good_rate\" = 2.0",
                ),
                "organism[1]",
            ),
        ] {
            let err = parse(&edit).unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
    }
}
