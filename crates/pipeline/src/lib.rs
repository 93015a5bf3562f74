//! # harness-pipeline
//!
//! The Harness-S main job as library calls, shared by the `harness-s` command line and the
//! `full_pipeline` example: one [`RunConfig`] (TOML or JSON, validated, every error naming the
//! file and field), and the stages that read and write a run directory ([`layout`]):
//!
//! 1. [`stages::evolve`]: Directional Harness Evolution from H0 into a frozen Sibling Harness
//!    Pool (harness-evolve);
//! 2. [`stages::calibrate`]: the router's first calibration with the initial policy
//!    (harness-router);
//! 3. [`stages::train`]: training of one method (harness-rollout, with grpo-candle's learner),
//!    each from the same checkpoint, seed and update count. The methods are one table,
//!    [`methods::METHODS`]: plain GRPO, GRPO with H0 rescue, the two fixed mixtures (H0 + the
//!    best sibling, H0 + Top-4), DAPO-style dynamic sampling, random-harness and rule-router
//!    rescue, the LLM router's Top-4 x 2, Top-K with fixed profiles, Harness-S (Top-K with
//!    re-anchored profiles), and Harness-S (HE only), which updates no weights;
//! 4. [`stages::evaluate`]: test Pass@k / Avg@k under H0 and under the router's Rank-1, as
//!    each method's entry says, and the router's Rank-1..R for Harness-S;
//! 5. [`stages::write_report`] (harness-report): the paper's Tables 1, 2, 5 and 9 and Figure
//!    3's panels.
//!
//! [`run_main_job`] runs them all for every seed. The embedded default (`env.name =
//! "default"`) is harness-warmstart's model organism; a checkpoint (`policy.model`), an
//! OpenAI-compatible endpoint for the LLM roles (`roles.llm`) and a vLLM or SGLang engine for
//! rollouts (`rollout.engine`) replace its parts without code changes. The library reads no
//! flags and no environment variables: the binary hands it the configuration and [`Secrets`].
//!
//! ```no_run
//! # async fn run() -> harness_pipeline::Result<()> {
//! use harness_pipeline::{Progress, RunConfig, Secrets, run_main_job};
//! let mut cfg = RunConfig::load("run.toml")?;
//! cfg.train.updates = 4;
//! let summary = run_main_job(&cfg, &Secrets::default(), &Progress::bars()).await?;
//! println!("{}", summary.tables);
//! # Ok(()) }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod config;
pub mod error;
pub mod keys;
pub mod layout;
pub mod methods;
pub mod organism;
pub mod paper;
pub mod serve;
pub mod setup;
pub mod stages;
pub mod sweep;
pub mod tau;
pub mod tinker;

pub use config::{Method, Preset, RunConfig};
pub use error::{Error, Result};
pub use layout::Layout;
pub use setup::{Progress, Secrets, Workbench};
pub use stages::{render_tables, write_report};

use std::time::Instant;

use error::StageExt;

/// What [`run_main_job`] did.
#[derive(Debug, Clone)]
pub struct MainJobSummary {
    /// The paper-shaped tables, as printed.
    pub tables: String,
    /// The report files written.
    pub files: Vec<std::path::PathBuf>,
    /// Wall seconds of the whole job.
    pub seconds: f64,
}

/// The key of `run.json` that records which sandbox agent programs ran in.
pub const SANDBOX_RECORD: &str = "external_sandbox";

/// Write the resolved configuration of a seed's run (`run.json`). A directory that already
/// holds a run of another configuration is refused (its results are never mixed or lost);
/// one of the same configuration is continued.
///
/// Beside the configuration it records `external_sandbox`: which sandbox the run's agent
/// programs run in (`Workbench::program_sandbox`), with the reason when `external.sandbox =
/// "auto"` found none; a continued run records its own.
pub fn write_run_config(wb: &Workbench) -> Result<()> {
    let path = wb.layout.config();
    let mut current = serde_json::to_value(&wb.cfg).unwrap_or_else(|_| unreachable!("plain data"));
    if let (Some(note), Some(map)) = (&wb.program_sandbox, current.as_object_mut()) {
        map.insert(
            SANDBOX_RECORD.into(),
            serde_json::Value::from(note.as_str()),
        );
    }
    if let Ok(text) = std::fs::read_to_string(&path) {
        let saved: serde_json::Value = serde_json::from_str(&text)
            .map_err(|e| Error::input("run", &path, format!("not a run configuration: {e}")))?;
        if comparable(saved.clone()) == comparable(current.clone()) {
            if saved.get(SANDBOX_RECORD) != current.get(SANDBOX_RECORD) {
                let text = serde_json::to_string_pretty(&current)
                    .unwrap_or_else(|_| unreachable!("plain data"));
                harness_core::fsutil::write_atomic(&path, text.as_bytes()).at("run")?;
            }
            return Ok(());
        }
        return Err(Error::input(
            "run",
            &path,
            "this directory holds a run of another configuration; choose another `out` (--out) or remove the directory",
        ));
    }
    std::fs::create_dir_all(wb.layout.root())
        .map_err(|e| Error::input("run", wb.layout.root(), e.to_string()))?;
    let text =
        serde_json::to_string_pretty(&current).unwrap_or_else(|_| unreachable!("plain data"));
    harness_core::fsutil::write_atomic(&path, text.as_bytes()).at("run")
}

