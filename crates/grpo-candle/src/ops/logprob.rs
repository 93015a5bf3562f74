//! Log-probabilities of chosen tokens straight from final hidden states and the lm_head weight.
//!
//! The naive path materialises `logits = hidden @ weight^T` as a `[tokens, vocab]` tensor, then a
//! `log_softmax` of the same size, then gathers one column per row; its backward keeps a few more
//! tensors of that size alive. At a real vocabulary (151,936) and a few thousand tokens that is
//! gigabytes. [`token_logprobs`] instead walks the logits in `token_chunk x vocab_chunk` blocks:
//! the forward keeps an online log-sum-exp per token (running max, sum of exponentials and the
//! sum needed for the entropy), and the backward recomputes each block, turns it into the
//! gradient of the logits in place and immediately folds it into the gradients of `hidden` and
//! `weight`. Extra memory is a few blocks, never `tokens x vocab`.
//!
//! The op is a candle [`CustomOp3`] whose forward only hands back statistics computed beforehand
//! and whose `bwd` does the chunked backward, so candle's autograd drives it like any other op.
//!
//! # Maths
//! For one token with logits `z` (a row of `hidden @ weight^T`) and target `y`:
//! `lse = log sum_j exp(z_j)`, `logp = z_y - lse`, `p = exp(z - lse)`,
//! `entropy = lse - sum_j p_j z_j`. With upstream gradients `g` (logp), `ge` (entropy) and
//! `gl` (lse), and `mu = sum_j p_j z_j = lse - entropy`:
//! `dL/dz_j = g [j = y] + p_j (gl - g + ge mu - ge z_j)`.
//! Both parts are formed block by block; each block then goes through two matmuls (into `dh` and
//! into its rows of `dW`) and is dropped.
//!
//! # Devices
//! On the CPU with f32/f64 the per-block statistics and block gradients are hand-written loops
//! over the matmul output (one pass each). With the `cuda` feature, on a CUDA device in
//! f32/bf16/f16, two CUDA kernels (`src/ops/cuda/logprob.cu`) do the same, one launch per block.
//! Elsewhere (f64 on CUDA, half types on the CPU) the maths runs as candle tensor ops on each
//! block. Matmuls always go through candle (gemm on the CPU, cuBLAS on CUDA). Half-precision
//! inputs produce f32 statistics. When all the logits fit [`LogProbConfig::cache_bytes`], the
//! backward reuses the forward's blocks instead of recomputing them.

use candle_core::{CustomOp3, DType, Tensor, WithDType};

use crate::ops::fused::{FastExp, cpu_slice, max_of, par_each, rows_per_unit};

/// Column of the op's `[N, 3]` output holding the chosen tokens' log-probs.
const COL_LOGP: usize = 0;
/// Column holding the entropy of each token's distribution.
const COL_ENTROPY: usize = 1;
/// Column holding the log-sum-exp of each token's logits.
const COL_LSE: usize = 2;

/// Chunk sizes of the blocked log-prob op.
///
/// Extra memory is a small multiple of `token_chunk * vocab_chunk` elements (f32: 4 bytes each),
/// plus the gradient of `weight` the backward has to return anyway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogProbConfig {
    /// Tokens per block (rows of the logits processed together).
    pub token_chunk: usize,
    /// Vocabulary entries per block (columns of the logits processed together).
    pub vocab_chunk: usize,
    /// When all of a call's logits take at most this many bytes, the forward keeps its blocks
    /// for the backward instead of recomputing them (one matmul of four saved). Memory stays
    /// bounded by this budget; 0 always recomputes.
    pub cache_bytes: usize,
    /// Use the device-agnostic tensor-op path even where a hand-written one exists (tests use this
    /// to check the path CUDA takes on a CPU).
    #[doc(hidden)]
    pub force_tensor_path: bool,
}

impl Default for LogProbConfig {
    fn default() -> Self {
        // 1024 x 8192 f32 = 32 MiB per block.
        Self {
            token_chunk: 1024,
            vocab_chunk: 8192,
            cache_bytes: 256 << 20,
            force_tensor_path: false,
        }
    }
}

