//! `[tinker]` and the learner: where the policy update runs.

use super::*;

/// `learner`: where the policy update runs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LearnerKind {
    /// grpo-candle in this process (full weights).
    #[default]
    Candle,
    /// A Tinker-protocol server (SkyRL's self-hosted server, hosted Tinker) training a LoRA
    /// adapter; rollouts sample its weights after each update (`[tinker]`).
    Tinker,
}

impl LearnerKind {
    pub(crate) fn is_candle(&self) -> bool {
        *self == LearnerKind::Candle
    }
}

/// `tinker.server`: how the server reduces per-token losses.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TinkerServer {
    /// SkyRL's self-hosted Tinker server (`skyrl-tx`).
    #[default]
    Skyrl,
    /// Hosted Tinker.
    Tinker,
}

/// `tinker.objective`: which loss the server back-propagates.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TinkerObjective {
    /// Eq. 15 exactly: the gradient computed here, sent as per-token weights.
    #[default]
    Exact,
    /// The server's own clipped `ppo` loss (hosted Tinker only).
    ServerPpo,
}

/// `[tinker]`: the Tinker learner (`learner = "tinker"`). Ignored with `learner = "candle"`,
/// so one file serves both learners.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TinkerSettings {
    /// The server root, `http://host:port` (SkyRL's `python -m tx.tinker.api` listens on 8000).
    pub url: Option<String>,
    /// The server kind.
    pub server: TinkerServer,
    /// The base model as the server lists it; by default the absolute path of the run's
    /// initial checkpoint (what SkyRL's `--base-model` is given).
    pub base_model: Option<String>,
    /// The LoRA rank the server trains (SkyRL: at most 32; its `lora_alpha` is 32).
    pub lora_rank: u32,
    /// Adam's step size; by default `policy.learning_rate`.
    pub learning_rate: Option<f64>,
    /// Adam's first-moment decay.
    pub beta1: f64,
    /// Adam's second-moment decay.
    pub beta2: f64,
    /// Adam's epsilon.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// `exact` (Eq. 15, default) or `server_ppo` (hosted Tinker only).
    pub objective: TinkerObjective,
    /// The environment variable the binary reads the API key from (hosted Tinker).
    pub api_key_env: String,
    /// Send the key over plain http to a host other than the loopback.
    pub allow_insecure_http: bool,
    /// Seconds between session heartbeats.
    pub heartbeat_s: f64,
    /// Seconds one request may take.
    pub timeout_s: f64,
    /// Seconds one server-side operation (a future) may stay pending.
    pub future_timeout_s: f64,
    /// Attempts per request (1: no retries).
    pub attempts: u32,
    /// After each sync, score a probe sequence on the server and in this process and stop the
    /// run when the log-probs differ by more than `check_tolerance` (a stale or mismatched sync).
    pub check_sync: bool,
    /// The largest absolute log-prob difference the probe accepts (nats).
    pub check_tolerance: f64,
}

impl Default for TinkerSettings {
    fn default() -> Self {
        TinkerSettings {
            url: None,
            server: TinkerServer::Skyrl,
            base_model: None,
            lora_rank: 32,
            learning_rate: None,
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            objective: TinkerObjective::Exact,
            api_key_env: "TINKER_API_KEY".into(),
            allow_insecure_http: false,
            heartbeat_s: 10.0,
            timeout_s: 120.0,
            future_timeout_s: 1800.0,
            attempts: 5,
            check_sync: true,
            check_tolerance: 1e-3,
        }
    }
}

impl TinkerSettings {
    pub(crate) fn is_default(&self) -> bool {
        *self == TinkerSettings::default()
    }
}

