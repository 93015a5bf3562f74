//! The retail world's LLM seats: a customer ([`LlmCustomer`], harness-envs'
//! [`UserSimulator`]) and a judge of the NL assertions ([`LlmJudge`], harness-envs'
//! [`NlJudge`]), both over the LLM roles' [`ChatModel`] (the `roles.llm` endpoint).
//!
//! Environments never call a model, so these live here and are injected into
//! [`TauRetail`](harness_envs::tau_retail::TauRetail) through its seams
//! (`env.tau_user = "llm"`, `env.tau_nl_judge = true`).
//!
//! ## The customer, as tau2-bench runs it
//! The customer model's system prompt holds the simulation rules and the task's scenario
//! (persona, reason for the call, what the customer knows and does not know, how it
//! behaves); it never sees the gold actions or what must be communicated. The conversation
//! reaches it with the roles flipped: the agent's messages are `user` turns, the customer's
//! own earlier messages `assistant` turns; the agent's tool calls stay hidden from it. The
//! benchmark's agent greets first and the customer model writes its opening; here the
//! opening is the task's instruction, fixed before the episode (the agent's context starts
//! from it), so the customer model sees a greeting ([`GREETING`]) and that opening as its own
//! first turn, and answers from the second customer turn on.
//!
//! The customer ends the conversation by writing one of the benchmark's end tokens:
//! [`STOP`] when its goal is met, [`TRANSFER`] when it has been transferred, [`OUT_OF_SCOPE`]
//! when the scenario does not say how to go on. The agent sees the reply without the token.
//! Its replies are observations of the episode, never policy tokens.
//!
//! A reply the episode cannot use (empty, or longer than [`MAX_REPLY_CHARS`]) is asked for
//! again with another seed, at most `attempts` times in all; then the episode fails with an
//! error that names the task and the last answer (the customer is infrastructure: a customer
//! that cannot answer is not the policy's failure).
//!
//! ## The judge
//! One request per judged episode: the conversation as `customer:` / `agent:` lines (tool calls
//! and their success as `agent tool call:` lines) and the numbered assertions; the answer is a
//! JSON object `{"results": [{"assertion": <number>, "reasoning": "...", "met": true|false},
//! ...]}` with one entry per assertion. Its verdicts enter the outcome's details
//! (`nl_assertions.verdicts`) and the reward (every assertion must hold). An answer that is
//! not that object is asked for again, at most `attempts` times, then an error.

use std::hash::{Hash, Hasher};
use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{ChatMessage, ChatModel, ChatRequest, OutputFormat};
use harness_envs::tau_retail::{Conversation, NlJudge, RetailTask, Turn, UserReply, UserSimulator};
use serde_json::Value;

/// The customer's end token: its goal is met.
pub const STOP: &str = "###STOP###";
/// The customer's end token: it has been transferred to another agent.
pub const TRANSFER: &str = "###TRANSFER###";
/// The customer's end token: the scenario does not say how to go on.
pub const OUT_OF_SCOPE: &str = "###OUT-OF-SCOPE###";
/// Every end token.
pub const END_TOKENS: [&str; 3] = [STOP, TRANSFER, OUT_OF_SCOPE];

/// The agent's greeting the customer model sees before its opening message.
pub const GREETING: &str = "Hello! How can I help you today?";

/// The longest customer reply accepted.
pub const MAX_REPLY_CHARS: usize = 4_000;

/// The simulation rules of the customer's system prompt (this project's wording of the
/// benchmark's rules).
pub const CUSTOMER_RULES: &str = "You are role-playing a customer of an online retail store who is talking to the store's customer service agent. You are the customer, never the agent.

Rules:
- Write one message per turn, as this customer would say it, in plain conversational language.
- Stay within the scenario below and follow its instructions.
- Give a piece of information only when the agent asks for it; do not volunteer everything at once.
- Anything the scenario does not tell you is unknown to you. Say you do not know it; never make up details such as ids, emails, addresses or amounts.
- Do not repeat the scenario's sentences word for word; say things in your own words.
- When everything the scenario asks for has been handled, write ###STOP### to end the conversation (on its own, or at the end of your last message).
- If the agent transfers you to another agent or a human, write ###TRANSFER###.
- If the scenario does not tell you enough to continue, write ###OUT-OF-SCOPE###.";

