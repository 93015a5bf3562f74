//! Chat messages and the [`ChatModel`] seam used by the LLM roles (editor, failure analyst,
//! Meta-Harness proposer, profiler, voters).

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::Result;

/// The speaker of a chat message, as chat templates know it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The system prompt.
    System,
    /// The user, and text the harness injects between turns.
    User,
    /// The model.
    Assistant,
    /// A tool's response to a call.
    Tool,
}

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatMessage {
    /// Who speaks.
    pub role: Role,
    /// The text. Assistant messages hold the raw generated text, tool-call blocks included.
    pub content: String,
    /// The tool's name for [`Role::Tool`] messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with no tool name.
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: content.into(),
            name: None,
        }
    }

    /// A system message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }

    /// A user message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }

    /// An assistant message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }

    /// A tool response from `tool`.
    pub fn tool(tool: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: Role::Tool,
            content: content.into(),
            name: Some(tool.into()),
        }
    }
}

/// A request to a [`ChatModel`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatRequest {
    /// Which role of the pipeline asks (`editor`, `analyst`, `profiler`, `voter`, ...); used to
    /// account external tokens per role.
    pub purpose: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Sampling temperature.
    pub temperature: f32,
    /// Upper bound on generated tokens.
    pub max_tokens: usize,
    /// Seed for providers that honour one.
    pub seed: Option<u64>,
    /// The answer's shape: [`OutputFormat::JsonObject`](crate::policy::OutputFormat::JsonObject) for roles that answer in JSON (sent as
    /// `response_format`; providers without constrained decoding may ignore it, so answers are
    /// validated all the same).
    #[serde(default)]
    pub format: crate::policy::OutputFormat,
}

impl ChatRequest {
    /// A request with temperature 0.7, 4,096 output tokens and no seed.
    pub fn new(purpose: impl Into<String>, messages: Vec<ChatMessage>) -> Self {
        ChatRequest {
            purpose: purpose.into(),
            messages,
            temperature: 0.7,
            max_tokens: 4096,
            seed: None,
            format: crate::policy::OutputFormat::Text,
        }
    }
}

/// Token usage reported by a provider.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens in the prompt.
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub completion_tokens: u64,
}

/// A [`ChatModel`]'s answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatResponse {
    /// The generated text.
    pub text: String,
    /// Token usage, when the provider reports it.
    pub usage: Option<Usage>,
}

/// A text-in, text-out language model for the pipeline's LLM roles.
///
/// # Example
/// `examples/custom_chat_model.rs` in the repository implements a model served by a local program, answering the router's LLM voter
/// (`cargo run --release --example custom_chat_model`; `tests/extension_examples.rs` runs it).
///
/// # Design
/// The roles need nothing but text: they never train, so token ids and log-probs stay out of
/// this trait (that is [`crate::Policy`]'s job). Implementations are an OpenAI-compatible HTTP
/// client for real use and deterministic built-in models for offline runs.
#[async_trait]
pub trait ChatModel: Send + Sync {
    /// A short name for logs and errors.
    fn name(&self) -> &str;

    /// Complete the conversation.
    async fn complete(&self, request: ChatRequest) -> Result<ChatResponse>;
}
