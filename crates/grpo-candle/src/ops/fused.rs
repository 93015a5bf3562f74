//! Fused CPU kernels, each with its own backward, for the model's training hot path.
//!
//! Built from candle primitives, one decoder layer is a few dozen small tensor ops forward and
//! about twice that backward, each allocating its output and, on two or more threads, crossing a
//! barrier. On small models that per-op cost, not arithmetic, bounds a training step. The ops here
//! do the same maths in one pass each, on contiguous CPU tensors in f32 or f64:
//!
//! - [`rms_norm`]: RMSNorm with a weight; gradients to the input and the weight.
//! - [`rope_to_heads`]: the rotary embedding, reading `[B, T, H, d]` and writing `[B, H, T, d]`,
//!   so the transpose before attention is part of the same pass.
//! - [`swiglu`]: `silu(gate) * up`.
//! - [`causal_attention`]: grouped-query causal attention that never keeps the `[T, T]` scores:
//!   the forward stores one log-sum-exp per query row and the backward recomputes the
//!   probabilities block by block, as flash attention does. Extra memory is a few blocks of at most
//!   [`ATTENTION_BLOCK_ELEMS`] elements, not `batch x heads x T x T` per layer. The block matmuls go
//!   through candle's CPU matmul (the `gemm` crate); masking, softmax and its gradient are loops
//!   over the block.
//!
//! Each function checks [`fusable`] and otherwise falls back to candle ops (CUDA, half
//! precision): differentiable primitives for the elementwise ops, and for attention
//! [`causal_attention_tensor_ops`], the same blocked algorithm with memory linear in `T`. Callers
//! need not care which path runs. Tests compare every path with the primitives, values and
//! gradients.

use std::sync::{Mutex, OnceLock};

use candle_core::backend::BackendStorage;
use candle_core::{
    CpuStorage, CustomOp2, CustomOp3, D, DType, Layout, Shape, Storage, Tensor, WithDType,
};
use num_traits::Float;

use crate::error::Result;
use crate::ops::reference::softmax_last_dim_primitive;

/// Elements of a scores block in [`causal_attention`] (16 MiB in f32): it bounds how many
/// (batch, key/value head) items share one block of 64 query positions. One block of scores and,
/// in the backward, one block of their gradients are alive at a time.
pub const ATTENTION_BLOCK_ELEMS: usize = 1 << 22;

/// Whether the fused CPU kernels apply to `t`: on the CPU in f32 or f64.
pub fn fusable(t: &Tensor) -> bool {
    t.device().is_cpu() && matches!(t.dtype(), DType::F32 | DType::F64)
}

/// Elements each parallel unit should hold at least, so that dispatch stays cheap.
const UNIT_ELEMS: usize = 1 << 14;

/// Runs `f(i, item)` for every item, in parallel on candle's CPU thread pool when there is more
/// than one item. Items are typically disjoint `&mut` chunks of output buffers.
/// Inside a rayon worker (the trainer's concurrent micro-batches) it runs inline: the other
/// cores are busy with the other micro-batches.
pub(crate) fn par_each<W: Send>(items: Vec<W>, f: impl Fn(usize, W) + Sync) {
    if items.len() <= 1
        || candle_core::utils::get_num_threads() <= 1
        || rayon::current_thread_index().is_some()
    {
        for (i, w) in items.into_iter().enumerate() {
            f(i, w);
        }
        return;
    }
    let slots: Vec<Mutex<Option<W>>> = items.into_iter().map(|w| Mutex::new(Some(w))).collect();
    candle_core::utils::barrier_pool().execute_chunked(slots.len(), |range| {
        for i in range {
            let item = slots[i].lock().map(|mut s| s.take()).unwrap_or(None);
            if let Some(w) = item {
                f(i, w);
            }
        }
    });
}

/// Rows per parallel unit for rows of `width` elements.
pub(crate) fn rows_per_unit(width: usize) -> usize {
    (UNIT_ELEMS / width.max(1)).max(1)
}

/// The contiguous elements a layout addresses in a CPU storage.
fn contiguous_slice<'a, T: WithDType>(
    s: &'a CpuStorage,
    l: &Layout,
    what: &str,
) -> candle_core::Result<&'a [T]> {
    let Some((start, end)) = l.contiguous_offsets() else {
        candle_core::bail!("{what}: input must be contiguous")
    };
    Ok(&s.as_slice::<T>()?[start..end])
}

/// Reads a contiguous CPU tensor's elements.
pub(crate) fn cpu_slice<T: WithDType, R>(
    t: &Tensor,
    f: impl FnOnce(&[T]) -> candle_core::Result<R>,
) -> candle_core::Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    match &*storage {
        Storage::Cpu(cpu) => {
            let all = cpu.as_slice::<T>()?;
            let start = layout.start_offset();
            f(&all[start..start + layout.shape().elem_count()])
        }
        _ => candle_core::bail!("cpu_slice: tensor is not on the cpu"),
    }
}

/// The forward methods of a [`CustomOp3`] whose result is computed beforehand (with tensor ops
/// on detached inputs) and passed as its third argument: they hand back a copy of it, on every
/// device, and the op's `bwd` does the real work.
macro_rules! forward_returns_third_arg {
    () => {
        fn cpu_fwd(
            &self,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
            _: &candle_core::CpuStorage,
            _: &candle_core::Layout,
            s3: &candle_core::CpuStorage,
            l3: &candle_core::Layout,
        ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
            use candle_core::backend::BackendStorage;
            Ok((s3.try_clone(l3)?, l3.shape().clone()))
        }

        fn cuda_fwd(
            &self,
            _: &candle_core::CudaStorage,
            _: &candle_core::Layout,
            _: &candle_core::CudaStorage,
            _: &candle_core::Layout,
            s3: &candle_core::CudaStorage,
            l3: &candle_core::Layout,
        ) -> candle_core::Result<(candle_core::CudaStorage, candle_core::Shape)> {
            #[allow(unused_imports)]
            use candle_core::backend::BackendStorage;
            Ok((s3.try_clone(l3)?, l3.shape().clone()))
        }

        fn metal_fwd(
            &self,
            _: &candle_core::MetalStorage,
            _: &candle_core::Layout,
            _: &candle_core::MetalStorage,
            _: &candle_core::Layout,
            s3: &candle_core::MetalStorage,
            l3: &candle_core::Layout,
        ) -> candle_core::Result<(candle_core::MetalStorage, candle_core::Shape)> {
            #[allow(unused_imports)]
            use candle_core::backend::BackendStorage;
            Ok((s3.try_clone(l3)?, l3.shape().clone()))
        }
    };
}
pub(crate) use forward_returns_third_arg;

// ---------------------------------------------------------------------------------------------
// RMSNorm

/// RMSNorm over the last dim with a weight: `x / sqrt(mean(x^2) + eps) * weight`. Fused on the
/// CPU in f32/f64 (gradients to `x` and `weight`); elsewhere the differentiable primitives of
/// [`crate::ops::reference::rms_norm_primitive`].
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let h = x.dim(D::Minus1)?;
    if weight.dims() != [h] {
        candle_core::bail!(
            "rms_norm: weight is {:?}, expected [{h}] for input {:?}",
            weight.dims(),
            x.dims()
        );
    }
    if fusable(x) && weight.dtype() == x.dtype() && weight.device().is_cpu() {
        return x
            .contiguous()?
            .apply_op2(&weight.contiguous()?, RmsNormOp { eps });
    }
    crate::ops::reference::rms_norm_primitive(x, weight, eps).map_err(candle_core::Error::wrap)
}

struct RmsNormOp {
    eps: f64,
}

fn rms_norm_fwd<T: WithDType + Float>(x: &[T], w: &[T], eps: f64) -> Vec<T> {
    let h = w.len();
    let mut out = vec![T::zero(); x.len()];
    let per = rows_per_unit(h) * h;
    let eps = T::from(eps).unwrap_or_else(T::zero);
    let n = T::from(h).unwrap_or_else(T::one);
    let items: Vec<(&[T], &mut [T])> = x.chunks(per).zip(out.chunks_mut(per)).collect();
    par_each(items, |_, (xs, ys)| {
        for (xr, yr) in xs.chunks_exact(h).zip(ys.chunks_exact_mut(h)) {
            let ss = xr.iter().fold(T::zero(), |a, &v| a + v * v);
            let r = T::one() / (ss / n + eps).sqrt();
            for ((y, &xv), &wv) in yr.iter_mut().zip(xr).zip(w) {
                *y = xv * r * wv;
            }
        }
    });
    out
}

