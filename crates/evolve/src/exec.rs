//! Running a harness on tasks with the frozen policy: greedy decoding, one rollout per task,
//! seeds derived from the round's seed, bounded concurrency.

use std::sync::Arc;

use futures::stream::{self, StreamExt, TryStreamExt};
use harness_core::{
    Environment, EpisodeOptions, Harness, Policy, SamplingParams, Task, Trajectory,
    run_episode_with,
};

use crate::error::Result;

/// Where the executor policy of a task comes from.
///
/// # Design
/// The paper's executor is one frozen model for every task, which [`SharedPolicy`] wraps. Offline
/// runs often use per-task reference solvers instead (the built-in environments' oracles), so the
/// seam hands out a policy per task; an implementation may return the same `Arc` every time.
pub trait PolicySource: Send + Sync {
    /// The policy that acts on `task`.
    fn policy_for(&self, task: &Task) -> Result<Arc<dyn Policy>>;

    /// A name for reports.
    fn name(&self) -> String;
}

/// One policy for every task.
pub struct SharedPolicy(pub Arc<dyn Policy>);

impl PolicySource for SharedPolicy {
    fn policy_for(&self, _task: &Task) -> Result<Arc<dyn Policy>> {
        Ok(Arc::clone(&self.0))
    }

    fn name(&self) -> String {
        self.0.name().to_string()
    }
}

impl<F> PolicySource for F
where
    F: Fn(&Task) -> Result<Arc<dyn Policy>> + Send + Sync,
{
    fn policy_for(&self, task: &Task) -> Result<Arc<dyn Policy>> {
        self(task)
    }

    fn name(&self) -> String {
        "per-task policy".to_string()
    }
}

/// The episode seed of `task` under a stage seed: the same task gets the same seed for every
/// harness of a stage, so outcomes pair up (Table 8: "seed 42", matched task seeds).
pub fn episode_seed(stage_seed: u64, task: &Task) -> u64 {
    let h = task.id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    harness_core::call_seed(stage_seed ^ h, 0)
}

/// The executor: policy, environment, sampling and concurrency.
#[derive(Clone)]
pub struct Executor {
    /// The frozen policy.
    pub policy: Arc<dyn PolicySource>,
    /// The environment.
    pub env: Arc<dyn Environment>,
    /// How turns are sampled (greedy under Table 8).
    pub sampling: SamplingParams,
    /// Episodes in flight at once.
    pub concurrency: usize,
}

impl Executor {
    /// Run `harness` once on each task with seeds from `stage_seed`, in task order.
    pub async fn run(
        &self,
        harness: &Harness,
        tasks: &[Task],
        stage_seed: u64,
    ) -> Result<Vec<Trajectory>> {
        self.run_with(harness, tasks, stage_seed, &self.sampling)
            .await
    }

    /// The same with other sampling settings (H0's pass@K at temperature, Figure 1b).
    pub async fn run_with(
        &self,
        harness: &Harness,
        tasks: &[Task],
        stage_seed: u64,
        sampling: &SamplingParams,
    ) -> Result<Vec<Trajectory>> {
        let options = EpisodeOptions {
            sampling: sampling.clone(),
        };
        let options = &options;
        stream::iter(tasks.iter().map(|task| async move {
            let policy = self.policy.policy_for(task)?;
            let seed = episode_seed(stage_seed, task);
            let trajectory = run_episode_with(
                policy.as_ref(),
                harness,
                self.env.as_ref(),
                task,
                seed,
                options,
            )
            .await?;
            Ok::<Trajectory, crate::Error>(trajectory)
        }))
        .buffered(self.concurrency.max(1))
        .try_collect()
        .await
    }
}
