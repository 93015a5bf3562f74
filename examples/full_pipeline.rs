//! The main job of harness-s: the whole Harness-S loop in one run, on the embedded default
//! unless a configuration says otherwise.
//!
//! ```sh
//! cargo run --release --example full_pipeline                         # embedded default, one seed
//! cargo run --release --example full_pipeline -- --seeds 3            # Table 1's mean and std
//! cargo run --release --example full_pipeline -- --config configs/compare.toml  # every setting from a file
//! cargo run --release --example full_pipeline -- --preset paper --config real.toml
//! ```
//!
//! 1. Directional Harness Evolution from H0 into a frozen Sibling Harness Pool (Eqs. 2-4);
//! 2. the router's first calibration (profiles and validation statistics);
//! 3. from the same checkpoint and seed: plain GRPO, GRPO with H0 rescue, Top-K router rescue
//!    with fixed profiles, and Harness-S (Top-K with re-anchored profiles), each for the same
//!    number of updates;
//! 4. the final re-anchoring and the test evaluation of every trained policy under H0, and of
//!    the Harness-S policy under the router's Rank-1;
//! 5. `report.md`, `report.html` and `plots/` with the paper's Tables 1, 2, 5 and 9 and
//!    Figure 3's panels, made from the run's files.
//!
//! This example is the thin wiring of harness-pipeline's stages; the `harness-s` binary runs
//! the same stages one at a time (`harness-s evolve`, `calibrate`, `train`, `eval`, `report`).

use std::path::PathBuf;

use anyhow::Result;
use clap::Parser;
use harness_pipeline::{Preset, Progress, RunConfig, Secrets, run_main_job};

#[path = "../src/threads.rs"]
mod threads;

// The default allocator spends much of a CPU training step in page faults; mimalloc reuses
// the large tensor buffers.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser, Debug)]
#[command(about = "Run the whole Harness-S loop (see `harness-s run --help` for every setting)")]
struct Args {
    /// A run configuration (TOML or JSON); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// quick (the embedded default) or paper.
    #[arg(long)]
    preset: Option<String>,
    /// The run's seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Seeds run one after another; the report gives mean and standard deviation.
    #[arg(long)]
    seeds: Option<usize>,
    /// The run directory.
    #[arg(long)]
    out: Option<PathBuf>,
    /// No progress bars.
    #[arg(long)]
    quiet: bool,
}

fn main() -> Result<()> {
    let args = Args::parse();
    let preset = args
        .preset
        .as_deref()
        .map(str::parse::<Preset>)
        .transpose()
        .map_err(|e| anyhow::anyhow!("--preset: {e}"))?;
    let mut cfg = RunConfig::load_with_preset(args.config.as_deref(), preset)?;
    if let Some(seed) = args.seed {
        cfg.seed = seed;
    }
    if let Some(seeds) = args.seeds {
        cfg.seeds = seeds;
    }
    if let Some(out) = args.out {
        cfg.out = out;
    }
    cfg.validate(args.config.as_deref())?;
    // `policy.threads` (one thread for the embedded policy) unless RAYON_NUM_THREADS is set.
    threads::set_unless_given(|| cfg.policy.cpu_threads());
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?
        .block_on(run(cfg, args.quiet))
}

async fn run(cfg: RunConfig, quiet: bool) -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let progress = if quiet {
        Progress::hidden()
    } else {
        Progress::bars()
    };
    // The embedded default asks no endpoint; with `roles.llm` set, the key comes from the
    // environment variable the configuration names.
    let secrets = Secrets {
        llm_api_key: cfg
            .roles
            .llm
            .as_ref()
            .and_then(|_| std::env::var(&cfg.roles.llm_key_env).ok()),
        engine_api_key: std::env::var("HARNESS_S_ENGINE_API_KEY").ok(),
        tinker_api_key: match cfg.learner {
            harness_pipeline::config::LearnerKind::Tinker => {
                std::env::var(&cfg.tinker.api_key_env).ok()
            }
            harness_pipeline::config::LearnerKind::Candle => None,
        },
    };
    let summary = run_main_job(&cfg, &secrets, &progress).await?;
    println!("{}", summary.tables);
    println!(
        "main job done in {:.0}s; report: {}",
        summary.seconds,
        cfg.out.join("report.html").display()
    );
    Ok(())
}
