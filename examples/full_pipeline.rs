//! The main job of harness-s, on the embedded default: built-in environments (DBBench on SQLite,
//! the app world, the repository-repair world), a tiny Qwen-architecture policy created locally
//! and warm-started on the environments' reference solutions, GRPO updates under the base harness
//! H0, and Pass@k / Avg@k on validation tasks under H0 and a sibling harness before and after
//! training. No network is used.
//!
//! ```sh
//! cargo run --release --example full_pipeline                        # embedded default
//! cargo run --release --example full_pipeline -- --model ./Qwen3-0.6B # a local HF checkpoint
//! cargo run --release --example full_pipeline -- --config run.json   # every setting from a file
//! ```
//!
//! One seed (`--seed`, or `seed` in the config) drives every random choice: task sampling,
//! episode seeds, policy initialisation and sampling. Results go to `--out` (default
//! `runs/full_pipeline`): `metrics.jsonl` (one record per stage and step), `trajectories.jsonl`
//! and the trained checkpoint in Hugging Face format.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use candle_core::{DType, Device};
use clap::Parser;
use futures::StreamExt;
use grpo_candle::sft::{SftConfig, SftTrainer, sft_sequences};
use grpo_candle::teacher::TeacherForcedPolicy;
use grpo_candle::trainer::{Trainer, TrainerConfig};
use grpo_candle::{CandlePolicy, PolicyModel, PolicyOptions, TinySpec};
use harness_core::{
    EditOp, Environment, EpisodeOptions, Group, GroupOrigin, Harness, HarnessEdit, Policy,
    SamplingParams, Split, Task, Trajectory, append_jsonl, call_seed, pass_and_avg_at_k,
    run_episode_with,
};
use harness_envs::{appworld, dbbench, swe};
use serde::{Deserialize, Serialize};
use serde_json::json;

// The default allocator spends much of a CPU training step in page faults; mimalloc reuses
// the large tensor buffers.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Every setting of a run. A JSON file may give any subset; flags override it.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct RunConfig {
    /// The one seed of the run.
    seed: u64,
    /// Where results are written.
    out: PathBuf,
    /// Environments to run: any of `dbbench`, `appworld`, `swe`.
    envs: Vec<String>,
    /// An AgentBench DBBench JSONL file to evaluate on instead of generated validation tasks.
    dbbench_data: Option<PathBuf>,
    /// A local Hugging Face checkpoint folder; `None` creates the tiny built-in policy.
    model: Option<PathBuf>,
    /// Validation tasks per environment.
    eval_tasks: usize,
    /// Rollouts per task (the k of Pass@k / Avg@k, and the group size of GRPO).
    k: usize,
    /// Warm-start steps on reference solutions (tiny policy only).
    warm_start_steps: usize,
    /// Training tasks per environment used for the warm start.
    warm_start_tasks: usize,
    /// Longest warm-start sequence, in tokens (longer reference solutions are left out; a step's
    /// time grows with sequence length).
    warm_start_max_tokens: usize,
    /// GRPO updates.
    grpo_steps: usize,
    /// Training tasks per environment in each GRPO batch.
    batch_tasks: usize,
    /// Peak learning rate of GRPO.
    learning_rate: f64,
    /// Sampling temperature of rollouts.
    temperature: f32,
    /// Per-episode overrides of the harness limits (the embedded default is small and fast).
    max_model_calls: Option<u32>,
    /// Generated tokens per policy call.
    max_output_tokens: Option<u32>,
    /// Episodes run at once.
    concurrency: usize,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            seed: 42,
            out: PathBuf::from("runs/full_pipeline"),
            envs: vec!["dbbench".into(), "appworld".into(), "swe".into()],
            dbbench_data: None,
            model: None,
            eval_tasks: 4,
            k: 2,
            warm_start_steps: 20,
            warm_start_tasks: 16,
            warm_start_max_tokens: 1536,
            grpo_steps: 2,
            batch_tasks: 2,
            learning_rate: 1e-4,
            temperature: 1.0,
            max_model_calls: Some(8),
            max_output_tokens: Some(160),
            concurrency: 16,
        }
    }
}

