//! Episode replay through the sampler with and without the prefix cache, in one run.
//!
//! ```text
//! cargo run --release -p grpo-candle --example bench_replay -- \
//!     [--hidden 256] [--layers 4] [--heads 8] [--kv-heads 4] [--vocab 8000] \
//!     [--tasks 2] [--k 8] [--system 600] [--task 80] [--turns 6] [--gen 48] [--obs 120] \
//!     [--trajectories FILE [--dump-shapes FILE]]
//! ```
//! Replays the turn structure of an agent episode on a random Qwen3 of the given shape: a
//! system prompt (harness text and tool schemas) of `--system` tokens, a task instruction of
//! `--task` tokens, then `--turns` turns, each generating `--gen` tokens and appending an
//! observation of `--obs` tokens. The K rollouts of a task share the system prompt and the task
//! and decode together, one batch per turn; tasks share the system prompt. The defaults follow
//! the app world's episodes under H0 in this repository (about 600 tokens of instructions and
//! tool schemas, a few turns of short tool calls and paginated observations). Both modes sample
//! the same seeds; the run checks that they produce the same tokens and log-probs, then prints
//! one JSON line per mode and a `SUMMARY` line with the ratios.
//!
//! `--trajectories FILE` replays recorded episodes instead: a `trajectories.jsonl` of the rescue
//! trainer (one `harness_core::Trajectory` per line). Rollouts are grouped by environment and
//! task (the first `--k` of each, at most `--tasks` groups when given); at turn `t` the
//! rollouts of a group that reached it decode together, each from its recorded context (token
//! ids folded into the model's vocabulary) for exactly its recorded number of generated tokens.
//! `--dump-shapes FILE` writes those batches (prompt ids and generation lengths) for
//! `bench/hf_generate_peer.py replay`, which runs them through transformers' `generate`.

use std::time::Instant;

use std::collections::BTreeMap;

use candle_core::{DType, Device};
use grpo_candle::sample::sampler::{Sample, SampleRequest, generate_cached};
use grpo_candle::{PrefixCache, PrefixCacheConfig, Qwen, QwenConfig};
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

struct Shape {
    tasks: usize,
    k: usize,
    system: usize,
    task: usize,
    turns: usize,
    gen_tokens: usize,
    obs: usize,
}

struct Outcome {
    seconds: f64,
    generated: usize,
    samples: Vec<Sample>,
    stats: grpo_candle::PrefixCacheStats,
}

/// Deterministic filler tokens for prompt text (`salt` tells texts apart).
fn filler(n: usize, salt: usize, vocab: usize) -> Vec<u32> {
    (0..n)
        .map(|i| ((i * 7919 + salt * 104_729 + 13) % (vocab - 1) + 1) as u32)
        .collect()
}

fn replay(
    model: &Qwen,
    tok: &tokenizers::Tokenizer,
    s: &Shape,
    config: PrefixCacheConfig,
) -> anyhow::Result<Outcome> {
    let vocab = model.config().vocab_size;
    let mut cache = PrefixCache::new(config);
    let system = filler(s.system, 0, vocab);
    let mut samples = Vec::new();
    let mut generated = 0;
    let started = Instant::now();
    for t in 0..s.tasks {
        let mut contexts: Vec<Vec<u32>> = (0..s.k)
            .map(|_| {
                let mut c = system.clone();
                c.extend(filler(s.task, 1 + t, vocab));
                c
            })
            .collect();
        for turn in 0..s.turns {
            let requests: Vec<SampleRequest> = contexts
                .iter()
                .enumerate()
                .map(|(r, c)| SampleRequest {
                    prompt: c.clone(),
                    max_new_tokens: s.gen_tokens,
                    params: SamplingParams::default(),
                    stop_token_ids: vec![],
                    seed: (t * 1000 + r * 100 + turn) as u64,
                    format: OutputFormat::Text,
                })
                .collect();
            let out = generate_cached(model, tok, &requests, &mut cache)?;
            for (r, (c, sample)) in contexts.iter_mut().zip(&out).enumerate() {
                generated += sample.tokens.len();
                c.extend(&sample.tokens);
                // The environment's observation differs per rollout (it answers that rollout's
                // action).
                c.extend(filler(s.obs, 1000 + t * 100 + r * 10 + turn, vocab));
            }
            samples.extend(out);
        }
    }
    Ok(Outcome {
        seconds: started.elapsed().as_secs_f64(),
        generated,
        samples,
        stats: cache.stats(),
    })
}

/// One decoding batch of a recorded replay: the rollouts of one task at one turn.
#[derive(serde::Serialize)]
struct Batch {
    prompts: Vec<Vec<u32>>,
    generated: Vec<usize>,
}

/// The batches of recorded trajectories (see the module docs) and the number of episodes.
fn recorded_batches(
    path: &str,
    k: usize,
    max_tasks: Option<usize>,
    vocab: usize,
) -> anyhow::Result<(Vec<Batch>, usize)> {
    let text =
        std::fs::read_to_string(path).map_err(|e| anyhow::anyhow!("cannot read {path}: {e}"))?;
    let mut groups: BTreeMap<(String, String), Vec<harness_core::Trajectory>> = BTreeMap::new();
    for (i, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let t: harness_core::Trajectory = serde_json::from_str(line).map_err(|e| {
            anyhow::anyhow!(
                "{path}:{}: not a trajectory (harness_core::Trajectory): {e}",
                i + 1
            )
        })?;
        let group = groups
            .entry((t.env.clone(), t.task_id.clone()))
            .or_default();
        if group.len() < k {
            group.push(t);
        }
    }
    let fold = |ids: &[u32]| ids.iter().map(|&i| i % vocab as u32).collect::<Vec<u32>>();
    let mut batches = Vec::new();
    let mut episodes = 0;
    for group in groups.values().take(max_tasks.unwrap_or(usize::MAX)) {
        episodes += group.len();
        let turns = group.iter().map(|t| t.turns.len()).max().unwrap_or(0);
        for turn in 0..turns {
            let (prompts, generated) = group
                .iter()
                .filter_map(|t| t.turns.get(turn))
                .filter(|r| !r.context_tokens.is_empty() && !r.tokens.is_empty())
                .map(|r| (fold(&r.context_tokens), r.tokens.len()))
                .unzip();
            batches.push(Batch { prompts, generated });
        }
    }
    batches.retain(|b| !b.prompts.is_empty());
    anyhow::ensure!(!batches.is_empty(), "{path}: no policy turns to replay");
    Ok((batches, episodes))
}

