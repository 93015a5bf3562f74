//! The agent loop: one episode of a policy under a harness in an environment.

use std::collections::BTreeMap;
use std::sync::Arc;

use crate::action::{ActionParser, ParsedAction, TOOL_CALL_FORMAT, ToolCall, ToolCallParser};
use crate::chat::{ChatMessage, Role};
use crate::env::{Environment, Observation, ToolKind, ToolSpec};
use crate::error::{Error, Result};
use crate::harness::{CompiledHook, Harness, HookAction, HookEvent, HookState, NOTE_TOOL};
use crate::policy::{FinishReason, Policy, PolicyRequest, SamplingParams, TurnSampling};
use crate::task::Task;
use crate::trajectory::{
    Counts, PolicyTurnRecord, Source, Termination, Trajectory, TrajectoryMessage,
};

/// Settings of an episode that are not part of the harness.
#[derive(Debug, Clone, Default)]
pub struct EpisodeOptions {
    /// How the policy samples.
    pub sampling: SamplingParams,
}

/// Run one episode with default options (temperature 1 sampling).
pub async fn run_episode(
    policy: &dyn Policy,
    harness: &Harness,
    env: &dyn Environment,
    task: &Task,
    seed: u64,
) -> Result<Trajectory> {
    run_episode_with(policy, harness, env, task, seed, &EpisodeOptions::default()).await
}