#[derive(Parser, Debug)]
#[command(about = "Run harness-s end to end on the built-in environments")]
struct Args {
    /// A JSON run configuration (see `RunConfig` in this file); flags override it.
    #[arg(long)]
    config: Option<PathBuf>,
    /// The run's seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Output folder.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Comma-separated environments (dbbench,appworld,swe).
    #[arg(long, value_delimiter = ',')]
    envs: Option<Vec<String>>,
    /// AgentBench DBBench JSONL to evaluate on.
    #[arg(long)]
    dbbench_data: Option<PathBuf>,
    /// A local Hugging Face checkpoint folder (config.json, safetensors, tokenizer.json).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Validation tasks per environment.
    #[arg(long)]
    eval_tasks: Option<usize>,
    /// Rollouts per task.
    #[arg(long)]
    k: Option<usize>,
    /// Warm-start steps (0 skips the warm start).
    #[arg(long)]
    warm_start_steps: Option<usize>,
    /// GRPO updates.
    #[arg(long)]
    grpo_steps: Option<usize>,
}

impl Args {
    fn into_config(self) -> Result<RunConfig> {
        let mut cfg = match &self.config {
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .with_context(|| format!("reading run config {}", path.display()))?;
                serde_json::from_str(&text)
                    .with_context(|| format!("{}: not a valid run configuration", path.display()))?
            }
            None => RunConfig::default(),
        };
        macro_rules! take {
            ($($field:ident),*) => { $(if let Some(v) = self.$field { cfg.$field = v.into(); })* };
        }
        take!(seed, out, envs, eval_tasks, k, warm_start_steps, grpo_steps);
        if self.dbbench_data.is_some() {
            cfg.dbbench_data = self.dbbench_data;
        }
        if self.model.is_some() {
            cfg.model = self.model;
        }
        if cfg.k == 0 || cfg.eval_tasks == 0 {
            bail!("`k` and `eval_tasks` must be at least 1");
        }
        Ok(cfg)
    }
}

/// Makes a reference solver for a task.
type OracleFactory = Box<dyn Fn(&Task) -> Result<Box<dyn Policy>> + Send + Sync>;

/// One environment of the run with its base harness and sibling.
struct EnvSetup {
    env: Arc<dyn Environment>,
    /// H0 with the environment's own limits (reference solutions may need all of them).
    demo_harness: Harness,
    /// H0 with the run's limits.
    base: Harness,
    sibling: Harness,
    /// A reference solver per task, for the warm start.
    oracle: OracleFactory,
    validation: Vec<Task>,
    train: Vec<Task>,
}

/// The run's sibling: the repairs of the environment's built-in siblings (`siblings()` of each
/// environment module, every hook of which can fire there) applied together to the run's H0
/// as one structured edit. For the app world these are the paper's Table 7 edits (complete
/// pagination, intersect combined conditions, reserve budget for submission).
fn combined_sibling(base: &Harness, siblings: &[Harness]) -> Result<Harness> {
    let mut ops = Vec::new();
    for sibling in siblings {
        for (name, hook) in &sibling.hooks {
            ops.push(EditOp::set(
                format!("state.hooks.{name}"),
                serde_json::to_value(hook)?,
            ));
        }
        for (name, rule) in &sibling.prompt_rules {
            ops.push(EditOp::set(
                format!("state.prompt_rules.{name}"),
                serde_json::to_value(rule)?,
            ));
        }
    }
    let names: Vec<&str> = siblings.iter().map(|s| s.name.as_str()).collect();
    let edit = HarnessEdit::new(ops, format!("the built-in repairs of {}", names.join(", ")));
    let mut sibling = edit.apply(base)?;
    sibling.name = format!("{}+siblings", base.name);
    sibling.lineage.parent = Some(base.id());
    sibling.lineage.generation = 1;
    sibling.lineage.direction = Some(edit.rationale.clone());
    Ok(sibling)
}

