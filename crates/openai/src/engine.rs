//! The token-level seams: [`PromptEncoder`] (chat template + tokenizer) and [`TokenGenerator`]
//! (a sampler over token ids), and [`EncodedPolicy`], the in-process [`Policy`] built from them.
//!
//! # Design
//! A serving engine works on token ids; a [`Policy`] works on messages. Splitting the policy into
//! "render and tokenize" and "sample from token ids" lets the same two pieces serve every path:
//! [`EncodedPolicy`] runs them in process, [`crate::RemotePolicy`] encodes locally and samples on
//! vLLM/SGLang, and [`crate::server`] exposes a generator over HTTP. Because the prompt ids are
//! computed on the client in every case, the trainer always sees the exact generating context.
//! This crate does not depend on candle: grpo-candle's chat template and tokenizer implement
//! [`PromptEncoder`], its sampler implements [`TokenGenerator`].

use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{
    ChatMessage, FinishReason, Policy, PolicyRequest, PolicyTurn, Result, SamplingParams, ToolSpec,
};
use serde::{Deserialize, Serialize};

/// Renders a conversation through a chat template and tokenizes it.
pub trait PromptEncoder: Send + Sync {
    /// The prompt token ids of `messages` with `tools` rendered into the template, ending with
    /// the assistant generation prompt (e.g. `<|im_start|>assistant\n` for ChatML).
    fn encode(&self, messages: &[ChatMessage], tools: &[ToolSpec]) -> Result<Vec<u32>>;

    /// The text of generated tokens (special tokens such as `<|im_end|>` dropped).
    fn decode(&self, tokens: &[u32]) -> Result<String>;

    /// Token ids of plain text (no template); used for text prompts of `/v1/completions`.
    fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        Err(harness_core::Error::Policy {
            policy: "prompt encoder".into(),
            message: format!(
                "this encoder cannot tokenize plain text ({} bytes); send token ids",
                text.len()
            ),
        })
    }
}

/// One generation over token ids.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenRequest {
    /// The prompt token ids.
    pub prompt: Vec<u32>,
    /// Upper bound on generated tokens.
    pub max_new_tokens: usize,
    /// How to sample.
    pub sampling: SamplingParams,
    /// The seed; the same prompt, parameters and seed give the same tokens.
    pub seed: u64,
}

/// What a [`TokenGenerator`] produced.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenOutput {
    /// The generated token ids (an end-of-turn token included when one ended generation).
    pub tokens: Vec<u32>,
    /// The log-probability of each generated token under the distribution it was sampled from.
    pub logprobs: Vec<f32>,
    /// [`FinishReason::Stop`] or [`FinishReason::Length`].
    pub finish: FinishReason,
}

/// A sampler over token ids with per-token log-probs.
///
/// # Design
/// Implementations batch concurrent calls themselves (grpo-candle's sampler gathers concurrent
/// requests into one decoding batch); callers such as the server simply call `generate` from
/// many tasks at once and never serialise them.
#[async_trait]
pub trait TokenGenerator: Send + Sync {
    /// The vocabulary size: valid token ids are `0..vocab_size()`.
    fn vocab_size(&self) -> usize;

    /// Generate from `request.prompt`.
    async fn generate(&self, request: TokenRequest) -> Result<TokenOutput>;
}

#[async_trait]
impl<T: TokenGenerator + ?Sized> TokenGenerator for Arc<T> {
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }

    async fn generate(&self, request: TokenRequest) -> Result<TokenOutput> {
        (**self).generate(request).await
    }
}

impl<T: PromptEncoder + ?Sized> PromptEncoder for Arc<T> {
    fn encode(&self, messages: &[ChatMessage], tools: &[ToolSpec]) -> Result<Vec<u32>> {
        (**self).encode(messages, tools)
    }

    fn decode(&self, tokens: &[u32]) -> Result<String> {
        (**self).decode(tokens)
    }

    fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        (**self).encode_text(text)
    }
}

/// The turn for a prompt longer than the context limit: nothing is generated.
pub(crate) fn overflow_turn(context_tokens: Vec<u32>) -> PolicyTurn {
    PolicyTurn {
        text: String::new(),
        context_tokens,
        tokens: Vec::new(),
        logprobs: Vec::new(),
        finish: FinishReason::ContextOverflow,
    }
}

/// Check a generator's output against its contract: one log-prob per token, finite
/// non-positive log-probs, token ids in the vocabulary.
pub(crate) fn check_output(
    output: &TokenOutput,
    max_new_tokens: usize,
    vocab: Option<usize>,
) -> std::result::Result<(), String> {
    if output.tokens.len() != output.logprobs.len() {
        return Err(format!(
            "{} tokens but {} log-probs",
            output.tokens.len(),
            output.logprobs.len()
        ));
    }
    if output.tokens.len() > max_new_tokens {
        return Err(format!(
            "{} tokens generated with max_new_tokens = {max_new_tokens}",
            output.tokens.len()
        ));
    }
    if let Some((i, lp)) = output
        .logprobs
        .iter()
        .enumerate()
        .find(|(_, lp)| !(lp.is_finite() || **lp == f32::NEG_INFINITY) || **lp > 1e-4)
    {
        return Err(format!("log-prob {i} is {lp}, not a log-probability"));
    }
    if let Some(v) = vocab
        && let Some(t) = output.tokens.iter().find(|t| **t as usize >= v)
    {
        return Err(format!("token id {t} is outside the vocabulary of {v}"));
    }
    Ok(())
}

/// A [`Policy`] from a [`PromptEncoder`] and a [`TokenGenerator`] in the same process: the
/// reference that [`crate::RemotePolicy`] reproduces over HTTP.
pub struct EncodedPolicy {
    name: String,
    encoder: Arc<dyn PromptEncoder>,
    generator: Arc<dyn TokenGenerator>,
}

impl EncodedPolicy {
    /// A policy named `name`.
    pub fn new(
        name: impl Into<String>,
        encoder: Arc<dyn PromptEncoder>,
        generator: Arc<dyn TokenGenerator>,
    ) -> Self {
        EncodedPolicy {
            name: name.into(),
            encoder,
            generator,
        }
    }
}

#[async_trait]
impl Policy for EncodedPolicy {
    fn name(&self) -> &str {
        &self.name
    }

    async fn generate(&self, request: PolicyRequest) -> Result<PolicyTurn> {
        let context = self.encoder.encode(&request.messages, &request.tools)?;
        if context.len() > request.max_context_tokens {
            return Ok(overflow_turn(context));
        }
        let out = self
            .generator
            .generate(TokenRequest {
                prompt: context.clone(),
                max_new_tokens: request.max_new_tokens,
                sampling: request.sampling.clone(),
                seed: request.seed,
            })
            .await?;
        check_output(
            &out,
            request.max_new_tokens,
            Some(self.generator.vocab_size()),
        )
        .map_err(|message| harness_core::Error::Policy {
            policy: self.name.clone(),
            message,
        })?;
        Ok(PolicyTurn {
            text: self.encoder.decode(&out.tokens)?,
            context_tokens: context,
            tokens: out.tokens,
            logprobs: out.logprobs,
            finish: out.finish,
        })
    }
}
