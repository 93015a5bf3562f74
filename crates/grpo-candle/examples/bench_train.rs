//! Training throughput: forward + backward + AdamW of a Qwen3-shaped model through the GRPO
//! trainer, with every position a scored policy token.
//!
//! ```text
//! cargo run --release -p grpo-candle --example bench_train -- tiny
//! cargo run --release -p grpo-candle --example bench_train -- mid --steps 3
//! cargo run --release -p grpo-candle --example bench_train -- custom --hidden 256 --layers 4 \
//!     --vocab 8000 --batch 4 --seq 512 --dtype bf16 --device cuda
//! cargo run --release -p grpo-candle --example bench_train -- --model /models/SmolLM2-135M \
//!     --batch 4 --seq 512
//! ```
//!
//! `--model DIR` trains a Hugging Face checkpoint folder (any architecture `PolicyModel::load_dir`
//! reads) instead of a random model of a preset's shape.
//!
//! The batch is split into as many micro-batches as the trainer runs at once (`--parallel N`;
//! by default, on the CPU with `CANDLE_NUM_THREADS=1`, one per thread, otherwise one);
//! `--micro-batch-tokens` overrides.
//!
//! Prints one JSON line: tokens/s (training tokens = batch x seq per step, median over the timed
//! steps), seconds per step, peak resident memory (VmHWM) and, on CUDA, model FLOP utilisation
//! against a given peak.

use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device};
use grpo_candle::ops::logprob::LogProbConfig;
use grpo_candle::train::trainer::{
    DecayKind, RolloutRecord, Schedule, TaskRollouts, Trainer, TrainerConfig, TurnTokens,
};
use grpo_candle::{PolicyModel, Qwen, QwenConfig};
use rand::{Rng, SeedableRng};

// The default allocator spends a large share of a CPU step in page faults on freshly mapped
// buffers; mimalloc reuses them.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    preset: String,
    hidden: Option<usize>,
    layers: Option<usize>,
    vocab: Option<usize>,
    intermediate: Option<usize>,
    heads: Option<usize>,
    kv_heads: Option<usize>,
    head_dim: Option<usize>,
    batch: usize,
    seq: usize,
    steps: usize,
    warmup: usize,
    dtype: DType,
    device: String,
    peak_tflops: f64,
    micro_batch_tokens: Option<usize>,
    parallel: usize,
    model: Option<std::path::PathBuf>,
}

fn parse() -> Result<Args> {
    let mut a = Args {
        preset: "tiny".into(),
        hidden: None,
        layers: None,
        vocab: None,
        intermediate: None,
        heads: None,
        kv_heads: None,
        head_dim: None,
        batch: 8,
        seq: 256,
        steps: 5,
        warmup: 1,
        dtype: DType::F32,
        device: "cpu".into(),
        peak_tflops: 0.0,
        micro_batch_tokens: None,
        parallel: 0,
        model: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--hidden" => a.hidden = Some(val()?.parse()?),
            "--layers" => a.layers = Some(val()?.parse()?),
            "--vocab" => a.vocab = Some(val()?.parse()?),
            "--intermediate" => a.intermediate = Some(val()?.parse()?),
            "--heads" => a.heads = Some(val()?.parse()?),
            "--kv-heads" => a.kv_heads = Some(val()?.parse()?),
            "--head-dim" => a.head_dim = Some(val()?.parse()?),
            "--batch" => a.batch = val()?.parse()?,
            "--seq" => a.seq = val()?.parse()?,
            "--steps" => a.steps = val()?.parse()?,
            "--warmup" => a.warmup = val()?.parse()?,
            "--micro-batch-tokens" => a.micro_batch_tokens = Some(val()?.parse()?),
            "--parallel" => a.parallel = val()?.parse()?,
            "--peak-tflops" => a.peak_tflops = val()?.parse()?,
            "--device" => a.device = val()?,
            "--model" => a.model = Some(val()?.into()),
            "--dtype" => {
                a.dtype = match val()?.as_str() {
                    "f32" => DType::F32,
                    "bf16" => DType::BF16,
                    "f16" => DType::F16,
                    other => bail!("--dtype: expected f32, bf16 or f16, got {other}"),
                }
            }
            p if !p.starts_with('-') => a.preset = p.to_string(),
            other => bail!("unknown argument {other}"),
        }
    }
    Ok(a)
}

