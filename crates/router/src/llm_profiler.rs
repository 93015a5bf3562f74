//! The LLM profiler (paper Eq. 8: "An LLM groups behavioral differences from paired validation
//! trajectories into entries"), over any [`ChatModel`].
//!
//! It shows the model the paired transcripts of validation tasks where the sibling and H0
//! differ in outcome and asks for a JSON profile. The answer is validated (shape, non-empty
//! text, bounded sizes, support only from the tasks shown); a malformed answer is sent back
//! with the problem, within a budget of attempts; after the budget the sibling keeps an empty
//! profile and the failure is logged and counted, never raised.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use harness_core::{ChatMessage, ChatModel, ChatRequest, OutputFormat, Usage, cut_text};
use serde_json::Value;

use crate::ballot::extract_json;
use crate::error::Result;
use crate::profile::{Entry, Profile};
use crate::profiler::{PairedTask, ProfileInput, ProfileOutcome, Profiler};
use crate::usage::TokenCounter;

/// The role the profiler's requests are accounted under.
pub const PROFILER_ROLE: &str = "profiler";

/// Most entries per list an answer may hold.
pub const MAX_ENTRIES: usize = 32;
/// Longest `when` or `behavior` text (characters).
pub const MAX_ENTRY_CHARS: usize = 600;

/// Settings of the LLM profiler.
#[derive(Debug, Clone)]
pub struct LlmProfilerSettings {
    /// Chat requests per sibling, retries included.
    pub attempts: u32,
    /// Most paired tasks shown per sibling (those where the outcomes differ).
    pub max_pairs: usize,
    /// Each transcript is cut to this many characters.
    pub transcript_chars: usize,
    /// Sampling temperature.
    pub temperature: f32,
    /// Output tokens per request.
    pub max_tokens: usize,
    /// Seed passed to providers that honour one.
    pub seed: u64,
}

impl Default for LlmProfilerSettings {
    fn default() -> Self {
        LlmProfilerSettings {
            attempts: 3,
            max_pairs: 8,
            transcript_chars: 6000,
            temperature: 0.2,
            max_tokens: 2048,
            seed: 0,
        }
    }
}

/// A profiler that asks an LLM.
pub struct LlmProfiler {
    model: Arc<dyn ChatModel>,
    settings: LlmProfilerSettings,
    tokens: TokenCounter,
    failures: AtomicUsize,
    rejected: AtomicUsize,
}

impl LlmProfiler {
    /// A profiler over `model`, counting tokens into `tokens`.
    pub fn new(
        model: Arc<dyn ChatModel>,
        settings: LlmProfilerSettings,
        tokens: TokenCounter,
    ) -> Self {
        LlmProfiler {
            model,
            settings,
            tokens,
            failures: AtomicUsize::new(0),
            rejected: AtomicUsize::new(0),
        }
    }

    /// Siblings left with an empty profile so far.
    pub fn failures(&self) -> usize {
        self.failures.load(Ordering::Relaxed)
    }

    /// Malformed answers rejected so far.
    pub fn rejected_answers(&self) -> usize {
        self.rejected.load(Ordering::Relaxed)
    }

    fn prompt(&self, input: &ProfileInput<'_>, pairs: &[PairedTask<'_>]) -> Vec<ChatMessage> {
        let system = "You compare executions of one agent policy under two harnesses: a base harness H0 and a sibling harness S (an edit of H0). For each validation task below both ran with the same task seed and execution limits, and their outcomes differ. Describe when S helps or hinders relative to H0.\n\nAnswer with one JSON object and nothing else:\n{\"prefer\": [{\"when\": \"<task condition>\", \"behavior\": \"<what S does differently from H0>\", \"support\": [\"<task id>\", ...]}], \"avoid\": [ ...same shape... ]}\n`prefer` holds conditions where S succeeds and H0 fails, `avoid` the reverse. Group repeated observations under one condition and behaviour; keep useful single-task observations. `support` lists only task ids shown below.";
        let mut user = format!(
            "Sibling S: {} ({})\nBase H0: {} ({})\n",
            input.sibling.name,
            one_line(&input.sibling.description),
            input.base.name,
            one_line(&input.base.description),
        );
        if let Some(direction) = &input.sibling.lineage.direction {
            user.push_str(&format!("S's repair direction: {}\n", one_line(direction)));
        }
        for pair in pairs {
            user.push_str(&format!(
                "\n=== task {} ({} in S, {} in H0)\nInstruction: {}\n",
                pair.task.id,
                verdict(pair.sibling_rate()),
                verdict(pair.base_rate()),
                one_line(&pair.task.instruction)
            ));
            if let Some(t) = pair.sibling.first() {
                user.push_str(&format!(
                    "--- S transcript\n{}\n",
                    cut_text(&t.transcript(), self.settings.transcript_chars)
                ));
            }
            if let Some(t) = pair.base.first() {
                user.push_str(&format!(
                    "--- H0 transcript\n{}\n",
                    cut_text(&t.transcript(), self.settings.transcript_chars)
                ));
            }
        }
        vec![ChatMessage::system(system), ChatMessage::user(user)]
    }
}

fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn verdict(rate: f64) -> String {
    if rate >= 1.0 {
        "succeeds".into()
    } else if rate <= 0.0 {
        "fails".into()
    } else {
        format!("succeeds {:.0}% of attempts", rate * 100.0)
    }
}

