//! A trainable Qwen- or Llama-family policy on candle.
//!
//! `grpo-candle` is the learning half of harness-s. It holds a dense decoder of the Qwen2, Qwen3,
//! Llama or Mistral family whose every parameter receives gradients, Qwen's ChatML template rendered natively, a KV-cached batched
//! sampler that returns per-token log-probs, a [`harness_core::Policy`] implementation on top of
//! them, HF-format checkpoints, and the paper's GRPO objective and trainer. It knows nothing about
//! environments: it consumes groups of trajectories that the rollout code produced.
//!
//! # Map
//! Four layers, each importing only those below it (checked by the workspace's
//! `tests/architecture.rs`); [`error`] sits under all of them.
//! - [`ops`]: tensor kernels with their own backward. [`fused`](ops::fused): the training forward's CPU ops
//!   (RMSNorm, rotary embedding, SwiGLU, softmax, causal attention with memory linear in the
//!   sequence length); [`logprob`](ops::logprob): the chunked lm_head → log-prob op (CUDA kernels with the
//!   `cuda` feature); [`ops::reference`]: the plain implementations they are tested against;
//!   [`ops::rowdot`]: a decoding step's weight products as dot products of rows.
//! - [`model`]: the stateless decoder ([`Qwen`]; Qwen2, Qwen3, Llama and Mistral share it),
//!   trainable end to end, with an explicit [`KvCache`] for sampling; [`config`](model::config) reads HF
//!   `config.json`; [`checkpoint`](model::checkpoint): [`PolicyModel`] = model + tokenizer + chat template + stop
//!   tokens, loaded from a folder or, with the `hub` feature, the hub ([`loading`](model::loading)), created
//!   fresh and tiny from a seed, saved in HF format; [`gguf`](model::gguf) imports llama.cpp's GGUF files
//!   (dequantised) as HF folders; [`lora`](model::lora) merges a remote learner's PEFT LoRA adapter into a
//!   snapshot of the initial weights ([`PeftAdapter`], [`BaseWeights`]); [`chat_template`](model::chat_template): Qwen ChatML rendering; [`tokenizer`](model::tokenizer):
//!   `tokenizer.json` helpers and the built-in byte-level BPE.
//! - [`sample`]: [`sampler`](sample::sampler), batched KV-cached decoding with per-token log-probs, with its
//!   [`prefix_cache`](sample::prefix_cache) and JSON-constrained rows ([`sample::json`]); [`policy`](sample::policy):
//!   [`CandlePolicy`], harness-core's `Policy`.
//! - [`train`]: [`objective`](train::objective), [`trainer`](train::trainer): the GRPO loss and the trainer; [`teacher`](train::teacher), [`sft`](train::sft):
//!   the warm start, a reference solver's turns recorded in the policy's own tokens and
//!   supervised updates on them; [`learner`](train::learner): harness-core's `Learner` on the trainer.
//!
//! Each module has one path, under its layer (`grpo_candle::train::trainer`,
//! `grpo_candle::model::config`, ...); the types most users need are also at the top
//! ([`CandlePolicy`], [`PolicyModel`], [`Qwen`], ...).
//!
//! # Log-prob conventions
//! [`CandlePolicy`] reports in `PolicyTurn::logprobs` the log-probability of each sampled token
//! under the distribution it was actually drawn from (temperature, top-k, top-p applied and
//! renormalised): that is `q` of the paper's Eq. 16. The trainer's `pi_old` is the model at its
//! configured temperature over the full vocabulary, so the detached weight
//! `clip(pi_old / q, 0, 2)` is an importance weight only when rollouts are sampled at that
//! temperature without top-k or top-p; [`Trainer::step`](train::trainer::Trainer::step) checks the
//! settings every trajectory records and refuses others. Greedy turns have `q = 1` (log-prob 0).
//! The raw model log-probs are available from the [`sampler`](sample::sampler) ([`Sample::raw_logprobs`]).
//!
//! # Example
//! ```
//! use candle_core::{DType, Device};
//! use grpo_candle::{CandlePolicy, PolicyModel, PolicyOptions, TinySpec};
//! use harness_core::{ChatMessage, PolicyRequest, SamplingParams};
//!
//! let tiny = PolicyModel::tiny(&TinySpec { num_merges: 16, ..TinySpec::default() }, DType::F32, &Device::Cpu)?;
//! let policy = CandlePolicy::new(tiny, PolicyOptions::default());
//! let turn = policy.generate_blocking(PolicyRequest {
//!     messages: vec![ChatMessage::user("Hello")],
//!     tools: vec![],
//!     max_new_tokens: 4,
//!     max_context_tokens: 1024,
//!     sampling: SamplingParams::default(),
//!     seed: 7,
//! })?;
//! assert_eq!(turn.tokens.len(), turn.logprobs.len());
//! # Ok::<(), grpo_candle::Error>(())
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod error;
pub mod model;
pub mod ops;
pub mod sample;
pub mod train;

pub use error::{Error, Result};
pub use model::chat_template::ChatTemplate;
pub use model::checkpoint::{PolicyModel, TinySpec};
pub use model::config::{Arch, QwenConfig, RopeScaling};
pub use model::gguf::{GgufImport, ImportSummary, import_gguf};
pub use model::loading::ModelFiles;
pub use model::lora::{BaseWeights, PeftAdapter};
pub use model::{KvCache, Qwen};
pub use sample::policy::{CandlePolicy, PolicyOptions, PolicyStats, UpdateGuard};
pub use sample::prefix_cache::{PrefixCache, PrefixCacheConfig, PrefixCacheStats};
pub use sample::sampler::{DecodeBatch, Sample, SampleRequest};
pub use train::sft::{SftConfig, SftTrainer};
pub use train::teacher::TeacherForcedPolicy;

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
