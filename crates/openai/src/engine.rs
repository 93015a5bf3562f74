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
    ChatMessage, FinishReason, OutputFormat, Policy, PolicyRequest, PolicyTurn, Result,
    SamplingParams, ToolSpec,
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

    /// The prompt ids of `messages` when `prefix` holds the exact tokens of everything up to
    /// and including the content of the assistant message `assistant` (the context and generated
    /// tokens of the turn that produced it): `prefix` followed by the tokens of the rest, or
    /// `None` when the template does not render that history as a prefix. Reusing generated
    /// tokens keeps each turn's context an extension of the previous turn's (re-tokenizing
    /// generated text may split it differently), so the trainer can pack the turns. The default
    /// never reuses.
    fn encode_continuation(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        assistant: usize,
        prefix: &[u32],
    ) -> Result<Option<Vec<u32>>> {
        let _ = (messages, tools, assistant, prefix);
        Ok(None)
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
    /// Free text, or one JSON object (constrained decoding where the generator has it).
    #[serde(default)]
    pub format: OutputFormat,
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

/// One token of a streamed generation, sent as soon as it is sampled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StreamedToken {
    /// Which of the request's `n` choices it belongs to.
    pub choice: usize,
    /// The token id.
    pub token: u32,
    /// Its log-prob (as in [`TokenOutput::logprobs`]).
    pub logprob: f32,
}

/// Where a streaming generation sends its tokens. Dropping the receiving end cancels: the
/// generator stops decoding the request's sequences at its next token.
pub type TokenSink = tokio::sync::mpsc::UnboundedSender<StreamedToken>;

/// The seed of choice `choice` of a request seeded `seed`: choice 0 keeps the request's seed
/// (so `n = 1` and the first of `n` choices agree), the others get distinct derived seeds.
pub fn choice_seed(seed: u64, choice: usize) -> u64 {
    if choice == 0 {
        seed
    } else {
        harness_core::call_seed(seed, choice as u32)
    }
}

/// A sampler over token ids with per-token log-probs.
///
/// # Design
/// Implementations batch concurrent calls themselves (grpo-candle's sampler gathers concurrent
/// requests into one decoding batch); callers such as the server simply call `generate` from
/// many tasks at once and never serialise them. [`TokenGenerator::generate_choices`] is the
/// serving-engine entry point (OpenAI's `n` and `stream`): its default runs `n` independent
/// [`TokenGenerator::generate`] calls and replays their tokens, an engine overrides it to
/// prefill the prompt once for all choices, stream tokens as they are drawn and stop decoding
/// when the client goes away.
#[async_trait]
pub trait TokenGenerator: Send + Sync {
    /// The vocabulary size: valid token ids are `0..vocab_size()`.
    fn vocab_size(&self) -> usize;

    /// Whether the generator can still answer; `Err` says why not (an engine whose decoding
    /// thread died). The server's `/health` reports it.
    fn health(&self) -> std::result::Result<(), String> {
        Ok(())
    }

    /// Generate from `request.prompt`.
    async fn generate(&self, request: TokenRequest) -> Result<TokenOutput>;

    /// `n` samples of `request.prompt`, choice `i` seeded with [`choice_seed`]`(request.seed,
    /// i)` (so each equals [`TokenGenerator::generate`] with that seed), in choice order. With a
    /// `sink`, every token is also sent there, tagged with its choice, in each choice's order;
    /// once the sink's receiver is gone the generator stops and returns what the choices hold
    /// (cut short, with [`FinishReason::Length`]).
    ///
    /// The default runs the `n` calls concurrently and sends each choice's tokens when it is
    /// done; dropping the sink's receiver drops the calls still running.
    async fn generate_choices(
        &self,
        request: TokenRequest,
        n: usize,
        sink: Option<TokenSink>,
    ) -> Result<Vec<TokenOutput>> {
        use futures::StreamExt;
        let calls = (0..n).map(|choice| {
            let request = TokenRequest {
                seed: choice_seed(request.seed, choice),
                ..request.clone()
            };
            async move { (choice, self.generate(request).await) }
        });
        let mut running: futures::stream::FuturesUnordered<_> = calls.collect();
        let mut outputs: Vec<Option<TokenOutput>> = vec![None; n];
        while let Some((choice, out)) = running.next().await {
            let out = out?;
            if let Some(sink) = &sink {
                let gone = out
                    .tokens
                    .iter()
                    .zip(&out.logprobs)
                    .any(|(&token, &logprob)| {
                        sink.send(StreamedToken {
                            choice,
                            token,
                            logprob,
                        })
                        .is_err()
                    });
                if gone {
                    drop(running);
                    return Ok(outputs
                        .into_iter()
                        .enumerate()
                        .map(|(i, o)| match o {
                            Some(o) => o,
                            None if i == choice => out.clone(),
                            None => TokenOutput {
                                tokens: Vec::new(),
                                logprobs: Vec::new(),
                                finish: FinishReason::Length,
                            },
                        })
                        .collect());
                }
            }
            outputs[choice] = Some(out);
        }
        Ok(outputs
            .into_iter()
            .map(|o| o.expect("every choice finished"))
            .collect())
    }
}

