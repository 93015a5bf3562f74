//! Loop overhead: one batch of single-turn episodes of the tiny candle policy through the rescue
//! loop (`RescueTrainer`, plain GRPO, a learner that does nothing) against the same generations
//! (same prompts, seeds and limits) straight through grpo-candle's batched sampler.
//!
//! ```text
//! cargo run -p harness-rollout --example loop_overhead -- [--tasks 8] [--k 8] [--new 32] [--concurrency 64] [--prefix-cache 0|1]
//! ```
//! The policy's prefix cache is off by default, so both sides prefill every prompt and the
//! ratio is the loop's own overhead; `--prefix-cache 1` shows what the cache adds on top.
//! Prints one JSON line: episodes/s and policy tokens/s both ways, their ratio, and whether the
//! sampler reproduced the loop's tokens exactly.

use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use candle_core::{DType, Device};
use grpo_candle::sample::sampler::{SampleRequest, generate};
use grpo_candle::{CandlePolicy, PolicyModel, PolicyOptions, TinySpec};
use harness_core::{
    EnvSession, Environment, Group, Harness, Learner, Observation, Outcome, OutputFormat,
    SamplingParams, Split, Task, ToolCall, ToolKind, ToolSpec, UpdateReport, call_seed,
};
use harness_pool::SiblingPool;
use harness_rollout::{RescueConfig, RescueTrainer, TrainingSetup, UpdateRecord};
use serde_json::json;

fn arg(args: &[String], name: &str, default: usize) -> anyhow::Result<usize> {
    match args.iter().position(|a| a == name) {
        Some(i) => Ok(args
            .get(i + 1)
            .ok_or_else(|| anyhow::anyhow!("{name} needs a value"))?
            .parse()?),
        None => Ok(default),
    }
}

/// One tool, every episode one turn.
struct OneTurn;
struct OneTurnSession;

#[async_trait]
impl Environment for OneTurn {
    fn name(&self) -> &str {
        "one-turn"
    }
    async fn reset(&self, _: &Task, _: u64) -> harness_core::Result<Box<dyn EnvSession>> {
        Ok(Box::new(OneTurnSession))
    }
}

#[async_trait]
impl EnvSession for OneTurnSession {
    fn tools(&self) -> Vec<ToolSpec> {
        vec![
            ToolSpec::new(
                "submit",
                "Submit.",
                json!({"type": "object", "properties": {}}),
            )
            .with_kind(ToolKind::Submit),
        ]
    }
    async fn step(&mut self, _: &ToolCall) -> harness_core::Result<Observation> {
        Ok(Observation::ok("Submitted.").finished())
    }
    async fn verify(&mut self, _: Option<&str>) -> harness_core::Result<Outcome> {
        Ok(Outcome::failure(json!({})))
    }
}

/// Measures rollouts only.
struct NoLearner;

#[async_trait]
impl Learner for NoLearner {
    async fn update(&mut self, _: &[Group]) -> harness_core::Result<UpdateReport> {
        Ok(UpdateReport::default())
    }
    fn save_checkpoint(&self, _: &std::path::Path) -> harness_core::Result<()> {
        Ok(())
    }
    fn load_checkpoint(&mut self, _: &std::path::Path) -> harness_core::Result<()> {
        Ok(())
    }
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (tasks_n, k, new, concurrency) = (
        arg(&args, "--tasks", 8)?,
        arg(&args, "--k", 8)?,
        arg(&args, "--new", 32)?,
        arg(&args, "--concurrency", 64)?,
    );
    let model = PolicyModel::tiny(&TinySpec::default(), DType::F32, &Device::Cpu)?;
    let mut options = PolicyOptions::default();
    if arg(&args, "--prefix-cache", 0)? == 0 {
        // The direct sampler path below prefills every prompt: compare like with like.
        options.prefix_cache = grpo_candle::PrefixCacheConfig::disabled();
    }
    let max_batch = options.max_batch;
    let policy = Arc::new(CandlePolicy::new(model, options));
    let mut h0 = Harness::new("H0", "Call submit.");
    h0.limits.max_model_calls = 1;
    h0.limits.max_output_tokens = new as u32;
    let pool = SiblingPool::starter(h0, [], serde_json::Value::Null)?;
    let tasks: Vec<Task> = (0..tasks_n)
        .map(|i| {
            Task::new(
                format!("b{i}"),
                "one-turn",
                Split::Train,
                format!("Task {i}."),
                i as u64,
            )
        })
        .collect();
    let cfg = RescueConfig {
        updates: 2,
        group_size: k,
        batch_tasks: tasks_n,
        concurrency,
        checkpoint_every: 0,
        final_calibration: false,
        strategy: harness_rollout::Strategy::Grpo,
        ..RescueConfig::default()
    };
    let dir = tempfile::tempdir()?;
    let mut trainer = RescueTrainer::new(
        cfg,
        TrainingSetup {
            policy: policy.clone(),
            environments: vec![Arc::new(OneTurn)],
            pool,
            train_tasks: tasks,
            validation_tasks: Vec::new(),
            learner: Box::new(NoLearner),
            selector: None,
            calibrator: None,
            weight_sync: None,
        },
        dir.path(),
    )?;
    trainer.step().await?; // warm-up
    let record: UpdateRecord = trainer.step().await?;
    let loop_seconds = record.rollout_seconds;
    let all = harness_core::read_jsonl(dir.path().join("trajectories.jsonl"))?;
    let batch = &all[all.len() - tasks_n * k..];
    let loop_tokens: usize = batch.iter().map(|t| t.policy_tokens()).sum();

    // The same generations straight through the sampler, in batches of the policy's size.
    let stop = policy.policy_model().stop_token_ids.clone();
    let requests: Vec<SampleRequest> = batch
        .iter()
        .map(|t| SampleRequest {
            prompt: t.turns[0].context_tokens.clone(),
            max_new_tokens: new,
            params: SamplingParams::default(),
            stop_token_ids: stop.clone(),
            seed: call_seed(t.seed, 0),
            format: OutputFormat::Text,
        })
        .collect();
    let started = Instant::now();
    let mut samples = Vec::new();
    for chunk in requests.chunks(max_batch) {
        samples.extend(generate(policy.model(), policy.tokenizer(), chunk)?);
    }
    let sampler_seconds = started.elapsed().as_secs_f64();
    let sampler_tokens: usize = samples.iter().map(|s| s.tokens.len()).sum();
    let identical = batch
        .iter()
        .zip(&samples)
        .filter(|(t, s)| t.turns[0].tokens == s.tokens)
        .count();
    let episodes = batch.len() as f64;
    println!(
        "{}",
        json!({
            "episodes": batch.len(),
            "max_new_tokens": new,
            "prompt_tokens_mean": requests.iter().map(|r| r.prompt.len()).sum::<usize>() as f64 / episodes,
            "loop": {"seconds": loop_seconds, "episodes_per_s": episodes / loop_seconds,
                     "policy_tokens": loop_tokens, "policy_tokens_per_s": loop_tokens as f64 / loop_seconds},
            "sampler": {"seconds": sampler_seconds, "episodes_per_s": episodes / sampler_seconds,
                        "policy_tokens": sampler_tokens, "policy_tokens_per_s": sampler_tokens as f64 / sampler_seconds},
            "loop_over_sampler_seconds": loop_seconds / sampler_seconds,
            "identical_generations": identical,
        })
    );
    Ok(())
}
