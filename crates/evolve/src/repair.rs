//! The built-in editor: a library of repair operators keyed by cause kind.
//!
//! Each cause kind has several operators, each touching the component the cause calls for
//! (the paper's planning instruction: "choose among all six editable components according to
//! the diagnosed cause; do not default to prompt/skill edits"): a pagination-completion hook
//! (Table 7, S6), an intersection rule in `action_guidance` (Table 7, S7), a low-budget
//! completion hook (Table 7, S8), a require-documentation-first hook, a read-back skill, a
//! memory note for codes, a context-truncation change, tool-view documentation, and an
//! assertion-based verification skill for the repository world. A direction's first proposal
//! uses each cause's first applicable operator; later variants, and revisions, move on to the
//! next one, so siblings along the same causes differ in mechanism.

use async_trait::async_trait;
use harness_core::{EditOp, Harness, HarnessEdit, ToolKind, ToolSpec};
use serde_json::{Value, json};

use crate::cause::Cause;
use crate::editor::{EditRequest, Editor, Feedback, Proposal};
use crate::error::Result;

/// Message of the pagination hook (Table 7, S6).
pub const PAGINATION_MESSAGE: &str = "This result is one page of a longer listing. Keep requesting pages until one comes back empty or shorter than the page size; the first page is not the whole list.";
/// Message of the low-budget hook (Table 7, S8).
pub const LOW_BUDGET_MESSAGE: &str = "Only a few actions are left. Finish only the required checks and keep one action for the completion call; skip anything else.";
/// Message of the low-call-budget hook.
pub const LOW_CALL_BUDGET_MESSAGE: &str = "Only a few replies are left: keep one action for the completion call and submit now if the work is done.";
/// Message of the unknown-name hook.
pub const UNKNOWN_NAME_MESSAGE: &str = "That table or column name is not one the schema has as written. Use the exact names the schema gives, put names with spaces in backticks, and retry.";
/// The unknown-name hook's pattern: an unknown table or column, or a syntax error next to a
/// word (what a name with spaces written without quotes gives).
pub const UNKNOWN_NAME_PATTERN: &str =
    r#"(?i)no such (column|table)|unknown column|doesn't exist|near "[^"]+": syntax error"#;
/// Message of the repeated-failure hook.
pub const REPEATED_FAILURE_MESSAGE: &str = "You repeated a call that failed. Do not repeat it: read the error, then change the arguments or the approach.";

/// The commit-after-change hook's pattern: DBBench's report of a successful change.
pub const CHANGE_DONE_PATTERN: &str = "^Query OK, \\d+ rows? affected";

/// Message of the commit-after-change hook, for the environment's commit tool `submit`.
pub fn commit_after_change_message(submit: &str) -> String {
    format!(
        "The change is made. If it is the change the task asks for, commit an empty answer now with {submit} and [] as the answers."
    )
}

/// What an operator sees.
pub struct OpCtx<'a> {
    /// The parent.
    pub parent: &'a Harness,
    /// The cause being repaired.
    pub cause: &'a Cause,
    /// The environment's tools.
    pub tools: &'a [ToolSpec],
}

impl OpCtx<'_> {
    /// The slot rules go to: `action_guidance` when the prompt has it, else the first slot.
    fn slot(&self) -> Option<String> {
        let slots = &self.parent.prompt.slots;
        if slots.contains_key("action_guidance") {
            return Some("action_guidance".into());
        }
        slots.keys().next().cloned()
    }

    fn tool_of_kind(&self, kind: ToolKind) -> Option<String> {
        self.tools
            .iter()
            .find(|t| t.kind == kind)
            .map(|t| t.name.clone())
    }

    fn has_tool(&self, name: &str) -> bool {
        self.tools.iter().any(|t| t.name == name)
    }

    /// The tool the cause's evidence names, when the environment has it.
    fn cause_tool(&self) -> Option<String> {
        self.cause.tools.iter().find(|t| self.has_tool(t)).cloned()
    }

    /// A rule in the prompt slot, or the same text as an always-on skill when the prompt has
    /// no slot to extend.
    fn rule_or_skill(&self, name: &str, text: &str) -> Vec<EditOp> {
        match self.slot() {
            Some(slot) => vec![EditOp::set(
                format!("state.prompt_rules.{name}"),
                json!({"slot": slot, "text": text}),
            )],
            None => skill(name, text, None),
        }
    }
}