/// Per-token results of [`token_logprobs`]; both tensors are differentiable.
#[derive(Debug, Clone)]
pub struct TokenLogProbs {
    /// `log softmax(hidden @ weight^T)[i, targets[i]]`, shape `[N]`.
    pub logp: Tensor,
    /// Entropy of each token's full distribution, shape `[N]`.
    pub entropy: Tensor,
    /// Log-sum-exp of each token's logits, shape `[N]`.
    pub lse: Tensor,
}

/// Log-probs (and entropies) of `targets` under `softmax(hidden @ weight^T)`, without ever holding
/// the `[N, V]` logits.
///
/// `hidden` is `[N, H]`, `weight` is `[V, H]` (the lm_head, or the tied embedding), `targets` is
/// `[N]` of `u32` or `i64`. The outputs are f32 for half-precision inputs and in the input dtype
/// otherwise. Gradients flow to `hidden` and `weight` through candle's autograd.
pub fn token_logprobs(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    cfg: &LogProbConfig,
) -> candle_core::Result<TokenLogProbs> {
    let (n, h) = hidden.dims2()?;
    let (v, h2) = weight.dims2()?;
    if h != h2 {
        candle_core::bail!("token_logprobs: hidden is [{n}, {h}] but weight is [{v}, {h2}]");
    }
    if targets.dims1()? != n {
        candle_core::bail!(
            "token_logprobs: {} targets for {n} hidden rows",
            targets.dims1()?
        );
    }
    if hidden.dtype() != weight.dtype() {
        candle_core::bail!(
            "token_logprobs: hidden is {:?} but weight is {:?}",
            hidden.dtype(),
            weight.dtype()
        );
    }
    if cfg.token_chunk == 0 || cfg.vocab_chunk == 0 {
        candle_core::bail!("token_logprobs: chunk sizes must be positive, got {cfg:?}");
    }
    let targets = targets.to_dtype(DType::U32)?.detach();
    let logits_bytes = n * v * hidden.dtype().size_in_bytes();
    let mut cache = (logits_bytes <= cfg.cache_bytes).then(BlockCache::new);
    let stats = forward_stats(
        &hidden.detach(),
        &weight.detach(),
        &targets,
        cfg,
        cache.as_mut(),
    )?;
    let op = LogProbOp {
        targets,
        cfg: *cfg,
        cache,
    };
    let out = hidden.apply_op3(weight, &stats, op)?;
    Ok(TokenLogProbs {
        logp: out.narrow(1, COL_LOGP, 1)?.squeeze(1)?,
        entropy: out.narrow(1, COL_ENTROPY, 1)?.squeeze(1)?,
        lse: out.narrow(1, COL_LSE, 1)?.squeeze(1)?,
    })
}

/// The reference path: full logits, `log_softmax`, gather. `O(N x V)` memory; for tests and
/// benchmarks only.
pub fn naive_token_logprobs(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
) -> candle_core::Result<TokenLogProbs> {
    let logits = hidden.matmul(&weight.t()?)?;
    let logits = if is_half(logits.dtype()) {
        logits.to_dtype(DType::F32)?
    } else {
        logits
    };
    let max = logits.max_keepdim(1)?.detach();
    let shifted = logits.broadcast_sub(&max)?;
    let lse_shifted = shifted.exp()?.sum_keepdim(1)?.log()?;
    let logsm = shifted.broadcast_sub(&lse_shifted)?;
    let idx = targets.to_dtype(DType::U32)?.unsqueeze(1)?;
    let logp = logsm.gather(&idx, 1)?.squeeze(1)?;
    let entropy = (logsm.exp()? * &logsm)?.sum(1)?.neg()?;
    let lse = (lse_shifted + max)?.squeeze(1)?;
    Ok(TokenLogProbs { logp, entropy, lse })
}

fn is_half(dtype: DType) -> bool {
    matches!(dtype, DType::BF16 | DType::F16)
}

/// Dtype of the statistics and of the logits blocks' elementwise maths.
fn stats_dtype(dtype: DType) -> DType {
    if is_half(dtype) { DType::F32 } else { dtype }
}

