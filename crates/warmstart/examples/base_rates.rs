//! Build (or load from the cache) the embedded default's warm start and measure where it starts,
//! on validation tasks: per family H0 Avg@k, Pass@k and the share of tasks that fail all k
//! attempts; per sibling success; and the paper's Figure 1b numbers (the oracle union of one
//! rollout under each sibling against the best single sibling and H0 at the same number of
//! rollouts). Sampling at temperature 1.
//!
//! ```sh
//! cargo run -p harness-warmstart --release --example base_rates
//! cargo run -p harness-warmstart --release --example base_rates -- --settings s.json --k 4
//! ```
//! Flags: `--cache DIR` (default `runs/warmstart-cache`), `--settings FILE` (a JSON
//! [`WarmStartSettings`], any subset of fields), `--k N` (rollouts per task and harness,
//! default 4), `--tasks N` (validation tasks, default all), `--concurrency N` (default 32),
//! `--train` (train even where the crate ships the checkpoint: how a shipped one is remade).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use grpo_candle::{CandlePolicy, PolicyOptions};
use harness_core::{
    EpisodeOptions, Harness, SamplingParams, Split, Task, pass_and_avg_at_k, run_episode_with,
};
use harness_warmstart::{
    Family, WarmStartProgress, WarmStartSettings, warm_start, warm_start_trained,
};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

struct Args {
    cache: PathBuf,
    settings: WarmStartSettings,
    k: usize,
    tasks: Option<usize>,
    concurrency: usize,
    show: usize,
    train: bool,
}

fn args() -> Result<Args> {
    let mut out = Args {
        cache: PathBuf::from("runs/warmstart-cache"),
        settings: WarmStartSettings::default(),
        k: 4,
        tasks: None,
        concurrency: 32,
        show: 0,
        train: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().with_context(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--cache" => out.cache = PathBuf::from(value()?),
            "--settings" => {
                let path = value()?;
                let text = std::fs::read_to_string(&path).with_context(|| path.clone())?;
                out.settings = WarmStartSettings::from_json(&text).context(path)?;
            }
            "--k" => out.k = value()?.parse()?,
            "--tasks" => out.tasks = Some(value()?.parse()?),
            "--concurrency" => out.concurrency = value()?.parse()?,
            "--show" => out.show = value()?.parse()?,
            "--train" => out.train = true,
            other => bail!("unknown flag `{other}`"),
        }
    }
    if out.k == 0 {
        bail!("--k must be at least 1");
    }
    Ok(out)
}