#[async_trait]
impl<T: TokenGenerator + ?Sized> TokenGenerator for Arc<T> {
    fn vocab_size(&self) -> usize {
        (**self).vocab_size()
    }

    fn health(&self) -> std::result::Result<(), String> {
        (**self).health()
    }

    async fn generate(&self, request: TokenRequest) -> Result<TokenOutput> {
        (**self).generate(request).await
    }

    async fn generate_choices(
        &self,
        request: TokenRequest,
        n: usize,
        sink: Option<TokenSink>,
    ) -> Result<Vec<TokenOutput>> {
        (**self).generate_choices(request, n, sink).await
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

    fn encode_continuation(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        assistant: usize,
        prefix: &[u32],
    ) -> Result<Option<Vec<u32>>> {
        (**self).encode_continuation(messages, tools, assistant, prefix)
    }
}

/// Recent turns (context + generated tokens) keyed by the conversation they answered and their
/// text, so that later prompts reuse their exact tokens (see
/// [`PromptEncoder::encode_continuation`]).
#[derive(Debug)]
pub(crate) struct TurnMemory {
    capacity: usize,
    inner: std::sync::Mutex<TurnStore>,
}

/// Insertion order (for eviction) and the remembered tokens by key.
type TurnStore = (
    std::collections::VecDeque<u64>,
    std::collections::HashMap<u64, Vec<u32>>,
);

fn turn_key(messages: &[ChatMessage], tools: &[ToolSpec], text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for m in messages {
        (m.role as u8, &m.content, &m.name).hash(&mut h);
    }
    for t in tools {
        (&t.name, &t.description, t.parameters.to_string()).hash(&mut h);
    }
    text.hash(&mut h);
    h.finish()
}

impl TurnMemory {
    pub(crate) fn new(capacity: usize) -> Self {
        TurnMemory {
            capacity,
            inner: Default::default(),
        }
    }

    /// Remember the turn generated for `messages` + `tools`.
    pub(crate) fn remember(&self, messages: &[ChatMessage], tools: &[ToolSpec], turn: &PolicyTurn) {
        if self.capacity == 0 || turn.tokens.is_empty() {
            return;
        }
        let key = turn_key(messages, tools, &turn.text);
        let mut tokens = turn.context_tokens.clone();
        tokens.extend(&turn.tokens);
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (order, map) = &mut *guard;
        if map.insert(key, tokens).is_none() {
            order.push_back(key);
        }
        while order.len() > self.capacity {
            if let Some(old) = order.pop_front() {
                map.remove(&old);
            }
        }
    }

    /// The prompt of `messages`, continuing the latest remembered assistant turn when the
    /// encoder can.
    pub(crate) fn encode(
        &self,
        encoder: &dyn PromptEncoder,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
    ) -> Result<Vec<u32>> {
        for j in (0..messages.len()).rev() {
            if messages[j].role != harness_core::Role::Assistant {
                continue;
            }
            let key = turn_key(&messages[..j], tools, &messages[j].content);
            let prefix = {
                let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
                guard.1.get(&key).cloned()
            };
            if let Some(prefix) = prefix
                && let Some(tokens) = encoder.encode_continuation(messages, tools, j, &prefix)?
            {
                return Ok(tokens);
            }
        }
        encoder.encode(messages, tools)
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
    memory: TurnMemory,
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
            memory: TurnMemory::new(4096),
        }
    }
}

#[async_trait]
impl Policy for EncodedPolicy {
    fn name(&self) -> &str {
        &self.name
    }

    async fn generate(&self, request: PolicyRequest) -> Result<PolicyTurn> {
        let context = self
            .memory
            .encode(&*self.encoder, &request.messages, &request.tools)?;
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
                format: OutputFormat::Text,
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
        let turn = PolicyTurn {
            text: self.encoder.decode(&out.tokens)?,
            context_tokens: context,
            tokens: out.tokens,
            logprobs: out.logprobs,
            finish: out.finish,
        };
        self.memory
            .remember(&request.messages, &request.tools, &turn);
        Ok(turn)
    }
}