/// Which code does the per-block work between the matmuls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BlockPath {
    /// Hand-written loops (CPU, f32/f64).
    CpuLoops,
    /// The CUDA kernels of [`crate::ops::cuda`] (f32/bf16/f16).
    #[cfg(feature = "cuda")]
    CudaKernels,
    /// candle tensor ops, any device and dtype.
    TensorOps,
}

fn block_path(t: &Tensor, cfg: &LogProbConfig) -> BlockPath {
    if cfg.force_tensor_path {
        return BlockPath::TensorOps;
    }
    let dtype = t.dtype();
    if t.device().is_cpu() && matches!(dtype, DType::F32 | DType::F64) {
        return BlockPath::CpuLoops;
    }
    #[cfg(feature = "cuda")]
    if t.device().is_cuda() && matches!(dtype, DType::F32 | DType::BF16 | DType::F16) {
        return BlockPath::CudaKernels;
    }
    BlockPath::TensorOps
}

/// `[tc, 3]` = (logp, entropy, lse) from running softmax statistics `[tc, 1]` each: max `m`,
/// `s = sum exp(z - m)`, `u = sum exp(z - m) (z - m)`, and the target's logit `zy`.
pub(crate) fn stats_from_online(
    m: &Tensor,
    s: &Tensor,
    u: &Tensor,
    zy: &Tensor,
) -> candle_core::Result<Tensor> {
    let log_s = s.log()?;
    let lse = (m + &log_s)?;
    let logp = (zy - &lse)?;
    let entropy = (log_s - (u / s)?)?;
    Tensor::cat(&[logp, entropy, lse], 1)
}

/// Logits blocks kept by the forward for the backward, by (first token, first vocabulary id).
type BlockCache = std::collections::HashMap<(usize, usize), Tensor>;

/// `[N, 3]` = (logp, entropy, lse) per token, detached. With a cache, every logits block is
/// stored in it.
fn forward_stats(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    cfg: &LogProbConfig,
    mut cache: Option<&mut BlockCache>,
) -> candle_core::Result<Tensor> {
    let (n, _) = hidden.dims2()?;
    let (v, _) = weight.dims2()?;
    let mut parts = Vec::with_capacity(n.div_ceil(cfg.token_chunk));
    for t0 in (0..n).step_by(cfg.token_chunk) {
        let tc = cfg.token_chunk.min(n - t0);
        let hc = hidden.narrow(0, t0, tc)?;
        let yc = targets.narrow(0, t0, tc)?;
        let mut keep = |v0: usize, z: &Tensor| {
            if let Some(c) = cache.as_deref_mut() {
                c.insert((t0, v0), z.clone());
            }
        };
        let part = match block_path(hidden, cfg) {
            BlockPath::CpuLoops if hidden.dtype() == DType::F32 => {
                cpu_forward_chunk::<f32>(&hc, weight, &yc, v, cfg, &mut keep)?
            }
            BlockPath::CpuLoops => cpu_forward_chunk::<f64>(&hc, weight, &yc, v, cfg, &mut keep)?,
            #[cfg(feature = "cuda")]
            BlockPath::CudaKernels => {
                crate::ops::cuda::forward_chunk(&hc, weight, &yc, v, cfg, &mut keep)?
            }
            BlockPath::TensorOps => tensor_forward_chunk(&hc, weight, &yc, v, cfg, &mut keep)?,
        };
        parts.push(part);
    }
    if parts.is_empty() {
        return Tensor::zeros((0, 3), stats_dtype(hidden.dtype()), hidden.device());
    }
    // A fresh contiguous tensor: the op's forward returns a copy of its storage.
    Tensor::cat(&parts, 0)?.contiguous()?.copy()
}

/// Running online-softmax state of one token: max, `sum exp(z - m)`, `sum exp(z - m) (z - m)`.
#[derive(Clone, Copy)]
struct Online<T> {
    m: T,
    s: T,
    u: T,
    zy: T,
}