/// The seed of the `call`-th policy call of an episode (a SplitMix64 step, so neighbouring
/// episode seeds give unrelated call seeds).
pub fn call_seed(episode_seed: u64, call: u32) -> u64 {
    let mut z =
        episode_seed.wrapping_add(0x9E37_79B9_7F4A_7C15u64.wrapping_mul(u64::from(call) + 1));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Cut `text` to at most `max` characters, saying how much was cut.
pub fn cut_text(text: &str, max: usize) -> String {
    let total = text.chars().count();
    if total <= max {
        return text.to_string();
    }
    let kept: String = text.chars().take(max).collect();
    format!("{kept}\n[... {} more characters cut]", total - max)
}

/// Run one episode: render the context from the harness and history, ask the policy for a turn,
/// parse it, apply hooks, step the environment, and record everything until the environment is
/// done, the policy finishes, or a limit is hit. The environment's verifier judges the end state.
///
/// Model misbehaviour (unparseable text, unknown tools, exhausted limits) is recorded in the
/// trajectory; `Err` means the harness is invalid for this environment or a backend failed.
pub async fn run_episode_with(
    policy: &dyn Policy,
    harness: &Harness,
    env: &dyn Environment,
    task: &Task,
    seed: u64,
    options: &EpisodeOptions,
) -> Result<Trajectory> {
    harness.validate()?;
    if harness.is_external() {
        // An agent program acts instead of this loop; the environment runs it.
        return env
            .run_program(policy, harness, task, seed, &options.sampling)
            .await;
    }
    let hooks = harness.compile_hooks()?;
    let mut session = env.reset(task, seed).await?;
    let env_tools = session.tools();
    harness.validate_for_tools(&env_tools)?;
    let parser: Arc<dyn ActionParser> = if harness.tool_view.format == TOOL_CALL_FORMAT {
        Arc::new(ToolCallParser)
    } else {
        session.action_parser(&harness.tool_view.format).ok_or_else(|| {
            Error::invalid(
                "tool_view.format",
                format!(
                    "environment `{}` has no action format `{}`; expected `{TOOL_CALL_FORMAT}` or one the environment defines",
                    env.name(),
                    harness.tool_view.format
                ),
            )
        })?
    };
    let tools = harness.visible_tools(&env_tools);
    let tool_kinds: BTreeMap<String, ToolKind> =
        env_tools.iter().map(|t| (t.name.clone(), t.kind)).collect();

    let mut ep = Episode {
        harness,
        hooks,
        tools,
        tool_kinds,
        messages: Vec::new(),
        turns: Vec::new(),
        counts: Counts::default(),
        executed: Vec::new(),
        last_observation: None,
        notes: Vec::new(),
        notes_shown: 0,
    };
    ep.push(
        Role::System,
        Source::Harness,
        harness.system_prompt(task)?,
        None,
        None,
    );
    ep.push(
        Role::User,
        Source::Task,
        harness.user_prompt(task)?,
        None,
        None,
    );
    let initial = session.initial_observation();
    if !initial.trim().is_empty() {
        ep.push(Role::User, Source::Environment, initial, None, None);
    }

    let limits = harness.limits;
    // Every turn is requested with the same settings; each record keeps them so that a trainer
    // can tell what its log-probs are probabilities under (Eq. 16).
    let sampling = TurnSampling::from(&options.sampling);
    let mut final_answer = None;
    let termination = 'episode: loop {
        if ep.counts.model_calls >= limits.max_model_calls {
            break Termination::MaxModelCalls;
        }
        ep.fire(HookEvent::BeforeModel, None);
        ep.show_notes();
        let request = PolicyRequest {
            messages: ep.render(),
            tools: ep.tools.clone(),
            max_new_tokens: limits.max_output_tokens as usize,
            max_context_tokens: limits.max_context_tokens as usize,
            sampling: options.sampling.clone(),
            seed: call_seed(seed, ep.counts.model_calls),
        };
        let turn = policy.generate(request).await?;
        check_turn(
            policy.name(),
            &turn,
            limits.max_output_tokens,
            limits.max_context_tokens,
        )?;
        ep.counts.model_calls += 1;
        if turn.finish == FinishReason::ContextOverflow {
            ep.turns.push(PolicyTurnRecord {
                message_index: None,
                context_tokens: turn.context_tokens,
                tokens: Vec::new(),
                logprobs: Vec::new(),
                finish: turn.finish,
                sampling: Some(sampling),
            });
            break Termination::ContextLimit;
        }
        ep.counts.policy_tokens += turn.tokens.len() as u32;
        let message_index = ep.messages.len();
        ep.push(
            Role::Assistant,
            Source::Policy,
            turn.text.clone(),
            None,
            None,
        );
        ep.turns.push(PolicyTurnRecord {
            message_index: Some(message_index),
            context_tokens: turn.context_tokens,
            tokens: turn.tokens,
            logprobs: turn.logprobs,
            finish: turn.finish,
            sampling: Some(sampling),
        });

        match parser.parse(&turn.text, &ep.tools) {
            ParsedAction::Invalid(reason) => {
                ep.counts.parse_failures += 1;
                let observation =
                    Observation::error(invalid_action_message(parser.format(), &reason));
                ep.push(
                    Role::User,
                    Source::Harness,
                    observation.text.clone(),
                    None,
                    None,
                );
                ep.last_observation = Some(observation);
                ep.fire(HookEvent::OnError, None);
            }
            ParsedAction::Final(answer) => {
                if ep.finish_refused(None) {
                    continue;
                }
                final_answer = Some(answer);
                break Termination::PolicyFinished;
            }
            ParsedAction::Calls(calls) => {
                for call in calls {
                    if call.name == NOTE_TOOL && harness.memory.enabled && harness.memory.note_tool
                    {
                        ep.take_note(&call);
                        continue;
                    }
                    let Some(spec) = ep.tools.iter().find(|t| t.name == call.name) else {
                        ep.refuse_unknown_tool(&call);
                        break;
                    };
                    if spec.kind == ToolKind::Submit && ep.finish_refused(Some(&call)) {
                        break;
                    }
                    if ep.tool_blocked(&call) {
                        break;
                    }
                    let observation = session.step(&call).await?;
                    if ep.record_step(call, observation) {
                        break 'episode Termination::EnvDone;
                    }
                    if ep.counts.env_actions >= limits.max_env_actions {
                        break 'episode Termination::MaxEnvActions;
                    }
                }
            }
        }
    };

    let outcome = session.verify(final_answer.as_deref()).await?;
    Ok(Trajectory {
        task_id: task.id.clone(),
        env: env.name().to_string(),
        harness_id: harness.id(),
        harness_name: harness.name.clone(),
        seed,
        policy: policy.name().to_string(),
        messages: ep.messages,
        turns: ep.turns,
        final_answer,
        outcome,
        termination,
        policy_version: None,
        counts: ep.counts,
    })
}

