//! Your own router: implement [`HarnessSelector`] (which siblings rescue a task) and
//! [`Calibrate`] (re-anchor the selector's evidence on the current policy, paper Eq. 11), and
//! train with them in the rescue loop.
//!
//! ```text
//! cargo run --release --example custom_router
//! ```
//!
//! The pair here routes by evidence per kind of task: the calibrator runs every harness of the
//! pool on the validation tasks with the current policy and records each harness's success per
//! task tag; the selector ranks a task's candidates by their success on validation tasks of the
//! same tag (H0 excluded in rescue, Eq. 10). The policy is harness-testkit's harness-sensitive
//! policy: each task plants a failure ("quirk") that only a harness naming its cure repairs, so
//! a good router sends each task to the sibling that cures its quirk. The learner only tallies
//! which harness rescued which task (the `custom_learner` example trains).
//!
//! harness-router's Adaptive Harness Router is the paper's selector and calibrator (behaviour
//! profiles, LLM voters, Borda aggregation); the rule router and random selectors implement the
//! same traits.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use async_trait::async_trait;
use harness_core::{
    Calibrate, CalibrationPoint, CalibrationSummary, Group, GroupOrigin, Harness, HarnessId,
    HarnessSelector, Learner, Policy, Result, SelectionMode, SelectionRequest, Split, Task,
    UpdateReport, run_episode,
};
use harness_pool::SiblingPool;
use harness_rollout::{RescueConfig, Strategy, TrainingSetup, run_training};
use harness_testkit::ScriptedEnv;
use harness_testkit::harness_sensitive::{HarnessSensitivePolicy, Quirk, quirk_task};

/// Validation success per harness and task tag, written by the calibrator, read by the selector.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Evidence {
    /// `success[harness][tag]`: the harness's success rate on validation tasks of that tag.
    pub success: BTreeMap<HarnessId, BTreeMap<String, f64>>,
}

/// A task's tag: the quirk its instruction names (`paging`, `text`, ...), or `plain`.
pub fn tag(task: &Task) -> String {
    task.instruction
        .split("[quirk: ")
        .nth(1)
        .and_then(|s| s.split(']').next())
        .unwrap_or("plain")
        .to_string()
}

/// Ranks a task's candidates by validation success on tasks of the same tag.
pub struct EvidenceSelector {
    pool: SiblingPool,
    evidence: Arc<RwLock<Evidence>>,
}

#[async_trait]
impl HarnessSelector for EvidenceSelector {
    fn name(&self) -> &str {
        "evidence"
    }

    async fn select(&self, request: &SelectionRequest) -> Result<Vec<HarnessId>> {
        let evidence = self.evidence.read().unwrap_or_else(|e| e.into_inner());
        let tag = tag(&request.task);
        let mut candidates: Vec<(f64, HarnessId)> = self
            .pool
            .ids()
            .into_iter()
            .filter(|id| request.mode == SelectionMode::Inference || id != self.pool.base_id())
            .map(|id| {
                let score = evidence
                    .success
                    .get(&id)
                    .and_then(|by_tag| by_tag.get(&tag))
                    .copied()
                    .unwrap_or(0.0);
                (score, id)
            })
            .collect();
        // Best first; ties keep the pool's order (a stable sort), so the choice is reproducible.
        candidates.sort_by(|a, b| b.0.total_cmp(&a.0));
        Ok(candidates
            .into_iter()
            .take(request.k)
            .map(|(_, id)| id)
            .collect())
    }
}

/// Measures every harness on the validation tasks with the current policy.
pub struct ValidationCalibrator {
    pool: SiblingPool,
    policy: Arc<dyn Policy>,
    validation: Vec<Task>,
    evidence: Arc<RwLock<Evidence>>,
}

#[async_trait]
impl Calibrate for ValidationCalibrator {
    fn name(&self) -> &str {
        "validation"
    }

    async fn calibrate(&self, point: &CalibrationPoint) -> Result<CalibrationSummary> {
        let start = std::time::Instant::now();
        let env = ScriptedEnv::new(3);
        let mut evidence = Evidence::default();
        let mut overall = BTreeMap::new();
        let mut rollouts = 0;
        for harness in self.pool.members() {
            let mut by_tag: BTreeMap<String, (f64, f64)> = BTreeMap::new();
            for task in &self.validation {
                // Paired executions: every harness sees the same task with the same seed.
                let t = run_episode(self.policy.as_ref(), harness, &env, task, point.seed).await?;
                rollouts += 1;
                let entry = by_tag.entry(tag(task)).or_default();
                entry.0 += f64::from(t.reward());
                entry.1 += 1.0;
            }
            let total: f64 = by_tag.values().map(|(s, _)| s).sum();
            overall.insert(harness.id(), total / self.validation.len() as f64);
            evidence.success.insert(
                harness.id(),
                by_tag.into_iter().map(|(k, (s, n))| (k, s / n)).collect(),
            );
        }
        *self.evidence.write().unwrap_or_else(|e| e.into_inner()) = evidence;
        Ok(CalibrationSummary {
            index: point.index,
            update: point.update,
            rollouts,
            validation_success: overall,
            usage: BTreeMap::new(),
            seconds: start.elapsed().as_secs_f64(),
        })
    }

