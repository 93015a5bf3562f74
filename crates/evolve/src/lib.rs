//! # harness-evolve
//!
//! Directional Harness Evolution (paper section "Directional Harness Evolution", Eqs. 2-4, and
//! the appendix "Directional Harness Evolution: Prompts and Settings", Table 8): starting from
//! `P_1 = {H0}`, each round runs every parent with the frozen policy on fresh training tasks,
//! groups the failures by root cause ([`Analyst`]), forms repair directions of 2-3 related,
//! well-supported causes ([`direction`]), asks an [`Editor`] for `Edit(H, d)` as a structured
//! [`harness_core::HarnessEdit`], validates the child (parse, references, smoke run), evaluates
//! it locally against the parent (at most 30 tasks, at most 10 controls, one revision), keeps
//! every valid child in the Sibling Harness Pool (Eq. 4), and picks the next parents by joint
//! validation coverage ([`cover`], Eq. 3). After `T` rounds the pool is frozen; rescue training
//! (`harness-rollout`) and the router read it. [`diversity`] computes the paper's Figure 1 and
//! Figure 5 views of the pool, [`plot`] draws them, and [`meta_harness`] is the Meta-Harness
//! comparison variant (one `H_best` by training score, its proposer reading the whole search
//! history).
//!
//! Offline, everything runs with the built-in [`RuleAnalyst`] and [`BuiltinEditor`]; with an
//! OpenAI-compatible [`harness_core::ChatModel`], [`LlmAnalyst`], [`LlmEditor`] and
//! Meta-Harness's [`LlmProposer`] take their place, with validated JSON answers, bounded retries, and tokens counted per role.
//!
//! ```
//! use std::collections::{BTreeMap, BTreeSet};
//! use harness_evolve::{EvolveSettings, cover::select_parents};
//!
//! let settings = EvolveSettings::paper();
//! assert_eq!((settings.rounds(), settings.parent_slots), (3, 4));
//!
//! // Eq. 3: complementary children beat the two individually best ones.
//! let set = |ids: &[&str]| ids.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
//! let solved = BTreeMap::from([
//!     ("A".to_string(), set(&["t1", "t2", "t3"])),
//!     ("B".to_string(), set(&["t1", "t2", "t4"])),
//!     ("C".to_string(), set(&["t5", "t6"])),
//! ]);
//! let cover = select_parents(&solved, 2);
//! assert_eq!(cover.covered, 5);
//! assert_eq!(cover.parents, vec!["A", "C"]);
//! ```

pub mod analyst;
pub mod cause;
pub mod cover;
pub mod direction;
pub mod diversity;
pub mod editor;
pub mod error;
pub mod exec;
pub mod llm;
pub mod llm_analyst;
pub mod llm_editor;
pub mod llm_proposer;
pub mod local_eval;
pub mod meta_harness;
pub mod plot;
pub mod repair;
pub mod report;
pub mod round;
pub mod settings;
pub mod trace;
pub mod usage;
pub mod validate;

pub use analyst::{Analyst, RuleAnalyst};
pub use cause::{CAUSE_KINDS, Cause, FailureAnalysis, Family};
pub use cover::{Cover, CoverInstance, CoverMethod};
pub use direction::{Direction, DirectionPlan, ReportedCause};
pub use diversity::DiversityReport;
pub use editor::{EditRequest, Editor, Feedback, Proposal};
pub use error::{Error, Result};
pub use exec::{Executor, PolicySource, SharedPolicy};
pub use llm_analyst::LlmAnalyst;
pub use llm_editor::LlmEditor;
pub use llm_proposer::LlmProposer;
pub use repair::BuiltinEditor;
pub use round::{
    CandidateOutcome, CandidateRecord, Evolution, EvolutionResult, ParentRecord, RoundReport,
};
pub use settings::EvolveSettings;
pub use usage::{RoleUsage, UsageByRole};
pub use validate::{Rejection, Stage};

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
