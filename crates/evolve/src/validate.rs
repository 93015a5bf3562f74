//! Validation of a candidate child: it parses, every reference resolves, and a smoke run under
//! a scripted policy completes under the protocol. Invalid children are recorded with the stage
//! and reason and never enter the pool.

use async_trait::async_trait;
use harness_core::{
    Environment, EpisodeOptions, Error as CoreError, Harness, Policy, PolicyRequest, PolicyTurn,
    Role, SamplingParams, Task, ToolCall, ToolKind, run_episode_with,
};
use serde::{Deserialize, Serialize};

use crate::editor::{Proposal, component_of};

/// Where a candidate failed validation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The edit changes nothing.
    Empty,
    /// The edit leaves the six editable components (limits, names, lineage) or changes the
    /// execution limits every candidate shares.
    Protocol,
    /// The edited document does not parse as a harness (wrong types, unknown fields).
    Parse,
    /// A reference does not resolve (dangling slot, unknown condition, unknown tool).
    References,
    /// The smoke run failed.
    Smoke,
    /// The child has the same content as a harness already in the pool or the round.
    Duplicate,
}

/// A rejected candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rejection {
    /// The stage that rejected it.
    pub stage: Stage,
    /// Why, naming the field at fault.
    pub reason: String,
}

fn reject(stage: Stage, reason: impl Into<String>) -> Rejection {
    Rejection {
        stage,
        reason: reason.into(),
    }
}

/// A scripted policy for the smoke run: one call of the first non-submit tool with empty
/// arguments (the environment answers it, usually with an error, which exercises the hooks),
/// then a text answer.
pub struct SmokePolicy;

#[async_trait]
impl Policy for SmokePolicy {
    fn name(&self) -> &str {
        "smoke"
    }

    async fn generate(&self, request: PolicyRequest) -> harness_core::Result<PolicyTurn> {
        let turns = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let tool = request.tools.iter().find(|t| t.kind != ToolKind::Submit);
        let text = match (turns, tool) {
            (0, Some(tool)) => {
                ToolCall::new(&tool.name, serde_json::json!({})).to_tool_call_block()
            }
            _ => "Smoke test finished.".to_string(),
        };
        Ok(PolicyTurn::text_only(text, request.max_new_tokens))
    }
}

/// Apply `proposal` to `parent` and validate the child against `env` with a smoke run on
/// `smoke_task`. `Err` only when the environment itself fails; a bad candidate is a
/// [`Rejection`].
pub async fn validate_child(
    parent: &Harness,
    proposal: &Proposal,
    env: &dyn Environment,
    smoke_task: &Task,
    seed: u64,
) -> harness_core::Result<std::result::Result<Harness, Rejection>> {
    if proposal.edit.is_empty() {
        return Ok(Err(reject(Stage::Empty, "the edit has no operations")));
    }
    for (i, op) in proposal.edit.ops.iter().enumerate() {
        if component_of(&op.path).is_none() {
            return Ok(Err(reject(
                Stage::Protocol,
                format!(
                    "ops[{i}].path `{}` is outside the six editable components (prompt, skills, context, memory, hooks, tool_view)",
                    op.path
                ),
            )));
        }
    }
    let child = match proposal.edit.apply(parent) {
        Ok(child) => child,
        Err(CoreError::Parse { location, message }) => {
            return Ok(Err(reject(Stage::Parse, format!("{location}: {message}"))));
        }
        Err(CoreError::Invalid { location, message }) => {
            return Ok(Err(reject(
                Stage::References,
                format!("{location}: {message}"),
            )));
        }
        Err(other) => return Err(other),
    };
    if child.limits != parent.limits {
        return Ok(Err(reject(
            Stage::Protocol,
            "the edit changes the execution limits",
        )));
    }
    if child.id() == parent.id() {
        return Ok(Err(reject(
            Stage::Empty,
            "the edit leaves the parent unchanged",
        )));
    }
    let session = env.reset(smoke_task, seed).await?;
    let tools = session.tools();
    drop(session);
    if let Err(e) = child.validate_for_tools(&tools) {
        return Ok(Err(reject(Stage::References, e.to_string())));
    }
    let options = EpisodeOptions {
        sampling: SamplingParams::greedy(),
    };
    match run_episode_with(&SmokePolicy, &child, env, smoke_task, seed, &options).await {
        Ok(_) => Ok(Ok(child)),
        Err(e @ (CoreError::Invalid { .. } | CoreError::Parse { .. })) => {
            Ok(Err(reject(Stage::Smoke, e.to_string())))
        }
        Err(e) => Err(e),
    }
}
