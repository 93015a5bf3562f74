//! The `harness-s` command line's flags and how they resolve into a run configuration: a
//! module of the binary (`src/main.rs`), also read by the test of the documented commands.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Parser, Subcommand};
use harness_pipeline::config::{LearnerKind, RolloutEngine, SETTINGS_HELP};
use harness_pipeline::{Method, Preset, Progress, RunConfig, Secrets};

#[derive(Parser)]
#[command(
    name = "harness-s",
    version,
    about = "Agent RL with sibling harnesses: evolve a pool, calibrate the router, rescue-train, evaluate, report",
    after_long_help = SETTINGS_HELP
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand)]
pub enum Command {
    /// The whole loop: evolve, calibrate, train every method, evaluate, report.
    #[command(after_long_help = SETTINGS_HELP)]
    Run {
        #[command(flatten)]
        common: Common,
        /// Print every setting that is not the paper's, or that the paper does not give, with
        /// the reason, and exit (with --preset paper: what still differs from the paper).
        #[arg(long)]
        explain: bool,
    },
    /// Directional Harness Evolution from H0 into <out>/evolve/pool (Eqs. 2-4).
    #[command(after_long_help = SETTINGS_HELP)]
    Evolve(Common),
    /// The router's first calibration with the initial policy, into <out>/calibration.
    #[command(after_long_help = SETTINGS_HELP)]
    Calibrate(Common),
    /// Rescue-train one method (or every configured one) into <out>/train/<method>.
    #[command(after_long_help = SETTINGS_HELP)]
    Train {
        #[command(flatten)]
        common: Common,
        /// The method (default: every method of train.methods).
        #[arg(long)]
        method: Option<String>,
        /// Continue a killed run from its latest checkpoint.
        #[arg(long)]
        resume: bool,
    },
    /// Test evaluation of a trained method (or `initial`) under H0, and Rank-1 for harness_s.
    #[command(after_long_help = SETTINGS_HELP)]
    Eval {
        #[command(flatten)]
        common: Common,
        /// The method, or `initial` (default: the initial policy and every configured method).
        #[arg(long)]
        method: Option<String>,
    },
    /// The main job over a grid of organism variants x rescue objectives x seeds, from a sweep
    /// file: each cell-seed its own run folder under the sweep's `out`, finished ones skipped,
    /// then one report (sweep.md, sweep.json, sweep_h0_vs_grpo.svg).
    Sweep {
        /// The sweep file (TOML; see `configs/sweep-rescue.toml`).
        file: PathBuf,
        /// Write the report from the finished cell-seeds without running any.
        #[arg(long)]
        report_only: bool,
        /// The sweep's root instead of the file's `out` (where cells are run, skipped and
        /// read; e.g. a folder written by --export).
        #[arg(long, value_name = "DIR")]
        out: Option<PathBuf>,
        /// Copy the finished cell-seeds' report inputs, gzip-compressed, to DIR (the same
        /// layout, about 100 kB per cell-seed) without running any; `--report-only --out DIR`
        /// then writes the same report from the copy.
        #[arg(long, value_name = "DIR", conflicts_with = "report_only")]
        export: Option<PathBuf>,
        /// Cell-seeds run at once, each in a child process of this program with
        /// `RAYON_NUM_THREADS` = cores / N, or the cells' `policy.threads` where fewer, unless
        /// set (default 1: one after another, in this process). Results do not depend on it.
        #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..), conflicts_with_all = ["report_only", "export", "cell"])]
        jobs: u16,
        /// Run only the cell-seed at this position of the grid (1 to the number of
        /// cell-seeds, as `sweep i/N` prints it), and write no report: what each `--jobs`
        /// child runs.
        #[arg(long, value_name = "I", value_parser = clap::value_parser!(u32).range(1..), conflicts_with_all = ["report_only", "export"])]
        cell: Option<u32>,
        /// No progress bars.
        #[arg(long)]
        quiet: bool,
    },
    /// Write report.md, report.html and plots/ from the run's files.
    #[command(after_long_help = SETTINGS_HELP)]
    Report(Common),
    /// Serve a checkpoint over the OpenAI- and SGLang-compatible API.
    #[command(after_long_help = SETTINGS_HELP)]
    Serve {
        #[command(flatten)]
        common: Common,
        /// The trained method to serve, or `initial` (default).
        #[arg(long)]
        method: Option<String>,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        host: IpAddr,
        /// Port (0 picks a free one).
        #[arg(long, default_value_t = 8000)]
        port: u16,
        /// The environment variable (a name ending in _API_KEY) holding the bearer key every
        /// route then asks for.
        #[arg(long, value_name = "NAME", conflicts_with = "api_key")]
        api_key_env: Option<String>,
        /// The bearer key itself (visible to other users in the process list: prefer
        /// --api-key-env).
        #[arg(long, value_name = "KEY")]
        api_key: Option<String>,
        /// The folder under which /update_weights_from_disk may load checkpoints (default:
        /// none, only the served checkpoint is reloaded).
        #[arg(long, value_name = "DIR")]
        reload_root: Option<PathBuf>,
    },
    /// Serve an environment over HTTP for agent programs in any language: list tasks, start
    /// sessions, step with tool calls, finish and verify on the server (protocol
    /// `harness-s-env/1`, documented in docs/GUIDE.md, "Your own harness").
    EnvServe(EnvServeArgs),
}

