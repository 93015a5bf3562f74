//! An [`Editor`] over a [`ChatModel`]: the parent, the direction's causes with evidence and the
//! other candidates' briefs in; a validated structured edit out.

use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{CONDITIONS, ChatMessage, ChatModel, Harness, HarnessEdit, ToolSpec};
use serde_json::Value;

use crate::editor::{EditRequest, Editor, Feedback, Proposal, component_of};
use crate::error::Result;
use crate::llm::{Ask, ask_json};
use crate::usage::{RoleUsage, UsageCell};

/// The role name under which the editor's tokens are counted.
pub const EDITOR_ROLE: &str = "editor";

/// An LLM harness editor (the paper's uses GLM-5.3 at temperature 0.6, Table 8, "Harness
/// editor"). Its answer must be `{"brief": text, "ops": [{"path": "state...", "value": ...}]}`;
/// an answer that does not parse, names a path outside the six editable components, or yields
/// an invalid harness (a dangling slot, an unknown condition) is shown back with the reason and
/// retried within the budget, then skipped and counted.
pub struct LlmEditor {
    model: Arc<dyn ChatModel>,
    retries: usize,
    temperature: f32,
    seed: u64,
    max_tokens: Option<usize>,
    usage: UsageCell,
}

impl LlmEditor {
    /// An editor asking `model`, retrying an unusable answer `retries` times, at temperature 0.6
    /// (Table 8).
    pub fn new(model: Arc<dyn ChatModel>, retries: usize) -> Self {
        LlmEditor {
            model,
            retries,
            temperature: 0.6,
            seed: 42,
            max_tokens: None,
            usage: UsageCell::default(),
        }
    }

    /// Cap on each answer's tokens (`None`: 4,096).
    pub fn with_max_tokens(mut self, max_tokens: Option<usize>) -> Self {
        self.max_tokens = max_tokens;
        self
    }

    /// Temperature and seed of the requests.
    pub fn with_sampling(mut self, temperature: f32, seed: u64) -> Self {
        self.temperature = temperature;
        self.seed = seed;
        self
    }

    async fn ask(&self, request: &EditRequest<'_>, body: String) -> Option<Proposal> {
        let ask = Ask {
            role: EDITOR_ROLE,
            messages: vec![
                ChatMessage::system(system_prompt()),
                ChatMessage::user(body),
            ],
            retries: self.retries,
            temperature: self.temperature,
            seed: Some(self.seed),
            max_tokens: self.max_tokens,
            usage: &self.usage,
        };
        let proposal = ask_json(self.model.as_ref(), ask, |v| validate_answer(v, request)).await;
        if proposal.is_none() {
            tracing::warn!(direction = %request.direction.id, "editor answer skipped after the retry budget");
        }
        proposal
    }
}

fn system_prompt() -> String {
    format!(
        "You edit an agent harness to repair diagnosed failure causes. {}\n\
         Limits are fixed. Seek a mechanism different from the other candidates' briefs. Answer with one \
         JSON object: {{\"brief\": one line naming the mechanism and causes, \"ops\": [{{\"path\": \"state....\", \
         \"value\": JSON or null to remove}}]}}.",
        editable_components()
    )
}

/// The editable components and hook conditions, as the LLM roles that write edits are told.
pub(crate) fn editable_components() -> String {
    let conditions: Vec<String> = CONDITIONS
        .iter()
        .map(|(n, p)| format!("- {n}: {p}"))
        .collect();
    format!(
        "Choose among all six editable \
         components according to the diagnosed cause; do not default to prompt/skill edits:\n\
         - state.prompt.slots.<name> (slot text), state.prompt_rules.<name> = {{\"slot\", \"text\"}}\n\
         - state.skills.<name> = {{\"text\", \"trigger\": regex or null}}\n\
         - state.context.keep_last_observations (integer or null), state.context.elision_text\n\
         - state.memory = {{\"enabled\", \"auto_notes\", \"note_tool\", \"max_notes\", \"note_chars\"}}\n\
         - state.hooks.<name> = {{\"action\": warn|block|require, \"condition\", \"event\": before_model|before_tool|after_tool|on_error|before_finish, \"message\", \"parameters\"}}\n\
         - state.tool_view.docs.<tool>, state.tool_view.max_observation_chars, state.tool_view.include/hide\n\
         Hook conditions:\n{}",
        conditions.join("\n")
    )
}

