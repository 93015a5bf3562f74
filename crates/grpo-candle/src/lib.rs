//! A trainable Qwen-family policy on candle.
//!
//! `grpo-candle` is the learning half of harness-s. It holds a Qwen2/Qwen3 dense decoder whose every
//! parameter receives gradients, Qwen's ChatML template rendered natively, a KV-cached batched
//! sampler that returns per-token log-probs, a [`harness_core::Policy`] implementation on top of
//! them, HF-format checkpoints, and the paper's GRPO objective and trainer. It knows nothing about
//! environments: it consumes groups of trajectories that the rollout code produced.

pub mod logprob;
pub mod objective;
pub mod trainer;

pub mod chat_template;
pub mod checkpoint;
pub mod config;
pub mod error;
pub mod loading;
pub mod model;
pub mod sampler;
pub mod tokenizer;

pub use config::{Arch, QwenConfig};
pub use error::{Error, Result};
pub use model::{KvCache, Qwen};
