//! [`RescueTrainer`]: Algorithm 1 of the paper, with every strategy of [`crate::Strategy`].

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use harness_core::{
    Calibrate, CalibrationPoint, Environment, EpisodeOptions, Group, GroupOrigin, Harness,
    HarnessId, HarnessSelector, Learner, Policy, RescueObjective, SelectionMode, SelectionRequest,
    Split, Task, TokenScoring, Trajectory, UpdateReport, pass_and_avg_at_k, run_episode_with,
};
use harness_pool::SiblingPool;

use crate::checkpoint::{
    CHECKPOINT_FORMAT, CheckpointState, LEARNER_DIR, latest_checkpoint, learner_dir_at,
    write_checkpoint,
};
use crate::config::{Allocation, RescueConfig, Strategy, resolve_harness};
use crate::error::{Error, Result};
use crate::files::{COST_FILE, GROUPS_FILE, METRICS_FILE, RunFiles, TRAJECTORIES_FILE};
use crate::metrics::{CalibrationRecord, Cost, EvalRecord, GroupRecord, UpdateRecord, summarize};
use crate::order::{Cursor, TaskOrder};
use crate::seed::{Phase, derive_seed, mix};
use crate::select::{check_rescue_selection, sample_distinct};
use crate::sync::{WeightSync, sync_with_retry};

/// What a run trains with: the policy that rolls out, the environments, the pool, the tasks,
/// and the seams to the learner, router and engine.
pub struct TrainingSetup {
    /// The policy that acts in episodes (sharing weights with the learner in process, or a
    /// remote engine kept current by `weight_sync`).
    pub policy: Arc<dyn Policy>,
    /// Environments, looked up by [`Task::env`].
    pub environments: Vec<Arc<dyn Environment>>,
    /// The fixed Sibling Harness Pool; its base is H0.
    pub pool: SiblingPool,
    /// Training tasks (never test tasks).
    pub train_tasks: Vec<Task>,
    /// Validation tasks for Pass@k / Avg@k under H0 (`eval_every`).
    pub validation_tasks: Vec<Task>,
    /// The policy update.
    pub learner: Box<dyn Learner>,
    /// The router, for the `router` strategy.
    pub selector: Option<Arc<dyn HarnessSelector>>,
    /// Re-anchors the router's evidence when due and at the end.
    pub calibrator: Option<Arc<dyn Calibrate>>,
    /// Brings new weights to a remote engine after each update.
    pub weight_sync: Option<Arc<dyn WeightSync>>,
}

/// Where a run stands; checkpointed with [`CheckpointState`].
#[derive(Debug, Clone, Default)]
struct Progress {
    update: u64,
    policy_version: u64,
    calibrations: u32,
    finished: bool,
    cost: Cost,
}

/// One episode to run.
struct Job<'a> {
    task: &'a Task,
    harness: &'a Harness,
    seed: u64,
}

/// A task's group as formed in one update.
struct Formed {
    record: GroupRecord,
    group: Group,
    /// Every rollout of the task (base then rescue), for `trajectories.jsonl`.
    all: Vec<Trajectory>,
}

/// Complementary Harness Rescue Training (Algorithm 1) over a run directory.
///
/// Per update: re-anchor the calibrator when due; draw `batch_tasks` tasks; K rollouts under H0
/// per task, concurrently; rescue all-failure groups per the strategy (Eq. 5); one learner
/// update on the retained groups; sync the weights; append the run files; evaluate and
/// checkpoint when due. After the last update: the final re-anchoring and a last checkpoint.
///
/// # Reproducibility
/// Every seed is derived from the config (see [`crate::seed`]) and a resumed run replays the
/// lost updates exactly, provided the policy's turns depend only on their request and seed.
/// grpo-candle's `CandlePolicy` batches concurrent requests, and a row's log-probs can differ in
/// the last bit with the batch it was decoded in; with `concurrency > 1` its runs agree in
/// their sampled tokens (in practice) but not bit for bit in `q`. Use `concurrency: 1` where
/// bit-identical files matter more than speed.
pub struct RescueTrainer {
    cfg: RescueConfig,
    policy: Arc<dyn Policy>,
    envs: BTreeMap<String, Arc<dyn Environment>>,
    pool: SiblingPool,
    tasks: Vec<Task>,
    validation: Vec<Task>,
    learner: Box<dyn Learner>,
    selector: Option<Arc<dyn HarnessSelector>>,
    calibrator: Option<Arc<dyn Calibrate>>,
    sync: Option<Arc<dyn WeightSync>>,
    /// A resumed run's engine may hold other weights than the checkpoint's (a restarted vLLM
    /// or SGLang starts from its launch weights): push them before anything samples.
    sync_pending: bool,
    run_dir: PathBuf,
    files: RunFiles,
    order: TaskOrder,
    /// Dynamic sampling's extra draws (beyond the first batch of an update).
    extra_order: TaskOrder,
    mixture: Vec<(HarnessId, usize)>,
    progress: Progress,
    options: EpisodeOptions,
}

