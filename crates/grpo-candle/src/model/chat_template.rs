//! ChatML chat templates (Qwen's and those of other ChatML models), rendered natively.
//!
//! The flavours, matching what the public Qwen2.5 and Qwen3 `tokenizer_config.json` templates
//! produce for text messages:
//!
//! * [`ChatTemplate::Qwen25`]: a default system prompt ("You are Qwen, created by Alibaba Cloud.
//!   You are a helpful assistant.") when the conversation has none; assistant text verbatim.
//! * [`ChatTemplate::ChatMlWithSystem`]: the same with another default system prompt, read from
//!   the checkpoint's template (SmolLM2-Instruct: "You are a helpful AI assistant named SmolLM,
//!   trained by Hugging Face"). Such templates usually know no tools; tools and tool responses are
//!   rendered the Qwen way, which is what the harness's tool-call parser reads.
//! * [`ChatTemplate::ChatMl`]: the same turns without a default system prompt or think handling
//!   (the locally created tiny policy; saved with an equivalent Jinja template).
//! * [`ChatTemplate::Qwen3`]: no default system prompt; assistant turns after the last real user
//!   query show their reasoning as a `<think>` block (turns before it lose it); with
//!   `enable_thinking: Some(false)` the generation prompt carries an empty think block.
//!
//! Common to both: each turn is `<|im_start|>{role}\n{content}<|im_end|>\n`; tools are listed in
//! the system turn inside `<tools></tools>`, one JSON object per line as Python's `json.dumps`
//! writes it (`", "` and `": "` separators, non-ASCII kept); consecutive tool responses are
//! grouped into one user turn of `<tool_response>` blocks; the generation prompt is
//! `<|im_start|>assistant\n`. Assistant messages hold the raw generated text, tool calls included,
//! so a turn's prompt extends the previous prompt plus the generated tokens.
//!
//! JSON object keys are written in the order `serde_json::Value` iterates them (sorted, unless the
//! build enables serde_json's `preserve_order`); Python keeps insertion order, so token-exact
//! agreement with `transformers` needs schemas whose keys are already sorted.

use harness_core::{ChatMessage, Role, ToolSpec};
use serde_json::Value;

/// The default system prompt of the Qwen2.5 template.
pub const QWEN25_DEFAULT_SYSTEM: &str =
    "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

const TOOLS_HEADER: &str = "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>";
const TOOLS_FOOTER: &str = "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call>";

/// Marker that identifies [`ChatTemplate::ChatMl`] in a saved `chat_template`.
pub const CHATML_MARKER: &str = "{#- harness-s chatml -#}";

/// A Jinja rendering of [`ChatTemplate::ChatMl`], saved in `tokenizer_config.json` so that
/// `transformers` and vLLM render prompts exactly as this crate does (tool JSON aside, whose key
/// order follows the caller's dicts there).
pub const CHATML_JINJA: &str = concat!(
    "{#- harness-s chatml -#}\n",
    "{%- set sys = messages[0].content if (messages and messages[0].role == 'system') else none -%}\n",
    "{%- if tools -%}\n",
    "{{- '<|im_start|>system\\n' -}}\n",
    "{%- if sys is not none -%}{{- sys + '\\n\\n' -}}{%- endif -%}\n",
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>' -}}\n",
    "{%- for t in tools -%}{{- '\\n' -}}{{- t | tojson -}}{%- endfor -%}\n",
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' -}}\n",
    "{%- elif sys is not none -%}{{- '<|im_start|>system\\n' + sys + '<|im_end|>\\n' -}}\n",
    "{%- endif -%}\n",
    "{%- for m in messages -%}\n",
    "{%- if m.role == 'system' and loop.first -%}\n",
    "{%- elif m.role == 'tool' -%}\n",
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}\n",
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' -}}\n",
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}\n",
    "{%- else -%}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' -}}\n",
    "{%- endif -%}\n",
    "{%- endfor -%}\n",
    "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}\n",
);

/// Which Qwen chat template to render.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChatTemplate {
    /// Plain ChatML with Qwen's tool block and tool-response turns, no default system prompt and
    /// no think handling: the template of the locally created tiny policy ([`CHATML_JINJA`]).
    ChatMl,
    /// Qwen2 / Qwen2.5 instruct models.
    Qwen25,
    /// ChatML with a default system prompt when the conversation has none (as Qwen2.5, with
    /// another prompt).
    ChatMlWithSystem {
        /// The system prompt of conversations that bring none.
        default_system: String,
    },
    /// Qwen3 models. `enable_thinking: Some(false)` appends an empty think block to the
    /// generation prompt (the template's `enable_thinking=False`); `None` or `Some(true)` leaves
    /// thinking to the model.
    Qwen3 {
        /// The template's `enable_thinking` variable (`None` = undefined).
        enable_thinking: Option<bool>,
    },
}

