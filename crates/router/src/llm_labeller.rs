//! The LLM labeller of the behaviour table (paper Table 3: "An LLM labels complete evaluation
//! trajectories; percentages report the fraction exhibiting each behavior"), over any
//! [`ChatModel`].
//!
//! It shows the model one complete trajectory (a long one by its start and its end) and the
//! behaviours an environment's
//! [`harness_core::TrajectoryLabeller`] measures, and asks whether the trajectory exhibits each
//! (a count feature: at least once). The answer must give every behaviour a `true` or `false`;
//! a malformed answer is sent back with the problem within a budget of attempts, after which
//! the trajectory stays unlabelled and the failure is counted, never raised.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use harness_core::{
    BehaviourFeature, ChatMessage, ChatModel, ChatRequest, FeatureKind, OutputFormat, Trajectory,
    TrajectoryLabels, cut_text,
};
use serde_json::Value;

use crate::ballot::extract_json;
use crate::usage::TokenCounter;

/// The role the labeller's requests are accounted under.
pub const LABELLER_ROLE: &str = "labeller";

/// Settings of the LLM labeller.
#[derive(Debug, Clone)]
pub struct LlmLabellerSettings {
    /// Chat requests per trajectory, retries included.
    pub attempts: u32,
    /// A longer transcript keeps its first and last halves of this many characters.
    pub transcript_chars: usize,
    /// Sampling temperature.
    pub temperature: f32,
    /// Output tokens per request.
    pub max_tokens: usize,
    /// Seed passed to providers that honour one.
    pub seed: u64,
}

impl Default for LlmLabellerSettings {
    fn default() -> Self {
        LlmLabellerSettings {
            attempts: 3,
            transcript_chars: 6000,
            temperature: 0.0,
            max_tokens: 512,
            seed: 0,
        }
    }
}

/// A labeller that asks an LLM.
pub struct LlmLabeller {
    model: Arc<dyn ChatModel>,
    settings: LlmLabellerSettings,
    tokens: TokenCounter,
    failures: AtomicUsize,
    rejected: AtomicUsize,
}

impl LlmLabeller {
    /// A labeller over `model`, counting tokens into `tokens`.
    pub fn new(
        model: Arc<dyn ChatModel>,
        settings: LlmLabellerSettings,
        tokens: TokenCounter,
    ) -> Self {
        LlmLabeller {
            model,
            settings,
            tokens,
            failures: AtomicUsize::new(0),
            rejected: AtomicUsize::new(0),
        }
    }

    /// Trajectories left unlabelled so far.
    pub fn failures(&self) -> usize {
        self.failures.load(Ordering::Relaxed)
    }

    /// Malformed answers rejected so far.
    pub fn rejected_answers(&self) -> usize {
        self.rejected.load(Ordering::Relaxed)
    }

    fn prompt(&self, features: &[BehaviourFeature], trajectory: &Trajectory) -> Vec<ChatMessage> {
        let system = "You label the behaviour of an agent in one complete trajectory. For each behaviour listed, say whether the agent exhibits it anywhere in the trajectory, judging behaviour only, not whether the task succeeded. Answer with one JSON object and nothing else, mapping every listed key to true or false.";
        let mut user = String::from("Behaviours (key: the agent ...):\n");
        for f in features {
            match f.kind {
                FeatureKind::Flag => user.push_str(&format!("- {}: {}\n", f.name, f.description)),
                FeatureKind::Count => user.push_str(&format!(
                    "- {}: has at least one of: {}\n",
                    f.name, f.description
                )),
            }
        }
        user.push_str(&format!(
            "\nTrajectory:\n{}\n",
            head_and_tail(&trajectory.transcript(), self.settings.transcript_chars)
        ));
        vec![ChatMessage::system(system), ChatMessage::user(user)]
    }

