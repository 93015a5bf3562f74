//! CUDA kernels of the chunked log-prob op (`src/cuda/logprob.cu`, compiled to PTX by `build.rs`
//! when the `cuda` feature is on).
//!
//! The op's logits blocks come from cuBLAS matmuls; two kernels do the rest in one pass over a
//! block each, as in-place candle ops:
//! - [`StatsUpdate`] folds a block into each token's running softmax statistics (forward);
//! - [`BlockGrad`] turns a block into the gradient of the logits (backward).
//!
//! Launching a kernel is `unsafe` in cudarc: the arguments must match the kernel's signature and
//! the launch must stay inside the buffers. Each launch below passes exactly the arguments of its
//! kernel in `logprob.cu`, with buffer sizes checked against the shapes first.
#![allow(unsafe_code)]

use candle_core::backend::BackendStorage;
use candle_core::cuda_backend::cudarc::driver::{LaunchConfig, PushKernelArg};
use candle_core::{CpuStorage, CudaStorage, DType, InplaceOp3, Layout};

/// The PTX of `src/cuda/logprob.cu`.
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

/// In place on the `[rows, 4]` f32 state `(m, s, u, z_target)`: folds in a logits block
/// `[rows, cols]` whose columns are vocabulary ids `v0..v0 + cols`, given the `[rows]` u32
/// targets.
pub(crate) struct StatsUpdate {
    pub v0: usize,
}

impl InplaceOp3 for StatsUpdate {
    fn name(&self) -> &'static str {
        "grpo-logprob-stats"
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
        candle_core::bail!("grpo-logprob-stats: the cpu has its own loops")
    }

    fn cuda_fwd(
        &self,
        state: &mut CudaStorage,
        ls: &Layout,
        z: &CudaStorage,
        lz: &Layout,
        y: &CudaStorage,
        ly: &Layout,
    ) -> candle_core::Result<()> {
        let (rows, cols) = check(self.name(), lz, ls, ly)?;
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let dev = z.device.clone();
        let func = dev.get_or_load_custom_func(
            &kernel_name("grpo_logprob_stats", z.dtype())?,
            MODULE,
            PTX,
        )?;
        let ys = y.as_cuda_slice::<u32>()?.slice(ly.start_offset()..);
        let st = state.as_cuda_slice_mut::<f32>()?;
        let mut st = st.slice_mut(ls.start_offset()..);
        let (rows_i, cols_i, v0_i) = (rows as i32, cols as i32, self.v0 as i32);
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        macro_rules! launch {
            ($t:ty) => {{
                let zs = z.as_cuda_slice::<$t>()?.slice(lz.start_offset()..);
                let mut b = func.builder();
                b.arg(&zs);
                b.arg(&mut st);
                b.arg(&ys);
                b.arg(&rows_i);
                b.arg(&cols_i);
                b.arg(&v0_i);
                // SAFETY: the arguments are the kernel's (const T*, float*, const unsigned*, int,
                // int, int); one block per row, every access bounded by rows x cols (checked above).
                unsafe { b.launch(cfg) }.map_err(wrap)?;
            }};
        }
        match z.dtype() {
            DType::F32 => launch!(f32),
            DType::BF16 => launch!(half::bf16),
            DType::F16 => launch!(half::f16),
            other => candle_core::bail!("grpo-logprob-stats: {other:?} logits"),
        }
        Ok(())
    }
}

/// In place on a logits block `[rows, cols]` (columns `v0..v0 + cols`): becomes
/// `exp(z - lse) (a - b z) + g [column == target]`, with `[rows, 4]` f32 coefficients
/// `(g, a, b, lse)` and `[rows]` u32 targets.
pub(crate) struct BlockGrad {
    pub v0: usize,
}

impl InplaceOp3 for BlockGrad {
    fn name(&self) -> &'static str {
        "grpo-logprob-grad"
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
        candle_core::bail!("grpo-logprob-grad: the cpu has its own loops")
    }

    fn cuda_fwd(
        &self,
        z: &mut CudaStorage,
        lz: &Layout,
        coef: &CudaStorage,
        lc: &Layout,
        y: &CudaStorage,
        ly: &Layout,
    ) -> candle_core::Result<()> {
        let (rows, cols) = check(self.name(), lz, lc, ly)?;
        if rows == 0 || cols == 0 {
            return Ok(());
        }
        let dev = z.device.clone();
        let func = dev.get_or_load_custom_func(
            &kernel_name("grpo_logprob_grad", z.dtype())?,
            MODULE,
            PTX,
        )?;
        let ys = y.as_cuda_slice::<u32>()?.slice(ly.start_offset()..);
        let cs = coef.as_cuda_slice::<f32>()?.slice(lc.start_offset()..);
        let (rows_i, cols_i, v0_i) = (rows as i32, cols as i32, self.v0 as i32);
        let n = rows * cols;
        let blocks = n.div_ceil(THREADS as usize).min(65_535 * 8) as u32;
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let dtype = z.dtype();
        macro_rules! launch {
            ($t:ty) => {{
                let zs = z.as_cuda_slice_mut::<$t>()?;
                let mut zs = zs.slice_mut(lz.start_offset()..);
                let mut b = func.builder();
                b.arg(&mut zs);
                b.arg(&cs);
                b.arg(&ys);
                b.arg(&rows_i);
                b.arg(&cols_i);
                b.arg(&v0_i);
                // SAFETY: the arguments are the kernel's (T*, const float*, const unsigned*, int,
                // int, int); the grid-stride loop stays below rows x cols (checked above).
                unsafe { b.launch(cfg) }.map_err(wrap)?;
            }};
        }
        match dtype {
            DType::F32 => launch!(f32),
            DType::BF16 => launch!(half::bf16),
            DType::F16 => launch!(half::f16),
            other => candle_core::bail!("grpo-logprob-grad: {other:?} logits"),
        }
        Ok(())
    }
}