/// The `env-serve` command's flags.
#[derive(Args, Clone)]
pub struct EnvServeArgs {
    /// The environment: dbbench or appworld.
    #[arg(long, default_value = "dbbench")]
    pub env: String,
    /// The seed the built-in tasks are generated from.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// DBBench only: serve the tasks of an AgentBench DBBench JSONL file (all in the test
    /// split) instead of generated ones.
    #[arg(long, value_name = "FILE")]
    pub dbbench_data: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    pub host: IpAddr,
    /// Port (0 picks a free one).
    #[arg(long, default_value_t = 8100)]
    pub port: u16,
    /// Seconds without a request after which a session is removed.
    #[arg(long, default_value_t = 600.0)]
    pub idle_timeout_s: f64,
    /// Seconds after its start at which a session is removed.
    #[arg(long, default_value_t = 3600.0)]
    pub max_lifetime_s: f64,
    /// The most sessions held at once.
    #[arg(long, default_value_t = 1024)]
    pub max_sessions: usize,
}

impl EnvServeArgs {
    pub fn environment(&self) -> Result<std::sync::Arc<dyn harness_core::Environment>> {
        use harness_envs::{appworld, dbbench};
        Ok(match self.env.as_str() {
            "dbbench" => match &self.dbbench_data {
                Some(path) => std::sync::Arc::new(
                    dbbench::DbBench::from_jsonl(path, harness_core::Split::Test)
                        .with_context(|| format!("--dbbench-data {}", path.display()))?,
                ),
                None => {
                    std::sync::Arc::new(dbbench::DbBench::generated(&dbbench::GeneratorConfig {
                        seed: self.seed,
                        ..Default::default()
                    }))
                }
            },
            "appworld" => {
                anyhow::ensure!(
                    self.dbbench_data.is_none(),
                    "--dbbench-data: only --env dbbench reads a DBBench file"
                );
                std::sync::Arc::new(appworld::AppWorld::with_config(appworld::AppWorldConfig {
                    base_seed: self.seed,
                    ..Default::default()
                }))
            }
            other => anyhow::bail!("--env {other}: expected dbbench or appworld"),
        })
    }

    pub fn config(&self) -> Result<harness_external::envserver::server::EnvServerConfig> {
        let secs = |flag: &str, v: f64| {
            anyhow::ensure!(
                v.is_finite() && v > 0.0,
                "{flag} {v}: expected a number of seconds above zero"
            );
            Ok(std::time::Duration::from_secs_f64(v))
        };
        Ok(harness_external::envserver::server::EnvServerConfig {
            idle_timeout: secs("--idle-timeout-s", self.idle_timeout_s)?,
            max_lifetime: secs("--max-lifetime-s", self.max_lifetime_s)?,
            max_sessions: self.max_sessions,
            ..Default::default()
        })
    }
}

/// Flags every subcommand takes; each overrides the configuration file.
#[derive(Args, Clone, Default)]
pub struct Common {
    /// The run configuration (TOML or JSON).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Start from a preset's defaults: quick or paper.
    #[arg(long)]
    pub preset: Option<String>,
    /// The one seed of the run.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Seeds run one after another; the report gives mean and standard deviation.
    #[arg(long)]
    pub seeds: Option<usize>,
    /// The run directory.
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// A saved pool directory to train on.
    #[arg(long)]
    pub pool: Option<PathBuf>,
    /// A Hugging Face checkpoint folder (or, built with `--features hub`, a cached hub id) instead
    /// of the embedded tiny policy.
    #[arg(long)]
    pub model: Option<String>,
    /// The environment: default, dbbench, appworld, swe or tau-retail.
    #[arg(long)]
    pub env: Option<String>,
    /// Who plays the retail customer (--env tau-retail): scripted (built in, offline) or llm
    /// (a model at --llm, driven by the task's scenario as tau2-bench runs it).
    #[arg(long, value_name = "scripted|llm")]
    pub tau_user: Option<String>,
    /// Judge the retail world's NL assertions with a model at --llm (off by default).
    #[arg(long)]
    pub tau_nl_judge: bool,
    /// An OpenAI-compatible base URL (ending in /v1) for the LLM roles.
    #[arg(long)]
    pub llm: Option<String>,
    /// The model asked at --llm.
    #[arg(long)]
    pub llm_model: Option<String>,
    /// The environment variable holding the --llm API key.
    #[arg(long)]
    pub llm_key_env: Option<String>,
    /// The rollout engine: local, vllm or sglang.
    #[arg(long)]
    pub rollout_engine: Option<String>,
    /// The rollout engine's server root (http://host:port).
    #[arg(long)]
    pub engine_url: Option<String>,
    /// Where the policy update runs: candle (this process) or tinker (a Tinker-protocol server).
    #[arg(long)]
    pub learner: Option<String>,
    /// The Tinker server's root (http://host:port), for --learner tinker.
    #[arg(long)]
    pub tinker_url: Option<String>,
    /// Policy updates per method.
    #[arg(long)]
    pub updates: Option<u64>,
    /// Any setting by its dotted path, as a TOML value (repeatable): --set train.group_size=8
    #[arg(long = "set", value_name = "PATH=VALUE")]
    pub sets: Vec<String>,
    /// No progress bars.
    #[arg(long)]
    pub quiet: bool,
}

