//! Asking a [`ChatModel`] for a JSON answer: extraction, validation, bounded retries, usage.

use harness_core::{ChatMessage, ChatModel, ChatRequest, OutputFormat};
use serde_json::Value;

use crate::usage::UsageCell;

/// The JSON object in a model's answer: a fenced ```json block, or the outermost `{...}`.
pub fn extract_json(text: &str) -> Result<Value, String> {
    let body = match text.find("```") {
        Some(start) => {
            let rest = &text[start + 3..];
            let rest = rest.strip_prefix("json").unwrap_or(rest);
            match rest.find("```") {
                Some(end) => &rest[..end],
                None => rest,
            }
        }
        None => text,
    };
    let (Some(open), Some(close)) = (body.find('{'), body.rfind('}')) else {
        return Err("the answer holds no JSON object".into());
    };
    if close < open {
        return Err("the answer holds no JSON object".into());
    }
    serde_json::from_str(&body[open..=close]).map_err(|e| format!("the JSON does not parse: {e}"))
}

/// Settings of one question to a model.
pub struct Ask<'a> {
    /// The role (`analyst`, `editor`), also the request's purpose.
    pub role: &'a str,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// Malformed answers retried before giving up.
    pub retries: usize,
    /// Sampling temperature.
    pub temperature: f32,
    /// Seed for providers that honour one.
    pub seed: Option<u64>,
    /// Cap on the answer's tokens (`None`: [`ChatRequest::new`]'s).
    pub max_tokens: Option<usize>,
    /// Where usage is counted.
    pub usage: &'a UsageCell,
}

/// Ask until `validate` accepts the answer, at most `1 + retries` calls. Each rejection is
/// shown to the model with its reason. Returns `None` when the budget runs out or the model
/// fails as infrastructure; both are counted and logged, never raised, so that one bad answer
/// does not stop a round.
pub async fn ask_json<T>(
    model: &dyn ChatModel,
    mut ask: Ask<'_>,
    validate: impl Fn(&Value) -> Result<T, String>,
) -> Option<T> {
    for attempt in 0..=ask.retries {
        let mut request = ChatRequest::new(ask.role, ask.messages.clone());
        request.temperature = ask.temperature;
        request.seed = ask.seed.map(|s| s.wrapping_add(attempt as u64));
        if let Some(max) = ask.max_tokens {
            request.max_tokens = max;
        }
        // Engines with constrained decoding then return parseable JSON; the answer is
        // validated all the same.
        request.format = OutputFormat::JsonObject;
        let response = match model.complete(request).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(
                    role = ask.role,
                    model = model.name(),
                    "model call failed: {e}"
                );
                ask.usage.update(|u| {
                    u.errors += 1;
                    u.skipped += 1;
                });
                return None;
            }
        };
        ask.usage.update(|u| {
            u.calls += 1;
            match response.usage {
                Some(usage) => {
                    u.prompt_tokens += usage.prompt_tokens;
                    u.completion_tokens += usage.completion_tokens;
                }
                None => u.calls_without_usage += 1,
            }
        });
        let verdict = extract_json(&response.text).and_then(|v| validate(&v));
        match verdict {
            Ok(value) => return Some(value),
            Err(reason) => {
                tracing::warn!(role = ask.role, attempt, "malformed answer: {reason}");
                ask.usage.update(|u| u.malformed += 1);
                ask.messages.push(ChatMessage::assistant(response.text));
                ask.messages.push(ChatMessage::user(format!(
                    "That answer was rejected: {reason}. Reply again with only the corrected JSON object."
                )));
            }
        }
    }
    ask.usage.update(|u| u.skipped += 1);
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extracts_fenced_and_bare_json() {
        assert_eq!(
            extract_json("x ```json\n{\"a\": 1}\n``` y").unwrap()["a"],
            1
        );
        assert_eq!(
            extract_json("sure: {\"a\": {\"b\": 2}} done").unwrap()["a"]["b"],
            2
        );
        assert!(extract_json("no json here").is_err());
        assert!(extract_json("{not json}").is_err());
        assert!(extract_json("} {").is_err());
    }
}
