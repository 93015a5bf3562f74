//! Sampling throughput of the batched KV-cached sampler on a random Qwen3 of a given shape.
//!
//! ```text
//! cargo run --release -p grpo-candle --example bench_sample -- \
//!     [--hidden 512] [--layers 8] [--heads 8] [--kv-heads 4] [--vocab 32000] \
//!     [--batch 8] [--prompt 256] [--new 128] [--reps 3] [--model DIR]
//! ```
//! `--model DIR` samples from a Hugging Face checkpoint folder (any architecture
//! `PolicyModel::load_dir` reads) instead of a random Qwen3 of the given shape.
//! Prints one JSON line: prefill tokens/s (prompt tokens per second of a call that generates one
//! token), decode tokens/s (tokens of all rows per second after the first) and the wall times,
//! each the median of `--reps` runs after a warm-up.

use std::time::Instant;

use candle_core::{DType, Device};
use grpo_candle::sample::sampler::{SampleRequest, generate};
use grpo_candle::{PolicyModel, Qwen, QwenConfig};
use harness_core::{OutputFormat, SamplingParams};

// Tensor work allocates many large short-lived buffers; glibc returns them to the OS and pays
// page faults on every reuse, mimalloc keeps them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn arg(args: &[String], name: &str, default: usize) -> anyhow::Result<usize> {
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(args
            .get(i + 1)
            .ok_or_else(|| anyhow::anyhow!("{name} needs a value"))?
            .parse()?),
        None => Ok(default),
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let hidden = arg(&args, "--hidden", 512)?;
    let heads = arg(&args, "--heads", 8)?;
    let mut cfg = QwenConfig::tiny_qwen3(arg(&args, "--vocab", 32_000)?);
    cfg.hidden_size = hidden;
    cfg.num_hidden_layers = arg(&args, "--layers", 8)?;
    cfg.num_attention_heads = heads;
    cfg.num_key_value_heads = arg(&args, "--kv-heads", 4)?;
    cfg.head_dim = hidden / heads;
    cfg.intermediate_size = 3 * hidden;
    let (batch, prompt, new) = (
        arg(&args, "--batch", 8)?,
        arg(&args, "--prompt", 256)?,
        arg(&args, "--new", 128)?,
    );
    let reps = arg(&args, "--reps", 3)?.max(1);
    let device = Device::Cpu;
    let (cfg, model, tokenizer) = match args.iter().position(|a| a == "--model") {
        Some(i) => {
            let dir = args
                .get(i + 1)
                .ok_or_else(|| anyhow::anyhow!("--model needs a folder"))?;
            let m = PolicyModel::load_dir(dir, DType::F32, &device)?;
            (m.model.config().clone(), m.model, m.tokenizer)
        }
        None => (
            cfg.clone(),
            Qwen::new_random(&cfg, 0, DType::F32, &device)?,
            grpo_candle::model::tokenizer::tiny_tokenizer(0)?,
        ),
    };

    let ids: Vec<u32> = (0..batch * prompt)
        .map(|i| (i * 7919 % cfg.vocab_size) as u32)
        .collect();
    let run = |max_new_tokens: usize| -> anyhow::Result<(f64, usize)> {
        let requests: Vec<SampleRequest> = (0..batch)
            .map(|b| SampleRequest {
                prompt: ids[b * prompt..(b + 1) * prompt].to_vec(),
                max_new_tokens,
                params: SamplingParams::default(),
                stop_token_ids: vec![],
                seed: b as u64,
                format: OutputFormat::Text,
            })
            .collect();
        let t = Instant::now();
        let out = generate(&model, &tokenizer, &requests)?;
        Ok((
            t.elapsed().as_secs_f64(),
            out.iter().map(|s| s.tokens.len()).sum(),
        ))
    };
    // Warm up, then: prefill + first token, and prefill + `new` tokens, the median of `reps`
    // runs each; decode is the difference.
    run(1)?;
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let prefill = median(
        (0..reps)
            .map(|_| run(1).map(|r| r.0))
            .collect::<anyhow::Result<_>>()?,
    );
    let mut generated = 0;
    let mut totals = Vec::with_capacity(reps);
    for _ in 0..reps {
        let (t, g) = run(new)?;
        totals.push(t);
        generated = g;
    }
    let total = median(totals);
    let decode = (total - prefill).max(1e-9);
    let generated = generated - batch;
    println!(
        "{}",
        serde_json::json!({
            "params": cfg.num_parameters(), "batch": batch, "prompt": prompt, "new": new, "reps": reps,
            "prefill_s": prefill, "prefill_tokens_per_s": (batch * prompt) as f64 / prefill,
            "decode_s": decode, "decode_tokens_per_s": generated as f64 / decode,
            "kernels": grpo_candle::ops::isa::kernel_path(),
        })
    );
    Ok(())
}
