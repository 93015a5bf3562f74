//! A scripted policy whose success depends on the harness: it has planted failure modes
//! ("quirks") that go away only when the harness's own text (system prompt, rules, skills,
//! hook messages, tool documentation) contains a cure keyword. Harness-evolution tests use it
//! with [`ScriptedEnv`] to check that edits repair the failures they target.
//!
//! The task names its quirk in the instruction (`[quirk: paging]`, see [`quirk_task`]); every
//! task asks for the number of items in the listing. Without its cure:
//! - [`Quirk::StopsAfterFirstPage`] reads page 1 only and submits its count;
//! - [`Quirk::WastesBudget`] reads every page, then echoes "double-checking" until the action
//!   limit ends the episode;
//! - [`Quirk::RepeatsFailingCall`] calls `fail` again and again;
//! - [`Quirk::AnswersInText`] reads every page and answers in text instead of calling `submit`.
//!
//! With its cure the policy reads every page and submits the right count.

use async_trait::async_trait;
use harness_core::{
    ActionParser, ParsedAction, Policy, PolicyRequest, PolicyTurn, Result, Role, Task, ToolCall,
    ToolCallParser,
};
use serde_json::json;

use crate::ScriptedEnv;

/// A planted failure mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Quirk {
    /// Stops paging after page 1.
    StopsAfterFirstPage,
    /// Spends the action budget before submitting.
    WastesBudget,
    /// Repeats a failing call.
    RepeatsFailingCall,
    /// Answers in text instead of calling `submit`.
    AnswersInText,
}

impl Quirk {
    /// Every quirk.
    pub const ALL: [Quirk; 4] = [
        Quirk::StopsAfterFirstPage,
        Quirk::WastesBudget,
        Quirk::RepeatsFailingCall,
        Quirk::AnswersInText,
    ];

    /// The tag in a task's instruction (`paging`, `budget`, `repeat`, `text`).
    pub fn tag(self) -> &'static str {
        match self {
            Quirk::StopsAfterFirstPage => "paging",
            Quirk::WastesBudget => "budget",
            Quirk::RepeatsFailingCall => "repeat",
            Quirk::AnswersInText => "text",
        }
    }

    fn of_instruction(text: &str) -> Option<Quirk> {
        Quirk::ALL
            .into_iter()
            .find(|q| text.contains(&format!("[quirk: {}]", q.tag())))
    }
}

/// A task of `env` planting `quirk` (`None`: a task the policy solves under any harness).
pub fn quirk_task(env: &ScriptedEnv, id: &str, quirk: Option<Quirk>) -> Task {
    let mut task = env.task(id, &env.item_count().to_string());
    let tag = quirk.map_or(String::new(), |q| format!(" [quirk: {}]", q.tag()));
    task.instruction = format!("Count every item in the listing and submit the count.{tag}");
    task
}

/// The harness-sensitive policy: quirks with the keywords that cure them.
#[derive(Debug, Clone, Default)]
pub struct HarnessSensitivePolicy {
    cures: Vec<(Quirk, Vec<String>)>,
}

impl HarnessSensitivePolicy {
    /// A policy with no cures (every quirk stays).
    pub fn new() -> Self {
        Self::default()
    }

    /// `quirk` goes away when the harness text contains any of `keywords` (case-insensitive).
    pub fn cured_by(mut self, quirk: Quirk, keywords: &[&str]) -> Self {
        self.cures
            .push((quirk, keywords.iter().map(|k| k.to_lowercase()).collect()));
        self
    }

    fn cured(&self, quirk: Quirk, harness_text: &str) -> bool {
        self.cures
            .iter()
            .filter(|(q, _)| *q == quirk)
            .any(|(_, keywords)| keywords.iter().any(|k| harness_text.contains(k)))
    }
}

/// What the policy has seen: its calls and their observations.
struct History {
    calls: Vec<(ToolCall, String)>,
}

impl History {
    fn of(request: &PolicyRequest) -> History {
        let mut calls = Vec::new();
        let messages = &request.messages;
        for (i, m) in messages.iter().enumerate() {
            if m.role != Role::Assistant {
                continue;
            }
            if let ParsedAction::Calls(list) = ToolCallParser.parse(&m.content, &[]) {
                let mut answers = messages[i + 1..]
                    .iter()
                    .take_while(|x| x.role != Role::Assistant)
                    .filter(|x| x.role == Role::Tool);
                for call in list {
                    let text = answers
                        .next()
                        .map(|a| a.content.clone())
                        .unwrap_or_default();
                    calls.push((call, text));
                }
            }
        }
        History { calls }
    }

