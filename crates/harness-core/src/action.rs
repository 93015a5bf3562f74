//! The action protocol: turning a policy's text into tool calls.
//!
//! The default format is the one Qwen models are trained on: each call is a JSON object inside
//! `<tool_call>...</tool_call>`. Text without any call block is the policy's final answer.
//! Environments may supply other formats through [`crate::EnvSession::action_parser`].

use serde::{Deserialize, Serialize};

use crate::env::ToolSpec;

/// One call of a tool with JSON arguments.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolCall {
    /// The tool's name.
    pub name: String,
    /// Its arguments (a JSON object).
    pub arguments: serde_json::Value,
}

impl ToolCall {
    /// A call of `name` with `arguments`.
    pub fn new(name: impl Into<String>, arguments: serde_json::Value) -> Self {
        ToolCall {
            name: name.into(),
            arguments,
        }
    }

    /// A canonical text form (sorted keys) used to detect repeated actions.
    pub fn canonical(&self) -> String {
        format!(
            "{}({})",
            self.name,
            crate::harness::canonical_json(&self.arguments)
        )
    }

    /// The call in the `<tool_call>` format.
    pub fn to_tool_call_block(&self) -> String {
        let body = serde_json::json!({ "name": self.name, "arguments": self.arguments });
        format!("<tool_call>\n{body}\n</tool_call>")
    }
}

/// What a policy turn asks for.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParsedAction {
    /// Call these tools in order.
    Calls(Vec<ToolCall>),
    /// Finish the episode with this answer.
    Final(String),
    /// The text looks like an action but is malformed; the reason is shown to the policy.
    Invalid(String),
}

/// Parses a turn's text into an action.
pub trait ActionParser: Send + Sync {
    /// The format's name, as a harness's `tool_view.format` names it.
    fn format(&self) -> &str;

    /// Parse one turn. Never panics; malformed text is [`ParsedAction::Invalid`].
    fn parse(&self, text: &str, tools: &[ToolSpec]) -> ParsedAction;
}

/// The `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` format.
#[derive(Debug, Clone, Copy, Default)]
pub struct ToolCallParser;

/// The name of the default action format.
pub const TOOL_CALL_FORMAT: &str = "tool_call";

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

impl ActionParser for ToolCallParser {
    fn format(&self) -> &str {
        TOOL_CALL_FORMAT
    }

    fn parse(&self, text: &str, _tools: &[ToolSpec]) -> ParsedAction {
        // Text before the first block (reasoning, `<think>` sections) is allowed; so is text
        // between blocks. A closing tag without an opening one, or the reverse, is malformed.
        let mut calls = Vec::new();
        let mut rest = text;
        loop {
            let Some(start) = rest.find(OPEN) else {
                if rest.contains(CLOSE) {
                    return ParsedAction::Invalid(format!("found `{CLOSE}` without `{OPEN}`"));
                }
                break;
            };
            if rest[..start].contains(CLOSE) {
                return ParsedAction::Invalid(format!("found `{CLOSE}` without `{OPEN}`"));
            }
            let body_start = start + OPEN.len();
            let Some(len) = rest[body_start..].find(CLOSE) else {
                return ParsedAction::Invalid(format!("`{OPEN}` is never closed by `{CLOSE}`"));
            };
            let body = rest[body_start..body_start + len].trim();
            match parse_call_body(body) {
                Ok(call) => calls.push(call),
                Err(reason) => return ParsedAction::Invalid(reason),
            }
            rest = &rest[body_start + len + CLOSE.len()..];
        }
        if calls.is_empty() {
            ParsedAction::Final(strip_think(text).trim().to_string())
        } else {
            ParsedAction::Calls(calls)
        }
    }
}

/// Drops a leading `<think>...</think>` section, which is reasoning, not the answer.
fn strip_think(text: &str) -> &str {
    match (text.find("<think>"), text.find("</think>")) {
        (Some(open), Some(close)) if open < close => &text[close + "</think>".len()..],
        _ => text,
    }
}

fn parse_call_body(body: &str) -> Result<ToolCall, String> {
    let value: serde_json::Value =
        serde_json::from_str(body).map_err(|e| format!("the tool call is not valid JSON ({e})"))?;
    let serde_json::Value::Object(mut object) = value else {
        return Err("the tool call must be a JSON object with `name` and `arguments`".into());
    };
    let name = match object.remove("name") {
        Some(serde_json::Value::String(name)) if !name.is_empty() => name,
        Some(_) => return Err("the tool call's `name` must be a non-empty string".into()),
        None => return Err("the tool call has no `name`".into()),
    };
    let arguments = match object.remove("arguments") {
        None | Some(serde_json::Value::Null) => serde_json::Value::Object(Default::default()),
        // Some models emit the arguments as a JSON string; accept it when it holds an object.
        Some(serde_json::Value::String(s)) => match serde_json::from_str(&s) {
            Ok(serde_json::Value::Object(map)) => serde_json::Value::Object(map),
            _ => return Err("the tool call's `arguments` must be a JSON object".into()),
        },
        Some(value @ serde_json::Value::Object(_)) => value,
        Some(_) => return Err("the tool call's `arguments` must be a JSON object".into()),
    };
    if let Some(extra) = object.keys().next() {
        return Err(format!(
            "the tool call has an unexpected field `{extra}`; expected only `name` and `arguments`"
        ));
    }
    Ok(ToolCall { name, arguments })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(text: &str) -> ParsedAction {
        ToolCallParser.parse(text, &[])
    }

    #[test]
    fn parses_one_and_many_calls() {
        let one = parse(
            "thinking\n<tool_call>\n{\"name\": \"ls\", \"arguments\": {\"page\": 2}}\n</tool_call>",
        );
        assert_eq!(
            one,
            ParsedAction::Calls(vec![ToolCall::new("ls", json!({"page": 2}))])
        );
        let two = parse(
            "<tool_call>{\"name\":\"a\",\"arguments\":{}}</tool_call> and <tool_call>{\"name\":\"b\"}</tool_call>",
        );
        assert_eq!(
            two,
            ParsedAction::Calls(vec![
                ToolCall::new("a", json!({})),
                ToolCall::new("b", json!({}))
            ])
        );
    }

    #[test]
    fn text_without_calls_is_final_answer() {
        assert_eq!(
            parse("<think>hmm</think> The answer is 4."),
            ParsedAction::Final("The answer is 4.".into())
        );
    }

    #[test]
    fn malformed_calls_are_invalid() {
        for bad in [
            "<tool_call>{\"name\": \"a\"",
            "<tool_call>not json</tool_call>",
            "<tool_call>[1,2]</tool_call>",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"a\", \"arguments\": 3}</tool_call>",
            "<tool_call>{\"name\": \"a\", \"x\": 1}</tool_call>",
            "done </tool_call>",
        ] {
            assert!(matches!(parse(bad), ParsedAction::Invalid(_)), "{bad}");
        }
    }

    #[test]
    fn round_trips_through_block() {
        let call = ToolCall::new("mail.list", json!({"page": 1, "folder": "spam"}));
        assert_eq!(
            parse(&call.to_tool_call_block()),
            ParsedAction::Calls(vec![call])
        );
    }
}
