//! [`ChatClient`]: a [`ChatModel`] on any OpenAI-compatible `/chat/completions` endpoint.

use async_trait::async_trait;
use harness_core::{ChatModel, ChatRequest, ChatResponse, OutputFormat, Usage};
use serde_json::{Map, Value};

use crate::error::{Error, Result};
use crate::protocol::{
    ChatCompletionRequest, ChatCompletionResponse, StopField, assistant_text, to_wire_messages,
};
use crate::transport::{EndpointConfig, Transport};
use crate::usage::UsageLedger;

/// Configuration of a [`ChatClient`].
#[derive(Debug, Clone)]
pub struct ChatClientConfig {
    /// The endpoint; `base_url` ends in `/v1` as in the OpenAI SDKs.
    pub endpoint: EndpointConfig,
    /// The model name sent in every request.
    pub model: String,
    /// Extra fields merged into every request body (provider-specific parameters such as
    /// `{"reasoning_effort": "low"}`); fields the client sets itself win.
    pub extra_body: Map<String, Value>,
    /// Stop strings sent with every request.
    pub stop: Vec<String>,
    /// Send the output limit as `max_completion_tokens` (OpenAI's reasoning models refuse
    /// `max_tokens`) instead of the widely supported `max_tokens`.
    pub use_max_completion_tokens: bool,
}

impl ChatClientConfig {
    /// A client of `model` at `base_url` with the endpoint defaults.
    pub fn new(base_url: impl Into<String>, model: impl Into<String>) -> Self {
        ChatClientConfig {
            endpoint: EndpointConfig::new(base_url),
            model: model.into(),
            extra_body: Map::new(),
            stop: Vec::new(),
            use_max_completion_tokens: false,
        }
    }
}

/// A [`ChatModel`] for any OpenAI-compatible provider or server (OpenAI, vLLM, SGLang, the local
/// [`crate::server`], ...), with per-attempt timeouts, retries with seeded exponential backoff
/// and jitter on 429/5xx/dropped connections (honouring `Retry-After`), a concurrency limit and
/// token accounting per role (`ChatRequest::purpose`) in a shared [`UsageLedger`].
///
/// A request is retried as a whole and its answer is returned once: a retried request never
/// yields two responses.
#[derive(Debug)]
pub struct ChatClient {
    name: String,
    config: ChatClientConfig,
    transport: Transport,
    ledger: UsageLedger,
}

impl ChatClient {
    /// A client with its own, empty ledger.
    pub fn new(config: ChatClientConfig) -> Result<Self> {
        Self::with_ledger(config, UsageLedger::new())
    }

    /// A client that records usage in `ledger` (shared with other clients).
    pub fn with_ledger(config: ChatClientConfig, ledger: UsageLedger) -> Result<Self> {
        if config.model.trim().is_empty() {
            return Err(Error::config("model", "must name the model to ask"));
        }
        let transport = Transport::new(config.endpoint.clone())?;
        Ok(ChatClient {
            name: format!("{} at {}", config.model, transport.url("")),
            config,
            transport,
            ledger,
        })
    }

    /// The usage ledger.
    pub fn ledger(&self) -> &UsageLedger {
        &self.ledger
    }

    /// The configuration.
    pub fn config(&self) -> &ChatClientConfig {
        &self.config
    }

    /// Send a full chat-completion request (tools, tool calls, any extension field) on behalf
    /// of `purpose`, with the client's retries and accounting. `request.model` is filled in when
    /// empty.
    pub async fn chat(
        &self,
        purpose: &str,
        mut request: ChatCompletionRequest,
    ) -> Result<ChatCompletionResponse> {
        if request.model.is_empty() {
            request.model = self.config.model.clone();
        }
        for (k, v) in &self.config.extra_body {
            request.extra.entry(k.clone()).or_insert_with(|| v.clone());
        }
        match self
            .transport
            .post_json::<_, ChatCompletionResponse>("/chat/completions", &request, None)
            .await
        {
            Ok(reply) => {
                let usage = reply.value.usage.map(|u| Usage {
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                });
                self.ledger.record_success(purpose, usage, reply.attempts);
                if reply.value.choices.is_empty() {
                    return Err(Error::Protocol {
                        endpoint: self.transport.url("/chat/completions"),
                        message: "the answer has no choices".into(),
                    });
                }
                Ok(reply.value)
            }
            Err(e) => {
                let attempts = match &e {
                    Error::Request { attempts, .. } => *attempts,
                    _ => 1,
                };
                self.ledger.record_failure(purpose, attempts);
                Err(e)
            }
        }
    }