impl RescueTrainer {
    /// A fresh run in `run_dir`, which must not hold a run already (resume it instead).
    pub fn new(cfg: RescueConfig, setup: TrainingSetup, run_dir: impl AsRef<Path>) -> Result<Self> {
        let trainer = Self::build(cfg, setup, run_dir.as_ref())?;
        if trainer.files.has_content() {
            return Err(Error::run_dir(
                &trainer.run_dir,
                "already holds a run (run files or checkpoints); resume it or choose an empty directory",
            ));
        }
        Ok(trainer)
    }

    /// Continue the run in `run_dir` from its latest complete checkpoint (a fresh start when
    /// there is none): the learner, the calibrator, the task order and the counters are
    /// restored and the run files are cut back to the checkpoint's offsets, so the run goes on
    /// exactly as if it had never stopped.
    pub fn resume(
        cfg: RescueConfig,
        setup: TrainingSetup,
        run_dir: impl AsRef<Path>,
    ) -> Result<Self> {
        let mut trainer = Self::build(cfg, setup, run_dir.as_ref())?;
        // The serving side may hold any weights (another method's, a lost update's): the
        // restored version is pushed once before anything samples, version 0 included.
        trainer.sync_pending = trainer.sync.is_some();
        let Some((dir, state)) = latest_checkpoint(&trainer.run_dir)? else {
            trainer.files.truncate_to(&Default::default())?;
            return Ok(trainer);
        };
        let state_file = dir.join(crate::checkpoint::STATE_FILE);
        let config = trainer.config_json();
        if let Some(field) = differing_field(&state.config, &config) {
            return Err(Error::run_dir(
                &state_file,
                format!(
                    "was written with another config (field `{field}`: {} there, {} now); only `updates` may change on resume",
                    state.config.get(&field).unwrap_or(&serde_json::Value::Null),
                    config.get(&field).unwrap_or(&serde_json::Value::Null)
                ),
            ));
        }
        if state.pool != trainer.pool.ids() {
            return Err(Error::run_dir(
                &state_file,
                format!(
                    "was written with pool members {:?}, but the run was given {:?}",
                    state.pool,
                    trainer.pool.ids()
                ),
            ));
        }
        trainer.learner.load_checkpoint(&dir.join(LEARNER_DIR))?;
        if let Some(c) = &trainer.calibrator {
            c.restore(&state.calibrator)?;
        }
        trainer.files.truncate_to(&state.offsets)?;
        trainer.order = TaskOrder::new(
            trainer.cfg.seed,
            trainer.tasks.len(),
            trainer.cfg.shuffle,
            state.cursor,
        );
        trainer.extra_order = TaskOrder::extra(
            trainer.cfg.seed,
            trainer.tasks.len(),
            trainer.cfg.shuffle,
            state.extra_cursor,
        );
        trainer.progress = Progress {
            update: state.update,
            policy_version: state.policy_version,
            calibrations: state.calibrations,
            // A run extended with more updates is not finished any more.
            finished: state.finished && state.update >= trainer.cfg.updates,
            cost: state.cost,
        };
        // cost.json may be ahead of the checkpoint (written after a lost update).
        trainer.write_cost()?;
        tracing::info!(checkpoint = %dir.display(), update = state.update, "resumed");
        Ok(trainer)
    }

