//! [`TinkerLearner`]: harness-core's [`Learner`] on a remote Tinker training engine, with the
//! paper's objective (Eqs. 13-16) computed in Rust and handed to the server as per-token loss
//! weights.
//!
//! # One update
//! 1. Every trajectory's policy turns become sequences in their own generating context
//!    (consecutive turns whose context extends the previous turn's context and tokens share
//!    one sequence; any other turn starts a new one). Only generated tokens are scored;
//!    harness and environment tokens are context with weight 0.
//! 2. `forward` returns `log pi_old` of every scored token (the adapter before the update).
//! 3. In Rust: advantages (Eq. 6), each token's share `1 / (|B| N_x)`, the detached weight
//!    `clip(pi_old / q, 0, 2)` and `g_k = d(-J)/d logp_k` of Eq. 15 ([`crate::objective`]).
//! 4. `forward_backward` with a loss whose gradient is `sum_k g_k dlogp_k/dtheta`:
//!    * [`ServerKind::Tinker`] (hosted Tinker sums per-token losses): `cross_entropy` with
//!      `weights = -g`, so the loss `-sum_k weights_k logp_k` has exactly that gradient;
//!    * [`ServerKind::SkyrlTx`] (SkyRL's server divides each example's loss by the sum of its
//!      weights and averages over the examples since the last step, which would flip or blow
//!      up negative weights): `importance_sampling` with `weights` = the 0/1 policy mask,
//!      `logprobs` = the `forward` log-probs (so the ratio is 1 at the current weights) and
//!      `advantages = -g * n_d * N` (`n_d` scored tokens of the example, `N` examples), which
//!      undoes both divisions. The loss it reports is then `sum_k g_k = -J` on-policy.
//! 5. `optim_step` with [`AdamParams`]; the policy version is bumped.
//!
//! [`ObjectiveMode::ServerPpo`] instead sends one `forward_backward` with the server's `ppo`
//! loss and asymmetric thresholds `0.80 / 1.28` (hosted Tinker reads `clip_low_threshold` and
//! `clip_high_threshold`): one call fewer, but its ratio is taken against the rollout
//! log-probs `q` rather than `pi_old`, and it has no detached weight `clip(pi_old / q, 0, 2)`.
//! It equals Eq. 15 only when the rollout engine samples exactly the trained policy. SkyRL's
//! server (0.3.0) clips its `ppo` loss at a fixed 0.8 / 1.2 and ignores the thresholds, so the
//! mode is refused there.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use harness_core::{Group, Learner, UpdateReport};
use serde::{Deserialize, Serialize};

use crate::client::{TinkerClient, nonce};
use crate::error::{Error, Result};
use crate::objective::{GrpoSettings, TokenTerm, eq15, group_advantages};
use crate::protocol::{
    AdamParams, Datum, ForwardBackwardInput, ForwardBackwardOutput, LoraConfig, LossFn, ModelInput,
    TensorData,
};

/// The learner's file inside a checkpoint folder.
pub const LEARNER_FILE: &str = "tinker_learner.json";

/// How the server reduces per-token losses (which decides how Eq. 15's gradient is encoded).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerKind {
    /// Hosted Tinker: the loss is the sum of the per-token losses.
    Tinker,
    /// SkyRL's self-hosted server (`skyrl-tx`): per example, the per-token losses summed and
    /// divided by the sum of the example's weights; examples averaged at `optim_step`.
    SkyrlTx,
}

/// Which loss the server back-propagates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectiveMode {
    /// Eq. 15 exactly: `forward`, the gradient in Rust, then a weighted `forward_backward`.
    Exact,
    /// The server's `ppo` loss with asymmetric thresholds, in one call (see the module docs
    /// for how it differs from Eq. 15). Only for [`ServerKind::Tinker`].
    ServerPpo,
}

/// Everything the learner is configured with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TinkerLearnerConfig {
    /// The base model, as the server lists it (`get_server_capabilities`).
    pub base_model: String,
    /// The LoRA adapter the server trains.
    pub lora: LoraConfig,
    /// The objective's settings (paper values by default).
    pub grpo: GrpoSettings,
    /// The optimizer's settings, sent with every `optim_step`.
    pub adam: AdamParams,
    /// How the server reduces losses.
    pub server: ServerKind,
    /// Which loss is sent.
    pub objective: ObjectiveMode,
    /// The temperature rollouts were sampled at (the server's log-probs are at 1). Only 1 is
    /// accepted: Eq. 16's weight compares `q` with the server's `pi_old`.
    pub temperature: f64,
    /// Prefix of checkpoint names on the server.
    pub checkpoint_prefix: String,
    /// Seconds between session heartbeats (servers unload the models of silent sessions).
    pub heartbeat_seconds: f64,
}