/// The benchmark's model shapes. `tiny` and `mid` match `bench/torch_peer.py`.
fn model_config(a: &Args) -> Result<QwenConfig> {
    let mut c = QwenConfig::tiny_qwen3(700);
    match a.preset.as_str() {
        "tiny" => {
            c.hidden_size = 64;
            c.intermediate_size = 192;
            c.num_hidden_layers = 3;
            c.num_attention_heads = 4;
            c.num_key_value_heads = 2;
            c.head_dim = 16;
            c.vocab_size = 700;
        }
        "mid" => {
            c.hidden_size = 512;
            c.intermediate_size = 1536;
            c.num_hidden_layers = 8;
            c.num_attention_heads = 8;
            c.num_key_value_heads = 4;
            c.head_dim = 64;
            c.vocab_size = 32_000;
        }
        // Qwen3-4B's shapes (36 layers, hidden 2560, 32 q / 8 kv heads of 128, MLP 9728).
        "qwen3-4b" => {
            c.hidden_size = 2560;
            c.intermediate_size = 9728;
            c.num_hidden_layers = 36;
            c.num_attention_heads = 32;
            c.num_key_value_heads = 8;
            c.head_dim = 128;
            c.vocab_size = 151_936;
            c.rope_theta = 1_000_000.0;
            c.max_position_embeddings = 40_960;
        }
        "custom" => {}
        other => bail!("unknown preset {other}: tiny, mid, qwen3-4b or custom"),
    }
    if let Some(v) = a.hidden {
        c.hidden_size = v;
    }
    if let Some(v) = a.layers {
        c.num_hidden_layers = v;
    }
    if let Some(v) = a.vocab {
        c.vocab_size = v;
    }
    if let Some(v) = a.intermediate {
        c.intermediate_size = v;
    }
    if let Some(v) = a.heads {
        c.num_attention_heads = v;
    }
    if let Some(v) = a.kv_heads {
        c.num_key_value_heads = v;
    }
    if let Some(v) = a.head_dim {
        c.head_dim = v;
    }
    c.max_position_embeddings = c.max_position_embeddings.max(a.seq + 1);
    c.tie_word_embeddings = true;
    Ok(c)
}