    /// Label `trajectory` on `features`: 1 where the model says the trajectory exhibits the
    /// behaviour, 0 where not; `None` when no answer was usable within the attempts.
    pub async fn label(
        &self,
        features: &[BehaviourFeature],
        trajectory: &Trajectory,
    ) -> Option<TrajectoryLabels> {
        let mut messages = self.prompt(features, trajectory);
        for attempt in 0..self.settings.attempts.max(1) {
            let request = ChatRequest {
                purpose: LABELLER_ROLE.into(),
                messages: messages.clone(),
                temperature: self.settings.temperature,
                max_tokens: self.settings.max_tokens,
                seed: Some(self.settings.seed.wrapping_add(u64::from(attempt))),
                format: OutputFormat::JsonObject,
            };
            let problem = match self.model.complete(request).await {
                Ok(answer) => {
                    self.tokens.record(LABELLER_ROLE, answer.usage);
                    match parse_label_answer(&answer.text, features) {
                        Ok(labels) => return Some(labels),
                        Err(problem) => {
                            messages.push(ChatMessage::assistant(cut_text(&answer.text, 2000)));
                            messages.push(ChatMessage::user(format!(
                                "Your answer was not usable: {problem}. Answer again with the JSON object only."
                            )));
                            problem
                        }
                    }
                }
                Err(e) => format!("the model failed: {e}"),
            };
            self.rejected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(
                task = %trajectory.task_id,
                attempt = attempt + 1,
                %problem,
                "labeller answer rejected"
            );
        }
        self.failures.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// `text` cut to about `max` characters by keeping its start and its end (how an episode
/// begins and how it finishes both matter to its behaviours), with the cut said in between.
pub fn head_and_tail(text: &str, max: usize) -> String {
    let n = text.chars().count();
    if n <= max {
        return text.to_string();
    }
    let half = max / 2;
    let head: String = text.chars().take(half).collect();
    let tail: String = text.chars().skip(n - half).collect();
    format!(
        "{head}\n[... {} characters left out ...]\n{tail}",
        n - 2 * half
    )
}

/// Validate a labeller answer: a JSON object giving every feature a boolean (or 0 / 1) and
/// naming no other key.
pub fn parse_label_answer(
    text: &str,
    features: &[BehaviourFeature],
) -> Result<TrajectoryLabels, String> {
    let Some(Value::Object(map)) = extract_json(text) else {
        return Err(
            "the answer holds no JSON object; expected {\"<behaviour key>\": true or false, ...}"
                .into(),
        );
    };
    if let Some(unknown) = map.keys().find(|k| !features.iter().any(|f| &f.name == *k)) {
        let shown: String = unknown.chars().take(80).collect();
        return Err(format!("`{shown}` is not one of the behaviours listed"));
    }
    let mut labels = TrajectoryLabels::new();
    for f in features {
        let value = match map.get(&f.name) {
            Some(Value::Bool(b)) => *b,
            Some(Value::Number(n)) if n.as_f64() == Some(0.0) || n.as_f64() == Some(1.0) => {
                n.as_f64() == Some(1.0)
            }
            Some(_) => return Err(format!("`{}` must be true or false", f.name)),
            None => {
                return Err(format!(
                    "`{}` is missing; every behaviour needs an answer",
                    f.name
                ));
            }
        };
        labels.insert(f.name.clone(), if value { 1.0 } else { 0.0 });
    }
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn features() -> Vec<BehaviourFeature> {
        vec![
            BehaviourFeature::count("pages_fetched", "pages fetched"),
            BehaviourFeature::flag("submitted", "submits through the submit tool"),
        ]
    }

    #[test]
    fn a_long_transcript_keeps_its_start_and_its_end() {
        let text: String = (0..100).map(|i| format!("{i:03}")).collect();
        let cut = head_and_tail(&text, 30);
        assert!(cut.starts_with("000001002003004"), "{cut}");
        assert!(cut.ends_with("095096097098099"), "{cut}");
        assert!(cut.contains("[... 270 characters left out ...]"), "{cut}");
        assert_eq!(head_and_tail("short", 30), "short");
    }

    #[test]
    fn an_answer_must_label_every_behaviour_and_nothing_else() {
        let ok = parse_label_answer(
            "```json\n{\"pages_fetched\": true, \"submitted\": 0}\n```",
            &features(),
        )
        .unwrap();
        assert_eq!(ok["pages_fetched"], 1.0);
        assert_eq!(ok["submitted"], 0.0);
        for (bad, why) in [
            ("no json", "no JSON object"),
            ("{\"pages_fetched\": true}", "`submitted` is missing"),
            (
                "{\"pages_fetched\": true, \"submitted\": \"yes\"}",
                "must be true or false",
            ),
            (
                "{\"pages_fetched\": 3, \"submitted\": true}",
                "must be true or false",
            ),
            (
                "{\"pages_fetched\": true, \"submitted\": true, \"moon\": true}",
                "`moon` is not one of",
            ),
        ] {
            let e = parse_label_answer(bad, &features()).unwrap_err();
            assert!(e.contains(why), "{bad}: {e}");
        }
    }
}