fn cpu_forward_chunk<T: WithDType + num_traits::Float + FastExp>(
    hc: &Tensor,
    weight: &Tensor,
    yc: &Tensor,
    v: usize,
    cfg: &LogProbConfig,
    keep: &mut dyn FnMut(usize, &Tensor),
) -> candle_core::Result<Tensor> {
    let tc = hc.dim(0)?;
    let ys: Vec<u32> = yc.to_vec1()?;
    if let Some(&bad) = ys.iter().find(|&&y| y as usize >= v) {
        candle_core::bail!("token_logprobs: target id {bad} outside a vocabulary of {v}");
    }
    let mut state = vec![
        Online {
            m: T::neg_infinity(),
            s: T::zero(),
            u: T::zero(),
            zy: T::zero(),
        };
        tc
    ];
    for v0 in (0..v).step_by(cfg.vocab_chunk) {
        let vc = cfg.vocab_chunk.min(v - v0);
        let wc = weight.narrow(0, v0, vc)?;
        let z = hc.matmul(&wc.t()?)?;
        keep(v0, &z);
        cpu_slice::<T, ()>(&z, |z| {
            let per = rows_per_unit(vc);
            let items: Vec<&mut [Online<T>]> = state.chunks_mut(per).collect();
            par_each(items, |i, block| {
                for (dr, st) in block.iter_mut().enumerate() {
                    let r = i * per + dr;
                    let row = &z[r * vc..(r + 1) * vc];
                    online_update(st, row);
                    let y = ys[r] as usize;
                    if (v0..v0 + vc).contains(&y) {
                        st.zy = row[y - v0];
                    }
                }
            });
            Ok(())
        })?;
    }
    let mut out = Vec::with_capacity(tc * 3);
    for st in &state {
        let lse = st.m + st.s.ln();
        out.push(st.zy - lse);
        out.push(st.s.ln() - st.u / st.s);
        out.push(lse);
    }
    Tensor::from_vec(out, (tc, 3), hc.device())
}

fn online_update<T: num_traits::Float + FastExp>(st: &mut Online<T>, row: &[T]) {
    let mx = max_of(row);
    if mx > st.m {
        if st.s > T::zero() {
            // Rescale to the new max: exp(z - m') = exp(z - m) c, (z - m') = (z - m) + (m - m').
            let d = st.m - mx;
            let c = d.exp();
            st.u = c * (st.u + d * st.s);
            st.s = c * st.s;
        }
        st.m = mx;
    }
    let m = st.m;
    let (mut s, mut u) = (T::zero(), T::zero());
    for &x in row {
        let d = x - m;
        let e = d.fast_exp();
        s = s + e;
        u = u + e * d;
    }
    st.s = st.s + s;
    st.u = st.u + u;
}

fn tensor_forward_chunk(
    hc: &Tensor,
    weight: &Tensor,
    yc: &Tensor,
    v: usize,
    cfg: &LogProbConfig,
    keep: &mut dyn FnMut(usize, &Tensor),
) -> candle_core::Result<Tensor> {
    let sd = stats_dtype(hc.dtype());
    let mut m: Option<Tensor> = None;
    let mut s: Option<Tensor> = None;
    let mut u: Option<Tensor> = None;
    for v0 in (0..v).step_by(cfg.vocab_chunk) {
        let vc = cfg.vocab_chunk.min(v - v0);
        let wc = weight.narrow(0, v0, vc)?;
        let z = hc.matmul(&wc.t()?)?;
        keep(v0, &z);
        let z = z.to_dtype(sd)?;
        let bm = z.max_keepdim(1)?;
        let (m_new, s_old, u_old) = match (&m, &s, &u) {
            (Some(m), Some(s), Some(u)) => {
                let m_new = m.maximum(&bm)?;
                let d = (m - &m_new)?;
                let c = d.exp()?;
                let u_old = (&c * (u + (&d * s)?)?)?;
                let s_old = (&c * s)?;
                (m_new, Some(s_old), Some(u_old))
            }
            _ => (bm, None, None),
        };
        let d = z.broadcast_sub(&m_new)?;
        let e = d.exp()?;
        let bs = e.sum_keepdim(1)?;
        let bu = (&e * &d)?.sum_keepdim(1)?;
        s = Some(match s_old {
            Some(so) => (so + bs)?,
            None => bs,
        });
        u = Some(match u_old {
            Some(uo) => (uo + bu)?,
            None => bu,
        });
        m = Some(m_new);
    }
    let (m, s, u) = (m.unwrap(), s.unwrap(), u.unwrap());
    let zy = chosen_logits(hc, weight, yc)?.to_dtype(sd)?.unsqueeze(1)?;
    stats_from_online(&m, &s, &u, &zy)
}

