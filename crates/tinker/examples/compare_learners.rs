//! The same rescue-shaped groups through both learners, update after update: grpo-candle's
//! [`CandleLearner`] (every weight, in this process) and [`TinkerLearner`] on SkyRL's Tinker
//! server (a LoRA adapter, JAX on the CPU, in a child process), both minimising the paper's
//! Eq. 15 from the same checkpoint.
//!
//! ```text
//! cargo run --release -p harness-tinker --example compare_learners -- \
//!     --python /path/to/venv/bin/python [--updates 4] [--lr 1e-2] [--hidden 64 --layers 4]
//! ```
//!
//! `--python` (or `HARNESS_TINKER_PYTHON`) names the python of a venv with skyrl-tx 0.3.0 and
//! CPU JAX, as `.ci/run` installs it. Printed, one JSON line per learner and update:
//! - `loss`: the learner's `-J`; on the first update both learners score the same base model
//!   against the same rollouts, so the two values must agree (checked, 1e-5);
//! - `weighted_change`: the advantage-weighted change of each trajectory's mean log-prob since
//!   the start (Eq. 15's `J` to first order, so it should rise), and `up` / `down`: the mean
//!   change of trajectories with positive / negative advantage;
//! - `seconds`: wall time of the update (for the Tinker learner: `forward`, `forward_backward`
//!   and `optim_step` round trips, the server's compilation on the first call included).
//!
//! and a `SUMMARY` line with the median seconds per update after the first and their ratio.
//! The two learners train different parameters (all weights vs a rank-`--lora-rank` adapter),
//! so their log-prob moves are compared in direction, not in size.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, bail};
use candle_core::{DType, Device};
use clap::Parser;
use grpo_candle::train::learner::CandleLearner;
use grpo_candle::train::trainer::TrainerConfig;
use grpo_candle::{CandlePolicy, PolicyModel, PolicyOptions};
use harness_core::{Learner, UpdateReport};
use harness_tinker::{
    Batch, ServerKind, TinkerClient, TinkerConfig, TinkerLearner, TinkerLearnerConfig,
};

#[path = "support/skyrl.rs"]
mod skyrl;

#[derive(Parser)]
struct Args {
    /// Python of a venv with skyrl-tx 0.3.0 and CPU JAX (default: `HARNESS_TINKER_PYTHON`).
    #[arg(long)]
    python: Option<String>,
    /// Updates on the same groups (the second and later are off-policy: Eq. 16's weight and
    /// the clip of Eq. 15 come into play).
    #[arg(long, default_value_t = 4)]
    updates: usize,
    /// Learning rate of both learners (AdamW, no weight decay, no gradient clipping).
    #[arg(long, default_value_t = 1e-2)]
    lr: f64,
    /// Rank of the Tinker learner's LoRA adapter.
    #[arg(long, default_value_t = 4)]
    lora_rank: u32,
    /// Tasks (groups).
    #[arg(long, default_value_t = 4)]
    tasks: usize,
    /// Trajectories per task.
    #[arg(long, default_value_t = 4)]
    per_task: u64,
    /// Hidden size of the checkpoint (heads of 8 dimensions, half as many key/value heads).
    #[arg(long, default_value_t = 32)]
    hidden: usize,
    /// Decoder layers of the checkpoint.
    #[arg(long, default_value_t = 2)]
    layers: usize,
    /// An existing checkpoint folder (Qwen3, `rope_theta` at the top of `config.json`) to
    /// compare on instead of a tiny random one: e.g. the embedded default's warm start in
    /// runs/cache/. --hidden and --layers are then ignored.
    #[arg(long)]
    model: Option<std::path::PathBuf>,
}

const INSTRUCTIONS: [&str; 8] = [
    "count the users",
    "name the largest table",
    "list the orders of March",
    "find the oldest customer",
    "sum the refunds",
    "rename the column city",
    "delete the empty rows",
    "show the top three products",
];

/// Per trajectory (one sequence per policy turn), the advantage-weighted change of mean
/// log-prob, and the mean change of positive- and negative-advantage trajectories.
fn moves(batch: &Batch, before: &[f64], after: &[f64]) -> (f64, f64, f64) {
    let b = skyrl::per_trajectory_means(batch, before);
    let a = skyrl::per_trajectory_means(batch, after);
    let (mut weighted, mut up, mut down) = (0.0, Vec::new(), Vec::new());
    for ((adv, x), (_, y)) in b.iter().zip(&a) {
        weighted += adv * (y - x);
        if *adv > 0.0 {
            up.push(y - x);
        } else if *adv < 0.0 {
            down.push(y - x);
        }
    }
    let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
    (weighted, mean(&up), mean(&down))
}

