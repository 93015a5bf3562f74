//! A trainable Qwen- or Llama-family policy on candle.
//!
//! `grpo-candle` is the learning half of harness-s. It holds a dense decoder of the Qwen2, Qwen3,
//! Llama or Mistral family whose every parameter receives gradients, Qwen's ChatML template rendered natively, a KV-cached batched
//! sampler that returns per-token log-probs, a [`harness_core::Policy`] implementation on top of
//! them, HF-format checkpoints, and the paper's GRPO objective and trainer. It knows nothing about
//! environments: it consumes groups of trajectories that the rollout code produced.
//!
//! # Map
//! - [`model`]: the stateless decoder ([`Qwen`]; Qwen2, Qwen3, Llama and Mistral share it),
//!   trainable end to end, with an explicit [`KvCache`] for sampling; [`config`] reads HF
//!   `config.json`.
//! - [`fused`]: the training forward's CPU ops with their own backward (RMSNorm, rotary
//!   embedding, SwiGLU, causal attention with memory linear in the sequence length).
//! - [`checkpoint`]: [`PolicyModel`] = model + tokenizer + chat template + stop tokens, loaded from
//!   a folder or the hub ([`loading`]), created fresh and tiny from a seed, saved in HF format;
//!   [`gguf`] imports llama.cpp's GGUF files (dequantised) as HF folders.
//! - [`chat_template`]: Qwen ChatML rendering; [`tokenizer`]: `tokenizer.json` helpers and the
//!   built-in byte-level BPE.
//! - [`sampler`]: batched KV-cached decoding with per-token log-probs;
//!   [`policy`]: [`CandlePolicy`], harness-core's `Policy`.
//! - [`logprob`], [`objective`], [`trainer`]: the chunked log-prob op (CUDA kernels with the
//!   `cuda` feature), the GRPO loss, the trainer.
//! - [`teacher`], [`sft`]: the warm start: a reference solver's turns recorded in the policy's own
//!   tokens, and supervised updates on them.
//!
//! # Log-prob conventions
//! [`CandlePolicy`] reports in `PolicyTurn::logprobs` the log-probability of each sampled token
//! under the distribution it was actually drawn from (temperature, top-k, top-p applied and
//! renormalised): that is `q` of the paper's Eq. 16. The trainer's `pi_old` is the model at its
//! configured temperature over the full vocabulary, so the detached weight
//! `clip(pi_old / q, 0, 2)` is an importance weight only when rollouts are sampled at that
//! temperature without top-k or top-p; [`Trainer::step`](trainer::Trainer::step) checks the
//! settings every trajectory records and refuses others. Greedy turns have `q = 1` (log-prob 0).
//! The raw model log-probs are available from the [`sampler`] ([`Sample::raw_logprobs`]).
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

#[cfg(feature = "cuda")]
mod cuda;
pub mod fused;
pub mod learner;
pub mod logprob;
pub mod objective;
pub mod trainer;

pub mod chat_template;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod gguf;
pub mod loading;
pub mod model;
pub mod policy;
pub mod prefix_cache;
pub mod sampler;
pub mod sft;
pub mod teacher;
pub mod tokenizer;

pub use chat_template::ChatTemplate;
pub use checkpoint::{PolicyModel, TinySpec};
pub use config::{Arch, QwenConfig, RopeScaling};
pub use error::{Error, Result};
pub use gguf::{GgufImport, ImportSummary, import_gguf};
pub use loading::ModelFiles;
pub use model::{KvCache, Qwen};
pub use policy::{CandlePolicy, PolicyOptions, PolicyStats, UpdateGuard};
pub use prefix_cache::{PrefixCache, PrefixCacheConfig, PrefixCacheStats};
pub use sampler::{DecodeBatch, Sample, SampleRequest};
pub use sft::{SftConfig, SftTrainer};
pub use teacher::TeacherForcedPolicy;
