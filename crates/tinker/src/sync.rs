//! [`TinkerWeightSync`]: harness-rollout's [`WeightSync`] for a [`crate::TinkerLearner`]. After
//! each applied update the rescue loop asks it for the new version: it saves the weights on
//! the server (`save_weights_for_sampler`, which SkyRL's server pushes into its vLLM engines,
//! or `save_weights`), optionally runs a reload hook (e.g. SGLang's
//! `update_weights_from_disk` on the unpacked checkpoint), and records the version. A failure
//! is an error the loop retries and then stops the run with; it never samples from stale
//! weights silently.
//!
//! With [`TinkerWeightSync::with_download`] each version's adapter is also fetched
//! ([`crate::TinkerClient::download_sampler_weights`]) into `<dir>/v<version>`, for a sampler
//! that runs the initial weights plus the downloaded LoRA in-process. The folder is in place
//! before the reload hook runs; after each sync only it and the next older `v*` folder are kept.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use async_trait::async_trait;
use futures::future::BoxFuture;
use harness_rollout::WeightSync;

use crate::client::nonce;
use crate::learner::TinkerModel;

/// Which save the sync makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncTarget {
    /// `save_weights_for_sampler`: weights for sampling.
    Sampler,
    /// `save_weights`: a training checkpoint (for backends that reload those).
    Training,
}

/// The weights of one version, as saved on the server.
#[derive(Debug, Clone, PartialEq)]
pub struct SyncedWeights {
    /// The policy version.
    pub version: u64,
    /// The server's path (`tinker://...`).
    pub path: String,
    /// The sampling session the server loaded them into, when it made one.
    pub sampling_session_id: Option<String>,
    /// The unpacked adapter (`<dir>/v<version>`), when the sync downloads.
    pub local_dir: Option<PathBuf>,
    /// Seconds the server took to save the weights.
    pub save_seconds: f64,
    /// Seconds the download and unpacking took (0 without a download).
    pub download_seconds: f64,
}

/// Where downloaded versions go.
#[derive(Debug, Clone)]
struct Download {
    dir: PathBuf,
    max_bytes: u64,
}

type ReloadHook =
    Arc<dyn Fn(SyncedWeights) -> BoxFuture<'static, harness_core::Result<()>> + Send + Sync>;

/// Saves each new version on the server and hands it to the rollout engine.
pub struct TinkerWeightSync {
    name: String,
    model: Arc<TinkerModel>,
    target: SyncTarget,
    prefix: String,
    reload: Option<ReloadHook>,
    download: Option<Download>,
    history: Mutex<Vec<SyncedWeights>>,
}

impl std::fmt::Debug for TinkerWeightSync {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TinkerWeightSync")
            .field("name", &self.name)
            .field("target", &self.target)
            .field("history", &self.history())
            .finish_non_exhaustive()
    }
}

impl TinkerWeightSync {
    /// A sync saving `model`'s weights as `target` under `<prefix>-v<version>-<suffix>`.
    pub fn new(model: Arc<TinkerModel>, target: SyncTarget, prefix: impl Into<String>) -> Self {
        TinkerWeightSync {
            name: "tinker-weights".into(),
            model,
            target,
            prefix: prefix.into(),
            reload: None,
            download: None,
            history: Mutex::new(Vec::new()),
        }
    }

    /// Also run `reload` with each saved version before the sync counts as done.
    pub fn with_reload(
        mut self,
        reload: impl Fn(SyncedWeights) -> BoxFuture<'static, harness_core::Result<()>>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        self.reload = Some(Arc::new(reload));
        self
    }

    /// Also download each saved version's adapter into `dir/v<version>` (archives up to
    /// `max_bytes`), before the reload hook runs; keep only the two newest such folders.
    /// Only for [`SyncTarget::Sampler`]: with [`SyncTarget::Training`], every `sync` fails
    /// saying so (training checkpoints have no sampler archive).
    pub fn with_download(mut self, dir: PathBuf, max_bytes: u64) -> Self {
        self.download = Some(Download { dir, max_bytes });
        self
    }

