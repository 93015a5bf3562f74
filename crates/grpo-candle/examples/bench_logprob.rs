//! Peak memory and time of the chosen-token log-prob (forward + backward) for one variant, in
//! this process only, so that `VmHWM` measures that variant alone:
//!
//! ```text
//! cargo run --release -p grpo-candle --example bench_logprob -- chunked --tokens 8192 --vocab 151936
//! cargo run --release -p grpo-candle --example bench_logprob -- naive --tokens 8192 --vocab 151936
//! ```
//!
//! `naive` is matmul + `log_softmax` + gather (the `[tokens, vocab]` logits and their softmax
//! exist); `chunked` is [`grpo_candle::ops::logprob::token_logprobs`]. Prints one JSON line with the
//! resident memory after the inputs exist (`base_rss_bytes`), the peak (`peak_rss_bytes`) and
//! their difference (`extra_bytes`); the gradients of `hidden` and `weight` are part of both.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::{D, Device, Tensor, Var};
use grpo_candle::ops::logprob::{LogProbConfig, token_logprobs};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn status_bytes(key: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

fn main() -> Result<()> {
    let mut variant = String::from("chunked");
    let (mut n, mut v, mut h) = (8192usize, 151_936usize, 1024usize);
    let mut cfg = LogProbConfig::default();
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || -> Result<usize> {
            Ok(it
                .next()
                .with_context(|| format!("{arg} needs a value"))?
                .parse()?)
        };
        match arg.as_str() {
            "--tokens" => n = val()?,
            "--vocab" => v = val()?,
            "--hidden" => h = val()?,
            "--token-chunk" => cfg.token_chunk = val()?,
            "--vocab-chunk" => cfg.vocab_chunk = val()?,
            "chunked" | "naive" => variant = arg.clone(),
            other => bail!("unknown argument {other}"),
        }
    }
    let dev = Device::Cpu;
    let hidden = Var::from_tensor(&(Tensor::randn(0f32, 1.0, (n, h), &dev)?))?;
    let weight = Var::from_tensor(&(Tensor::randn(0f32, 0.05, (v, h), &dev)?))?;
    let ids: Vec<u32> = (0..n).map(|i| ((i * 7919) % v) as u32).collect();
    let targets = Tensor::from_vec(ids, n, &dev)?;
    let base = status_bytes("VmRSS:").unwrap_or(0);
    let t0 = Instant::now();
    let logp = match variant.as_str() {
        "chunked" => token_logprobs(hidden.as_tensor(), weight.as_tensor(), &targets, &cfg)?.logp,
        _ => {
            let logits = hidden.as_tensor().matmul(&weight.as_tensor().t()?)?;
            let logsm = candle_nn::ops::log_softmax(&logits, D::Minus1)?;
            logsm.gather(&targets.unsqueeze(1)?, 1)?.squeeze(1)?
        }
    };
    let loss = logp.mean_all()?;
    let value = loss.to_scalar::<f32>()?;
    let grads = loss.backward()?;
    let gw = grads
        .get(weight.as_tensor())
        .context("no weight gradient")?;
    let gnorm = gw.sqr()?.sum_all()?.sqrt()?.to_scalar::<f32>()?;
    let secs = t0.elapsed().as_secs_f64();
    let peak = status_bytes("VmHWM:").unwrap_or(0);
    let out = serde_json::json!({
        "variant": variant,
        "tokens": n,
        "vocab": v,
        "hidden": h,
        "mean_logp": value,
        "weight_grad_norm": gnorm,
        "seconds": secs,
        "base_rss_bytes": base,
        "peak_rss_bytes": peak,
        "extra_bytes": peak.saturating_sub(base),
    });
    println!("{out}");
    Ok(())
}
