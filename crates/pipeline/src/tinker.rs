//! The Tinker learner in the main job (`learner = "tinker"`): the policy update runs on a
//! Tinker-protocol server (SkyRL's self-hosted server, hosted Tinker) that trains a LoRA
//! adapter, and every stage that samples does so from the server's weights.
//!
//! After each applied update the training stage's weight sync (harness-tinker's
//! [`TinkerWeightSync`]) saves the server's sampler weights, downloads the adapter and merges
//! it into the in-process policy, always from the initial checkpoint's weights
//! ([`grpo_candle::BaseWeights`]) so that versions never compound. Then, when
//! `tinker.check_sync` is on, a probe sequence is scored by the server and by the merged
//! policy: a difference above `tinker.check_tolerance` stops the run, as does any failed
//! step. With a vLLM or SGLang engine, the merged weights are then pushed to it as with the
//! in-process learner. The acting policy reports the version it samples
//! ([`harness_core::Policy::weights_version`]) and the rescue loop refuses to sample when it
//! lags the learner's. Each sync is a line of `<method>/sampler/syncs.jsonl`.
//!
//! Each checkpoint holds the server's `tinker://` path (harness-tinker's
//! `tinker_learner.json`) and the merged weights (`model.safetensors` and the rest of a
//! checkpoint folder), so calibration, `eval`, `report` and `serve` read local weights and
//! never ask the server. A resume is refused when the checkpoint was written by the other
//! learner, when its versions disagree, when a LoRA or optimiser setting changed, when the
//! server no longer holds the checkpoint, or when the weights the server serves for the
//! restored version differ from the merged weights the checkpoint saved.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use grpo_candle::{BaseWeights, CandlePolicy, PeftAdapter};
use harness_core::{Group, Learner, UpdateReport};
use harness_rollout::WeightSync;
use harness_tinker::{
    AdamParams, GrpoSettings, ObjectiveMode, RetryPolicy, ServerKind, SyncTarget, SyncedWeights,
    TinkerClient, TinkerConfig, TinkerLearner, TinkerLearnerConfig, TinkerModel, TinkerWeightSync,
};
use serde::{Deserialize, Serialize};

use crate::config::{LearnerKind, TinkerObjective, TinkerServer};
use crate::error::{Error, Result, StageExt};
use crate::setup::Workbench;

/// The folder of a training run where sampler weights are unpacked and syncs are logged.
pub const SAMPLER_DIR: &str = "sampler";
/// One line per weight sync.
pub const SYNCS_FILE: &str = "syncs.jsonl";
/// Tokens of the probe sequence scored after each sync.
const PROBE_TOKENS: usize = 96;
/// The largest absolute weight difference accepted between the weights the server serves
/// for a restored version and the merged weights its checkpoint saved.
const RESUME_WEIGHT_TOLERANCE: f32 = 1e-5;

/// One weight sync, as `syncs.jsonl` records it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SyncRecord {
    /// The policy version now served.
    pub version: u64,
    /// The server's path of the sampler weights.
    pub tinker_path: String,
    /// Seconds of the server-side save.
    pub save_seconds: f64,
    /// Seconds of the download and unpacking.
    pub download_seconds: f64,
    /// Seconds of the merge into the in-process policy.
    pub merge_seconds: f64,
    /// Seconds of the probe (both scorings), when it ran.
    pub probe_seconds: Option<f64>,
    /// The probe's largest absolute log-prob difference, when it ran.
    pub probe_max_diff: Option<f64>,
    /// Seconds pushing the merged weights to a vLLM / SGLang engine, when there is one.
    pub engine_seconds: Option<f64>,
}

fn config_error(wb: &Workbench, field: &str, message: String) -> Error {
    Error::Config {
        file: wb.layout.config(),
        field: field.into(),
        message,
    }
}

