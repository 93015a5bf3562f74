//! The [`HarnessSelector`] seam: rollout code asks it which harnesses to use for a task, and
//! never sees how the choice is made (an LLM router, a rule router, random choice).

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::Result;
use crate::chat::Usage;
use crate::harness::HarnessId;
use crate::task::Task;

/// Why harnesses are being selected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SelectionMode {
    /// Rescue during training: the base harness is excluded (Eq. 10).
    Rescue,
    /// Inference: the whole pool, base harness included (Eq. 12).
    Inference,
}

/// A request for `k` distinct harnesses for one task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SelectionRequest {
    /// The task (never a test task during calibration).
    pub task: Task,
    /// How many distinct harnesses to return.
    pub k: usize,
    /// Rescue or inference.
    pub mode: SelectionMode,
    /// Seed for any random choice the selector makes.
    pub seed: u64,
}

/// Chooses harnesses for a task.
///
/// # Example
/// `examples/custom_router.rs` in the repository implements a selector that ranks siblings by validation evidence per kind of task, with the calibrator that gathers it
/// (`cargo run --release --example custom_router`; `tests/extension_examples.rs` runs it).
#[async_trait]
pub trait HarnessSelector: Send + Sync {
    /// A short name for logs.
    fn name(&self) -> &str;

    /// Up to `k` distinct harness ids, best first.
    async fn select(&self, request: &SelectionRequest) -> Result<Vec<HarnessId>>;

    /// External LLM tokens spent so far, by role (an LLM router's `voter`), cumulative since
    /// the selector was built; the training loop accounts the difference around each batch.
    fn usage(&self) -> BTreeMap<String, Usage> {
        BTreeMap::new()
    }
}
