//! The embedded default: harness-warmstart's model organism (a tiny Qwen3 warm-started on
//! planted DBBench demonstrations under a compact H0), built once per settings and seed and
//! cached under `policy.cache_dir`, with a progress bar and its time stated. The default
//! settings with the default seed are shipped with harness-warmstart and installed in a second.

use std::path::PathBuf;
use std::sync::Arc;

use harness_core::{Environment, Harness};
use harness_warmstart::{WarmStartProgress, WarmStartSettings, warm_start as warm};

use crate::config::RunConfig;
use crate::error::{Error, Result, StageExt};
use crate::setup::Progress;

/// The embedded default's environment, compact H0 and warm-started checkpoint.
pub struct OrganismSetup {
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
pub fn warm_start(cfg: &RunConfig, progress: &Progress) -> Result<OrganismSetup> {
    let settings = settings(cfg)?;
    let bar = progress.bar(
        settings.sft_steps as u64,
        "warm start (cached after the first run)",
    );
    let started = warm(&settings, &cfg.policy.cache_dir, &mut |p| match p {
        WarmStartProgress::Cached(dir) => {
            bar.set_message(format!("warm start: cached {}", dir.display()))
        }
        WarmStartProgress::Shipped(dir) => bar.set_message(format!(
            "warm start: installed the shipped {}",
            dir.display()
        )),
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
    if started.shipped {
        progress.println(format!(
            "warm start: installed the checkpoint shipped with harness-warmstart in {} ({:.1}s; training it from its {} demonstrations takes {:.0}s: see harness_warmstart::shipped)",
            started.checkpoint.display(),
            started.seconds,
            started.report.demos,
            started.report.train_seconds + started.report.demo_seconds,
        ));
    } else if started.cached {
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
    Ok(OrganismSetup {
        env: started.environment(),
        base: started.base.clone(),
        siblings: started.siblings.clone(),
        checkpoint: started.checkpoint.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_run_uses_the_shipped_warm_start() {
        let cfg = RunConfig::default();
        let settings = settings(&cfg).unwrap();
        assert!(
            harness_warmstart::shipped_for(&settings).is_some(),
            "the quick default's warm start ({}) is not shipped with harness-warmstart",
            harness_warmstart::cache_dir_name(&settings)
        );
        let mut other = cfg.clone();
        other.seed = 7;
        assert!(harness_warmstart::shipped_for(&super::settings(&other).unwrap()).is_none());
    }
}
