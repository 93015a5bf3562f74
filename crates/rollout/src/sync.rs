//! Weight sync for remote rollouts: after each applied update the loop asks a [`WeightSync`]
//! to make the rollout engine serve the new weights, retries a failure, and then stops the run
//! with an error rather than keep sampling from stale weights.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use futures::future::BoxFuture;

use crate::config::SyncRetry;
use crate::error::{Error, Result};

/// Brings the learner's newest weights to the engine the rollouts sample from.
///
/// # Design
/// The loop knows only versions: the learner bumps one per applied update, and the sync makes
/// the engine serve it. How the weights travel (an HF checkpoint on a shared disk and a reload
/// request, NCCL, nothing at all in process) is the implementation's business, so this crate
/// needs neither the trainer nor the HTTP client. An in-process policy sharing the learner's
/// weights needs no sync at all.
#[async_trait]
pub trait WeightSync: Send + Sync {
    /// A short name for logs and errors.
    fn name(&self) -> &str;

    /// Make the engine serve the weights of `version`. Called once per attempt; must be safe
    /// to call again after a failure.
    async fn sync(&self, version: u64) -> harness_core::Result<()>;
}

/// Run `sync` with retries and doubling back-off; the error names the sync, the version and
/// the last failure.
pub async fn sync_with_retry(sync: &dyn WeightSync, version: u64, retry: SyncRetry) -> Result<()> {
    let mut pause = Duration::from_millis(retry.backoff_ms);
    let mut last = String::new();
    for attempt in 1..=retry.attempts.max(1) {
        match sync.sync(version).await {
            Ok(()) => return Ok(()),
            Err(e) => {
                tracing::warn!(sync = sync.name(), version, attempt, error = %e, "weight sync failed");
                last = e.to_string();
                if attempt < retry.attempts {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        }
    }
    Err(Error::Sync {
        sync: sync.name().to_string(),
        version,
        attempts: retry.attempts.max(1),
        message: last,
    })
}

type SaveFn = Box<dyn Fn(&Path) -> harness_core::Result<()> + Send + Sync>;
type ReloadFn = Box<dyn Fn(PathBuf) -> BoxFuture<'static, harness_core::Result<()>> + Send + Sync>;

/// The usual remote sync: write the weights as an HF checkpoint into one folder, then ask the
/// engine to reload it (e.g. grpo-candle's `CandlePolicy::save_hf` and harness-openai's
/// `RemotePolicy::reload_weights`, wired in an example).
pub struct SaveAndReload {
    name: String,
    dir: PathBuf,
    save: SaveFn,
    reload: ReloadFn,
}

impl SaveAndReload {
    /// A sync that calls `save(dir)` then `reload(dir)`.
    pub fn new(
        name: impl Into<String>,
        dir: impl Into<PathBuf>,
        save: impl Fn(&Path) -> harness_core::Result<()> + Send + Sync + 'static,
        reload: impl Fn(PathBuf) -> BoxFuture<'static, harness_core::Result<()>> + Send + Sync + 'static,
    ) -> Self {
        SaveAndReload {
            name: name.into(),
            dir: dir.into(),
            save: Box::new(save),
            reload: Box::new(reload),
        }
    }
}

#[async_trait]
impl WeightSync for SaveAndReload {
    fn name(&self) -> &str {
        &self.name
    }

    async fn sync(&self, version: u64) -> harness_core::Result<()> {
        tracing::debug!(sync = %self.name, version, dir = %self.dir.display(), "saving weights for the engine");
        (self.save)(&self.dir)?;
        (self.reload)(self.dir.clone()).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The loop holds the sync as `Arc<dyn WeightSync>`.
    fn _object_safe(_: &dyn WeightSync) {}

    #[tokio::test]
    async fn save_and_reload_saves_into_its_folder_then_reloads_it() {
        let dir = tempfile::tempdir().unwrap();
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let log = seen.clone();
        let sync = SaveAndReload::new(
            "test",
            dir.path(),
            |d| {
                std::fs::write(d.join("model.safetensors"), b"w")
                    .map_err(|e| harness_core::Error::io(d, e))
            },
            move |d| {
                let log = log.clone();
                Box::pin(async move {
                    assert!(
                        d.join("model.safetensors").is_file(),
                        "saved before the reload"
                    );
                    log.lock().unwrap().push(d);
                    Ok(())
                })
            },
        );
        sync_with_retry(&sync, 1, SyncRetry::default())
            .await
            .unwrap();
        assert_eq!(*seen.lock().unwrap(), vec![dir.path().to_path_buf()]);
    }
}
