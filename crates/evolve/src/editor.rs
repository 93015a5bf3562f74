//! The [`Editor`] seam: `Edit(H, d)` of Eq. 2 as a structured [`HarnessEdit`].

use async_trait::async_trait;
use harness_core::{Harness, HarnessEdit, LocalEval, ToolSpec};
use serde::{Deserialize, Serialize};

use crate::direction::Direction;
use crate::error::Result;
use crate::usage::RoleUsage;

/// The six editable components (Table 8, "Editable components": Prompt, Skill, Context,
/// Memory, Hooks, Tool View), by the top-level harness fields an edit path may start with.
pub const EDITABLE: &[(&str, &str)] = &[
    ("prompt", "prompt"),
    ("prompt_rules", "prompt"),
    ("skills", "skill"),
    ("context", "context"),
    ("memory", "memory"),
    ("hooks", "hooks"),
    ("tool_view", "tool_view"),
];

/// The component an edit path touches (`state.hooks.x` -> `hooks`), or `None` outside the six
/// editable components (limits, names and lineage are not the editor's to change).
pub fn component_of(path: &str) -> Option<&'static str> {
    let field = path.strip_prefix("state.")?.split('.').next()?;
    EDITABLE.iter().find(|(f, _)| *f == field).map(|(_, c)| *c)
}

/// What the editor sees for one direction.
#[derive(Debug, Clone, Copy)]
pub struct EditRequest<'a> {
    /// The parent harness H.
    pub parent: &'a Harness,
    /// The direction d: the causes to address.
    pub direction: &'a Direction,
    /// Briefs of the round's other candidates, to seek different mechanisms.
    pub other_briefs: &'a [String],
    /// The environment's tools (what hooks and tool docs may refer to).
    pub tools: &'a [ToolSpec],
    /// The environment's name.
    pub env: &'a str,
}

/// An editor's candidate: the edit and a brief other candidates see.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    /// The structured patch of the parent.
    pub edit: HarnessEdit,
    /// One line: the mechanism and the causes it targets.
    pub brief: String,
}

impl Proposal {
    /// The components the edit touches, sorted and distinct (`?` marks a path outside them).
    pub fn components(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .edit
            .ops
            .iter()
            .map(|op| component_of(&op.path).unwrap_or("?").to_string())
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// What local evaluation measured, handed to the editor for its one revision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Feedback {
    /// The measured figures.
    pub local_eval: LocalEval,
    /// Targeted failures the candidate did not repair.
    pub unrepaired: Vec<String>,
    /// Causes none of whose targeted tasks were repaired.
    pub unrepaired_causes: Vec<String>,
}

/// Proposes `Edit(H, d)` for a parent and a direction, and may revise it once after local
/// evaluation.
///
/// # Design
/// The editor returns data, not a harness: a [`HarnessEdit`] over the six editable components,
/// which the host applies and validates itself (parse, references, a smoke run), so an editor
/// cannot smuggle in an unchecked candidate or change the execution limits. `Ok(None)` means the
/// editor has nothing to propose (no repair for these causes, or an LLM whose answers stayed
/// unusable); the round records that and goes on. `Err` is for infrastructure only.
#[async_trait]
pub trait Editor: Send + Sync {
    /// A short name for reports.
    fn name(&self) -> &str;

    /// The initial candidate for `request`.
    async fn propose(&self, request: &EditRequest<'_>) -> Result<Option<Proposal>>;

    /// One revision of `previous` given the measured `feedback` (default: none).
    async fn revise(
        &self,
        request: &EditRequest<'_>,
        previous: &Proposal,
        feedback: &Feedback,
    ) -> Result<Option<Proposal>> {
        let _ = (request, previous, feedback);
        Ok(None)
    }

    /// Cumulative external-model usage (zero for offline editors).
    fn usage(&self) -> RoleUsage {
        RoleUsage::default()
    }
}