/// `(dx, dw)` of RMSNorm for upstream gradient `g`.
fn rms_norm_bwd<T: WithDType + Float>(x: &[T], w: &[T], g: &[T], eps: f64) -> (Vec<T>, Vec<T>) {
    let h = w.len();
    let mut dx = vec![T::zero(); x.len()];
    let per = rows_per_unit(h) * h;
    let units = x.len().div_ceil(per.max(1));
    let mut dw_parts = vec![vec![T::zero(); h]; units];
    let eps = T::from(eps).unwrap_or_else(T::zero);
    let n = T::from(h).unwrap_or_else(T::one);
    let items: Vec<_> = x
        .chunks(per)
        .zip(g.chunks(per))
        .zip(dx.chunks_mut(per))
        .zip(dw_parts.iter_mut())
        .collect();
    par_each(items, |_, (((xs, gs), dxs), dw)| {
        for ((xr, gr), dxr) in xs
            .chunks_exact(h)
            .zip(gs.chunks_exact(h))
            .zip(dxs.chunks_exact_mut(h))
        {
            let ss = xr.iter().fold(T::zero(), |a, &v| a + v * v);
            let r = T::one() / (ss / n + eps).sqrt();
            // a = g * w, normed = x * r; dx = r * (a - normed * mean(a * normed)).
            let mut dot = T::zero();
            for ((&xv, &gv), &wv) in xr.iter().zip(gr).zip(w) {
                dot += gv * wv * xv * r;
            }
            let c = dot / n;
            for ((((d, &xv), &gv), &wv), dwv) in
                dxr.iter_mut().zip(xr).zip(gr).zip(w).zip(dw.iter_mut())
            {
                let normed = xv * r;
                *d = r * (gv * wv - normed * c);
                *dwv += gv * normed;
            }
        }
    });
    let mut dw = vec![T::zero(); h];
    for part in &dw_parts {
        for (a, &b) in dw.iter_mut().zip(part) {
            *a += b;
        }
    }
    (dx, dw)
}

impl CustomOp2 for RmsNormOp {
    fn name(&self) -> &'static str {
        "grpo-rms-norm"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let out = match s1.dtype() {
            DType::F32 => CpuStorage::F32(rms_norm_fwd(
                contiguous_slice::<f32>(s1, l1, "rms_norm")?,
                contiguous_slice::<f32>(s2, l2, "rms_norm")?,
                self.eps,
            )),
            DType::F64 => CpuStorage::F64(rms_norm_fwd(
                contiguous_slice::<f64>(s1, l1, "rms_norm")?,
                contiguous_slice::<f64>(s2, l2, "rms_norm")?,
                self.eps,
            )),
            other => candle_core::bail!("rms_norm: fused path takes f32 or f64, not {other:?}"),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        fn run<T: WithDType + Float>(
            x: &Tensor,
            w: &Tensor,
            g: &Tensor,
            eps: f64,
        ) -> candle_core::Result<(Tensor, Tensor)> {
            let (dx, dw) = cpu_slice::<T, _>(x, |xs| {
                cpu_slice::<T, _>(w, |ws| {
                    cpu_slice::<T, _>(g, |gs| Ok(rms_norm_bwd(xs, ws, gs, eps)))
                })
            })?;
            Ok((
                Tensor::from_vec(dx, x.shape(), x.device())?,
                Tensor::from_vec(dw, w.shape(), w.device())?,
            ))
        }
        let g = g.to_dtype(x.dtype())?;
        let (dx, dw) = match x.dtype() {
            DType::F32 => run::<f32>(x, w, &g, self.eps)?,
            _ => run::<f64>(x, w, &g, self.eps)?,
        };
        Ok((Some(dx), Some(dw)))
    }
}

// ---------------------------------------------------------------------------------------------
// Rotary embedding

/// The rotary embedding in transformers' "rotate half" layout, with a transpose: `x` is
/// `[B, T, H, d]`, `cos` and `sin` hold `B x T x d` elements (`[B, 1, T, d]` or `[B, T, d]`), and
/// the result is `[B, H, T, d]`, contiguous. Fused on the CPU in f32/f64 (gradient to `x`; `cos`
/// and `sin` are treated as constants); elsewhere transpose + [`crate::ops::reference::rope`].
pub fn rope_to_heads(x: &Tensor, cos: &Tensor, sin: &Tensor) -> candle_core::Result<Tensor> {
    let (b, t, _, d) = x.dims4()?;
    if d % 2 != 0 {
        candle_core::bail!("rope: head dim {d} is odd");
    }
    if cos.elem_count() != b * t * d || sin.elem_count() != b * t * d {
        candle_core::bail!(
            "rope: cos {:?} and sin {:?} must hold {b} x {t} x {d} elements",
            cos.dims(),
            sin.dims()
        );
    }
    if fusable(x) && cos.dtype() == x.dtype() && sin.dtype() == x.dtype() {
        return x.contiguous()?.apply_op3(
            &cos.detach().contiguous()?,
            &sin.detach().contiguous()?,
            RopeOp,
        );
    }
    let cos = cos.reshape((b, 1, t, d))?;
    let sin = sin.reshape((b, 1, t, d))?;
    let xt = x.transpose(1, 2)?.contiguous()?;
    crate::ops::reference::rope(&xt, &cos, &sin).map_err(candle_core::Error::wrap)
}

struct RopeOp;

/// The rotation: `src` is `[B, T, H, d]`, the result `[B, H, T, d]`.
fn rope_apply<T: WithDType + Float>(
    src: &[T],
    cos: &[T],
    sin: &[T],
    (b, t, h, d): (usize, usize, usize, usize),
) -> Vec<T> {
    let half = d / 2;
    let mut out = vec![T::zero(); src.len()];
    debug_assert_eq!(src.len(), b * t * h * d);
    // One unit per (batch, head): T rows of d.
    let items: Vec<&mut [T]> = out.chunks_mut(t * d).collect();
    par_each(items, |unit, dst| {
        let (bi, hi) = (unit / h, unit % h);
        for ti in 0..t {
            let tab = (bi * t + ti) * d;
            let (c, s) = (&cos[tab..tab + d], &sin[tab..tab + d]);
            // Index of row (bi, ti, hi) in [B, T, H, d].
            let bthd = ((bi * t + ti) * h + hi) * d;
            let x = &src[bthd..bthd + d];
            let y = &mut dst[ti * d..(ti + 1) * d];
            for i in 0..half {
                let (x1, x2) = (x[i], x[i + half]);
                y[i] = x1 * c[i] - x2 * s[i];
                y[i + half] = x2 * c[i + half] + x1 * s[i + half];
            }
        }
    });
    out
}

/// Gradient of [`rope_apply`]: `g` is `[B, H, T, d]`, the result `[B, T, H, d]`.
fn rope_backward<T: WithDType + Float>(
    g: &[T],
    cos: &[T],
    sin: &[T],
    (b, t, h, d): (usize, usize, usize, usize),
) -> Vec<T> {
    let half = d / 2;
    let mut out = vec![T::zero(); g.len()];
    debug_assert_eq!(g.len(), b * t * h * d);
    // One unit per (batch, position): H rows of d.
    let items: Vec<&mut [T]> = out.chunks_mut(h * d).collect();
    par_each(items, |unit, dst| {
        let (bi, ti) = (unit / t, unit % t);
        let tab = (bi * t + ti) * d;
        let (c, s) = (&cos[tab..tab + d], &sin[tab..tab + d]);
        for hi in 0..h {
            let bhtd = ((bi * h + hi) * t + ti) * d;
            let gy = &g[bhtd..bhtd + d];
            let dx = &mut dst[hi * d..(hi + 1) * d];
            for i in 0..half {
                let (g1, g2) = (gy[i], gy[i + half]);
                dx[i] = g1 * c[i] + g2 * s[i + half];
                dx[i + half] = g2 * c[i + half] - g1 * s[i];
            }
        }
    });
    out
}