    /// Every version synced so far, oldest first.
    pub fn history(&self) -> Vec<SyncedWeights> {
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The newest synced version.
    pub fn latest(&self) -> Option<SyncedWeights> {
        self.history().last().cloned()
    }

    fn error(&self, version: u64, e: impl std::fmt::Display) -> harness_core::Error {
        harness_core::Error::Learner {
            learner: self.name.clone(),
            message: format!("syncing weights version {version}: {e}"),
        }
    }
}

#[async_trait]
impl WeightSync for TinkerWeightSync {
    fn name(&self) -> &str {
        &self.name
    }

    async fn sync(&self, version: u64) -> harness_core::Result<()> {
        if self.download.is_some() && self.target == SyncTarget::Training {
            return Err(self.error(
                version,
                "a download needs SyncTarget::Sampler (the server archives sampler weights, \
                 not training checkpoints): build the sync with SyncTarget::Sampler or without \
                 with_download",
            ));
        }
        let name = format!("{}-v{version}-{}", self.prefix, nonce());
        let model_id = self.model.model_id();
        let client = self.model.client();
        let started = Instant::now();
        let mut weights = match self.target {
            SyncTarget::Sampler => {
                let out = client
                    .save_weights_for_sampler(&model_id, &name)
                    .await
                    .map_err(|e| self.error(version, e))?;
                SyncedWeights {
                    version,
                    path: out
                        .path
                        .unwrap_or_else(|| format!("tinker://{model_id}/sampler_weights/{name}")),
                    sampling_session_id: out.sampling_session_id,
                    local_dir: None,
                    save_seconds: 0.0,
                    download_seconds: 0.0,
                }
            }
            SyncTarget::Training => SyncedWeights {
                version,
                path: client
                    .save_weights(&model_id, &name)
                    .await
                    .map_err(|e| self.error(version, e))?,
                sampling_session_id: None,
                local_dir: None,
                save_seconds: 0.0,
                download_seconds: 0.0,
            },
        };
        weights.save_seconds = started.elapsed().as_secs_f64();
        if let Some(d) = &self.download {
            let started = Instant::now();
            let dest = d.dir.join(format!("v{version}"));
            client
                .download_sampler_weights(&weights.path, &dest, d.max_bytes)
                .await
                .map_err(|e| self.error(version, format!("downloading {}: {e}", weights.path)))?;
            weights.download_seconds = started.elapsed().as_secs_f64();
            weights.local_dir = Some(dest);
        }
        if let Some(reload) = &self.reload {
            reload(weights.clone()).await?;
        }
        tracing::info!(
            version,
            path = %weights.path,
            save_seconds = weights.save_seconds,
            download_seconds = weights.download_seconds,
            "tinker weights synced"
        );
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(weights);
        if let Some(d) = &self.download
            && let Err(e) = prune(&d.dir, version)
        {
            tracing::warn!(dir = %d.dir.display(), error = %e, "cannot remove old weight folders");
        }
        Ok(())
    }
}

/// Keep `dir/v<current>` and the newest older `v*` folder (a sampler may still read it);
/// remove the other `v*` folders, older ones and those of versions past `current` (left by a
/// run that resumed from an earlier checkpoint).
fn prune(dir: &Path, current: u64) -> std::io::Result<()> {
    let mut versions: Vec<(u64, PathBuf)> = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(v) = name
            .to_str()
            .and_then(|n| n.strip_prefix('v'))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        if entry.file_type()?.is_dir() {
            versions.push((v, entry.path()));
        }
    }
    let previous = versions
        .iter()
        .map(|(v, _)| *v)
        .filter(|&v| v < current)
        .max();
    for (v, path) in versions {
        if v != current && Some(v) != previous {
            std::fs::remove_dir_all(&path)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prune_keeps_the_current_and_the_previous_version() {
        let dir = std::env::temp_dir().join(format!("tinker-prune-{}", nonce()));
        for v in ["v1", "v2", "v3", "v7", "v3.tmp-x", "other"] {
            std::fs::create_dir_all(dir.join(v)).unwrap();
        }
        prune(&dir, 3).unwrap();
        let mut left: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["other", "v2", "v3", "v3.tmp-x"]);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
