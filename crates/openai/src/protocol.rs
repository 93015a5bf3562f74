//! Wire types of the OpenAI-compatible API (chat completions, completions with vLLM's token-id
//! extensions) and of SGLang's native `/generate`, shared by the clients and the server.
//!
//! Only the fields this crate reads or writes are typed; unknown request fields are kept in
//! `extra` maps so that provider-specific parameters pass through.

use std::collections::BTreeMap;

use harness_core::{ChatMessage, Role, ToolCall, ToolSpec};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// `stop` as one string or a list.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    /// One stop string.
    One(String),
    /// Several stop strings.
    Many(Vec<String>),
}

impl StopField {
    /// The stop strings as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(s) => vec![s],
            StopField::Many(v) => v,
        }
    }
}

/// Message content: a string or a list of typed parts (only text parts are understood).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    /// Plain text.
    Text(String),
    /// Typed parts such as `{"type": "text", "text": "..."}`.
    Parts(Vec<ContentPart>),
}

impl MessageContent {
    /// The text of the content (text parts concatenated).
    pub fn text(&self) -> String {
        match self {
            MessageContent::Text(s) => s.clone(),
            MessageContent::Parts(parts) => parts
                .iter()
                .filter_map(|p| p.text.as_deref())
                .collect::<Vec<_>>()
                .join(""),
        }
    }
}

/// One part of a multi-part message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ContentPart {
    /// The part's type (`text`, `image_url`, ...).
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
}

/// A function call as the chat API writes it: arguments are a JSON-encoded string.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// The arguments, JSON-encoded.
    pub arguments: String,
}

/// A tool call in an assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireToolCall {
    /// The call's id, echoed by the tool message that answers it.
    pub id: String,
    /// Always `function`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// The function and arguments.
    pub function: FunctionCall,
}

fn function_kind() -> String {
    "function".into()
}

impl WireToolCall {
    /// A wire call from a harness [`ToolCall`].
    pub fn from_call(id: impl Into<String>, call: &ToolCall) -> Self {
        WireToolCall {
            id: id.into(),
            kind: function_kind(),
            function: FunctionCall {
                name: call.name.clone(),
                arguments: call.arguments.to_string(),
            },
        }
    }

    /// The harness [`ToolCall`]; unparseable arguments are kept as a JSON string.
    pub fn to_call(&self) -> ToolCall {
        let arguments = serde_json::from_str(&self.function.arguments)
            .unwrap_or_else(|_| Value::String(self.function.arguments.clone()));
        ToolCall::new(self.function.name.clone(), arguments)
    }
}

/// A chat message on the wire.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireMessage {
    /// `system`, `developer`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The content (absent or null for an assistant message that only calls tools).
    #[serde(default)]
    pub content: Option<MessageContent>,
    /// The speaker's or tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Tool calls of an assistant message.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<WireToolCall>,
    /// The call a tool message answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
}

impl WireMessage {
    /// A message with text content only.
    pub fn text(role: &str, content: impl Into<String>) -> Self {
        WireMessage {
            role: role.into(),
            content: Some(MessageContent::Text(content.into())),
            name: None,
            tool_calls: Vec::new(),
            tool_call_id: None,
        }
    }
}

/// A function tool offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireTool {
    /// Always `function`.
    #[serde(rename = "type", default = "function_kind")]
    pub kind: String,
    /// The function.
    pub function: WireFunction,
}

/// A function's declaration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WireFunction {
    /// Its name.
    pub name: String,
    /// What it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Its JSON-schema parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<Value>,
}

impl WireTool {
    /// The wire form of a harness tool.
    pub fn from_spec(spec: &ToolSpec) -> Self {
        WireTool {
            kind: function_kind(),
            function: WireFunction {
                name: spec.name.clone(),
                description: Some(spec.description.clone()),
                parameters: Some(spec.parameters.clone()),
            },
        }
    }