/// `z[i, y_i] = hidden_i . weight[y_i]`, `[N]`.
fn chosen_logits(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
) -> candle_core::Result<Tensor> {
    let wy = weight.index_select(targets, 0)?;
    (hidden * wy)?.sum(1)
}

/// The candle op: forward returns the precomputed statistics, backward is the blocked gradient.
struct LogProbOp {
    targets: Tensor,
    cfg: LogProbConfig,
    /// The forward's logits blocks, when they fit [`LogProbConfig::cache_bytes`].
    cache: Option<BlockCache>,
}

impl CustomOp3 for LogProbOp {
    fn name(&self) -> &'static str {
        "grpo-token-logprobs"
    }

    crate::ops::fused::forward_returns_third_arg!();

    fn bwd(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        _stats: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> candle_core::Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (dh, dw) = backward(
            &hidden.detach(),
            &weight.detach(),
            &self.targets,
            &res.detach(),
            &grad_res.detach(),
            &self.cfg,
            self.cache.as_ref(),
        )?;
        Ok((Some(dh), Some(dw), None))
    }
}

/// Gradients of hidden and weight given the op's output statistics and upstream gradient.
fn backward(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    res: &Tensor,
    grad_res: &Tensor,
    cfg: &LogProbConfig,
    cache: Option<&BlockCache>,
) -> candle_core::Result<(Tensor, Tensor)> {
    let (n, h) = hidden.dims2()?;
    let (v, _) = weight.dims2()?;
    let dtype = hidden.dtype();
    let sd = stats_dtype(dtype);
    let res = res.to_dtype(sd)?;
    let grad_res = grad_res.to_dtype(sd)?;
    let g = grad_res.narrow(1, COL_LOGP, 1)?; // [N,1]
    let ge = grad_res.narrow(1, COL_ENTROPY, 1)?;
    let gl = grad_res.narrow(1, COL_LSE, 1)?;
    let lse = res.narrow(1, COL_LSE, 1)?;
    let mu = (&lse - res.narrow(1, COL_ENTROPY, 1)?)?;
    // Dense part of dL/dz = p * (a - b z), with a = gl - g + ge mu and b = ge.
    let a = ((&gl - &g)? + (&ge * &mu)?)?.contiguous()?;
    let g = g.contiguous()?;
    let b = ge.contiguous()?;
    let lse = lse.contiguous()?;

    // Outer loop over vocabulary chunks so each chunk's weight gradient is finished in one go
    // and written straight into the result (no concatenation copy); dh accumulates per token
    // chunk.
    let dw = Tensor::zeros((v, h), dtype, hidden.device())?;
    let mut dh_parts: Vec<Option<Tensor>> = vec![None; n.div_ceil(cfg.token_chunk)];
    for v0 in (0..v).step_by(cfg.vocab_chunk) {
        let vc = cfg.vocab_chunk.min(v - v0);
        let wc = weight.narrow(0, v0, vc)?;
        let mut dw_c: Option<Tensor> = None;
        for (k, t0) in (0..n).step_by(cfg.token_chunk).enumerate() {
            let tc = cfg.token_chunk.min(n - t0);
            let hc = hidden.narrow(0, t0, tc)?;
            let (gc, ac, bc, lc, yc) = (
                g.narrow(0, t0, tc)?,
                a.narrow(0, t0, tc)?,
                b.narrow(0, t0, tc)?,
                lse.narrow(0, t0, tc)?,
                targets.narrow(0, t0, tc)?,
            );
            let cached = cache.and_then(|c| c.get(&(t0, v0)));
            let z = match cached {
                Some(z) => z.clone(),
                None => hc.matmul(&wc.t()?)?,
            };
            let dz = match block_path(hidden, cfg) {
                BlockPath::CpuLoops if dtype == DType::F32 => {
                    cpu_block_grad::<f32>(&z, &gc, &ac, &bc, &lc, &yc, v0)?
                }
                BlockPath::CpuLoops => cpu_block_grad::<f64>(&z, &gc, &ac, &bc, &lc, &yc, v0)?,
                #[cfg(feature = "cuda")]
                BlockPath::CudaKernels => crate::ops::cuda::block_grad(
                    z,
                    cached.is_some(),
                    [&gc, &ac, &bc, &lc],
                    &yc,
                    v0,
                )?,
                BlockPath::TensorOps => {
                    let z = z.to_dtype(sd)?;
                    let p = z.broadcast_sub(&lc)?.exp()?;
                    let coef = ac.broadcast_sub(&z.broadcast_mul(&bc)?)?;
                    // One-hot part: g where the column is the row's target.
                    let cols =
                        Tensor::arange(v0 as u32, (v0 + vc) as u32, z.device())?.unsqueeze(0)?;
                    let onehot = cols.broadcast_eq(&yc.unsqueeze(1)?)?.to_dtype(sd)?;
                    ((p * coef)? + onehot.broadcast_mul(&gc)?)?.to_dtype(dtype)?
                }
            };
            let dh_k = dz.matmul(&wc)?;
            dh_parts[k] = Some(match dh_parts[k].take() {
                Some(acc) => (acc + dh_k)?,
                None => dh_k,
            });
            let dw_k = dz.t()?.matmul(&hc)?;
            dw_c = Some(match dw_c {
                Some(acc) => (acc + dw_k)?,
                None => dw_k,
            });
        }
        if let Some(d) = dw_c {
            dw.slice_set(&d, 0, v0)?;
        }
    }
    let dh_parts: Vec<Tensor> = dh_parts.into_iter().flatten().collect();
    let dh = if dh_parts.is_empty() {
        hidden.zeros_like()?
    } else {
        Tensor::cat(&dh_parts, 0)?
    };
    Ok((dh, dw))
}