fn limited(mut h: Harness, cfg: &RunConfig, context_tokens: u32) -> Harness {
    if let Some(calls) = cfg.max_model_calls {
        h.limits.max_model_calls = h.limits.max_model_calls.min(calls);
        // Keep the two budgets consistent: with fewer replies than actions, a hook on the
        // action budget (`remaining_steps_lte`) could never fire.
        h.limits.max_env_actions = h.limits.max_env_actions.min(calls);
    }
    if let Some(out) = cfg.max_output_tokens {
        h.limits.max_output_tokens = h.limits.max_output_tokens.min(out);
    }
    h.limits.max_context_tokens = h.limits.max_context_tokens.min(context_tokens);
    h
}

fn setups(cfg: &RunConfig, context_tokens: u32) -> Result<Vec<EnvSetup>> {
    let mut out = Vec::new();
    for name in &cfg.envs {
        let (env, base, oracle): (Arc<dyn Environment>, Harness, OracleFactory) =
            match name.as_str() {
                "dbbench" => (
                    Arc::new(dbbench::DbBench::generated(&dbbench::GeneratorConfig {
                        seed: cfg.seed,
                        ..Default::default()
                    })),
                    dbbench::base_harness(),
                    Box::new(|task: &Task| {
                        Ok(Box::new(dbbench::OraclePolicy::new(task)?) as Box<dyn Policy>)
                    }),
                ),
                "appworld" => (
                    Arc::new(appworld::AppWorld::with_config(appworld::AppWorldConfig {
                        base_seed: cfg.seed,
                        ..Default::default()
                    })),
                    appworld::base_harness(),
                    Box::new(|task: &Task| {
                        Ok(Box::new(appworld::OraclePolicy::new(task)) as Box<dyn Policy>)
                    }),
                ),
                "swe" => {
                    let env = swe::SweEnv::builtin();
                    let oracle_env = env.clone();
                    (
                        Arc::new(env),
                        swe::base_harness(),
                        Box::new(move |task: &Task| {
                            Ok(Box::new(oracle_env.oracle(task)?) as Box<dyn Policy>)
                        }),
                    )
                }
                other => bail!("unknown environment `{other}`; expected dbbench, appworld or swe"),
            };
        // Demonstrations keep the environment's own call limits; their context is capped at the
        // warm start's sequence budget so long episodes stop early instead of being recorded.
        let mut demo_harness = base.clone();
        demo_harness.limits.max_context_tokens = demo_harness
            .limits
            .max_context_tokens
            .min(context_tokens)
            .min(cfg.warm_start_max_tokens as u32);
        let base = limited(base, cfg, context_tokens);
        let builtin_siblings = match name.as_str() {
            "dbbench" => dbbench::siblings(),
            "appworld" => appworld::siblings(),
            "swe" => swe::siblings(),
            other => bail!("unknown environment `{other}`; expected dbbench, appworld or swe"),
        };
        let sibling = combined_sibling(&base, &builtin_siblings)?;
        let mut validation = env.tasks(Split::Validation)?;
        if name == "dbbench"
            && let Some(path) = &cfg.dbbench_data
        {
            validation =
                dbbench::DbBench::from_jsonl(path, Split::Validation)?.tasks(Split::Validation)?;
        }
        validation.truncate(cfg.eval_tasks);
        let train = env.tasks(Split::Train)?;
        out.push(EnvSetup {
            env,
            demo_harness,
            base,
            sibling,
            oracle,
            validation,
            train,
        });
    }
    Ok(out)
}

/// The seed of attempt `attempt` of task number `index` in a stage.
fn episode_seed(run_seed: u64, stage: u32, index: usize, attempt: usize) -> u64 {
    call_seed(
        call_seed(call_seed(run_seed, stage), index as u32),
        attempt as u32,
    )
}

/// How a batch of rollouts runs.
struct Batch<'a> {
    /// Episodes per task.
    k: usize,
    /// Episodes run at once.
    concurrency: usize,
    /// Sampling settings.
    options: &'a EpisodeOptions,
}

