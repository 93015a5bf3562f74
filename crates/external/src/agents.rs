//! The agent programs that ship with this crate, and how to make one a sibling of a
//! declarative harness.
//!
//! [`DBBENCH_AGENT`] is a DBBench agent in standard-library Python (`agents/dbbench_agent.py`):
//! it reads the task and the tools from its environment-server session, asks the policy
//! through the recording proxy with the tools offered the OpenAI way, and runs the calls on the
//! session. By default it speaks its own prompts. [`mirror_sibling`] configures it instead to
//! speak the prompts of a declarative H0 (its rendered system message, its user template, the
//! loop's answer to a turn without a tool call) and to carry a sibling's warn hooks: an agent
//! program that is a sibling of H0, so that a policy trained under harness-s's loop meets
//! prompts it knows, while every token it trains on passes through the proxy.

use std::collections::BTreeMap;

use harness_core::{Harness, HookAction, HookEvent, HookSpec, Split, Task};

use crate::error::{Error, Result};
use crate::program::{ExternalHarness, ExternalKind, ProgramLimits};

/// The source of `agents/dbbench_agent.py`.
pub const DBBENCH_AGENT: &str = include_str!("../agents/dbbench_agent.py");

/// The conditions the bundled agent evaluates (warn hooks after a tool call or on an error).
pub const AGENT_CONDITIONS: &[&str] = &[
    "always",
    "tool_error",
    "remaining_steps_lte",
    "observation_matches",
];

/// What [`mirror_sibling`] builds from.
pub struct MirrorSpec<'a> {
    /// The declarative H0 whose prompts the program speaks.
    pub base: &'a Harness,
    /// The hooks the program carries (by name), each a warn hook after a tool call or on an
    /// error with one of [`AGENT_CONDITIONS`].
    pub hooks: BTreeMap<String, HookSpec>,
    /// What the loop answers to a turn without a tool call under H0's action format (see
    /// [`harness_core::invalid_action_message`]); `None` when such a turn ends the episode
    /// with the turn as the answer.
    pub no_call_reply: Option<String>,
    /// The program: the interpreter and the installed agent.
    pub command: Vec<String>,
    /// The member's name.
    pub name: String,
    /// Seconds an episode may take.
    pub timeout_s: f64,
}

/// The bundled DBBench agent as a sibling of `spec.base` carrying `spec.hooks`. Refused, with
/// the field that the agent cannot mirror, when H0 shows what the program does not: a system
/// prompt that depends on the task, skills, memory, elided or cut observations, a filtered or
/// documented tool view, or a hook that is not a warn hook the agent evaluates.
pub fn mirror_sibling(spec: MirrorSpec<'_>) -> Result<ExternalHarness> {
    let base = spec.base;
    let refuse = |field: &str, why: &str| {
        Err(Error::config(
            field,
            format!(
                "the bundled agent cannot mirror harness `{}`: {why}",
                base.name
            ),
        ))
    };
    if !base.skills.is_empty() {
        return refuse("skills", "it has skills");
    }
    if base.memory.enabled {
        return refuse("memory", "it keeps notes");
    }
    if base.context.keep_last_observations.is_some() {
        return refuse("context.keep_last_observations", "it elides observations");
    }
    let view = &base.tool_view;
    if view.include.is_some() || !view.hide.is_empty() || !view.docs.is_empty() {
        return refuse(
            "tool_view",
            "it filters or documents the tools (the agent offers the session's tools as they are)",
        );
    }
    if view.max_observation_chars.is_some() {
        return refuse("tool_view.max_observation_chars", "it cuts observations");
    }
    if base.is_external() {
        return refuse("program", "it is an agent program itself");
    }
    // The system message must not depend on the task: the program gets it rendered once.
    let probe = |instruction: &str| Task::new("probe", "probe", Split::Train, instruction, 0);
    let system = base
        .system_prompt(&probe("first"))
        .map_err(|e| Error::config("prompt.system", e.to_string()))?;
    if base
        .system_prompt(&probe("second"))
        .map_err(|e| Error::config("prompt.system", e.to_string()))?
        != system
    {
        return refuse(
            "prompt.system",
            "its system prompt depends on the task's instruction",
        );
    }
    // `{instruction}` survives rendering as itself: the program puts the task's there.
    let user = base
        .user_prompt(&probe("{instruction}"))
        .map_err(|e| Error::config("prompt.user", e.to_string()))?;
    for (name, hook) in &spec.hooks {
        let field = format!("hooks.{name}");
        if hook.action != HookAction::Warn {
            return refuse(&field, "only warn hooks are carried");
        }
        if !matches!(hook.event, HookEvent::AfterTool | HookEvent::OnError) {
            return refuse(&field, "only after_tool and on_error hooks are carried");
        }
        if !AGENT_CONDITIONS.contains(&hook.condition.as_str()) {
            return refuse(
                &field,
                &format!(
                    "its condition `{}` is not one the agent evaluates ({})",
                    hook.condition,
                    AGENT_CONDITIONS.join(", ")
                ),
            );
        }
    }
    // The loop fires hooks in name order; so does the program, in list order. Each carries its
    // name, which the program sends as the message's `hook:<name>` marker (proxy::record).
    let hooks: Vec<serde_json::Value> = spec
        .hooks
        .iter()
        .map(|(name, hook)| {
            let mut v = serde_json::to_value(hook).expect("hooks serialise");
            v["name"] = serde_json::Value::String(name.clone());
            v
        })
        .collect();
    let mut env = BTreeMap::from([
        ("AGENT_SYSTEM".to_string(), system),
        ("AGENT_USER".to_string(), user),
        (
            "AGENT_HOOKS".to_string(),
            serde_json::to_string(&hooks).expect("hooks serialise"),
        ),
    ]);
    if let Some(reply) = spec.no_call_reply {
        env.insert("AGENT_NO_CALL".into(), reply);
    }
    let limits = base.limits;
    let harness = ExternalHarness {
        kind: ExternalKind::External,
        name: spec.name,
        description: format!(
            "The bundled Python DBBench agent speaking the prompts of `{}` with the hooks {}.",
            base.name,
            spec.hooks.keys().cloned().collect::<Vec<_>>().join(", ")
        ),
        command: spec.command,
        env,
        limits: ProgramLimits {
            max_model_calls: limits.max_model_calls,
            max_env_actions: limits.max_env_actions,
            max_context_tokens: limits.max_context_tokens,
            max_output_tokens: limits.max_output_tokens,
            timeout_s: spec.timeout_s,
        },
    };
    harness.validate()?;
    Ok(harness)
}
