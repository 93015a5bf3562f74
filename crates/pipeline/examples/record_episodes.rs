//! Record episodes of a checkpoint under an environment's base harness H0, K rollouts per
//! training task, without any update: one `harness_core::Trajectory` per line, the format of
//! the rescue trainer's `trajectories.jsonl` (and the input of grpo-candle's
//! `bench_replay --trajectories`).
//!
//! ```text
//! cargo run --release -p harness-pipeline --example record_episodes -- \
//!     --env appworld --model /models/Qwen3-4B --tasks 4 --k 8 --out appworld.jsonl \
//!     [--max-output-tokens N] [--set rollout.temperature=1.0 ...]
//! ```
//!
//! `--max-output-tokens N` caps every policy call at N tokens (H0's
//! `limits.max_output_tokens`, 8,192 unless the harness says otherwise), for a policy that does
//! not end its turns on its own.
//!
//! `--env default` with no `--model` records the embedded warm-started policy. Any run
//! configuration setting can be given with `--set path=value`; the seed (`--set seed=N`)
//! decides the episodes' seeds. Prints, per environment, episodes, turns and policy tokens.

use std::io::Write;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use harness_core::{EpisodeOptions, Policy, SamplingParams, run_episode_with};
use harness_pipeline::{Progress, RunConfig, Secrets, Workbench};

struct Args {
    env: String,
    model: Option<PathBuf>,
    tasks: usize,
    k: u64,
    out: PathBuf,
    max_output_tokens: Option<u32>,
    sets: Vec<(String, String)>,
}

fn parse() -> anyhow::Result<Args> {
    let mut a = Args {
        env: "default".into(),
        model: None,
        tasks: 4,
        k: 8,
        out: PathBuf::from("trajectories.jsonl"),
        max_output_tokens: None,
        sets: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut val = || it.next().with_context(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--env" => a.env = val()?,
            "--model" => a.model = Some(val()?.into()),
            "--tasks" => a.tasks = val()?.parse()?,
            "--k" => a.k = val()?.parse()?,
            "--out" => a.out = val()?.into(),
            "--max-output-tokens" => a.max_output_tokens = Some(val()?.parse()?),
            "--set" => {
                let s = val()?;
                let (p, v) = s
                    .split_once('=')
                    .with_context(|| format!("--set {s}: expected path=value"))?;
                a.sets.push((p.to_string(), v.to_string()));
            }
            other => bail!("unknown argument {other}"),
        }
    }
    if a.tasks == 0 || a.k == 0 || a.max_output_tokens == Some(0) {
        bail!("--tasks, --k and --max-output-tokens must be at least 1");
    }
    Ok(a)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let a = parse()?;
    let work = tempfile::tempdir()?;
    let mut cfg = RunConfig {
        out: work.path().join("run"),
        ..RunConfig::default()
    };
    cfg.set("env.name", &format!("{:?}", a.env))?;
    if let Some(m) = &a.model {
        cfg.set("policy.model", &format!("{:?}", m.display().to_string()))?;
    }
    cfg.set("env.train_tasks", &a.tasks.to_string())?;
    for (p, v) in &a.sets {
        cfg.set(p, v)?;
    }
    let wb = Workbench::new(cfg.clone(), Secrets::default(), Progress::hidden())?;
    let policy: Arc<dyn Policy> = wb.local_policy(&wb.checkpoint, "recorded")?;
    let mut base = wb.base.clone();
    if let Some(n) = a.max_output_tokens {
        base.limits.max_output_tokens = n;
    }
    let options = EpisodeOptions {
        sampling: SamplingParams {
            temperature: cfg.rollout.temperature,
            ..SamplingParams::default()
        },
    };
    if wb.train.len() < a.tasks {
        bail!(
            "{} has {} training tasks, fewer than --tasks {}",
            a.env,
            wb.train.len(),
            a.tasks
        );
    }
    let jobs: Vec<(usize, u64)> = (0..a.tasks)
        .flat_map(|t| (0..a.k).map(move |j| (t, j)))
        .collect();
    let (wb, policy, options, base) = (&wb, &policy, &options, &base);
    let started = std::time::Instant::now();
    let trajectories: Vec<harness_core::Trajectory> = futures::stream::iter(jobs)
        .map(|(t, j)| async move {
            let seed = cfg
                .seed
                .wrapping_mul(1_000_003)
                .wrapping_add((t as u64) << 16 | j);
            run_episode_with(
                policy.as_ref(),
                base,
                wb.env.as_ref(),
                &wb.train[t],
                seed,
                options,
            )
            .await
        })
        .buffered(wb.cfg.rollout.concurrency.max(1))
        .try_collect()
        .await?;
    let mut file = std::io::BufWriter::new(
        std::fs::File::create(&a.out).with_context(|| format!("{}", a.out.display()))?,
    );
    for t in &trajectories {
        serde_json::to_writer(&mut file, t)?;
        writeln!(file)?;
    }
    file.flush()?;
    let turns: usize = trajectories.iter().map(|t| t.turns.len()).sum();
    let tokens: usize = trajectories
        .iter()
        .flat_map(|t| &t.turns)
        .map(|t| t.tokens.len())
        .sum();
    let solved = trajectories
        .iter()
        .filter(|t| t.outcome.reward > 0.0)
        .count();
    println!(
        "{}: {} episodes ({} tasks x {}), {turns} policy turns, {tokens} policy tokens, {solved} solved, {:.0} s; written to {}",
        a.env,
        trajectories.len(),
        a.tasks,
        a.k,
        started.elapsed().as_secs_f64(),
        a.out.display()
    );
    Ok(())
}