/// The base model the server is asked to train: `tinker.base_model`, or the absolute path of
/// the run's initial checkpoint (what SkyRL's server is started with).
pub fn base_model(wb: &Workbench) -> Result<String> {
    if let Some(m) = &wb.cfg.tinker.base_model {
        return Ok(m.clone());
    }
    let dir = std::fs::canonicalize(&wb.checkpoint)
        .map_err(|e| Error::input("train", &wb.checkpoint, e.to_string()))?;
    Ok(dir.to_string_lossy().into_owned())
}

/// A client for `tinker.url` with the run's timeouts, retries and key.
pub fn client(wb: &Workbench) -> Result<TinkerClient> {
    let t = &wb.cfg.tinker;
    let url = t.url.clone().ok_or_else(|| {
        config_error(
            wb,
            "tinker.url",
            "learner = \"tinker\" needs the server's root (--tinker-url)".into(),
        )
    })?;
    let mut cfg = TinkerConfig::new(url);
    cfg.api_key = wb.secrets.tinker_api_key.clone();
    cfg.timeout = Duration::from_secs_f64(t.timeout_s);
    cfg.future_timeout = Duration::from_secs_f64(t.future_timeout_s);
    cfg.retry = RetryPolicy {
        max_attempts: t.attempts,
        ..RetryPolicy::default()
    };
    TinkerClient::new(cfg).map_err(|e| config_error(wb, "tinker", e.to_string()))
}

/// The learner's settings from the run's.
pub fn learner_config(wb: &Workbench, base_model: String) -> TinkerLearnerConfig {
    let t = &wb.cfg.tinker;
    let server = match t.server {
        TinkerServer::Skyrl => ServerKind::SkyrlTx,
        TinkerServer::Tinker => ServerKind::Tinker,
    };
    let mut cfg = TinkerLearnerConfig::new(base_model, server);
    cfg.lora.rank = t.lora_rank;
    cfg.lora.seed = Some(wb.cfg.seed);
    cfg.grpo = GrpoSettings::default();
    cfg.adam = AdamParams {
        learning_rate: t.learning_rate.unwrap_or(wb.cfg.policy.learning_rate),
        beta1: t.beta1,
        beta2: t.beta2,
        eps: t.eps,
        weight_decay: t.weight_decay,
    };
    cfg.objective = match t.objective {
        TinkerObjective::Exact => ObjectiveMode::Exact,
        TinkerObjective::ServerPpo => ObjectiveMode::ServerPpo,
    };
    cfg.temperature = f64::from(wb.cfg.rollout.temperature);
    cfg.heartbeat_seconds = t.heartbeat_s;
    cfg
}

/// Whether the run trains with the Tinker learner.
pub fn enabled(wb: &Workbench) -> bool {
    wb.cfg.learner == LearnerKind::Tinker
}

/// Before any rollout: the server answers and lists the base model. An unreachable server
/// is an error on `tinker.url`, an unknown model one on `tinker.base_model`.
pub async fn preflight(wb: &Workbench) -> Result<()> {
    let client = client(wb)?;
    let base = base_model(wb)?;
    let url = wb.cfg.tinker.url.clone().unwrap_or_default();
    let caps = client.get_server_capabilities().await.map_err(|e| {
        config_error(
            wb,
            "tinker.url",
            format!(
                "cannot reach the Tinker server at {url}: {e}; start it first, e.g. `python -m tx.tinker.api --base-model {base} --backend jax` (docs/GUIDE.md, \"Training on a Tinker server\")"
            ),
        )
    })?;
    let names: Vec<String> = caps
        .supported_models
        .iter()
        .filter_map(|m| m.model_name.clone())
        .collect();
    if !names.is_empty() && !names.contains(&base) {
        return Err(config_error(
            wb,
            "tinker.base_model",
            format!(
                "the server at {url} trains {names:?}, not `{base}`; start it with --base-model {base}, or set tinker.base_model to the name it lists for the same weights"
            ),
        ));
    }
    Ok(())
}

