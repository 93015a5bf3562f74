//! # harness-router
//!
//! The *Adaptive Harness Router* of harness-s (paper "Adaptive Harness Router", Eqs. 8-12):
//! which sibling harnesses should rescue a task that H0 failed, and which harness should run a
//! task at inference. It sits above `harness-core` and `harness-pool`; the rescue loop
//! (`harness-rollout`) sees it only through harness-core's [`harness_core::HarnessSelector`] and
//! [`harness_core::Calibrate`] seams.
//!
//! - Calibration (Eq. 11): [`paired`] runs every member and H0 on the same validation tasks with
//!   the same seeds and limits; a [`Calibration`] holds the outcomes, success rates and profiles
//!   as validated JSON.
//! - Profiles (Eq. 8): [`Profile`] `{prefer, avoid}` of [`Entry`] `{when, behavior, support}`,
//!   built by a [`Profiler`]: [`BuiltinProfiler`] (task features + per-environment trajectory
//!   labellers) or [`LlmProfiler`] (any [`harness_core::ChatModel`]).
//! - Voting (Eqs. 9, 10, 12): [`Voter`]s ([`BuiltinVoter`], [`LlmVoter`]) rank four candidates
//!   each; [`aggregate()`] sums the weights 1, 3/4, 1/2, 1/4; [`AdaptiveRouter`] returns the Top-K
//!   without H0 in rescue and ranks the full pool in inference.
//! - Re-anchoring: [`Calibrator`] implements [`harness_core::Calibrate`].
//! - Baselines: [`RuleRouter`] and the fixed-profile router ([`ReanchorMode::Fixed`]); Random
//!   Harness is harness-rollout's `RandomSelector`. [`rank_eval`] produces Table 5.
//!
//! ```
//! use std::collections::BTreeMap;
//! use harness_core::HarnessId;
//! use harness_router::{RankWeights, aggregate, top_k};
//!
//! let id = |s: &str| HarnessId(s.into());
//! let candidates = [id("a"), id("b"), id("c"), id("d"), id("e")];
//! let success = BTreeMap::from([(id("e"), 0.9)]);
//! let ballots = vec![
//!     vec![id("a"), id("b"), id("c"), id("d")],
//!     vec![id("b"), id("a"), id("d"), id("c")],
//! ];
//! // a and b both score 1 + 3/4; neither has a validation rate, so the id decides.
//! let ranking = aggregate(&candidates, &success, &ballots, &RankWeights::default());
//! assert_eq!((ranking[0].id.clone(), ranking[0].score), (id("a"), 1.75));
//! // Rescue excludes H0 (here `a`) and fills from unvoted candidates by validation success.
//! let pick = top_k(ranking, 4, Some(&id("a")))?;
//! assert_eq!(pick.ids, vec![id("b"), id("c"), id("d"), id("e")]);
//! assert_eq!(pick.filled, vec![id("e")]);
//! # Ok::<(), harness_router::Error>(())
//! ```

pub mod aggregate;
pub mod ballot;
pub mod baselines;
pub mod calibration;
pub mod error;
pub mod features;
pub mod llm_labeller;
pub mod llm_profiler;
pub mod llm_voter;
pub mod paired;
pub mod profile;
pub mod profiler;
pub mod rank_eval;
pub mod reanchor;
pub mod router;
pub mod similar;
pub mod usage;
pub mod vote;

pub use aggregate::{RankWeights, Scored, Selection, aggregate, top_k};
pub use ballot::{BALLOT_LEN, BallotError, BallotRules, parse_ballot_text};
pub use baselines::RuleRouter;
pub use calibration::{
    CALIBRATION_FORMAT, Calibration, CheckpointRef, MemberInfo, ProfilerStats, TaskOutcome,
    calibration_file_name,
};
pub use error::{Error, Result};
pub use features::{FeatureSource, TaskFeatures};
pub use llm_labeller::{LABELLER_ROLE, LlmLabeller, LlmLabellerSettings, parse_label_answer};
pub use llm_profiler::{LlmProfiler, LlmProfilerSettings, PROFILER_ROLE, parse_profile_answer};
pub use llm_voter::{LlmVoter, LlmVoterSettings, VOTER_ROLE};
pub use paired::{Environments, PairedLimits, PairedRun, PairedSettings, run_paired};
pub use profile::{Entry, Profile, consolidate};
pub use profiler::{BuiltinProfiler, PairedTask, ProfileInput, ProfileOutcome, Profiler};
pub use rank_eval::{RankEvalSettings, RankReport, RankRow, evaluate_ranks};
pub use reanchor::{Calibrator, CalibratorSettings, ReanchorMode};
pub use router::{AdaptiveRouter, Evidence, EvidenceCell, Routed, RouterSettings, RouterStats};
pub use similar::{Neighbour, SimilarIndex};
pub use usage::{RoleTokens, TokenCounter};
pub use vote::{
    BuiltinVoter, BuiltinVoterWeights, Candidate, SimilarOutcome, VoteAnswer, VoteRequest, Voter,
};

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    // Pipelines wire these at run time: keep them object safe.
    #[test]
    fn traits_are_object_safe() {
        fn _voter(_: Arc<dyn super::Voter>) {}
        fn _profiler(_: Arc<dyn super::Profiler>) {}
        fn _selector(_: Arc<dyn harness_core::HarnessSelector>) {}
        fn _calibrate(_: Arc<dyn harness_core::Calibrate>) {}
    }
}

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
