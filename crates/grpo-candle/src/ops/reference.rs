//! The plain implementations the fused ops are tested against and fall back to off the CPU:
//! RMSNorm, softmax and the rotary embedding from differentiable candle primitives, and
//! token log-probs by a full log-softmax. They need nothing else from this crate.

use candle_core::{D, DType, Tensor};

use crate::error::Result;

/// [`rms_norm`](crate::model::rms_norm) from differentiable primitives.
pub fn rms_norm_primitive(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    let dtype = x.dtype();
    let work = if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    };
    let xf = x.to_dtype(work)?;
    let var = xf.sqr()?.mean_keepdim(D::Minus1)?;
    let normed = xf.broadcast_div(&(var + eps)?.sqrt()?)?.to_dtype(dtype)?;
    Ok(normed.broadcast_mul(weight)?)
}

/// Softmax over the last dim from differentiable primitives.
pub fn softmax_last_dim_primitive(x: &Tensor) -> Result<Tensor> {
    let max = x.max_keepdim(D::Minus1)?.detach();
    let e = x.broadcast_sub(&max)?.exp()?;
    Ok(e.broadcast_div(&e.sum_keepdim(D::Minus1)?)?)
}

/// Rotary embedding in transformers' "rotate half" layout: `x * cos + rotate_half(x) * sin` with
/// `x` `[B, heads, T, d]` and `cos`/`sin` `[B, 1, T, d]`. Differentiable.
pub fn rope(x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    let d = x.dim(D::Minus1)?;
    let x1 = x.narrow(D::Minus1, 0, d / 2)?;
    let x2 = x.narrow(D::Minus1, d / 2, d / 2)?;
    let rotated = Tensor::cat(&[&x2.neg()?, &x1], D::Minus1)?;
    Ok((x.broadcast_mul(cos)? + rotated.broadcast_mul(sin)?)?)
}

/// Log-probabilities `[N]` of `targets` under `logits` `[N, vocab]` (full log-softmax; for tests and
/// small vocabularies).
pub fn token_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let logits = logits.to_dtype(DType::F32)?;
    let max = logits.max_keepdim(D::Minus1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(D::Minus1)?.log()?;
    let logp = shifted.broadcast_sub(&lse)?;
    Ok(logp.gather(&targets.unsqueeze(1)?, 1)?.squeeze(1)?)
}
