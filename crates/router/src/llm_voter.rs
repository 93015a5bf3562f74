//! The LLM voter: one [`ChatModel`] call per ballot, over any OpenAI-compatible endpoint.
//!
//! "Candidate order varies across calls": the candidates are shuffled with a seed drawn from the
//! voter's own seed, the request's seed and the retry number, so several voters on one
//! endpoint see different orders (the paper's "same LLM with different seeds/orders").

use std::fmt::Write as _;
use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{ChatMessage, ChatModel, ChatRequest, OutputFormat, SelectionMode, cut_text};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::ballot::{BallotError, parse_ballot_text};
use crate::error::Result;
use crate::usage::TokenCounter;
use crate::vote::{Candidate, VoteAnswer, VoteRequest, Voter};

/// The role voter requests are accounted under.
pub const VOTER_ROLE: &str = "voter";

/// Settings of an LLM voter.
#[derive(Debug, Clone)]
pub struct LlmVoterSettings {
    /// Sampling temperature.
    pub temperature: f32,
    /// Output tokens per ballot.
    pub max_tokens: usize,
    /// Profile entries shown per candidate and list.
    pub max_entries: usize,
    /// Similar tasks shown.
    pub max_similar: usize,
}

impl Default for LlmVoterSettings {
    fn default() -> Self {
        LlmVoterSettings {
            temperature: 0.7,
            max_tokens: 512,
            max_entries: 6,
            max_similar: 5,
        }
    }
}

/// A voter that asks an LLM.
pub struct LlmVoter {
    name: String,
    model: Arc<dyn ChatModel>,
    seed: u64,
    settings: LlmVoterSettings,
    tokens: TokenCounter,
}

impl LlmVoter {
    /// A voter named `name` over `model` with its own `seed`, counting tokens into `tokens`.
    pub fn new(
        name: impl Into<String>,
        model: Arc<dyn ChatModel>,
        seed: u64,
        settings: LlmVoterSettings,
        tokens: TokenCounter,
    ) -> Self {
        LlmVoter {
            name: name.into(),
            model,
            seed,
            settings,
            tokens,
        }
    }

    /// The candidates in the order this call shows them.
    pub fn order<'a>(&self, request: &'a VoteRequest) -> Vec<&'a Candidate> {
        let mut order: Vec<&Candidate> = request.candidates.iter().collect();
        let seed =
            harness_core::call_seed(self.seed ^ request.seed.rotate_left(17), request.attempt);
        order.shuffle(&mut ChaCha8Rng::seed_from_u64(seed));
        order
    }

    /// The conversation of one ballot request.
    pub fn prompt(&self, request: &VoteRequest) -> Vec<ChatMessage> {
        let mode = match request.mode {
            SelectionMode::Rescue => {
                "The base harness H0 already failed this task in training and is not a candidate."
            }
            SelectionMode::Inference => "The base harness H0 is a candidate like the others.",
        };
        let system = format!(
            "You route an agent task to the execution harnesses most likely to make the same policy succeed. {mode} Rank exactly {n} distinct candidates, best first, using the candidates' behaviour profiles (when they help or hinder relative to H0), their validation success, and their outcomes on similar validation tasks.\nAnswer with one JSON object and nothing else: {{\"ranking\": [\"<candidate id>\", ...]}} with exactly {n} ids from the list.",
            n = request.ballot_len
        );
        let mut user = format!(
            "Task {} (environment {}):\n{}\n\nCandidates:\n",
            request.task.id,
            request.task.env,
            cut_text(request.task.instruction.trim(), 4000)
        );
        for c in self.order(request) {
            let _ = writeln!(
                user,
                "- id {} | {}{} | validation success {:.2}",
                c.id,
                c.name,
                if c.is_base { " (H0)" } else { "" },
                c.validation_success
            );
            if !c.description.trim().is_empty() {
                let _ = writeln!(
                    user,
                    "  description: {}",
                    cut_text(c.description.trim(), 400)
                );
            }
            if let Some(p) = &c.profile {
                for (label, entries) in [("prefer", &p.prefer), ("avoid", &p.avoid)] {
                    for e in entries.iter().take(self.settings.max_entries) {
                        let _ = writeln!(
                            user,
                            "  {label} when {}: {} ({} tasks)",
                            cut_text(&e.when, 300),
                            cut_text(&e.behavior, 300),
                            e.support.len()
                        );
                    }
                }
            }
        }
        if !request.similar.is_empty() {
            user.push_str("\nSimilar validation tasks (success per candidate id):\n");
            for s in request.similar.iter().take(self.settings.max_similar) {
                let rates: Vec<String> = self
                    .order(request)
                    .iter()
                    .filter_map(|c| s.success.get(&c.id).map(|r| format!("{}={r:.2}", c.id)))
                    .collect();
                let _ = writeln!(
                    user,
                    "- {} (similarity {:.2}): {} | {}",
                    s.task_id,
                    s.similarity,
                    cut_text(s.instruction.trim(), 200),
                    rates.join(", ")
                );
            }
        }
        vec![ChatMessage::system(system), ChatMessage::user(user)]
    }
}

#[async_trait]
impl Voter for LlmVoter {
    fn name(&self) -> &str {
        &self.name
    }

    async fn vote(&self, request: &VoteRequest) -> Result<VoteAnswer> {
        let chat = ChatRequest {
            purpose: VOTER_ROLE.into(),
            messages: self.prompt(request),
            temperature: self.settings.temperature,
            max_tokens: self.settings.max_tokens,
            seed: Some(request.seed),
            format: OutputFormat::JsonObject,
        };
        Ok(match self.model.complete(chat).await {
            Ok(answer) => {
                self.tokens.record(VOTER_ROLE, answer.usage);
                VoteAnswer {
                    ballot: parse_ballot_text(&answer.text),
                    usage: answer.usage,
                }
            }
            // The client already retried transport failures; the router counts this ballot as
            // dropped instead of failing the selection.
            Err(e) => VoteAnswer {
                ballot: Err(BallotError::VoterFailed {
                    message: e.to_string(),
                }),
                usage: None,
            },
        })
    }
}
