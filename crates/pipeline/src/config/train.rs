//! `[train]` and `[eval]`: the trained methods and the test evaluation.

use super::*;

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

pub(crate) fn is_paper_objective(o: &RescueObjective) -> bool {
    o.is_paper()
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