impl Common {
    /// File, then preset, then flags.
    pub fn config(&self) -> Result<RunConfig> {
        let preset = self
            .preset
            .as_deref()
            .map(str::parse::<Preset>)
            .transpose()
            .map_err(|e| anyhow::anyhow!("--preset: {e}"))?;
        let mut cfg = RunConfig::load_with_preset(self.config.as_deref(), preset)?;
        let mut sets: Vec<(String, String)> = Vec::new();
        let mut flag = |path: &str, value: Option<String>| {
            if let Some(v) = value {
                sets.push((path.to_string(), v));
            }
        };
        flag("seed", self.seed.map(|v| v.to_string()));
        flag("seeds", self.seeds.map(|v| v.to_string()));
        flag("train.updates", self.updates.map(|v| v.to_string()));
        let quoted = |v: &Option<String>| v.as_ref().map(|s| toml_string(s));
        flag(
            "out",
            self.out.as_ref().map(|p| toml_string(&p.to_string_lossy())),
        );
        flag(
            "pool",
            self.pool
                .as_ref()
                .map(|p| toml_string(&p.to_string_lossy())),
        );
        flag("policy.model", quoted(&self.model));
        flag("env.name", quoted(&self.env));
        flag("env.tau_user", quoted(&self.tau_user));
        flag("env.tau_nl_judge", self.tau_nl_judge.then(|| "true".into()));
        flag("roles.llm", quoted(&self.llm));
        flag("roles.llm_model", quoted(&self.llm_model));
        flag("roles.llm_key_env", quoted(&self.llm_key_env));
        flag("rollout.engine", quoted(&self.rollout_engine));
        flag("rollout.engine_url", quoted(&self.engine_url));
        flag("learner", quoted(&self.learner));
        flag("tinker.url", quoted(&self.tinker_url));
        for set in &self.sets {
            let (path, value) = set
                .split_once('=')
                .with_context(|| format!("--set {set}: expected PATH=VALUE"))?;
            sets.push((path.trim().to_string(), value.trim().to_string()));
        }
        for (path, value) in sets {
            cfg.set(&path, &value)?;
        }
        let file = self.config.as_deref();
        cfg.validate(file)?;
        Ok(cfg)
    }

    pub fn secrets(&self, cfg: &RunConfig) -> Secrets {
        Secrets {
            llm_api_key: cfg
                .roles
                .llm
                .as_ref()
                .and_then(|_| std::env::var(&cfg.roles.llm_key_env).ok()),
            engine_api_key: match cfg.rollout.engine {
                RolloutEngine::Local => None,
                _ => std::env::var("HARNESS_S_ENGINE_API_KEY").ok(),
            },
            tinker_api_key: match cfg.learner {
                LearnerKind::Tinker => std::env::var(&cfg.tinker.api_key_env)
                    .ok()
                    .filter(|k| !k.is_empty()),
                LearnerKind::Candle => None,
            },
        }
    }

    pub fn progress(&self) -> Progress {
        if self.quiet {
            Progress::hidden()
        } else {
            Progress::bars()
        }
    }
}

/// The `serve` command's bearer key: from the variable `--api-key-env` names (an `*_API_KEY`
/// one, set and not empty) or `--api-key`.
pub fn serve_key(
    env: Option<&str>,
    flag: Option<String>,
) -> Result<Option<harness_pipeline::serve::ApiKey>> {
    let key = match env {
        Some(name) => {
            harness_pipeline::keys::check_key_env(name)
                .map_err(|m| anyhow::anyhow!("--api-key-env: {m}"))?;
            Some(
                std::env::var(name)
                    .with_context(|| format!("--api-key-env {name}: the variable is not set"))?,
            )
        }
        None => flag,
    };
    match key {
        None => Ok(None),
        Some(key) => harness_pipeline::serve::ApiKey::new(key)
            .map(Some)
            .context("the API key is empty"),
    }
}

pub fn toml_string(s: &str) -> String {
    toml::Value::String(s.to_string()).to_string()
}

pub fn method(name: &str) -> Result<Method> {
    Method::parse(name).with_context(|| {
        let names: Vec<&str> = Method::ALL.iter().map(|m| m.name()).collect();
        format!("--method {name}: expected one of {}", names.join(", "))
    })
}
