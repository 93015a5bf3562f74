//! Rescue training (paper Algorithm 1) with the policy update on a Tinker server: rollouts on an
//! OpenAI-compatible engine (vLLM or SGLang) serving the policy, the update by
//! [`harness_tinker::TinkerLearner`] with the paper's Eq. 15, and after every update the
//! weights saved for the sampler (`save_weights_for_sampler`) and their version recorded. A
//! failed save stops the run.
//!
//! ```text
//! cargo run -p harness-tinker --example tinker_train -- \
//!     --tinker-url http://127.0.0.1:8000 --server skyrl-tx --base-model Qwen/Qwen3-4B \
//!     --tokenizer-dir /models/Qwen3-4B --engine-url http://127.0.0.1:8001 --engine vllm \
//!     --served-model policy --config crates/rollout/examples/configs/router_2x2.json \
//!     --run-dir runs/tinker [--resume]
//! ```
//!
//! With SkyRL's server started with `--external-inference-url` pointing at the vLLM engine (or
//! its SkyRL-train backend, which owns its vLLM engines), `save_weights_for_sampler` is what
//! puts each new adapter into the engine. Hosted Tinker reads its key from `TINKER_API_KEY`.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use candle_core::{DType, Device};
use clap::{Parser, ValueEnum};
use grpo_candle::PolicyModel;
use harness_core::{Environment, Harness, Split};
use harness_envs::appworld::{self, AppWorld};
use harness_openai::candle::CandleEncoder;
use harness_openai::{EngineKind, RemotePolicy, RemotePolicyConfig};
use harness_pool::SiblingPool;
use harness_rollout::{RandomSelector, RescueConfig, TrainingSetup, run_training};
use harness_tinker::{
    ObjectiveMode, ServerKind, SyncTarget, TinkerClient, TinkerConfig, TinkerLearner,
    TinkerLearnerConfig, TinkerWeightSync,
};

#[derive(Clone, Copy, ValueEnum)]
enum Server {
    /// SkyRL's self-hosted Tinker server (skyrl-tx).
    SkyrlTx,
    /// Hosted Tinker.
    Tinker,
}

#[derive(Clone, Copy, ValueEnum)]
enum Engine {
    Vllm,
    Sglang,
}

#[derive(Parser)]
struct Args {
    /// The Tinker server's root URL.
    #[arg(long)]
    tinker_url: String,
    /// Which server it is (decides how Eq. 15's gradient is encoded).
    #[arg(long, value_enum, default_value = "skyrl-tx")]
    server: Server,
    /// The base model, as the server lists it.
    #[arg(long)]
    base_model: String,
    /// A folder with the base model's tokenizer and config (prompts are tokenized locally).
    #[arg(long)]
    tokenizer_dir: PathBuf,
    /// The rollout engine's root URL.
    #[arg(long)]
    engine_url: String,
    /// The rollout engine's API.
    #[arg(long, value_enum, default_value = "vllm")]
    engine: Engine,
    /// The model name the engine serves the trained adapter under.
    #[arg(long)]
    served_model: String,
    /// The run's `RescueConfig` as JSON.
    #[arg(long)]
    config: PathBuf,
    /// Where the run files and checkpoints go.
    #[arg(long)]
    run_dir: PathBuf,
    /// Continue the run in `run_dir` from its latest checkpoint.
    #[arg(long)]
    resume: bool,
    /// LoRA rank.
    #[arg(long, default_value_t = 32)]
    lora_rank: u32,
    /// Adam's learning rate.
    #[arg(long, default_value_t = 1e-5)]
    lr: f64,
    /// Use the server's `ppo` loss with thresholds 0.80 / 1.28 (hosted Tinker only; ratio
    /// against the rollout log-probs, no Eq. 16 weight) instead of the exact Eq. 15.
    #[arg(long)]
    server_ppo: bool,
    /// Training tasks used (the first of the split).
    #[arg(long, default_value_t = 16)]
    tasks: usize,
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let cfg = RescueConfig::load(&args.config)?;
    let pool = SiblingPool::starter(
        appworld::base_harness(),
        appworld::siblings().into_iter().map(|h: Harness| h),
        serde_json::json!({"starter": "appworld"}),
    )?;
    let env = AppWorld::new();
    let train: Vec<_> = env
        .tasks(Split::Train)?
        .into_iter()
        .take(args.tasks)
        .collect();
    let validation: Vec<_> = env.tasks(Split::Validation)?.into_iter().take(4).collect();

    let encoder = CandleEncoder::new(
        PolicyModel::load_dir(&args.tokenizer_dir, DType::F32, &Device::Cpu)
            .with_context(|| format!("loading {}", args.tokenizer_dir.display()))?,
    );
    let engine = match args.engine {
        Engine::Vllm => EngineKind::Vllm,
        Engine::Sglang => EngineKind::Sglang,
    };
    let policy = Arc::new(RemotePolicy::new(
        RemotePolicyConfig::new(&args.engine_url, &args.served_model, engine),
        Arc::new(encoder),
    )?);

    let mut tinker = TinkerConfig::new(&args.tinker_url);
    tinker.api_key = std::env::var("TINKER_API_KEY")
        .ok()
        .filter(|k| !k.is_empty());
    let client = TinkerClient::new(tinker)?;
    let server = match args.server {
        Server::SkyrlTx => ServerKind::SkyrlTx,
        Server::Tinker => ServerKind::Tinker,
    };
    let mut lcfg = TinkerLearnerConfig::new(&args.base_model, server);
    lcfg.lora.rank = args.lora_rank;
    lcfg.adam.learning_rate = args.lr;
    if args.server_ppo {
        lcfg.objective = ObjectiveMode::ServerPpo;
    }
    let learner = TinkerLearner::connect(client, lcfg).await?;
    let sync = Arc::new(TinkerWeightSync::new(
        learner.model().clone(),
        SyncTarget::Sampler,
        "rollout",
    ));

    let setup = TrainingSetup {
        policy,
        environments: vec![Arc::new(env)],
        selector: Some(Arc::new(RandomSelector::new(&pool))),
        pool,
        train_tasks: train,
        validation_tasks: validation,
        learner: Box::new(learner),
        calibrator: None,
        weight_sync: Some(sync.clone()),
    };
    let cost = run_training(cfg, setup, &args.run_dir, args.resume)
        .await
        .with_context(|| format!("training in {}", args.run_dir.display()))?;
    for w in sync.history() {
        println!("weights version {}: {}", w.version, w.path);
    }
    println!("{}", serde_json::to_string_pretty(&cost)?);
    Ok(())
}
