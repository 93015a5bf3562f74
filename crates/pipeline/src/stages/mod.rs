//! The stages of the main job, one module each. Each reads the previous stage's files and
//! writes its own (see [`crate::layout`]), so a user can evolve once and train many policies
//! on the pool.
//!
//! 1. [`evolve()`]: Directional Harness Evolution from H0 into a frozen pool (Eqs. 2-4).
//! 2. [`calibrate()`]: the first calibration of the router with the initial policy.
//! 3. [`train()`]: training of one method from the initial checkpoint (Algorithm 1), with
//!    the strategy, selector and calibrator of its [`crate::methods::METHODS`] entry; for
//!    Meta-Harness and WHALE, their search for one harness H_best ([`search()`]).
//! 4. [`evaluate()`]: the test evaluation of a method in the modes its entry names (H0, the
//!    router's Rank-1), and for Harness-S the router's Rank-1..R before and after (Table 5);
//!    once every method was evaluated, [`transfer()`] finds Table 4's cases.
//! 5. [`write_report`]: the report of every seed, made from the files alone.
//!
//! `roles` holds what the router's stages share: the profiler and voters, the calibrator and
//! the first calibration.

mod calibrate;
mod cost;
mod diagnostics;
mod evaluate;
mod evolve;
mod report;
mod roles;
mod search;
mod train;
mod transfer;

pub use calibrate::calibrate;
pub use cost::{STAGE_COST_FILE, StageCost, Tokens};
pub use diagnostics::{
    DiagnosticsLine, FamilyDiagnostics, InterventionCounts, intervention_of, planted_before,
    tokens_before,
};
pub use evaluate::{
    BehaviourRecord, ChoiceCounts, RankRecord, RoutingRecord, TaskResult, TestRecord, evaluate,
    has_test_record, rank1_choices,
};
pub use evolve::{evolve, load_pool};
pub use report::{render_tables, write_report};
pub use search::{
    H_BEST_FILE, SEARCH_FILE, SFT_FILE, SearchRecord, SftRecord, TrainedOn, is_searched,
    load_h_best, search,
};
pub use train::{
    ROUTER_STATS_FILE, Trained, checkpoint_of, is_trained, method_label, rescue_config,
    router_allocation, strategy, train, voter_summary,
};
pub use transfer::{
    AttemptRecord, BehaviourDiff, DECISION_PREFIX, EpisodeRecord, RescueEvidence, TransferCase,
    behaviour_diffs, behaviour_labels, transfer,
};