impl TinkerLearnerConfig {
    /// Paper objective, grpo-candle's AdamW defaults, rank-32 LoRA, for `server`.
    pub fn new(base_model: impl Into<String>, server: ServerKind) -> Self {
        TinkerLearnerConfig {
            base_model: base_model.into(),
            lora: LoraConfig {
                rank: 32,
                seed: Some(0),
                train_attn: true,
                train_mlp: true,
                train_unembed: false,
            },
            grpo: GrpoSettings::default(),
            adam: AdamParams::default(),
            server,
            objective: ObjectiveMode::Exact,
            temperature: 1.0,
            checkpoint_prefix: "harness".into(),
            heartbeat_seconds: 10.0,
        }
    }

    /// Check every field; the error names it.
    pub fn validate(&self) -> Result<()> {
        if self.base_model.trim().is_empty() {
            return Err(Error::config(
                "base_model",
                "must name the server's base model",
            ));
        }
        if self.lora.rank == 0 {
            return Err(Error::config("lora.rank", "must be at least 1"));
        }
        let g = &self.grpo;
        if !(0.0..1.0).contains(&g.clip_low) || g.clip_high < 0.0 || g.weight_cap <= 0.0 {
            return Err(Error::config(
                "grpo",
                format!("expected 0 <= clip_low < 1, clip_high >= 0, weight_cap > 0, got {g:?}"),
            ));
        }
        let lr = self.adam.learning_rate;
        if lr.is_nan() || lr < 0.0 {
            return Err(Error::config(
                "adam.learning_rate",
                format!("must be a number >= 0, got {lr}"),
            ));
        }
        if self.temperature != 1.0 {
            return Err(Error::config(
                "temperature",
                "the server scores at temperature 1; rollouts must be sampled at 1",
            ));
        }
        if self.objective == ObjectiveMode::ServerPpo && self.server == ServerKind::SkyrlTx {
            return Err(Error::config(
                "objective",
                "server_ppo needs a server that honours clip_low_threshold / clip_high_threshold; \
                 SkyRL's server (skyrl-tx 0.3.0) clips its ppo loss at a fixed 0.8 / 1.2: use `exact`",
            ));
        }
        if self.heartbeat_seconds <= 0.0 || !self.heartbeat_seconds.is_finite() {
            return Err(Error::config("heartbeat_seconds", "must be positive"));
        }
        if self.checkpoint_prefix.is_empty()
            || !self
                .checkpoint_prefix
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(Error::config(
                "checkpoint_prefix",
                "expected letters, digits, `_` or `-`",
            ));
        }
        Ok(())
    }
}

/// The server-side model the learner trains, shared with [`crate::TinkerWeightSync`].
#[derive(Debug)]
pub struct TinkerModel {
    pub(crate) client: TinkerClient,
    pub(crate) session_id: String,
    pub(crate) model_id: RwLock<String>,
}

impl TinkerModel {
    /// The model's id on the server.
    pub fn model_id(&self) -> String {
        self.model_id
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The session it lives in.
    pub fn session_id(&self) -> &str {
        &self.session_id
    }

    /// The client.
    pub fn client(&self) -> &TinkerClient {
        &self.client
    }

    /// `log p(ids[i] | ids[..i])` for `i` in `1..ids.len()` under the current weights (a
    /// `forward` with `cross_entropy` and weight 1 on every target): `ids.len() - 1` values,
    /// none for fewer than two ids.
    pub async fn logprobs(&self, ids: &[u32]) -> Result<Vec<f64>> {
        if ids.len() < 2 {
            return Ok(Vec::new());
        }
        let seq = Sequence {
            task: 0,
            ids: ids.to_vec(),
            policy_pos: (1..ids.len()).collect(),
            rollout_logp: Vec::new(),
            advantage: 0.0,
        };
        let input = ForwardBackwardInput {
            data: vec![seq.datum(&vec![1.0; ids.len() - 1], None, None)],
            loss_fn: LossFn::CrossEntropy,
            loss_fn_config: None,
        };
        let out = self.client.forward(&self.model_id(), &input).await?;
        let batch = Batch {
            sequences: vec![seq],
            task_tokens: vec![ids.len() - 1],
        };
        scored(&batch, &out, "logprobs", "forward")
    }
}

/// One training sequence: a packed run of one trajectory's turns.
#[derive(Debug, Clone, PartialEq)]
pub struct Sequence {
    /// The group (task) it belongs to.
    pub task: usize,
    /// Contexts and generated tokens, in order.
    pub ids: Vec<u32>,
    /// Positions `p >= 1` of generated tokens in `ids` (the loss mask), ascending.
    pub policy_pos: Vec<usize>,
    /// `log q` of each scored token.
    pub rollout_logp: Vec<f64>,
    /// The trajectory's advantage (Eq. 6).
    pub advantage: f64,
}

impl Sequence {
    /// The example the server reads: `ids[..n-1]` predicting `ids[1..]`, with `weights` at the
    /// scored positions (`p - 1`) and 0 elsewhere, plus optional per-position `logprobs` and
    /// `advantages` (0 outside the scored positions).
    fn datum(
        &self,
        weights: &[f64],
        logprobs: Option<&[f64]>,
        advantages: Option<&[f64]>,
    ) -> Datum {
        let n = self.ids.len() - 1;
        let spread = |vals: &[f64]| {
            let mut v = vec![0.0; n];
            for (&p, &x) in self.policy_pos.iter().zip(vals) {
                v[p - 1] = x;
            }
            TensorData::floats(v)
        };
        let mut inputs = BTreeMap::new();
        inputs.insert(
            "target_tokens".to_string(),
            TensorData::ints(&self.ids[1..]),
        );
        inputs.insert("weights".to_string(), spread(weights));
        if let Some(l) = logprobs {
            inputs.insert("logprobs".to_string(), spread(l));
        }
        if let Some(a) = advantages {
            inputs.insert("advantages".to_string(), spread(a));
        }
        Datum {
            model_input: ModelInput::from_tokens(self.ids[..n].to_vec()),
            loss_fn_inputs: inputs,
        }
    }
}

/// The batch's sequences and each task's scored-token count `N_x`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Batch {
    /// Sequences with at least one scored token.
    pub sequences: Vec<Sequence>,
    /// `N_x` per group, in group order.
    pub task_tokens: Vec<usize>,
}

