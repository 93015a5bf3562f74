//! Paired validation executions (paper Eq. 11 and Appendix "Sibling Harness Edits"): with the
//! policy frozen, every pool member and H0 run the same validation tasks with the same task
//! seeds, episode seeds and execution limits, so that a sibling's trajectory can be compared
//! with H0's on the same initial state.
//!
//! Episodes run through `harness_core::run_episode_with` with bounded concurrency
//! (`futures::stream::buffer_unordered`); no runtime is assumed beyond the caller's executor.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use harness_core::{
    Environment, EpisodeOptions, Harness, HarnessId, Policy, SamplingParams, Split, Task,
    Trajectory, call_seed, run_episode_with,
};
use harness_pool::SiblingPool;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// The environments tasks run in, by [`Environment::name`].
pub type Environments = BTreeMap<String, Arc<dyn Environment>>;

/// Which execution limits paired episodes run under.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairedLimits {
    /// Every member runs under H0's limits: the paper's "matched execution limits". A sibling
    /// whose edit *is* a limit is then measured without that edit.
    #[default]
    Base,
    /// Every member keeps its own limits.
    Own,
}

/// How paired executions run.
#[derive(Debug, Clone)]
pub struct PairedSettings {
    /// Episodes per (harness, task); the same episode seeds for every harness.
    pub rollouts_per_task: u32,
    /// Episodes in flight at once.
    pub concurrency: usize,
    /// Matched or own limits.
    pub limits: PairedLimits,
    /// Sampling settings of the frozen policy (greedy by default, as in the paper's paired
    /// analysis of Appendix § 11: one greedy rollout per validation task).
    pub options: EpisodeOptions,
}

impl Default for PairedSettings {
    fn default() -> Self {
        PairedSettings {
            rollouts_per_task: 1,
            concurrency: 8,
            limits: PairedLimits::Base,
            options: EpisodeOptions {
                sampling: SamplingParams::greedy(),
            },
        }
    }
}

/// The trajectories of one paired calibration run.
#[derive(Debug, Clone)]
pub struct PairedRun {
    /// The validation tasks, in order.
    pub tasks: Vec<Task>,
    /// H0 first, then the siblings in pool order.
    pub members: Vec<HarnessId>,
    /// Per member, per task id, the episodes in attempt order.
    pub episodes: BTreeMap<HarnessId, BTreeMap<String, Vec<Trajectory>>>,
}

impl PairedRun {
    /// The episodes of `member` on `task_id` (empty when none ran).
    pub fn of(&self, member: &HarnessId, task_id: &str) -> &[Trajectory] {
        self.episodes
            .get(member)
            .and_then(|m| m.get(task_id))
            .map_or(&[], Vec::as_slice)
    }

    /// Episodes run.
    pub fn rollouts(&self) -> usize {
        self.episodes
            .values()
            .flat_map(|m| m.values())
            .map(Vec::len)
            .sum()
    }
}

/// The episode seed of `attempt` on `task`: derived from the run seed, the task's id and seed,
/// and never from the harness, so that paired executions share it.
pub fn paired_seed(seed: u64, task: &Task, attempt: u32) -> u64 {
    let id_hash = task.id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    call_seed(seed ^ id_hash ^ task.seed.rotate_left(29), attempt)
}

/// Refuse test tasks (they never feed the router), naming the first one.
pub fn ensure_no_test_tasks(tasks: &[Task], context: &str) -> Result<()> {
    match tasks.iter().find(|t| t.split == Split::Test) {
        Some(t) => Err(Error::TestTask {
            task: t.id.clone(),
            context: context.to_string(),
        }),
        None => Ok(()),
    }
}

/// The environment of `task`, or an error naming the known ones.
pub fn env_for<'a>(envs: &'a Environments, task: &Task) -> Result<&'a Arc<dyn Environment>> {
    envs.get(&task.env)
        .ok_or_else(|| Error::UnknownEnvironment {
            task: task.id.clone(),
            env: task.env.clone(),
            known: envs.keys().cloned().collect::<Vec<_>>().join(", "),
        })
}

/// Run every pool member (H0 included) on every task, paired.
pub async fn run_paired(
    policy: &dyn Policy,
    pool: &SiblingPool,
    envs: &Environments,
    tasks: &[Task],
    seed: u64,
    settings: &PairedSettings,
) -> Result<PairedRun> {
    ensure_no_test_tasks(tasks, "paired calibration")?;
    if settings.rollouts_per_task == 0 {
        return Err(Error::setting("rollouts_per_task", "expected at least 1"));
    }
    for task in tasks {
        env_for(envs, task)?;
    }
    let base_limits = pool.base().limits;
    let harnesses: Vec<(HarnessId, Harness)> = pool
        .members()
        .iter()
        .map(|h| {
            let mut run = h.clone();
            if settings.limits == PairedLimits::Base {
                run.limits = base_limits;
            }
            (h.id(), run)
        })
        .collect();
    let mut jobs = Vec::new();
    for (m, _) in harnesses.iter().enumerate() {
        for (t, task) in tasks.iter().enumerate() {
            for attempt in 0..settings.rollouts_per_task {
                jobs.push((m, t, attempt, paired_seed(seed, task, attempt)));
            }
        }
    }
    let results: Vec<Result<(usize, usize, u32, Trajectory)>> = futures::stream::iter(jobs)
        .map(|(m, t, attempt, episode_seed)| {
            let harness = &harnesses[m].1;
            let task = &tasks[t];
            async move {
                let env = env_for(envs, task)?;
                let trajectory = run_episode_with(
                    policy,
                    harness,
                    env.as_ref(),
                    task,
                    episode_seed,
                    &settings.options,
                )
                .await?;
                Ok((m, t, attempt, trajectory))
            }
        })
        .buffer_unordered(settings.concurrency.max(1))
        .collect()
        .await;
    let mut slots: BTreeMap<(usize, usize), Vec<Option<Trajectory>>> = BTreeMap::new();
    for result in results {
        let (m, t, attempt, trajectory) = result?;
        slots
            .entry((m, t))
            .or_insert_with(|| vec![None; settings.rollouts_per_task as usize])[attempt as usize] =
            Some(trajectory);
    }
    let mut episodes: BTreeMap<HarnessId, BTreeMap<String, Vec<Trajectory>>> = BTreeMap::new();
    for ((m, t), list) in slots {
        episodes
            .entry(harnesses[m].0.clone())
            .or_default()
            .insert(tasks[t].id.clone(), list.into_iter().flatten().collect());
    }
    Ok(PairedRun {
        tasks: tasks.to_vec(),
        members: harnesses.into_iter().map(|(id, _)| id).collect(),
        episodes,
    })
}
