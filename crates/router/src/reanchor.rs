//! Policy-aware profile re-anchoring (paper Eq. 11 and "Profile refresh"): the calibrator the
//! rescue loop calls every N updates (paper: 10) and once with the final policy. With the
//! policy frozen it re-runs the paired validation executions, rebuilds every sibling's profile
//! and the validation statistics, saves the calibration, and swaps it into the router's
//! [`EvidenceCell`]; routing uses it until the next call.
//!
//! In [`ReanchorMode::Fixed`] (the paper's "Top-8 Fixed") the first calibration is kept for the
//! whole run: later calls measure nothing and change nothing.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use async_trait::async_trait;
use futures::StreamExt;
use harness_core::{
    Calibrate, CalibrationPoint, CalibrationSummary, HarnessId, Policy, Task, append_jsonl,
};
use harness_pool::SiblingPool;
use serde::{Deserialize, Serialize};

use crate::calibration::{Calibration, CheckpointRef, ProfilerStats};
use crate::error::{Error, Result};
use crate::features::FeatureSource;
use crate::paired::{
    Environments, PairedRun, PairedSettings, ensure_no_test_tasks, env_for, run_paired,
};
use crate::profile::Profile;
use crate::profiler::{PairedTask, ProfileInput, Profiler};
use crate::router::EvidenceCell;

/// Whether later calibrations replace the first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReanchorMode {
    /// Re-anchor at every call (Harness-S).
    #[default]
    Adaptive,
    /// Keep the first calibration (the fixed-profile baseline).
    Fixed,
}

/// Settings of the calibrator.
#[derive(Debug, Clone)]
pub struct CalibratorSettings {
    /// How paired executions run.
    pub paired: PairedSettings,
    /// Adaptive or fixed.
    pub mode: ReanchorMode,
    /// Where calibrations (and their paired trajectories) are written; `None` keeps them in
    /// memory only.
    pub dir: Option<PathBuf>,
    /// Siblings profiled at once.
    pub profile_concurrency: usize,
    /// Also write `trajectories-<index>.jsonl` with the paired episodes.
    pub save_trajectories: bool,
    /// Where the profiles' and the similarity index's task features come from (recorded in
    /// every calibration).
    pub features: FeatureSource,
}

impl Default for CalibratorSettings {
    fn default() -> Self {
        CalibratorSettings {
            paired: PairedSettings::default(),
            mode: ReanchorMode::Adaptive,
            dir: None,
            profile_concurrency: 4,
            save_trajectories: true,
            features: FeatureSource::default(),
        }
    }
}

/// The re-anchoring calibrator.
pub struct Calibrator {
    name: String,
    pool: Arc<SiblingPool>,
    policy: Arc<dyn Policy>,
    envs: Environments,
    tasks: Vec<Task>,
    profiler: Arc<dyn Profiler>,
    evidence: EvidenceCell,
    settings: CalibratorSettings,
}

impl Calibrator {
    /// A calibrator measuring `policy` on the validation `tasks` with every member of `pool`,
    /// profiling with `profiler` and publishing into `evidence`. Test tasks, tasks of unknown
    /// environments and an empty task list are refused.
    pub fn new(
        pool: Arc<SiblingPool>,
        policy: Arc<dyn Policy>,
        envs: Environments,
        tasks: Vec<Task>,
        profiler: Arc<dyn Profiler>,
        evidence: EvidenceCell,
        settings: CalibratorSettings,
    ) -> Result<Self> {
        ensure_no_test_tasks(&tasks, "calibration tasks")?;
        if tasks.is_empty() {
            return Err(Error::setting(
                "tasks",
                "expected at least one validation task",
            ));
        }
        for task in &tasks {
            env_for(&envs, task)?;
        }
        let name = match settings.mode {
            ReanchorMode::Adaptive => "reanchoring-calibrator",
            ReanchorMode::Fixed => "fixed-profile-calibrator",
        };
        Ok(Calibrator {
            name: name.into(),
            pool,
            policy,
            envs,
            tasks,
            profiler,
            evidence,
            settings,
        })
    }

    /// The evidence cell it publishes into (give it to the router).
    pub fn evidence(&self) -> &EvidenceCell {
        &self.evidence
    }

