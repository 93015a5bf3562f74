//! The [`Policy`] seam: the trainable model that acts inside episodes.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::Result;
use crate::chat::ChatMessage;
use crate::env::ToolSpec;

/// How to sample a turn. A [`Policy`] samples with these settings and reports its log-probs
/// under them (see [`PolicyTurn::logprobs`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingParams {
    /// Softmax temperature; 0 means greedy.
    pub temperature: f32,
    /// Nucleus sampling mass (1.0 disables it).
    pub top_p: f32,
    /// Keep only the k most likely tokens (`None` disables it).
    #[serde(default)]
    pub top_k: Option<usize>,
    /// Generation stops after any of these strings (the string is kept in the output).
    #[serde(default)]
    pub stop: Vec<String>,
}

/// The shape a generation must take. [`OutputFormat::JsonObject`] asks the engine to constrain
/// decoding so that the text is one JSON object (OpenAI's `response_format: {"type":
/// "json_object"}`, served by vLLM, SGLang and this project's server): tokens that would break
/// the syntax are never drawn, and generation ends when the object closes. The object's fields are
/// not constrained: callers still validate them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputFormat {
    /// Free text.
    #[default]
    Text,
    /// One JSON object, syntactically valid once generation ends on its own.
    JsonObject,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            stop: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            ..Self::default()
        }
    }

    /// Whether these settings decode greedily (temperature 0).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// The settings a turn was sampled with, as its trajectory records them: the distribution the
/// turn's log-probs (`q`, Eq. 16) are probabilities under.
///
/// A trainer whose `pi_old` is the model at one temperature over the full vocabulary can use
/// `clip(pi_old / q, 0, 2)` as an importance weight only when `q` is that same distribution: not
/// greedy, no top-p or top-k truncation, the same temperature. With a nucleus, `q` is
/// renormalised over the kept tokens and the weight is biased on every token; with greedy
/// decoding the token is drawn from a point mass and its recorded log q is 0.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TurnSampling {
    /// Softmax temperature (0 when greedy).
    pub temperature: f32,
    /// Nucleus mass (1: no nucleus truncation).
    pub top_p: f32,
    /// Top-k truncation (`None`: none).
    #[serde(default)]
    pub top_k: Option<usize>,
    /// Greedy decoding: each token is the most likely one and its recorded log q is 0 (a point
    /// mass), whatever the model's probability of it.
    pub greedy: bool,
}

impl TurnSampling {
    /// Whether `q` was renormalised over a truncated vocabulary (top-p < 1 or a top-k).
    pub fn is_truncated(&self) -> bool {
        self.top_p < 1.0 || self.top_k.is_some()
    }
}

impl From<&SamplingParams> for TurnSampling {
    fn from(p: &SamplingParams) -> Self {
        TurnSampling {
            temperature: p.temperature,
            top_p: p.top_p,
            top_k: p.top_k,
            greedy: p.is_greedy(),
        }
    }
}

/// One call to a [`Policy`]: the rendered context of an episode at one point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyRequest {
    /// The conversation so far, as the harness renders it.
    pub messages: Vec<ChatMessage>,
    /// The tools the harness shows.
    pub tools: Vec<ToolSpec>,
    /// Upper bound on generated tokens (the harness's output limit).
    pub max_new_tokens: usize,
    /// Upper bound on prompt tokens (the harness's context limit).
    pub max_context_tokens: usize,
    /// How to sample.
    pub sampling: SamplingParams,
    /// Seed for this call; the same request and seed give the same turn.
    pub seed: u64,
}

/// Why a turn's generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// An end-of-turn token or stop string.
    Stop,
    /// `max_new_tokens` was reached.
    Length,
    /// The prompt exceeded `max_context_tokens`; nothing was generated.
    ContextOverflow,
}

/// One generated turn with what training needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyTurn {
    /// The generated text (decoded from `tokens`).
    pub text: String,
    /// The prompt token ids the turn was generated from (the generating context).
    pub context_tokens: Vec<u32>,
    /// The generated token ids.
    pub tokens: Vec<u32>,
    /// The rollout backend's log-probability of each generated token (`q` in the paper's
    /// Eq. 16), one per entry of `tokens`: under the distribution the token was drawn from with
    /// the request's [`SamplingParams`] (temperature, then top-k and top-p, renormalised), so 0
    /// for greedy decoding. The episode records those settings beside the turn
    /// ([`TurnSampling`]) so that a trainer can check them.
    pub logprobs: Vec<f32>,
    /// Why generation stopped.
    pub finish: FinishReason,
}

impl PolicyTurn {
    /// A turn from a policy without a tokenizer (scripted or reference solvers): one pseudo token
    /// per byte of the text, cut at `max_new_tokens`, each with log-prob 0, and no context tokens.
    /// Such turns drive episodes but are not training data for a real model.
    pub fn text_only(text: impl Into<String>, max_new_tokens: usize) -> Self {
        let text = text.into();
        let tokens: Vec<u32> = text.bytes().take(max_new_tokens).map(u32::from).collect();
        let finish = if tokens.len() < text.len() {
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        PolicyTurn {
            text,
            context_tokens: Vec::new(),
            logprobs: vec![0.0; tokens.len()],
            tokens,
            finish,
        }
    }
}

/// A model that produces the next turn of an episode.
///
/// # Example
/// `examples/custom_policy.rs` in the repository implements a policy with a sampling distribution of its own, its turns' tokens and log-probs as a trainer needs them
/// (`cargo run --release --example custom_policy`; `tests/extension_examples.rs` runs it).
///
/// # Design
/// The policy renders the messages itself (chat template, tokenizer), so it reports the exact
/// prompt tokens it used: the trainer recomputes probabilities in that generating context, and
/// the rollout log-probs feed the importance weight of Eq. 16. Batching across concurrent
/// episodes is the implementation's business: the loop calls `generate` from many tasks at once.
#[async_trait]
pub trait Policy: Send + Sync {
    /// A short name for logs and errors.
    fn name(&self) -> &str;

    /// Generate one turn.
    async fn generate(&self, request: PolicyRequest) -> Result<PolicyTurn>;

    /// The version of the weights this policy samples from, when it tracks one: a trainer
    /// whose updates reach the policy by a weight sync (a remote learner, a serving engine)
    /// compares it with its own version before sampling, so a lost or failed sync stops the
    /// run instead of training on rollouts from stale weights. `None` (the default): the
    /// policy does not track versions.
    fn weights_version(&self) -> Option<u64> {
        None
    }

    /// The prompt tokens [`Policy::generate`] would feed the model for `request`, without
    /// generating. The `h0` rescue objective re-renders rescued turns under H0's context with it
    /// (`crate::objective::h0_request`). The default says the policy cannot: a remote engine or a
    /// scripted policy has no chat template here.
    fn render_prompt(&self, request: &PolicyRequest) -> Result<Vec<u32>> {
        let _ = request;
        Err(crate::Error::Policy {
            policy: self.name().to_string(),
            message: "cannot render a prompt without generating (no chat template in process); the `h0` rescue objective needs a policy that can, such as grpo-candle's CandlePolicy".into(),
        })
    }
}