impl Batch {
    /// Scored tokens in all.
    pub fn tokens(&self) -> usize {
        self.task_tokens.iter().sum()
    }

    /// `1 / (|B| N_x)` for a token of `task`.
    pub fn coef(&self, task: usize) -> f64 {
        1.0 / (self.task_tokens.len() as f64 * self.task_tokens[task] as f64)
    }
}

/// Turns groups into training sequences (module docs, step 1); checks every turn's token and
/// log-prob counts and refuses rollouts whose `q` is not the full-vocabulary temperature-1
/// distribution (top-p < 1, a top-k, greedy, another temperature): Eq. 16's weight would be
/// biased.
pub fn build_batch(groups: &[Group], cfg: &GrpoSettings) -> Result<Batch> {
    let mut batch = Batch::default();
    for (task, g) in groups.iter().enumerate() {
        let adv = group_advantages(&g.rewards(), cfg.adv_eps);
        let mut n_x = 0;
        for (t, (traj, &a)) in g.trajectories.iter().zip(&adv).enumerate() {
            let mut cur: Option<Sequence> = None;
            let mut done = Vec::new();
            for (k, turn) in traj.turns.iter().enumerate() {
                let at = || {
                    format!(
                        "task `{}` trajectory {t} (seed {}) turn {k}",
                        g.task.id, traj.seed
                    )
                };
                if turn.tokens.len() != turn.logprobs.len() {
                    return Err(Error::Data(format!(
                        "{}: {} generated tokens but {} rollout log-probs",
                        at(),
                        turn.tokens.len(),
                        turn.logprobs.len()
                    )));
                }
                if let Some(s) = &turn.sampling
                    && (s.greedy || s.top_p < 1.0 || s.top_k.is_some() || s.temperature != 1.0)
                {
                    return Err(Error::Data(format!(
                        "{}: sampled with {s:?}; the learner needs rollouts at temperature 1 over \
                         the full vocabulary (no top-p, top-k or greedy) so that clip(pi_old / q, 0, 2) \
                         compares like with like",
                        at()
                    )));
                }
                if turn.tokens.is_empty() {
                    continue;
                }
                let extends = cur.as_ref().is_some_and(|s| {
                    turn.context_tokens.len() >= s.ids.len()
                        && turn.context_tokens.starts_with(&s.ids)
                });
                if !extends {
                    done.extend(cur.take());
                    cur = Some(Sequence {
                        task,
                        ids: turn.context_tokens.clone(),
                        policy_pos: Vec::new(),
                        rollout_logp: Vec::new(),
                        advantage: a,
                    });
                }
                let s = cur.as_mut().unwrap_or_else(|| unreachable!("set above"));
                let n = s.ids.len();
                s.ids
                    .extend_from_slice(&turn.context_tokens[n.min(turn.context_tokens.len())..]);
                for (&tok, &lq) in turn.tokens.iter().zip(&turn.logprobs) {
                    let p = s.ids.len();
                    s.ids.push(tok);
                    if p >= 1 {
                        s.policy_pos.push(p);
                        s.rollout_logp.push(f64::from(lq));
                    }
                }
            }
            done.extend(cur);
            for s in done.into_iter().filter(|s| !s.policy_pos.is_empty()) {
                n_x += s.policy_pos.len();
                batch.sequences.push(s);
            }
        }
        batch.task_tokens.push(n_x);
    }
    Ok(batch)
}

