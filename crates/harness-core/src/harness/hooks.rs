//! Hooks: named reactions to loop events, with a closed set of conditions.
//!
//! On disk a hook keeps the paper's shape (Table 7):
//! `{"action": "warn", "condition": "remaining_steps_lte", "event": "after_tool",
//!   "message": "...", "parameters": {"threshold": 3}}`.
//! [`HookSpec::compile`] turns the condition name and parameters into a typed [`Condition`].

use std::collections::BTreeMap;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::action::ToolCall;
use crate::env::{Observation, ToolKind};
use crate::error::{Error, Result};

/// When a hook is considered.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookEvent {
    /// Before each policy call.
    BeforeModel,
    /// Before a tool call is sent to the environment (the only event where `block` refuses a
    /// tool call).
    BeforeTool,
    /// After each environment action.
    AfterTool,
    /// After a failed action (a tool error or an unparseable turn).
    OnError,
    /// When the policy tries to finish (a final answer or a submit tool).
    BeforeFinish,
}

/// What a hook does when it fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookAction {
    /// Inject the message into the context (the action proceeds).
    Warn,
    /// Refuse the pending action with the message when the condition holds
    /// (`before_tool` and `before_finish` only).
    Block,
    /// Refuse to finish with the message until the condition holds (`before_finish` only).
    Require,
}

/// A hook as stored in a harness.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookSpec {
    /// What it does.
    pub action: HookAction,
    /// The condition's name (one of [`CONDITIONS`]).
    pub condition: String,
    /// When it is considered.
    pub event: HookEvent,
    /// The text injected or shown on refusal.
    pub message: String,
    /// The condition's parameters.
    #[serde(default)]
    pub parameters: BTreeMap<String, serde_json::Value>,
}

/// The closed set of condition names with their parameters, for documentation and errors.
pub const CONDITIONS: &[(&str, &str)] = &[
    ("always", "no parameters"),
    (
        "pagination_present",
        "no parameters: the last observation is one page of a listing",
    ),
    (
        "remaining_steps_lte",
        "`threshold` (integer >= 0): environment actions left <= threshold",
    ),
    (
        "remaining_calls_lte",
        "`threshold` (integer >= 0): model calls left <= threshold",
    ),
    (
        "tool_error",
        "no parameters: the last observation is an error",
    ),
    (
        "repeated_action",
        "`n` (integer >= 2): the latest n actions are identical",
    ),
    (
        "no_schema_lookup_before_first_call",
        "no parameters: the latest action is the first non-lookup call and no lookup tool came before it",
    ),
    (
        "observation_matches",
        "`pattern` (regular expression): the last observation matches",
    ),
    (
        "tool_called",
        "`name` (tool name): the tool has been called without error",
    ),
    (
        "tool_is",
        "`name` (tool name): the latest action calls this tool",
    ),
];

/// A typed condition.
#[derive(Debug, Clone)]
pub enum Condition {
    /// Always holds.
    Always,
    /// The last observation is one page of a listing.
    PaginationPresent,
    /// Environment actions left <= threshold.
    RemainingStepsLte(u32),
    /// Model calls left <= threshold.
    RemainingCallsLte(u32),
    /// The last observation is an error.
    ToolError,
    /// The latest `n` actions (the pending one included) are identical.
    RepeatedAction(u32),
    /// The latest action is the episode's first non-lookup call and no lookup preceded it.
    NoSchemaLookupBeforeFirstCall,
    /// The last observation's text matches.
    ObservationMatches(Regex),
    /// The tool has been called without error.
    ToolCalled(String),
    /// The latest action calls this tool.
    ToolIs(String),
}

/// A hook ready to evaluate.
#[derive(Debug, Clone)]
pub struct CompiledHook {
    /// The hook's name in the harness.
    pub name: String,
    /// What it does.
    pub action: HookAction,
    /// When it is considered.
    pub event: HookEvent,
    /// The text injected or shown on refusal.
    pub message: String,
    /// The typed condition.
    pub condition: Condition,
}