impl Default for ChatTemplate {
    fn default() -> Self {
        ChatTemplate::Qwen3 {
            enable_thinking: None,
        }
    }
}

fn role_name(role: Role) -> &'static str {
    match role {
        Role::System => "system",
        Role::User => "user",
        Role::Assistant => "assistant",
        Role::Tool => "tool",
    }
}

impl ChatTemplate {
    /// Pick a template from a checkpoint's `chat_template` text when there is one, else from the
    /// model type (`qwen2` -> Qwen2.5, `llama` and `mistral` -> plain ChatML, otherwise Qwen3).
    ///
    /// Among ChatML templates: Qwen3's (think handling), Qwen2.5's (its default system prompt),
    /// one that writes a fixed system turn `<|im_start|>system\n...<|im_end|>` as one literal
    /// ([`ChatTemplate::ChatMlWithSystem`] with that text), any other ChatML one
    /// ([`ChatTemplate::ChatMl`]).
    pub fn detect(chat_template: Option<&str>, model_type: &str) -> Self {
        match chat_template {
            Some(t) if t.contains(CHATML_MARKER) => ChatTemplate::ChatMl,
            Some(t) if t.contains("enable_thinking") || t.contains("last_query_index") => {
                ChatTemplate::Qwen3 {
                    enable_thinking: None,
                }
            }
            Some(t) if t.contains("You are Qwen, created by Alibaba Cloud") => ChatTemplate::Qwen25,
            Some(t) if Self::is_chatml(t) => match literal_system_turn(t) {
                Some(default_system) => ChatTemplate::ChatMlWithSystem { default_system },
                None => ChatTemplate::ChatMl,
            },
            _ if model_type == "qwen2" => ChatTemplate::Qwen25,
            _ if model_type == "llama" || model_type == "mistral" => ChatTemplate::ChatMl,
            _ => ChatTemplate::Qwen3 {
                enable_thinking: None,
            },
        }
    }

    /// Whether a Jinja chat template writes ChatML turns (`<|im_start|>`), the only kind this
    /// module renders.
    pub fn is_chatml(chat_template: &str) -> bool {
        chat_template.contains("<|im_start|>")
    }

    /// The system prompt added to conversations that bring none.
    pub fn default_system(&self) -> Option<&str> {
        match self {
            ChatTemplate::Qwen25 => Some(QWEN25_DEFAULT_SYSTEM),
            ChatTemplate::ChatMlWithSystem { default_system } => Some(default_system),
            ChatTemplate::ChatMl | ChatTemplate::Qwen3 { .. } => None,
        }
    }

    /// Render a conversation (and the tools shown to the model) to the prompt text.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        add_generation_prompt: bool,
    ) -> String {
        let mut out = String::new();
        let first_is_system = messages.first().is_some_and(|m| m.role == Role::System);
        // The system turn (with the tool list when there are tools).
        let default_system = self.default_system();
        if !tools.is_empty() {
            out.push_str("<|im_start|>system\n");
            let system = if first_is_system {
                Some(messages[0].content.as_str())
            } else {
                default_system
            };
            if let Some(system) = system {
                out.push_str(system);
                out.push_str("\n\n");
            }
            out.push_str(TOOLS_HEADER);
            for tool in tools {
                out.push('\n');
                out.push_str(&tool_json(tool));
            }
            out.push_str(TOOLS_FOOTER);
            out.push_str("<|im_end|>\n");
        } else if first_is_system {
            push_turn(&mut out, "system", &messages[0].content);
        } else if let Some(system) = default_system {
            push_turn(&mut out, "system", system);
        }

        // Qwen3: the last user message that is a real query (not wrapped tool output).
        let last_query = messages
            .iter()
            .rposition(|m| {
                m.role == Role::User
                    && !(m.content.starts_with("<tool_response>")
                        && m.content.ends_with("</tool_response>"))
            })
            .unwrap_or(messages.len().saturating_sub(1));

        for (i, msg) in messages.iter().enumerate() {
            let is_last = i + 1 == messages.len();
            match msg.role {
                Role::System if i == 0 => {}
                Role::System | Role::User => push_turn(&mut out, role_name(msg.role), &msg.content),
                Role::Assistant => {
                    out.push_str("<|im_start|>assistant\n");
                    match self {
                        ChatTemplate::Qwen25
                        | ChatTemplate::ChatMl
                        | ChatTemplate::ChatMlWithSystem { .. } => out.push_str(&msg.content),
                        ChatTemplate::Qwen3 { .. } => {
                            let (reasoning, content) = split_think(&msg.content);
                            if i > last_query && (is_last || !reasoning.is_empty()) {
                                out.push_str("<think>\n");
                                out.push_str(reasoning.trim_matches('\n'));
                                out.push_str("\n</think>\n\n");
                                out.push_str(content.trim_start_matches('\n'));
                            } else {
                                out.push_str(content);
                            }
                        }
                    }
                    out.push_str("<|im_end|>\n");
                }
                Role::Tool => {
                    let prev_tool = i > 0 && messages[i - 1].role == Role::Tool;
                    let next_tool = messages.get(i + 1).is_some_and(|m| m.role == Role::Tool);
                    if !prev_tool {
                        out.push_str("<|im_start|>user");
                    }
                    out.push_str("\n<tool_response>\n");
                    out.push_str(&msg.content);
                    out.push_str("\n</tool_response>");
                    if !next_tool {
                        out.push_str("<|im_end|>\n");
                    }
                }
            }
        }
        if add_generation_prompt {
            out.push_str("<|im_start|>assistant\n");
            if *self
                == (ChatTemplate::Qwen3 {
                    enable_thinking: Some(false),
                })
            {
                out.push_str("<think>\n\n</think>\n\n");
            }
        }
        out
    }
}