/// The checkpoint a resume loaded, until the first sync has checked the server's weights
/// against it.
#[derive(Debug, Clone, Default)]
enum Restored {
    /// Nothing to check (a fresh start, or checked).
    #[default]
    None,
    /// The version and learner folder of the loaded checkpoint.
    Pending(u64, PathBuf),
    /// The check failed: every later attempt fails the same way, so a retry cannot let the
    /// run go on with weights the checkpoint does not hold.
    Refused(String),
}

/// A learner on the server whose checkpoints also hold the merged weights of the version they
/// save, so every reader of a checkpoint (calibration, `eval`) finds local weights.
pub struct TinkerRun {
    inner: TinkerLearner,
    local: Arc<CandlePolicy>,
    restored: Arc<Mutex<Restored>>,
}

impl TinkerRun {
    /// Connect to the server and create the model.
    pub async fn connect(wb: &Workbench, local: Arc<CandlePolicy>) -> Result<Self> {
        let client = client(wb)?;
        let cfg = learner_config(wb, base_model(wb)?);
        let inner = TinkerLearner::connect(client, cfg)
            .await
            .map_err(|e| Error::stage("train", e))?;
        Ok(TinkerRun {
            inner,
            local,
            restored: Arc::new(Mutex::new(Restored::None)),
        })
    }

    /// The server-side model.
    pub fn model(&self) -> Arc<TinkerModel> {
        self.inner.model().clone()
    }
}

#[async_trait]
impl Learner for TinkerRun {
    fn name(&self) -> &str {
        self.inner.name()
    }

    async fn update(&mut self, groups: &[Group]) -> harness_core::Result<UpdateReport> {
        self.inner.update(groups).await.map_err(|e| {
            let text = e.to_string();
            if text.contains("Model not found") {
                harness_core::Error::Learner {
                    learner: "tinker".into(),
                    message: format!(
                        "{text}; the server no longer holds this run's model (restarted?): run the same command again (or `harness-s train --resume`) to continue from the latest checkpoint"
                    ),
                }
            } else {
                e
            }
        })
    }

    /// The server's checkpoint, then the merged weights of the same version beside it.
    fn save_checkpoint(&self, dir: &Path) -> harness_core::Result<()> {
        let version = self.inner.policy_version();
        if self.local.weights_version() != Some(version) {
            return Err(harness_core::Error::Learner {
                learner: "tinker".into(),
                message: format!(
                    "checkpointing version {version}, but the policy samples version {:?}: a weight sync was lost",
                    self.local.weights_version()
                ),
            });
        }
        self.inner.save_checkpoint(dir)?;
        self.local.save_hf(dir).map_err(candle_error)
    }

    fn load_checkpoint(&mut self, dir: &Path) -> harness_core::Result<()> {
        self.inner.load_checkpoint(dir)?;
        *self.restored.lock().unwrap_or_else(|e| e.into_inner()) =
            Restored::Pending(self.inner.policy_version(), dir.to_path_buf());
        Ok(())
    }
}

fn candle_error(e: grpo_candle::Error) -> harness_core::Error {
    harness_core::Error::Policy {
        policy: "candle".into(),
        message: e.to_string(),
    }
}

fn sync_error(version: u64, message: impl std::fmt::Display) -> harness_core::Error {
    harness_core::Error::Learner {
        learner: "tinker-weights".into(),
        message: format!("syncing weights version {version}: {message}"),
    }
}

/// What the sync hook needs besides the synced weights.
struct SyncHook {
    local: Arc<CandlePolicy>,
    base: Arc<BaseWeights>,
    model: Arc<TinkerModel>,
    probe: Option<(Vec<u32>, f64)>,
    engine: Option<Arc<dyn WeightSync>>,
    restored: Arc<Mutex<Restored>>,
    log: PathBuf,
}

