//! CUDA kernels of the chunked log-prob op (`src/ops/cuda/logprob.cu`, compiled to PTX by
//! `build.rs` when the `cuda` feature is on).
//!
//! The op's logits blocks come from cuBLAS matmuls; two kernels do the rest in one pass over a
//! block each, as in-place candle ops ([`BlockKernel`]): `Stats` folds a block into each token's
//! running softmax statistics ([`forward_chunk`], the forward), `Grad` turns a block into the
//! gradient of the logits ([`block_grad`], the backward).
//!
//! Launching a kernel is `unsafe` in cudarc: the arguments must match the kernel's signature and
//! the launch must stay inside the buffers. Each launch below passes exactly the arguments of its
//! kernel in `logprob.cu`, with buffer sizes checked against the shapes first.
#![allow(unsafe_code)]

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{CpuStorage, CudaStorage, DType, InplaceOp3, Layout, Tensor};

use crate::ops::logprob::{LogProbConfig, stats_from_online};

/// The PTX of `src/ops/cuda/logprob.cu`.
const PTX: &str = include_str!(concat!(env!("OUT_DIR"), "/grpo_kernels.ptx"));
const MODULE: &str = "grpo_logprob";
const THREADS: u32 = 256;

fn kernel_name(prefix: &str, dtype: DType) -> candle_core::Result<String> {
    let suffix = match dtype {
        DType::F32 => "f32",
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        other => candle_core::bail!("{prefix}: no cuda kernel for {other:?} logits"),
    };
    Ok(format!("{prefix}_{suffix}"))
}

fn wrap(e: impl std::error::Error + Send + Sync + 'static) -> candle_core::Error {
    candle_core::Error::Cuda(Box::new(e))
}

/// Checks the layouts the kernels assume: `[rows, cols]` logits, `[rows, 4]` f32 state or
/// coefficients, `[rows]` u32 targets, all contiguous.
fn check(what: &str, z: &Layout, four: &Layout, y: &Layout) -> candle_core::Result<(usize, usize)> {
    let (rows, cols) = z.shape().dims2()?;
    if four.shape().dims2()? != (rows, 4) || y.shape().dims1()? != rows {
        candle_core::bail!(
            "{what}: logits {:?}, per-row terms {:?} (expected [{rows}, 4]), targets {:?}",
            z.dims(),
            four.dims(),
            y.dims()
        );
    }
    if !(z.is_contiguous() && four.is_contiguous() && y.is_contiguous()) {
        candle_core::bail!("{what}: inputs must be contiguous");
    }
    if rows > i32::MAX as usize || cols > i32::MAX as usize {
        candle_core::bail!("{what}: block {rows} x {cols} too large");
    }
    Ok((rows, cols))
}

/// The two kernels; each runs in place on its first argument.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kernel {
    /// On the `[rows, 4]` f32 state `(m, s, u, z_target)`: folds in a logits block `[rows, cols]`
    /// (second argument) given the `[rows]` u32 targets (third).
    Stats,
    /// On a logits block `[rows, cols]`: becomes `exp(z - lse) (a - b z) + g [column == target]`,
    /// with `[rows, 4]` f32 coefficients `(g, a, b, lse)` (second argument) and the targets.
    Grad,
}

/// One kernel launch on a block whose columns are vocabulary ids `v0..v0 + cols`.
struct BlockKernel {
    kernel: Kernel,
    v0: usize,
}

