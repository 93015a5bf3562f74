//! `[search]`: the frozen-policy harness searches (Meta-Harness, WHALE) and their budgets.

use super::*;

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

pub(crate) fn paper_meta_harness_ratio() -> f64 {
    PAPER_META_HARNESS_BUDGET_RATIO
}

pub(crate) fn default_history_candidates() -> usize {
    HistoryBounds::default().detailed_candidates
}

pub(crate) fn is_default_history_candidates(v: &usize) -> bool {
    *v == default_history_candidates()
}

pub(crate) fn default_history_traces() -> usize {
    HistoryBounds::default().traces_per_candidate
}

pub(crate) fn is_default_history_traces(v: &usize) -> bool {
    *v == default_history_traces()
}

pub(crate) fn default_history_trace_chars() -> usize {
    HistoryBounds::default().trace_chars
}

pub(crate) fn is_default_history_trace_chars(v: &usize) -> bool {
    *v == default_history_trace_chars()
}

pub(crate) fn default_max_unscored_in_a_row() -> usize {
    harness_evolve::meta_harness::DEFAULT_MAX_UNSCORED_IN_A_ROW
}

pub(crate) fn is_default_max_unscored_in_a_row(v: &usize) -> bool {
    *v == default_max_unscored_in_a_row()
}

pub(crate) fn default_whale_sft_learning_rate() -> f64 {
    1e-3
}

// Left out of `run.json` at their defaults, so that runs written before the settings existed
// resume with the same configuration.
pub(crate) fn is_paper_meta_harness_ratio(v: &f64) -> bool {
    *v == PAPER_META_HARNESS_BUDGET_RATIO
}

pub(crate) fn is_default_whale_sft_learning_rate(v: &f64) -> bool {
    *v == default_whale_sft_learning_rate()
}

impl SearchConfig {
    pub(crate) fn quick() -> Self {
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