impl SyncHook {
    async fn run(self: Arc<Self>, w: SyncedWeights) -> harness_core::Result<()> {
        let v = w.version;
        let dir = w
            .local_dir
            .clone()
            .ok_or_else(|| sync_error(v, "the sampler weights were not downloaded"))?;
        let started = Instant::now();
        let hook = self.clone();
        tokio::task::spawn_blocking(move || -> harness_core::Result<()> {
            let adapter = PeftAdapter::load(&dir).map_err(|e| sync_error(v, e))?;
            hook.local
                .load_merged(&hook.base, &adapter, v)
                .map_err(|e| sync_error(v, e))
        })
        .await
        .map_err(|e| sync_error(v, format!("the merge panicked: {e}")))??;
        let merge_seconds = started.elapsed().as_secs_f64();
        self.check_restored(v).await?;
        let (mut probe_seconds, mut probe_max_diff) = (None, None);
        if let Some((ids, tolerance)) = &self.probe {
            let started = Instant::now();
            let server = self
                .model
                .logprobs(ids)
                .await
                .map_err(|e| sync_error(v, format!("scoring the probe on the server: {e}")))?;
            let local = self.local.clone();
            let probe = ids.clone();
            let here = tokio::task::spawn_blocking(move || local.score_tokens(&probe))
                .await
                .map_err(|e| sync_error(v, format!("the probe panicked: {e}")))?
                .map_err(|e| sync_error(v, e))?;
            if server.len() != here.len() {
                return Err(sync_error(
                    v,
                    format!(
                        "the server scored {} probe tokens, this process {}",
                        server.len(),
                        here.len()
                    ),
                ));
            }
            let diff = server
                .iter()
                .zip(&here)
                .map(|(a, b)| (a - f64::from(*b)).abs())
                .fold(0.0, f64::max);
            if !diff.is_finite() || diff > *tolerance {
                return Err(sync_error(
                    v,
                    format!(
                        "the merged weights give probe log-probs that differ from the server's by {diff:.3e} (tinker.check_tolerance {tolerance:e}): a stale or mismatched sync, or a server whose base model is not the run's initial checkpoint"
                    ),
                ));
            }
            probe_seconds = Some(started.elapsed().as_secs_f64());
            probe_max_diff = Some(diff);
        }
        let mut engine_seconds = None;
        if let Some(engine) = &self.engine {
            let started = Instant::now();
            engine.sync(v).await?;
            engine_seconds = Some(started.elapsed().as_secs_f64());
        }
        let record = SyncRecord {
            version: v,
            tinker_path: w.path.clone(),
            save_seconds: w.save_seconds,
            download_seconds: w.download_seconds,
            merge_seconds,
            probe_seconds,
            probe_max_diff,
            engine_seconds,
        };
        harness_core::fsutil::append_json_line(&self.log, &record)
    }

    /// After a resume: the weights the server serves for the restored version must be the
    /// merged weights its checkpoint saved.
    async fn check_restored(&self, version: u64) -> harness_core::Result<()> {
        let restored = self
            .restored
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let (saved_version, dir) = match restored {
            Restored::None => return Ok(()),
            Restored::Refused(why) => return Err(sync_error(version, why)),
            Restored::Pending(v, dir) => (v, dir),
        };
        let refuse = |why: String| {
            *self.restored.lock().unwrap_or_else(|e| e.into_inner()) =
                Restored::Refused(why.clone());
            Err(sync_error(version, why))
        };
        if saved_version != version {
            return refuse(format!(
                "the checkpoint {} holds version {saved_version}, the run resumes at {version}",
                dir.display()
            ));
        }
        let local = self.local.clone();
        let compared = dir.clone();
        let diff = tokio::task::spawn_blocking(move || local.max_weight_diff(&compared))
            .await
            .map_err(|e| sync_error(version, format!("the comparison panicked: {e}")))?;
        match diff {
            Err(e) => refuse(format!(
                "cannot compare the server's weights with the checkpoint {}: {e}",
                dir.display()
            )),
            Ok(d) if d.is_nan() || d > RESUME_WEIGHT_TOLERANCE => refuse(format!(
                "the server's weights for version {version} differ from the run's checkpoint {} by {d:.3e}: the server does not hold the state this run saved; refusing to resume",
                dir.display()
            )),
            Ok(_) => {
                *self.restored.lock().unwrap_or_else(|e| e.into_inner()) = Restored::None;
                Ok(())
            }
        }
    }
}