fn hook(
    name: &str,
    action: &str,
    condition: &str,
    event: &str,
    message: &str,
    parameters: Value,
) -> Vec<EditOp> {
    vec![EditOp::set(
        format!("state.hooks.{name}"),
        json!({"action": action, "condition": condition, "event": event, "message": message, "parameters": parameters}),
    )]
}

fn skill(name: &str, text: &str, trigger: Option<&str>) -> Vec<EditOp> {
    vec![EditOp::set(
        format!("state.skills.{name}"),
        json!({"text": text, "trigger": trigger}),
    )]
}

fn tool_doc(tool: &str, text: &str) -> Vec<EditOp> {
    vec![EditOp::set(
        format!("state.tool_view.docs.{tool}"),
        json!(text),
    )]
}

/// One repair: a name, the component it edits, and how to build its operations.
pub struct Operator {
    /// The operator's name (also the entry's name in the harness).
    pub name: &'static str,
    /// The component it edits.
    pub component: &'static str,
    /// The operations, or `None` when the operator does not apply (no slot, no such tool).
    pub build: fn(&OpCtx<'_>) -> Option<Vec<EditOp>>,
}

/// The low-step reminder (Table 7, S8): the first repair of every cause that ends without the
/// completion call for want of steps.
const LOW_BUDGET_OP: Operator = Operator {
    name: "low-budget-completion",
    component: "hooks",
    build: |_| {
        Some(hook(
            "low-budget-completion",
            "warn",
            "remaining_steps_lte",
            "after_tool",
            LOW_BUDGET_MESSAGE,
            json!({"threshold": 3}),
        ))
    },
};

/// The operators for a cause kind, in order of preference (empty for unknown kinds).
pub fn operators(kind: &str) -> &'static [Operator] {
    match kind {
        "stopped-paging" => {
            const OPS: &[Operator] = &[
                Operator {
                    name: "pagination-completion-guidance",
                    component: "hooks",
                    build: |_| {
                        Some(hook(
                            "pagination-completion-guidance",
                            "warn",
                            "pagination_present",
                            "after_tool",
                            PAGINATION_MESSAGE,
                            json!({}),
                        ))
                    },
                },
                Operator {
                    name: "listing-pagination-doc",
                    component: "tool_view",
                    build: |c| {
                        Some(tool_doc(
                            &c.cause_tool()?,
                            "Results come one page at a time. Keep requesting pages until one comes back empty or shorter than the page size before you count or answer.",
                        ))
                    },
                },
                Operator {
                    name: "complete-listing",
                    component: "skill",
                    build: |_| {
                        Some(skill(
                            "complete-listing",
                            "When a task needs every item of a listing: keep requesting pages until one comes back empty or shorter than the page size, merge the pages, and only then count, filter or answer.",
                            None,
                        ))
                    },
                },
            ];
            OPS
        }
        "union-not-intersection" => {
            const OPS: &[Operator] = &[
                Operator {
                    name: "reconcile-before-side-effect",
                    component: "prompt",
                    build: |c| {
                        Some(c.rule_or_skill("reconcile-before-side-effect", "When a request combines several conditions, fetch the records for each condition and keep only those that meet all of them (the intersection); never widen a match to a whole containing collection."))
                    },
                },
                Operator {
                    name: "joint-filtering",
                    component: "skill",
                    build: |_| {
                        Some(skill(
                            "joint-filtering",
                            "Before answering, check every candidate item against each condition of the request and drop items that fail any of them; the answer is the intersection.",
                            None,
                        ))
                    },
                },
            ];
            OPS
        }
        "budget-before-completion" => {
            const OPS: &[Operator] = &[
                LOW_BUDGET_OP,
                Operator {
                    name: "reserve-completion-step",
                    component: "prompt",
                    build: |c| {
                        Some(c.rule_or_skill("reserve-completion-step", "Plan within the action budget: stop exploring once you have what the task needs and keep one action for the completion call."))
                    },
                },
                Operator {
                    name: "low-call-budget",
                    component: "hooks",
                    build: |_| {
                        Some(hook(
                            "low-call-budget",
                            "warn",
                            "remaining_calls_lte",
                            "before_model",
                            LOW_CALL_BUDGET_MESSAGE,
                            json!({"threshold": 2}),
                        ))
                    },
                },
            ];
            OPS
        }
        "rerun-instead-of-commit" => {
            const OPS: &[Operator] = &[
                // Re-running a finished statement spends the budget the commit needs: the same
                // reminder as for an exhausted budget, before it is exhausted.
                LOW_BUDGET_OP,
                Operator {
                    name: "commit-known-result",
                    component: "prompt",
                    build: |c| {
                        let submit = c.tool_of_kind(ToolKind::Submit)?;
                        Some(c.rule_or_skill("commit-known-result", &format!("Once a statement has returned the values the question asks for, commit them with `{submit}`; running it again shows nothing new.")))
                    },
                },
                Operator {
                    name: "repeated-result-commit",
                    component: "hooks",
                    build: |c| {
                        let submit = c.tool_of_kind(ToolKind::Submit)?;
                        Some(hook(
                            "repeated-result-commit",
                            "warn",
                            "repeated_action",
                            "after_tool",
                            &format!(
                                "You ran this already and have its result: commit the answer with {submit} instead of running it again."
                            ),
                            json!({"n": 2}),
                        ))
                    },
                },
            ];
            OPS
        }
        "no-commit-after-change" => {
            const OPS: &[Operator] = &[
                Operator {
                    name: "commit-after-change",
                    component: "hooks",
                    build: |c| {
                        // The hook reads DBBench's change report; elsewhere the rule below.
                        if !c.has_tool("execute_sql") {
                            return None;
                        }
                        let submit = c.tool_of_kind(ToolKind::Submit)?;
                        Some(hook(
                            "commit-after-change",
                            "warn",
                            "observation_matches",
                            "after_tool",
                            &commit_after_change_message(&submit),
                            json!({"pattern": CHANGE_DONE_PATTERN}),
                        ))
                    },
                },
                Operator {
                    name: "commit-when-changed",
                    component: "prompt",
                    build: |c| {
                        let submit = c.tool_of_kind(ToolKind::Submit)?;
                        Some(c.rule_or_skill("commit-when-changed", &format!("When the change the task asks for has succeeded, finish with `{submit}` right away; one read-back is enough, further checks spend the budget.")))
                    },
                },
                LOW_BUDGET_OP,
            ];
            OPS
        }
        "finished-without-submit" => {
            const OPS: &[Operator] = &[
                Operator {
                    name: "require-completion-call",
                    component: "hooks",
                    build: |c| {
                        let submit = c.tool_of_kind(ToolKind::Submit)?;
                        Some(hook(
                            "require-completion-call",
                            "require",
                            "tool_is",
                            "before_finish",
                            &format!(
                                "An answer written as text does not count. Finish by calling `{submit}` with the answer."
                            ),
                            json!({"name": submit}),
                        ))
                    },
                },
                Operator {
                    name: "finish-through-submit",
                    component: "prompt",
                    build: |c| {
                        let submit = c.tool_of_kind(ToolKind::Submit)?;
                        Some(c.rule_or_skill("finish-through-submit", &format!("Give the final answer only by calling `{submit}`; an answer written as text does not count.")))
                    },
                },
            ];
            OPS
        }
        "repeated-failing-call" => {
            const OPS: &[Operator] = &[
                Operator {
                    name: "repeated-failure-recovery",
                    component: "hooks",
                    build: |_| {
                        Some(hook(
                            "repeated-failure-recovery",
                            "warn",
                            "repeated_action",
                            "on_error",
                            REPEATED_FAILURE_MESSAGE,
                            json!({"n": 2}),
                        ))
                    },
                },
                Operator {
                    name: "error-recovery",
                    component: "skill",
                    build: |_| {
                        Some(skill(
                            "error-recovery",
                            "When a call fails, do not repeat it: read the error, then change the arguments or the approach (read the documentation, check names).",
                            None,
                        ))
                    },
                },
                Operator {
                    name: "action-notes",
                    component: "memory",
                    build: |c| {
                        (!c.parent.memory.enabled).then(|| vec![EditOp::set("state.memory", json!({"enabled": true, "auto_notes": true, "note_tool": false, "max_notes": 20, "note_chars": 200}))])
                    },
                },
            ];
            OPS
        }
        "unknown-schema-name" => {
            const OPS: &[Operator] = &[
                // The error itself is the trigger: the most local repair comes first.
                Operator {
                    name: "unknown-name-recovery",
                    component: "hooks",
                    build: |_| {
                        Some(hook(
                            "unknown-name-recovery",
                            "warn",
                            "observation_matches",
                            "on_error",
                            UNKNOWN_NAME_MESSAGE,
                            json!({"pattern": UNKNOWN_NAME_PATTERN}),
                        ))
                    },
                },
                Operator {
                    name: "check-schema-first",
                    component: "prompt",
                    build: |c| {
                        Some(c.rule_or_skill("check-schema-first", "Before the first query, look up the exact table and column names (DESCRIBE the table or read the schema shown) and use only those names."))
                    },
                },
                Operator {
                    name: "schema-names-doc",
                    component: "tool_view",
                    build: |c| {
                        Some(tool_doc(
                            &c.cause_tool()?,
                            "Use only table and column names that exist; DESCRIBE <table> lists the columns. A `no such column` error means the name is wrong: do not repeat it.",
                        ))
                    },
                },
            ];
            OPS
        }
        "call-without-docs" => {
            const OPS: &[Operator] = &[
                Operator {
                    name: "require-documentation-first",
                    component: "hooks",
                    build: |c| {
                        c.tool_of_kind(ToolKind::Lookup)?;
                        Some(hook(
                            "require-documentation-first",
                            "block",
                            "no_schema_lookup_before_first_call",
                            "before_tool",
                            "Read the documentation of the API you are about to call first (its parameters and result shape).",
                            json!({}),
                        ))
                    },
                },
                Operator {
                    name: "api-docs-first-doc",
                    component: "tool_view",
                    build: |c| {
                        Some(tool_doc(
                            &c.cause_tool()?,
                            "Before the first call of an API, read its documentation to get the parameter names and types right.",
                        ))
                    },
                },
            ];
            OPS
        }
        "stale-code" => {
            const OPS: &[Operator] = &[
                Operator {
                    name: "code-notes",
                    component: "memory",
                    build: |c| {
                        (!c.parent.memory.enabled).then(|| vec![EditOp::set("state.memory", json!({"enabled": true, "auto_notes": true, "note_tool": false, "max_notes": 20, "note_chars": 200}))])
                    },
                },
                Operator {
                    name: "newest-code",
                    component: "skill",
                    build: |_| {
                        Some(skill(
                            "newest-code",
                            "Only the most recently requested code works: request the code, then find the newest message that carries it (check spam too) and use that one.",
                            Some("(?i)password|reset|code"),
                        ))
                    },
                },
            ];
            OPS
        }
        "no-readback" => {
            const OPS: &[Operator] = &[
                Operator {
                    name: "read-back",
                    component: "skill",
                    build: |_| {
                        Some(skill(
                            "read-back",
                            "After every change (a payment, a playlist, an update), read the changed record back and check it against the request before completing; answer from what you read back.",
                            None,
                        ))
                    },
                },
                Operator {
                    name: "read-back-rule",
                    component: "prompt",
                    build: |c| {
                        Some(c.rule_or_skill("read-back-rule", "After changing anything, read the result back and answer from what you read, not from what you expect."))
                    },
                },
            ];
            OPS
        }
        "edit-without-retest" => {
            const OPS: &[Operator] = &[
                Operator {
                    name: "assertion-verification",
                    component: "skill",
                    build: |_| {
                        Some(skill(
                            "assertion-verification",
                            "Run the failing test first and read its assertion. After every edit run the tests again; submit only when the failing tests pass and the others still pass.",
                            None,
                        ))
                    },
                },
                Operator {
                    name: "retest-before-submit",
                    component: "hooks",
                    build: |c| {
                        c.has_tool("run_tests").then(|| {
                            hook(
                                "retest-before-submit",
                                "require",
                                "tool_called",
                                "before_finish",
                                "Run the tests with run_tests after your edit before you submit.",
                                json!({"name": "run_tests"}),
                            )
                        })
                    },
                },
            ];
            OPS
        }
        "edited-tests" => {
            const OPS: &[Operator] = &[
                Operator {
                    name: "keep-tests",
                    component: "prompt",
                    build: |c| {
                        Some(c.rule_or_skill("keep-tests", "Never edit the tests: they define the expected behaviour. Change the code under test."))
                    },
                },
                Operator {
                    name: "no-test-edits-doc",
                    component: "tool_view",
                    build: |c| {
                        Some(tool_doc(
                            &c.cause_tool()?,
                            "Do not use this on test files; the tests are restored before judging.",
                        ))
                    },
                },
            ];
            OPS
        }
        "context-overflow" => {
            const OPS: &[Operator] = &[
                Operator {
                    name: "keep-recent-observations",
                    component: "context",
                    build: |c| {
                        (c.parent.context.keep_last_observations.is_none()).then(|| {
                            vec![EditOp::set(
                                "state.context.keep_last_observations",
                                json!(6),
                            )]
                        })
                    },
                },
                Operator {
                    name: "cut-observations",
                    component: "tool_view",
                    build: |c| {
                        (c.parent.tool_view.max_observation_chars.is_none()).then(|| {
                            vec![EditOp::set(
                                "state.tool_view.max_observation_chars",
                                json!(2000),
                            )]
                        })
                    },
                },
            ];
            OPS
        }
        "malformed-action" => {
            const OPS: &[Operator] = &[
                Operator {
                    name: "action-format",
                    component: "prompt",
                    build: |c| {
                        Some(c.rule_or_skill("action-format", "Write every call exactly as <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call> with valid JSON and one call per reply."))
                    },
                },
                Operator {
                    name: "action-format-skill",
                    component: "skill",
                    build: |_| {
                        Some(skill(
                            "action-format-skill",
                            "Each reply holds one tool call: <tool_call>{\"name\": \"tool\", \"arguments\": {\"key\": \"value\"}}</tool_call>. Check the JSON before sending.",
                            None,
                        ))
                    },
                },
            ];
            OPS
        }
        _ => &[],
    }
}