/// The task's scenario as the customer model reads it (persona, reason for the call, known
/// and unknown information, behaviour), and nothing else of the task.
pub fn scenario_prompt(task: &RetailTask) -> String {
    let scenario = &task.user_scenario;
    let i = &scenario.instructions;
    let mut lines = Vec::new();
    if let Some(persona) = &scenario.persona {
        lines.push(format!("Persona:\n{}", persona.trim()));
    }
    lines.push("Domain: retail".to_string());
    lines.push(format!(
        "Reason for the call:\n{}",
        i.reason_for_call.trim()
    ));
    for (label, text) in [
        ("What you know", &i.known_info),
        ("What you do not know", &i.unknown_info),
        ("How to behave", &i.task_instructions),
    ] {
        if let Some(text) = text {
            lines.push(format!("{label}:\n{}", text.trim()));
        }
    }
    lines.join("\n")
}

/// The customer model's system prompt for `task`.
pub fn customer_system_prompt(task: &RetailTask) -> String {
    format!(
        "{CUSTOMER_RULES}\n\n<scenario>\n{}\n</scenario>",
        scenario_prompt(task)
    )
}

/// The chat the customer model answers: its system prompt, the greeting, then the
/// conversation with the roles flipped (the agent speaks as `user`, the customer as
/// `assistant`); tool calls are left out.
pub fn customer_messages(task: &RetailTask, conversation: &Conversation) -> Vec<ChatMessage> {
    let mut messages = vec![
        ChatMessage::system(customer_system_prompt(task)),
        ChatMessage::user(GREETING),
    ];
    for turn in &conversation.turns {
        match turn {
            Turn::Customer { text } => messages.push(ChatMessage::assistant(text.clone())),
            Turn::Agent { text } => messages.push(ChatMessage::user(text.clone())),
            Turn::Tool { .. } => {}
        }
    }
    messages
}

/// A customer model's answer as a reply: whether it ends the conversation (it holds an end
/// token) and the text the agent sees (the answer without the tokens; the token itself when
/// nothing else is left). `Err` says why the answer is unusable.
pub fn parse_customer_reply(answer: &str) -> std::result::Result<UserReply, String> {
    let trimmed = answer.trim();
    if trimmed.is_empty() {
        return Err("the answer is empty".into());
    }
    let chars = trimmed.chars().count();
    if chars > MAX_REPLY_CHARS {
        return Err(format!(
            "the answer has {chars} characters; a customer message has at most {MAX_REPLY_CHARS}"
        ));
    }
    let token = END_TOKENS.into_iter().find(|t| trimmed.contains(t));
    let mut text = trimmed.to_string();
    for t in END_TOKENS {
        text = text.replace(t, "");
    }
    let text = text.trim();
    Ok(UserReply {
        text: match (text.is_empty(), token) {
            (true, Some(token)) => token.to_string(),
            _ => text.to_string(),
        },
        ends: token.is_some(),
    })
}

/// How the LLM customer and judge ask.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LlmSeatSettings {
    /// Requests per reply or verdict before giving up on unusable answers (at least 1).
    pub attempts: usize,
    /// Sampling temperature of the first request (the benchmark: 0). Later requests sample at
    /// least at [`RETRY_TEMPERATURE`], since a greedy retry would repeat the unusable answer.
    pub temperature: f32,
    /// Output tokens per answer.
    pub max_tokens: usize,
}

/// The lowest temperature of a retried request.
pub const RETRY_TEMPERATURE: f32 = 0.7;

impl Default for LlmSeatSettings {
    fn default() -> Self {
        LlmSeatSettings {
            attempts: 3,
            temperature: 0.0,
            max_tokens: 1024,
        }
    }
}

impl LlmSeatSettings {
    fn request(
        &self,
        purpose: &str,
        messages: Vec<ChatMessage>,
        seed: u64,
        attempt: usize,
    ) -> ChatRequest {
        let mut request = ChatRequest::new(purpose, messages);
        request.temperature = if attempt == 0 {
            self.temperature
        } else {
            self.temperature.max(RETRY_TEMPERATURE)
        };
        request.max_tokens = self.max_tokens;
        request.seed = Some(seed.wrapping_add(attempt as u64));
        request
    }
}

/// A seed that depends only on the task and the conversation so far, so a replayed episode
/// asks the same requests.
fn seed_of(task: &RetailTask, conversation: &Conversation) -> u64 {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    task.id.hash(&mut hasher);
    for turn in &conversation.turns {
        serde_json::to_string(turn)
            .unwrap_or_default()
            .hash(&mut hasher);
    }
    hasher.finish()
}