/// The learner's part of a checkpoint (`tinker_learner.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedCheckpoint {
    /// The base model trained.
    pub base_model: String,
    /// The server's model the weights were saved from.
    pub model_id: String,
    /// The training checkpoint's `tinker://` path (adapter and optimizer state).
    pub weights_path: String,
    /// Optimizer steps applied when it was saved.
    pub optimizer_steps: u64,
    /// The policy version when it was saved.
    pub policy_version: u64,
    /// The settings that shape the update (absent in files of older versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub settings: Option<SavedSettings>,
}

/// The LoRA settings a checkpoint's adapter was trained with (its seed only matters before the
/// first load).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedLora {
    /// Rank.
    pub rank: u32,
    /// Attention projections adapted.
    pub train_attn: bool,
    /// MLP adapted.
    pub train_mlp: bool,
    /// Unembedding adapted.
    pub train_unembed: bool,
}

/// The learner settings a checkpoint was trained with; a resume must use the same (only the
/// URL, timeouts and heartbeat may change).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SavedSettings {
    /// How the server reduces losses.
    pub server: ServerKind,
    /// Which loss is sent.
    pub objective: ObjectiveMode,
    /// The adapter.
    pub lora: SavedLora,
    /// The objective's settings.
    pub grpo: GrpoSettings,
    /// The optimizer's settings.
    pub adam: AdamParams,
}

impl SavedSettings {
    /// The settings of `cfg`.
    pub fn of(cfg: &TinkerLearnerConfig) -> Self {
        SavedSettings {
            server: cfg.server,
            objective: cfg.objective,
            lora: SavedLora {
                rank: cfg.lora.rank,
                train_attn: cfg.lora.train_attn,
                train_mlp: cfg.lora.train_mlp,
                train_unembed: cfg.lora.train_unembed,
            },
            grpo: cfg.grpo,
            adam: cfg.adam,
        }
    }

    /// The first setting that differs from `now`: its dotted name, its value here and in
    /// `now`.
    pub fn drift(&self, now: &SavedSettings) -> Option<(String, String, String)> {
        let a = serde_json::to_value(self).unwrap_or_else(|_| unreachable!("plain data"));
        let b = serde_json::to_value(now).unwrap_or_else(|_| unreachable!("plain data"));
        first_difference("", &a, &b)
    }
}

fn first_difference(
    at: &str,
    a: &serde_json::Value,
    b: &serde_json::Value,
) -> Option<(String, String, String)> {
    use serde_json::Value;
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let name = if at.is_empty() {
                    k.clone()
                } else {
                    format!("{at}.{k}")
                };
                first_difference(
                    &name,
                    x.get(k).unwrap_or(&Value::Null),
                    y.get(k).unwrap_or(&Value::Null),
                )
            })
        }
        _ if a == b => None,
        _ => Some((at.to_string(), a.to_string(), b.to_string())),
    }
}

/// Read `dir/tinker_learner.json` (e.g. to check a run's state against it before resuming).
pub fn read_saved(dir: &Path) -> harness_core::Result<SavedCheckpoint> {
    let path = dir.join(LEARNER_FILE);
    let text = std::fs::read_to_string(&path).map_err(|e| harness_core::Error::io(&path, e))?;
    serde_json::from_str(&text).map_err(|e| harness_core::Error::Parse {
        location: harness_core::Location::at("").in_file(&path),
        message: format!(
            "{e}; expected {{\"base_model\", \"model_id\", \"weights_path\", \"optimizer_steps\", \"policy_version\", \"settings\"}}"
        ),
    })
}

/// Whether a failed `load_weights` says the checkpoint is gone (not the model).
fn checkpoint_missing(e: &Error) -> bool {
    let says_missing = |m: &str| {
        let m = m.to_lowercase();
        (m.contains("not found") || m.contains("does not exist") || m.contains("no such"))
            && !m.contains("model not found")
    };
    match e {
        Error::Http {
            status: Some(404),
            message,
            ..
        } => !message.to_lowercase().contains("model not found"),
        Error::Http { message, .. } | Error::FutureFailed { message, .. } => says_missing(message),
        _ => false,
    }
}

