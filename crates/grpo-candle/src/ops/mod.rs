//! The bottom layer: tensor kernels with their own backward, on the CPU and (with the `cuda`
//! feature) in CUDA, and the plain implementations they are tested against. Nothing here knows
//! about models, sampling or training; it uses only [`crate::error`].
//!
//! - [`reference`](mod@reference): RMSNorm, softmax, the rotary embedding and token log-probs
//!   from differentiable candle primitives.
//! - [`fused`]: the training forward's CPU ops (RMSNorm, rotary embedding, SwiGLU, softmax, causal
//!   attention with memory linear in the sequence length), falling back to those and to tensor
//!   ops elsewhere, and the CPU helpers the other kernels share.
//! - [`rowdot`]: `x @ wᵀ` as dot products of rows, for decoding steps: weights read once, and
//!   a row's result independent of the other rows multiplied with it.
//! - [`isa`]: which vector instructions these kernels and candle's matmuls run here.
//! - [`logprob`]: the chunked lm_head → log-prob op; its CUDA kernels (`cuda.rs`,
//!   `cuda/logprob.cu`, compiled by `build.rs`) sit behind the `cuda` feature.

#[cfg(feature = "cuda")]
mod cuda;
pub mod fused;
pub mod isa;
pub mod logprob;
pub mod reference;
pub mod rowdot;
