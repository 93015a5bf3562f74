//! Rescue training (paper Algorithm 1) with the real Adaptive Harness Router: a built-in
//! environment's starter pool (or a saved pool, e.g. one written by harness-evolve's
//! `evolve_builtin` example), the tiny local candle policy trained by grpo-candle's
//! `CandleLearner`, harness-router's `Calibrator` re-anchoring the profiles every
//! `calibrate_every` updates and with the final policy (Eq. 11), and its `AdaptiveRouter`
//! choosing the rescue siblings (Eqs. 9-10). Profiler and voters are the built-in ones, or,
//! with `--llm`, an LLM profiler and LLM voters on any OpenAI-compatible endpoint.
//!
//! ```text
//! cargo run --release --example rescue_router -- \
//!     --config crates/rollout/examples/configs/router_2x2.json --run-dir runs/rescue-router
//! cargo run --release --example rescue_router -- \
//!     --config crates/rollout/examples/configs/router_2x2.json --run-dir runs/rescue-router-llm \
//!     --llm https://api.openai.com/v1 --llm-model gpt-4o-mini   # key from $OPENAI_API_KEY
//! ```
//!
//! The run directory gets the rollout run files (`metrics.jsonl`, `groups.jsonl`,
//! `trajectories.jsonl`, `cost.json`, `checkpoints/`) and the router's `calibrations/`; `--resume`
//! continues a killed run from its latest checkpoint, calibrator state included.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, bail};
use candle_core::{DType, Device};
use clap::Parser;
use grpo_candle::train::learner::CandleLearner;
use grpo_candle::train::trainer::TrainerConfig;
use grpo_candle::{CandlePolicy, PolicyModel, PolicyOptions, TinySpec};
use harness_core::{ChatModel, Environment, Harness, Policy, Split};
use harness_envs::{appworld, dbbench, swe};
use harness_openai::{ChatClient, ChatClientConfig};
use harness_pipeline::keys;
use harness_pool::SiblingPool;
use harness_rollout::{METRICS_FILE, RescueConfig, TrainingSetup, run_training};
use harness_router::{
    AdaptiveRouter, BuiltinProfiler, BuiltinVoter, Calibrator, CalibratorSettings, EvidenceCell,
    LlmProfiler, LlmProfilerSettings, LlmVoter, LlmVoterSettings, Profiler, RouterSettings,
    TokenCounter, Voter,
};
use serde_json::Value;

// The default allocator spends much of a CPU training step in page faults; mimalloc reuses
// the large tensor buffers.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
struct Args {
    /// The run's `RescueConfig` as JSON (see crates/rollout/README.md for the strategies).
    #[arg(long)]
    config: PathBuf,
    /// Where the run files, checkpoints and calibrations go.
    #[arg(long)]
    run_dir: PathBuf,
    /// Continue the run in `run_dir` from its latest checkpoint.
    #[arg(long)]
    resume: bool,
    /// Overrides the config's seed (the one seed of the run; the voters' seeds derive from it).
    #[arg(long)]
    seed: Option<u64>,
    /// The built-in environment: appworld, dbbench or swe.
    #[arg(long, default_value = "appworld")]
    env: String,
    /// A saved pool directory (of `--env`'s harnesses), used as saved, instead of the
    /// environment's starter pool.
    #[arg(long)]
    pool: Option<PathBuf>,
    /// Voters on the router's panel.
    #[arg(long, default_value_t = 4)]
    voters: usize,
    /// An OpenAI-compatible base URL (ending in `/v1`) for an LLM profiler and LLM voters.
    #[arg(long, requires = "llm_model")]
    llm: Option<String>,
    /// The model asked at `--llm`.
    #[arg(long, requires = "llm")]
    llm_model: Option<String>,
    /// The environment variable holding the `--llm` API key (unset: no auth header); its
    /// name must end in `_API_KEY`.
    #[arg(long, default_value = "OPENAI_API_KEY")]
    llm_key_env: String,
    /// Send that key over plain http:// to a host other than this machine (unsafe: it goes
    /// unencrypted); without it the key goes only over https or to a loopback host.
    #[arg(long)]
    allow_insecure_http: bool,
    /// Training tasks used (the first of the split).
    #[arg(long, default_value_t = 16)]
    tasks: usize,
    /// Validation tasks the calibrator runs every member on (the first of the split).
    #[arg(long, default_value_t = 4)]
    validation_tasks: usize,
    /// Model calls per episode in the starter pool: the tiny untrained model rambles, so the
    /// demo caps episodes well below the paper's 32.
    #[arg(long, default_value_t = 3)]
    max_calls: u32,
    /// Output tokens per call in the starter pool.
    #[arg(long, default_value_t = 24)]
    max_output: u32,
}