/// A learner whose weights, gradients and optimizer live on a Tinker server.
pub struct TinkerLearner {
    name: String,
    cfg: TinkerLearnerConfig,
    model: Arc<TinkerModel>,
    steps: u64,
    version: u64,
    /// Why no further update may be taken: a gradient reached the server but its update was
    /// not completed, so the server holds a pending gradient that the next `forward_backward`
    /// would add to.
    broken: Option<String>,
    heartbeat: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for TinkerLearner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TinkerLearner")
            .field("model", &self.model)
            .field("steps", &self.steps)
            .field("version", &self.version)
            .finish_non_exhaustive()
    }
}

impl Drop for TinkerLearner {
    fn drop(&mut self) {
        self.heartbeat.abort();
    }
}

/// Run `f` to completion from synchronous code (the [`Learner`] checkpoint hooks) on any
/// runtime: in place on a multi-threaded one, else on a helper thread with its own runtime and
/// its own connection pool.
pub(crate) fn block_on<T, F, Fut>(client: &TinkerClient, f: F) -> Result<T>
where
    T: Send,
    F: FnOnce(TinkerClient) -> Fut + Send,
    Fut: std::future::Future<Output = Result<T>>,
{
    use tokio::runtime::{Handle, RuntimeFlavor};
    if let Ok(h) = Handle::try_current()
        && h.runtime_flavor() == RuntimeFlavor::MultiThread
    {
        return tokio::task::block_in_place(|| h.block_on(f(client.clone())));
    }
    std::thread::scope(|s| {
        s.spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| Error::Protocol(format!("cannot start a runtime: {e}")))?;
            let c = client.detached()?;
            rt.block_on(f(c))
        })
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    })
}

/// Per-token values of the sequences, concatenated in order: the scored positions of each
/// example's output tensor `key`.
fn scored(batch: &Batch, out: &ForwardBackwardOutput, key: &str, op: &str) -> Result<Vec<f64>> {
    if out.loss_fn_outputs.len() != batch.sequences.len() {
        return Err(Error::Protocol(format!(
            "{op}: {} outputs for {} examples",
            out.loss_fn_outputs.len(),
            batch.sequences.len()
        )));
    }
    let mut v = Vec::with_capacity(batch.tokens());
    for (d, (s, o)) in batch.sequences.iter().zip(&out.loss_fn_outputs).enumerate() {
        let t = o.get(key).ok_or_else(|| {
            Error::Protocol(format!(
                "{op}: example {d} has no `{key}` output (has {:?})",
                o.keys()
            ))
        })?;
        if t.data.len() < s.ids.len() - 1 {
            return Err(Error::Protocol(format!(
                "{op}: example {d} has {} `{key}` values for {} positions",
                t.data.len(),
                s.ids.len() - 1
            )));
        }
        v.extend(s.policy_pos.iter().map(|&p| t.data[p - 1]));
    }
    Ok(v)
}

