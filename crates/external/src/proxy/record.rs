//! What the proxy records per episode, the prefix check, and the trajectory assembled from it.
//!
//! Every turn is recorded from the policy's own [`PolicyTurn`]: its prompt token ids, sampled
//! token ids and log-probs, with the sampling settings the turn was drawn under. Nothing is
//! re-tokenised: the trajectory's turns are those records.
//!
//! **The prefix check.** A turn *extends* the previous one when its prompt tokens begin with
//! the previous turn's prompt followed by the tokens it sampled: the program sent back the
//! history the policy produced, and the chat template rendered it as the policy saw it. A turn
//! that does not (the program edited, summarised or dropped history, or the template re-renders
//! earlier turns differently, e.g. without their reasoning) is a *prefix break*. Each turn is
//! trained in its own generating context either way (the trainer packs only turns that extend);
//! with [`PrefixPolicy::MaskEpisode`] an episode with a break keeps its reward (it still counts
//! in its group's advantage) but none of its tokens is scored.
//!
//! **Sources.** Each new message of a request is recorded with the source it is inferred to
//! have: system messages the harness's, tool messages the environment's, the first user
//! message the task's, later user messages the harness's, assistant messages the policy's when
//! the policy generated that text (else the harness's). A program marks a message it adds on
//! its own account (a hook's warning, a nudge) by sending it as a `user` or `system` message
//! whose OpenAI `name` is `hook:<name>` ([`HOOK_NAME_PREFIX`]): it is recorded as the harness's
//! with `hook = <name>`, as the built-in loop records its hook messages, so diagnostics and the
//! `masked` and `h0` rescue objectives find it. The name is not shown to the policy (chat
//! templates and the wire form of user messages leave it out).

use std::collections::{HashMap, HashSet};

use harness_core::{
    ChatMessage, Counts, FinishReason, HarnessId, Limits, Outcome, PolicyTurn, PolicyTurnRecord,
    Role, Source, Termination, ToolCall, Trajectory, TrajectoryMessage, TurnSampling,
};
use harness_openai::protocol::{MessageContent, WireMessage};
use serde::{Deserialize, Serialize};

/// The `name` prefix with which a program marks a message as a hook's (see the module docs).
pub const HOOK_NAME_PREFIX: &str = "hook:";

/// The hook a program marked `message` with: the rest of a `user` or `system` message's name
/// after [`HOOK_NAME_PREFIX`], when not empty.
fn hook_marker(message: &ChatMessage) -> Option<&str> {
    match message.role {
        Role::User | Role::System => message
            .name
            .as_deref()
            .and_then(|n| n.strip_prefix(HOOK_NAME_PREFIX))
            .filter(|n| !n.trim().is_empty()),
        _ => None,
    }
}

/// What to do with an episode whose turns break the prefix check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PrefixPolicy {
    /// Train each turn in its own recorded context (the default).
    #[default]
    OwnContext,
    /// Keep the episode's reward but score none of its tokens.
    MaskEpisode,
}

/// One episode the proxy records: the key's task, seed and limits.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeSpec {
    /// The task the program works on (for the record).
    pub task_id: String,
    /// The episode seed: the `k`-th call of the episode samples with
    /// [`harness_core::call_seed`]`(seed, k)`, whatever seed the program sends.
    pub seed: u64,
    /// Model calls, context and output tokens per call (`max_env_actions` is the environment
    /// server's business).
    pub limits: Limits,
    /// Sampling settings every call of this episode uses, whatever the request says (a
    /// runner pins the run's settings here); before [`super::ProxyConfig::sampling`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<harness_core::SamplingParams>,
}

/// Everything recorded for one episode, handed back when the episode is closed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeRecord {
    /// The episode.
    pub spec: EpisodeSpec,
    /// The conversation as the proxy saw it, with each message's source.
    pub messages: Vec<TrajectoryMessage>,
    /// Every policy call, in the order the calls finished.
    pub turns: Vec<PolicyTurnRecord>,
    /// For each turn, whether its prompt extends the previous turn's context + completion.
    pub extends_previous: Vec<bool>,
    /// Turns that broke the prefix check.
    pub prefix_breaks: u32,
    /// Calls refused (over the model-call limit, or malformed).
    pub refused_calls: u32,
    /// The policy the proxy applied.
    pub prefix_policy: PrefixPolicy,
}