impl RunConfig {
    /// The `[tinker]` settings under `learner = "tinker"`.
    pub(crate) fn validate_tinker(&self, file: &Path) -> Result<()> {
        if self.learner != LearnerKind::Tinker {
            return Ok(());
        }
        let t = &self.tinker;
        let bad = |field: &str, message: String| {
            Err(Error::Config {
                file: file.to_path_buf(),
                field: field.to_string(),
                message,
            })
        };
        let Some(url) = &t.url else {
            return bad(
                "tinker.url",
                "learner = \"tinker\" trains on a Tinker server: give its root, http://host:port (SkyRL's `python -m tx.tinker.api` listens on 8000), or pass --tinker-url".into(),
            );
        };
        if let Err(message) = keys::Endpoint::parse(url) {
            return bad("tinker.url", message);
        }
        if t.base_model.as_deref().is_some_and(|m| m.trim().is_empty()) {
            return bad(
                "tinker.base_model",
                "expected the base model's name as the server lists it, or no value (the initial checkpoint's absolute path)".into(),
            );
        }
        if t.lora_rank == 0 {
            return bad(
                "tinker.lora_rank",
                "expected a LoRA rank of at least 1, found 0".into(),
            );
        }
        if t.server == TinkerServer::Skyrl && t.lora_rank > 32 {
            return bad(
                "tinker.lora_rank",
                format!(
                    "SkyRL's server trains LoRA ranks up to 32 (its max_lora_rank), found {}",
                    t.lora_rank
                ),
            );
        }
        if let Some(lr) = t.learning_rate
            && !(lr.is_finite() && lr > 0.0)
        {
            return bad(
                "tinker.learning_rate",
                format!("expected a step size above zero, found {lr}"),
            );
        }
        for (field, v) in [("tinker.beta1", t.beta1), ("tinker.beta2", t.beta2)] {
            if !(0.0..1.0).contains(&v) {
                return bad(field, format!("expected a decay in [0, 1), found {v}"));
            }
        }
        if !(t.eps.is_finite() && t.eps > 0.0) {
            return bad(
                "tinker.eps",
                format!("expected a number above zero, found {}", t.eps),
            );
        }
        if !(t.weight_decay.is_finite() && t.weight_decay >= 0.0) {
            return bad(
                "tinker.weight_decay",
                format!(
                    "expected a number of at least zero, found {}",
                    t.weight_decay
                ),
            );
        }
        for (field, v) in [
            ("tinker.heartbeat_s", t.heartbeat_s),
            ("tinker.timeout_s", t.timeout_s),
            ("tinker.future_timeout_s", t.future_timeout_s),
        ] {
            if !(v.is_finite() && v > 0.0) {
                return bad(field, format!("expected seconds above zero, found {v}"));
            }
        }
        if t.attempts == 0 {
            return bad(
                "tinker.attempts",
                "expected at least 1 attempt per request, found 0".into(),
            );
        }
        if !(t.check_tolerance.is_finite() && t.check_tolerance > 0.0) {
            return bad(
                "tinker.check_tolerance",
                format!("expected nats above zero, found {}", t.check_tolerance),
            );
        }
        if t.objective == TinkerObjective::ServerPpo && t.server == TinkerServer::Skyrl {
            return bad(
                "tinker.objective",
                "server_ppo needs a server that honours clip_low_threshold / clip_high_threshold; SkyRL's server clips its ppo loss at a fixed 0.8 / 1.2: use `exact`".into(),
            );
        }
        if !self.train.rescue_objective.is_paper() {
            return bad(
                "train.rescue_objective",
                format!(
                    "`{}` is computed by grpo-candle's learner in this process; the Tinker learner scores every policy token in its generating context (the paper's objective): expected \"generating\" with learner = \"tinker\"",
                    self.train.rescue_objective
                ),
            );
        }
        if self.rollout.temperature != 1.0 {
            return bad(
                "rollout.temperature",
                format!(
                    "the Tinker learner scores at temperature 1 (Eq. 16 compares the rollout's log-probs with the server's pi_old); found {}",
                    self.rollout.temperature
                ),
            );
        }
        if let Some(m) = self
            .train
            .methods
            .iter()
            .find(|m| matches!(m, Method::Whale))
        {
            return bad(
                "train.methods",
                format!(
                    "{m} fine-tunes with grpo-candle's SFT trainer in this process; leave it out with learner = \"tinker\""
                ),
            );
        }
        Ok(())
    }

    /// Whether the Tinker key may go to `tinker.url` (https, or plain http to the loopback
    /// unless `tinker.allow_insecure_http`).
    pub fn check_tinker_key_transport(&self, key: bool) -> Result<()> {
        let (true, LearnerKind::Tinker, Some(url)) = (key, self.learner, &self.tinker.url) else {
            return Ok(());
        };
        keys::Endpoint::parse(url)
            .and_then(|endpoint| endpoint.check_key_transport(self.tinker.allow_insecure_http))
            .map_err(|message| Error::Config {
                file: PathBuf::from("<run config>"),
                field: "tinker.url".into(),
                message,
            })
    }
}