impl TinkerLearner {
    /// Open a session on the server, check that it serves `cfg.base_model`, create the LoRA
    /// model and start the heartbeat.
    pub async fn connect(client: TinkerClient, cfg: TinkerLearnerConfig) -> Result<Self> {
        cfg.validate()?;
        let caps = client.get_server_capabilities().await?;
        let names: Vec<String> = caps
            .supported_models
            .iter()
            .filter_map(|m| m.model_name.clone())
            .collect();
        if !names.is_empty() && !names.iter().any(|n| n == &cfg.base_model) {
            return Err(Error::config(
                "base_model",
                format!(
                    "the server does not train `{}`; it lists {names:?}",
                    cfg.base_model
                ),
            ));
        }
        let session_id = client.create_session(vec!["harness-s".into()]).await?;
        let model_id = client
            .create_model(&session_id, &cfg.base_model, &cfg.lora)
            .await?;
        tracing::info!(%session_id, %model_id, base_model = %cfg.base_model, "tinker model created");
        let model = Arc::new(TinkerModel {
            client: client.clone(),
            session_id: session_id.clone(),
            model_id: RwLock::new(model_id),
        });
        let every = Duration::from_secs_f64(cfg.heartbeat_seconds);
        let hb_client = client.clone();
        let heartbeat = tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            tick.tick().await;
            loop {
                tick.tick().await;
                if let Err(e) = hb_client.session_heartbeat(&session_id).await {
                    tracing::warn!(session = %session_id, error = %e, "tinker heartbeat failed");
                }
            }
        });
        Ok(TinkerLearner {
            name: "tinker".into(),
            cfg,
            model,
            steps: 0,
            version: 0,
            broken: None,
            heartbeat,
        })
    }

    /// The server-side model (shared with weight syncs).
    pub fn model(&self) -> &Arc<TinkerModel> {
        &self.model
    }

    /// The settings.
    pub fn config(&self) -> &TinkerLearnerConfig {
        &self.cfg
    }

    /// Optimizer steps applied so far.
    pub fn optimizer_steps(&self) -> u64 {
        self.steps
    }

    /// The current weights' version (one per applied update).
    pub fn policy_version(&self) -> u64 {
        self.version
    }

    /// The batch's sequences and the server's current log-prob of each scored token, in order.
    pub async fn score(&self, groups: &[Group]) -> Result<(Batch, Vec<f64>)> {
        let batch = build_batch(groups, &self.cfg.grpo)?;
        if batch.sequences.is_empty() {
            return Ok((batch, Vec::new()));
        }
        let data = batch
            .sequences
            .iter()
            .map(|s| s.datum(&vec![1.0; s.policy_pos.len()], None, None))
            .collect();
        let input = ForwardBackwardInput {
            data,
            loss_fn: LossFn::CrossEntropy,
            loss_fn_config: None,
        };
        let out = self
            .model
            .client
            .forward(&self.model.model_id(), &input)
            .await?;
        let logp = scored(&batch, &out, "logprobs", "forward")?;
        Ok((batch, logp))
    }

    /// One update (module docs); the crate's error type. Once an update has failed after its
    /// `forward_backward` reached the server, every later call is refused: the server may hold
    /// that gradient, and the next `forward_backward` would add to it.
    pub async fn step(&mut self, groups: &[Group]) -> Result<UpdateReport> {
        if let Some(why) = &self.broken {
            return Err(Error::Data(format!(
                "no update after a failed one ({why}): the server may hold its gradient, which \
                 the next forward_backward would add to; connect a new learner and load the \
                 latest checkpoint"
            )));
        }
        let started = Instant::now();
        let cfg = self.cfg.clone();
        let model_id = self.model.model_id();
        let client = self.model.client.clone();
        let (batch, logp_old, fb_input, expected, eq) = match cfg.objective {
            ObjectiveMode::Exact => {
                let (batch, logp_old) = self.score(groups).await?;
                if batch.sequences.is_empty() {
                    return Ok(self.skipped(groups, started));
                }
                let terms = self.terms(&batch, &logp_old, None);
                let eq = eq15(&terms, &cfg.grpo);
                let n = batch.sequences.len() as f64;
                let mut k = 0;
                let mut data = Vec::with_capacity(batch.sequences.len());
                let mut expected = 0.0;
                for s in &batch.sequences {
                    let m = s.policy_pos.len();
                    let g = &eq.grad[k..k + m];
                    let lo = &logp_old[k..k + m];
                    k += m;
                    data.push(match cfg.server {
                        ServerKind::Tinker => {
                            let w: Vec<f64> = g.iter().map(|x| -x).collect();
                            expected += g.iter().zip(lo).map(|(g, l)| g * l).sum::<f64>();
                            s.datum(&w, None, None)
                        }
                        ServerKind::SkyrlTx => {
                            let scale = m as f64 * n;
                            let adv: Vec<f64> = g.iter().map(|x| -x * scale).collect();
                            expected += g.iter().sum::<f64>();
                            s.datum(&vec![1.0; m], Some(lo), Some(&adv))
                        }
                    });
                }
                let loss_fn = match cfg.server {
                    ServerKind::Tinker => LossFn::CrossEntropy,
                    ServerKind::SkyrlTx => LossFn::ImportanceSampling,
                };
                let input = ForwardBackwardInput {
                    data,
                    loss_fn,
                    loss_fn_config: None,
                };
                (batch, Some(logp_old), input, Some(expected), eq)
            }
            ObjectiveMode::ServerPpo => {
                let batch = build_batch(groups, &cfg.grpo)?;
                if batch.sequences.is_empty() {
                    return Ok(self.skipped(groups, started));
                }
                let data = batch
                    .sequences
                    .iter()
                    .map(|s| {
                        let c = batch.coef(s.task);
                        let adv = vec![s.advantage * c; s.policy_pos.len()];
                        s.datum(
                            &vec![1.0; s.policy_pos.len()],
                            Some(&s.rollout_logp),
                            Some(&adv),
                        )
                    })
                    .collect();
                let config = BTreeMap::from([
                    ("clip_low_threshold".to_string(), 1.0 - cfg.grpo.clip_low),
                    ("clip_high_threshold".to_string(), 1.0 + cfg.grpo.clip_high),
                ]);
                let input = ForwardBackwardInput {
                    data,
                    loss_fn: LossFn::Ppo,
                    loss_fn_config: Some(config),
                };
                (batch, None, input, None, crate::objective::Eq15::default())
            }
        };
        // From here until optim_step completes, a failure leaves a gradient on the server.
        let next = self.steps + 1;
        let pending = move |e: &Error| format!("update {next} failed after forward_backward: {e}");
        let out = match client.forward_backward(&model_id, &fb_input).await {
            Ok(out) => out,
            Err(e) => {
                self.broken = Some(pending(&e));
                return Err(e);
            }
        };
        let checked = scored(&batch, &out, "logprobs", "forward_backward").and_then(|logp| {
            let server_loss = server_surrogate(&batch, &out, cfg.server)?;
            check_reduction(server_loss, expected, cfg.server)?;
            Ok((logp, server_loss))
        });
        let (logp_fb, server_loss) = match checked {
            Ok(v) => v,
            Err(e) => {
                self.broken = Some(pending(&e));
                return Err(e);
            }
        };
        let mut extra = BTreeMap::new();
        if let Some(v) = server_loss {
            extra.insert("server_surrogate".to_string(), v);
        }
        if let Some(v) = expected {
            extra.insert("expected_surrogate".to_string(), v);
        }
        // Eq. 15 at the weights the gradient was taken at (for ServerPpo: pi_old = q).
        let eq = match &logp_old {
            Some(lo) => {
                let drift = lo
                    .iter()
                    .zip(&logp_fb)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0.0, f64::max);
                extra.insert("logprob_drift".to_string(), drift);
                eq
            }
            None => eq15(&self.terms(&batch, &logp_fb, Some(())), &cfg.grpo),
        };
        if let Err(e) = client.optim_step(&model_id, cfg.adam).await {
            self.broken = Some(pending(&e));
            return Err(e);
        }
        self.steps += 1;
        self.version += 1;
        let t = batch.tokens().max(1) as f64;
        extra.insert("ratio_mean".into(), eq.ratio_sum / t);
        extra.insert("ratio_min".into(), eq.ratio_min);
        extra.insert("ratio_max".into(), eq.ratio_max);
        extra.insert("sequences".into(), batch.sequences.len() as f64);
        Ok(UpdateReport {
            applied: true,
            optimizer_steps: self.steps,
            policy_version: self.version,
            loss: match cfg.objective {
                ObjectiveMode::Exact => eq.loss,
                ObjectiveMode::ServerPpo => server_loss.unwrap_or(eq.loss),
            },
            // The server does not report the gradient norm.
            grad_norm: 0.0,
            lr: cfg.adam.learning_rate,
            policy_tokens: batch.tokens(),
            clip_frac_low: eq.clipped_low as f64 / t,
            clip_frac_high: eq.clipped_high as f64 / t,
            weight_mean: eq.weight_sum / t,
            weight_clipped_frac: eq.weight_clipped as f64 / t,
            seconds: started.elapsed().as_secs_f64(),
            extra,
        })
    }

    /// Eq. 15's per-token inputs with `logp_new = logp_old = logp` (the update is taken at
    /// `pi_old`); with `rollout_as_old`, `pi_old = q` (what the server's `ppo` loss assumes).
    fn terms(&self, batch: &Batch, logp: &[f64], rollout_as_old: Option<()>) -> Vec<TokenTerm> {
        let mut out = Vec::with_capacity(logp.len());
        let mut k = 0;
        for s in &batch.sequences {
            let c = batch.coef(s.task);
            for &lq in &s.rollout_logp {
                out.push(TokenTerm {
                    logp_new: logp[k],
                    logp_old: if rollout_as_old.is_some() {
                        lq
                    } else {
                        logp[k]
                    },
                    logp_rollout: lq,
                    advantage: s.advantage,
                    coef: c,
                });
                k += 1;
            }
        }
        out
    }

    fn skipped(&self, groups: &[Group], started: Instant) -> UpdateReport {
        tracing::info!(
            groups = groups.len(),
            "tinker update: no scored policy token; no step"
        );
        UpdateReport {
            applied: false,
            optimizer_steps: self.steps,
            policy_version: self.version,
            lr: self.cfg.adam.learning_rate,
            seconds: started.elapsed().as_secs_f64(),
            ..UpdateReport::default()
        }
    }

    /// `save_weights` under a fresh name; the `tinker://` path.
    pub async fn save_weights(&self) -> Result<String> {
        let name = format!(
            "{}-step{}-{}",
            self.cfg.checkpoint_prefix,
            self.steps,
            nonce()
        );
        self.model
            .client
            .save_weights(&self.model.model_id(), &name)
            .await
    }

    fn error(&self, e: impl std::fmt::Display) -> harness_core::Error {
        harness_core::Error::Learner {
            learner: self.name.clone(),
            message: e.to_string(),
        }
    }
}