/// `g [j = y] + p * (a - b z)` for one block on the CPU, with `p = exp(z - lse)` and the block's
/// columns starting at vocabulary id `v0`.
fn cpu_block_grad<T: WithDType + num_traits::Float + FastExp>(
    z: &Tensor,
    g: &Tensor,
    a: &Tensor,
    b: &Tensor,
    lse: &Tensor,
    targets: &Tensor,
    v0: usize,
) -> candle_core::Result<Tensor> {
    let (tc, vc) = z.dims2()?;
    let g: Vec<T> = g.flatten_all()?.to_vec1()?;
    let a: Vec<T> = a.flatten_all()?.to_vec1()?;
    let b: Vec<T> = b.flatten_all()?.to_vec1()?;
    let lse: Vec<T> = lse.flatten_all()?.to_vec1()?;
    let ys: Vec<u32> = targets.to_vec1()?;
    let mut out = vec![T::zero(); tc * vc];
    cpu_slice::<T, ()>(z, |z| {
        // Rows are independent: split the output by rows across threads.
        let per = rows_per_unit(vc);
        let items: Vec<&mut [T]> = out.chunks_mut(per * vc).collect();
        par_each(items, |i, block| {
            let r0 = i * per;
            for (dr, orow) in block.chunks_mut(vc).enumerate() {
                let r = r0 + dr;
                let (ar, br, lr) = (a[r], b[r], lse[r]);
                let zr = &z[r * vc..(r + 1) * vc];
                for (o, &x) in orow.iter_mut().zip(zr) {
                    *o = (x - lr).fast_exp() * (ar - br * x);
                }
                let y = ys[r] as usize;
                if (v0..v0 + vc).contains(&y) {
                    orow[y - v0] += g[r];
                }
            }
        });
        Ok(())
    })?;
    Tensor::from_vec(out, (tc, vc), z.device())
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::{Device, Var};

    fn rand_inputs(n: usize, h: usize, v: usize, dtype: DType, seed: u64) -> (Var, Var, Tensor) {
        use rand::{Rng, SeedableRng};
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let hid: Vec<f64> = (0..n * h).map(|_| rng.r#gen::<f64>() * 4.0 - 2.0).collect();
        let w: Vec<f64> = (0..v * h).map(|_| rng.r#gen::<f64>() * 2.0 - 1.0).collect();
        let y: Vec<u32> = (0..n).map(|_| rng.gen_range(0..v as u32)).collect();
        let dev = Device::Cpu;
        let hid = Tensor::from_vec(hid, (n, h), &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        let w = Tensor::from_vec(w, (v, h), &dev)
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
        (
            Var::from_tensor(&hid).unwrap(),
            Var::from_tensor(&w).unwrap(),
            Tensor::from_vec(y, n, &dev).unwrap(),
        )
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f64 {
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

    /// Compares values and gradients of `c1 . logp + c2 . entropy + c3 . lse` between the chunked
    /// op and the naive path.
    fn check(n: usize, h: usize, v: usize, dtype: DType, cfg: LogProbConfig, tol: f64) {
        let (hid, w, y) = rand_inputs(n, h, v, dtype, (n * 31 + v) as u64);
        // Fixed, irregular coefficients: the check must not depend on the run.
        let coefs: Vec<f64> = (0..3 * n).map(|i| ((i * 7 + 3) as f64).sin()).collect();
        let coefs = Tensor::from_vec(coefs, (3, n), &Device::Cpu)
            .unwrap()
            .to_dtype(stats_dtype(dtype))
            .unwrap();
        let objective = |r: &TokenLogProbs| {
            let terms = [&r.logp, &r.entropy, &r.lse];
            let mut total = Tensor::zeros((), stats_dtype(dtype), &Device::Cpu).unwrap();
            for (k, t) in terms.iter().enumerate() {
                total = (total + (*t * coefs.get(k).unwrap()).unwrap().sum_all().unwrap()).unwrap();
            }
            total
        };
        let fast = token_logprobs(hid.as_tensor(), w.as_tensor(), &y, &cfg).unwrap();
        let slow = naive_token_logprobs(hid.as_tensor(), w.as_tensor(), &y).unwrap();
        assert!(max_abs_diff(&fast.logp, &slow.logp) < tol, "logp");
        assert!(max_abs_diff(&fast.entropy, &slow.entropy) < tol, "entropy");
        assert!(max_abs_diff(&fast.lse, &slow.lse) < tol, "lse");
        let gf = objective(&fast).backward().unwrap();
        let gs = objective(&slow).backward().unwrap();
        for var in [&hid, &w] {
            let a = gf.get(var.as_tensor()).expect("fast grad");
            let b = gs.get(var.as_tensor()).expect("naive grad");
            let d = max_abs_diff(a, b);
            assert!(d < tol, "gradient differs by {d}");
        }
    }

    fn small(tc: usize, vc: usize) -> LogProbConfig {
        LogProbConfig {
            token_chunk: tc,
            vocab_chunk: vc,
            cache_bytes: 0,
            force_tensor_path: false,
        }
    }

    #[test]
    fn chunked_matches_naive_f32_forward_and_gradient() {
        check(37, 16, 101, DType::F32, small(8, 24), 1e-5);
        check(5, 8, 64, DType::F32, small(64, 64), 1e-5);
    }

    #[test]
    fn cached_logits_give_the_same_values_and_gradients() {
        for force_tensor_path in [false, true] {
            let cfg = LogProbConfig {
                cache_bytes: 1 << 30,
                force_tensor_path,
                ..small(8, 24)
            };
            check(37, 16, 101, DType::F32, cfg, 1e-5);
            check(23, 12, 77, DType::F64, cfg, 1e-12);
        }
    }

    #[test]
    fn the_forward_caches_every_block_and_the_backward_reads_them() {
        // 37 tokens x 101 ids in chunks of 8 x 24: 5 x 5 blocks.
        let (hid, w, y) = rand_inputs(37, 16, 101, DType::F32, 5);
        let cfg = small(8, 24);
        let (h, w) = (hid.as_tensor(), w.as_tensor());
        let mut cache = BlockCache::new();
        let stats = forward_stats(h, w, &y, &cfg, Some(&mut cache)).unwrap();
        assert_eq!(cache.len(), 25);
        let grad = Tensor::ones((37, 3), DType::F32, &Device::Cpu).unwrap();
        let grads = |c: Option<&BlockCache>| backward(h, w, &y, &stats, &grad, &cfg, c).unwrap();
        let (dh0, dw0) = grads(None);
        let (dh1, dw1) = grads(Some(&cache));
        assert!(max_abs_diff(&dh0, &dh1) < 1e-6 && max_abs_diff(&dw0, &dw1) < 1e-6);
        // A changed cached block changes the gradient: the backward used the cache.
        let block = cache.get_mut(&(0, 0)).unwrap();
        *block = block.zeros_like().unwrap();
        let (dh2, _) = grads(Some(&cache));
        assert!(max_abs_diff(&dh0, &dh2) > 1e-3);
    }

    #[test]
    fn chunked_matches_naive_f64() {
        check(23, 12, 77, DType::F64, small(7, 10), 1e-12);
    }

    #[test]
    fn tensor_path_matches_naive_f32_and_f64() {
        let cfg = LogProbConfig {
            force_tensor_path: true,
            ..small(9, 20)
        };
        check(31, 16, 90, DType::F32, cfg, 1e-5);
        check(31, 16, 90, DType::F64, cfg, 1e-12);
    }

    #[test]
    fn bf16_inputs_give_f32_outputs_close_to_naive() {
        let (hid, w, y) = rand_inputs(11, 16, 50, DType::BF16, 3);
        let fast = token_logprobs(hid.as_tensor(), w.as_tensor(), &y, &small(4, 16)).unwrap();
        assert_eq!(fast.logp.dtype(), DType::F32);
        let slow = naive_token_logprobs(hid.as_tensor(), w.as_tensor(), &y).unwrap();
        assert!(max_abs_diff(&fast.logp, &slow.logp) < 0.1);
        let g = fast.logp.sum_all().unwrap().backward().unwrap();
        assert_eq!(g.get(hid.as_tensor()).unwrap().dtype(), DType::BF16);
    }

    #[test]
    fn large_logits_stay_finite() {
        let (hid, w, y) = rand_inputs(6, 8, 40, DType::F32, 9);
        let hid = (hid.as_tensor() * 200.0).unwrap();
        let fast = token_logprobs(&hid, w.as_tensor(), &y, &small(4, 7)).unwrap();
        let slow = naive_token_logprobs(&hid, w.as_tensor(), &y).unwrap();
        let rel = max_abs_diff(&fast.logp, &slow.logp)
            / slow
                .logp
                .abs()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap() as f64;
        assert!(rel < 1e-5, "relative error {rel}");
        assert!(max_abs_diff(&fast.entropy, &slow.entropy) < 1e-3);
    }

    #[test]
    fn rejects_bad_shapes_and_targets() {
        let (hid, w, _) = rand_inputs(4, 8, 10, DType::F32, 1);
        let bad_y = Tensor::new(&[0u32, 1, 2, 10], &Device::Cpu).unwrap();
        assert!(token_logprobs(hid.as_tensor(), w.as_tensor(), &bad_y, &small(2, 3)).is_err());
        let short_y = Tensor::new(&[0u32, 1], &Device::Cpu).unwrap();
        assert!(token_logprobs(hid.as_tensor(), w.as_tensor(), &short_y, &small(2, 3)).is_err());
    }

    #[test]
    fn empty_input_is_fine() {
        let (_, w, _) = rand_inputs(1, 8, 10, DType::F32, 1);
        let hid = Var::zeros((0, 8), DType::F32, &Device::Cpu).unwrap();
        let y = Tensor::zeros(0, DType::U32, &Device::Cpu).unwrap();
        let r = token_logprobs(hid.as_tensor(), w.as_tensor(), &y, &small(2, 3)).unwrap();
        assert_eq!(r.logp.dims(), &[0]);
        let g = r.logp.sum_all().unwrap().backward().unwrap();
        assert!(g.get(w.as_tensor()).is_some());
    }
}