fn environment(name: &str) -> anyhow::Result<Arc<dyn Environment>> {
    Ok(match name {
        appworld::ENV_NAME => Arc::new(appworld::AppWorld::new()),
        dbbench::ENV_NAME => Arc::new(dbbench::DbBench::new()),
        swe::ENV_NAME => Arc::new(swe::SweEnv::builtin()),
        other => bail!(
            "--env {other}: expected one of {:?}",
            harness_envs::STARTER_ENVIRONMENTS
        ),
    })
}

/// The environment's starter pool with the demo's limits: every member capped, the siblings
/// re-parented on the capped H0 (capping changes the ids).
fn capped_starter(args: &Args) -> anyhow::Result<SiblingPool> {
    let pool = harness_envs::starter_pool(&args.env)?;
    let cap = |mut h: Harness| {
        h.limits.max_model_calls = args.max_calls;
        h.limits.max_output_tokens = args.max_output;
        h.lineage.parent = None;
        h
    };
    let mut settings = pool.settings().clone();
    settings["max_calls"] = args.max_calls.into();
    settings["max_output"] = args.max_output.into();
    Ok(SiblingPool::starter(
        cap(pool.base().clone()),
        pool.auxiliaries().cloned().map(cap),
        settings,
    )?)
}

/// The router's LLM-capable roles.
struct Roles {
    profiler: Arc<dyn Profiler>,
    voters: Vec<Arc<dyn Voter>>,
}

/// The profiler and voters: built-in, or LLM ones on one OpenAI-compatible endpoint (the voters
/// differ by seed, and so by the order they see the candidates in).
fn roles(args: &Args, seed: u64, tokens: &TokenCounter) -> anyhow::Result<Roles> {
    let (Some(url), Some(model)) = (&args.llm, &args.llm_model) else {
        let profiler = BuiltinProfiler::new(harness_envs::labels::builtin_labellers());
        let voters = BuiltinVoter::panel(args.voters, seed)
            .into_iter()
            .map(|v| Arc::new(v) as Arc<dyn Voter>)
            .collect();
        return Ok(Roles {
            profiler: Arc::new(profiler),
            voters,
        });
    };
    let mut config = ChatClientConfig::new(url, model);
    let endpoint = keys::Endpoint::parse(url).map_err(|e| anyhow::anyhow!("--llm: {e}"))?;
    keys::check_key_env(&args.llm_key_env).map_err(|e| anyhow::anyhow!("--llm-key-env: {e}"))?;
    if let Ok(key) = std::env::var(&args.llm_key_env) {
        endpoint
            .check_key_transport(args.allow_insecure_http)
            .map_err(|e| anyhow::anyhow!("--llm: {e}"))?;
        config.endpoint = config.endpoint.with_api_key(key);
    }
    let chat: Arc<dyn ChatModel> = Arc::new(ChatClient::new(config)?);
    let profiler = LlmProfiler::new(
        chat.clone(),
        LlmProfilerSettings {
            seed,
            ..LlmProfilerSettings::default()
        },
        tokens.clone(),
    );
    let voters = (0..args.voters)
        .map(|v| {
            Arc::new(LlmVoter::new(
                format!("llm-{v}"),
                chat.clone(),
                harness_core::call_seed(seed, v as u32),
                LlmVoterSettings::default(),
                tokens.clone(),
            )) as Arc<dyn Voter>
        })
        .collect();
    Ok(Roles {
        profiler: Arc::new(profiler),
        voters,
    })
}