/// The server's surrogate against the value the learner's encoding implies: a server that
/// reduces per-token losses otherwise than `server` describes applies a differently scaled
/// gradient, and is refused before its optimizer step.
fn check_reduction(server: Option<f64>, expected: Option<f64>, kind: ServerKind) -> Result<()> {
    let (Some(s), Some(e)) = (server, expected) else {
        return Ok(());
    };
    if (s - e).abs() <= 1e-4 * e.abs().max(1.0) {
        return Ok(());
    }
    Err(Error::Protocol(format!(
        "forward_backward reported a surrogate of {s:.6e} where {e:.6e} was expected: the \
         server does not reduce the loss the way `server = {kind:?}` assumes, so the gradient \
         it applied is not Eq. 15's; no optimizer step was taken (check `server` in the \
         learner's configuration)"
    )))
}

/// What the server says its surrogate loss was, in the learner's units.
fn server_surrogate(
    batch: &Batch,
    out: &ForwardBackwardOutput,
    server: ServerKind,
) -> Result<Option<f64>> {
    if let Some(v) = out.metrics.get("loss:sum") {
        return Ok(Some(*v));
    }
    let Some(_) = out
        .loss_fn_outputs
        .first()
        .and_then(|o| o.get("elementwise_loss"))
    else {
        return Ok(None);
    };
    let n = batch.sequences.len() as f64;
    let mut total = 0.0;
    for (d, (s, o)) in batch.sequences.iter().zip(&out.loss_fn_outputs).enumerate() {
        let t = o.get("elementwise_loss").ok_or_else(|| {
            Error::Protocol(format!(
                "forward_backward: example {d} has no `elementwise_loss`"
            ))
        })?;
        let sum: f64 = t.data.iter().sum();
        total += match server {
            ServerKind::Tinker => sum,
            ServerKind::SkyrlTx => sum / s.policy_pos.len() as f64 / n,
        };
    }
    Ok(Some(total))
}