/// The probe: the first training task's instruction as a user turn, as the policy's chat
/// template renders it, cut to [`PROBE_TOKENS`].
fn probe_tokens(wb: &Workbench, local: &CandlePolicy) -> Result<Vec<u32>> {
    let instruction = wb
        .train
        .first()
        .map(|t| t.instruction.clone())
        .unwrap_or_else(|| "hello".into());
    let messages = vec![harness_core::ChatMessage::user(instruction)];
    let text = local.template().render(&messages, &[], true);
    let mut ids = grpo_candle::model::tokenizer::encode(local.tokenizer(), &text)
        .map_err(|e| Error::stage("train", e))?;
    ids.truncate(PROBE_TOKENS);
    Ok(ids)
}

/// The training stage's weight sync: save on the server, download, merge into `local` from
/// `base`, probe, then push to `engine` when rollouts run on vLLM / SGLang.
pub fn sampler_sync(
    wb: &Workbench,
    run: &TinkerRun,
    local: Arc<CandlePolicy>,
    base: Arc<BaseWeights>,
    engine: Option<Arc<dyn WeightSync>>,
    run_dir: &Path,
) -> Result<Arc<dyn WeightSync>> {
    let probe = if wb.cfg.tinker.check_sync {
        Some((probe_tokens(wb, &local)?, wb.cfg.tinker.check_tolerance))
    } else {
        None
    };
    let dir = run_dir.join(SAMPLER_DIR);
    // An adapter is far smaller than the model; twice the model's f32 weights bounds it.
    let max_bytes = 2 * base.bytes() as u64 + (64 << 20);
    let hook = Arc::new(SyncHook {
        local,
        base,
        model: run.model(),
        probe,
        engine,
        restored: run.restored.clone(),
        log: dir.join(SYNCS_FILE),
    });
    let sync = TinkerWeightSync::new(run.model(), SyncTarget::Sampler, "harness-sampler")
        .with_download(dir, max_bytes)
        .with_reload(move |w| {
            let hook = hook.clone();
            Box::pin(hook.run(w))
        });
    Ok(Arc::new(sync))
}

/// Before resuming a training run: its latest checkpoint was written by the learner this run
/// trains with, and that checkpoint's learner state and run state name the same version.
pub fn check_resume(wb: &Workbench, run_dir: &Path) -> Result<()> {
    let Some((dir, state)) = harness_rollout::latest_checkpoint(run_dir).at("train")? else {
        return Ok(());
    };
    let learner_dir = dir.join(harness_rollout::checkpoint::LEARNER_DIR);
    let tinker_file = learner_dir.join(harness_tinker::LEARNER_FILE);
    let candle_file = learner_dir.join(grpo_candle::train::learner::LEARNER_FILE);
    let refuse = |message: String| Err(Error::input("train", &learner_dir, message));
    match wb.cfg.learner {
        LearnerKind::Candle if tinker_file.is_file() => refuse(
            "this run was trained with learner = \"tinker\"; resume it with --learner tinker (and its server), or choose another `out`".into(),
        ),
        LearnerKind::Tinker if candle_file.is_file() => refuse(
            "this run was trained with learner = \"candle\"; resume it with --learner candle, or choose another `out`".into(),
        ),
        LearnerKind::Tinker => {
            let saved = harness_tinker::read_saved(&learner_dir).at("train")?;
            if saved.policy_version != state.policy_version {
                return refuse(format!(
                    "{} holds policy version {}, the run state {}: the checkpoint is inconsistent",
                    tinker_file.display(),
                    saved.policy_version,
                    state.policy_version
                ));
            }
            Ok(())
        }
        LearnerKind::Candle => Ok(()),
    }
}