impl CustomOp3 for RopeOp {
    fn name(&self) -> &'static str {
        "grpo-rope-to-heads"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let (b, t, h, d) = l1.shape().dims4()?;
        let dims = (b, t, h, d);
        let out = match s1.dtype() {
            DType::F32 => CpuStorage::F32(rope_apply(
                contiguous_slice::<f32>(s1, l1, "rope")?,
                contiguous_slice::<f32>(s2, l2, "rope")?,
                contiguous_slice::<f32>(s3, l3, "rope")?,
                dims,
            )),
            DType::F64 => CpuStorage::F64(rope_apply(
                contiguous_slice::<f64>(s1, l1, "rope")?,
                contiguous_slice::<f64>(s2, l2, "rope")?,
                contiguous_slice::<f64>(s3, l3, "rope")?,
                dims,
            )),
            other => candle_core::bail!("rope: fused path takes f32 or f64, not {other:?}"),
        };
        Ok((out, Shape::from((b, h, t, d))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        _res: &Tensor,
        g: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        fn run<T: WithDType + Float>(
            x: &Tensor,
            cos: &Tensor,
            sin: &Tensor,
            g: &Tensor,
        ) -> candle_core::Result<Tensor> {
            let dims = x.dims4()?;
            let dx = cpu_slice::<T, _>(g, |gs| {
                cpu_slice::<T, _>(cos, |c| {
                    cpu_slice::<T, _>(sin, |s| Ok(rope_backward(gs, c, s, dims)))
                })
            })?;
            Tensor::from_vec(dx, x.shape(), x.device())
        }
        let g = g.to_dtype(x.dtype())?;
        let dx = match x.dtype() {
            DType::F32 => run::<f32>(x, cos, sin, &g)?,
            _ => run::<f64>(x, cos, sin, &g)?,
        };
        Ok((Some(dx), None, None))
    }
}

// ---------------------------------------------------------------------------------------------
// SwiGLU

/// `silu(gate) * up` for tensors of one shape. Fused on the CPU in f32/f64 (gradients to both);
/// elsewhere candle's `silu` and a product.
pub fn swiglu(gate: &Tensor, up: &Tensor) -> candle_core::Result<Tensor> {
    if gate.dims() != up.dims() {
        candle_core::bail!(
            "swiglu: gate {:?} and up {:?} differ",
            gate.dims(),
            up.dims()
        );
    }
    if fusable(gate) && up.dtype() == gate.dtype() {
        return gate.contiguous()?.apply_op2(&up.contiguous()?, SwigluOp);
    }
    gate.silu()? * up
}

struct SwigluOp;

fn sigmoid<T: Float + FastExp>(x: T) -> T {
    T::one() / (T::one() + (-x).fast_exp())
}

fn swiglu_fwd<T: WithDType + Float + FastExp>(g: &[T], u: &[T]) -> Vec<T> {
    let mut out = vec![T::zero(); g.len()];
    let items: Vec<_> = g
        .chunks(UNIT_ELEMS)
        .zip(u.chunks(UNIT_ELEMS))
        .zip(out.chunks_mut(UNIT_ELEMS))
        .collect();
    par_each(items, |_, ((gs, us), ys)| {
        for ((y, &gv), &uv) in ys.iter_mut().zip(gs).zip(us) {
            *y = gv * sigmoid(gv) * uv;
        }
    });
    out
}

fn swiglu_bwd<T: WithDType + Float + FastExp>(g: &[T], u: &[T], dy: &[T]) -> (Vec<T>, Vec<T>) {
    let mut dg = vec![T::zero(); g.len()];
    let mut du = vec![T::zero(); g.len()];
    let items: Vec<_> = g
        .chunks(UNIT_ELEMS)
        .zip(u.chunks(UNIT_ELEMS))
        .zip(dy.chunks(UNIT_ELEMS))
        .zip(dg.chunks_mut(UNIT_ELEMS).zip(du.chunks_mut(UNIT_ELEMS)))
        .collect();
    par_each(items, |_, (((gs, us), dys), (dgs, dus))| {
        for ((((&gv, &uv), &d), dgv), duv) in gs
            .iter()
            .zip(us)
            .zip(dys)
            .zip(dgs.iter_mut())
            .zip(dus.iter_mut())
        {
            let s = sigmoid(gv);
            let silu = gv * s;
            *duv = d * silu;
            *dgv = d * uv * s * (T::one() + gv * (T::one() - s));
        }
    });
    (dg, du)
}

impl CustomOp2 for SwigluOp {
    fn name(&self) -> &'static str {
        "grpo-swiglu"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        let out = match s1.dtype() {
            DType::F32 => CpuStorage::F32(swiglu_fwd(
                contiguous_slice::<f32>(s1, l1, "swiglu")?,
                contiguous_slice::<f32>(s2, l2, "swiglu")?,
            )),
            DType::F64 => CpuStorage::F64(swiglu_fwd(
                contiguous_slice::<f64>(s1, l1, "swiglu")?,
                contiguous_slice::<f64>(s2, l2, "swiglu")?,
            )),
            other => candle_core::bail!("swiglu: fused path takes f32 or f64, not {other:?}"),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        gate: &Tensor,
        up: &Tensor,
        _res: &Tensor,
        dy: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>)> {
        fn run<T: WithDType + Float + FastExp>(
            gate: &Tensor,
            up: &Tensor,
            dy: &Tensor,
        ) -> candle_core::Result<(Tensor, Tensor)> {
            let (dg, du) = cpu_slice::<T, _>(gate, |g| {
                cpu_slice::<T, _>(up, |u| cpu_slice::<T, _>(dy, |d| Ok(swiglu_bwd(g, u, d))))
            })?;
            Ok((
                Tensor::from_vec(dg, gate.shape(), gate.device())?,
                Tensor::from_vec(du, up.shape(), up.device())?,
            ))
        }
        let dy = dy.to_dtype(gate.dtype())?;
        let (dg, du) = match gate.dtype() {
            DType::F32 => run::<f32>(gate, up, &dy)?,
            _ => run::<f64>(gate, up, &dy)?,
        };
        Ok((Some(dg), Some(du)))
    }
}

// ---------------------------------------------------------------------------------------------
// Softmax

/// Differentiable softmax over the last dim.
///
/// On the CPU in f32/f64 it is one fused pass that keeps only its output for the backward pass
/// (`dx = p * (g - sum(g * p))`); elsewhere it is built from primitives (the max is a detached
/// constant), which candle differentiates but which keeps every intermediate.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    if x.device().is_cpu() && matches!(x.dtype(), DType::F32 | DType::F64) {
        return Ok(x.contiguous()?.apply_op1(FusedSoftmax)?);
    }
    softmax_last_dim_primitive(x)
}

/// Row-wise softmax with its own backward (CPU, f32/f64).
struct FusedSoftmax;

fn softmax_rows<T: num_traits::Float + FastExp + Send + Sync>(
    src: &[T],
    out: &mut [T],
    width: usize,
) {
    out.copy_from_slice(src);
    let per = rows_per_unit(width) * width.max(1);
    let items: Vec<&mut [T]> = out.chunks_mut(per).collect();
    par_each(items, |_, rows| {
        for row in rows.chunks_exact_mut(width) {
            softmax_in_place(row);
        }
    });
}

impl candle_core::CustomOp1 for FusedSoftmax {
    fn name(&self) -> &'static str {
        "grpo-softmax-last-dim"
    }

    fn cpu_fwd(
        &self,
        storage: &candle_core::CpuStorage,
        layout: &candle_core::Layout,
    ) -> candle_core::Result<(candle_core::CpuStorage, candle_core::Shape)> {
        use candle_core::CpuStorage;
        let Some((start, end)) = layout.contiguous_offsets() else {
            candle_core::bail!("softmax: input must be contiguous")
        };
        let width = layout.dims().last().copied().unwrap_or(1);
        let out = match storage {
            CpuStorage::F32(v) => {
                let mut out = vec![0f32; end - start];
                softmax_rows(&v[start..end], &mut out, width);
                CpuStorage::F32(out)
            }
            CpuStorage::F64(v) => {
                let mut out = vec![0f64; end - start];
                softmax_rows(&v[start..end], &mut out, width);
                CpuStorage::F64(out)
            }
            _ => candle_core::bail!("softmax: only f32 and f64"),
        };
        Ok((out, layout.shape().clone()))
    }

    fn bwd(
        &self,
        _arg: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<Option<Tensor>> {
        let dot = (grad_res * res)?.sum_keepdim(D::Minus1)?;
        Ok(Some((res * grad_res.broadcast_sub(&dot)?)?))
    }
}