/// Whether every operation would leave the parent unchanged (it already has this repair).
fn already_there(parent: &Harness, ops: &[EditOp]) -> bool {
    ops.iter().all(|op| {
        HarnessEdit::current_value(parent, &op.path)
            .ok()
            .flatten()
            .as_ref()
            == op.value.as_ref()
    })
}

/// The operators of `cause` that apply to the parent, from `start` on (cyclically), skipping
/// those whose name appears in `avoid`, unless every applicable one does.
fn pick(ctx: &OpCtx<'_>, start: usize, avoid: &[String]) -> Vec<(&'static Operator, Vec<EditOp>)> {
    let ops = operators(&ctx.cause.kind);
    let n = ops.len();
    let applicable: Vec<(&'static Operator, Vec<EditOp>)> = (0..n)
        .map(|i| &ops[(start + i) % n])
        .filter_map(|op| (op.build)(ctx).map(|edit| (op, edit)))
        .filter(|(_, edit)| !already_there(ctx.parent, edit))
        .collect();
    let fresh: Vec<(&'static Operator, Vec<EditOp>)> = applicable
        .iter()
        .filter(|(op, _)| !avoid.iter().any(|b| b.contains(op.name)))
        .cloned()
        .collect();
    if fresh.is_empty() { applicable } else { fresh }
}

/// The built-in, offline editor over [`operators`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BuiltinEditor;

fn brief_of(parent: &Harness, picks: &[(String, &'static str, &'static str)]) -> String {
    let parts: Vec<String> = picks
        .iter()
        .map(|(cause, op, component)| format!("{component}:{op} for {cause}"))
        .collect();
    format!("edit {}: {}", parent.name, parts.join("; "))
}

#[async_trait]
impl Editor for BuiltinEditor {
    fn name(&self) -> &str {
        "builtin-editor"
    }

    async fn propose(&self, request: &EditRequest<'_>) -> Result<Option<Proposal>> {
        let mut ops = Vec::new();
        let mut picks = Vec::new();
        for cause in &request.direction.causes {
            let ctx = OpCtx {
                parent: request.parent,
                cause,
                tools: request.tools,
            };
            // Other candidates of this parent already using an operator push this one to the
            // next mechanism; the variant index does the same for repeated directions.
            let avoid: Vec<String> = request
                .other_briefs
                .iter()
                .filter(|b| b.starts_with(&format!("edit {}:", request.parent.name)))
                .cloned()
                .collect();
            if let Some((op, edit)) = pick(&ctx, request.direction.variant, &avoid)
                .into_iter()
                .next()
            {
                ops.extend(edit);
                picks.push((cause.kind.clone(), op.name, op.component));
            }
        }
        if ops.is_empty() {
            return Ok(None);
        }
        let brief = brief_of(request.parent, &picks);
        Ok(Some(Proposal {
            edit: HarnessEdit::new(ops, format!("repair {}", request.direction.label())),
            brief,
        }))
    }

    async fn revise(
        &self,
        request: &EditRequest<'_>,
        previous: &Proposal,
        feedback: &Feedback,
    ) -> Result<Option<Proposal>> {
        // Add the next mechanism for each cause that no measured run shows repaired.
        let mut ops = previous.edit.ops.clone();
        let mut added = Vec::new();
        for cause in request
            .direction
            .causes
            .iter()
            .filter(|c| feedback.unrepaired_causes.contains(&c.kind))
        {
            let ctx = OpCtx {
                parent: request.parent,
                cause,
                tools: request.tools,
            };
            let used: Vec<String> = vec![previous.brief.clone()];
            if let Some((op, edit)) = pick(&ctx, request.direction.variant + 1, &used)
                .into_iter()
                .find(|(op, _)| !previous.brief.contains(op.name))
            {
                ops.extend(edit);
                added.push((cause.kind.clone(), op.name, op.component));
            }
        }
        if added.is_empty() {
            return Ok(None);
        }
        let brief = format!(
            "{}; revision adds {}",
            previous.brief,
            added
                .iter()
                .map(|(c, o, k)| format!("{k}:{o} for {c}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        Ok(Some(Proposal {
            edit: HarnessEdit::new(ops, format!("{} (revised)", previous.edit.rationale)),
            brief,
        }))
    }
}