fn shorten(text: &str) -> String {
    const SHOWN: usize = 200;
    if text.chars().count() <= SHOWN {
        text.to_string()
    } else {
        format!("{}...", text.chars().take(SHOWN).collect::<String>())
    }
}

/// The benchmark's LLM customer over a [`ChatModel`] (see the module documentation).
pub struct LlmCustomer {
    chat: Arc<dyn ChatModel>,
    settings: LlmSeatSettings,
    name: String,
}

impl LlmCustomer {
    /// A customer played by `chat`.
    pub fn new(chat: Arc<dyn ChatModel>, settings: LlmSeatSettings) -> Self {
        let name = format!("llm customer ({})", chat.name());
        LlmCustomer {
            chat,
            settings,
            name,
        }
    }
}

#[async_trait]
impl UserSimulator for LlmCustomer {
    fn name(&self) -> &str {
        &self.name
    }

    async fn reply(
        &self,
        task: &RetailTask,
        conversation: &Conversation,
    ) -> harness_core::Result<UserReply> {
        let messages = customer_messages(task, conversation);
        let seed = seed_of(task, conversation);
        let mut last = String::new();
        for attempt in 0..self.settings.attempts.max(1) {
            let request = self
                .settings
                .request("tau_user", messages.clone(), seed, attempt);
            let answer = self.chat.complete(request).await?;
            match parse_customer_reply(&answer.text) {
                Ok(reply) => return Ok(reply),
                Err(why) => {
                    tracing::warn!(task = %task.id, attempt, "unusable customer reply: {why}");
                    last = format!("{why} (`{}`)", shorten(&answer.text));
                }
            }
        }
        Err(harness_core::Error::Chat {
            model: self.name.clone(),
            message: format!(
                "the LLM customer gave no usable reply on tau-retail task {} after {} request(s) (env.tau_llm_attempts): {last}",
                task.id,
                self.settings.attempts.max(1)
            ),
        })
    }
}

/// The judge's system prompt.
pub const JUDGE_RULES: &str = "You grade a recorded conversation between a customer service agent of an online retail store and a customer against a numbered list of expected outcomes.