// ---------------------------------------------------------------------------------------------
// Causal attention

/// Causal grouped-query attention of full sequences (no cache, no padding): `q` is
/// `[B, heads, T, d]`, `k` and `v` are `[B, kv_heads, T, d]`, query head `h` reads key/value head
/// `h / (heads / kv_heads)`, and position `i` attends to positions `0..=i`. Returns
/// `[B, T, heads * d]` (the layout the output projection reads), with gradients to `q`, `k`, `v`.
///
/// Fused on the CPU in f32/f64 (see the module docs); elsewhere
/// [`causal_attention_tensor_ops`]. Memory is linear in `T` on both paths.
pub fn causal_attention(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
) -> candle_core::Result<Tensor> {
    causal_attention_blocked(q, k, v, scale, ATTENTION_BLOCK_ELEMS)
}

/// [`causal_attention`] with a given block size (tests use small blocks to cover the splits).
pub(crate) fn causal_attention_blocked(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    block_elems: usize,
) -> candle_core::Result<Tensor> {
    let (b, nh, t, d) = q.dims4()?;
    let (kb, kvh, kt, kd) = k.dims4()?;
    if (kb, kt, kd) != (b, t, d) || v.dims() != k.dims() || kvh == 0 || nh % kvh != 0 {
        candle_core::bail!(
            "causal_attention: q {:?}, k {:?}, v {:?} are not [B, H, T, d] and [B, KV, T, d] with KV dividing H",
            q.dims(),
            k.dims(),
            v.dims()
        );
    }
    if fusable(q) && k.dtype() == q.dtype() && v.dtype() == q.dtype() {
        let op = AttentionOp {
            shape: AttnShape {
                b,
                nh,
                kvh,
                t,
                d,
                scale,
            },
            block_elems: block_elems.max(1),
            lse: OnceLock::new(),
        };
        return q
            .contiguous()?
            .apply_op3(&k.contiguous()?, &v.contiguous()?, op);
    }
    causal_attention_tensor_ops(q, k, v, scale, TENSOR_QUERY_BLOCK)
}

/// Query positions per block of [`causal_attention_tensor_ops`].
const TENSOR_QUERY_BLOCK: usize = 256;

/// The same blocked algorithm as the fused CPU kernel, from candle tensor ops, for any device
/// and dtype (CUDA: cuBLAS matmuls and candle's kernels): the forward walks blocks of `qb`
/// query positions against the keys up to the block's end, keeps the output and one
/// log-sum-exp per query row, and the backward recomputes each block's probabilities. Scores
/// exist one block at a time (`B x heads x qb x T`), never `B x heads x T x T` per layer.
/// Softmax maths is in f32 (f64 for f64 inputs).
pub fn causal_attention_tensor_ops(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    qb: usize,
) -> candle_core::Result<Tensor> {
    let t = q.dim(2)?;
    let kvh = k.dim(1)?;
    let qb = qb.clamp(1, t.max(1));
    let (out, lse) = blocked_forward(&q.detach(), &k.detach(), &v.detach(), scale, qb)?;
    // k and v travel as one argument (the op has three): candle's `cat` backward splits the
    // gradient between them.
    let kv = Tensor::cat(&[k, v], 1)?;
    let op = BlockedAttention {
        lse,
        scale,
        qb,
        kvh,
    };
    q.apply_op3(&kv, &out, op)
}

/// Softmax dtype for `dtype`: f64 stays f64, everything else is f32.
fn work_dtype(dtype: DType) -> DType {
    if dtype == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// Additive causal mask of a block: `[groups * (t1 - t0), t1]`, row `i` (position
/// `t0 + i % (t1 - t0)`) sees columns up to its position. Built on the device (no host copy).
fn block_mask(
    groups: usize,
    t0: usize,
    t1: usize,
    dtype: DType,
    device: &candle_core::Device,
) -> candle_core::Result<Tensor> {
    let rows = groups * (t1 - t0);
    let cols = Tensor::arange(0u32, t1 as u32, device)?.unsqueeze(0)?;
    let pos = Tensor::arange(t0 as u32, t1 as u32, device)?
        .repeat(groups)?
        .unsqueeze(1)?;
    let visible = cols.broadcast_le(&pos)?;
    let open = Tensor::zeros((rows, t1), dtype, device)?;
    let shut = Tensor::full(f32::NEG_INFINITY, (rows, t1), device)?.to_dtype(dtype)?;
    visible.where_cond(&open, &shut)
}

/// A block's queries `[B, kvh, groups * qb, d]` (heads sharing a key/value head stacked).
fn block_queries(q: &Tensor, kvh: usize, t0: usize, t1: usize) -> candle_core::Result<Tensor> {
    let (b, nh, _, d) = q.dims4()?;
    q.narrow(2, t0, t1 - t0)?
        .contiguous()?
        .reshape((b, kvh, (nh / kvh) * (t1 - t0), d))
}

/// Scaled, masked scores of a block, `[B, kvh, groups * qb, t1]` in the mask's (work) dtype.
fn block_scores(
    qs: &Tensor,
    kp: &Tensor,
    mask: &Tensor,
    scale: f64,
) -> candle_core::Result<Tensor> {
    (qs.matmul(&kp.t()?)?.to_dtype(mask.dtype())? * scale)?.broadcast_add(mask)
}

/// Output `[B, T, heads * d]` and log-sum-exps `[B, kvh, groups, T]` (work dtype).
fn blocked_forward(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
    qb: usize,
) -> candle_core::Result<(Tensor, Tensor)> {
    let (b, nh, t, d) = q.dims4()?;
    let kvh = k.dim(1)?;
    let groups = nh / kvh;
    let work = work_dtype(q.dtype());
    let mut outs = Vec::new();
    let mut lses = Vec::new();
    for t0 in (0..t).step_by(qb) {
        let t1 = (t0 + qb).min(t);
        let qs = block_queries(q, kvh, t0, t1)?;
        let kp = k.narrow(2, 0, t1)?;
        let vp = v.narrow(2, 0, t1)?;
        let mask = block_mask(groups, t0, t1, work, q.device())?;
        let s = block_scores(&qs, &kp, &mask, scale)?;
        let m = s.max_keepdim(D::Minus1)?;
        let e = s.broadcast_sub(&m)?.exp()?;
        let sum = e.sum_keepdim(D::Minus1)?;
        let p = e.broadcast_div(&sum)?;
        let lse = (m + sum.log()?)?;
        let o = p.to_dtype(q.dtype())?.matmul(&vp.contiguous()?)?;
        outs.push(o.reshape((b, nh, t1 - t0, d))?);
        lses.push(lse.reshape((b, kvh, groups, t1 - t0))?);
    }
    let out = Tensor::cat(&outs, 2)?
        .transpose(1, 2)?
        .reshape((b, t, nh * d))?
        .contiguous()?;
    Ok((out, Tensor::cat(&lses, 3)?.contiguous()?))
}

/// The op of [`causal_attention_tensor_ops`]: arguments `(q, cat(k, v), out)`; its forward hands
/// back `out` (computed beforehand), its backward recomputes block by block.
struct BlockedAttention {
    lse: Tensor,
    scale: f64,
    qb: usize,
    kvh: usize,
}

impl CustomOp3 for BlockedAttention {
    fn name(&self) -> &'static str {
        "grpo-causal-attention-blocked"
    }

    forward_returns_third_arg!();

    fn bwd(
        &self,
        q: &Tensor,
        kv: &Tensor,
        out: &Tensor,
        _res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (q, kv) = (q.detach(), kv.detach());
        let (b, nh, t, d) = q.dims4()?;
        let kvh = self.kvh;
        let groups = nh / kvh;
        let k = kv.narrow(1, 0, kvh)?.contiguous()?;
        let v = kv.narrow(1, kvh, kvh)?.contiguous()?;
        let work = work_dtype(q.dtype());
        // Upstream gradient as [B, heads, T, d], and D = rowsum(dO * O) as [B, kvh, groups, T].
        let g = grad
            .detach()
            .to_dtype(q.dtype())?
            .reshape((b, t, nh, d))?
            .transpose(1, 2)?
            .contiguous()?;
        let o = out.reshape((b, t, nh, d))?.transpose(1, 2)?.contiguous()?;
        let dsum = (g.to_dtype(work)? * o.to_dtype(work)?)?
            .sum(D::Minus1)?
            .reshape((b, kvh, groups, t))?;
        let dk = Tensor::zeros((b, kvh, t, d), work, q.device())?;
        let dv = Tensor::zeros((b, kvh, t, d), work, q.device())?;
        let mut dqs = Vec::new();
        for t0 in (0..t).step_by(self.qb) {
            let t1 = (t0 + self.qb).min(t);
            let rows = groups * (t1 - t0);
            let qs = block_queries(&q, kvh, t0, t1)?;
            let kp = k.narrow(2, 0, t1)?;
            let vp = v.narrow(2, 0, t1)?;
            let mask = block_mask(groups, t0, t1, work, q.device())?;
            let lse = self
                .lse
                .narrow(3, t0, t1 - t0)?
                .contiguous()?
                .reshape((b, kvh, rows, 1))?;
            let p = block_scores(&qs, &kp, &mask, self.scale)?
                .broadcast_sub(&lse)?
                .exp()?;
            let gs = block_queries(&g, kvh, t0, t1)?;
            let dr = dsum
                .narrow(3, t0, t1 - t0)?
                .contiguous()?
                .reshape((b, kvh, rows, 1))?;
            // dV += P^T dO; dS = P (dO V^T - D) scale; dQ = dS K; dK += dS^T Q.
            let dv_blk = p.t()?.matmul(&gs.to_dtype(work)?)?;
            let dp = gs.matmul(&vp.t()?)?.to_dtype(work)?;
            let ds = ((p * dp.broadcast_sub(&dr)?)? * self.scale)?;
            let dq = ds.matmul(&kp.to_dtype(work)?)?;
            let dk_blk = ds.t()?.matmul(&qs.to_dtype(work)?)?;
            let acc_dk = (dk.narrow(2, 0, t1)? + dk_blk)?;
            dk.slice_set(&acc_dk.contiguous()?, 2, 0)?;
            let acc_dv = (dv.narrow(2, 0, t1)? + dv_blk)?;
            dv.slice_set(&acc_dv.contiguous()?, 2, 0)?;
            dqs.push(dq.reshape((b, nh, t1 - t0, d))?);
        }
        let dq = Tensor::cat(&dqs, 2)?.to_dtype(q.dtype())?;
        let dkv = Tensor::cat(&[dk, dv], 1)?.to_dtype(kv.dtype())?;
        Ok((Some(dq), Some(dkv), None))
    }
}