    fn count(&self, tool: &str) -> usize {
        self.calls.iter().filter(|(c, _)| c.name == tool).count()
    }

    /// The next page to read, or `None` when the last page read was the last one.
    fn next_page(&self) -> Option<u64> {
        let Some((call, text)) = self
            .calls
            .iter()
            .rev()
            .find(|(c, _)| c.name == "list_items")
        else {
            return Some(1);
        };
        let page = call
            .arguments
            .get("page")
            .and_then(|p| p.as_u64())
            .unwrap_or(1);
        let total = text
            .split_whitespace()
            .skip_while(|w| *w != "of")
            .nth(1)
            .and_then(|w| w.trim_end_matches(':').parse::<u64>().ok())
            .unwrap_or(page);
        (page < total).then_some(page + 1)
    }

    fn items_seen(&self) -> usize {
        self.calls
            .iter()
            .filter(|(c, _)| c.name == "list_items")
            .map(|(_, text)| text.matches("item-").count())
            .sum()
    }
}

fn call(name: &str, arguments: serde_json::Value) -> String {
    ToolCall::new(name, arguments).to_tool_call_block()
}

impl HarnessSensitivePolicy {
    fn decide(&self, request: &PolicyRequest) -> String {
        let mut harness_text = String::new();
        let mut instruction = String::new();
        let mut first_user = true;
        for m in &request.messages {
            match m.role {
                Role::System => harness_text.push_str(&m.content),
                Role::User if first_user => {
                    instruction = m.content.clone();
                    first_user = false;
                }
                Role::User => harness_text.push_str(&m.content),
                _ => {}
            }
            harness_text.push('\n');
        }
        for tool in &request.tools {
            harness_text.push_str(&tool.description);
            harness_text.push('\n');
        }
        let harness_text = harness_text.to_lowercase();
        let quirk = Quirk::of_instruction(&instruction);
        let cured = |q: Quirk| quirk != Some(q) || self.cured(q, &harness_text);
        let history = History::of(request);
        if !cured(Quirk::RepeatsFailingCall) {
            return call("fail", json!({}));
        }
        match history.next_page() {
            Some(page) if page == 1 || cured(Quirk::StopsAfterFirstPage) => {
                return call("list_items", json!({"page": page}));
            }
            _ => {}
        }
        let count = history.items_seen();
        if !cured(Quirk::WastesBudget) {
            let n = history.count("echo");
            return call("echo", json!({"text": format!("double-checking {n}")}));
        }
        if !cured(Quirk::AnswersInText) {
            return format!("The listing holds {count} items.");
        }
        call("submit", json!({"answer": count.to_string()}))
    }
}

#[async_trait]
impl Policy for HarnessSensitivePolicy {
    fn name(&self) -> &str {
        "harness-sensitive"
    }

    async fn generate(&self, request: PolicyRequest) -> Result<PolicyTurn> {
        let text = self.decide(&request);
        Ok(PolicyTurn::text_only(text, request.max_new_tokens))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use harness_core::{Harness, run_episode};

    fn run(policy: &HarnessSensitivePolicy, harness: &Harness, quirk: Option<Quirk>) -> bool {
        let env = ScriptedEnv::new(3);
        let task = quirk_task(&env, "t", quirk);
        futures::executor::block_on(run_episode(policy, harness, &env, &task, 1))
            .unwrap()
            .is_success()
    }

    #[test]
    fn quirks_fail_until_the_harness_mentions_their_cure() {
        let policy = HarnessSensitivePolicy::new()
            .cured_by(Quirk::StopsAfterFirstPage, &["keep requesting pages"])
            .cured_by(Quirk::WastesBudget, &["keep one action"])
            .cured_by(Quirk::RepeatsFailingCall, &["do not repeat"])
            .cured_by(Quirk::AnswersInText, &["does not count"]);
        let mut plain = Harness::new("H0", "Solve the task with tools.");
        plain.limits.max_env_actions = 10;
        assert!(run(&policy, &plain, None));
        for quirk in Quirk::ALL {
            assert!(!run(&policy, &plain, Some(quirk)), "{quirk:?} should fail");
        }
        let mut cured = plain.clone();
        cured.prompt.system =
            "Keep requesting pages. Keep one action. Do not repeat. Text does not count.".into();
        for quirk in Quirk::ALL {
            assert!(
                run(&policy, &cured, Some(quirk)),
                "{quirk:?} should be cured"
            );
        }
    }
}