/// What the loop tells the policy when its turn could not be read as an action in `format`
/// (the parser's `reason`); an agent program that mirrors the loop sends the same text.
pub fn invalid_action_message(format: &str, reason: &str) -> String {
    let hint = if format == TOOL_CALL_FORMAT {
        " Call a tool with <tool_call>{\"name\": ..., \"arguments\": {...}}</tool_call>, or answer without a tool call to finish."
    } else {
        ""
    };
    format!("Your last message could not be read as an action: {reason}.{hint}")
}

fn check_turn(
    policy: &str,
    turn: &crate::policy::PolicyTurn,
    max_output: u32,
    max_context: u32,
) -> Result<()> {
    let broken = |message: String| {
        Err(Error::Policy {
            policy: policy.to_string(),
            message,
        })
    };
    if turn.tokens.len() != turn.logprobs.len() {
        return broken(format!(
            "returned {} tokens but {} log-probs; expected one log-prob per token",
            turn.tokens.len(),
            turn.logprobs.len()
        ));
    }
    if turn.tokens.len() > max_output as usize {
        return broken(format!(
            "generated {} tokens, over the limit of {max_output}",
            turn.tokens.len()
        ));
    }
    if turn.finish == FinishReason::ContextOverflow && !turn.tokens.is_empty() {
        return broken("reported a context overflow but generated tokens".into());
    }
    if turn.finish != FinishReason::ContextOverflow
        && turn.context_tokens.len() > max_context as usize
    {
        return broken(format!(
            "generated from {} context tokens, over the limit of {max_context}, instead of reporting an overflow",
            turn.context_tokens.len()
        ));
    }
    Ok(())
}

/// The mutable state of one episode.
struct Episode<'h> {
    harness: &'h Harness,
    hooks: Vec<CompiledHook>,
    tools: Vec<ToolSpec>,
    tool_kinds: BTreeMap<String, ToolKind>,
    messages: Vec<TrajectoryMessage>,
    turns: Vec<PolicyTurnRecord>,
    counts: Counts,
    executed: Vec<(ToolCall, bool)>,
    last_observation: Option<Observation>,
    notes: Vec<String>,
    notes_shown: usize,
}