    fn build(cfg: RescueConfig, setup: TrainingSetup, run_dir: &Path) -> Result<Self> {
        cfg.validate(&setup.pool)?;
        // A learner that cannot compute the objective, or a policy that cannot re-render for
        // `h0`, is refused before anything is sampled.
        setup.learner.check_rescue_objective(cfg.rescue_objective)?;
        if cfg.rescue_objective == RescueObjective::H0 {
            setup
                .policy
                .render_prompt(&harness_core::PolicyRequest {
                    messages: vec![harness_core::ChatMessage {
                        role: harness_core::Role::User,
                        content: "probe".into(),
                        name: None,
                    }],
                    tools: Vec::new(),
                    max_new_tokens: 1,
                    max_context_tokens: usize::MAX,
                    sampling: cfg.sampling.clone(),
                    seed: 0,
                })
                .map_err(|e| {
                    Error::config(
                        "rescue_objective",
                        format!("`h0` re-renders rescued turns with the policy: {e}"),
                    )
                })?;
        }
        if cfg.strategy.uses_selector() && setup.selector.is_none() {
            return Err(Error::config(
                "strategy",
                "the router strategy needs a harness selector; none was given",
            ));
        }
        if setup.train_tasks.is_empty() {
            return Err(Error::config("train_tasks", "no training tasks were given"));
        }
        let mut envs = BTreeMap::new();
        for env in setup.environments {
            envs.insert(env.name().to_string(), env);
        }
        for task in setup.train_tasks.iter().chain(&setup.validation_tasks) {
            if task.split == Split::Test {
                return Err(Error::config(
                    "train_tasks",
                    format!(
                        "task `{}` is a test task; test tasks never feed training or the router",
                        task.id
                    ),
                ));
            }
            if !envs.contains_key(&task.env) {
                return Err(Error::UnknownEnvironment {
                    task: task.id.clone(),
                    env: task.env.clone(),
                    available: envs.keys().cloned().collect(),
                });
            }
        }
        let mixture = match &cfg.strategy {
            Strategy::FixedMixture { mixture } => mixture
                .iter()
                .map(|e| {
                    resolve_harness(&setup.pool, &e.harness)
                        .map(|id| (id, e.rollouts))
                        .map_err(|m| Error::config("strategy.mixture", m))
                })
                .collect::<Result<Vec<_>>>()?,
            _ => Vec::new(),
        };
        let order = TaskOrder::new(
            cfg.seed,
            setup.train_tasks.len(),
            cfg.shuffle,
            Cursor::default(),
        );
        let extra_order = TaskOrder::extra(
            cfg.seed,
            setup.train_tasks.len(),
            cfg.shuffle,
            Cursor::default(),
        );
        let progress = Progress {
            cost: Cost {
                strategy: cfg.strategy.label(),
                ..Cost::default()
            },
            ..Progress::default()
        };
        Ok(RescueTrainer {
            options: EpisodeOptions {
                sampling: cfg.sampling.clone(),
            },
            files: RunFiles::new(run_dir)?,
            run_dir: run_dir.to_path_buf(),
            policy: setup.policy,
            envs,
            pool: setup.pool,
            tasks: setup.train_tasks,
            validation: setup.validation_tasks,
            learner: setup.learner,
            selector: setup.selector,
            calibrator: setup.calibrator,
            sync: setup.weight_sync,
            sync_pending: false,
            order,
            extra_order,
            mixture,
            progress,
            cfg,
        })
    }

    fn config_json(&self) -> serde_json::Value {
        serde_json::to_value(&self.cfg).unwrap_or_else(|_| unreachable!("the config is plain data"))
    }

    /// Updates applied so far.
    pub fn updates_done(&self) -> u64 {
        self.progress.update
    }

    /// The policy version rollouts use next.
    pub fn policy_version(&self) -> u64 {
        self.progress.policy_version
    }

    /// The learner.
    pub fn learner(&self) -> &dyn Learner {
        self.learner.as_ref()
    }

    /// The cost totals so far.
    pub fn cost(&self) -> &Cost {
        &self.progress.cost
    }

    /// The run directory.
    pub fn run_dir(&self) -> &Path {
        &self.run_dir
    }

    /// Run the remaining updates, the final re-anchoring and the last checkpoint.
    pub async fn run(&mut self) -> Result<Cost> {
        while self.progress.update < self.cfg.updates {
            self.step().await?;
        }
        self.finish().await
    }