/// How an episode ended, from the runner's side: the verifier's outcome and the environment's
/// counts, which the proxy cannot see.
#[derive(Debug, Clone, PartialEq)]
pub struct EpisodeEnd {
    /// The environment's name.
    pub env: String,
    /// The harness (pool member) that ran the episode.
    pub harness_id: HarnessId,
    /// Its human name.
    pub harness_name: String,
    /// The policy's name.
    pub policy: String,
    /// The verifier's judgement.
    pub outcome: Outcome,
    /// Why the episode ended.
    pub termination: Termination,
    /// The program's closing text, when it gave one.
    pub final_answer: Option<String>,
    /// Tool calls the environment served.
    pub env_actions: u32,
    /// Of those, the ones answered with an error observation.
    pub tool_errors: u32,
}

impl EpisodeRecord {
    /// Whether the episode is kept out of the loss ([`PrefixPolicy::MaskEpisode`] and a break).
    pub fn masked(&self) -> bool {
        self.prefix_policy == PrefixPolicy::MaskEpisode && self.prefix_breaks > 0
    }

    /// The trajectory of the episode: the recorded turns (with their tokens emptied when the
    /// episode is [masked](Self::masked), so that the trainer scores none of them), the
    /// recorded messages, and `end`'s outcome and counts.
    pub fn into_trajectory(self, end: EpisodeEnd) -> Trajectory {
        let masked = self.masked();
        let policy_tokens = self.turns.iter().map(|t| t.tokens.len() as u32).sum();
        let hook_messages = self.messages.iter().filter(|m| m.hook.is_some()).count() as u32;
        let mut turns = self.turns;
        if masked {
            for turn in &mut turns {
                turn.tokens.clear();
                turn.logprobs.clear();
            }
        }
        Trajectory {
            task_id: self.spec.task_id,
            env: end.env,
            harness_id: end.harness_id,
            harness_name: end.harness_name,
            seed: self.spec.seed,
            policy: end.policy,
            messages: self.messages,
            policy_version: None,
            counts: Counts {
                model_calls: turns.len() as u32,
                env_actions: end.env_actions,
                tool_errors: end.tool_errors,
                refused_actions: self.refused_calls,
                policy_tokens,
                prefix_breaks: self.prefix_breaks,
                hook_messages,
                ..Counts::default()
            },
            turns,
            final_answer: end.final_answer,
            outcome: end.outcome,
            termination: end.termination,
        }
    }
}

/// The key under which a reply is remembered: its content (trimmed) and its tool calls
/// (canonical JSON), so that a program that sends a reply back with other whitespace or
/// another JSON layout of the arguments gets the policy's own text back.
pub(crate) fn reply_key(content: &str, calls: &[ToolCall]) -> String {
    let mut key = content.trim().to_string();
    for call in calls {
        key.push('\u{1f}');
        key.push_str(&call.canonical());
    }
    key
}

fn wire_key(message: &WireMessage) -> String {
    let content = message
        .content
        .as_ref()
        .map(MessageContent::text)
        .unwrap_or_default();
    let calls: Vec<ToolCall> = message.tool_calls.iter().map(|c| c.to_call()).collect();
    reply_key(&content, &calls)
}

/// The running record of one episode.
#[derive(Debug)]
pub(crate) struct EpisodeLog {
    spec: EpisodeSpec,
    policy: PrefixPolicy,
    messages: Vec<TrajectoryMessage>,
    turns: Vec<PolicyTurnRecord>,
    extends: Vec<bool>,
    /// The last recorded request followed by its reply: what the next request should begin with.
    conversation: Vec<ChatMessage>,
    /// Replies sent, by [`reply_key`], with the text the policy generated.
    replies: HashMap<String, String>,
    generated: HashSet<String>,
    prefix_breaks: u32,
    refused_calls: u32,
    calls_started: u32,
    seen_task: bool,
}

