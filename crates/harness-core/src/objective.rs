//! Rescue objectives: how a learner scores the policy tokens of a trajectory retained from a
//! sibling rescue (DESIGN section 13; issue 39, "What to build" item 3).
//!
//! The paper trains every retained trajectory in its own generating context (Eqs. 13-16):
//! [`RescueObjective::Generating`], the default. Two alternatives are settings of the rescue
//! strategy; both apply only to trajectories of a sibling rescue (a rescued group's trajectories
//! whose harness is not H0). H0 groups, H0-rescue groups and fixed mixtures are scored as the
//! paper scores them.
//!
//! * [`RescueObjective::Masked`]: a rescued trajectory scores only its policy turns from the
//!   sibling's *first intervention* on ([`first_intervention`]); the turns before it were
//!   generated in a context H0 would have shown as well, so the rescue's advantage does not
//!   credit them.
//! * [`RescueObjective::H0`]: a rescued trajectory's policy tokens are re-scored under the
//!   context H0 would have rendered for the same history ([`h0_request`]: H0's system and user
//!   prompt, the sibling's hook messages dropped, tool observations kept), with the importance
//!   ratio `r = pi_theta(y | c_H0) / pi_old(y | c_H)` reshaped as Guide does (arXiv 2506.13923):
//!   `r / (r + gamma)`. The learner computes the loss (grpo-candle's `guide_loss`).
//!
//! # The first intervention
//! [`first_intervention`] finds where a sibling's trajectory first leaves what H0 would have
//! shown the policy, from the two harnesses and the trajectory's message record, in two steps:
//! 1. Before any history: [`prompt_difference`] compares what H0 and the sibling render before
//!    the first policy turn, component by component: an agent program on either side (its
//!    prompts are its own), the system prompt for the task (template, slots, prompt rules,
//!    skills), the user prompt, the tool view, the memory policy and the context policy. Any
//!    difference is an intervention at turn 0, token 0: every policy token was generated in a
//!    context H0 would not show. (A context-policy difference only shows once old observations
//!    are elided; counting it from token 0 errs toward scoring more, i.e. toward the paper.)
//!    Limits are not compared: they end episodes but are not rendered.
//! 2. Otherwise the contexts agree until the first message that H0 would not have sent: the first
//!    message with a `hook` marker (source [`Source::Harness`]) whose hook H0 does not have with
//!    the same spec. Hook messages are the only way a harness that renders the same prompt can
//!    add to the context; harness messages without a hook marker (a parse-failure notice, an
//!    unknown-tool refusal) are what H0 sends in the same situation. The intervention turn is the
//!    first policy turn whose context holds that message (the first turn recorded after it).
//!
//! A trajectory without either difference never left H0's context: [`first_intervention`]
//! returns `None` and the masked objective scores none of its tokens (its reward still enters
//! its group's advantage, Eq. 6).

use serde::{Deserialize, Serialize};

use crate::chat::{ChatMessage, Role};
use crate::env::ToolSpec;
use crate::error::{Error, Result};
use crate::harness::{ContextPolicy, Harness};
use crate::policy::{PolicyRequest, SamplingParams};
use crate::task::Task;
use crate::trajectory::{Source, Trajectory, TrajectoryMessage};

/// How the policy tokens of a trajectory retained from a sibling rescue enter the loss.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RescueObjective {
    /// The paper (Eqs. 13-16): every policy token in its own generating context.
    #[default]
    Generating,
    /// Re-scored under H0's context with the Guide-shaped ratio `r / (r + gamma)`.
    H0,
    /// Only the turns from the sibling's first intervention on ([`first_intervention`]).
    Masked,
}

impl RescueObjective {
    /// Every objective, the paper's first.
    pub const ALL: [RescueObjective; 3] = [
        RescueObjective::Generating,
        RescueObjective::H0,
        RescueObjective::Masked,
    ];

    /// The name in configs and `metrics.jsonl`.
    pub fn label(self) -> &'static str {
        match self {
            RescueObjective::Generating => "generating",
            RescueObjective::H0 => "h0",
            RescueObjective::Masked => "masked",
        }
    }

    /// Whether this is the paper's objective.
    pub fn is_paper(self) -> bool {
        self == RescueObjective::Generating
    }
}