    /// One update of Algorithm 1 (lines 3-12), with evaluation and a checkpoint when due.
    pub async fn step(&mut self) -> Result<UpdateRecord> {
        self.sync_if_pending().await?;
        self.check_version()?;
        let u = self.progress.update;
        let number = u + 1;
        // Line 3: re-anchor if calibration is due (line 1, the profiles before training, is the
        // calibration before update 0).
        let due = (u == 0 && self.cfg.initial_calibration)
            || (self.cfg.calibrate_every > 0
                && u > 0
                && u.is_multiple_of(self.cfg.calibrate_every));
        let calibration_seconds = if due {
            self.calibrate(false).await?
        } else {
            0.0
        };

        // Lines 4-11.
        let started = Instant::now();
        let version = self.progress.policy_version;
        let selector_usage_before = self.selector.as_ref().map(|s| s.usage());
        let mut formed = Vec::new();
        let batches = match self.cfg.strategy {
            Strategy::DynamicSampling { max_batches } => max_batches,
            _ => 1,
        };
        for b in 0..batches {
            // The first batch comes from the order every method shares; dynamic sampling's
            // extra batches from a stream of their own, so its later updates draw the same
            // tasks with the same seeds as every other method's (paired comparisons).
            let draws = if b == 0 {
                self.order.draw(self.cfg.batch_tasks)
            } else {
                self.extra_order.draw(self.cfg.batch_tasks)
            };
            formed.extend(self.form_groups(number, &draws, version).await?);
            if !matches!(self.cfg.strategy, Strategy::DynamicSampling { .. }) {
                break;
            }
            let effective = formed.iter().filter(|f| f.group.is_effective()).count();
            if effective >= self.cfg.batch_tasks {
                break;
            }
        }
        // The selector's LLM tokens of this batch (its counters are cumulative and not part
        // of a checkpoint, so the difference goes into the checkpointed cost).
        if let (Some(selector), Some(before)) = (&self.selector, selector_usage_before) {
            self.progress
                .cost
                .add_external_usage(&usage_delta(&selector.usage(), &before));
        }
        if matches!(self.cfg.strategy, Strategy::DynamicSampling { .. }) {
            // DAPO: train only on groups with reward variance, at most a batch of them.
            let mut kept = 0;
            for f in &mut formed {
                let keep = f.group.is_effective() && kept < self.cfg.batch_tasks;
                kept += usize::from(keep);
                if !keep {
                    f.record.retained = false;
                    f.record.retained_rewards.clear();
                    f.record.retained_harnesses.clear();
                    f.record.policy_tokens = 0;
                }
            }
        }
        let rollout_seconds = started.elapsed().as_secs_f64();

        // Line 12.
        let started = Instant::now();
        let groups: Vec<Group> = formed
            .iter()
            .filter(|f| f.record.retained)
            .map(|f| f.group.clone())
            .collect();
        let report = if groups.is_empty() {
            UpdateReport {
                policy_version: version,
                ..UpdateReport::default()
            }
        } else if self.cfg.rescue_objective.is_paper() {
            self.learner.update(&groups).await?
        } else {
            let scoring = self.rescue_scoring(&groups).await?;
            self.learner.update_scored(&groups, &scoring).await?
        };
        if report.applied {
            if let Some(sync) = &self.sync {
                sync_with_retry(sync.as_ref(), report.policy_version, self.cfg.sync_retry).await?;
            }
            self.progress.policy_version = report.policy_version;
            self.check_version()?;
        }
        let update_seconds = started.elapsed().as_secs_f64();

        let records: Vec<GroupRecord> = formed.iter().map(|f| f.record.clone()).collect();
        let mut metrics = summarize(number, &self.cfg.strategy.label(), &records, &report);
        metrics.policy_version = self.progress.policy_version;
        metrics.rescue_objective = self.cfg.rescue_objective;
        metrics.rollout_seconds = rollout_seconds;
        metrics.update_seconds = update_seconds;
        metrics.calibration_seconds = calibration_seconds;
        let trajectories: Vec<Trajectory> = formed.into_iter().flat_map(|f| f.all).collect();
        metrics.prefix_breaks = trajectories
            .iter()
            .map(|t| u64::from(t.counts.prefix_breaks))
            .sum();
        // Metrics last: a line in metrics.jsonl means the update's other lines are complete.
        self.files.append(TRAJECTORIES_FILE, &trajectories)?;
        self.files.append(GROUPS_FILE, &records)?;
        self.files
            .append(METRICS_FILE, std::slice::from_ref(&metrics))?;
        let is_mixture = matches!(self.cfg.strategy, Strategy::FixedMixture { .. });
        self.progress.cost.add_update(
            &metrics,
            is_mixture,
            self.cfg.group_size,
            self.cfg.batch_tasks,
        );
        self.progress.update = number;
        tracing::info!(
            update = number,
            eg_rate = metrics.eg_rate,
            rescue_trigger_rate = metrics.rescue_trigger_rate,
            loss = metrics.loss,
            "update done"
        );

        if self.cfg.eval_every > 0
            && number.is_multiple_of(self.cfg.eval_every)
            && !self.validation.is_empty()
        {
            self.evaluate().await?;
        }
        self.write_cost()?;
        if self.cfg.checkpoint_every > 0 && number.is_multiple_of(self.cfg.checkpoint_every) {
            self.checkpoint()?;
        }
        Ok(metrics)
    }