    /// The harness form of a wire tool.
    pub fn to_spec(&self) -> ToolSpec {
        ToolSpec::new(
            self.function.name.clone(),
            self.function.description.clone().unwrap_or_default(),
            self.function
                .parameters
                .clone()
                .unwrap_or_else(|| serde_json::json!({"type": "object", "properties": {}})),
        )
    }
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionRequest {
    /// The model's name.
    pub model: String,
    /// The conversation.
    pub messages: Vec<WireMessage>,
    /// Tools the model may call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<WireTool>,
    /// `none`, `auto`, `required` or a specific function.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<Value>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus mass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Upper bound on generated tokens (legacy name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<i64>,
    /// Upper bound on generated tokens (current name).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_completion_tokens: Option<i64>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Stop strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopField>,
    /// Number of choices (the local server supports 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Streaming (the local server does not stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Return the sampled tokens' log-probs in `choices[i].logprobs.content`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<bool>,
    /// Provider-specific fields, passed through.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// One generated token's log-prob in a chat answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its log-prob.
    pub logprob: f32,
    /// Its UTF-8 bytes.
    #[serde(default)]
    pub bytes: Option<Vec<u8>>,
    /// Alternatives (the local server reports none).
    #[serde(default)]
    pub top_logprobs: Vec<Value>,
}

/// Log-probs of a chat choice.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    #[serde(default)]
    pub content: Option<Vec<ChatTokenLogprob>>,
}

/// Token counts of an answer.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WireUsage {
    /// Prompt tokens.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Generated tokens.
    #[serde(default)]
    pub completion_tokens: u64,
    /// Their sum.
    #[serde(default)]
    pub total_tokens: u64,
}

impl WireUsage {
    /// Usage of `prompt` and `completion` tokens.
    pub fn new(prompt: usize, completion: usize) -> Self {
        WireUsage {
            prompt_tokens: prompt as u64,
            completion_tokens: completion as u64,
            total_tokens: (prompt + completion) as u64,
        }
    }
}

/// One choice of a chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatChoice {
    /// Its index.
    #[serde(default)]
    pub index: u32,
    /// The assistant message.
    pub message: WireMessage,
    /// `stop`, `length` or `tool_calls`.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// Log-probs, when asked for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<ChatLogprobs>,
}

/// The answer to a chat completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatCompletionResponse {
    /// Its id.
    #[serde(default)]
    pub id: String,
    /// `chat.completion`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// The model that answered.
    #[serde(default)]
    pub model: String,
    /// The choices.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    #[serde(default)]
    pub usage: Option<WireUsage>,
}

/// A completion prompt: text, texts, token ids or batches of token ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PromptField {
    /// One token-id prompt.
    Tokens(Vec<u32>),
    /// Several token-id prompts.
    TokenBatch(Vec<Vec<u32>>),
    /// One text prompt.
    Text(String),
    /// Several text prompts.
    Texts(Vec<String>),
}

/// `POST /v1/completions` with vLLM's extensions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionRequest {
    /// The model's name.
    pub model: String,
    /// The prompt(s).
    pub prompt: PromptField,
    /// Upper bound on generated tokens (OpenAI's default is 16).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<i64>,
    /// Sampling temperature.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f32>,
    /// Nucleus mass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f32>,
    /// Top-k (vLLM; -1 or 0 disables).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<i64>,
    /// Sampling seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Stop strings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop: Option<StopField>,
    /// Number of choices per prompt (the local server supports 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub n: Option<u32>,
    /// Streaming (the local server does not stream).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Echo the prompt (the local server does not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub echo: Option<bool>,
    /// Return log-probs: the sampled token's plus this many alternatives.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs: Option<u32>,
    /// vLLM: put `token_ids` (and `prompt_token_ids`) in each choice.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_token_ids: Option<bool>,
    /// vLLM: write log-prob tokens as `token_id:<id>` instead of text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub return_tokens_as_token_ids: Option<bool>,
    /// vLLM: keep a matched stop string in the text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub include_stop_str_in_output: Option<bool>,
    /// Provider-specific fields, passed through.
    #[serde(flatten)]
    pub extra: Map<String, Value>,
}

