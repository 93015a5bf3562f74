//! Reading a trajectory as a list of steps (a call and the observation it got), for the
//! rule-based analyst and for the briefs shown to LLM roles.

use harness_core::{
    ActionParser, ParsedAction, Role, Source, ToolCall, ToolCallParser, Trajectory,
};
use regex::Regex;
use std::sync::OnceLock;

/// One tool call of an episode and what came back.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// Index of the policy message that made the call.
    pub message: usize,
    /// The call.
    pub call: ToolCall,
    /// The observation's text (`None` when no tool message answered it).
    pub observation: Option<String>,
    /// Whether the observation reads as a failure.
    pub error: bool,
}

/// A policy turn that made no tool call (a text answer, or an unreadable action).
#[derive(Debug, Clone, PartialEq)]
pub struct TextTurn {
    /// Index of the policy message.
    pub message: usize,
    /// Whether the turn held a malformed `<tool_call>` block rather than plain text.
    pub malformed: bool,
}

/// The names of submit tools of the built-in environments and the test kit.
pub const SUBMIT_TOOLS: &[&str] = &["complete_task", "commit_final_answer", "submit"];

fn error_regex() -> &'static Regex {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| {
        Regex::new(r"(?i)^\s*error\b|\b(fails?|failed|invalid|unknown|missing|not found|no such|doesn't exist|does not exist|must be|cannot|there is no)\b")
            .unwrap_or_else(|e| unreachable!("a fixed pattern: {e}"))
    })
}

/// Whether an observation reads as a failed call. Trajectories keep the text, not the
/// environment's error flag, so this looks for the words tools use when they refuse a call;
/// only the first 200 characters count, so listings that mention such words further down do
/// not read as errors.
pub fn looks_like_error(text: &str) -> bool {
    let head: String = text.chars().take(200).collect();
    error_regex().is_match(&head)
}

/// Every call of the episode in order, with its observation, and the turns without a call.
pub fn steps(trajectory: &Trajectory) -> (Vec<Step>, Vec<TextTurn>) {
    let mut steps = Vec::new();
    let mut text_turns = Vec::new();
    let messages = &trajectory.messages;
    for (i, message) in messages.iter().enumerate() {
        if message.source != Source::Policy {
            continue;
        }
        let calls = match ToolCallParser.parse(&message.content, &[]) {
            ParsedAction::Calls(calls) => calls,
            ParsedAction::Final(_) => {
                text_turns.push(TextTurn {
                    message: i,
                    malformed: false,
                });
                continue;
            }
            ParsedAction::Invalid(_) => {
                text_turns.push(TextTurn {
                    message: i,
                    malformed: true,
                });
                continue;
            }
        };
        // The tool messages after this turn, up to the next policy turn, answer its calls in
        // order (hook and memory messages in between are skipped).
        let mut answers = messages[i + 1..]
            .iter()
            .take_while(|m| m.source != Source::Policy)
            .filter(|m| m.role == Role::Tool);
        for call in calls {
            let observation = answers.next().map(|m| m.content.clone());
            let error = observation.as_deref().is_some_and(looks_like_error);
            steps.push(Step {
                message: i,
                call,
                observation,
                error,
            });
        }
    }
    (steps, text_turns)
}

/// Whether any step called a submit tool.
pub fn submitted(steps: &[Step]) -> bool {
    steps
        .iter()
        .any(|s| SUBMIT_TOOLS.contains(&s.call.name.as_str()))
}

/// A short readable digest of a trajectory for LLM prompts: the instruction, each call and
/// the start of its observation, how it ended and the verifier's details.
pub fn digest(trajectory: &Trajectory, max_chars: usize) -> String {
    let (steps, _) = steps(trajectory);
    let mut out = format!(
        "task {} (reward {}, ended by {:?})\n",
        trajectory.task_id, trajectory.outcome.reward, trajectory.termination
    );
    if let Some(instruction) = trajectory
        .messages
        .iter()
        .find(|m| m.source == Source::Task)
    {
        out.push_str(&format!(
            "instruction: {}\n",
            cut(&instruction.content, 300)
        ));
    }
    for (n, step) in steps.iter().enumerate() {
        out.push_str(&format!(
            "step {n}: {} -> {}{}\n",
            cut(&step.call.canonical(), 200),
            if step.error { "[error] " } else { "" },
            cut(
                step.observation.as_deref().unwrap_or("(no observation)"),
                160
            )
        ));
    }
    out.push_str(&format!(
        "verifier: {}\n",
        cut(&trajectory.outcome.details.to_string(), 600)
    ));
    cut(&out, max_chars)
}

fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        text.to_string()
    } else {
        let kept: String = text.chars().take(max).collect();
        format!("{kept}...")
    }
}
