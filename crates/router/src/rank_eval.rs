//! Rank-r evaluation (paper Table 5 and Eq. 12): for each test task the router ranks the full
//! pool, H0 included, before any outcome is observed; the harness at rank r is then fixed across
//! the task's k attempts. The report gives Pass@k and Avg@k for H0 and for Rank-1..R, and the
//! fraction of tasks that place H0 at each rank ("H0 rate").

use std::collections::BTreeMap;

use futures::StreamExt;
use harness_core::{
    EpisodeOptions, HarnessId, HarnessSelector, Policy, SelectionMode, SelectionRequest, Task,
    pass_and_avg_at_k, run_episode_with,
};
use harness_pool::SiblingPool;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::paired::{Environments, env_for, paired_seed};

/// Settings of a Rank-r evaluation.
#[derive(Debug, Clone)]
pub struct RankEvalSettings {
    /// Ranks evaluated (the paper's 3).
    pub ranks: usize,
    /// Attempts per task and harness (the paper's 3).
    pub attempts: u32,
    /// Episodes in flight at once.
    pub concurrency: usize,
    /// Sampling of the evaluated policy.
    pub options: EpisodeOptions,
    /// Seed of the selections and the episodes.
    pub seed: u64,
}

impl Default for RankEvalSettings {
    fn default() -> Self {
        RankEvalSettings {
            ranks: 3,
            attempts: 3,
            concurrency: 8,
            options: EpisodeOptions::default(),
            seed: 0,
        }
    }
}

/// One row of Table 5.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankRow {
    /// `H0` or `Rank-r`.
    pub label: String,
    /// Pass@k over tasks.
    pub pass_at_k: f64,
    /// Avg@k over tasks.
    pub avg_at_k: f64,
    /// Fraction of tasks placing H0 at this rank (`None` for the H0 row).
    pub h0_rate: Option<f64>,
}

/// A Rank-r evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankReport {
    /// H0, then Rank-1..R.
    pub rows: Vec<RankRow>,
    /// Tasks evaluated.
    pub tasks: usize,
    /// Attempts per task and harness.
    pub attempts: u32,
    /// Each task's ranking (first R ids), made before any episode ran.
    pub rankings: BTreeMap<String, Vec<HarnessId>>,
}

/// Evaluate Rank-1..R of `selector` (asked in inference mode) against H0 on `tasks`.
pub async fn evaluate_ranks(
    selector: &dyn HarnessSelector,
    policy: &dyn Policy,
    pool: &SiblingPool,
    envs: &Environments,
    tasks: &[Task],
    settings: &RankEvalSettings,
) -> Result<RankReport> {
    if settings.ranks == 0 || settings.attempts == 0 {
        return Err(Error::setting(
            "ranks/attempts",
            "expected at least 1 of each",
        ));
    }
    for task in tasks {
        env_for(envs, task)?;
    }
    // Every ranking is complete before any task outcome is observed.
    let mut rankings = BTreeMap::new();
    for (i, task) in tasks.iter().enumerate() {
        let ids = selector
            .select(&SelectionRequest {
                task: task.clone(),
                k: settings.ranks,
                mode: SelectionMode::Inference,
                seed: harness_core::call_seed(settings.seed, i as u32),
            })
            .await?;
        let distinct: std::collections::BTreeSet<&HarnessId> = ids.iter().collect();
        if ids.len() != settings.ranks
            || distinct.len() != ids.len()
            || ids.iter().any(|id| !pool.contains(id))
        {
            return Err(Error::Selection(format!(
                "selector `{}` returned {ids:?} for task `{}`; expected {} distinct pool members",
                selector.name(),
                task.id,
                settings.ranks
            )));
        }
        rankings.insert(task.id.clone(), ids);
    }
    // One set of k episodes per distinct (harness, task): a harness at two ranks, or H0 at a
    // rank, is not run twice (the episode seeds are the same anyway).
    let mut jobs: Vec<(HarnessId, usize)> = Vec::new();
    for (t, task) in tasks.iter().enumerate() {
        let mut wanted = vec![pool.base_id().clone()];
        wanted.extend(rankings[&task.id].iter().cloned());
        wanted.sort();
        wanted.dedup();
        jobs.extend(wanted.into_iter().map(|id| (id, t)));
    }
    let episodes: Vec<(HarnessId, usize, u32)> = jobs
        .into_iter()
        .flat_map(|(id, t)| (0..settings.attempts).map(move |a| (id.clone(), t, a)))
        .collect();
    let results: Vec<Result<(HarnessId, usize, f32)>> = futures::stream::iter(episodes)
        .map(|(id, t, attempt)| async move {
            let task = &tasks[t];
            let harness = pool
                .get(&id)
                .ok_or_else(|| Error::Selection(format!("`{id}` is not a pool member")))?;
            let env = env_for(envs, task)?;
            let trajectory = run_episode_with(
                policy,
                harness,
                env.as_ref(),
                task,
                paired_seed(settings.seed, task, attempt),
                &settings.options,
            )
            .await?;
            Ok((id, t, trajectory.reward()))
        })
        .buffer_unordered(settings.concurrency.max(1))
        .collect()
        .await;
    let mut rewards: BTreeMap<(HarnessId, usize), Vec<f32>> = BTreeMap::new();
    for r in results {
        let (id, t, reward) = r?;
        rewards.entry((id, t)).or_default().push(reward);
    }
    let row = |label: String, pick: &dyn Fn(&Task) -> HarnessId, h0_rate: Option<f64>| {
        let per_task: Vec<Vec<f32>> = tasks
            .iter()
            .enumerate()
            .map(|(t, task)| rewards.get(&(pick(task), t)).cloned().unwrap_or_default())
            .collect();
        let (pass_at_k, avg_at_k) = pass_and_avg_at_k(&per_task);
        RankRow {
            label,
            pass_at_k,
            avg_at_k,
            h0_rate,
        }
    };
    let base = pool.base_id().clone();
    let mut rows = vec![row("H0".into(), &|_| base.clone(), None)];
    rows.extend((0..settings.ranks).map(|r| {
        let at_rank = |task: &Task| rankings[&task.id][r].clone();
        let h0 = if tasks.is_empty() {
            0.0
        } else {
            tasks.iter().filter(|t| at_rank(t) == base).count() as f64 / tasks.len() as f64
        };
        row(format!("Rank-{}", r + 1), &at_rank, Some(h0))
    }));
    Ok(RankReport {
        rows,
        tasks: tasks.len(),
        attempts: settings.attempts,
        rankings,
    })
}

impl RankReport {
    /// The report as a Markdown table in percent, like the paper's Table 5.
    pub fn to_markdown(&self) -> String {
        let mut out = format!(
            "| Harness | Pass@{k} | Avg@{k} | H0 rate |\n|---|---|---|---|\n",
            k = self.attempts
        );
        for r in &self.rows {
            out.push_str(&format!(
                "| {} | {:.2} | {:.2} | {} |\n",
                r.label,
                r.pass_at_k * 100.0,
                r.avg_at_k * 100.0,
                r.h0_rate
                    .map_or("—".to_string(), |h| format!("{:.2}", h * 100.0))
            ));
        }
        out
    }
}