    /// Algorithm 1, line 14: re-anchor with the final policy, then the last checkpoint and
    /// `cost.json`. Runs once; a finished run resumed does nothing more.
    pub async fn finish(&mut self) -> Result<Cost> {
        self.sync_if_pending().await?;
        self.check_version()?;
        if !self.progress.finished {
            if self.cfg.final_calibration {
                self.calibrate(true).await?;
            }
            self.progress.finished = true;
            self.write_cost()?;
            self.checkpoint()?;
        }
        Ok(self.progress.cost.clone())
    }

    /// How the learner scores each retained trajectory under `rescue_objective`: the paper's
    /// scoring for every trajectory of a group that is not a rescue and for every H0 trajectory;
    /// for a sibling's trajectory in a rescue group, `masked` scores from its first
    /// intervention on ([`harness_core::first_intervention`]) and `h0` re-renders each turn
    /// under H0 ([`harness_core::h0_request`], tokenized by [`Policy::render_prompt`]; the tools
    /// H0 shows come from a fresh session of the task at the trajectory's seed).
    async fn rescue_scoring(&self, groups: &[Group]) -> Result<Vec<Vec<TokenScoring>>> {
        let base = self.pool.base();
        let base_id = base.id();
        let mut out = Vec::with_capacity(groups.len());
        for group in groups {
            let mut scoring = Vec::with_capacity(group.trajectories.len());
            let mut env_tools: Option<Vec<harness_core::ToolSpec>> = None;
            for t in &group.trajectories {
                if group.origin != GroupOrigin::Rescue || t.harness_id == base_id {
                    scoring.push(TokenScoring::Generating);
                    continue;
                }
                let sibling = self.pool.get(&t.harness_id).ok_or_else(|| {
                    Error::config(
                        "rescue_objective",
                        format!(
                            "rescued trajectory of task `{}` names harness {} ({}), which is not in the pool",
                            t.task_id, t.harness_id, t.harness_name
                        ),
                    )
                })?;
                scoring.push(match self.cfg.rescue_objective {
                    RescueObjective::Generating => TokenScoring::Generating,
                    RescueObjective::Masked => {
                        let first =
                            harness_core::first_intervention(t, base, sibling, &group.task)?;
                        TokenScoring::FromTurn {
                            first_turn: first.map_or(t.turns.len(), |i| i.first_turn(t)),
                        }
                    }
                    RescueObjective::H0 => {
                        if env_tools.is_none() {
                            let env = self.envs.get(&group.task.env).ok_or_else(|| {
                                Error::UnknownEnvironment {
                                    task: group.task.id.clone(),
                                    env: group.task.env.clone(),
                                    available: self.envs.keys().cloned().collect(),
                                }
                            })?;
                            env_tools = Some(env.reset(&group.task, t.seed).await?.tools());
                        }
                        let tools = env_tools.as_deref().unwrap_or_default();
                        let mut contexts = Vec::with_capacity(t.turns.len());
                        for k in 0..t.turns.len() {
                            contexts.push(
                                match harness_core::h0_request(
                                    t,
                                    k,
                                    base,
                                    sibling,
                                    &group.task,
                                    tools,
                                )? {
                                    Some(request) => self.policy.render_prompt(&request)?,
                                    None => Vec::new(),
                                },
                            );
                        }
                        TokenScoring::H0 { contexts }
                    }
                });
            }
            out.push(scoring);
        }
        Ok(out)
    }

    /// Refuse to sample when the acting policy reports a weights version
    /// ([`Policy::weights_version`]) other than the learner's: its sync was lost.
    fn check_version(&self) -> Result<()> {
        match self.policy.weights_version() {
            Some(found) if found != self.progress.policy_version => Err(Error::StaleWeights {
                policy: self.policy.name().to_string(),
                expected: self.progress.policy_version,
                found,
            }),
            _ => Ok(()),
        }
    }

    /// Push the restored weights to the serving engine once after a resume.
    async fn sync_if_pending(&mut self) -> Result<()> {
        if self.sync_pending
            && let Some(sync) = &self.sync
        {
            sync_with_retry(
                sync.as_ref(),
                self.progress.policy_version,
                self.cfg.sync_retry,
            )
            .await?;
        }
        self.sync_pending = false;
        Ok(())
    }