/// The text of a fixed system turn a template writes as one string literal
/// (`'<|im_start|>system\nYou are ...<|im_end|>\n'`), with the newline written either as a
/// newline or as Jinja's `\n` escape. `None` when the system turn is built from variables.
fn literal_system_turn(template: &str) -> Option<String> {
    for open in ["<|im_start|>system\n", "<|im_start|>system\\n"] {
        let Some(start) = template.find(open) else {
            continue;
        };
        let rest = &template[start + open.len()..];
        let end = rest.find("<|im_end|>")?;
        let text = &rest[..end];
        let literal = !text.is_empty()
            && !text.contains(['\'', '"', '{', '}', '+', '\\'])
            && !text.contains('\n');
        return literal.then(|| text.to_string());
    }
    None
}

fn push_turn(out: &mut String, role: &str, content: &str) {
    out.push_str("<|im_start|>");
    out.push_str(role);
    out.push('\n');
    out.push_str(content);
    out.push_str("<|im_end|>\n");
}

/// Qwen3's split of an assistant message into (reasoning, visible content) when it contains
/// `</think>`: reasoning is what precedes the first `</think>` (after any `<think>`), the content
/// what follows the last one.
fn split_think(content: &str) -> (&str, &str) {
    let Some(first_close) = content.find("</think>") else {
        return ("", content);
    };
    let before = &content[..first_close];
    let before = before.trim_end_matches('\n');
    let reasoning = match before.rfind("<think>") {
        Some(p) => &before[p + "<think>".len()..],
        None => before,
    };
    let last_close = content.rfind("</think>").expect("found above");
    let visible = &content[last_close + "</think>".len()..];
    (
        reasoning.trim_start_matches('\n'),
        visible.trim_start_matches('\n'),
    )
}

/// The tool as the templates list it: `{"type": "function", "function": {name, description,
/// parameters}}`, in Python `json.dumps` style.
pub fn tool_json(tool: &ToolSpec) -> String {
    let mut s = String::from("{\"type\": \"function\", \"function\": {\"name\": ");
    write_json_string(&mut s, &tool.name);
    s.push_str(", \"description\": ");
    write_json_string(&mut s, &tool.description);
    s.push_str(", \"parameters\": ");
    write_python_json(&mut s, &tool.parameters);
    s.push_str("}}");
    s
}

/// JSON as Python's `json.dumps(v, ensure_ascii=False)` writes it: `", "` between items, `": "`
/// after keys, non-ASCII characters unescaped.
pub fn python_json(value: &Value) -> String {
    let mut s = String::new();
    write_python_json(&mut s, value);
    s
}

fn write_python_json(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&python_number(n)),
        Value::String(s) => write_json_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_python_json(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => {
            out.push('{');
            for (i, (k, v)) in map.iter().enumerate() {
                if i > 0 {
                    out.push_str(", ");
                }
                write_json_string(out, k);
                out.push_str(": ");
                write_python_json(out, v);
            }
            out.push('}');
        }
    }
}

