//! [`TinkerWeightSync`]: harness-rollout's [`WeightSync`] for a [`crate::TinkerLearner`]. After
//! each applied update the rescue loop asks it for the new version: it saves the weights on
//! the server (`save_weights_for_sampler`, which SkyRL's server pushes into its vLLM engines,
//! or `save_weights`), optionally runs a reload hook (e.g. SGLang's
//! `update_weights_from_disk` on the unpacked checkpoint), and records the version. A failure
//! is an error the loop retries and then stops the run with; it never samples from stale
//! weights silently.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use futures::future::BoxFuture;
use harness_rollout::WeightSync;

use crate::learner::{TinkerModel, nonce};

/// Which save the sync makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncTarget {
    /// `save_weights_for_sampler`: weights for sampling.
    Sampler,
    /// `save_weights`: a training checkpoint (for backends that reload those).
    Training,
}

/// The weights of one version, as saved on the server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncedWeights {
    /// The policy version.
    pub version: u64,
    /// The server's path (`tinker://...`).
    pub path: String,
    /// The sampling session the server loaded them into, when it made one.
    pub sampling_session_id: Option<String>,
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
        let name = format!("{}-v{version}-{}", self.prefix, nonce());
        let model_id = self.model.model_id();
        let client = self.model.client();
        let weights = match self.target {
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
                }
            }
            SyncTarget::Training => SyncedWeights {
                version,
                path: client
                    .save_weights(&model_id, &name)
                    .await
                    .map_err(|e| self.error(version, e))?,
                sampling_session_id: None,
            },
        };
        if let Some(reload) = &self.reload {
            reload(weights.clone()).await?;
        }
        tracing::info!(version, path = %weights.path, "tinker weights synced");
        self.history
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(weights);
        Ok(())
    }
}
