//! Device check of the `cuda` feature: the log-prob op's CUDA kernels against the CPU path on
//! fresh random inputs (values and gradients, f32 and bf16, with and without the logits cache,
//! and the tensor-op path), then timings of the op at a real vocabulary.
//!
//! ```text
//! cargo build --release -p grpo-candle --features cuda --example cuda_check
//! target/release/examples/cuda_check            # on a machine with a CUDA GPU
//! ```
//!
//! Prints one `CHECK` line per comparison and one `BENCH` line per timing; exits non-zero when a
//! check fails.

use std::time::Instant;

use anyhow::Result;
use candle_core::{DType, Device, Tensor, Var};
use grpo_candle::ops::logprob::{LogProbConfig, TokenLogProbs, token_logprobs};
use rand::{Rng, SeedableRng};

fn random(shape: (usize, usize), scale: f64, rng: &mut rand_chacha::ChaCha8Rng) -> Result<Tensor> {
    let n = shape.0 * shape.1;
    let data: Vec<f32> = (0..n)
        .map(|_| (rng.gen_range(-1.0..1.0) * scale) as f32)
        .collect();
    Ok(Tensor::from_vec(data, shape, &Device::Cpu)?)
}

/// Values and gradients of `sum(logp r1) + sum(entropy r2) + sum(lse r3)`.
struct Run {
    out: [Tensor; 3],
    dh: Tensor,
    dw: Tensor,
}

fn run(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    r: &[Tensor; 3],
    cfg: &LogProbConfig,
) -> Result<Run> {
    let h = Var::from_tensor(hidden)?;
    let w = Var::from_tensor(weight)?;
    let TokenLogProbs { logp, entropy, lse } =
        token_logprobs(h.as_tensor(), w.as_tensor(), targets, cfg)?;
    let dev = hidden.device();
    let mut loss = Tensor::zeros((), DType::F32, dev)?;
    for (t, ri) in [&logp, &entropy, &lse].into_iter().zip(r) {
        loss = (loss + (t.to_dtype(DType::F32)? * ri.to_device(dev)?)?.sum_all()?)?;
    }
    let g = loss.backward()?;
    let grad = |v: &Var| -> Result<Tensor> {
        Ok(g.get(v.as_tensor())
            .expect("gradient")
            .to_dtype(DType::F32)?
            .to_device(&Device::Cpu)?)
    };
    let cpu =
        |t: &Tensor| -> Result<Tensor> { Ok(t.to_dtype(DType::F32)?.to_device(&Device::Cpu)?) };
    Ok(Run {
        out: [cpu(&logp)?, cpu(&entropy)?, cpu(&lse)?],
        dh: grad(&h)?,
        dw: grad(&w)?,
    })
}

/// Largest absolute difference over the largest magnitude of the reference.
fn rel_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
    let d = (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()? as f64;
    let m = b.abs()?.flatten_all()?.max(0)?.to_scalar::<f32>()? as f64;
    Ok(d / m.max(1e-12))
}