impl EpisodeLog {
    pub(crate) fn new(spec: EpisodeSpec, policy: PrefixPolicy) -> Self {
        EpisodeLog {
            spec,
            policy,
            messages: Vec::new(),
            turns: Vec::new(),
            extends: Vec::new(),
            conversation: Vec::new(),
            replies: HashMap::new(),
            generated: HashSet::new(),
            prefix_breaks: 0,
            refused_calls: 0,
            calls_started: 0,
            seen_task: false,
        }
    }

    pub(crate) fn spec(&self) -> &EpisodeSpec {
        &self.spec
    }

    /// Give assistant messages that carry a reply the proxy sent the policy's own text.
    pub(crate) fn restore(&self, wire: &[WireMessage], messages: &mut [ChatMessage]) {
        for (w, m) in wire.iter().zip(messages.iter_mut()) {
            // The hook marker rides on the message's name (dropped by the wire conversion for
            // user and system messages); the policy's templates do not render it.
            if matches!(m.role, Role::User | Role::System)
                && let Some(name) = w.name.as_ref().filter(|n| n.starts_with(HOOK_NAME_PREFIX))
            {
                m.name = Some(name.clone());
            }
            if m.role == Role::Assistant
                && let Some(raw) = self.replies.get(&wire_key(w))
            {
                m.content = raw.clone();
            }
        }
    }

    /// Admit one more model call: its index, or `None` when the episode's limit is reached.
    pub(crate) fn begin_call(&mut self) -> Option<u32> {
        if self.calls_started >= self.spec.limits.max_model_calls {
            self.refused_calls += 1;
            return None;
        }
        self.calls_started += 1;
        Some(self.calls_started - 1)
    }

    /// Count a call refused for another reason (a malformed request).
    pub(crate) fn refuse(&mut self) {
        self.refused_calls += 1;
    }

    /// Record a turn generated for `messages`; `reply_key` is the key of the reply sent back
    /// (`None` when nothing was generated). Returns whether the turn extends the previous one.
    pub(crate) fn record(
        &mut self,
        messages: &[ChatMessage],
        turn: &PolicyTurn,
        sampling: TurnSampling,
        reply_key: Option<String>,
    ) -> bool {
        let common = messages
            .iter()
            .zip(&self.conversation)
            .take_while(|(a, b)| a == b)
            .count();
        if common < self.conversation.len() {
            self.messages.push(TrajectoryMessage {
                role: Role::System,
                source: Source::Harness,
                content: format!(
                    "[the program rewrote the conversation: from message {common} on, this request differs from what the policy saw]"
                ),
                name: None,
                hook: None,
            });
        }
        for m in &messages[common..] {
            if let Some(hook) = hook_marker(m) {
                self.messages.push(TrajectoryMessage {
                    role: m.role,
                    source: Source::Harness,
                    content: m.content.clone(),
                    name: None,
                    hook: Some(hook.to_string()),
                });
                continue;
            }
            let source = match m.role {
                Role::System => Source::Harness,
                Role::Tool => Source::Environment,
                Role::User if !self.seen_task => {
                    self.seen_task = true;
                    Source::Task
                }
                Role::User => Source::Harness,
                Role::Assistant if self.generated.contains(&m.content) => Source::Policy,
                // Text the program wrote in the assistant's place: never a training target.
                Role::Assistant => Source::Harness,
            };
            self.messages.push(TrajectoryMessage {
                role: m.role,
                source,
                content: m.content.clone(),
                name: m.name.clone(),
                hook: None,
            });
        }
        let extends = match self.turns.last() {
            None => true,
            Some(prev) => {
                let n = prev.context_tokens.len();
                turn.context_tokens.len() >= n + prev.tokens.len()
                    && turn.context_tokens[..n] == prev.context_tokens[..]
                    && turn.context_tokens[n..n + prev.tokens.len()] == prev.tokens[..]
            }
        };
        if !extends {
            self.prefix_breaks += 1;
        }
        self.conversation = messages.to_vec();
        let message_index = if turn.finish == FinishReason::ContextOverflow {
            None
        } else {
            self.messages.push(TrajectoryMessage {
                role: Role::Assistant,
                source: Source::Policy,
                content: turn.text.clone(),
                name: None,
                hook: None,
            });
            self.conversation
                .push(ChatMessage::assistant(turn.text.clone()));
            self.generated.insert(turn.text.clone());
            if let Some(key) = reply_key {
                self.replies.insert(key, turn.text.clone());
            }
            Some(self.messages.len() - 1)
        };
        self.turns.push(PolicyTurnRecord {
            message_index,
            context_tokens: turn.context_tokens.clone(),
            tokens: turn.tokens.clone(),
            logprobs: turn.logprobs.clone(),
            finish: turn.finish,
            sampling: Some(sampling),
        });
        self.extends.push(extends);
        extends
    }

