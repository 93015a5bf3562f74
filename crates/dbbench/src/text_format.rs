//! The classic AgentBench DBBench action format:
//!
//! ````text
//! Action: Operation
//! ```sql
//! SELECT COUNT(*) FROM `Game Schedule` WHERE Opponent = 'Athlone Town';
//! ```
//! ````
//!
//! and, to finish, `Action: Answer` followed by `Final Answer: ["answer 1", "answer 2"]`.
//! Turns become calls of `execute_sql` and `commit_final_answer`.

use harness_core::{ActionParser, ParsedAction, ToolCall, ToolSpec};
use serde_json::json;

use super::answer::parse_answer_list;
use super::{COMMIT_TOOL, SQL_TOOL};

/// The name harnesses use to select this format (`tool_view.format`).
pub const TEXT_FORMAT: &str = "dbbench_text";

/// Parser of the classic `Action: Operation` / `Action: Answer` format.
#[derive(Debug, Clone, Copy, Default)]
pub struct DbBenchTextParser;

const HELP: &str = "expected `Action: Operation` followed by the SQL in a ```sql code block, or `Action: Answer` followed by `Final Answer: [\"...\"]`";

/// Drops `<think>...</think>` reasoning.
fn strip_think(text: &str) -> &str {
    match (text.find("<think>"), text.find("</think>")) {
        (Some(open), Some(close)) if open < close => &text[close + "</think>".len()..],
        (None, Some(close)) => &text[close + "</think>".len()..],
        _ => text,
    }
}

/// Byte offset of the marker `needle` in `hay`, ignoring ASCII case; the marker must not
/// continue a word (`Action:` is found in "Action:" and "**Action:**", not in "transaction:").
fn find_ci(hay: &str, needle: &str) -> Option<usize> {
    let hay_lower = hay.to_ascii_lowercase();
    let needle = needle.to_ascii_lowercase();
    let mut from = 0;
    while let Some(offset) = hay_lower[from..].find(&needle) {
        let at = from + offset;
        let starts_word = hay_lower[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !c.is_alphanumeric());
        if starts_word {
            return Some(at);
        }
        from = at + needle.len();
    }
    None
}

/// The first fenced code block: its body, without the language tag.
fn code_block(text: &str) -> Option<&str> {
    let open = text.find("```")?;
    let after = &text[open + 3..];
    // The info string (`sql`, `SQL`, `mysql`) runs to the end of the line.
    let line_end = after.find('\n');
    let info = after[..line_end.unwrap_or(after.len())].trim();
    if line_end.is_none() || !info.chars().all(|c| c.is_ascii_alphanumeric()) {
        // ```SELECT 1``` on one line: everything up to the closing fence is the body.
        let close = after.find("```")?;
        let body = after[..close].trim_start();
        for tag in ["sql", "mysql", "sqlite"] {
            if let (Some(head), Some(rest)) = (body.get(..tag.len()), body.get(tag.len()..))
                && head.eq_ignore_ascii_case(tag)
                && rest.starts_with(char::is_whitespace)
            {
                return Some(rest);
            }
        }
        return Some(body);
    }
    let body_start = line_end? + 1;
    let body = &after[body_start..];
    let close = body.find("```")?;
    Some(&body[..close])
}

/// The answer after `Final Answer:`: a bracketed list (which may span lines) or the rest of
/// the line.
fn final_answer(text: &str) -> Option<Vec<String>> {
    let at = find_ci(text, "final answer:")?;
    let rest = text[at + "final answer:".len()..].trim_start();
    if rest.starts_with('[') {
        let mut depth = 0i32;
        let mut quote: Option<char> = None;
        let mut escaped = false;
        for (i, c) in rest.char_indices() {
            if let Some(q) = quote {
                if escaped {
                    escaped = false;
                } else if c == '\\' {
                    escaped = true;
                } else if c == q {
                    quote = None;
                }
                continue;
            }
            match c {
                '\'' | '"' => quote = Some(c),
                '[' => depth += 1,
                ']' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(parse_answer_list(&rest[..=i]));
                    }
                }
                _ => {}
            }
        }
    }
    let line = rest.lines().next().unwrap_or("").trim();
    Some(parse_answer_list(line))
}

impl ActionParser for DbBenchTextParser {
    fn format(&self) -> &str {
        TEXT_FORMAT
    }