/// Log-probs of a completion choice (OpenAI's legacy format).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CompletionLogprobs {
    /// The tokens (text, or `token_id:<id>`).
    #[serde(default)]
    pub tokens: Vec<String>,
    /// The sampled tokens' log-probs.
    #[serde(default)]
    pub token_logprobs: Vec<Option<f32>>,
    /// The most likely alternatives per position.
    #[serde(default)]
    pub top_logprobs: Option<Vec<Option<BTreeMap<String, f32>>>>,
    /// Character offsets of the tokens in the text.
    #[serde(default)]
    pub text_offset: Vec<usize>,
}

/// One choice of a completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionChoice {
    /// Its index.
    #[serde(default)]
    pub index: u32,
    /// The generated text.
    #[serde(default)]
    pub text: String,
    /// Log-probs, when asked for.
    #[serde(default)]
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` or `length`.
    #[serde(default)]
    pub finish_reason: Option<String>,
    /// vLLM: the generated token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_ids: Option<Vec<u32>>,
    /// vLLM: the prompt token ids.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompt_token_ids: Option<Vec<u32>>,
}

/// The answer to a completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CompletionResponse {
    /// Its id.
    #[serde(default)]
    pub id: String,
    /// `text_completion`.
    #[serde(default)]
    pub object: String,
    /// Unix seconds.
    #[serde(default)]
    pub created: u64,
    /// The model that answered.
    #[serde(default)]
    pub model: String,
    /// One choice per prompt.
    pub choices: Vec<CompletionChoice>,
    /// Token counts.
    #[serde(default)]
    pub usage: Option<WireUsage>,
}

/// SGLang's sampling parameters for `/generate` (defaults as SGLang's).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SglangSamplingParams {
    /// Upper bound on generated tokens.
    #[serde(default = "default_max_new_tokens")]
    pub max_new_tokens: i64,
    /// Sampling temperature (0 is greedy).
    #[serde(default = "one")]
    pub temperature: f32,
    /// Nucleus mass.
    #[serde(default = "one")]
    pub top_p: f32,
    /// Top-k; -1 disables.
    #[serde(default = "minus_one")]
    pub top_k: i64,
    /// Stop strings.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stop: Vec<String>,
    /// Keep a matched stop string in the text.
    #[serde(default)]
    pub no_stop_trim: bool,
    /// Per-request seed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling_seed: Option<u64>,
}

fn default_sglang_params() -> SglangSamplingParams {
    serde_json::from_value(serde_json::json!({})).expect("every field has a default")
}

fn default_max_new_tokens() -> i64 {
    128
}

fn one() -> f32 {
    1.0
}

fn minus_one() -> i64 {
    -1
}

/// `POST /generate` on SGLang.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SglangGenerateRequest {
    /// The prompt as token ids.
    pub input_ids: Vec<u32>,
    /// How to sample.
    #[serde(default = "default_sglang_params")]
    pub sampling_params: SglangSamplingParams,
    /// Return the sampled tokens' log-probs in `meta_info.output_token_logprobs`.
    #[serde(default)]
    pub return_logprob: bool,
    /// Streaming (never used here).
    #[serde(default)]
    pub stream: bool,
}

/// `meta_info` of a `/generate` answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SglangMetaInfo {
    /// `{"type": "stop" | "length" | "abort", ...}`.
    #[serde(default)]
    pub finish_reason: Option<Value>,
    /// Prompt tokens.
    #[serde(default)]
    pub prompt_tokens: u64,
    /// Generated tokens.
    #[serde(default)]
    pub completion_tokens: u64,
    /// One `[logprob, token_id, text-or-null]` per generated token.
    #[serde(default)]
    pub output_token_logprobs: Vec<Vec<Value>>,
}

/// The answer of SGLang's `/generate` for one prompt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SglangGenerateResponse {
    /// The generated text.
    #[serde(default)]
    pub text: String,
    /// The generated token ids (recent versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_ids: Option<Vec<u32>>,
    /// Token counts, finish reason and log-probs.
    #[serde(default)]
    pub meta_info: SglangMetaInfo,
}

/// The opening tag of a tool call in generated text (Qwen's Hermes format).
pub const CALL_OPEN: &str = "<tool_call>";

/// Split a generated text into the content before its first `<tool_call>` block and the calls,
/// when it has well-formed calls (harness-core's [`harness_core::ToolCallParser`] decides).
pub fn split_tool_calls(text: &str) -> Option<(String, Vec<ToolCall>)> {
    use harness_core::{ActionParser, ParsedAction, ToolCallParser};
    match ToolCallParser.parse(text, &[]) {
        ParsedAction::Calls(calls) => {
            let head = text.find(CALL_OPEN).map_or(text, |i| &text[..i]);
            Some((head.trim().to_string(), calls))
        }
        _ => None,
    }
}

/// Harness messages to wire messages. Assistant messages whose raw text holds `<tool_call>`
/// blocks become `tool_calls` with ids `call_<message>_<k>`, and the tool messages that follow
/// answer them in order (by name when it matches); a tool message with no call to answer is
/// sent as a user message wrapped in `<tool_response>` so that strict providers accept it.
pub fn to_wire_messages(messages: &[ChatMessage]) -> Vec<WireMessage> {
    let mut out = Vec::with_capacity(messages.len());
    let mut pending: Vec<(String, String)> = Vec::new(); // (id, tool name)
    for (m, msg) in messages.iter().enumerate() {
        match msg.role {
            Role::System => out.push(WireMessage::text("system", &msg.content)),
            Role::User => out.push(WireMessage::text("user", &msg.content)),
            Role::Assistant => match split_tool_calls(&msg.content) {
                Some((head, calls)) => {
                    let tool_calls: Vec<WireToolCall> = calls
                        .iter()
                        .enumerate()
                        .map(|(k, c)| WireToolCall::from_call(format!("call_{m}_{k}"), c))
                        .collect();
                    pending = tool_calls
                        .iter()
                        .map(|c| (c.id.clone(), c.function.name.clone()))
                        .collect();
                    out.push(WireMessage {
                        role: "assistant".into(),
                        content: (!head.is_empty()).then_some(MessageContent::Text(head)),
                        name: None,
                        tool_calls,
                        tool_call_id: None,
                    });
                }
                None => {
                    pending.clear();
                    out.push(WireMessage::text("assistant", &msg.content));
                }
            },
            Role::Tool => {
                let pos = pending
                    .iter()
                    .position(|(_, name)| Some(name) == msg.name.as_ref())
                    .or_else(|| (!pending.is_empty()).then_some(0));
                match pos {
                    Some(i) => {
                        let (id, name) = pending.remove(i);
                        out.push(WireMessage {
                            role: "tool".into(),
                            content: Some(MessageContent::Text(msg.content.clone())),
                            name: Some(msg.name.clone().unwrap_or(name)),
                            tool_calls: Vec::new(),
                            tool_call_id: Some(id),
                        });
                    }
                    None => out.push(WireMessage::text(
                        "user",
                        format!("<tool_response>\n{}\n</tool_response>", msg.content),
                    )),
                }
            }
        }
    }
    out
}

/// The text a harness sees for an assistant wire message: its content followed by its tool
/// calls as `<tool_call>` blocks.
pub fn assistant_text(message: &WireMessage) -> String {
    let mut text = message
        .content
        .as_ref()
        .map(MessageContent::text)
        .unwrap_or_default();
    for call in &message.tool_calls {
        if !text.is_empty() {
            text.push('\n');
        }
        text.push_str(&call.to_call().to_tool_call_block());
    }
    text
}

/// Wire messages to harness messages (the server side of [`to_wire_messages`]). Unknown roles
/// are an error naming the message index.
pub fn from_wire_messages(messages: &[WireMessage]) -> Result<Vec<ChatMessage>, String> {
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    let mut out = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let content = m
            .content
            .as_ref()
            .map(MessageContent::text)
            .unwrap_or_default();
        let msg = match m.role.as_str() {
            "system" | "developer" => ChatMessage::system(content),
            "user" => ChatMessage::user(content),
            "assistant" => {
                for c in &m.tool_calls {
                    names.insert(c.id.clone(), c.function.name.clone());
                }
                ChatMessage::assistant(assistant_text(m))
            }
            "tool" => {
                let name = m
                    .name
                    .clone()
                    .or_else(|| {
                        m.tool_call_id
                            .as_ref()
                            .and_then(|id| names.get(id).cloned())
                    })
                    .unwrap_or_else(|| "tool".into());
                ChatMessage::tool(name, content)
            }
            other => {
                return Err(format!(
                    "messages[{i}].role: expected system, developer, user, assistant or tool, got `{other}`"
                ));
            }
        };
        out.push(msg);
    }
    Ok(out)
}

/// The log-prob, token id pairs of SGLang's `output_token_logprobs`.
pub fn sglang_logprobs(rows: &[Vec<Value>]) -> Result<Vec<(f32, u32)>, String> {
    rows.iter()
        .enumerate()
        .map(|(i, row)| {
            let lp = row.first().and_then(Value::as_f64);
            let id = row.get(1).and_then(Value::as_u64);
            match (lp, id) {
                (Some(lp), Some(id)) if id <= u64::from(u32::MAX) => Ok((lp as f32, id as u32)),
                _ => Err(format!(
                    "meta_info.output_token_logprobs[{i}]: expected [logprob, token_id, ...], got {}",
                    Value::Array(row.clone())
                )),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tool_calls_round_trip_through_the_wire() {
        let call = ToolCall::new("search", json!({"q": "rust"}));
        let messages = vec![
            ChatMessage::system("sys"),
            ChatMessage::user("find it"),
            ChatMessage::assistant(format!("Let me look.\n{}", call.to_tool_call_block())),
            ChatMessage::tool("search", "found"),
            ChatMessage::tool("search", "orphan"),
        ];
        let wire = to_wire_messages(&messages);
        assert_eq!(wire[2].tool_calls.len(), 1);
        assert_eq!(wire[2].tool_calls[0].id, "call_2_0");
        assert_eq!(wire[3].tool_call_id.as_deref(), Some("call_2_0"));
        assert_eq!(
            wire[4].role, "user",
            "an unanswerable tool message becomes user text"
        );
        let back = from_wire_messages(&wire[..4]).unwrap();
        assert_eq!(back[3], ChatMessage::tool("search", "found"));
        assert_eq!(
            split_tool_calls(&back[2].content).unwrap().1,
            vec![call.clone()]
        );
        assert_eq!(
            split_tool_calls(&back[2].content).unwrap().0,
            "Let me look."
        );
    }

    #[test]
    fn prompts_parse_in_every_shape() {
        let p: PromptField = serde_json::from_value(json!([1, 2, 3])).unwrap();
        assert_eq!(p, PromptField::Tokens(vec![1, 2, 3]));
        let p: PromptField = serde_json::from_value(json!([[1], [2, 3]])).unwrap();
        assert_eq!(p, PromptField::TokenBatch(vec![vec![1], vec![2, 3]]));
        let p: PromptField = serde_json::from_value(json!("hi")).unwrap();
        assert_eq!(p, PromptField::Text("hi".into()));
        assert!(serde_json::from_value::<PromptField>(json!([-1])).is_err());
    }

    #[test]
    fn sglang_rows_parse_and_bad_rows_are_named() {
        let rows = vec![
            vec![json!(-0.5), json!(7), Value::Null],
            vec![json!(-1.0), json!(9)],
        ];
        assert_eq!(sglang_logprobs(&rows).unwrap(), vec![(-0.5, 7), (-1.0, 9)]);
        let bad = vec![vec![json!("x")]];
        assert!(sglang_logprobs(&bad).unwrap_err().contains("[0]"));
    }
}
