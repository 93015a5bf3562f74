//! Tasks and dataset splits.

use serde::{Deserialize, Serialize};

/// Which part of a benchmark a task belongs to.
///
/// Harness editing and policy optimisation use `Train`; parent selection and router calibration
/// use `Validation`; `Test` is reserved for final evaluation and never feeds the router.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// Training tasks.
    Train,
    /// Validation tasks (parent selection, profile calibration).
    Validation,
    /// Held-out test tasks.
    Test,
}

impl Split {
    /// All splits in their canonical order.
    pub const ALL: [Split; 3] = [Split::Train, Split::Validation, Split::Test];

    /// The lowercase name used in files and on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Split::Train => "train",
            Split::Validation => "validation",
            Split::Test => "test",
        }
    }
}

impl std::fmt::Display for Split {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One task instance of an environment.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Task {
    /// Unique within its environment, e.g. `dbbench/dev-17`.
    pub id: String,
    /// The environment that runs it (matches [`crate::Environment::name`]).
    pub env: String,
    /// The split it belongs to.
    pub split: Split,
    /// What the user asks for, shown to the policy.
    pub instruction: String,
    /// The seed that generated the task's initial state.
    pub seed: u64,
    /// Environment-specific data (ground truth lives here and is never shown to the policy).
    #[serde(default)]
    pub metadata: serde_json::Value,
}

impl Task {
    /// A task with empty metadata.
    pub fn new(
        id: impl Into<String>,
        env: impl Into<String>,
        split: Split,
        instruction: impl Into<String>,
        seed: u64,
    ) -> Self {
        Task {
            id: id.into(),
            env: env.into(),
            split,
            instruction: instruction.into(),
            seed,
            metadata: serde_json::Value::Null,
        }
    }
}
