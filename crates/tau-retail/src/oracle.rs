//! The reference solver: the task's gold actions in order, with the conversation around them
//! that the protocol asks for. It asks the customer for the details a gold user lookup needs,
//! asks for confirmation before each gold write ([`confirmation_request`]), tells the customer
//! every `communicate_info` string at the end, and lets the customer close the conversation
//! (or transfers, when the gold actions do). `tau_check` and the conformance suite rely on it
//! scoring 1 on every task.

use async_trait::async_trait;
use harness_core::{Policy, PolicyRequest, PolicyTurn, Result, Role, Task, ToolCall};
use serde_json::json;

use super::RESPOND_TOOL;
use super::tasks::{RetailTask, retail_task};
use super::tools::{self, name};
use super::user::confirmation_request;

fn respond(content: &str) -> String {
    ToolCall::new(RESPOND_TOOL, json!({ "content": content })).to_tool_call_block()
}

/// The closing message: every string the agent must communicate, then an offer of more help.
pub fn closing_message(task: &RetailTask) -> String {
    let info = &task.evaluation_criteria.communicate_info;
    if info.is_empty() {
        "Your request has been handled. Is there anything else I can help you with?".into()
    } else {
        format!(
            "Here is the information you asked for: {}. Is there anything else I can help you with?",
            info.join("; ")
        )
    }
}

/// The oracle's turns for `task`, one per policy call.
pub fn oracle_turns(task: &RetailTask) -> Vec<String> {
    let mut turns = Vec::new();
    let mut asked_identity = false;
    for action in &task.evaluation_criteria.actions {
        let call = ToolCall::new(action.name.clone(), action.arguments.clone());
        if tools::AUTH_TOOLS.contains(&action.name.as_str()) && !asked_identity {
            asked_identity = true;
            turns.push(respond(if action.name == name::FIND_USER_ID_BY_EMAIL {
                "Could you tell me your email address?"
            } else {
                "Could you tell me your first name, last name and zip code?"
            }));
        }
        if action.name == name::TRANSFER_TO_HUMAN_AGENTS {
            if !task.evaluation_criteria.communicate_info.is_empty() {
                turns.push(respond(&closing_message(task)));
            }
            turns.push(call.to_tool_call_block());
            return turns;
        }
        if tools::is_write(&action.name) {
            turns.push(respond(&confirmation_request(action)));
        }
        turns.push(call.to_tool_call_block());
    }
    turns.push(respond(&closing_message(task)));
    turns.push("Thank you for contacting us. Goodbye!".into());
    turns
}

/// A policy that says [`oracle_turns`] one per turn. Stateless (the turn index is the number of
/// earlier assistant messages), so one value serves concurrent episodes of its task.
#[derive(Debug, Clone)]
pub struct OraclePolicy {
    turns: Vec<String>,
}

impl OraclePolicy {
    /// The oracle of a harness task of this environment.
    pub fn new(task: &Task) -> Result<Self> {
        let task = retail_task(task).map_err(harness_core::Error::from)?;
        Ok(OraclePolicy {
            turns: oracle_turns(&task),
        })
    }
}

#[async_trait]
impl Policy for OraclePolicy {
    fn name(&self) -> &str {
        "tau-retail-oracle"
    }

    async fn generate(&self, request: PolicyRequest) -> Result<PolicyTurn> {
        let done = request
            .messages
            .iter()
            .filter(|m| m.role == Role::Assistant)
            .count();
        let text = self
            .turns
            .get(done)
            .cloned()
            .unwrap_or_else(|| "Goodbye!".into());
        Ok(PolicyTurn::text_only(text, request.max_new_tokens))
    }
}