/// Peak resident set size of this process in bytes (Linux `VmHWM`).
fn vm_hwm_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// CPU seconds (user + system) this process has used so far, from `/proc/self/stat`.
fn cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return f64::NAN;
    };
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = stat.rsplit_once(')').map(|x| x.1).unwrap_or("");
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| {
        f.get(i)
            .and_then(|x| x.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// One batch: `batch` trajectories of one generated turn of `seq` tokens after a 1-token prompt,
/// so the model runs `seq` positions per sequence and every one of them is scored.
fn batch(cfg: &QwenConfig, a: &Args, seed: u64) -> Vec<TaskRollouts> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let v = cfg.vocab_size as u32;
    // Groups of up to 8 with mixed rewards, so every token has a non-zero advantage.
    let mut tasks = Vec::new();
    let mut left = a.batch;
    while left > 0 {
        let k = left.min(8);
        left -= k;
        tasks.push(TaskRollouts {
            rollouts: (0..k)
                .map(|j| {
                    let tokens: Vec<u32> = (0..a.seq).map(|_| rng.gen_range(0..v)).collect();
                    RolloutRecord {
                        reward: (j % 2) as f32,
                        turns: vec![TurnTokens {
                            context: vec![rng.gen_range(0..v)],
                            logprobs: vec![-2.0; tokens.len()],
                            tokens,
                        }],
                    }
                })
                .collect(),
        });
    }
    tasks
}

fn main() -> Result<()> {
    let a = parse()?;
    let device = match a.device.as_str() {
        "cpu" => Device::Cpu,
        "cuda" => Device::new_cuda(0)?,
        other => bail!("--device: cpu or cuda, got {other}"),
    };
    let (cfg, model) = match &a.model {
        Some(dir) => {
            let model = PolicyModel::load_dir(dir, a.dtype, &device)?.model;
            (model.config().clone(), model)
        }
        None => {
            let cfg = model_config(&a)?;
            let model = Qwen::new_random(&cfg, 0, a.dtype, &device)?;
            (cfg, model)
        }
    };
    let tokens_per_step = a.batch * a.seq;
    let mut tcfg = TrainerConfig {
        schedule: Schedule {
            lr: 1e-5,
            warmup_steps: 0,
            total_steps: 1000,
            decay: DecayKind::Constant,
            min_lr_ratio: 1.0,
        },
        micro_batch_tokens: tokens_per_step,
        parallel_micro_batches: a.parallel,
        logprob: LogProbConfig::default(),
        ..TrainerConfig::default()
    };
    // One micro-batch per sequence group the trainer runs at once.
    let at_once = tcfg.micro_batches_at_once(&device);
    tcfg.micro_batch_tokens = a
        .micro_batch_tokens
        .unwrap_or(a.seq * a.batch.div_ceil(at_once));
    let tcfg_micro = tcfg.micro_batch_tokens;
    let mut trainer = Trainer::new(&model, tcfg)?;
    let mut times = Vec::new();
    let mut cpu_times = Vec::new();
    for step in 0..a.warmup + a.steps {
        let groups = batch(&cfg, &a, step as u64);
        let t0 = Instant::now();
        let c0 = cpu_seconds();
        let m = trainer.step_rollouts(&model, &groups)?;
        device.synchronize()?;
        let dt = t0.elapsed().as_secs_f64();
        let dc = cpu_seconds() - c0;
        eprintln!(
            "step {step}: {dt:.3} s ({dc:.2} cpu-s, optimizer {:.3} s), loss {:.5}, grad norm {:.4}, {} tokens",
            m.optimizer_seconds, m.loss, m.grad_norm, m.policy_tokens
        );
        if step >= a.warmup {
            times.push(dt);
            cpu_times.push(dc);
        }
    }
    times.sort_by(|x, y| x.total_cmp(y));
    let median = times[times.len() / 2];
    cpu_times.sort_by(|x, y| x.total_cmp(y));
    let cpu_median = cpu_times[cpu_times.len() / 2];
    let tps = tokens_per_step as f64 / median;
    // Training FLOPs per token: 6 x parameters (tied embedding counted once for the lm_head
    // matmul) + attention 12 x layers x seq x heads x head_dim (causal: half of the full 2 x 6).
    let params = cfg.num_parameters() as f64;
    let attn = 6.0
        * cfg.num_hidden_layers as f64
        * a.seq as f64
        * (cfg.num_attention_heads * cfg.head_dim) as f64;
    let flops_per_token = 6.0 * params + attn;
    let achieved_tflops = flops_per_token * tps / 1e12;
    let out = serde_json::json!({
        "preset": match &a.model {
            Some(dir) => dir.display().to_string(),
            None => a.preset.clone(),
        },
        "device": a.device,
        "dtype": format!("{:?}", a.dtype),
        "hidden": cfg.hidden_size,
        "layers": cfg.num_hidden_layers,
        "vocab": cfg.vocab_size,
        "batch": a.batch,
        "seq": a.seq,
        "params": cfg.num_parameters(),
        "step_seconds_median": median,
        "step_cpu_seconds_median": cpu_median,
        "tokens_per_s": tps,
        "achieved_tflops": achieved_tflops,
        "mfu": if a.peak_tflops > 0.0 { achieved_tflops / a.peak_tflops } else { f64::NAN },
        "peak_rss_bytes": vm_hwm_bytes(),
        "threads": candle_core::utils::get_num_threads(),
        "micro_batch_tokens": tcfg_micro,
        "micro_batches_at_once": at_once,
        "kernels": grpo_candle::ops::isa::kernel_path(),
    });
    println!("{out}");
    Ok(())
}
