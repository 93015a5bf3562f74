//! Rescue training from one config file: the built-in AppWorld-style environment with its
//! starter pool (H0 and the Table 7 siblings), a tiny local candle policy trained by
//! grpo-candle's `CandleLearner`, and the seeded random selector standing in for the router
//! (the root package wires harness-router's Adaptive Harness Router and its calibrator; this
//! crate may not depend on it).
//!
//! ```text
//! cargo run -p harness-rollout --example rescue_train -- \
//!     --config crates/rollout/examples/configs/router_2x2.json --run-dir runs/router [--resume]
//! ```
//! Kill it at any time and run the same command with `--resume`: it continues from the latest
//! complete checkpoint and writes the same files as a run that never stopped.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use candle_core::{DType, Device};
use clap::Parser;
use grpo_candle::train::learner::CandleLearner;
use grpo_candle::train::trainer::TrainerConfig;
use grpo_candle::{CandlePolicy, PolicyModel, PolicyOptions, TinySpec};
use harness_core::{Environment, Harness, Split};
use harness_envs::appworld::{self, AppWorld};
use harness_pool::SiblingPool;
use harness_rollout::{RandomSelector, RescueConfig, TrainingSetup, run_training};

#[derive(Parser)]
struct Args {
    /// The run's `RescueConfig` as JSON.
    #[arg(long)]
    config: PathBuf,
    /// Where the run files and checkpoints go.
    #[arg(long)]
    run_dir: PathBuf,
    /// Continue the run in `run_dir` from its latest checkpoint.
    #[arg(long)]
    resume: bool,
    /// A saved pool directory instead of the starter pool.
    #[arg(long)]
    pool: Option<PathBuf>,
    /// Training tasks used (the first of the split).
    #[arg(long, default_value_t = 16)]
    tasks: usize,
    /// Model calls per episode: the tiny untrained model rambles, so the demo caps episodes
    /// well below the paper's 32.
    #[arg(long, default_value_t = 3)]
    max_calls: u32,
    /// Output tokens per call.
    #[arg(long, default_value_t = 24)]
    max_output: u32,
}

fn capped(mut h: Harness, args: &Args) -> Harness {
    h.limits.max_model_calls = args.max_calls;
    h.limits.max_output_tokens = args.max_output;
    h
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let cfg = RescueConfig::load(&args.config)?;
    let pool = match &args.pool {
        Some(dir) => SiblingPool::load(dir)?,
        None => SiblingPool::starter(
            capped(appworld::base_harness(), &args),
            appworld::siblings().into_iter().map(|h| capped(h, &args)),
            serde_json::json!({"starter": "appworld", "max_calls": args.max_calls, "max_output": args.max_output}),
        )?,
    };
    println!("{}", pool.render_lineage());
    let env = AppWorld::new();
    let train: Vec<_> = env
        .tasks(Split::Train)?
        .into_iter()
        .take(args.tasks)
        .collect();
    let validation: Vec<_> = env.tasks(Split::Validation)?.into_iter().take(4).collect();
    let model = PolicyModel::tiny(
        &TinySpec {
            seed: cfg.seed,
            ..TinySpec::default()
        },
        DType::F32,
        &Device::Cpu,
    )?;
    let policy = Arc::new(CandlePolicy::new(model, PolicyOptions::default()));
    let trainer_cfg = TrainerConfig {
        seed: cfg.seed,
        // Eq. 16's weight needs pi_old at the rollout temperature.
        temperature: f64::from(cfg.sampling.temperature),
        ..TrainerConfig::default()
    };
    let setup = TrainingSetup {
        policy: policy.clone(),
        environments: vec![Arc::new(env)],
        selector: Some(Arc::new(RandomSelector::new(&pool))),
        pool,
        train_tasks: train,
        validation_tasks: validation,
        learner: Box::new(CandleLearner::new(policy, trainer_cfg)?),
        calibrator: None,
        weight_sync: None,
    };
    let cost = run_training(cfg, setup, &args.run_dir, args.resume)
        .await
        .with_context(|| format!("training in {}", args.run_dir.display()))?;
    println!("{}", serde_json::to_string_pretty(&cost)?);
    Ok(())
}