impl InplaceOp3 for BlockKernel {
    fn name(&self) -> &'static str {
        match self.kernel {
            Kernel::Stats => "grpo_logprob_stats",
            Kernel::Grad => "grpo_logprob_grad",
        }
    }

    fn cpu_fwd(
        &self,
        _: &mut CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
        _: &CpuStorage,
        _: &Layout,
    ) -> candle_core::Result<()> {
        candle_core::bail!("{}: the cpu has its own loops", self.name())
    }

    fn cuda_fwd(
        &self,
        dst: &mut CudaStorage,
        ld: &Layout,
        src: &CudaStorage,
        ls: &Layout,
        y: &CudaStorage,
        ly: &Layout,
    ) -> candle_core::Result<()> {
        let name = self.name();
        let (logits, lz, four, lf) = match self.kernel {
            Kernel::Stats => (src.dtype(), ls, dst.dtype(), ld),
            Kernel::Grad => (dst.dtype(), ld, src.dtype(), ls),
        };
        if four != DType::F32 {
            candle_core::bail!("{name}: per-row terms must be f32, got {four:?}");
        }
        let (rows, cols) = check(name, lz, lf, ly)?;
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let func = src
            .device
            .get_or_load_custom_func(&kernel_name(name, logits)?, MODULE, PTX)?;
        let ys = y.as_cuda_slice::<u32>()?.slice(ly.start_offset()..);
        let (rows_i, cols_i, v0_i) = (rows as i32, cols as i32, self.v0 as i32);
        let grid = match self.kernel {
            // One block per row.
            Kernel::Stats => rows as u32,
            // A grid-stride loop over the elements.
            Kernel::Grad => (rows * cols).div_ceil(THREADS as usize).min(65_535 * 8) as u32,
        };
        let cfg = LaunchConfig {
            grid_dim: (grid, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        macro_rules! launch {
            ($t:ty) => {{
                let mut b = func.builder();
                // The kernels take (logits, per-row terms, targets, rows, cols, v0), with the
                // in-place one mutable: `Stats` writes the terms, `Grad` the logits.
                match self.kernel {
                    Kernel::Stats => {
                        let zs = src.as_cuda_slice::<$t>()?.slice(ls.start_offset()..);
                        let st = dst.as_cuda_slice_mut::<f32>()?;
                        let mut st = st.slice_mut(ld.start_offset()..);
                        b.arg(&zs);
                        b.arg(&mut st);
                        b.arg(&ys);
                        b.arg(&rows_i);
                        b.arg(&cols_i);
                        b.arg(&v0_i);
                        // SAFETY: the arguments are the kernel's (const T*, float*, const
                        // unsigned*, int, int, int); one block per row, every access bounded by
                        // rows x cols (checked above).
                        unsafe { b.launch(cfg) }.map_err(wrap)?;
                    }
                    Kernel::Grad => {
                        let cs = src.as_cuda_slice::<f32>()?.slice(ls.start_offset()..);
                        let zs = dst.as_cuda_slice_mut::<$t>()?;
                        let mut zs = zs.slice_mut(ld.start_offset()..);
                        b.arg(&mut zs);
                        b.arg(&cs);
                        b.arg(&ys);
                        b.arg(&rows_i);
                        b.arg(&cols_i);
                        b.arg(&v0_i);
                        // SAFETY: the arguments are the kernel's (T*, const float*, const
                        // unsigned*, int, int, int); the grid-stride loop stays below rows x
                        // cols (checked above).
                        unsafe { b.launch(cfg) }.map_err(wrap)?;
                    }
                }
            }};
        }
        match logits {
            DType::F32 => launch!(f32),
            DType::BF16 => launch!(half::bf16),
            DType::F16 => launch!(half::f16),
            other => candle_core::bail!("{name}: {other:?} logits"),
        }
        Ok(())
    }
}

/// One token chunk's `[tc, 3]` f32 statistics of the log-prob op: cuBLAS logits blocks, each
/// folded into the running state by one kernel launch.
pub(crate) fn forward_chunk(
    hc: &Tensor,
    weight: &Tensor,
    yc: &Tensor,
    v: usize,
    cfg: &LogProbConfig,
    keep: &mut dyn FnMut(usize, &Tensor),
) -> candle_core::Result<Tensor> {
    let tc = hc.dim(0)?;
    let init: Vec<f32> = (0..tc)
        .flat_map(|_| [f32::NEG_INFINITY, 0.0, 0.0, 0.0])
        .collect();
    let state = Tensor::from_vec(init, (tc, 4), hc.device())?;
    let yc = yc.contiguous()?;
    for v0 in (0..v).step_by(cfg.vocab_chunk) {
        let vc = cfg.vocab_chunk.min(v - v0);
        let wc = weight.narrow(0, v0, vc)?;
        let z = hc.matmul(&wc.t()?)?.contiguous()?;
        keep(v0, &z);
        let op = BlockKernel {
            kernel: Kernel::Stats,
            v0,
        };
        state.inplace_op3(&z, &yc, &op)?;
    }
    let col = |i| state.narrow(1, i, 1);
    stats_from_online(&col(0)?, &col(1)?, &col(2)?, &col(3)?)
}

/// The gradient of one logits block, computed in place on `z` (on a copy when `z` is the
/// forward's cached block), from the per-row terms `[g, a, b, lse]` (`[tc, 1]` each).
pub(crate) fn block_grad(
    z: Tensor,
    cached: bool,
    terms: [&Tensor; 4],
    targets: &Tensor,
    v0: usize,
) -> candle_core::Result<Tensor> {
    let z = if cached { z.copy()? } else { z.contiguous()? };
    let coef = Tensor::cat(&terms, 1)?.to_dtype(DType::F32)?.contiguous()?;
    let op = BlockKernel {
        kernel: Kernel::Grad,
        v0,
    };
    z.inplace_op3(&coef, &targets.contiguous()?, &op)?;
    Ok(z)
}