fn pct(x: f64) -> String {
    format!("{:5.1}%", 100.0 * x)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = args()?;
    let mut last_print = Instant::now();
    let build = if args.train {
        warm_start_trained
    } else {
        warm_start
    };
    let started = build(&args.settings, &args.cache, &mut |p| match &p {
        WarmStartProgress::Step { step, total, loss } => {
            if last_print.elapsed().as_secs_f64() > 10.0 || step == total {
                eprintln!("warm start: update {step}/{total}, nll {loss:.4}");
                last_print = Instant::now();
            }
        }
        other => eprintln!("warm start: {other:?}"),
    })?;
    let r = &started.report;
    println!(
        "warm start: {} ({}), {:.1} s this call; trained {} updates in {:.1} s (demos {:.1} s): nll {:.3} -> {:.3} (last 10%: {:.3})",
        started.checkpoint.display(),
        if started.shipped {
            "shipped with the crate"
        } else if started.cached {
            "cached"
        } else {
            "trained now"
        },
        started.seconds,
        r.steps,
        r.train_seconds,
        r.demo_seconds,
        r.first_loss,
        r.final_loss,
        r.tail_loss
    );
    println!(
        "  {} demos, {} sequences, {} tokens ({} scored, longest {}), {} cut turns, vocab {}, {} parameters",
        r.demos,
        r.sequences,
        r.sequence_tokens,
        r.policy_tokens,
        r.max_sequence_tokens,
        r.truncated_turns,
        r.vocab_size,
        r.parameters
    );
    for (family, c) in &r.families {
        println!(
            "  demos {family:8}: {:4} ({} planted, {} prompted by a repair, {} unprompted good, {} successful)",
            c.demos, c.planted, c.prompted, c.unprompted_good, c.successes
        );
    }

    let model = started.load_model()?;
    let policy = Arc::new(CandlePolicy::new(model, PolicyOptions::default()));
    let env = started.environment();
    let mut tasks = env.tasks(Split::Validation)?;
    if let Some(n) = args.tasks {
        tasks.truncate(n);
    }
    let mut harnesses: Vec<Harness> = vec![started.base.clone()];
    harnesses.extend(started.siblings.iter().cloned());
    let k = args.k;
    let options = EpisodeOptions {
        sampling: SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        },
    };
    // rewards[h][t][j]: harness h, task t, rollout j.
    let eval_started = Instant::now();
    let jobs: Vec<(usize, usize, usize)> = (0..harnesses.len())
        .flat_map(|h| (0..tasks.len()).flat_map(move |t| (0..k).map(move |j| (h, t, j))))
        .collect();
    let show = args.show;
    let results: Vec<Result<(usize, usize, usize, f32)>> =
        futures::stream::iter(jobs.into_iter().map(|(h, t, j)| {
            let policy = Arc::clone(&policy);
            let env = Arc::clone(&env);
            let harness = &harnesses[h];
            let task: &Task = &tasks[t];
            let options = &options;
            async move {
                // The same seeds under every harness: paired rollouts.
                let seed = 1_000_003 * (t as u64 + 1) + j as u64;
                let traj =
                    run_episode_with(policy.as_ref(), harness, env.as_ref(), task, seed, options)
                        .await?;
                if j == 0 && t < show {
                    let mut text = format!(
                        "---- {} under {} (reward {}, {:?})\n",
                        task.id, harness.name, traj.outcome.reward, traj.termination
                    );
                    for m in traj.messages.iter().skip(2) {
                        text.push_str(&format!("[{:?}] {}\n", m.role, m.content));
                    }
                    println!("{text}");
                }
                Ok((h, t, j, traj.outcome.reward))
            }
        }))
        .buffer_unordered(args.concurrency)
        .collect()
        .await;
    let mut rewards = vec![vec![vec![0.0f32; k]; tasks.len()]; harnesses.len()];
    for r in results {
        let (h, t, j, reward) = r?;
        rewards[h][t][j] = reward;
    }
    let families: Vec<Family> = tasks
        .iter()
        .map(|t| Family::of_task(t).unwrap_or(Family::Plain))
        .collect();
    println!(
        "\nvalidation: {} tasks, k = {k}, {} episodes in {:.1} s (temperature 1)",
        tasks.len(),
        harnesses.len() * tasks.len() * k,
        eval_started.elapsed().as_secs_f64()
    );

    let select = |h: usize, fam: Option<Family>| -> Vec<Vec<f32>> {
        (0..tasks.len())
            .filter(|&t| fam.is_none_or(|f| families[t] == f))
            .map(|t| rewards[h][t].clone())
            .collect()
    };
    let fail_all = |rows: &[Vec<f32>]| {
        rows.iter().filter(|r| r.iter().all(|x| *x < 1.0)).count() as f64 / rows.len().max(1) as f64
    };
    print!(
        "\n{:10} {:>5} {:>9} {:>9} {:>12}",
        "family", "tasks", "H0 Avg@k", "H0 Pass@k", "H0 fail all"
    );
    for s in &harnesses[1..] {
        print!(" {:>14}", s.name.trim_start_matches("dbbench-compact-"));
    }
    println!();
    let mut groups: Vec<Option<Family>> = Family::ALL.iter().copied().map(Some).collect();
    groups.push(None);
    for fam in groups {
        let rows = select(0, fam);
        let (pass, avg) = pass_and_avg_at_k(&rows);
        print!(
            "{:10} {:>5} {:>9} {:>9} {:>12}",
            fam.map(|f| f.as_str()).unwrap_or("all"),
            rows.len(),
            pct(avg),
            pct(pass),
            pct(fail_all(&rows))
        );
        for h in 1..harnesses.len() {
            let (_, avg) = pass_and_avg_at_k(&select(h, fam));
            print!(" {:>14}", pct(avg));
        }
        println!();
    }
    println!("(sibling columns: Avg@k of the sibling on the family's tasks)");

    // Figure 1b: N = number of siblings rollouts per task.
    let n = harnesses.len() - 1;
    let n_tasks = tasks.len().max(1) as f64;
    let solved = |h: usize, t: usize, rollouts: usize| {
        rewards[h][t][..rollouts.min(k)].iter().any(|x| *x >= 1.0)
    };
    let union = (0..tasks.len())
        .filter(|&t| (1..harnesses.len()).any(|h| rewards[h][t][0] >= 1.0))
        .count() as f64
        / n_tasks;
    let best_single = (1..harnesses.len())
        .map(|h| (0..tasks.len()).filter(|&t| solved(h, t, 1)).count() as f64 / n_tasks)
        .fold(0.0, f64::max);
    let best_sibling_n = (1..harnesses.len())
        .map(|h| (0..tasks.len()).filter(|&t| solved(h, t, n)).count() as f64 / n_tasks)
        .fold(0.0, f64::max);
    let h0_n = (0..tasks.len()).filter(|&t| solved(0, t, n)).count() as f64 / n_tasks;
    let failed_h0 = (0..tasks.len())
        .filter(|&t| !solved(0, t, k))
        .collect::<Vec<_>>();
    let rescued = failed_h0
        .iter()
        .filter(|&&t| (1..harnesses.len()).any(|h| rewards[h][t][0] >= 1.0))
        .count();
    println!(
        "\nFigure 1b (N = {n} rollouts per task{}):",
        if n > k { ", capped at k" } else { "" }
    );
    println!(
        "  oracle union, one rollout under each sibling: {}",
        pct(union)
    );
    println!(
        "  best single sibling, one rollout:             {}",
        pct(best_single)
    );
    println!(
        "  best single sibling, pass@N:                  {}",
        pct(best_sibling_n)
    );
    println!(
        "  H0 pass@N:                                    {}",
        pct(h0_n)
    );
    println!(
        "  tasks H0 fails in all k = {k}: {} of {}; one rollout per sibling rescues {} of them",
        failed_h0.len(),
        tasks.len(),
        rescued
    );
    let mut per_sibling: BTreeMap<String, usize> = BTreeMap::new();
    for &t in &failed_h0 {
        for h in 1..harnesses.len() {
            if rewards[h][t][0] >= 1.0 {
                *per_sibling.entry(harnesses[h].name.clone()).or_default() += 1;
            }
        }
    }
    for (name, count) in per_sibling {
        println!("    {name}: rescues {count}");
    }
    Ok(())
}