/// Run `batch.k` episodes of every task under `harness`, `batch.concurrency` at a time.
async fn rollouts(
    policy: &dyn Policy,
    setup: &EnvSetup,
    harness: &Harness,
    tasks: &[Task],
    seeds: impl Fn(usize, usize) -> u64,
    batch: &Batch<'_>,
) -> Result<Vec<Vec<Trajectory>>> {
    let (k, concurrency, options) = (batch.k, batch.concurrency, batch.options);
    let jobs: Vec<(usize, usize, u64)> = (0..tasks.len())
        .flat_map(|i| (0..k).map(move |a| (i, a)))
        .map(|(i, a)| (i, a, seeds(i, a)))
        .collect();
    let results: Vec<(usize, harness_core::Result<Trajectory>)> = futures::stream::iter(jobs)
        .map(|(i, _, seed)| async move {
            (
                i,
                run_episode_with(
                    policy,
                    harness,
                    setup.env.as_ref(),
                    &tasks[i],
                    seed,
                    options,
                )
                .await,
            )
        })
        .buffered(concurrency.max(1))
        .collect()
        .await;
    let mut per_task: Vec<Vec<Trajectory>> = vec![Vec::new(); tasks.len()];
    for (i, result) in results {
        per_task[i].push(result?);
    }
    Ok(per_task)
}

struct Run {
    cfg: RunConfig,
    tiny: bool,
    metrics: PathBuf,
    trajectories: PathBuf,
}

impl Run {
    fn record(&self, value: serde_json::Value) -> Result<()> {
        use std::io::Write;
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.metrics)?;
        writeln!(file, "{value}")?;
        Ok(())
    }

    async fn evaluate(
        &self,
        stage: &str,
        stage_id: u32,
        policy: &dyn Policy,
        setups: &[EnvSetup],
    ) -> Result<()> {
        let options = EpisodeOptions {
            sampling: SamplingParams {
                temperature: self.cfg.temperature,
                ..SamplingParams::default()
            },
        };
        println!("\n== {stage}: validation, k = {}", self.cfg.k);
        println!(
            "{:<10} {:<28} {:>6} {:>8} {:>8} {:>9}",
            "env", "harness", "tasks", "Pass@k", "Avg@k", "seconds"
        );
        for setup in setups {
            for harness in [&setup.base, &setup.sibling] {
                let started = Instant::now();
                let seeds = |i, a| episode_seed(self.cfg.seed, stage_id, i, a);
                let groups = rollouts(
                    policy,
                    setup,
                    harness,
                    &setup.validation,
                    seeds,
                    &Batch {
                        k: self.cfg.k,
                        concurrency: self.cfg.concurrency,
                        options: &options,
                    },
                )
                .await?;
                let rewards: Vec<Vec<f32>> = groups
                    .iter()
                    .map(|g| g.iter().map(Trajectory::reward).collect())
                    .collect();
                let (pass, avg) = pass_and_avg_at_k(&rewards);
                let secs = started.elapsed().as_secs_f64();
                println!(
                    "{:<10} {:<28} {:>6} {:>8.3} {:>8.3} {:>9.1}",
                    setup.env.name(),
                    harness.name,
                    rewards.len(),
                    pass,
                    avg,
                    secs
                );
                self.record(json!({"stage": stage, "env": setup.env.name(), "harness": harness.name, "harness_id": harness.id(),
                    "tasks": rewards.len(), "k": self.cfg.k, "pass_at_k": pass, "avg_at_k": avg, "seconds": secs}))?;
                append_jsonl(
                    &self.trajectories,
                    &groups.into_iter().flatten().collect::<Vec<_>>(),
                )?;
            }
        }
        Ok(())
    }
}

fn load_policy(cfg: &RunConfig) -> Result<(Arc<CandlePolicy>, bool)> {
    let device = Device::Cpu;
    let (model, tiny) = match &cfg.model {
        Some(dir) => (PolicyModel::load_dir(dir, DType::F32, &device)?, false),
        None => (
            PolicyModel::tiny(
                &TinySpec {
                    seed: cfg.seed,
                    ..TinySpec::default()
                },
                DType::F32,
                &device,
            )?,
            true,
        ),
    };
    Ok((
        Arc::new(CandlePolicy::new(model, PolicyOptions::default())),
        tiny,
    ))
}