impl Episode<'_> {
    fn push(
        &mut self,
        role: Role,
        source: Source,
        content: String,
        name: Option<String>,
        hook: Option<String>,
    ) {
        self.messages.push(TrajectoryMessage {
            role,
            source,
            content,
            name,
            hook,
        });
    }

    fn state<'a>(&'a self, pending: Option<&'a ToolCall>) -> HookState<'a> {
        let limits = self.harness.limits;
        HookState {
            last_observation: self.last_observation.as_ref(),
            pending,
            executed: &self.executed,
            remaining_steps: limits
                .max_env_actions
                .saturating_sub(self.counts.env_actions),
            remaining_calls: limits
                .max_model_calls
                .saturating_sub(self.counts.model_calls),
            tool_kinds: &self.tool_kinds,
        }
    }

    /// Evaluate the hooks of `event`; inject the messages of those that fire. Returns whether a
    /// `block` or `require` hook fired (the pending action must be refused).
    fn fire(&mut self, event: HookEvent, pending: Option<&ToolCall>) -> bool {
        let state = self.state(pending);
        let fired: Vec<(String, HookAction, String)> = self
            .hooks
            .iter()
            .filter(|h| h.event == event && h.fires(&state))
            .map(|h| (h.name.clone(), h.action, h.message.clone()))
            .collect();
        let mut refused = false;
        for (name, action, message) in fired {
            refused |= action != HookAction::Warn;
            self.counts.hook_messages += 1;
            self.push(Role::User, Source::Harness, message, None, Some(name));
        }
        refused
    }

    fn finish_refused(&mut self, pending: Option<&ToolCall>) -> bool {
        let refused = self.fire(HookEvent::BeforeFinish, pending);
        if refused {
            self.counts.refused_finishes += 1;
        }
        refused
    }

    fn tool_blocked(&mut self, call: &ToolCall) -> bool {
        let blocked = self.fire(HookEvent::BeforeTool, Some(call));
        if blocked {
            self.counts.refused_actions += 1;
        }
        blocked
    }

    fn refuse_unknown_tool(&mut self, call: &ToolCall) {
        self.counts.refused_actions += 1;
        let names: Vec<&str> = self.tools.iter().map(|t| t.name.as_str()).collect();
        let observation = Observation::error(format!(
            "There is no tool named `{}`. Available tools: {}.",
            call.name,
            names.join(", ")
        ));
        self.push(
            Role::Tool,
            Source::Harness,
            observation.text.clone(),
            Some(call.name.clone()),
            None,
        );
        self.last_observation = Some(observation);
        self.fire(HookEvent::OnError, None);
    }

    fn take_note(&mut self, call: &ToolCall) {
        let text = call
            .arguments
            .get("text")
            .and_then(|t| t.as_str())
            .unwrap_or("")
            .trim();
        let reply = if text.is_empty() {
            "The note tool needs a non-empty `text` argument.".to_string()
        } else {
            self.add_note(text.to_string());
            "Noted.".to_string()
        };
        self.push(
            Role::Tool,
            Source::Harness,
            reply,
            Some(NOTE_TOOL.to_string()),
            None,
        );
    }

    fn add_note(&mut self, text: String) {
        let memory = &self.harness.memory;
        self.notes.push(cut_text(&text, memory.note_chars as usize));
        let excess = self.notes.len().saturating_sub(memory.max_notes as usize);
        if excess > 0 {
            self.notes.drain(..excess);
            self.notes_shown = self.notes_shown.saturating_sub(excess);
        }
    }

    /// Inject the note store when it changed since it was last shown.
    fn show_notes(&mut self) {
        if !self.harness.memory.enabled
            || self.notes.is_empty()
            || self.notes_shown == self.notes.len()
        {
            return;
        }
        let mut text = String::from("Notes so far:");
        for note in &self.notes {
            text.push_str("\n- ");
            text.push_str(note);
        }
        self.notes_shown = self.notes.len();
        self.push(
            Role::User,
            Source::Harness,
            text,
            None,
            Some("memory".to_string()),
        );
    }

    /// Record an executed step; returns whether the environment ended the episode.
    fn record_step(&mut self, call: ToolCall, mut observation: Observation) -> bool {
        self.counts.env_actions += 1;
        if let Some(max) = self.harness.tool_view.max_observation_chars {
            observation.text = cut_text(&observation.text, max as usize);
        }
        self.push(
            Role::Tool,
            Source::Environment,
            observation.text.clone(),
            Some(call.name.clone()),
            None,
        );
        if self.harness.memory.enabled && self.harness.memory.auto_notes {
            let status = if observation.error { "error" } else { "ok" };
            let first_line = observation.text.lines().next().unwrap_or("");
            self.add_note(format!("{} -> {status}: {first_line}", call.canonical()));
        }
        let done = observation.done;
        let error = observation.error;
        self.executed.push((call, error));
        self.last_observation = Some(observation);
        if error {
            self.counts.tool_errors += 1;
            self.fire(HookEvent::OnError, None);
        }
        self.fire(HookEvent::AfterTool, None);
        done
    }

    /// The messages as the policy sees them, with old observations elided per the context policy.
    fn render(&self) -> Vec<ChatMessage> {
        crate::objective::render_history(&self.messages, &self.harness.context)
    }
}