    // The evidence goes into the run's checkpoint, so a resumed run routes as before the crash.
    fn snapshot(&self) -> Result<serde_json::Value> {
        let evidence = self.evidence.read().unwrap_or_else(|e| e.into_inner());
        serde_json::to_value(&*evidence)
            .map_err(|e| harness_core::Error::invalid("evidence", e.to_string()))
    }

    fn restore(&self, snapshot: &serde_json::Value) -> Result<()> {
        let evidence: Evidence = serde_json::from_value(snapshot.clone())
            .map_err(|e| harness_core::Error::invalid("evidence", e.to_string()))?;
        *self.evidence.write().unwrap_or_else(|e| e.into_inner()) = evidence;
        Ok(())
    }
}

/// `(task tag, harness name)` of every successful rescue rollout, in order.
type Rescues = Arc<Mutex<Vec<(String, String)>>>;

/// A learner that trains nothing and tallies the rescued groups it is handed.
struct Tally {
    pool: SiblingPool,
    rescues: Rescues,
    steps: u64,
}

#[async_trait]
impl Learner for Tally {
    async fn update(&mut self, groups: &[Group]) -> Result<UpdateReport> {
        let mut rescues = self.rescues.lock().unwrap_or_else(|e| e.into_inner());
        for group in groups.iter().filter(|g| g.origin == GroupOrigin::Rescue) {
            for t in group.trajectories.iter().filter(|t| t.is_success()) {
                let name = self
                    .pool
                    .get(&t.harness_id)
                    .map_or("?", |h| h.name.as_str());
                rescues.push((tag(&group.task), name.to_string()));
            }
        }
        self.steps += 1;
        Ok(UpdateReport {
            applied: true,
            optimizer_steps: self.steps,
            policy_version: self.steps,
            ..UpdateReport::default()
        })
    }

    fn save_checkpoint(&self, _dir: &Path) -> Result<()> {
        Ok(())
    }

    fn load_checkpoint(&mut self, _dir: &Path) -> Result<()> {
        Ok(())
    }
}

/// Two quirks, each cured by one sibling's prompt; H0 cures neither.
fn setup() -> (SiblingPool, HarnessSensitivePolicy, Vec<Task>, Vec<Task>) {
    let h0 = Harness::new("H0", "Count the items and submit the count.");
    let pager = Harness::new(
        "pager",
        "Count the items and submit the count. Read every page of a listing.",
    );
    let submitter = Harness::new(
        "submitter",
        "Count the items and submit the count. Always answer with the submit tool.",
    );
    let pool = SiblingPool::starter(h0, [pager, submitter], serde_json::Value::Null)
        .expect("a valid pool");
    let policy = HarnessSensitivePolicy::new()
        .cured_by(Quirk::StopsAfterFirstPage, &["every page"])
        .cured_by(Quirk::AnswersInText, &["submit tool"]);
    let env = ScriptedEnv::new(3);
    let make = |split: Split, n: usize| -> Vec<Task> {
        (0..n)
            .map(|i| {
                let quirk = [Quirk::StopsAfterFirstPage, Quirk::AnswersInText][i % 2];
                let mut task = quirk_task(&env, &format!("{split}-{i}"), Some(quirk));
                task.split = split;
                task
            })
            .collect()
    };
    (
        pool,
        policy,
        make(Split::Train, 4),
        make(Split::Validation, 4),
    )
}

/// Rescue training with the evidence router; the successful rescues by (tag, sibling).
pub async fn run(run_dir: &Path) -> anyhow::Result<Vec<(String, String)>> {
    let (pool, policy, train, validation) = setup();
    let policy: Arc<dyn Policy> = Arc::new(policy);
    let evidence = Arc::new(RwLock::new(Evidence::default()));
    let rescues = Rescues::default();
    let cfg = RescueConfig {
        seed: 11,
        updates: 2,
        group_size: 1,
        batch_tasks: 4,
        strategy: Strategy::Router {
            allocation: Default::default(),
        },
        calibrate_every: 1,
        ..RescueConfig::default()
    };
    let setup = TrainingSetup {
        policy: policy.clone(),
        environments: vec![Arc::new(ScriptedEnv::new(3))],
        selector: Some(Arc::new(EvidenceSelector {
            pool: pool.clone(),
            evidence: evidence.clone(),
        })),
        calibrator: Some(Arc::new(ValidationCalibrator {
            pool: pool.clone(),
            policy: policy.clone(),
            validation: validation.clone(),
            evidence,
        })),
        learner: Box::new(Tally {
            pool: pool.clone(),
            rescues: rescues.clone(),
            steps: 0,
        }),
        pool,
        train_tasks: train,
        validation_tasks: validation,
        weight_sync: None,
    };
    run_training(cfg, setup, run_dir, false).await?;
    let rescues = rescues.lock().unwrap_or_else(|e| e.into_inner()).clone();
    Ok(rescues)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("custom-router-{}", std::process::id()));
    let rescues = run(&dir).await?;
    println!(
        "successful rescues (task tag -> sibling), run files in {}:",
        dir.display()
    );
    for (tag, harness) in rescues {
        println!("  {tag:8} -> {harness}");
    }
    Ok(())
}