/// Python's float repr differs from serde_json's for exponents (`1e+20` vs `1e20`).
fn python_number(n: &serde_json::Number) -> String {
    if n.is_f64() {
        let f = n.as_f64().unwrap_or(0.0);
        let s = n.to_string();
        if f.is_finite() && f.abs() >= 1e16 || (f != 0.0 && f.abs() < 1e-4) {
            // Python uses exponent notation with a signed two-digit exponent.
            let e = format!("{f:e}");
            if let Some((mant, exp)) = e.split_once('e') {
                let (sign, digits) = match exp.strip_prefix('-') {
                    Some(d) => ('-', d),
                    None => ('+', exp),
                };
                return format!("{mant}e{sign}{digits:0>2}");
            }
        }
        s
    } else {
        n.to_string()
    }
}

fn write_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness_core::ToolKind;
    use serde_json::json;

    fn tool() -> ToolSpec {
        ToolSpec {
            name: "execute_sql".into(),
            description: "Run one SQL statement.".into(),
            parameters: json!({"properties": {"query": {"type": "string"}}, "required": ["query"], "type": "object"}),
            kind: ToolKind::default(),
        }
    }

    const TOOL_LINE: &str = r#"{"type": "function", "function": {"name": "execute_sql", "description": "Run one SQL statement.", "parameters": {"properties": {"query": {"type": "string"}}, "required": ["query"], "type": "object"}}}"#;

    fn agent_conversation() -> Vec<ChatMessage> {
        vec![
            ChatMessage::system("Solve the task."),
            ChatMessage::user("How many users?"),
            ChatMessage::assistant(
                "<tool_call>\n{\"name\": \"execute_sql\", \"arguments\": {\"query\": \"SELECT count(*) FROM users\"}}\n</tool_call>",
            ),
            ChatMessage::tool("execute_sql", "[[3]]"),
            ChatMessage::tool("execute_sql", "ok"),
        ]
    }

    #[test]
    fn qwen3_tools_and_tool_responses() {
        let got = ChatTemplate::default().render(&agent_conversation(), &[tool()], true);
        let want = format!(
            "<|im_start|>system\nSolve the task.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{TOOL_LINE}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call><|im_end|>\n\
<|im_start|>user\nHow many users?<|im_end|>\n\
<|im_start|>assistant\n<tool_call>\n{{\"name\": \"execute_sql\", \"arguments\": {{\"query\": \"SELECT count(*) FROM users\"}}}}\n</tool_call><|im_end|>\n\
<|im_start|>user\n<tool_response>\n[[3]]\n</tool_response>\n<tool_response>\nok\n</tool_response><|im_end|>\n\
<|im_start|>assistant\n"
        );
        assert_eq!(got, want);
    }

    #[test]
    fn qwen25_default_system_and_no_tools() {
        let msgs = vec![
            ChatMessage::user("Hi"),
            ChatMessage::assistant("Hello!"),
            ChatMessage::user("Bye"),
        ];
        let got = ChatTemplate::Qwen25.render(&msgs, &[], true);
        assert_eq!(
            got,
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n<|im_start|>assistant\n"
        );
        // Qwen3 adds no default system prompt.
        let got = ChatTemplate::default().render(&msgs, &[], false);
        assert_eq!(
            got,
            "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        );
    }

    #[test]
    fn qwen25_tools_without_system_use_the_default() {
        let got = ChatTemplate::Qwen25.render(&[ChatMessage::user("q")], &[tool()], true);
        assert!(got.starts_with(&format!(
            "<|im_start|>system\n{QWEN25_DEFAULT_SYSTEM}\n\n# Tools\n\nYou may call"
        )));
        let got3 = ChatTemplate::default().render(&[ChatMessage::user("q")], &[tool()], true);
        assert!(got3.starts_with("<|im_start|>system\n# Tools\n\nYou may call"));
        assert!(got3.ends_with(
            "</tool_call><|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n"
        ));
    }

    #[test]
    fn qwen3_thinking_rules() {
        let msgs = vec![
            ChatMessage::user("first"),
            ChatMessage::assistant("<think>\nold reasoning\n</think>\n\nold answer"),
            ChatMessage::user("second"),
            ChatMessage::assistant("<think>\nplan\n</think>\n\n<tool_call>x</tool_call>"),
            ChatMessage::tool("t", "r"),
            // The last message: shown with a (here empty) think block, as the template does.
            ChatMessage::assistant("no think here"),
        ];
        let got = ChatTemplate::Qwen3 {
            enable_thinking: Some(false),
        }
        .render(&msgs, &[], true);
        assert_eq!(
            got,
            "<|im_start|>user\nfirst<|im_end|>\n\
<|im_start|>assistant\nold answer<|im_end|>\n\
<|im_start|>user\nsecond<|im_end|>\n\
<|im_start|>assistant\n<think>\nplan\n</think>\n\n<tool_call>x</tool_call><|im_end|>\n\
<|im_start|>user\n<tool_response>\nr\n</tool_response><|im_end|>\n\
<|im_start|>assistant\n<think>\n\n</think>\n\nno think here<|im_end|>\n\
<|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
        // A final assistant message after the query always shows a (possibly empty) think block.
        let last = ChatTemplate::default().render(&msgs[..2], &[], false);
        assert!(last.ends_with(
            "<|im_start|>assistant\n<think>\nold reasoning\n</think>\n\nold answer<|im_end|>\n"
        ));
        let bare = ChatTemplate::default().render(
            &[ChatMessage::user("a"), ChatMessage::assistant("b")],
            &[],
            false,
        );
        assert!(bare.ends_with("<|im_start|>assistant\n<think>\n\n</think>\n\nb<|im_end|>\n"));
    }

    #[test]
    fn prompt_of_next_turn_extends_previous_prompt_and_output() {
        let template = ChatTemplate::default();
        let mut msgs = vec![ChatMessage::system("s"), ChatMessage::user("u")];
        let p1 = template.render(&msgs, &[tool()], true);
        let generated = "<tool_call>\n{\"name\": \"execute_sql\", \"arguments\": {}}\n</tool_call>";
        msgs.push(ChatMessage::assistant(generated));
        msgs.push(ChatMessage::tool("execute_sql", "[]"));
        let p2 = template.render(&msgs, &[tool()], true);
        assert!(p2.starts_with(&format!("{p1}{generated}<|im_end|>")));
    }

    #[test]
    fn python_json_style() {
        let v = json!({"b": [1, 2.5, "ü\n\"x\""], "a": {"c": null, "d": true}, "e": 1e20});
        assert_eq!(
            python_json(&v),
            r#"{"a": {"c": null, "d": true}, "b": [1, 2.5, "ü\n\"x\""], "e": 1e+20}"#
        );
        assert_eq!(python_json(&json!(1.5e-7)), "1.5e-07");
        assert_eq!(python_json(&json!("\u{1}")), r#""\u0001""#);
    }

    /// SmolLM2-135M-Instruct's template, as its GGUF file and `tokenizer_config.json` carry it.
    const SMOLLM2: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_with_a_literal_default_system_prompt() {
        let smol = ChatTemplate::detect(Some(SMOLLM2), "llama");
        let system = "You are a helpful AI assistant named SmolLM, trained by Hugging Face";
        assert_eq!(
            smol,
            ChatTemplate::ChatMlWithSystem {
                default_system: system.into()
            }
        );
        // The same with Jinja's escaped newline.
        let escaped = SMOLLM2.replace("system\n", "system\\n");
        assert_eq!(ChatTemplate::detect(Some(&escaped), "llama"), smol);
        let got = smol.render(&[ChatMessage::user("Hi")], &[], true);
        assert_eq!(
            got,
            format!(
                "<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
            )
        );
        // A system message replaces the default, with or without tools.
        let own = smol.render(
            &[ChatMessage::system("S"), ChatMessage::user("Hi")],
            &[],
            false,
        );
        assert!(own.starts_with("<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nHi"));
        let with_tools = smol.render(&[ChatMessage::user("q")], &[tool()], true);
        assert!(with_tools.starts_with(&format!("<|im_start|>system\n{system}\n\n# Tools\n")));
        // A system turn built from variables is no literal default.
        let variable = "{{ '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}";
        assert_eq!(
            ChatTemplate::detect(Some(variable), "llama"),
            ChatTemplate::ChatMl
        );
        // Without a template a Llama model gets plain ChatML; a Llama-3 template is not ChatML.
        assert_eq!(ChatTemplate::detect(None, "llama"), ChatTemplate::ChatMl);
        assert!(!ChatTemplate::is_chatml(
            "<|start_header_id|>user<|end_header_id|>"
        ));
    }

    #[test]
    fn detect_picks_the_flavour() {
        assert_eq!(ChatTemplate::detect(None, "qwen2"), ChatTemplate::Qwen25);
        assert_eq!(ChatTemplate::detect(None, "qwen3"), ChatTemplate::default());
        assert_eq!(
            ChatTemplate::detect(Some("{%- if enable_thinking is defined %}"), "qwen2"),
            ChatTemplate::default()
        );
        assert_eq!(
            ChatTemplate::detect(Some(CHATML_JINJA), "qwen3"),
            ChatTemplate::ChatMl
        );
    }
}