    pub(crate) fn finish(self) -> EpisodeRecord {
        EpisodeRecord {
            spec: self.spec,
            messages: self.messages,
            turns: self.turns,
            extends_previous: self.extends,
            prefix_breaks: self.prefix_breaks,
            refused_calls: self.refused_calls,
            prefix_policy: self.policy,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(context: &[u32], tokens: &[u32], text: &str) -> PolicyTurn {
        PolicyTurn {
            text: text.into(),
            context_tokens: context.to_vec(),
            tokens: tokens.to_vec(),
            logprobs: vec![-0.5; tokens.len()],
            finish: FinishReason::Stop,
        }
    }

    fn spec() -> EpisodeSpec {
        EpisodeSpec {
            task_id: "t".into(),
            seed: 1,
            limits: Limits {
                max_model_calls: 2,
                ..Limits::default()
            },
            sampling: None,
        }
    }

    fn sampling() -> TurnSampling {
        TurnSampling::from(&harness_core::SamplingParams::default())
    }

    #[test]
    fn a_program_marks_its_hook_messages_by_name() {
        let wire = |role: &str, content: &str, name: Option<&str>| WireMessage {
            name: name.map(str::to_string),
            ..WireMessage::text(role, content)
        };
        let mut log = EpisodeLog::new(spec(), PrefixPolicy::OwnContext);
        let first = [wire("system", "s", None), wire("user", "q", None)];
        let mut m1 = harness_openai::protocol::from_wire_messages(&first).unwrap();
        log.restore(&first, &mut m1);
        log.record(&m1, &turn(&[1, 2], &[3], "a"), sampling(), None);
        let second = [
            wire("system", "s", None),
            wire("user", "q", None),
            wire("assistant", "a", None),
            wire("user", "Check before you commit.", Some("hook:check")),
            // Control: the same text unmarked, and a name that is not a hook marker.
            wire("user", "Check before you commit.", None),
            wire("user", "hello", Some("alice")),
        ];
        let mut m2 = harness_openai::protocol::from_wire_messages(&second).unwrap();
        log.restore(&second, &mut m2);
        log.record(&m2, &turn(&[1, 2, 3, 4], &[5], "b"), sampling(), None);
        let record = log.finish();
        let hooks: Vec<(Source, Option<&str>)> = record
            .messages
            .iter()
            .map(|m| (m.source, m.hook.as_deref()))
            .collect();
        assert_eq!(
            hooks,
            vec![
                (Source::Harness, None),
                (Source::Task, None),
                (Source::Policy, None),
                (Source::Harness, Some("check")),
                (Source::Harness, None),
                (Source::Harness, None),
                (Source::Policy, None),
            ]
        );
        let end = EpisodeEnd {
            env: "e".into(),
            harness_id: HarnessId("h".into()),
            harness_name: "h".into(),
            policy: "p".into(),
            outcome: Outcome::success(serde_json::Value::Null),
            termination: Termination::EnvDone,
            final_answer: None,
            env_actions: 1,
            tool_errors: 0,
        };
        assert_eq!(record.into_trajectory(end).counts.hook_messages, 1);
    }

    #[test]
    fn the_prefix_check_compares_tokens_with_the_previous_context_and_completion() {
        let mut log = EpisodeLog::new(spec(), PrefixPolicy::MaskEpisode);
        let m1 = vec![ChatMessage::system("s"), ChatMessage::user("q")];
        assert!(log.record(&m1, &turn(&[1, 2], &[3, 4], "a"), sampling(), None));
        let mut m2 = m1.clone();
        m2.push(ChatMessage::assistant("a"));
        m2.push(ChatMessage::tool("x", "r"));
        assert!(log.record(&m2, &turn(&[1, 2, 3, 4, 5], &[6], "b"), sampling(), None));
        // Same length, one token differs inside the previous completion.
        assert!(!log.record(
            &m2,
            &turn(&[1, 2, 3, 9, 5, 6, 7], &[8], "c"),
            sampling(),
            None
        ));
        // Shorter than the previous context + completion.
        assert!(!log.record(&m2, &turn(&[1, 2], &[8], "d"), sampling(), None));
        let record = log.finish();
        assert_eq!(record.prefix_breaks, 2);
        assert_eq!(record.extends_previous, vec![true, true, false, false]);
        assert!(record.masked());
        // The rewritten conversation is marked in the transcript, sources are as documented.
        let sources: Vec<Source> = record.messages.iter().map(|m| m.source).collect();
        assert_eq!(
            &sources[..5],
            &[
                Source::Harness,
                Source::Task,
                Source::Policy,
                Source::Environment,
                Source::Policy
            ]
        );
        assert!(record.messages[5].content.contains("rewrote"));
        let end = EpisodeEnd {
            env: "e".into(),
            harness_id: HarnessId("h".into()),
            harness_name: "h".into(),
            policy: "p".into(),
            outcome: Outcome::success(serde_json::Value::Null),
            termination: Termination::EnvDone,
            final_answer: None,
            env_actions: 1,
            tool_errors: 0,
        };
        let trajectory = record.clone().into_trajectory(end.clone());
        assert!(trajectory.turns.iter().all(|t| t.tokens.is_empty()));
        assert_eq!(trajectory.counts.policy_tokens, 5);
        assert_eq!(trajectory.counts.prefix_breaks, 2);
        assert_eq!(trajectory.reward(), 1.0);
        let kept = EpisodeRecord {
            prefix_policy: PrefixPolicy::OwnContext,
            ..record
        }
        .into_trajectory(end);
        assert_eq!(kept.turns[1].tokens, vec![6]);
        assert_eq!(kept.turns[0].message_index, Some(2));
    }

    #[test]
    fn the_model_call_limit_is_counted() {
        let mut log = EpisodeLog::new(spec(), PrefixPolicy::OwnContext);
        assert_eq!(log.begin_call(), Some(0));
        assert_eq!(log.begin_call(), Some(1));
        assert_eq!(log.begin_call(), None);
        assert_eq!(log.finish().refused_calls, 1);
    }

    #[test]
    fn replies_come_back_with_the_policys_text() {
        let mut log = EpisodeLog::new(spec(), PrefixPolicy::OwnContext);
        let call = ToolCall::new("f", serde_json::json!({"a": 1, "b": "x"}));
        let raw = format!("Let me see.\n{}", call.to_tool_call_block());
        let m1 = vec![ChatMessage::user("q")];
        log.record(
            &m1,
            &turn(&[1], &[2], &raw),
            sampling(),
            Some(reply_key("Let me see.", std::slice::from_ref(&call))),
        );
        // The program sends the call back with other JSON spacing and key order.
        let wire = vec![WireMessage {
            role: "assistant".into(),
            content: Some(MessageContent::Text("Let me see. ".into())),
            name: None,
            tool_calls: vec![harness_openai::protocol::WireToolCall {
                id: "c".into(),
                kind: "function".into(),
                function: harness_openai::protocol::FunctionCall {
                    name: "f".into(),
                    arguments: "{\"b\": \"x\",  \"a\": 1}".into(),
                },
            }],
            tool_call_id: None,
        }];
        let mut messages = vec![ChatMessage::assistant("rendered by the program")];
        log.restore(&wire, &mut messages);
        assert_eq!(messages[0].content, raw);
        // Other content is the program's.
        let mut edited = wire.clone();
        edited[0].content = None;
        let mut messages = vec![ChatMessage::assistant("rendered by the program")];
        log.restore(&edited, &mut messages);
        assert_eq!(messages[0].content, "rendered by the program");
    }
}