/// What conditions can see of an episode at an event.
#[derive(Debug, Clone, Copy)]
pub struct HookState<'a> {
    /// The most recent observation, if any.
    pub last_observation: Option<&'a Observation>,
    /// The action about to run (`before_tool`, `before_finish` with a submit tool).
    pub pending: Option<&'a ToolCall>,
    /// Actions sent to the environment so far, with whether each failed.
    pub executed: &'a [(ToolCall, bool)],
    /// Environment actions left.
    pub remaining_steps: u32,
    /// Model calls left.
    pub remaining_calls: u32,
    /// The kind of each tool, by name (unknown names count as actions).
    pub tool_kinds: &'a BTreeMap<String, ToolKind>,
}

impl HookState<'_> {
    fn kind(&self, name: &str) -> ToolKind {
        self.tool_kinds.get(name).copied().unwrap_or_default()
    }

    /// Executed actions followed by the pending one.
    fn actions(&self) -> impl Iterator<Item = &ToolCall> {
        self.executed
            .iter()
            .map(|(call, _)| call)
            .chain(self.pending)
    }
}

fn param<'a>(
    spec: &'a HookSpec,
    path: &str,
    key: &str,
    expected: &str,
) -> Result<&'a serde_json::Value> {
    spec.parameters.get(key).ok_or_else(|| {
        Error::invalid(
            format!("{path}.parameters"),
            format!(
                "condition `{}` needs parameter `{key}` ({expected})",
                spec.condition
            ),
        )
    })
}

fn uint_param(spec: &HookSpec, path: &str, key: &str, min: u64) -> Result<u32> {
    let expected = format!("an integer >= {min}");
    let value = param(spec, path, key, &expected)?;
    value
        .as_u64()
        .filter(|v| *v >= min && *v <= u64::from(u32::MAX))
        .map(|v| v as u32)
        .ok_or_else(|| {
            Error::invalid(
                format!("{path}.parameters.{key}"),
                format!("expected {expected}, found {value}"),
            )
        })
}

fn string_param(spec: &HookSpec, path: &str, key: &str, expected: &str) -> Result<String> {
    let value = param(spec, path, key, expected)?;
    match value.as_str() {
        Some(s) if !s.is_empty() => Ok(s.to_string()),
        _ => Err(Error::invalid(
            format!("{path}.parameters.{key}"),
            format!("expected {expected}, found {value}"),
        )),
    }
}