impl std::fmt::Display for RescueObjective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// How a learner scores one trajectory's policy tokens (one per retained trajectory).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TokenScoring {
    /// Every generated token in its generating context with the paper's clipped ratio and the
    /// weight of Eq. 16.
    Generating,
    /// As `Generating`, but only the tokens of turns `first_turn..` are scored; the earlier
    /// turns stay in the context. `first_turn >= turns.len()` scores nothing.
    FromTurn {
        /// The first scored turn.
        first_turn: usize,
    },
    /// Re-scored under H0: `contexts[k]` is the context H0 would have rendered before turn `k`
    /// (empty for a turn without generated tokens). The ratio's denominator is the recorded
    /// rollout log-prob `q` of the turn in its generating context.
    H0 {
        /// H0's prompt tokens per turn.
        contexts: Vec<Vec<u32>>,
    },
}

impl TokenScoring {
    /// Whether the learner needs more than the paper's objective for this trajectory.
    pub fn is_paper(&self) -> bool {
        matches!(self, TokenScoring::Generating)
    }
}

/// Where a sibling's trajectory first leaves the context H0 would have shown (module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Intervention {
    /// The sibling renders something else than H0 before any history: turn 0, token 0.
    Prompt {
        /// The first differing component (`program`, `prompt.system`, `prompt.user`,
        /// `tool_view`, `memory`, `context`).
        component: String,
    },
    /// The first message H0 would not have sent (a hook's).
    Message {
        /// Its index in [`Trajectory::messages`].
        message: usize,
        /// The hook that sent it.
        hook: String,
    },
}

impl Intervention {
    /// The first policy turn whose context contains the intervention: 0 for a prompt
    /// difference, else the first turn recorded after the message (`turns.len()` when the
    /// episode ended before another turn).
    pub fn first_turn(&self, trajectory: &Trajectory) -> usize {
        match self {
            Intervention::Prompt { .. } => 0,
            Intervention::Message { message, .. } => trajectory
                .turns
                .iter()
                .position(|t| t.message_index.is_some_and(|m| m > *message))
                .unwrap_or(trajectory.turns.len()),
        }
    }

    /// Policy tokens generated before the intervention (the tokens the masked objective drops).
    pub fn tokens_before(&self, trajectory: &Trajectory) -> usize {
        let first = self.first_turn(trajectory);
        trajectory.turns[..first.min(trajectory.turns.len())]
            .iter()
            .map(|t| t.tokens.len())
            .sum()
    }
}

/// The first component in which `sibling` renders another context than `h0` before any history
/// for `task` (step 1 of the module docs), or `None` when they render the same.
pub fn prompt_difference(h0: &Harness, sibling: &Harness, task: &Task) -> Result<Option<String>> {
    if h0.is_external() || sibling.is_external() {
        return Ok(Some("program".into()));
    }
    let component = if h0.system_prompt(task)? != sibling.system_prompt(task)? {
        Some("prompt.system")
    } else if h0.user_prompt(task)? != sibling.user_prompt(task)? {
        Some("prompt.user")
    } else if h0.tool_view != sibling.tool_view {
        Some("tool_view")
    } else if h0.memory != sibling.memory {
        Some("memory")
    } else if h0.context != sibling.context {
        Some("context")
    } else {
        None
    };
    Ok(component.map(str::to_string))
}

/// Whether `message` is one H0 would not have sent: a hook's message whose hook H0 lacks (or
/// has with another spec).
fn is_sibling_hook_message(h0: &Harness, sibling: &Harness, message: &TrajectoryMessage) -> bool {
    let Some(hook) = &message.hook else {
        return false;
    };
    match (h0.hooks.get(hook), sibling.hooks.get(hook)) {
        (Some(a), Some(b)) => a != b,
        // A hook marker H0 has but the sibling does not (an agent program's own marker that
        // happens to share H0's name) is not H0's either.
        _ => true,
    }
}

/// The sibling's first intervention in `trajectory` (module docs), `None` when the trajectory
/// never left H0's context. `sibling` is the trajectory's generating harness.
pub fn first_intervention(
    trajectory: &Trajectory,
    h0: &Harness,
    sibling: &Harness,
    task: &Task,
) -> Result<Option<Intervention>> {
    if let Some(component) = prompt_difference(h0, sibling, task)? {
        return Ok(Some(Intervention::Prompt { component }));
    }
    Ok(trajectory
        .messages
        .iter()
        .enumerate()
        .find(|(_, m)| m.source == Source::Harness && is_sibling_hook_message(h0, sibling, m))
        .map(|(i, m)| Intervention::Message {
            message: i,
            hook: m.hook.clone().unwrap_or_default(),
        }))
}