fn main() -> Result<()> {
    let gpu = Device::new_cuda(0)?;
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(20_261_201);
    let mut failures = 0;

    // Correctness: 3 vocabulary blocks and 2 token blocks.
    let (n, h, v) = (1536, 256, 20_000);
    let hidden = random((n, h), 1.0, &mut rng)?;
    let weight = random((v, h), 0.2, &mut rng)?;
    let targets: Vec<u32> = (0..n).map(|_| rng.gen_range(0..v as u32)).collect();
    let targets = Tensor::from_vec(targets, n, &Device::Cpu)?;
    let r = [
        random((n, 1), 1.0, &mut rng)?.squeeze(1)?,
        random((n, 1), 1.0, &mut rng)?.squeeze(1)?,
        random((n, 1), 1.0, &mut rng)?.squeeze(1)?,
    ];
    let base = LogProbConfig {
        token_chunk: 1024,
        vocab_chunk: 8192,
        cache_bytes: 0,
        force_tensor_path: false,
    };
    for (dtype, tol) in [(DType::F32, 2e-4), (DType::BF16, 3e-2)] {
        // The reference sees the same (rounded) values on the CPU in f32.
        let hd = hidden.to_dtype(dtype)?;
        let wd = weight.to_dtype(dtype)?;
        let reference = run(
            &hd.to_dtype(DType::F32)?,
            &wd.to_dtype(DType::F32)?,
            &targets,
            &r,
            &base,
        )?;
        let variants = [
            ("kernels", base),
            (
                "kernels+cache",
                LogProbConfig {
                    cache_bytes: 1 << 30,
                    ..base
                },
            ),
            (
                "tensor-ops",
                LogProbConfig {
                    force_tensor_path: true,
                    ..base
                },
            ),
        ];
        for (name, cfg) in variants {
            let got = run(
                &hd.to_device(&gpu)?,
                &wd.to_device(&gpu)?,
                &targets.to_device(&gpu)?,
                &r,
                &cfg,
            )?;
            let diffs = [
                ("logp", rel_diff(&got.out[0], &reference.out[0])?),
                ("entropy", rel_diff(&got.out[1], &reference.out[1])?),
                ("lse", rel_diff(&got.out[2], &reference.out[2])?),
                ("d_hidden", rel_diff(&got.dh, &reference.dh)?),
                ("d_weight", rel_diff(&got.dw, &reference.dw)?),
            ];
            let worst = diffs.iter().map(|d| d.1).fold(0.0, f64::max);
            let ok = worst <= tol;
            failures += usize::from(!ok);
            println!(
                "CHECK log-prob op {name} {dtype:?} vs cpu f32: {} (worst relative diff {worst:.2e}, tolerance {tol:.0e}; {})",
                if ok { "PASS" } else { "FAIL" },
                diffs
                    .iter()
                    .map(|(k, d)| format!("{k} {d:.2e}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }

    // Timings at Qwen3's vocabulary: forward + backward of the op, bf16, 8192 tokens.
    let (n, h, v) = (8192, 2560, 151_936);
    let hidden = random((n, h), 1.0, &mut rng)?
        .to_dtype(DType::BF16)?
        .to_device(&gpu)?;
    let weight = random((v, h), 0.02, &mut rng)?
        .to_dtype(DType::BF16)?
        .to_device(&gpu)?;
    let targets: Vec<u32> = (0..n).map(|_| rng.gen_range(0..v as u32)).collect();
    let targets = Tensor::from_vec(targets, n, &gpu)?;
    let r = [
        Tensor::ones(n, DType::F32, &gpu)?,
        Tensor::zeros(n, DType::F32, &gpu)?,
        Tensor::zeros(n, DType::F32, &gpu)?,
    ];
    let big = LogProbConfig {
        token_chunk: 4096,
        vocab_chunk: 16_384,
        cache_bytes: 0,
        force_tensor_path: false,
    };
    for (name, cfg) in [
        ("kernels", big),
        (
            "tensor-ops",
            LogProbConfig {
                force_tensor_path: true,
                ..big
            },
        ),
    ] {
        let mut times = Vec::new();
        for _ in 0..4 {
            gpu.synchronize()?;
            let t0 = Instant::now();
            run(&hidden, &weight, &targets, &r, &cfg)?;
            gpu.synchronize()?;
            times.push(t0.elapsed().as_secs_f64());
        }
        times.remove(0);
        times.sort_by(f64::total_cmp);
        // Forward 1 matmul, backward 3 (recompute, d_hidden, d_weight): 8 n v h FLOPs.
        let flops = 8.0 * n as f64 * v as f64 * h as f64;
        println!(
            "BENCH log-prob op {name} bf16 {n} tokens x vocab {v} x hidden {h}: {:.1} ms forward+backward ({:.0} TFLOP/s)",
            times[1] * 1e3,
            flops / times[1] / 1e12
        );
    }
    if failures > 0 {
        anyhow::bail!("{failures} check(s) failed");
    }
    Ok(())
}