/// The reference path: scores, additive causal mask, softmax, weighted sum; `O(T^2)` memory.
pub fn causal_attention_primitive(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    scale: f64,
) -> candle_core::Result<Tensor> {
    let (b, nh, t, d) = q.dims4()?;
    let kvh = k.dim(1)?;
    let groups = nh / kvh;
    let work = work_dtype(q.dtype());
    let qs = (q * scale)?.reshape((b, kvh, groups * t, d))?;
    let scores = qs.matmul(&k.t()?)?.to_dtype(work)?;
    let scores = scores.reshape((b, kvh, groups, t, t))?;
    let mask = block_mask(1, 0, t, work, q.device())?.reshape((1, 1, 1, t, t))?;
    let probs = softmax_last_dim(&scores.broadcast_add(&mask)?)
        .map_err(candle_core::Error::wrap)?
        .to_dtype(q.dtype())?;
    let out = probs.reshape((b, kvh, groups * t, t))?.matmul(v)?;
    out.reshape((b, nh, t, d))?
        .transpose(1, 2)?
        .reshape((b, t, nh * d))
}

#[derive(Debug, Clone, Copy)]
struct AttnShape {
    b: usize,
    nh: usize,
    kvh: usize,
    t: usize,
    d: usize,
    scale: f64,
}

/// Query positions per block: a block's keys stop at its last query, so smaller blocks skip
/// more of the masked upper triangle (64: 62.5% of the full square at T = 256) at the cost of
/// more, smaller matmuls.
const QUERY_BLOCK: usize = 64;

impl AttnShape {
    fn groups(&self) -> usize {
        self.nh / self.kvh
    }

    /// Query rows per item: the `groups` heads sharing a key/value head, stacked.
    fn rows(&self) -> usize {
        self.groups() * self.t
    }

    /// Items: (batch, key/value head) pairs.
    fn items(&self) -> usize {
        self.b * self.kvh
    }

    /// Scores blocks: for each run of items that fits in `budget`, each query head of the group
    /// and each run of [`QUERY_BLOCK`] positions.
    fn blocks(&self, budget: usize) -> Vec<Block> {
        let qb = QUERY_BLOCK.min(self.t).max(1);
        let per = (budget / (qb * self.t)).max(1);
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.items() {
            let n = per.min(self.items() - i);
            for group in 0..self.groups() {
                let mut t0 = 0;
                while t0 < self.t {
                    let t1 = (t0 + qb).min(self.t);
                    out.push(Block {
                        item0: i,
                        items: n,
                        group,
                        t0,
                        t1,
                    });
                    t0 = t1;
                }
            }
            i += n;
        }
        out
    }

    /// Index in `[B, T, heads * d]` of stacked row `r` of item `item`.
    fn out_row(&self, item: usize, r: usize) -> usize {
        let (bi, kv) = (item / self.kvh, item % self.kvh);
        let (g, ti) = (r / self.t, r % self.t);
        let head = kv * self.groups() + g;
        ((bi * self.t + ti) * self.nh + head) * self.d
    }
}

/// Queries at positions `t0..t1` of head `group` of items `item0..item0 + items`, against keys
/// `0..t1`.
#[derive(Debug, Clone, Copy)]
struct Block {
    item0: usize,
    items: usize,
    group: usize,
    t0: usize,
    t1: usize,
}

impl Block {
    /// Query rows per item.
    fn qb(&self) -> usize {
        self.t1 - self.t0
    }

    /// Block row `i`: its item, its stacked row within the item, and its position.
    fn row(&self, sh: &AttnShape, i: usize) -> (usize, usize, usize) {
        let item = self.item0 + i / self.qb();
        let pos = self.t0 + i % self.qb();
        (item, self.group * sh.t + pos, pos)
    }

    /// Layout of the block's query rows in a `[items, rows, d]` buffer starting at `start`.
    fn q_layout(&self, sh: &AttnShape, start: usize) -> Layout {
        let d = sh.d;
        Layout::new(
            Shape::from((self.items, self.qb(), d)),
            vec![sh.rows() * d, d, 1],
            start + (self.item0 * sh.rows() + self.group * sh.t + self.t0) * d,
        )
    }

    /// Layout of keys (or values) `0..t1` in a `[items, T, d]` buffer starting at `start`,
    /// transposed to `[items, d, t1]` when `transposed`.
    fn kv_layout(&self, sh: &AttnShape, start: usize, transposed: bool) -> Layout {
        let (t, d) = (sh.t, sh.d);
        let offset = start + self.item0 * t * d;
        if transposed {
            Layout::new(
                Shape::from((self.items, d, self.t1)),
                vec![t * d, 1, d],
                offset,
            )
        } else {
            Layout::new(
                Shape::from((self.items, self.t1, d)),
                vec![t * d, d, 1],
                offset,
            )
        }
    }

    /// Layout of the block's `[items, qb, t1]` scores, or their transpose.
    fn scores_layout(&self, transposed: bool) -> Layout {
        let (qb, t1) = (self.qb(), self.t1);
        if transposed {
            Layout::new(Shape::from((self.items, t1, qb)), vec![qb * t1, 1, t1], 0)
        } else {
            Layout::contiguous((self.items, qb, t1))
        }
    }