fn line(learner: &str, update: usize, seconds: f64, r: &UpdateReport, m: (f64, f64, f64)) {
    let mut v = serde_json::json!({
        "learner": learner,
        "update": update,
        "seconds": seconds,
        "loss": r.loss,
        "grad_norm": r.grad_norm,
        "policy_tokens": r.policy_tokens,
        "clip_frac_low": r.clip_frac_low,
        "clip_frac_high": r.clip_frac_high,
        "weight_mean": r.weight_mean,
        "weighted_change": m.0,
        "up": m.1,
        "down": m.2,
    });
    if let Some(s) = r.extra.get("server_surrogate") {
        v["server_surrogate"] = (*s).into();
    }
    println!("{v}");
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    if v.is_empty() {
        return f64::NAN;
    }
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let python = args
        .python
        .clone()
        .or_else(|| std::env::var(skyrl::VAR).ok())
        .filter(|p| !p.is_empty())
        .with_context(|| {
            format!(
                "give --python or set {}: the python of a venv with skyrl-tx 0.3.0 and CPU JAX",
                skyrl::VAR
            )
        })?;
    if args.hidden % 16 != 0 || args.tasks == 0 || args.tasks > INSTRUCTIONS.len() {
        bail!(
            "--hidden must be a multiple of 16 and --tasks between 1 and {}",
            INSTRUCTIONS.len()
        );
    }
    let work = tempfile::tempdir()?;
    let model_dir = match &args.model {
        Some(dir) => {
            std::fs::canonicalize(dir).with_context(|| format!("--model {}", dir.display()))?
        }
        None => {
            let dir = work.path().join("checkpoint");
            let mut spec = skyrl::tiny_spec();
            spec.hidden_size = args.hidden;
            spec.num_layers = args.layers;
            spec.num_heads = args.hidden / 8;
            spec.num_kv_heads = args.hidden / 16;
            spec.intermediate_size = 2 * args.hidden;
            skyrl::write_checkpoint(&dir, &spec);
            dir
        }
    };
    let load = || -> anyhow::Result<Arc<CandlePolicy>> {
        Ok(Arc::new(CandlePolicy::new(
            PolicyModel::load_dir(&model_dir, DType::F32, &Device::Cpu)?,
            PolicyOptions::default(),
        )))
    };

    // Groups sampled once from the checkpoint; turns of 4, 6 or 8 tokens, so trajectories
    // differ in length and the on-policy value of Eq. 15 is not trivially zero.
    let sampler = load()?;
    let groups = std::thread::scope(|s| {
        s.spawn(|| {
            skyrl::groups(&sampler, &INSTRUCTIONS[..args.tasks], args.per_task, &|j| {
                4 + 2 * (j as usize % 3)
            })
        })
        .join()
        .expect("sampling thread")
    });

    let (mut server, url) = skyrl::start_server(&python, &model_dir, work.path());
    skyrl::wait_healthy(&url, &mut server).await;
    let mut tcfg = TinkerConfig::new(&url);
    tcfg.future_timeout = std::time::Duration::from_secs(600);
    let mut cfg = TinkerLearnerConfig::new(model_dir.display().to_string(), ServerKind::SkyrlTx);
    cfg.lora.rank = args.lora_rank;
    cfg.adam.learning_rate = args.lr;
    cfg.adam.weight_decay = 0.0;
    let mut tinker = TinkerLearner::connect(TinkerClient::new(tcfg)?, cfg.clone()).await?;

    let trained = load()?;
    let mut tc = TrainerConfig::default();
    tc.grpo.clip_low = cfg.grpo.clip_low;
    tc.grpo.clip_high = cfg.grpo.clip_high;
    tc.grpo.weight_cap = cfg.grpo.weight_cap;
    tc.schedule.lr = args.lr;
    tc.schedule.total_steps = args.updates as u64;
    tc.adamw.weight_decay = 0.0;
    tc.max_grad_norm = None;
    let mut candle = CandleLearner::new(trained.clone(), tc)?;

    let (batch, server_start) = tinker.score(&groups).await?;
    let candle_start = skyrl::candle_logprobs(trained.model(), &batch);
    let agree = server_start
        .iter()
        .zip(&candle_start)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0, f64::max);
    eprintln!(
        "{} groups, {} sequences, {} policy tokens; before any update max |server - candle| log-prob = {agree:.2e}",
        groups.len(),
        batch.sequences.len(),
        batch.tokens()
    );

    let (mut secs_t, mut secs_c) = (Vec::new(), Vec::new());
    let mut first_losses = None;
    for u in 1..=args.updates {
        let t0 = Instant::now();
        let rt = tinker.update(&groups).await?;
        let st = t0.elapsed().as_secs_f64();
        let (_, server_now) = tinker.score(&groups).await?;
        line(
            "tinker-skyrl",
            u,
            st,
            &rt,
            moves(&batch, &server_start, &server_now),
        );

        let t0 = Instant::now();
        let rc = candle.update(&groups).await?;
        let sc = t0.elapsed().as_secs_f64();
        let candle_now = skyrl::candle_logprobs(trained.model(), &batch);
        line(
            "grpo-candle",
            u,
            sc,
            &rc,
            moves(&batch, &candle_start, &candle_now),
        );
        if u == 1 {
            first_losses = Some((rt.loss, rc.loss));
        } else {
            secs_t.push(st);
            secs_c.push(sc);
        }
    }
    drop(server);

    if let Some((lt, lc)) = first_losses {
        let d = (lt - lc).abs();
        println!(
            "SUMMARY first update loss: tinker {lt:.6}, grpo-candle {lc:.6}, |diff| {d:.2e}; \
             median seconds per later update: tinker {:.3}, grpo-candle {:.3} (tinker/candle {:.1}x)",
            median(secs_t.clone()),
            median(secs_c.clone()),
            median(secs_t) / median(secs_c)
        );
        if d > 1e-5 * (1.0 + lc.abs()) {
            bail!(
                "the two learners' first-update losses differ by {d}: the objective is not the same"
            );
        }
    }
    Ok(())
}