/// Validate a profiler answer; `allowed` are the task ids the model was shown.
pub fn parse_profile_answer(
    text: &str,
    allowed: &BTreeSet<String>,
) -> std::result::Result<Profile, String> {
    let value = extract_json(text).ok_or_else(|| {
        format!(
            "the answer holds no JSON object ({} characters); expected {{\"prefer\": [...], \"avoid\": [...]}}",
            text.chars().count()
        )
    })?;
    let Value::Object(map) = value else {
        return Err(
            "the answer is a JSON array; expected an object with `prefer` and `avoid`".into(),
        );
    };
    let mut lists = Vec::new();
    for key in ["prefer", "avoid"] {
        let Some(Value::Array(items)) = map.get(key) else {
            return Err(format!(
                "`{key}` is missing or not an array; expected a list of entries"
            ));
        };
        if items.len() > MAX_ENTRIES {
            return Err(format!(
                "`{key}` has {} entries; expected at most {MAX_ENTRIES}",
                items.len()
            ));
        }
        let mut entries = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let at = format!("{key}[{i}]");
            let text_field = |name: &str| -> std::result::Result<String, String> {
                match item.get(name) {
                    Some(Value::String(s))
                        if !s.trim().is_empty() && s.chars().count() <= MAX_ENTRY_CHARS =>
                    {
                        Ok(s.trim().to_string())
                    }
                    Some(Value::String(s)) if s.trim().is_empty() => {
                        Err(format!("{at}.{name} is empty"))
                    }
                    Some(Value::String(_)) => Err(format!(
                        "{at}.{name} is longer than {MAX_ENTRY_CHARS} characters"
                    )),
                    _ => Err(format!("{at}.{name} is missing or not a string")),
                }
            };
            let when = text_field("when")?;
            let behavior = text_field("behavior")?;
            let Some(Value::Array(support)) = item.get("support") else {
                return Err(format!(
                    "{at}.support is missing or not an array of task ids"
                ));
            };
            if support.is_empty() {
                return Err(format!(
                    "{at}.support is empty; expected at least one task id"
                ));
            }
            let mut ids = Vec::new();
            for (j, s) in support.iter().enumerate() {
                match s.as_str() {
                    Some(id) if allowed.contains(id) => ids.push(id.to_string()),
                    Some(id) => {
                        let shown: String = id.chars().take(80).collect();
                        return Err(format!(
                            "{at}.support[{j}] names `{shown}`, which is not one of the tasks shown"
                        ));
                    }
                    None => return Err(format!("{at}.support[{j}] is not a string")),
                }
            }
            entries.push(Entry::new(when, behavior, ids));
        }
        lists.push(entries);
    }
    let avoid = lists.pop().unwrap_or_default();
    let prefer = lists.pop().unwrap_or_default();
    Ok(Profile { prefer, avoid }.consolidated())
}

#[async_trait]
impl Profiler for LlmProfiler {
    fn name(&self) -> &str {
        "llm"
    }

    async fn profile(&self, input: &ProfileInput<'_>) -> Result<ProfileOutcome> {
        let mut pairs: Vec<PairedTask<'_>> = input
            .pairs
            .iter()
            .copied()
            .filter(PairedTask::differs)
            .collect();
        if pairs.is_empty() {
            // Nothing differs: the profile is empty by evidence, not by failure.
            return Ok(ProfileOutcome::default());
        }
        // Show helping and hurting cases alike, in a stable order.
        pairs.sort_by(|a, b| a.task.id.cmp(&b.task.id));
        pairs.truncate(self.settings.max_pairs.max(1));
        let allowed: BTreeSet<String> = pairs.iter().map(|p| p.task.id.clone()).collect();
        let mut messages = self.prompt(input, &pairs);
        let mut outcome = ProfileOutcome::default();
        for attempt in 0..self.settings.attempts.max(1) {
            let request = ChatRequest {
                purpose: PROFILER_ROLE.into(),
                messages: messages.clone(),
                temperature: self.settings.temperature,
                max_tokens: self.settings.max_tokens,
                seed: Some(self.settings.seed.wrapping_add(u64::from(attempt))),
                format: OutputFormat::JsonObject,
            };
            let problem = match self.model.complete(request).await {
                Ok(answer) => {
                    self.tokens.record(PROFILER_ROLE, answer.usage);
                    let usage = answer.usage.unwrap_or_default();
                    outcome.usage = Usage {
                        prompt_tokens: outcome.usage.prompt_tokens + usage.prompt_tokens,
                        completion_tokens: outcome.usage.completion_tokens
                            + usage.completion_tokens,
                    };
                    match parse_profile_answer(&answer.text, &allowed) {
                        Ok(profile) => {
                            outcome.profile = profile;
                            return Ok(outcome);
                        }
                        Err(problem) => {
                            messages.push(ChatMessage::assistant(cut_text(&answer.text, 4000)));
                            messages.push(ChatMessage::user(format!(
                                "Your answer was not a valid profile: {problem}. Answer again with the JSON object only."
                            )));
                            problem
                        }
                    }
                }
                Err(e) => format!("the model failed: {e}"),
            };
            outcome.rejected_answers += 1;
            self.rejected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                sibling = %input.sibling.name,
                attempt = attempt + 1,
                %problem,
                "profiler answer rejected"
            );
        }
        self.failures.fetch_add(1, Ordering::Relaxed);
        tracing::warn!(
            sibling = %input.sibling.name,
            attempts = self.settings.attempts,
            "profiler gave up; the sibling keeps an empty profile"
        );
        outcome.failed = true;
        outcome.profile = Profile::default();
        Ok(outcome)
    }
}