fn replay_recorded(
    model: &Qwen,
    tok: &tokenizers::Tokenizer,
    batches: &[Batch],
    config: PrefixCacheConfig,
) -> anyhow::Result<Outcome> {
    let mut cache = PrefixCache::new(config);
    let mut samples = Vec::new();
    let mut generated = 0;
    let started = Instant::now();
    for (b, batch) in batches.iter().enumerate() {
        let requests: Vec<SampleRequest> = batch
            .prompts
            .iter()
            .zip(&batch.generated)
            .enumerate()
            .map(|(r, (prompt, &n))| SampleRequest {
                prompt: prompt.clone(),
                max_new_tokens: n,
                params: SamplingParams::default(),
                stop_token_ids: vec![],
                seed: (b * 100 + r) as u64,
                format: OutputFormat::Text,
            })
            .collect();
        let out = generate_cached(model, tok, &requests, &mut cache)?;
        generated += out.iter().map(|s| s.tokens.len()).sum::<usize>();
        samples.extend(out);
    }
    Ok(Outcome {
        seconds: started.elapsed().as_secs_f64(),
        generated,
        samples,
        stats: cache.stats(),
    })
}

fn flag<'a>(args: &'a [String], name: &str) -> anyhow::Result<Option<&'a str>> {
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(Some(
            args.get(i + 1)
                .ok_or_else(|| anyhow::anyhow!("{name} needs a value"))?,
        )),
        None => Ok(None),
    }
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let hidden = arg(&args, "--hidden", 256)?;
    let heads = arg(&args, "--heads", 8)?;
    let mut cfg = QwenConfig::tiny_qwen3(arg(&args, "--vocab", 8000)?);
    cfg.hidden_size = hidden;
    cfg.num_hidden_layers = arg(&args, "--layers", 4)?;
    cfg.num_attention_heads = heads;
    cfg.num_key_value_heads = arg(&args, "--kv-heads", 4)?;
    cfg.head_dim = hidden / heads;
    cfg.intermediate_size = 3 * hidden;
    cfg.max_position_embeddings = 32_768;
    let shape = Shape {
        tasks: arg(&args, "--tasks", 2)?,
        k: arg(&args, "--k", 8)?,
        system: arg(&args, "--system", 600)?,
        task: arg(&args, "--task", 80)?,
        turns: arg(&args, "--turns", 6)?,
        gen_tokens: arg(&args, "--gen", 48)?,
        obs: arg(&args, "--obs", 120)?,
    };
    let model = Qwen::new_random(&cfg, 0, DType::F32, &Device::Cpu)?;
    let tok = grpo_candle::model::tokenizer::tiny_tokenizer(0)?;

    let (plain, cached, episodes) = match flag(&args, "--trajectories")? {
        None => {
            let plain = replay(&model, &tok, &shape, PrefixCacheConfig::disabled())?;
            let cached = replay(&model, &tok, &shape, PrefixCacheConfig::default())?;
            (plain, cached, shape.tasks * shape.k)
        }
        Some(path) => {
            let max_tasks = args.iter().any(|a| a == "--tasks").then_some(shape.tasks);
            let (batches, episodes) = recorded_batches(path, shape.k, max_tasks, cfg.vocab_size)?;
            if let Some(out) = flag(&args, "--dump-shapes")? {
                let shapes = serde_json::json!({"episodes": episodes, "batches": batches});
                std::fs::write(out, shapes.to_string())
                    .map_err(|e| anyhow::anyhow!("cannot write {out}: {e}"))?;
            }
            let plain = replay_recorded(&model, &tok, &batches, PrefixCacheConfig::disabled())?;
            let cached = replay_recorded(&model, &tok, &batches, PrefixCacheConfig::default())?;
            (plain, cached, episodes)
        }
    };
    anyhow::ensure!(
        plain.samples == cached.samples,
        "cached and uncached replays sampled different tokens or log-probs"
    );
    let episodes = episodes as f64;
    for (mode, o) in [("uncached", &plain), ("cached", &cached)] {
        println!(
            "{}",
            serde_json::json!({
                "mode": mode,
                "seconds": o.seconds,
                "episodes_per_s": episodes / o.seconds,
                "policy_tokens_per_s": o.generated as f64 / o.seconds,
                "prefill_tokens_computed": o.stats.computed_tokens,
                "prefill_tokens_reused": o.stats.reused_tokens,
                "cache_hits": o.stats.hits,
                "cache_bytes": o.stats.bytes,
            })
        );
    }
    println!(
        "SUMMARY episode throughput cached/uncached {:.2}x; prefill tokens computed uncached/cached {:.2}x ({} vs {}); identical samples: yes",
        plain.seconds / cached.seconds,
        plain.stats.computed_tokens as f64 / cached.stats.computed_tokens.max(1) as f64,
        plain.stats.computed_tokens,
        cached.stats.computed_tokens,
    );
    Ok(())
}