async fn warm_start(run: &Run, student: &Arc<CandlePolicy>, setups: &[EnvSetup]) -> Result<()> {
    let cfg = &run.cfg;
    println!(
        "\n== warm start: reference solutions of {} training tasks per environment, {} steps",
        cfg.warm_start_tasks, cfg.warm_start_steps
    );
    let options = EpisodeOptions::default();
    let mut demos = Vec::new();
    for (e, setup) in setups.iter().enumerate() {
        for (i, task) in setup.train.iter().take(cfg.warm_start_tasks).enumerate() {
            let teacher = (setup.oracle)(task)?;
            let policy =
                TeacherForcedPolicy::new(Arc::from(teacher), Arc::clone(student)).without_scoring();
            let seed = episode_seed(cfg.seed, 100 + e as u32, i, 0);
            let t = run_episode_with(
                &policy,
                &setup.demo_harness,
                setup.env.as_ref(),
                task,
                seed,
                &options,
            )
            .await?;
            if t.is_success() {
                demos.push(t);
            }
        }
    }
    let all = sft_sequences(&demos, true)?;
    let total = all.len();
    let sequences: Vec<_> = all
        .into_iter()
        .filter(|s| s.ids.len() <= cfg.warm_start_max_tokens)
        .collect();
    println!(
        "{} successful demonstrations; {} of {} training sequences fit in {} tokens",
        demos.len(),
        sequences.len(),
        total,
        cfg.warm_start_max_tokens
    );
    if sequences.is_empty() {
        println!("no demonstration is short enough: warm start skipped");
        return Ok(());
    }
    let mut sft = SftTrainer::new(
        student.model(),
        SftConfig {
            seed: cfg.seed,
            ..SftConfig::default()
        },
    )?;
    for step in 0..cfg.warm_start_steps {
        let metrics = {
            let _guard = student.update_guard();
            sft.step(student.model(), &sequences)?
        };
        if step % 10 == 0 || step + 1 == cfg.warm_start_steps {
            println!(
                "warm-start update {:>3}: nll {:.4} over {} tokens ({:.1} s)",
                step + 1,
                metrics.loss,
                metrics.tokens,
                metrics.seconds
            );
        }
        run.record(json!({"stage": "warm_start", "metrics": metrics}))?;
    }
    Ok(())
}

async fn train(run: &Run, policy: &Arc<CandlePolicy>, setups: &[EnvSetup]) -> Result<()> {
    let cfg = &run.cfg;
    println!(
        "\n== GRPO under H0: {} updates, {} tasks per environment, group size {}",
        cfg.grpo_steps, cfg.batch_tasks, cfg.k
    );
    let mut trainer_cfg = TrainerConfig {
        seed: cfg.seed,
        ..TrainerConfig::default()
    };
    trainer_cfg.schedule.lr = cfg.learning_rate;
    trainer_cfg.schedule.total_steps = cfg.grpo_steps.max(1) as u64;
    // The importance weight compares the trainer's probabilities with the rollout's, so both
    // must be taken at the same temperature.
    trainer_cfg.temperature = f64::from(cfg.temperature);
    let mut trainer = Trainer::new(policy.model(), trainer_cfg)?;
    let options = EpisodeOptions {
        sampling: SamplingParams {
            temperature: cfg.temperature,
            ..SamplingParams::default()
        },
    };
    for step in 0..cfg.grpo_steps {
        let mut groups = Vec::new();
        for (e, setup) in setups.iter().enumerate() {
            // Tasks of this step: a seeded walk through the training split.
            // GRPO samples from the tasks the warm start demonstrated, where a tiny policy has a
            // chance of mixed outcomes; with a real checkpoint the whole split is used.
            let n = if run.tiny {
                setup.train.len().min(cfg.warm_start_tasks.max(1))
            } else {
                setup.train.len()
            };
            let tasks: Vec<Task> = (0..cfg.batch_tasks)
                .map(|j| {
                    setup.train[(call_seed(cfg.seed, (step * cfg.batch_tasks + j) as u32) as usize
                        + e)
                        % n]
                        .clone()
                })
                .collect();
            let seeds = |i, a| episode_seed(cfg.seed, 1000 + step as u32 * 8 + e as u32, i, a);
            let per_task = rollouts(
                policy.as_ref(),
                setup,
                &setup.base,
                &tasks,
                seeds,
                &Batch {
                    k: cfg.k,
                    concurrency: cfg.concurrency,
                    options: &options,
                },
            )
            .await?;
            for (task, trajectories) in tasks.into_iter().zip(per_task) {
                groups.push(Group {
                    task,
                    trajectories,
                    origin: GroupOrigin::Base,
                });
            }
        }
        let reward: f64 = groups
            .iter()
            .flat_map(|g| g.rewards())
            .map(f64::from)
            .sum::<f64>()
            / groups
                .iter()
                .map(|g| g.trajectories.len())
                .sum::<usize>()
                .max(1) as f64;
        let metrics = {
            let _guard = policy.update_guard();
            trainer.step(policy.model(), &groups)?
        };
        println!(
            "update {:>2}: reward {:.3}, effective groups {}/{}, loss {:+.5}, grad norm {:.4}, policy tokens {}",
            step + 1,
            reward,
            metrics.effective_groups,
            metrics.groups,
            metrics.loss,
            metrics.grad_norm,
            metrics.policy_tokens
        );
        run.record(
            json!({"stage": "grpo", "update": step + 1, "reward": reward, "metrics": metrics}),
        )?;
        append_jsonl(
            &run.trajectories,
            &groups
                .into_iter()
                .flat_map(|g| g.trajectories)
                .collect::<Vec<_>>(),
        )?;
    }
    Ok(())
}