    async fn calibrate(&mut self, is_final: bool) -> Result<f64> {
        let Some(calibrator) = self.calibrator.clone() else {
            return Ok(0.0);
        };
        let index = self.progress.calibrations;
        let point = CalibrationPoint {
            index,
            update: self.progress.update,
            is_final,
            seed: derive_seed(
                self.cfg.seed,
                Phase::Calibrate,
                self.progress.update,
                "",
                u64::from(index),
                0,
            ),
            // The checkpoint of this very update, when one was written (checkpoint_every
            // dividing calibrate_every); the initial calibration measures the starting policy.
            checkpoint: learner_dir_at(&self.run_dir, self.progress.update),
        };
        let started = Instant::now();
        let summary = calibrator.calibrate(&point).await?;
        let seconds = started.elapsed().as_secs_f64();
        self.progress.calibrations += 1;
        self.progress.cost.add_calibration(&summary);
        self.files.append(
            METRICS_FILE,
            &[CalibrationRecord {
                kind: "calibration".into(),
                update: self.progress.update,
                index,
                is_final,
                rollouts: summary.rollouts,
                validation_success: summary.validation_success,
                calibration_seconds: summary.seconds,
            }],
        )?;
        Ok(seconds)
    }

    /// Validation Pass@k / Avg@k under H0 with the current policy.
    async fn evaluate(&mut self) -> Result<()> {
        let started = Instant::now();
        let base = self.pool.base().clone();
        let number = self.progress.update;
        let mut jobs = Vec::new();
        for (i, task) in self.validation.iter().enumerate() {
            for slot in 0..self.cfg.eval_k {
                jobs.push(Job {
                    task,
                    harness: &base,
                    seed: derive_seed(
                        self.cfg.seed,
                        Phase::Eval,
                        number,
                        &task.id,
                        i as u64,
                        slot as u64,
                    ),
                });
            }
        }
        let trajectories = self.run_jobs(jobs).await?;
        let per_task: Vec<Vec<f32>> = trajectories
            .chunks(self.cfg.eval_k)
            .map(|c| c.iter().map(Trajectory::reward).collect())
            .collect();
        let (pass, avg) = pass_and_avg_at_k(&per_task);
        let seconds = started.elapsed().as_secs_f64();
        self.progress.cost.eval_rollouts += trajectories.len() as u64;
        self.progress.cost.eval_seconds += seconds;
        self.files.append(
            METRICS_FILE,
            &[EvalRecord {
                kind: "eval".into(),
                update: number,
                k: self.cfg.eval_k,
                tasks: per_task.len(),
                pass_at_k: pass,
                avg_at_k: avg,
                eval_seconds: seconds,
            }],
        )?;
        Ok(())
    }

    fn write_cost(&self) -> Result<()> {
        let json = serde_json::to_vec_pretty(&self.progress.cost)
            .unwrap_or_else(|_| unreachable!("the cost is plain data"));
        harness_core::fsutil::write_atomic(&self.files.path(COST_FILE), &json)?;
        Ok(())
    }

    fn checkpoint(&self) -> Result<PathBuf> {
        let state = CheckpointState {
            format: CHECKPOINT_FORMAT,
            update: self.progress.update,
            cursor: self.order.cursor(),
            extra_cursor: self.extra_order.cursor(),
            policy_version: self.progress.policy_version,
            calibrations: self.progress.calibrations,
            finished: self.progress.finished,
            offsets: self.files.offsets()?,
            cost: self.progress.cost.clone(),
            calibrator: match &self.calibrator {
                Some(c) => c.snapshot()?,
                None => serde_json::Value::Null,
            },
            config: self.config_json(),
            pool: self.pool.ids(),
        };
        let dir = write_checkpoint(
            &self.run_dir,
            &state,
            self.learner.as_ref(),
            self.cfg.keep_checkpoints,
        )?;
        tracing::info!(checkpoint = %dir.display(), update = state.update, "checkpoint written");
        Ok(dir)
    }