/// A run configuration without the settings a resumed run may change: where the Tinker
/// server is and how long to wait for it (a server restarted on another port keeps the run),
/// which roles would ask an LLM endpoint when none is configured (they change nothing
/// then, and the list of roles grows as roles are added), and the process's CPU threads. A
/// warm start without `organism` (a run saved before the setting existed) is the
/// recovery-hooks organism, harness-warmstart's default.
pub(crate) fn comparable(mut cfg: serde_json::Value) -> serde_json::Value {
    if let Some(map) = cfg.as_object_mut() {
        map.remove(SANDBOX_RECORD);
    }
    if let Some(policy) = cfg.get_mut("policy").and_then(|p| p.as_object_mut()) {
        policy.remove("threads");
        if let Some(warm) = policy.get_mut("warm_start").and_then(|w| w.as_object_mut()) {
            warm.entry("organism")
                .or_insert_with(|| harness_warmstart::Organism::default().as_str().into());
        }
    }
    if let Some(roles) = cfg.get_mut("roles").and_then(|r| r.as_object_mut())
        && roles.get("llm").is_none_or(serde_json::Value::is_null)
    {
        roles.remove("llm_roles");
    }
    if let Some(t) = cfg.get_mut("tinker").and_then(|t| t.as_object_mut()) {
        for key in [
            "url",
            "heartbeat_s",
            "timeout_s",
            "future_timeout_s",
            "attempts",
        ] {
            t.remove(key);
        }
    }
    cfg
}

/// The whole loop for every seed: evolution, the first calibration, every method's training
/// from the same checkpoint and seed, the test evaluations, then the report over all seeds.
pub async fn run_main_job(
    cfg: &RunConfig,
    secrets: &Secrets,
    progress: &Progress,
) -> Result<MainJobSummary> {
    cfg.validate(None)?;
    let started = Instant::now();
    for seed in cfg.seed_list() {
        let wb = Workbench::new(cfg.with_seed(seed), secrets.clone(), progress.clone())?;
        progress.println(format!("== seed {seed}: {}", wb.layout.root().display()));
        write_run_config(&wb)?;
        run_seed(&wb).await?;
    }
    let files = write_report(cfg)?;
    let tables = render_tables(cfg)?;
    Ok(MainJobSummary {
        tables,
        files,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// One seed's loop. A stage whose outputs are complete is not run again, and a killed
/// training run resumes from its latest checkpoint, so re-running the same configuration
/// continues where the last run stopped.
pub async fn run_seed(wb: &Workbench) -> Result<()> {
    if tinker::enabled(wb)
        && wb
            .cfg
            .train
            .methods
            .iter()
            .any(|&m| m.has_training_stage() && !m.searches() && !stages::is_trained(wb, m))
    {
        // Before evolution runs any rollout: an unreachable server or a model it does not
        // train is a configuration error now, not after the first stages.
        tinker::preflight(wb).await?;
    }
    let pool = if wb.cfg.pool.is_some() || wb.layout.pool().join(harness_pool::POOL_FILE).is_file()
    {
        stages::load_pool(wb)?
    } else {
        stages::evolve(wb).await?
    };
    let calibrated = harness_router::Calibration::load_latest(&wb.layout.calibration())
        .at("calibrate")?
        .is_some();
    if !calibrated {
        stages::calibrate(wb, &pool).await?;
    }
    if !stages::has_test_record(wb, &pool, None)? {
        stages::evaluate(wb, &pool, None).await?;
    }
    let siblings = pool.auxiliaries().count();
    for &method in &wb.cfg.train.methods {
        if method.has_training_stage() {
            let needed = method.siblings_needed(wb.cfg.train.group_size, siblings);
            if method.needs_program() && !pool.auxiliaries().any(|h| h.is_external()) {
                wb.progress.println(format!(
                    "{}: not trained: it mixes H0 with an agent program and the pool holds none \
                     (add one with external.harnesses or external.python_sibling)",
                    method.label()
                ));
                continue;
            }
            if siblings < needed {
                // Evolution can keep fewer children than a method rescues with (none at all
                // when an LLM analyst or editor never answered usably): the run goes on with
                // the methods the pool allows, and the report lists this one as not trained.
                wb.progress.println(format!(
                    "{}: not trained: it needs {needed} distinct sibling harnesses and the \
                     pool holds {siblings} besides H0 (see evolve/rounds.json and evolve/usage.json)",
                    method.label()
                ));
                continue;
            }
            if !stages::is_trained(wb, method) {
                let started = wb
                    .layout
                    .train(method)
                    .join(harness_rollout::METRICS_FILE)
                    .is_file();
                stages::train(wb, &pool, method, started).await?;
            }
        }
        if !stages::has_test_record(wb, &pool, Some(method))? {
            stages::evaluate(wb, &pool, Some(method)).await?;
        }
    }
    // Table 4 once every method was evaluated: its cases need plain GRPO's H0 episodes
    // whatever the order of train.methods.
    if let Some(why) = stages::transfer(wb, &pool)? {
        wb.progress.println(format!("Table 4: not written: {why}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::comparable;
    use crate::RunConfig;

    #[test]
    fn a_run_saved_with_fewer_llm_roles_resumes_only_when_no_endpoint_is_set() {
        let mut current = serde_json::to_value(RunConfig::default()).unwrap();
        let mut saved = current.clone();
        // A run written before the labeller and proposer roles existed.
        saved["roles"]["llm_roles"] =
            serde_json::json!(["analyst", "editor", "profiler", "voters"]);
        assert_eq!(comparable(saved.clone()), comparable(current.clone()));
        // With an endpoint the roles decide what asks it: a different list is another run.
        saved["roles"]["llm"] = "http://127.0.0.1:8000/v1".into();
        current["roles"]["llm"] = "http://127.0.0.1:8000/v1".into();
        assert_ne!(comparable(saved), comparable(current));
    }
}

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