    fn parse(&self, text: &str, _tools: &[ToolSpec]) -> ParsedAction {
        let text = strip_think(text);
        let action = find_ci(text, "action:").map(|at| {
            let rest = &text[at + "action:".len()..];
            let line = rest.lines().next().unwrap_or("");
            (
                line.trim()
                    .trim_matches(|c: char| !c.is_alphanumeric())
                    .to_ascii_lowercase(),
                at,
            )
        });
        let sql_call = |from: &str| -> ParsedAction {
            match code_block(from) {
                Some(sql) if !sql.trim().is_empty() => ParsedAction::Calls(vec![ToolCall::new(
                    SQL_TOOL,
                    json!({ "query": sql.trim() }),
                )]),
                Some(_) => ParsedAction::Invalid("the ```sql code block is empty".into()),
                None => ParsedAction::Invalid(format!(
                    "`Action: Operation` needs the SQL in a ```sql code block; {HELP}"
                )),
            }
        };
        let answer_call = |answers: Vec<String>| {
            ParsedAction::Calls(vec![ToolCall::new(
                COMMIT_TOOL,
                json!({ "answers": answers }),
            )])
        };
        match action {
            Some((name, at)) if name == "operation" => sql_call(&text[at..]),
            Some((name, at)) if name == "answer" => match final_answer(&text[at..]) {
                Some(answers) => answer_call(answers),
                None => ParsedAction::Invalid(format!(
                    "`Action: Answer` needs a `Final Answer: [...]` line; {HELP}"
                )),
            },
            Some((name, _)) => ParsedAction::Invalid(format!("unknown action `{name}`; {HELP}")),
            None => {
                if let Some(answers) = final_answer(text) {
                    answer_call(answers)
                } else if code_block(text).is_some() {
                    sql_call(text)
                } else {
                    ParsedAction::Invalid(HELP.to_string())
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> ParsedAction {
        DbBenchTextParser.parse(text, &[])
    }

    #[test]
    fn operations() {
        let turn = "I will count.\nAction: Operation\n```sql\nSELECT COUNT(*) FROM `t`;\n```\n";
        assert_eq!(
            parse(turn),
            ParsedAction::Calls(vec![ToolCall::new(
                SQL_TOOL,
                json!({"query": "SELECT COUNT(*) FROM `t`;"})
            )])
        );
        assert!(matches!(
            parse("Action: Operation\nSELECT 1"),
            ParsedAction::Invalid(_)
        ));
        assert!(matches!(
            parse("Action: Operation\n```sql\n\n```"),
            ParsedAction::Invalid(_)
        ));
    }

    #[test]
    fn one_line_blocks() {
        assert_eq!(
            parse("Action: Operation\n```SELECT 1```"),
            ParsedAction::Calls(vec![ToolCall::new(SQL_TOOL, json!({"query": "SELECT 1"}))])
        );
        assert_eq!(
            parse("**Action:** Operation\n```sql SELECT 2 ```\n"),
            ParsedAction::Calls(vec![ToolCall::new(SQL_TOOL, json!({"query": "SELECT 2"}))])
        );
        assert_eq!(
            parse("Action: Operation\n```sqé x ```"),
            ParsedAction::Calls(vec![ToolCall::new(SQL_TOOL, json!({"query": "sqé x"}))])
        );
    }

    #[test]
    fn answers() {
        assert_eq!(
            parse("Done.\nAction: Answer\nFinal Answer: [\"a\", \"b\"]"),
            ParsedAction::Calls(vec![ToolCall::new(
                COMMIT_TOOL,
                json!({"answers": ["a", "b"]})
            )])
        );
        assert_eq!(
            parse("Action: Answer\nFinal Answer: [\n  \"x\",\n  'y'\n]\n"),
            ParsedAction::Calls(vec![ToolCall::new(
                COMMIT_TOOL,
                json!({"answers": ["x", "y"]})
            )])
        );
        assert_eq!(
            parse("<think>hm</think>Final Answer: 42"),
            ParsedAction::Calls(vec![ToolCall::new(COMMIT_TOOL, json!({"answers": ["42"]}))])
        );
    }

    #[test]
    fn malformed_turns_are_invalid() {
        for bad in [
            "hello",
            "Action: Dance",
            "Action: Answer\nno answer here",
            "The transaction: Operation",
        ] {
            assert!(matches!(parse(bad), ParsedAction::Invalid(_)), "{bad}");
        }
    }
}