impl HookSpec {
    /// Check the condition, its parameters and the event/action pairing; `path` is the hook's
    /// JSON path for error messages (e.g. `hooks.low-budget`).
    pub fn compile(&self, name: &str, path: &str) -> Result<CompiledHook> {
        let allowed: &[&str] = match self.condition.as_str() {
            "remaining_steps_lte" | "remaining_calls_lte" => &["threshold"],
            "repeated_action" => &["n"],
            "observation_matches" => &["pattern"],
            "tool_called" | "tool_is" => &["name"],
            _ => &[],
        };
        let condition = match self.condition.as_str() {
            "always" => Condition::Always,
            "pagination_present" => Condition::PaginationPresent,
            "remaining_steps_lte" => {
                Condition::RemainingStepsLte(uint_param(self, path, "threshold", 0)?)
            }
            "remaining_calls_lte" => {
                Condition::RemainingCallsLte(uint_param(self, path, "threshold", 0)?)
            }
            "tool_error" => Condition::ToolError,
            "repeated_action" => Condition::RepeatedAction(uint_param(self, path, "n", 2)?),
            "no_schema_lookup_before_first_call" => Condition::NoSchemaLookupBeforeFirstCall,
            "observation_matches" => {
                let pattern = string_param(self, path, "pattern", "a regular expression")?;
                let regex = super::validate::compile_pattern(&pattern, false).map_err(|e| {
                    Error::invalid(
                        format!("{path}.parameters.pattern"),
                        format!("not a valid regular expression: {e}"),
                    )
                })?;
                Condition::ObservationMatches(regex)
            }
            "tool_called" => {
                Condition::ToolCalled(string_param(self, path, "name", "a tool name")?)
            }
            "tool_is" => Condition::ToolIs(string_param(self, path, "name", "a tool name")?),
            other => {
                let known: Vec<&str> = CONDITIONS.iter().map(|(n, _)| *n).collect();
                return Err(Error::invalid(
                    format!("{path}.condition"),
                    format!(
                        "unknown condition `{other}`; expected one of: {}",
                        known.join(", ")
                    ),
                ));
            }
        };
        if let Some(extra) = self
            .parameters
            .keys()
            .find(|k| !allowed.contains(&k.as_str()))
        {
            let expected = if allowed.is_empty() {
                "no parameters".to_string()
            } else {
                format!(
                    "only {}",
                    allowed
                        .iter()
                        .map(|a| format!("`{a}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            };
            return Err(Error::invalid(
                format!("{path}.parameters.{extra}"),
                format!(
                    "unknown parameter for condition `{}`; expected {expected}",
                    self.condition
                ),
            ));
        }
        match (self.action, self.event) {
            (HookAction::Warn, _) => {}
            (HookAction::Block, HookEvent::BeforeTool | HookEvent::BeforeFinish) => {}
            (HookAction::Require, HookEvent::BeforeFinish) => {}
            (HookAction::Block, _) => {
                return Err(Error::invalid(
                    format!("{path}.event"),
                    "action `block` refuses a pending action, so its event must be `before_tool` or `before_finish`",
                ));
            }
            (HookAction::Require, _) => {
                return Err(Error::invalid(
                    format!("{path}.event"),
                    "action `require` holds back finishing, so its event must be `before_finish`",
                ));
            }
        }
        if self.message.trim().is_empty() {
            return Err(Error::invalid(
                format!("{path}.message"),
                "expected a non-empty message",
            ));
        }
        Ok(CompiledHook {
            name: name.to_string(),
            action: self.action,
            event: self.event,
            message: self.message.clone(),
            condition,
        })
    }
}

impl Condition {
    /// Whether the condition holds in `state`.
    pub fn holds(&self, state: &HookState<'_>) -> bool {
        match self {
            Condition::Always => true,
            Condition::PaginationPresent => state.last_observation.is_some_and(|o| o.pagination),
            Condition::RemainingStepsLte(t) => state.remaining_steps <= *t,
            Condition::RemainingCallsLte(t) => state.remaining_calls <= *t,
            Condition::ToolError => state.last_observation.is_some_and(|o| o.error),
            Condition::RepeatedAction(n) => {
                let actions: Vec<String> = state.actions().map(ToolCall::canonical).collect();
                let n = *n as usize;
                actions.len() >= n
                    && actions[actions.len() - n..]
                        .iter()
                        .all(|a| *a == actions[actions.len() - 1])
            }
            Condition::NoSchemaLookupBeforeFirstCall => {
                let actions: Vec<&ToolCall> = state.actions().collect();
                let Some(first) = actions
                    .iter()
                    .position(|c| state.kind(&c.name) != ToolKind::Lookup)
                else {
                    return false;
                };
                first == actions.len() - 1 && first == 0
            }
            Condition::ObservationMatches(regex) => state
                .last_observation
                .is_some_and(|o| regex.is_match(&o.text)),
            Condition::ToolCalled(name) => state
                .executed
                .iter()
                .any(|(call, failed)| !failed && call.name == *name),
            Condition::ToolIs(name) => state.actions().last().is_some_and(|c| c.name == *name),
        }
    }
}

impl CompiledHook {
    /// Whether the hook fires in `state`: its condition holds, or for `require`, does not.
    pub fn fires(&self, state: &HookState<'_>) -> bool {
        let holds = self.condition.holds(state);
        match self.action {
            HookAction::Require => !holds,
            HookAction::Warn | HookAction::Block => holds,
        }
    }
}