    /// Adds a `[items, t1, d]` block result into the first `t1` rows of each item of a
    /// `[items, T, d]` accumulator.
    fn add_kv<T: WithDType + Float>(
        &self,
        sh: &AttnShape,
        acc: &mut [T],
        src: &CpuStorage,
    ) -> candle_core::Result<()> {
        let src = T::cpu_storage_as_slice(src)?;
        let (t, d) = (sh.t, sh.d);
        for (i, part) in src.chunks_exact(self.t1 * d).enumerate() {
            let at = (self.item0 + i) * t * d;
            for (a, &b) in acc[at..at + self.t1 * d].iter_mut().zip(part) {
                *a += b;
            }
        }
        Ok(())
    }
}

struct AttentionOp {
    shape: AttnShape,
    block_elems: usize,
    /// Log-sum-exp of every stacked query row (`items x rows`), kept by the forward for the
    /// backward.
    lse: OnceLock<CpuStorage>,
}

fn attention_fwd<T: WithDType + Float + FastExp>(
    sh: &AttnShape,
    budget: usize,
    (q, ql): (&CpuStorage, &Layout),
    (k, kl): (&CpuStorage, &Layout),
    (v, vl): (&CpuStorage, &Layout),
) -> candle_core::Result<(Vec<T>, Vec<T>)> {
    let (d, rows) = (sh.d, sh.rows());
    let scale = T::from(sh.scale).unwrap_or_else(T::one);
    let mut out = vec![T::zero(); sh.b * sh.t * sh.nh * d];
    let mut lse = vec![T::zero(); sh.items() * rows];
    for blk in sh.blocks(budget) {
        let (qb, t1) = (blk.qb(), blk.t1);
        let s = q.matmul(
            k,
            (blk.items, qb, t1, d),
            &blk.q_layout(sh, ql.start_offset()),
            &blk.kv_layout(sh, kl.start_offset(), true),
        )?;
        let mut p: Vec<T> = T::cpu_storage_data(s)?;
        let mut block_lse = vec![T::zero(); blk.items * qb];
        let per = rows_per_unit(t1);
        let items: Vec<_> = p
            .chunks_mut(per * t1)
            .zip(block_lse.chunks_mut(per))
            .collect();
        par_each(items, |unit, (ps, ls)| {
            for (j, (row, l)) in ps.chunks_exact_mut(t1).zip(ls.iter_mut()).enumerate() {
                let (_, _, pos) = blk.row(sh, unit * per + j);
                *l = softmax_causal_row(row, pos, scale);
            }
        });
        let p = T::to_cpu_storage_owned(p);
        let o = p.matmul(
            v,
            (blk.items, qb, d, t1),
            &blk.scores_layout(false),
            &blk.kv_layout(sh, vl.start_offset(), false),
        )?;
        let o = T::cpu_storage_as_slice(&o)?;
        for (i, (src, &l)) in o.chunks_exact(d).zip(&block_lse).enumerate() {
            let (item, r, _) = blk.row(sh, i);
            let at = sh.out_row(item, r);
            out[at..at + d].copy_from_slice(src);
            lse[item * rows + r] = l;
        }
    }
    Ok((out, lse))
}

/// Scales the row, applies the causal mask (`pos + 1` visible entries), turns it into
/// probabilities in place and returns its log-sum-exp.
fn softmax_causal_row<T: Float + FastExp>(row: &mut [T], pos: usize, scale: T) -> T {
    let (vis, hidden) = row.split_at_mut(pos + 1);
    for x in vis.iter_mut() {
        *x = *x * scale;
    }
    hidden.fill(T::zero());
    softmax_in_place(vis)
}

/// Softmax of a row in place; returns its log-sum-exp. A row with no finite maximum is shifted
/// by 0, and a row whose exponentials sum to 0 becomes all zeros.
pub(crate) fn softmax_in_place<T: Float + FastExp>(row: &mut [T]) -> T {
    let m = max_of(row);
    let m = if m.is_finite() { m } else { T::zero() };
    for x in row.iter_mut() {
        *x = (*x - m).fast_exp();
    }
    let sum = sum_of(row);
    let inv = if sum > T::zero() {
        T::one() / sum
    } else {
        T::zero()
    };
    for x in row.iter_mut() {
        *x = *x * inv;
    }
    m + sum.ln()
}

/// Maximum of a slice (`-inf` when empty), in eight independent lanes so that it vectorises.
pub(crate) fn max_of<T: Float>(xs: &[T]) -> T {
    let mut lanes = [T::neg_infinity(); 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = if x > *l { x } else { *l };
        }
    }
    let mut m = T::neg_infinity();
    for &x in lanes.iter().chain(chunks.remainder()) {
        m = if x > m { x } else { m };
    }
    m
}

/// Sum of a slice, in eight independent lanes so that it vectorises.
fn sum_of<T: Float>(xs: &[T]) -> T {
    let mut lanes = [T::zero(); 8];
    let mut chunks = xs.chunks_exact(8);
    for c in &mut chunks {
        for (l, &x) in lanes.iter_mut().zip(c) {
            *l = *l + x;
        }
    }
    lanes
        .iter()
        .chain(chunks.remainder())
        .fold(T::zero(), |a, &x| a + x)
}

#[allow(clippy::too_many_arguments)]
fn attention_bwd<T: WithDType + Float + FastExp>(
    sh: &AttnShape,
    budget: usize,
    (q, ql): (&CpuStorage, &Layout),
    (k, kl): (&CpuStorage, &Layout),
    (v, vl): (&CpuStorage, &Layout),
    out: &[T],
    grad: &[T],
    lse: &[T],
) -> candle_core::Result<(Vec<T>, Vec<T>, Vec<T>)> {
    let (t, d, rows) = (sh.t, sh.d, sh.rows());
    let scale = T::from(sh.scale).unwrap_or_else(T::one);
    // Upstream gradient in the stacked layout [items, rows, d], and D = rowsum(dO * O).
    let mut dos = vec![T::zero(); sh.items() * rows * d];
    let mut dsum = vec![T::zero(); sh.items() * rows];
    for (i, (dst, ds)) in dos.chunks_exact_mut(d).zip(dsum.iter_mut()).enumerate() {
        let at = sh.out_row(i / rows, i % rows);
        dst.copy_from_slice(&grad[at..at + d]);
        *ds = dst
            .iter()
            .zip(&out[at..at + d])
            .fold(T::zero(), |a, (&x, &y)| a + x * y);
    }
    let dos = T::to_cpu_storage_owned(dos);
    let mut dq = vec![T::zero(); sh.items() * rows * d];
    let mut dk = vec![T::zero(); sh.items() * t * d];
    let mut dv = vec![T::zero(); sh.items() * t * d];
    for blk in sh.blocks(budget) {
        let (qb, t1) = (blk.qb(), blk.t1);
        let q_lay = blk.q_layout(sh, ql.start_offset());
        let do_lay = blk.q_layout(sh, 0);
        let per = rows_per_unit(t1);
        // Per block row: log-sum-exp and D.
        let (row_lse, row_d): (Vec<T>, Vec<T>) = (0..blk.items * qb)
            .map(|i| {
                let (item, r, _) = blk.row(sh, i);
                (lse[item * rows + r], dsum[item * rows + r])
            })
            .unzip();

        // Probabilities, recomputed from the saved log-sum-exp.
        let s = q.matmul(
            k,
            (blk.items, qb, t1, d),
            &q_lay,
            &blk.kv_layout(sh, kl.start_offset(), true),
        )?;
        let mut p: Vec<T> = T::cpu_storage_data(s)?;
        let items: Vec<_> = p.chunks_mut(per * t1).zip(row_lse.chunks(per)).collect();
        par_each(items, |unit, (ps, ls)| {
            for (j, (row, &l)) in ps.chunks_exact_mut(t1).zip(ls).enumerate() {
                let (_, _, pos) = blk.row(sh, unit * per + j);
                let (vis, hidden) = row.split_at_mut(pos + 1);
                for x in vis.iter_mut() {
                    *x = (*x * scale - l).fast_exp();
                }
                hidden.fill(T::zero());
            }
        });
        let p = T::to_cpu_storage_owned(p);
        // dV += P^T dO.
        let dv_blk = p.matmul(
            &dos,
            (blk.items, t1, d, qb),
            &blk.scores_layout(true),
            &do_lay,
        )?;
        blk.add_kv(sh, &mut dv, &dv_blk)?;
        // dS = P * (dO V^T - D) * scale.
        let dp = dos.matmul(
            v,
            (blk.items, qb, t1, d),
            &do_lay,
            &blk.kv_layout(sh, vl.start_offset(), true),
        )?;
        let mut ds: Vec<T> = T::cpu_storage_data(dp)?;
        {
            let p = T::cpu_storage_as_slice(&p)?;
            let items: Vec<_> = ds
                .chunks_mut(per * t1)
                .zip(p.chunks(per * t1))
                .zip(row_d.chunks(per))
                .collect();
            par_each(items, |_, ((dss, ps), dd)| {
                for ((row, prow), &dr) in dss.chunks_exact_mut(t1).zip(ps.chunks_exact(t1)).zip(dd)
                {
                    for (x, &pv) in row.iter_mut().zip(prow) {
                        *x = pv * (*x - dr) * scale;
                    }
                }
            });
        }
        drop(p);
        let ds = T::to_cpu_storage_owned(ds);
        // dQ = dS K, dK += dS^T Q.
        let dq_blk = ds.matmul(
            k,
            (blk.items, qb, d, t1),
            &blk.scores_layout(false),
            &blk.kv_layout(sh, kl.start_offset(), false),
        )?;
        for (i, src) in T::cpu_storage_as_slice(&dq_blk)?
            .chunks_exact(d)
            .enumerate()
        {
            let (item, r, _) = blk.row(sh, i);
            let at = (item * rows + r) * d;
            dq[at..at + d].copy_from_slice(src);
        }
        let dk_blk = ds.matmul(q, (blk.items, t1, d, qb), &blk.scores_layout(true), &q_lay)?;
        blk.add_kv(sh, &mut dk, &dk_blk)?;
    }
    Ok((dq, dk, dv))
}