/// Why `sibling`'s trajectories cannot be re-rendered under `h0` for the `h0` objective, or
/// `None` when they can: an agent program (its prompts and message record are its own), a
/// different tool view (the policy saw other tools, documentation, or observations cut
/// otherwise, which H0's rendering cannot restore), or a different memory policy (note-tool
/// replies and note messages change the observations).
pub fn h0_rerender_refusal(h0: &Harness, sibling: &Harness) -> Option<String> {
    if sibling.is_external() || h0.is_external() {
        return Some(format!(
            "`{}` is an agent program: its prompts are its own, so its turns cannot be re-rendered under `{}`",
            sibling.name, h0.name
        ));
    }
    if sibling.tool_view != h0.tool_view {
        return Some(format!(
            "`{}` changes the tool view (`tool_view` differs from `{}`'s): the policy saw other tools or observations than H0 would show",
            sibling.name, h0.name
        ));
    }
    if sibling.memory != h0.memory {
        return Some(format!(
            "`{}` changes the memory policy (`memory` differs from `{}`'s): its note messages and note-tool replies change what the policy observed",
            sibling.name, h0.name
        ));
    }
    None
}

/// The messages as a harness with context policy `context` shows them: observations before the
/// last `keep_last_observations` are replaced by the elision text (what the agent loop renders).
pub fn render_history(messages: &[TrajectoryMessage], context: &ContextPolicy) -> Vec<ChatMessage> {
    let observation_indices: Vec<usize> = messages
        .iter()
        .enumerate()
        .filter(|(_, m)| m.role == Role::Tool && m.source == Source::Environment)
        .map(|(i, _)| i)
        .collect();
    let first_kept = match context.keep_last_observations.map(|k| k as usize) {
        Some(k) if observation_indices.len() > k => {
            observation_indices[observation_indices.len() - k]
        }
        _ => 0,
    };
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let elide = m.role == Role::Tool && m.source == Source::Environment && i < first_kept;
            ChatMessage {
                role: m.role,
                content: if elide {
                    context.elision_text.clone()
                } else {
                    m.content.clone()
                },
                name: m.name.clone(),
            }
        })
        .collect()
}

