//! Scripted policies.

use std::sync::Mutex;

use async_trait::async_trait;
use harness_core::{ChatMessage, FinishReason, Policy, PolicyRequest, PolicyTurn, Result};

/// Byte-level fake tokenisation: one token per byte.
pub fn byte_tokens(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// The fake prompt a scripted policy "tokenises": each message as `role\ncontent\n`, then the
/// generation prompt `assistant\n`. Like a real chat template, a turn's context followed by its
/// generated text is a prefix of the next turn's context.
pub fn render_fake_context(messages: &[ChatMessage]) -> String {
    let mut out = String::new();
    for m in messages {
        let role = format!("{:?}", m.role).to_lowercase();
        out.push_str(&format!("{role}\n{}\n", m.content));
    }
    out.push_str("assistant\n");
    out
}

fn turn_from_text(request: &PolicyRequest, text: String) -> PolicyTurn {
    let context_tokens = byte_tokens(&render_fake_context(&request.messages));
    if context_tokens.len() > request.max_context_tokens {
        return PolicyTurn {
            text: String::new(),
            context_tokens,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            finish: FinishReason::ContextOverflow,
        };
    }
    let mut tokens = byte_tokens(&text);
    let mut finish = FinishReason::Stop;
    let mut text = text;
    if tokens.len() > request.max_new_tokens {
        tokens.truncate(request.max_new_tokens);
        text = String::from_utf8_lossy(&text.as_bytes()[..request.max_new_tokens]).into_owned();
        finish = FinishReason::Length;
    }
    // A fixed, token-dependent log-prob keeps trajectories deterministic.
    let logprobs = tokens.iter().map(|t| -0.01 * (1 + t % 7) as f32).collect();
    PolicyTurn {
        text,
        context_tokens,
        tokens,
        logprobs,
        finish,
    }
}

/// Replays a fixed list of turns; after the script runs out it repeats the last turn (or answers
/// with an empty final answer when the script is empty).
#[derive(Debug)]
pub struct ScriptedPolicy {
    turns: Vec<String>,
    next: Mutex<usize>,
}

impl ScriptedPolicy {
    /// A policy that says `turns` in order.
    pub fn new(turns: Vec<String>) -> Self {
        ScriptedPolicy {
            turns,
            next: Mutex::new(0),
        }
    }

    /// How many turns were requested so far.
    pub fn calls(&self) -> usize {
        *self.next.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[async_trait]
impl Policy for ScriptedPolicy {
    fn name(&self) -> &str {
        "scripted"
    }

    async fn generate(&self, request: PolicyRequest) -> Result<PolicyTurn> {
        let index = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let i = *next;
            *next += 1;
            i
        };
        let text = self
            .turns
            .get(index)
            .or_else(|| self.turns.last())
            .cloned()
            .unwrap_or_default();
        Ok(turn_from_text(&request, text))
    }
}

/// A policy whose turns come from a closure over the request (stateless, so concurrent episodes
/// can share one).
pub struct FnPolicy<F> {
    name: String,
    f: F,
}

impl<F> FnPolicy<F>
where
    F: Fn(&PolicyRequest) -> String + Send + Sync,
{
    /// A policy named `name` answering with `f(request)`.
    pub fn new(name: impl Into<String>, f: F) -> Self {
        FnPolicy {
            name: name.into(),
            f,
        }
    }
}

#[async_trait]
impl<F> Policy for FnPolicy<F>
where
    F: Fn(&PolicyRequest) -> String + Send + Sync,
{
    fn name(&self) -> &str {
        &self.name
    }

    async fn generate(&self, request: PolicyRequest) -> Result<PolicyTurn> {
        let text = (self.f)(&request);
        Ok(turn_from_text(&request, text))
    }
}