/// `exp`, vectorisable where it matters: for f32 a polynomial with no library call (relative
/// error about 2e-7, inputs below -87 flush towards zero), for f64 the standard `exp`.
pub(crate) trait FastExp: Copy {
    /// `e^self`.
    fn fast_exp(self) -> Self;
}

impl FastExp for f64 {
    #[inline]
    fn fast_exp(self) -> f64 {
        self.exp()
    }
}

impl FastExp for f32 {
    #[inline]
    fn fast_exp(self) -> f32 {
        // e^x = 2^n e^r with n = round(x log2 e) and |r| <= ln 2 / 2; e^r by its Taylor series to
        // degree 7 (truncation error below 2e-8 relative on that interval).
        const LOG2E: f32 = std::f32::consts::LOG2_E;
        const LN2_HI: f32 = 0.693_145_75;
        const LN2_LO: f32 = 1.428_606_8e-6;
        // Adding and subtracting 1.5 * 2^23 rounds to the nearest integer without a libm call.
        const ROUND: f32 = 12_582_912.0;
        let x = self.clamp(-87.0, 88.0);
        let n = (x * LOG2E + ROUND) - ROUND;
        let r = (x - n * LN2_HI) - n * LN2_LO;
        let p = 1.0
            + r * (1.0
                + r * (0.5
                    + r * (1.0 / 6.0
                        + r * (1.0 / 24.0
                            + r * (1.0 / 120.0 + r * (1.0 / 720.0 + r * (1.0 / 5040.0)))))));
        // 2^n from the bits of n + 127 + 2^23, whose low mantissa bits hold the integer n + 127
        // (in 1..=254 after the clamp): integer-free, so the loop around it vectorises.
        let biased = (n + (127.0 + 8_388_608.0)).to_bits();
        let e = p * f32::from_bits(biased << 23);
        // Below the clamp e^x is under 1.7e-38: exactly 0, as for a masked score (-inf). The
        // clamped value would be kept as a tiny positive weight, and once a softmax divides it
        // by the row's sum it is subnormal, which x86 multiplies tens of times slower than a
        // normal float, and a prefill block's masked half slowed the next matmul many times over.
        if self < -87.0 { 0.0 } else { e }
    }
}