fn request_body(request: &EditRequest<'_>) -> String {
    let mut out = format!(
        "Parent harness:\n{}\n\nCauses to repair:\n",
        request.parent.to_json_pretty()
    );
    for cause in &request.direction.causes {
        out.push_str(&format!(
            "- {} ({} failed tasks): {}\n",
            cause.kind,
            cause.tasks.len(),
            cause.summary
        ));
        for line in cause.evidence.iter().take(5) {
            out.push_str(&format!("    {line}\n"));
        }
    }
    out.push_str("\nTools of the environment:\n");
    for tool in request.tools {
        out.push_str(&format!(
            "- {} ({:?}): {}\n",
            tool.name, tool.kind, tool.description
        ));
    }
    if !request.other_briefs.is_empty() {
        out.push_str("\nOther candidates this round:\n");
        for brief in request.other_briefs {
            out.push_str(&format!("- {brief}\n"));
        }
    }
    out
}

/// Check an editor answer: the shape, every path inside the editable components, and that the
/// edit applies to the parent as a valid harness.
pub fn validate_answer(
    value: &Value,
    request: &EditRequest<'_>,
) -> std::result::Result<Proposal, String> {
    validate_edit(value, request.parent, request.tools)
}

/// Check a `{"brief", "ops"}` answer against `parent`: a non-empty brief, a non-empty edit whose
/// every path lies inside the editable components, and a valid harness for `tools` once applied.
pub fn validate_edit(
    value: &Value,
    parent: &Harness,
    tools: &[ToolSpec],
) -> std::result::Result<Proposal, String> {
    let brief = value
        .get("brief")
        .and_then(Value::as_str)
        .filter(|b| !b.trim().is_empty())
        .ok_or("`brief` must be a non-empty string")?
        .to_string();
    let ops = value.get("ops").ok_or("`ops` is missing")?;
    let edit: HarnessEdit =
        serde_json::from_value(serde_json::json!({"ops": ops, "rationale": brief}))
            .map_err(|e| format!("`ops` must be a list of {{\"path\", \"value\"}} objects: {e}"))?;
    if edit.is_empty() {
        return Err("`ops` is empty".into());
    }
    for (i, op) in edit.ops.iter().enumerate() {
        if component_of(&op.path).is_none() {
            return Err(format!(
                "ops[{i}].path `{}` is not inside an editable component (prompt, prompt_rules, skills, context, memory, hooks, tool_view)",
                op.path
            ));
        }
    }
    let child = edit
        .apply(parent)
        .map_err(|e| format!("the edit gives an invalid harness: {e}"))?;
    child
        .validate_for_tools(tools)
        .map_err(|e| format!("the edit gives an invalid harness: {e}"))?;
    Ok(Proposal {
        brief: format!("edit {}: {brief}", parent.name),
        edit,
    })
}

#[async_trait]
impl Editor for LlmEditor {
    fn name(&self) -> &str {
        "llm-editor"
    }

    async fn propose(&self, request: &EditRequest<'_>) -> Result<Option<Proposal>> {
        Ok(self.ask(request, request_body(request)).await)
    }

    async fn revise(
        &self,
        request: &EditRequest<'_>,
        previous: &Proposal,
        feedback: &Feedback,
    ) -> Result<Option<Proposal>> {
        let eval = &feedback.local_eval;
        let body = format!(
            "{}\n\nYour candidate:\n{}\nThe host measured it on {} training tasks: repaired {:?}, regressed {:?}; still failing among the targeted: {:?}; causes with no repair: {:?}. Submit one revision (the complete edit of the parent, not a diff of your candidate).",
            request_body(request),
            previous.edit,
            eval.tasks,
            eval.repaired,
            eval.regressed,
            feedback.unrepaired,
            feedback.unrepaired_causes
        );
        Ok(self.ask(request, body).await)
    }

    fn usage(&self) -> RoleUsage {
        self.usage.get()
    }
}