/// Per update: eg_rate, rescue_trigger_rate, rescue_success; then the calibrations.
fn summary(run_dir: &Path) -> anyhow::Result<String> {
    let path = run_dir.join(METRICS_FILE);
    let text = std::fs::read_to_string(&path).with_context(|| path.display().to_string())?;
    let lines: Vec<Value> = text
        .lines()
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .with_context(|| path.display().to_string())?;
    let rate = |v: &Value| v.as_f64().map_or("-".to_string(), |x| format!("{x:.3}"));
    let mut out = String::from("update  eg_rate  rescue_trigger_rate  rescue_success\n");
    for m in lines.iter().filter(|m| m["kind"] == "update") {
        out.push_str(&format!(
            "{:>6}  {:>7}  {:>19}  {:>14}\n",
            m["update"].as_u64().unwrap_or_default(),
            rate(&m["eg_rate"]),
            rate(&m["rescue_trigger_rate"]),
            rate(&m["rescue_success"]),
        ));
    }
    let calibrations = lines.iter().filter(|m| m["kind"] == "calibration").count();
    out.push_str(&format!(
        "calibrations: {calibrations} in {}",
        run_dir.join("calibrations").display()
    ));
    Ok(out)
}

#[tokio::main(flavor = "multi_thread")]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    let mut cfg = RescueConfig::load(&args.config)?;
    if let Some(seed) = args.seed {
        cfg.seed = seed;
    }
    let pool = match &args.pool {
        Some(dir) => SiblingPool::load(dir)?,
        None => capped_starter(&args)?,
    };
    println!("{}", pool.render_lineage());

    let env = environment(&args.env)?;
    let train: Vec<_> = env
        .tasks(Split::Train)?
        .into_iter()
        .take(args.tasks)
        .collect();
    let validation: Vec<_> = env
        .tasks(Split::Validation)?
        .into_iter()
        .take(args.validation_tasks)
        .collect();
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

    let tokens = TokenCounter::new();
    let Roles { profiler, voters } = roles(&args, cfg.seed, &tokens)?;
    let evidence = EvidenceCell::new();
    let calibrator = Calibrator::new(
        Arc::new(pool.clone()),
        policy.clone() as Arc<dyn Policy>,
        [(env.name().to_string(), env.clone())].into(),
        validation.clone(),
        profiler,
        evidence.clone(),
        CalibratorSettings {
            dir: Some(args.run_dir.join("calibrations")),
            ..CalibratorSettings::default()
        },
    )?;
    let router = Arc::new(AdaptiveRouter::new(
        evidence,
        voters,
        RouterSettings::default(),
    )?);
    let setup = TrainingSetup {
        policy: policy.clone(),
        environments: vec![env],
        selector: Some(router.clone()),
        pool,
        train_tasks: train,
        validation_tasks: validation,
        learner: Box::new(CandleLearner::new(policy, trainer_cfg)?),
        calibrator: Some(Arc::new(calibrator)),
        weight_sync: None,
    };
    let cost = run_training(cfg, setup, &args.run_dir, args.resume)
        .await
        .with_context(|| format!("training in {}", args.run_dir.display()))?;
    println!("{}", serde_json::to_string_pretty(&cost)?);
    let stats = router.stats();
    println!(
        "router: {} selections, {} ballots, {} dropped, {} filled; LLM tokens by role: {}",
        stats.selections,
        stats.ballots,
        stats.dropped,
        stats.filled_ids,
        serde_json::to_string(&tokens.snapshot())?
    );
    println!("{}", summary(&args.run_dir)?);
    Ok(())
}