fn parameter_count(policy: &CandlePolicy) -> usize {
    policy
        .varmap()
        .all_vars()
        .iter()
        .map(|v| v.elem_count())
        .sum()
}

fn prepare_out(out: &Path) -> Result<(PathBuf, PathBuf)> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let metrics = out.join("metrics.jsonl");
    let trajectories = out.join("trajectories.jsonl");
    for file in [&metrics, &trajectories] {
        if file.exists() {
            std::fs::remove_file(file)?;
        }
    }
    Ok((metrics, trajectories))
}

#[tokio::main]
async fn main() -> Result<()> {
    let cfg = Args::parse().into_config()?;
    let started = Instant::now();
    let (metrics, trajectories) = prepare_out(&cfg.out)?;
    std::fs::write(
        cfg.out.join("config.json"),
        serde_json::to_string_pretty(&cfg)?,
    )?;
    let (policy, tiny) = load_policy(&cfg)?;
    let context_tokens = policy.model().config().max_position_embeddings as u32;
    let setups = setups(&cfg, context_tokens)?;
    println!(
        "harness-s full pipeline: seed {}, policy {} ({} parameters), environments {}",
        cfg.seed,
        if tiny {
            "tiny built-in Qwen3"
        } else {
            "checkpoint"
        },
        parameter_count(&policy),
        cfg.envs.join(", ")
    );
    for s in &setups {
        println!(
            "  {:<9} H0 {} | sibling {} {} | {} validation / {} training tasks",
            s.env.name(),
            s.base.id(),
            s.sibling.name,
            s.sibling.id(),
            s.validation.len(),
            s.train.len()
        );
    }
    let run = Run {
        cfg,
        tiny,
        metrics,
        trajectories,
    };
    if tiny && run.cfg.warm_start_steps > 0 {
        warm_start(&run, &policy, &setups).await?;
    }
    run.evaluate("before training", 1, policy.as_ref(), &setups)
        .await?;
    if run.cfg.grpo_steps > 0 {
        train(&run, &policy, &setups).await?;
        run.evaluate("after training", 2, policy.as_ref(), &setups)
            .await?;
    }
    let checkpoint = run.cfg.out.join("checkpoint");
    policy.save_hf(&checkpoint)?;
    println!(
        "\nwrote {}, {} and {} in {:.0} s",
        run.metrics.display(),
        run.trajectories.display(),
        checkpoint.display(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