impl CustomOp3 for AttentionOp {
    fn name(&self) -> &'static str {
        "grpo-causal-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> candle_core::Result<(CpuStorage, Shape)> {
        for l in [l1, l2, l3] {
            if !l.is_contiguous() {
                candle_core::bail!("causal_attention: inputs must be contiguous");
            }
        }
        let sh = &self.shape;
        let args = ((s1, l1), (s2, l2), (s3, l3));
        let (out, lse) = match s1.dtype() {
            DType::F32 => {
                let (o, l) = attention_fwd::<f32>(sh, self.block_elems, args.0, args.1, args.2)?;
                (CpuStorage::F32(o), CpuStorage::F32(l))
            }
            DType::F64 => {
                let (o, l) = attention_fwd::<f64>(sh, self.block_elems, args.0, args.1, args.2)?;
                (CpuStorage::F64(o), CpuStorage::F64(l))
            }
            other => {
                candle_core::bail!("causal_attention: fused path takes f32 or f64, not {other:?}")
            }
        };
        // A second forward through the same op value (not done by candle) keeps the first lse.
        let _ = self.lse.set(lse);
        Ok((out, Shape::from((sh.b, sh.t, sh.nh * sh.d))))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let Some(lse) = self.lse.get() else {
            candle_core::bail!("causal_attention: backward before forward")
        };
        let grad = grad.to_dtype(q.dtype())?.contiguous()?;
        let (qs, ql) = q.storage_and_layout();
        let (ks, kl) = k.storage_and_layout();
        let (vs, vl) = v.storage_and_layout();
        let (Storage::Cpu(qs), Storage::Cpu(ks), Storage::Cpu(vs)) = (&*qs, &*ks, &*vs) else {
            candle_core::bail!("causal_attention: fused backward runs on the cpu")
        };
        let sh = &self.shape;
        let budget = self.block_elems;
        #[allow(clippy::too_many_arguments)]
        fn run<T: WithDType + Float + FastExp>(
            sh: &AttnShape,
            budget: usize,
            q: (&CpuStorage, &Layout),
            k: (&CpuStorage, &Layout),
            v: (&CpuStorage, &Layout),
            res: &Tensor,
            grad: &Tensor,
            lse: &CpuStorage,
        ) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
            let (dq, dk, dv) = cpu_slice::<T, _>(res, |o| {
                cpu_slice::<T, _>(grad, |g| {
                    attention_bwd(sh, budget, q, k, v, o, g, T::cpu_storage_as_slice(lse)?)
                })
            })?;
            let dev = res.device();
            Ok((
                Tensor::from_vec(dq, q.1.shape(), dev)?,
                Tensor::from_vec(dk, k.1.shape(), dev)?,
                Tensor::from_vec(dv, v.1.shape(), dev)?,
            ))
        }
        let (q_arg, k_arg, v_arg) = ((qs, ql), (ks, kl), (vs, vl));
        let (dq, dk, dv) = match q.dtype() {
            DType::F32 => run::<f32>(sh, budget, q_arg, k_arg, v_arg, res, &grad, lse)?,
            _ => run::<f64>(sh, budget, q_arg, k_arg, v_arg, res, &grad, lse)?,
        };
        Ok((Some(dq), Some(dk), Some(dv)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};
    use rand::{Rng, SeedableRng};

    fn random(shape: &[usize], dtype: DType, seed: u64) -> Var {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let n: usize = shape.iter().product();
        let data: Vec<f64> = (0..n).map(|_| rng.gen_range(-1.5..1.5)).collect();
        let t = Tensor::from_vec(data, shape, &Device::Cpu).unwrap();
        Var::from_tensor(&t.to_dtype(dtype).unwrap()).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
        assert_eq!(a.dims(), b.dims());
        (a.to_dtype(DType::F64).unwrap() - b.to_dtype(DType::F64).unwrap())
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar::<f64>()
            .unwrap()
    }

    /// Value and gradients (to every var) of `sum(f(vars) * r)` for a fixed random `r`.
    fn value_and_grads(
        vars: &[&Var],
        f: impl Fn(&[Tensor]) -> Tensor,
        seed: u64,
    ) -> (Tensor, Vec<Tensor>) {
        let ts: Vec<Tensor> = vars.iter().map(|v| v.as_tensor().clone()).collect();
        let y = f(&ts);
        let r = random(y.dims(), y.dtype(), seed);
        let loss = (&y * r.as_tensor()).unwrap().sum_all().unwrap();
        let grads = loss.backward().unwrap();
        let gs = vars
            .iter()
            .map(|v| grads.get(v.as_tensor()).expect("a gradient").clone())
            .collect();
        (y, gs)
    }

    fn check(
        vars: &[&Var],
        fused: impl Fn(&[Tensor]) -> Tensor,
        reference: impl Fn(&[Tensor]) -> Tensor,
        tol: f64,
    ) {
        let (y1, g1) = value_and_grads(vars, fused, 99);
        let (y2, g2) = value_and_grads(vars, reference, 99);
        let d = max_diff(&y1, &y2);
        assert!(d <= tol, "value differs by {d}");
        for (i, (a, b)) in g1.iter().zip(&g2).enumerate() {
            let d = max_diff(a, b);
            assert!(d <= tol, "gradient {i} differs by {d}");
        }
    }

    #[test]
    fn rms_norm_matches_primitives() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
            let x = random(&[3, 5, 24], dtype, 1);
            let w = random(&[24], dtype, 2);
            check(
                &[&x, &w],
                |t| rms_norm(&t[0], &t[1], 1e-6).unwrap(),
                |t| crate::ops::reference::rms_norm_primitive(&t[0], &t[1], 1e-6).unwrap(),
                tol,
            );
        }
    }

    #[test]
    fn rope_to_heads_matches_transpose_and_primitives() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let x = random(&[2, 5, 3, 8], dtype, 3);
            let cos = random(&[2, 1, 5, 8], dtype, 4).as_tensor().clone();
            let sin = random(&[2, 1, 5, 8], dtype, 5).as_tensor().clone();
            check(
                &[&x],
                |t| rope_to_heads(&t[0], &cos, &sin).unwrap(),
                |t| {
                    let xt = t[0].transpose(1, 2).unwrap().contiguous().unwrap();
                    crate::ops::reference::rope(&xt, &cos, &sin).unwrap()
                },
                tol,
            );
        }
    }

    #[test]
    fn swiglu_matches_silu_times_up() {
        for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 1e-5)] {
            let g = random(&[4, 7, 33], dtype, 6);
            let u = random(&[4, 7, 33], dtype, 7);
            check(
                &[&g, &u],
                |t| swiglu(&t[0], &t[1]).unwrap(),
                |t| (t[0].silu().unwrap() * &t[1]).unwrap(),
                tol,
            );
        }
    }

    /// `attention(q, k, v, scale)` against the primitives on random inputs of the given shapes
    /// `(batch, heads, kv heads, T, d)`, in f64 and f32.
    fn check_attention(
        shapes: &[(usize, usize, usize, usize, usize)],
        attention: impl Fn(&Tensor, &Tensor, &Tensor, f64) -> Tensor,
    ) {
        for &(b, nh, kvh, t, d) in shapes {
            for (dtype, tol) in [(DType::F64, 1e-12), (DType::F32, 2e-5)] {
                let q = random(&[b, nh, t, d], dtype, 11);
                let k = random(&[b, kvh, t, d], dtype, 12);
                let v = random(&[b, kvh, t, d], dtype, 13);
                let scale = 1.0 / (d as f64).sqrt();
                check(
                    &[&q, &k, &v],
                    |x| attention(&x[0], &x[1], &x[2], scale),
                    |x| causal_attention_primitive(&x[0], &x[1], &x[2], scale).unwrap(),
                    tol,
                );
            }
        }
    }

    #[test]
    fn causal_attention_matches_primitives_for_every_block_split() {
        // T = 150 spans three query blocks. Every item in one run, and one item per run.
        let shapes = [
            (2, 4, 2, 7, 8),
            (1, 3, 3, 5, 4),
            (2, 2, 1, 1, 6),
            (2, 2, 1, 150, 4),
        ];
        for budget in [1 << 24, 1] {
            check_attention(&shapes, |q, k, v, s| {
                causal_attention_blocked(q, k, v, s, budget).unwrap()
            });
        }
    }

    #[test]
    fn tensor_op_attention_matches_primitives() {
        // The path CUDA takes, run on the CPU, with several query blocks.
        let shapes = [(2, 4, 2, 9, 8), (1, 3, 3, 5, 4), (2, 2, 1, 1, 6)];
        for qb in [1, 4, 5] {
            check_attention(&shapes, |q, k, v, s| {
                causal_attention_tensor_ops(q, k, v, s, qb).unwrap()
            });
        }
    }

    #[test]
    fn attention_blocks_cover_every_row_once_and_stop_at_their_last_query() {
        for t in [1, 5, 64, 65, 200] {
            let sh = AttnShape {
                b: 3,
                nh: 4,
                kvh: 2,
                t,
                d: 2,
                scale: 1.0,
            };
            for budget in [1, 64 * t, 2 * 64 * t, 1 << 30] {
                let mut seen = vec![0; sh.items() * sh.rows()];
                for blk in sh.blocks(budget) {
                    assert!(blk.items >= 1 && blk.qb() >= 1, "{blk:?}");
                    for i in 0..blk.items * blk.qb() {
                        let (item, r, pos) = blk.row(&sh, i);
                        assert!(pos < blk.t1);
                        seen[item * sh.rows() + r] += 1;
                    }
                }
                assert!(seen.iter().all(|&n| n == 1), "T {t}, budget {budget}");
            }
        }
    }

    #[test]
    fn fast_exp_is_close_to_exp() {
        let mut worst = 0f64;
        let mut x = -80.0f32;
        while x < 80.0 {
            let (a, b) = (x.fast_exp() as f64, (x as f64).exp());
            worst = worst.max((a - b).abs() / b);
            x += 0.0137;
        }
        assert!(worst < 5e-7, "worst relative error {worst}");
        // Underflow is exactly zero, never subnormal (see `fast_exp`), down to -inf.
        for x in [-87.5f32, -200.0, -1.0e9, f32::NEG_INFINITY] {
            assert_eq!(x.fast_exp(), 0.0, "e^{x}");
        }
        assert!((-86.9f32).fast_exp() >= f32::MIN_POSITIVE);
        assert!(f32::NAN.fast_exp().is_nan());
        assert_eq!(0.0f32.fast_exp(), 1.0);
    }

    #[test]
    fn masked_entries_of_a_softmax_are_exactly_zero() {
        // A prefill's scores carry the additive mask (-1e9) or -inf; their weights must be 0,
        // not subnormal (which slows every later multiply by them).
        let mut row: Vec<f32> = (0..300)
            .map(|i| {
                if i % 3 == 0 {
                    -1.0e9
                } else {
                    (i as f32 * 0.37).sin()
                }
            })
            .collect();
        row[1] = f32::NEG_INFINITY;
        softmax_in_place(&mut row);
        for (i, p) in row.iter().enumerate() {
            if i % 3 == 0 || i == 1 {
                assert_eq!(*p, 0.0, "masked entry {i}");
            } else {
                assert!(p.is_normal(), "entry {i} = {p}");
            }
        }
    }

    #[test]
    fn bad_shapes_are_refused_with_the_shapes() {
        let q = Tensor::zeros((1, 3, 4, 2), DType::F32, &Device::Cpu).unwrap();
        let k = Tensor::zeros((1, 2, 4, 2), DType::F32, &Device::Cpu).unwrap();
        let err = causal_attention(&q, &k, &k, 1.0).unwrap_err().to_string();
        assert!(
            err.contains("[1, 3, 4, 2]") && err.contains("KV dividing H"),
            "{err}"
        );
        let w = Tensor::zeros(3, DType::F32, &Device::Cpu).unwrap();
        let err = rms_norm(&q, &w, 1e-6).unwrap_err().to_string();
        assert!(err.contains("expected [2]"), "{err}");
    }
}
