//! The [`Calibrate`] seam: the rescue loop asks for a re-anchoring of the router's evidence
//! (paper Eq. 11, "policy-aware profile re-anchoring") every few updates and once with the final
//! policy, without depending on the router crate.

use std::collections::BTreeMap;
use std::path::PathBuf;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::Result;
use crate::chat::Usage;
use crate::harness::HarnessId;

/// When and on what a calibration is taken.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibrationPoint {
    /// The calibration index `s` (0 for the one before training).
    pub index: u32,
    /// Policy updates applied before this calibration.
    pub update: u64,
    /// Whether this is the re-anchoring with the final policy.
    pub is_final: bool,
    /// Seed for the paired validation executions.
    pub seed: u64,
    /// The policy checkpoint being measured, when one was written.
    #[serde(default)]
    pub checkpoint: Option<PathBuf>,
}

/// What a calibration measured, for metrics and cost accounting.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CalibrationSummary {
    /// The calibration index `s`.
    pub index: u32,
    /// Policy updates applied before it.
    pub update: u64,
    /// Validation episodes run.
    pub rollouts: usize,
    /// Validation success per harness (H0 included).
    pub validation_success: BTreeMap<HarnessId, f64>,
    /// External LLM tokens spent, by role (`profiler`, ...).
    #[serde(default)]
    pub usage: BTreeMap<String, Usage>,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// Re-anchors a selector's evidence on the current, frozen policy.
///
/// # Example
/// `examples/custom_router.rs` in the repository implements a calibrator that measures every harness on the validation tasks, with the selector that reads it
/// (`cargo run --release --example custom_router`; `tests/extension_examples.rs` runs it).
///
/// # Design
/// The calibrator shares the policy with the loop (in process, the same weights; remotely, the
/// same engine after a weight sync), so a call measures exactly the policy that will roll out
/// next. Its state must survive a crash: [`Calibrate::snapshot`] goes into the run's checkpoint
/// and [`Calibrate::restore`] puts it back on resume.
#[async_trait]
pub trait Calibrate: Send + Sync {
    /// A short name for logs.
    fn name(&self) -> &str;

    /// Run the paired validation executions and rebuild profiles and statistics; routing uses
    /// the result until the next call.
    async fn calibrate(&self, point: &CalibrationPoint) -> Result<CalibrationSummary>;

    /// The current calibration as JSON, for the run's checkpoint (`Null` when stateless).
    fn snapshot(&self) -> Result<serde_json::Value> {
        Ok(serde_json::Value::Null)
    }

    /// Restore a [`Calibrate::snapshot`].
    fn restore(&self, snapshot: &serde_json::Value) -> Result<()> {
        let _ = snapshot;
        Ok(())
    }
}
