//! # harness-rollout
//!
//! Complementary Harness Rescue Training, the paper's Algorithm 1, as a library. For each
//! training batch the [`RescueTrainer`] re-anchors the router when calibration is due (through
//! [`harness_core::Calibrate`]), samples K rollouts per task under the base harness H0, and
//! when all of them fail asks a [`harness_core::HarnessSelector`] for K distinct auxiliary
//! harnesses of the [`harness_pool::SiblingPool`] and runs one fresh rollout under each; the
//! retained groups (Eq. 5) go to a [`harness_core::Learner`] for one update. Every baseline of
//! the paper is a [`Strategy`] value: `grpo`, `h0_rescue`, `random_harness`, `router` with
//! `top_k` or `top_m_x_n` allocation, `fixed_mixture`, and DAPO's `dynamic_sampling`.
//! How a sibling's rescued tokens are scored is [`RescueConfig::rescue_objective`]: the paper's
//! generating context (the default, Eqs. 13-16), `masked` (from the sibling's first
//! intervention on) or `h0` (re-rendered under H0, Guide's ratio); see
//! [`harness_core::objective`]. Every `metrics.jsonl` update line names the objective it ran.
//!
//! It sits between the pool and the router in the crate graph: it depends on harness-core and
//! harness-pool only, and meets the router, the trainer and remote engines through traits
//! ([`harness_core::HarnessSelector`], [`harness_core::Calibrate`], [`harness_core::Learner`],
//! [`WeightSync`]).
//!
//! A run directory holds `metrics.jsonl`, `groups.jsonl`, `trajectories.jsonl`, `cost.json`
//! and `checkpoints/`; [`RescueTrainer::resume`] continues a killed run from its latest
//! complete checkpoint with the same task order, seeds, learner state and file contents.
//!
//! ```
//! use harness_core::Harness;
//! use harness_pool::SiblingPool;
//! use harness_rollout::{Allocation, RescueConfig, Strategy};
//!
//! let base = Harness::new("H0", "Solve the task with tools.");
//! let siblings = (1..=8).map(|i| Harness::new(format!("S{i}"), format!("Variant {i}: solve the task.")));
//! let pool = SiblingPool::starter(base, siblings, serde_json::Value::Null)?;
//!
//! // The paper's LLM Router 4x2 control, everything else at the paper's defaults.
//! let cfg = RescueConfig::from_json(
//!     r#"{"seed": 7, "strategy": {"kind": "router", "allocation": {"kind": "top_m_x_n", "m": 4, "n": 2}}}"#,
//!     None,
//! )?;
//! assert_eq!(cfg.group_size, 8);
//! assert_eq!(cfg.calibrate_every, 10);
//! assert_eq!(cfg.strategy, Strategy::Router { allocation: Allocation::TopMXN { m: 4, n: 2 } });
//! cfg.validate(&pool)?;
//!
//! // 3 x 2 rollouts do not make a group of 8: a clear error naming the field.
//! let bad = RescueConfig::from_json(
//!     r#"{"strategy": {"kind": "router", "allocation": {"kind": "top_m_x_n", "m": 3, "n": 2}}}"#,
//!     None,
//! )?;
//! assert!(bad.validate(&pool).unwrap_err().to_string().contains("strategy.allocation"));
//! # Ok::<(), harness_rollout::Error>(())
//! ```

pub mod checkpoint;
pub mod config;
pub mod error;
mod files;
pub mod metrics;
pub mod order;
pub mod seed;
pub mod select;
pub mod sync;
pub mod trainer;

pub use checkpoint::{CheckpointState, latest_checkpoint};
pub use config::{Allocation, MixtureEntry, RescueConfig, Strategy, SyncRetry};
pub use error::{Error, Result};
pub use files::{CHECKPOINT_DIR, COST_FILE, GROUPS_FILE, METRICS_FILE, Offsets, TRAJECTORIES_FILE};
pub use metrics::{CalibrationRecord, Cost, EvalRecord, GroupRecord, HarnessUse, UpdateRecord};
pub use select::{RandomSelector, check_rescue_selection};
pub use sync::{SaveAndReload, WeightSync, sync_with_retry};
pub use trainer::{RescueTrainer, TrainingSetup, run_training};

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
