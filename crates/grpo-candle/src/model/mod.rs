//! The model layer: the decoder and everything that turns files into one (configuration,
//! checkpoint loading and saving, GGUF import, tokenizer, chat template). It uses [`crate::ops`]
//! and nothing above it.
//!
//! - [`decoder`]: the stateless decoder ([`Qwen`]; Qwen2, Qwen3, Llama and Mistral share it),
//!   trainable end to end, with an explicit [`KvCache`] for sampling. Its items are re-exported
//!   here, with the differentiable ops it is built from, so `model::Qwen` and
//!   `model::token_logprobs` name them.
//! - [`config`]: HF `config.json`; [`loading`]: a folder or the hub; [`checkpoint`]: model,
//!   tokenizer, chat template and stop tokens together; [`gguf`]: llama.cpp's GGUF files as HF
//!   folders; [`lora`]: PEFT LoRA adapters merged into a snapshot of the initial weights.
//! - [`tokenizer`]: `tokenizer.json` helpers and the built-in byte-level BPE; [`chat_template`]:
//!   ChatML rendering.

pub mod chat_template;
pub mod checkpoint;
pub mod config;
pub mod decoder;
pub mod gguf;
pub mod loading;
pub mod lora;
pub mod tokenizer;

pub use crate::ops::fused::softmax_last_dim;
pub use crate::ops::reference::{
    rms_norm_primitive, rope, softmax_last_dim_primitive, token_logprobs,
};
pub use decoder::{KvCache, Qwen, rms_norm, score_continuation};
pub use lora::{BaseWeights, PeftAdapter};
