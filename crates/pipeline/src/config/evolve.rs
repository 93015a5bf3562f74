//! `[evolve]` and `[calibration]`: how the pool is grown and how the router is calibrated.

use super::*;

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

pub(crate) fn default_analyst_batch() -> usize {
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