/// The request H0 would have made before turn `turn` of `trajectory` (a rescue rollout of
/// `sibling`): H0's system and user prompt for `task`, the recorded history up to the turn with
/// the sibling's hook messages dropped and every tool observation kept, rendered with H0's
/// context policy; the tools H0 shows of `env_tools`. `None` for a turn without generated tokens.
/// Errors name the trajectory when the sibling cannot be re-rendered
/// ([`h0_rerender_refusal`]) or the record does not start with the system and task messages.
pub fn h0_request(
    trajectory: &Trajectory,
    turn: usize,
    h0: &Harness,
    sibling: &Harness,
    task: &Task,
    env_tools: &[ToolSpec],
) -> Result<Option<PolicyRequest>> {
    let where_ = |what: String| {
        Error::invalid(
            "rescue_objective",
            format!(
                "h0: trajectory of task `{}` under `{}` (seed {}): {what}",
                trajectory.task_id, trajectory.harness_name, trajectory.seed
            ),
        )
    };
    if let Some(why) = h0_rerender_refusal(h0, sibling) {
        return Err(where_(why));
    }
    let record = trajectory
        .turns
        .get(turn)
        .ok_or_else(|| where_(format!("has no turn {turn}")))?;
    let Some(end) = record.message_index.filter(|_| !record.tokens.is_empty()) else {
        return Ok(None);
    };
    let history = &trajectory.messages[..end.min(trajectory.messages.len())];
    let starts_as_loop = history.len() >= 2
        && history[0].role == Role::System
        && history[0].source == Source::Harness
        && history[1].source == Source::Task;
    if !starts_as_loop {
        return Err(where_(
            "expected the record to start with the harness's system message and the task's message"
                .into(),
        ));
    }
    let mut kept: Vec<TrajectoryMessage> = Vec::with_capacity(history.len());
    for (i, m) in history.iter().enumerate() {
        if m.source == Source::Harness && is_sibling_hook_message(h0, sibling, m) {
            continue;
        }
        let mut m = m.clone();
        if i == 0 {
            m.content = h0.system_prompt(task)?;
        } else if i == 1 {
            m.content = h0.user_prompt(task)?;
        }
        kept.push(m);
    }
    Ok(Some(PolicyRequest {
        messages: render_history(&kept, &h0.context),
        tools: h0.visible_tools(env_tools),
        max_new_tokens: h0.limits.max_output_tokens as usize,
        max_context_tokens: h0.limits.max_context_tokens as usize,
        sampling: SamplingParams::default(),
        seed: 0,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::env::Outcome;
    use crate::harness::{HookAction, HookEvent, HookSpec};
    use crate::policy::FinishReason;
    use crate::task::Split;
    use crate::trajectory::{PolicyTurnRecord, Termination};

    fn task() -> Task {
        Task::new("t1", "db", Split::Train, "Count the rows.", 0)
    }

    fn hook(message: &str) -> HookSpec {
        HookSpec {
            action: HookAction::Warn,
            condition: "always".into(),
            event: HookEvent::AfterTool,
            message: message.into(),
            parameters: Default::default(),
        }
    }

    fn msg(role: Role, source: Source, content: &str, hook: Option<&str>) -> TrajectoryMessage {
        TrajectoryMessage {
            role,
            source,
            content: content.into(),
            name: (role == Role::Tool).then(|| "sql".to_string()),
            hook: hook.map(str::to_string),
        }
    }

    fn turn(message_index: usize, tokens: Vec<u32>) -> PolicyTurnRecord {
        let n = tokens.len();
        PolicyTurnRecord {
            message_index: Some(message_index),
            context_tokens: vec![1, 2],
            tokens,
            logprobs: vec![-1.0; n],
            finish: FinishReason::Stop,
            sampling: None,
        }
    }

    /// system, task, policy (turn 0), observation, hook `check`, policy (turn 1), observation,
    /// policy (turn 2): the sibling's hook fires after the first action.
    fn rescued(harness: &Harness) -> Trajectory {
        let t = task();
        Trajectory {
            task_id: t.id.clone(),
            env: "db".into(),
            harness_id: harness.id(),
            harness_name: harness.name.clone(),
            seed: 7,
            policy: "p".into(),
            messages: vec![
                msg(
                    Role::System,
                    Source::Harness,
                    &harness.system_prompt(&t).unwrap(),
                    None,
                ),
                msg(
                    Role::User,
                    Source::Task,
                    &harness.user_prompt(&t).unwrap(),
                    None,
                ),
                msg(Role::Assistant, Source::Policy, "SELECT 1", None),
                msg(Role::Tool, Source::Environment, "1 row", None),
                msg(
                    Role::User,
                    Source::Harness,
                    "Check before you commit.",
                    Some("check"),
                ),
                msg(Role::Assistant, Source::Policy, "SELECT 2", None),
                msg(Role::Tool, Source::Environment, "2 rows", None),
                msg(Role::Assistant, Source::Policy, "commit", None),
            ],
            turns: vec![
                turn(2, vec![5, 6, 7]),
                turn(5, vec![8, 9]),
                turn(7, vec![10]),
            ],
            final_answer: None,
            outcome: Outcome {
                reward: 1.0,
                details: serde_json::Value::Null,
            },
            termination: Termination::EnvDone,
            counts: Default::default(),
            policy_version: None,
        }
    }

    fn h0() -> Harness {
        Harness::new("H0", "You query a database.")
    }

    fn hook_sibling() -> Harness {
        let mut s = h0();
        s.name = "S-check".into();
        s.hooks
            .insert("check".into(), hook("Check before you commit."));
        s
    }

    #[test]
    fn a_hook_sibling_intervenes_at_its_first_hook_message() {
        let (h0, s) = (h0(), hook_sibling());
        let tr = rescued(&s);
        let i = first_intervention(&tr, &h0, &s, &task()).unwrap().unwrap();
        assert_eq!(
            i,
            Intervention::Message {
                message: 4,
                hook: "check".into()
            }
        );
        // Turn 0 (message 2) came before the hook; turn 1 (message 5) is the first to see it.
        assert_eq!(i.first_turn(&tr), 1);
        assert_eq!(i.tokens_before(&tr), 3);
    }

    #[test]
    fn a_prompt_sibling_intervenes_at_token_zero_and_h0s_own_hooks_do_not_count() {
        let task = task();
        let mut h0 = h0();
        let mut rule = hook_sibling();
        rule.prompt
            .system
            .push_str(" Always check before you commit.");
        let tr = rescued(&rule);
        let i = first_intervention(&tr, &h0, &rule, &task).unwrap().unwrap();
        assert_eq!(
            i,
            Intervention::Prompt {
                component: "prompt.system".into()
            }
        );
        assert_eq!((i.first_turn(&tr), i.tokens_before(&tr)), (0, 0));
        // A sibling with H0's prompt and H0's very hook never leaves H0's context...
        h0.hooks
            .insert("check".into(), hook("Check before you commit."));
        let same = hook_sibling();
        assert_eq!(first_intervention(&tr, &h0, &same, &task).unwrap(), None);
        // ...but the same hook name with another message is the sibling's.
        h0.hooks.insert("check".into(), hook("Something else."));
        assert!(
            first_intervention(&tr, &h0, &same, &task)
                .unwrap()
                .is_some()
        );
        // A tool-view edit differs before any history.
        let mut view = h0.clone();
        view.tool_view.hide.push("sql".into());
        assert_eq!(
            prompt_difference(&h0, &view, &task).unwrap().as_deref(),
            Some("tool_view")
        );
    }

    #[test]
    fn the_h0_request_drops_the_hook_and_keeps_the_observations() {
        let (h0, s) = (h0(), hook_sibling());
        let mut tr = rescued(&s);
        // The sibling's own system prompt in the record is replaced by H0's.
        tr.messages[0].content = "Sibling's system prompt.".into();
        let tools = vec![ToolSpec {
            name: "sql".into(),
            description: "Run SQL.".into(),
            parameters: serde_json::json!({"type": "object"}),
            kind: Default::default(),
        }];
        let req = h0_request(&tr, 2, &h0, &s, &task(), &tools)
            .unwrap()
            .unwrap();
        let texts: Vec<&str> = req.messages.iter().map(|m| m.content.as_str()).collect();
        assert_eq!(
            texts,
            vec![
                h0.system_prompt(&task()).unwrap().as_str(),
                h0.user_prompt(&task()).unwrap().as_str(),
                "SELECT 1",
                "1 row",
                "SELECT 2",
                "2 rows"
            ]
        );
        assert_eq!(req.tools, tools);
        // Turn 0 saw no hook: its H0 request is its own history with H0's prompts.
        let first = h0_request(&tr, 0, &h0, &s, &task(), &tools)
            .unwrap()
            .unwrap();
        assert_eq!(first.messages.len(), 2);
        // Control: with the hook kept (the sibling as its own H0), the hook text is there.
        let own = h0_request(&tr, 2, &s, &s, &task(), &tools)
            .unwrap()
            .unwrap();
        assert!(
            own.messages
                .iter()
                .any(|m| m.content == "Check before you commit.")
        );
    }

    #[test]
    fn a_tool_view_sibling_cannot_be_rerendered_under_h0() {
        let h0 = h0();
        let mut view = hook_sibling();
        view.tool_view.max_observation_chars = Some(10);
        let tr = rescued(&view);
        let err = h0_request(&tr, 1, &h0, &view, &task(), &[])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("rescue_objective")
                && err.contains("tool_view")
                && err.contains("S-check"),
            "{err}"
        );
        // Control: the same sibling without the tool-view edit re-renders.
        assert!(h0_request(&tr, 1, &h0, &hook_sibling(), &task(), &[]).is_ok());
        let mut memory = hook_sibling();
        memory.memory.enabled = true;
        assert!(
            h0_rerender_refusal(&h0, &memory)
                .unwrap()
                .contains("memory")
        );
    }

    #[test]
    fn objectives_are_named_as_in_configs() {
        for o in RescueObjective::ALL {
            let json = serde_json::to_string(&o).unwrap();
            assert_eq!(json, format!("\"{}\"", o.label()));
            assert_eq!(serde_json::from_str::<RescueObjective>(&json).unwrap(), o);
        }
        assert_eq!(RescueObjective::default(), RescueObjective::Generating);
        let err = serde_json::from_str::<RescueObjective>("\"hinted\"").unwrap_err();
        assert!(err.to_string().contains("generating"), "{err}");
    }
}