Judge each expected outcome on its own: does the agent's behaviour in the conversation satisfy it? Answer with one JSON object and nothing else:
{\"results\": [{\"assertion\": <the outcome's number>, \"reasoning\": \"<one or two sentences>\", \"met\": true or false}]}
with exactly one entry per expected outcome, in the order given.";

/// The conversation as the judge reads it.
pub fn transcript(conversation: &Conversation) -> String {
    conversation
        .turns
        .iter()
        .map(|turn| match turn {
            Turn::Customer { text } => format!("customer: {text}"),
            Turn::Agent { text } => format!("agent: {text}"),
            Turn::Tool {
                name,
                arguments,
                ok,
            } => format!(
                "agent tool call: {name} {arguments} ({})",
                if *ok { "succeeded" } else { "failed" }
            ),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The judge's request for `assertions` over `conversation`.
pub fn judge_messages(conversation: &Conversation, assertions: &[String]) -> Vec<ChatMessage> {
    let numbered = assertions
        .iter()
        .enumerate()
        .map(|(i, a)| format!("{}. {a}", i + 1))
        .collect::<Vec<_>>()
        .join("\n");
    vec![
        ChatMessage::system(JUDGE_RULES),
        ChatMessage::user(format!(
            "Conversation:\n{}\n\nExpected outcomes:\n{numbered}",
            transcript(conversation)
        )),
    ]
}

/// The verdicts of a judge's answer, one per assertion in order; `Err` says why the answer is
/// unusable.
pub fn parse_verdicts(answer: &str, assertions: usize) -> std::result::Result<Vec<bool>, String> {
    let value: Value = serde_json::from_str(answer.trim())
        .map_err(|e| format!("the answer is not a JSON object: {e}"))?;
    let results = value
        .get("results")
        .and_then(Value::as_array)
        .ok_or("the answer has no `results` array")?;
    if results.len() != assertions {
        return Err(format!(
            "`results` has {} entries for {assertions} assertion(s)",
            results.len()
        ));
    }
    let mut verdicts = vec![None; assertions];
    for (i, result) in results.iter().enumerate() {
        let met = result
            .get("met")
            .and_then(Value::as_bool)
            .ok_or_else(|| format!("`results[{i}].met` is not true or false"))?;
        // Entries are placed by their number when they give one, else by their position.
        let slot = match result.get("assertion") {
            None => i,
            Some(n) => match n.as_u64() {
                Some(n) if (1..=assertions as u64).contains(&n) => n as usize - 1,
                _ => {
                    return Err(format!(
                        "`results[{i}].assertion` is {n}; expected a number from 1 to {assertions}"
                    ));
                }
            },
        };
        if verdicts[slot].replace(met).is_some() {
            return Err(format!("assertion {} is graded twice", slot + 1));
        }
    }
    Ok(verdicts.into_iter().map(|v| v.unwrap_or(false)).collect())
}

/// The benchmark's LLM judge of NL assertions over a [`ChatModel`] (see the module
/// documentation).
pub struct LlmJudge {
    chat: Arc<dyn ChatModel>,
    settings: LlmSeatSettings,
    name: String,
}

impl LlmJudge {
    /// A judge played by `chat`.
    pub fn new(chat: Arc<dyn ChatModel>, settings: LlmSeatSettings) -> Self {
        let name = format!("llm judge ({})", chat.name());
        LlmJudge {
            chat,
            settings,
            name,
        }
    }
}

#[async_trait]
impl NlJudge for LlmJudge {
    fn name(&self) -> &str {
        &self.name
    }

    async fn judge(
        &self,
        task: &RetailTask,
        conversation: &Conversation,
    ) -> harness_core::Result<Vec<bool>> {
        let assertions = task
            .evaluation_criteria
            .nl_assertions
            .clone()
            .unwrap_or_default();
        if assertions.is_empty() {
            return Ok(Vec::new());
        }
        let messages = judge_messages(conversation, &assertions);
        let seed = seed_of(task, conversation);
        let mut last = String::new();
        for attempt in 0..self.settings.attempts.max(1) {
            let mut request = self
                .settings
                .request("tau_judge", messages.clone(), seed, attempt);
            request.format = OutputFormat::JsonObject;
            let answer = self.chat.complete(request).await?;
            match parse_verdicts(&answer.text, assertions.len()) {
                Ok(verdicts) => return Ok(verdicts),
                Err(why) => {
                    tracing::warn!(task = %task.id, attempt, "unusable judge answer: {why}");
                    last = format!("{why} (`{}`)", shorten(&answer.text));
                }
            }
        }
        Err(harness_core::Error::Chat {
            model: self.name.clone(),
            message: format!(
                "the LLM judge gave no usable verdicts on tau-retail task {} after {} request(s) (env.tau_llm_attempts): {last}",
                task.id,
                self.settings.attempts.max(1)
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn end_tokens_end_the_conversation_and_leave_the_text() {
        let reply = parse_customer_reply("Thanks, that's all. ###STOP###").unwrap();
        assert_eq!(
            reply,
            UserReply {
                text: "Thanks, that's all.".into(),
                ends: true
            }
        );
        let reply = parse_customer_reply(" ###TRANSFER### ").unwrap();
        assert_eq!((reply.text.as_str(), reply.ends), (TRANSFER, true));
        let reply = parse_customer_reply("My zip code is 19122.").unwrap();
        assert!(!reply.ends);
        assert!(parse_customer_reply("  \n").unwrap_err().contains("empty"));
        let long = "a".repeat(MAX_REPLY_CHARS + 1);
        assert!(parse_customer_reply(&long).unwrap_err().contains("at most"));
    }

    #[test]
    fn verdicts_are_read_by_number_and_checked() {
        let answer = r#"{"results": [{"assertion": 2, "reasoning": "r", "met": false}, {"assertion": 1, "reasoning": "r", "met": true}]}"#;
        assert_eq!(parse_verdicts(answer, 2).unwrap(), vec![true, false]);
        let by_position = r#"{"results": [{"met": true}]}"#;
        assert_eq!(parse_verdicts(by_position, 1).unwrap(), vec![true]);
        for (bad, why) in [
            ("yes", "not a JSON object"),
            ("{}", "no `results`"),
            (r#"{"results": [{"met": true}]}"#, "1 entries for 2"),
            (
                r#"{"results": [{"met": "yes"}, {"met": true}]}"#,
                "results[0].met",
            ),
            (
                r#"{"results": [{"assertion": 1, "met": true}, {"assertion": 1, "met": true}]}"#,
                "graded twice",
            ),
            (
                r#"{"results": [{"assertion": 3, "met": true}, {"met": true}]}"#,
                "from 1 to 2",
            ),
        ] {
            let e = parse_verdicts(bad, 2).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