    async fn profiles(
        &self,
        run: &PairedRun,
    ) -> Result<(BTreeMap<HarnessId, Profile>, ProfilerStats)> {
        let base = self.pool.base();
        let base_id = self.pool.base_id();
        let outcomes: Vec<Result<(HarnessId, crate::profiler::ProfileOutcome)>> =
            // Owned siblings keep the closure free of borrowed arguments, which the async-trait
            // future could not name.
            futures::stream::iter(self.pool.auxiliaries().cloned().collect::<Vec<_>>())
                .map(|sibling| async move {
                    let id = sibling.id();
                    let input = ProfileInput {
                        base,
                        sibling: &sibling,
                        pairs: run
                            .tasks
                            .iter()
                            .map(|task| PairedTask {
                                task,
                                sibling: run.of(&id, &task.id),
                                base: run.of(base_id, &task.id),
                            })
                            .collect(),
                        features: self.settings.features,
                    };
                    let outcome = self.profiler.profile(&input).await?;
                    Ok((id, outcome))
                })
                .buffered(self.settings.profile_concurrency.max(1))
                .collect()
                .await;
        let mut profiles = BTreeMap::new();
        let mut stats = ProfilerStats {
            profiler: self.profiler.name().to_string(),
            ..ProfilerStats::default()
        };
        for outcome in outcomes {
            let (id, o) = outcome?;
            stats.failures += usize::from(o.failed);
            stats.rejected_answers += o.rejected_answers;
            stats.usage.prompt_tokens += o.usage.prompt_tokens;
            stats.usage.completion_tokens += o.usage.completion_tokens;
            profiles.insert(id, o.profile);
        }
        Ok((profiles, stats))
    }

    /// Run one calibration and publish it (what [`Calibrate::calibrate`] does), returning the
    /// calibration and the episodes it ran.
    pub async fn run(&self, point: &CalibrationPoint) -> Result<(Calibration, usize)> {
        // Hash the checkpoint first: a missing one fails before any episode runs.
        let checkpoint = point
            .checkpoint
            .as_deref()
            .map(CheckpointRef::of)
            .transpose()?;
        let run = run_paired(
            self.policy.as_ref(),
            &self.pool,
            &self.envs,
            &self.tasks,
            point.seed,
            &self.settings.paired,
        )
        .await?;
        let (profiles, stats) = self.profiles(&run).await?;
        let mut calibration = Calibration::from_run(
            point,
            checkpoint,
            &self.pool,
            &run,
            &self.settings.paired,
            profiles,
            stats,
        );
        calibration.features = self.settings.features;
        if let Some(dir) = &self.settings.dir {
            calibration.save(dir)?;
            if self.settings.save_trajectories {
                let path = dir.join(format!("trajectories-{:04}.jsonl", point.index));
                // A re-run of the same index replaces its trajectories instead of appending.
                let _ = std::fs::remove_file(&path);
                for member in &run.members {
                    for task in &run.tasks {
                        append_jsonl(&path, run.of(member, &task.id))?;
                    }
                }
            }
        }
        self.evidence.set(calibration.clone())?;
        tracing::info!(
            index = point.index,
            update = point.update,
            rollouts = run.rollouts(),
            profiler_failures = calibration.profiler.failures,
            "router re-anchored"
        );
        Ok((calibration, run.rollouts()))
    }

    fn check_members(&self, calibration: &Calibration) -> Result<()> {
        if calibration.member_ids() != self.pool.ids() {
            return Err(Error::calibration(
                "members",
                "the calibration's members differ from the pool's; expected a calibration of this pool",
            ));
        }
        Ok(())
    }
}

#[async_trait]
impl Calibrate for Calibrator {
    fn name(&self) -> &str {
        &self.name
    }

    async fn calibrate(
        &self,
        point: &CalibrationPoint,
    ) -> harness_core::Result<CalibrationSummary> {
        if self.settings.mode == ReanchorMode::Fixed
            && let Some(existing) = self.evidence.get()
        {
            // The fixed-profile baseline never re-anchors: report the evidence in use.
            return Ok(existing.calibration.summary(0, 0.0));
        }
        let started = Instant::now();
        let (calibration, rollouts) = self.run(point).await?;
        Ok(calibration.summary(rollouts, started.elapsed().as_secs_f64()))
    }

    fn snapshot(&self) -> harness_core::Result<serde_json::Value> {
        Ok(match self.evidence.get() {
            Some(e) => {
                serde_json::to_value(&e.calibration).unwrap_or_else(|_| unreachable!("plain data"))
            }
            None => serde_json::Value::Null,
        })
    }

    fn restore(&self, snapshot: &serde_json::Value) -> harness_core::Result<()> {
        if snapshot.is_null() {
            return Ok(());
        }
        let calibration = Calibration::from_json(&snapshot.to_string())?;
        self.check_members(&calibration)?;
        self.evidence.set(calibration)?;
        Ok(())
    }
}