    /// The model ids `GET /models` lists (a cheap check that the endpoint is up and serves the
    /// configured model).
    pub async fn models(&self) -> Result<Vec<String>> {
        let reply = self.transport.get_json::<Value>("/models").await?;
        let ids = reply
            .value
            .get("data")
            .and_then(Value::as_array)
            .map(|data| {
                data.iter()
                    .filter_map(|m| m.get("id").and_then(Value::as_str).map(str::to_string))
                    .collect()
            })
            .ok_or_else(|| Error::Protocol {
                endpoint: self.transport.url("/models"),
                message: "expected {\"data\": [{\"id\": ...}]}".into(),
            })?;
        Ok(ids)
    }

    /// The wire request for a harness [`ChatRequest`].
    pub fn wire_request(&self, request: &ChatRequest) -> ChatCompletionRequest {
        let limit = request.max_tokens.min(i64::MAX as usize) as i64;
        ChatCompletionRequest {
            model: self.config.model.clone(),
            messages: to_wire_messages(&request.messages),
            tools: Vec::new(),
            tool_choice: None,
            temperature: Some(request.temperature),
            top_p: None,
            max_tokens: (!self.config.use_max_completion_tokens).then_some(limit),
            max_completion_tokens: self.config.use_max_completion_tokens.then_some(limit),
            seed: request.seed,
            stop: (!self.config.stop.is_empty()).then(|| StopField::Many(self.config.stop.clone())),
            n: None,
            stream: None,
            logprobs: None,
            extra: match request.format {
                OutputFormat::Text => Map::new(),
                OutputFormat::JsonObject => {
                    let mut extra = Map::new();
                    extra.insert(
                        "response_format".into(),
                        serde_json::json!({"type": "json_object"}),
                    );
                    extra
                }
            },
        }
    }
}

#[async_trait]
impl ChatModel for ChatClient {
    fn name(&self) -> &str {
        &self.name
    }

    async fn complete(&self, request: ChatRequest) -> harness_core::Result<ChatResponse> {
        let wire = self.wire_request(&request);
        let answer = self
            .chat(&request.purpose, wire)
            .await
            .map_err(|e| e.into_chat(&self.name))?;
        let choice = &answer.choices[0];
        Ok(ChatResponse {
            text: assistant_text(&choice.message),
            usage: answer.usage.map(|u| Usage {
                prompt_tokens: u.prompt_tokens,
                completion_tokens: u.completion_tokens,
            }),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness_core::ChatMessage;

    #[test]
    fn json_requests_ask_for_a_json_object() {
        let client = ChatClient::new(ChatClientConfig::new("http://127.0.0.1:9/v1", "m")).unwrap();
        let mut request = ChatRequest::new("analyst", vec![ChatMessage::user("JSON please")]);
        let plain = serde_json::to_value(client.wire_request(&request)).unwrap();
        assert!(plain.get("response_format").is_none(), "{plain}");
        request.format = OutputFormat::JsonObject;
        let json = serde_json::to_value(client.wire_request(&request)).unwrap();
        assert_eq!(
            json["response_format"],
            serde_json::json!({"type": "json_object"})
        );
    }

    #[test]
    fn wire_requests_carry_the_limit_in_the_configured_field() {
        let mut config = ChatClientConfig::new("http://127.0.0.1:1/v1", "m");
        config.stop = vec!["</answer>".into()];
        let client = ChatClient::new(config.clone()).unwrap();
        let mut request = ChatRequest::new("voter", vec![ChatMessage::user("rank")]);
        request.max_tokens = 77;
        request.seed = Some(3);
        let wire = client.wire_request(&request);
        assert_eq!(
            (wire.max_tokens, wire.max_completion_tokens),
            (Some(77), None)
        );
        assert_eq!(wire.seed, Some(3));
        assert_eq!(wire.stop, Some(StopField::Many(vec!["</answer>".into()])));
        config.use_max_completion_tokens = true;
        let wire = ChatClient::new(config).unwrap().wire_request(&request);
        assert_eq!(
            (wire.max_tokens, wire.max_completion_tokens),
            (None, Some(77))
        );
        assert!(
            ChatClient::new(ChatClientConfig::new("http://x/v1", " "))
                .unwrap_err()
                .to_string()
                .contains("model")
        );
    }
}