#[async_trait]
impl Learner for TinkerLearner {
    fn name(&self) -> &str {
        &self.name
    }

    async fn update(&mut self, groups: &[Group]) -> harness_core::Result<UpdateReport> {
        self.step(groups).await.map_err(|e| self.error(e))
    }

    /// `save_weights` on the server (adapter and optimizer state), then the `tinker://` path
    /// and the counters into `dir/tinker_learner.json`.
    fn save_checkpoint(&self, dir: &Path) -> harness_core::Result<()> {
        let model_id = self.model.model_id();
        let name = format!(
            "{}-step{}-{}",
            self.cfg.checkpoint_prefix,
            self.steps,
            nonce()
        );
        let path = block_on(&self.model.client, |c| {
            let (m, n) = (model_id.clone(), name.clone());
            async move { c.save_weights(&m, &n).await }
        })
        .map_err(|e| self.error(e))?;
        let saved = SavedCheckpoint {
            base_model: self.cfg.base_model.clone(),
            model_id,
            weights_path: path,
            optimizer_steps: self.steps,
            policy_version: self.version,
            settings: Some(SavedSettings::of(&self.cfg)),
        };
        let json = serde_json::to_vec_pretty(&saved).unwrap_or_else(|_| unreachable!("plain data"));
        std::fs::create_dir_all(dir).map_err(|e| harness_core::Error::io(dir, e))?;
        harness_core::fsutil::write_atomic(&dir.join(LEARNER_FILE), &json)
    }

    /// `load_weights` of the saved `tinker://` path into the current model, and the counters.
    /// Refused when the checkpoint was trained with other settings ([`SavedSettings`]) or
    /// the server no longer holds its weights.
    fn load_checkpoint(&mut self, dir: &Path) -> harness_core::Result<()> {
        let path = dir.join(LEARNER_FILE);
        let saved = read_saved(dir)?;
        if saved.base_model != self.cfg.base_model {
            return Err(self.error(format!(
                "{}: the checkpoint trains `{}`, this learner `{}`",
                path.display(),
                saved.base_model,
                self.cfg.base_model
            )));
        }
        match &saved.settings {
            Some(then) => {
                if let Some((name, a, b)) = then.drift(&SavedSettings::of(&self.cfg)) {
                    return Err(self.error(format!(
                        "`{name}`: {a} in {}, {b} now; only the URL, timeouts and heartbeat may \
                         change on resume",
                        path.display()
                    )));
                }
            }
            None => tracing::warn!(
                file = %path.display(),
                "the checkpoint records no learner settings (an older version): not checked"
            ),
        }
        let model_id = self.model.model_id();
        block_on(&self.model.client, |c| {
            let (m, p) = (model_id.clone(), saved.weights_path.clone());
            async move { c.load_weights(&m, &p).await }
        })
        .map_err(|e| {
            if checkpoint_missing(&e) {
                self.error(format!(
                    "{}: the server no longer holds {} (restarted with another \
                     --checkpoints-base / --database-url?): {e}",
                    path.display(),
                    saved.weights_path
                ))
            } else {
                self.error(format!("{}: {e}", path.display()))
            }
        })?;
        self.steps = saved.optimizer_steps;
        self.version = saved.policy_version;
        Ok(())
    }
}
