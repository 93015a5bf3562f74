//! `[policy]`, `[roles]` and `[rollout]`: the checkpoint and its warm start, the LLM roles, and
//! the rollout engine.

use super::*;

/// The policy: the embedded warm-started organism or a checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    /// A Hugging Face checkpoint folder (config.json, safetensors, tokenizer.json) or, with the
    /// `hub` feature, a hub id already in the local cache; `None` warm-starts the embedded tiny
    /// policy.
    pub model: Option<String>,
    /// Where the warm-started checkpoint is cached between runs.
    pub cache_dir: PathBuf,
    /// Which warm-start defaults `warm_start` starts from: `default` (a few minutes in a
    /// release build) or `tiny` (seconds, for tests and smoke runs; its policy is not useful).
    pub warm_start_preset: WarmStartPreset,
    /// The warm start's settings (harness-warmstart's `WarmStartSettings`, any subset over
    /// `warm_start_preset`). Its `seed` defaults to the run's; with several seeds every seed
    /// trains from the checkpoint of the first.
    pub warm_start: Value,
    /// Peak learning rate of the GRPO updates.
    pub learning_rate: f64,
    /// CPU threads of the process that decodes and trains the local policy (the binaries set
    /// `RAYON_NUM_THREADS` from it unless that variable is set). Unset (the default): one for
    /// the embedded tiny policy, whose decoding steps are too small to split over threads
    /// (`crates/grpo-candle/bench/README.md`, "Decoding threads"); for a checkpoint the
    /// variable is left unset, so rayon and candle use every core. Results do not depend on it, so a run may be resumed with another value.
    #[serde(default)]
    pub threads: Option<usize>,
}

impl PolicyConfig {
    /// The CPU threads a binary gives the process that runs this policy: [`Self::threads`],
    /// or when unset one for the embedded tiny policy and `None` (every core) for a
    /// checkpoint.
    pub fn cpu_threads(&self) -> Option<usize> {
        match (self.threads, &self.model) {
            (Some(n), _) => Some(n),
            (None, None) => Some(1),
            (None, Some(_)) => None,
        }
    }
}

/// The warm start's defaults.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WarmStartPreset {
    /// harness-warmstart's defaults.
    #[default]
    Default,
    /// harness-warmstart's `tiny` preset.
    Tiny,
}

/// The LLM roles: failure analyst, editor, Meta-Harness proposer, profiler and voters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolesConfig {
    /// An OpenAI-compatible base URL (ending in `/v1`); `None` uses the built-in analyst,
    /// editor, proposer, profiler and voters.
    pub llm: Option<String>,
    /// The model asked at `llm`.
    pub llm_model: String,
    /// The environment variable the binary reads the API key from (its name must end in
    /// `_API_KEY`).
    pub llm_key_env: String,
    /// Send the API key to `llm` over plain `http://` to a host other than this machine
    /// (unencrypted: anyone on the path reads it). Off by default.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_insecure_http: bool,
    /// Voters on the router's panel (paper: 4).
    pub voters: usize,
    /// Cap on the tokens of every role answer; `None` keeps each role's own (voters and
    /// labeller 512, profiler 2,048, analyst, editor and proposer 4,096). A small local model
    /// that rambles inside its JSON answer is held to this.
    #[serde(default)]
    pub max_tokens: Option<usize>,
    /// Seconds one request to `llm` may take before the client retries it.
    #[serde(default = "default_role_timeout_s")]
    pub timeout_s: u64,
    /// The roles that ask `llm` (of `analyst`, `editor`, `labeller` (Table 3's), `profiler`,
    /// `proposer` (Meta-Harness's), `voters`); the others stay built-in. All six by default.
    #[serde(default = "default_llm_roles")]
    pub llm_roles: Vec<String>,
}

/// The roles an LLM can play.
pub const LLM_ROLES: [&str; 6] = [
    "analyst", "editor", "labeller", "profiler", "proposer", "voters",
];

/// Settings that are off stay out of `run.json`, so a run saved before they existed still
/// matches its configuration.
pub(crate) fn is_false(value: &bool) -> bool {
    !*value
}

pub(crate) fn default_role_timeout_s() -> u64 {
    120
}

pub(crate) fn default_llm_roles() -> Vec<String> {
    LLM_ROLES.iter().map(|r| r.to_string()).collect()
}

impl RolesConfig {
    /// Whether `role` asks the LLM endpoint (one is configured and the role is listed).
    pub fn asks_llm(&self, role: &str) -> bool {
        self.llm.is_some() && self.llm_roles.iter().any(|r| r == role)
    }
}

/// Which engine samples rollouts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RolloutEngine {
    /// grpo-candle in this process.
    #[default]
    Local,
    /// A vLLM server (token-id prompts on `/v1/completions`, in-place weight reload).
    Vllm,
    /// An SGLang server (`/generate`, `update_weights_from_disk`).
    Sglang,
}

/// How rollouts are sampled.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RolloutConfig {
    /// The engine.
    pub engine: RolloutEngine,
    /// The engine's server root (`http://127.0.0.1:8000`), for `vllm` and `sglang`.
    pub engine_url: Option<String>,
    /// Send the engine's API key over plain `http://` to a host other than this machine
    /// (unencrypted: anyone on the path reads it). Off by default.
    #[serde(default, skip_serializing_if = "is_false")]
    pub allow_insecure_http: bool,
    /// The model name the engine serves (vLLM's `--served-model-name`).
    pub served_model: Option<String>,
    /// The folder the trained weights are written to for the engine to reload (vLLM reloads
    /// in place: make it the folder it serves).
    pub weights_dir: Option<PathBuf>,
    /// Sampling temperature of training and validation rollouts.
    pub temperature: f32,
    /// Episodes in flight at once.
    pub concurrency: usize,
}