    /// Run episodes concurrently (at most `concurrency` in flight), results in job order, each
    /// stamped with the policy version it sampled.
    async fn run_jobs(&self, jobs: Vec<Job<'_>>) -> Result<Vec<Trajectory>> {
        let version = self.progress.policy_version;
        let policy = self.policy.as_ref();
        let options = &self.options;
        let envs = &self.envs;
        futures::stream::iter(jobs.into_iter().map(|job| async move {
            let env = envs
                .get(&job.task.env)
                .ok_or_else(|| Error::UnknownEnvironment {
                    task: job.task.id.clone(),
                    env: job.task.env.clone(),
                    available: envs.keys().cloned().collect(),
                })?;
            // Each episode resets its own session: a fresh initial state for every rollout.
            run_episode_with(
                policy,
                job.harness,
                env.as_ref(),
                job.task,
                job.seed,
                options,
            )
            .await
            .map(|mut t| {
                t.policy_version = Some(policy.weights_version().unwrap_or(version));
                t
            })
            .map_err(Error::from)
        }))
        .buffered(self.cfg.concurrency)
        .try_collect()
        .await
    }

    /// Lines 5-10 for a batch of drawn tasks.
    async fn form_groups(
        &self,
        number: u64,
        draws: &[(usize, u64)],
        version: u64,
    ) -> Result<Vec<Formed>> {
        let k = self.cfg.group_size;
        let seed = self.cfg.seed;
        let base = self.pool.base();
        let harness = |id: &HarnessId| {
            self.pool
                .get(id)
                .unwrap_or_else(|| unreachable!("ids were checked against the pool"))
        };
        // Line 5 (or a fixed mixture's allocation).
        let mut base_slots: Vec<Vec<&Harness>> = Vec::new();
        let mut jobs = Vec::new();
        for &(t, draw) in draws {
            let task = &self.tasks[t];
            let slots: Vec<&Harness> = if self.mixture.is_empty() {
                vec![base; k]
            } else {
                self.mixture
                    .iter()
                    .flat_map(|(id, n)| std::iter::repeat_n(harness(id), *n))
                    .collect()
            };
            for (j, h) in slots.iter().enumerate() {
                jobs.push(Job {
                    task,
                    harness: h,
                    seed: derive_seed(seed, Phase::Base, number, &task.id, draw, j as u64),
                });
            }
            base_slots.push(slots);
        }
        let mut base_runs = self.run_jobs(jobs).await?.into_iter();
        let base_groups: Vec<Vec<Trajectory>> = base_slots
            .iter()
            .map(|s| base_runs.by_ref().take(s.len()).collect())
            .collect();

        // Lines 6-7: which tasks are rescued, and with which harnesses.
        let rescue_strategy = matches!(
            self.cfg.strategy,
            Strategy::H0Rescue | Strategy::RandomHarness | Strategy::Router { .. }
        );
        let mut chosen: Vec<Option<(Vec<HarnessId>, Vec<HarnessId>)>> = Vec::new();
        for (&(t, draw), group) in draws.iter().zip(&base_groups) {
            let task = &self.tasks[t];
            if !rescue_strategy || group.iter().any(Trajectory::is_success) {
                chosen.push(None);
                continue;
            }
            let select_seed = derive_seed(seed, Phase::Select, number, &task.id, draw, 0);
            let (selected, per_rollout) = match self.cfg.strategy {
                Strategy::H0Rescue => (vec![base.id()], vec![base.id(); k]),
                Strategy::RandomHarness => {
                    let aux: Vec<HarnessId> = self.pool.auxiliaries().map(Harness::id).collect();
                    let ids = sample_distinct(&aux, k, select_seed);
                    check_rescue_selection("random_harness", &task.id, k, &ids, &self.pool)?;
                    (ids.clone(), ids)
                }
                Strategy::Router { allocation } => {
                    let (m, n) = match allocation {
                        Allocation::TopK => (k, 1),
                        Allocation::TopMXN { m, n } => (m, n),
                    };
                    let selector = self
                        .selector
                        .as_ref()
                        .unwrap_or_else(|| unreachable!("checked when the run was built"));
                    let ids = selector
                        .select(&SelectionRequest {
                            task: task.clone(),
                            k: m,
                            mode: SelectionMode::Rescue,
                            seed: select_seed,
                        })
                        .await?;
                    check_rescue_selection(selector.name(), &task.id, m, &ids, &self.pool)?;
                    let per: Vec<HarnessId> = ids
                        .iter()
                        .flat_map(|id| std::iter::repeat_n(id.clone(), n))
                        .collect();
                    (ids, per)
                }
                _ => unreachable!("only rescue strategies rescue"),
            };
            chosen.push(Some((selected, per_rollout)));
        }

        // Line 8: one fresh rollout per rescue slot, from a new session and a new seed.
        let mut jobs = Vec::new();
        for ((&(t, draw), group), choice) in draws.iter().zip(&base_groups).zip(&chosen) {
            let Some((_, per)) = choice else { continue };
            let task = &self.tasks[t];
            let used: HashSet<u64> = group.iter().map(|tr| tr.seed).collect();
            for (j, id) in per.iter().enumerate() {
                let mut s = derive_seed(seed, Phase::Rescue, number, &task.id, draw, j as u64);
                // Phases already separate the streams; this makes "never a base seed" certain.
                while used.contains(&s) {
                    s = mix(s);
                }
                jobs.push(Job {
                    task,
                    harness: harness(id),
                    seed: s,
                });
            }
        }
        let mut rescue_runs = self.run_jobs(jobs).await?.into_iter();

        // Line 10: Eq. 5.
        let mut out = Vec::with_capacity(draws.len());
        for ((&(t, draw), base_group), choice) in draws.iter().zip(base_groups).zip(chosen) {
            let task = self.tasks[t].clone();
            let base_rewards: Vec<f32> = base_group.iter().map(Trajectory::reward).collect();
            let (origin, retained, rescue, selected) = match choice {
                Some((selected, per)) => {
                    let rescue: Vec<Trajectory> = rescue_runs.by_ref().take(per.len()).collect();
                    (GroupOrigin::Rescue, rescue.clone(), rescue, selected)
                }
                None => {
                    let origin = if self.mixture.is_empty() {
                        GroupOrigin::Base
                    } else {
                        GroupOrigin::Mixture
                    };
                    (origin, base_group.clone(), Vec::new(), Vec::new())
                }
            };
            let record = GroupRecord {
                update: number,
                task_id: task.id.clone(),
                draw,
                origin,
                base_rewards,
                rescue_harnesses: selected,
                rescue_rewards: rescue.iter().map(Trajectory::reward).collect(),
                retained: true,
                retained_rewards: retained.iter().map(Trajectory::reward).collect(),
                retained_harnesses: retained.iter().map(|t| t.harness_id.clone()).collect(),
                policy_tokens: retained.iter().map(Trajectory::policy_tokens).sum(),
                policy_version: version,
            };
            let mut all = base_group;
            all.extend(rescue);
            out.push(Formed {
                record,
                group: Group {
                    task,
                    trajectories: retained,
                    origin,
                },
                all,
            });
        }
        Ok(out)
    }
}

