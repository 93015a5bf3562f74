//! The embedded default: harness-warmstart's model organism (a tiny Qwen3 warm-started on
//! planted DBBench demonstrations under a compact H0), built once per settings and seed and
//! cached under `policy.cache_dir`, with a progress bar and its time stated.

use std::path::PathBuf;
use std::sync::Arc;

use harness_core::{Environment, Harness};
use harness_warmstart::{WarmStartProgress, WarmStartSettings, warm_start as warm};

use crate::config::RunConfig;
use crate::error::{Error, Result, StageExt};
use crate::setup::Progress;

/// The embedded default's environment, compact H0 and warm-started checkpoint.
pub struct Organism {
    /// The environment the warm start was made for.
    pub env: Arc<dyn Environment>,
    /// The compact H0.
    pub base: Harness,
    /// DBBench's siblings re-based on the compact H0 (what the warm start planted against).
    pub siblings: Vec<Harness>,
    /// The warm-started checkpoint.
    pub checkpoint: PathBuf,
}

/// The warm start's settings of `cfg`: `policy.warm_start` over the chosen preset, seeded by
/// [`RunConfig::warm_start_seed`].
pub fn settings(cfg: &RunConfig) -> Result<WarmStartSettings> {
    let mut settings: WarmStartSettings = serde_json::from_value(cfg.policy.warm_start.clone())
        .map_err(|e| Error::Config {
            file: PathBuf::from("<run config>"),
            field: "policy.warm_start".into(),
            message: format!("expected harness-warmstart settings: {e}"),
        })?;
    settings.seed = cfg.warm_start_seed();
    settings.validate().map_err(|e| Error::Config {
        file: PathBuf::from("<run config>"),
        field: "policy.warm_start".into(),
        message: e.to_string(),
    })?;
    Ok(settings)
}

/// Warm-start (or load from the cache) the embedded default for `cfg`'s seed.
pub fn warm_start(cfg: &RunConfig, progress: &Progress) -> Result<Organism> {
    let settings = settings(cfg)?;
    let bar = progress.bar(
        settings.sft_steps as u64,
        "warm start (cached after the first run)",
    );
    let started = warm(&settings, &cfg.policy.cache_dir, &mut |p| match p {
        WarmStartProgress::Cached(dir) => {
            bar.set_message(format!("warm start: cached {}", dir.display()))
        }
        WarmStartProgress::Demos { pass, done, total } => bar.set_message(format!(
            "warm start: demonstrations (pass {pass}) {done}/{total}"
        )),
        WarmStartProgress::Tokenizer { vocab } => {
            bar.set_message(format!("warm start: tokenizer of {vocab} tokens fitted"))
        }
        WarmStartProgress::Step { step, loss, .. } => {
            bar.set_message(format!("warm start: fine-tuning, loss {loss:.3}"));
            bar.set_position(step as u64);
        }
        WarmStartProgress::Saved(_) => {}
    })
    .at("warm start")?;
    bar.finish_and_clear();
    if started.cached {
        progress.println(format!(
            "warm start: loaded the cached checkpoint {} ({:.1}s)",
            started.checkpoint.display(),
            started.seconds
        ));
    } else {
        progress.println(format!(
            "warm start: {} demonstrations, {} updates, loss {:.3} -> {:.3}, in {:.0}s (cached in {})",
            started.report.demos,
            started.report.steps,
            started.report.first_loss,
            started.report.tail_loss,
            started.seconds,
            started.checkpoint.display()
        ));
    }
    Ok(Organism {
        env: started.environment(),
        base: started.base.clone(),
        siblings: started.siblings.clone(),
        checkpoint: started.checkpoint.clone(),
    })
}
