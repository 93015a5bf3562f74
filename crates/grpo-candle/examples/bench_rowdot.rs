//! A decoding step's weight products: candle's matmul (gemm) against
//! [`grpo_candle::ops::rowdot::linear_rows`], on the shapes of `bench_sample`'s random Qwen3
//! (hidden 512, MLP 1,536, vocab 32k) and of SmolLM2-135M (hidden 576, vocab 49,152).
//!
//! ```text
//! MIMALLOC_PURGE_DELAY=-1 RAYON_NUM_THREADS=2 cargo run --release -p grpo-candle --example bench_rowdot
//! ```
//! Prints one JSON line per shape and row count: milliseconds per product (median of 21) on
//! each path and their ratio.

use std::time::Instant;

use candle_core::{Device, Tensor};
use grpo_candle::ops::rowdot::linear_rows;

// As the other benchmarks: keep freed buffers instead of faulting fresh pages in.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn median_ms(mut f: impl FnMut() -> anyhow::Result<Tensor>) -> anyhow::Result<f64> {
    f()?;
    let mut times = Vec::with_capacity(21);
    for _ in 0..21 {
        let t = Instant::now();
        f()?;
        times.push(t.elapsed().as_secs_f64() * 1e3);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

fn main() -> anyhow::Result<()> {
    let device = Device::Cpu;
    // (inputs, outputs): q/o, k/v, gate/up, down, lm_head; SmolLM2's lm_head.
    let shapes = [
        (512, 512),
        (512, 256),
        (512, 1536),
        (1536, 512),
        (512, 32_000),
        (576, 49_152),
    ];
    for (k, n) in shapes {
        let w = Tensor::randn(0f32, 1.0, (n, k), &device)?;
        for m in [1, 8, 16, 32, 64] {
            let x = Tensor::randn(0f32, 1.0, (m, k), &device)?;
            let gemm = median_ms(|| Ok(x.matmul(&w.t()?)?))?;
            let rowdot = median_ms(|| Ok(linear_rows(&x, &w)?))?;
            println!(
                "{}",
                serde_json::json!({
                    "inputs": k, "outputs": n, "rows": m,
                    "gemm_ms": gemm, "rowdot_ms": rowdot, "gemm_over_rowdot": gemm / rowdot,
                })
            );
        }
    }
    Ok(())
}