/// The first top-level field (other than `updates`) in which two configs differ.
fn differing_field(saved: &serde_json::Value, now: &serde_json::Value) -> Option<String> {
    let (Some(a), Some(b)) = (saved.as_object(), now.as_object()) else {
        return (saved != now).then(|| "(root)".to_string());
    };
    a.keys()
        .chain(b.keys())
        .filter(|k| k.as_str() != "updates")
        .find(|k| a.get(*k) != b.get(*k))
        .cloned()
}

/// Run a whole training: a fresh run, or with `resume` the continuation of the one in
/// `run_dir`. The folder is locked (`harness_core::fsutil::DirLock`) for the whole training,
/// so a second training on it, a concurrent `--resume` say, is refused at once, naming it.
pub async fn run_training(
    cfg: RescueConfig,
    setup: TrainingSetup,
    run_dir: impl AsRef<Path>,
    resume: bool,
) -> Result<Cost> {
    let run_dir = run_dir.as_ref();
    let _lock = harness_core::fsutil::DirLock::acquire(run_dir)?;
    let mut trainer = if resume {
        RescueTrainer::resume(cfg, setup, run_dir)?
    } else {
        RescueTrainer::new(cfg, setup, run_dir)?
    };
    trainer.run().await
}

/// Tokens spent per role between two cumulative snapshots.
fn usage_delta(
    after: &BTreeMap<String, harness_core::Usage>,
    before: &BTreeMap<String, harness_core::Usage>,
) -> BTreeMap<String, harness_core::Usage> {
    after
        .iter()
        .map(|(role, a)| {
            let b = before.get(role).copied().unwrap_or_default();
            let delta = harness_core::Usage {
                prompt_tokens: a.prompt_tokens.saturating_sub(b.prompt_tokens),
                completion_tokens: a.completion_tokens.saturating_sub(b.completion_tokens),
            };
            (role.clone(), delta)
        })
        .filter(|(_, d)| *d != harness_core::Usage::default())
        .collect()
}
