//! Root causes of failed episodes: the closed catalogue the built-in analyst and editor share,
//! and the failure analysis an [`crate::Analyst`] returns.

use serde::{Deserialize, Serialize};

/// A family of related causes; directions group causes of one family first (paper: "each
/// direction groups related local root causes").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Family {
    /// The policy did not look at everything the task needs (pages, conditions).
    Coverage,
    /// The policy did not finish through the completion call.
    Completion,
    /// The policy did not recover from errors (repeated calls, wrong names).
    Recovery,
    /// The policy did not check its work (read-back, re-running tests).
    Verification,
    /// The context or the action format got in the way.
    Context,
    /// A cause outside the catalogue (named by an LLM analyst).
    Other,
}

/// One entry of the cause catalogue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CauseInfo {
    /// The cause's name, used as its key everywhere (`stopped-paging`).
    pub kind: &'static str,
    /// Its family.
    pub family: Family,
    /// What the failure looks like.
    pub description: &'static str,
}

/// The causes the built-in analyst recognises and the built-in editor repairs.
pub const CAUSE_KINDS: &[CauseInfo] = &[
    CauseInfo {
        kind: "stopped-paging",
        family: Family::Coverage,
        description: "stopped paging through a listing while more pages existed",
    },
    CauseInfo {
        kind: "union-not-intersection",
        family: Family::Coverage,
        description: "answered with a union where the request intersects conditions",
    },
    CauseInfo {
        kind: "budget-before-completion",
        family: Family::Completion,
        description: "reached the action or call budget before the completion call",
    },
    CauseInfo {
        kind: "rerun-instead-of-commit",
        family: Family::Completion,
        description: "re-ran a SQL statement that had already succeeded instead of committing its result",
    },
    CauseInfo {
        kind: "finished-without-submit",
        family: Family::Completion,
        description: "answered in text instead of calling the completion or commit tool",
    },
    CauseInfo {
        kind: "repeated-failing-call",
        family: Family::Recovery,
        description: "repeated the same failing call",
    },
    CauseInfo {
        kind: "unknown-schema-name",
        family: Family::Recovery,
        description: "queried a column or table that does not exist, or wrote a name with spaces without quotes",
    },
    CauseInfo {
        kind: "call-without-docs",
        family: Family::Recovery,
        description: "called an API wrongly before reading its documentation",
    },
    CauseInfo {
        kind: "stale-code",
        family: Family::Recovery,
        description: "used a stale or wrong verification code",
    },
    CauseInfo {
        kind: "no-readback",
        family: Family::Verification,
        description: "changed state without reading the result back before finishing",
    },
    CauseInfo {
        kind: "no-commit-after-change",
        family: Family::Verification,
        description: "kept checking a SQL change that had succeeded instead of committing it",
    },
    CauseInfo {
        kind: "edit-without-retest",
        family: Family::Verification,
        description: "edited code without re-running the failing test",
    },
    CauseInfo {
        kind: "edited-tests",
        family: Family::Verification,
        description: "edited test files instead of the code under test",
    },
    CauseInfo {
        kind: "context-overflow",
        family: Family::Context,
        description: "the rendered context exceeded its token limit",
    },
    CauseInfo {
        kind: "malformed-action",
        family: Family::Context,
        description: "turns whose tool calls could not be parsed",
    },
];

/// The catalogue entry of a cause kind.
pub fn cause_info(kind: &str) -> Option<&'static CauseInfo> {
    CAUSE_KINDS.iter().find(|c| c.kind == kind)
}

/// The family of a cause kind (`Other` outside the catalogue).
pub fn family_of(kind: &str) -> Family {
    cause_info(kind).map_or(Family::Other, |c| c.family)
}

/// A root cause with the failed tasks it explains.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Cause {
    /// The cause's kind (a catalogue name, or an analyst's own name).
    pub kind: String,
    /// What went wrong, in one sentence.
    pub summary: String,
    /// The distinct failed task ids it explains, sorted.
    pub tasks: Vec<String>,
    /// One line of evidence per task (the earliest decision or tool result that explains it).
    #[serde(default)]
    pub evidence: Vec<String>,
    /// Names found in the evidence that a repair may need (the listing tool, the write tool).
    #[serde(default)]
    pub tools: Vec<String>,
}

/// What an [`crate::Analyst`] found in one parent's failures.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FailureAnalysis {
    /// Failed episodes looked at.
    pub failures: usize,
    /// Every explained failure, grouped by root cause (largest first, then by kind).
    pub causes: Vec<Cause>,
    /// Failed task ids no cause explains.
    pub unresolved: Vec<String>,
    /// Failures the analyst could not judge (an LLM whose answers stayed malformed).
    pub skipped: Vec<String>,
}

impl FailureAnalysis {
    /// Sort causes (most tasks first, then kind) and every task list.
    pub fn normalise(&mut self) {
        for cause in &mut self.causes {
            let mut pairs: Vec<(String, String)> = cause
                .tasks
                .iter()
                .cloned()
                .zip(
                    cause
                        .evidence
                        .iter()
                        .cloned()
                        .chain(std::iter::repeat(String::new())),
                )
                .collect();
            pairs.sort();
            pairs.dedup_by(|a, b| a.0 == b.0);
            cause.tasks = pairs.iter().map(|p| p.0.clone()).collect();
            cause.evidence = pairs.into_iter().map(|p| p.1).collect();
            cause.tools.sort();
            cause.tools.dedup();
        }
        self.causes.sort_by(|a, b| {
            b.tasks
                .len()
                .cmp(&a.tasks.len())
                .then_with(|| a.kind.cmp(&b.kind))
        });
        self.unresolved.sort();
        self.unresolved.dedup();
        self.skipped.sort();
        self.skipped.dedup();
    }
}
