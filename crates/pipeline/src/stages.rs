//! The stages of the main job. Each reads the previous stage's files and writes its own (see
//! [`crate::layout`]), so a user can evolve once and train many policies on the pool.
//!
//! 1. [`evolve`]: Directional Harness Evolution from H0 into a frozen pool (Eqs. 2-4).
//! 2. [`calibrate`]: the first calibration of the router with the initial policy.
//! 3. [`train`]: rescue training of one method from the initial checkpoint (Algorithm 1).
//! 4. [`evaluate`]: test Pass@k / Avg@k under H0 of a trained policy, and for Harness-S the
//!    router's Rank-1..R (Table 5) with the final re-anchored profiles.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use grpo_candle::CandlePolicy;
use grpo_candle::learner::CandleLearner;
use grpo_candle::trainer::{Schedule, TrainerConfig};
use harness_core::{
    Calibrate, CalibrationPoint, EpisodeOptions, HarnessSelector, Policy, SamplingParams, Task,
    call_seed, pass_and_avg_at_k, run_episode_with,
};
use harness_evolve::exec::{Executor, SharedPolicy};
use harness_evolve::report::{round_summary, write_reports};
use harness_evolve::{Analyst, BuiltinEditor, Editor, Evolution, EvolveSettings, RuleAnalyst};
use harness_pool::SiblingPool;
use harness_rollout::{
    METRICS_FILE, RandomSelector, RescueConfig, RescueTrainer, SaveAndReload, Strategy,
    TrainingSetup, WeightSync,
};
use harness_router::{
    AdaptiveRouter, BuiltinProfiler, BuiltinVoter, Calibration, Calibrator, CalibratorSettings,
    EvidenceCell, LlmProfiler, LlmProfilerSettings, LlmVoter, LlmVoterSettings, PairedSettings,
    Profiler, RankEvalSettings, RankReport, ReanchorMode, RouterSettings, TokenCounter, Voter,
    evaluate_ranks,
};
use serde::{Deserialize, Serialize};

use crate::config::{Method, PoolSource, RolloutEngine};
use crate::error::{Error, Result, StageExt};
use crate::setup::Workbench;

/// Seeds of the test evaluation, apart from every training and calibration seed.
const TEST_SEED_SALT: u64 = 0x7e57_7e57_7e57_7e57;

/// One task's test outcome.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    /// The test task.
    pub task: String,
    /// The harness it ran under.
    pub harness: String,
    /// Successful attempts.
    pub successes: usize,
    /// Attempts.
    pub attempts: usize,
}

/// One line of `eval/test.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestRecord {
    /// The method's file name (`initial` for the checkpoint before training).
    pub method: String,
    /// Its label in the tables.
    pub label: String,
    /// `h0` (every task under H0) or `rank1` (each task under the router's Rank-1).
    pub mode: String,
    /// Attempts per task.
    pub k: usize,
    /// Test tasks.
    pub tasks: usize,
    /// Fraction of tasks with at least one success.
    pub pass_at_k: f64,
    /// Mean success over every attempt.
    pub avg_at_k: f64,
    /// Episodes run.
    pub rollouts: usize,
    /// Wall seconds.
    pub seconds: f64,
    /// Per task.
    pub per_task: Vec<TaskResult>,
}

/// Counts of choices at one decision point: `choice name -> episodes`.
pub type ChoiceCounts = BTreeMap<String, usize>;

/// One line of `eval/behaviour.jsonl`: what the H0 test episodes of one checkpoint chose at
/// each DBBench decision point (`harness_envs::labels::dbbench_decisions`), by task family
/// (paper Table 3's behaviour frequencies, measured where the planted behaviours are decided).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BehaviourRecord {
    /// The method's file name (`initial` before training).
    pub method: String,
    /// Its label in the tables.
    pub label: String,
    /// `h0`.
    pub mode: String,
    /// Episodes per family.
    pub episodes: BTreeMap<String, usize>,
    /// `family -> decision point -> choice -> episodes` (an episode counts once per point it
    /// reached).
    pub choices: BTreeMap<String, BTreeMap<String, ChoiceCounts>>,
    /// The checkpoint's probability of each planted family's good decision under H0, on the
    /// demonstration script's fixed contexts (`harness_warmstart::probe`; embedded default
    /// only, empty elsewhere).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub probe: BTreeMap<String, harness_warmstart::FamilyProbe>,
}

/// One line of `eval/routing.jsonl`: the router's Rank-1 harness for one test task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingRecord {
    /// `before` or `after` training.
    pub stage: String,
    /// The routed method (`harness_s`).
    pub method: String,
    /// The test task.
    pub task: String,
    /// Its family (for the report only: the router never sees it).
    pub family: String,
    /// The Rank-1 harness's id.
    pub rank1: String,
    /// Its name.
    pub rank1_name: String,
    /// Whether Rank-1 is H0.
    pub rank1_is_h0: bool,
}

/// One line of `eval/rank.jsonl` (Table 5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankRecord {
    /// `before` (initial policy, first calibration) or `after` (trained policy, final
    /// re-anchoring).
    pub stage: String,
    /// The trained method (`harness_s`).
    pub method: String,
    /// harness-router's report.
    pub report: RankReport,
}

/// Build the pool into `evolve/pool`: evolution from H0 (writing its round reports and
/// diversity views into `evolve/`), or, with `evolve.source = "builtin"`, H0 with the
/// environment's hand-written siblings.
pub async fn evolve(wb: &Workbench) -> Result<SiblingPool> {
    let cfg = &wb.cfg;
    if cfg.evolve.source == PoolSource::Builtin {
        let pool = wb.builtin_pool()?;
        pool.save(wb.layout.pool()).at("evolve")?;
        wb.progress.println(format!(
            "pool: H0 and the environment's {} built-in siblings (no evolution)",
            pool.len() - 1
        ));
        return Ok(pool);
    }
    let mut settings = EvolveSettings::paper();
    settings.proposal_budgets = cfg.evolve.proposal_budgets.clone();
    settings.parent_slots = cfg.evolve.parent_slots;
    settings.train_tasks_per_round = cfg.evolve.train_tasks_per_round;
    settings.local_eval_tasks = cfg.evolve.local_eval_tasks;
    settings.local_eval_controls = cfg.evolve.local_eval_controls;
    settings.revisions = cfg.evolve.revisions;
    settings.seed = cfg.seed;
    settings.concurrency = cfg.rollout.concurrency;
    // The base harness's limits are the run's (the embedded default's compact H0 keeps episodes
    // short); Table 8's limits are for the paper preset's real checkpoints.
    settings.limits = None;
    let analyst: Arc<dyn Analyst> = match &wb.chat {
        Some(chat) if cfg.roles.asks_llm("analyst") => Arc::new(
            harness_evolve::LlmAnalyst::new(chat.clone(), settings.llm_retries)
                .with_batch(cfg.evolve.analyst_batch)
                .with_max_tokens(cfg.roles.max_tokens),
        ),
        _ => Arc::new(RuleAnalyst),
    };
    let editor: Arc<dyn Editor> = match &wb.chat {
        Some(chat) if cfg.roles.asks_llm("editor") => Arc::new(
            harness_evolve::LlmEditor::new(chat.clone(), settings.llm_retries)
                .with_max_tokens(cfg.roles.max_tokens),
        ),
        _ => Arc::new(BuiltinEditor),
    };
    let policy = wb.local_policy(&wb.checkpoint, "initial-policy")?;
    let evolution = Evolution {
        settings,
        executor: Executor {
            policy: Arc::new(SharedPolicy(policy as Arc<dyn Policy>)),
            env: wb.env.clone(),
            sampling: SamplingParams::greedy(),
            concurrency: cfg.rollout.concurrency,
        },
        analyst,
        editor,
        train: wb.train.clone(),
        validation: wb.validation.clone(),
    };
    let bar = wb.progress.spinner(format!(
        "evolution: {} rounds from H0",
        cfg.evolve.proposal_budgets.len()
    ));
    let started = Instant::now();
    let result = evolution.run(wb.base.clone()).await.at("evolve")?;
    bar.set_message("evolution: diversity views");
    let views = harness_evolve::diversity::measure(
        &evolution.executor,
        &result.pool,
        &result.validation_solved,
        &evolution.validation,
        evolution.validation_seed(),
        &SamplingParams {
            temperature: cfg.rollout.temperature,
            ..SamplingParams::default()
        },
    )
    .await
    .at("evolve")?;
    write_reports(&wb.layout.evolve(), &result, &views).at("evolve")?;
    bar.finish_and_clear();
    for round in &result.rounds {
        wb.progress
            .println(round_summary(round, evolution.validation.len()).trim_end());
    }
    for (role, u) in result.usage.iter().filter(|(_, u)| u.calls > 0) {
        wb.progress.println(format!(
            "evolution {role}: {} calls, {} malformed answers rejected and asked again, {} items \
             skipped after the retry budget, {} failed calls",
            u.calls, u.malformed, u.skipped, u.errors
        ));
    }
    wb.progress.println(format!(
        "evolution: {} members in {:.0}s; H0 solves {}/{} validation tasks, the pool's union {}/{}",
        result.pool.len(),
        started.elapsed().as_secs_f64(),
        views.coverage.h0_solved,
        views.tasks,
        views.coverage.oracle_union,
        views.tasks,
    ));
    Ok(result.pool)
}

/// The pool a stage trains on: `pool` from the config, else evolution's.
pub fn load_pool(wb: &Workbench) -> Result<SiblingPool> {
    let dir = wb.cfg.pool.clone().unwrap_or_else(|| wb.layout.pool());
    if !dir.join(harness_pool::POOL_FILE).is_file() {
        return Err(Error::input(
            "pool",
            &dir,
            "no pool here: run `harness-s evolve` first, or give `pool` (--pool) a saved pool directory",
        ));
    }
    SiblingPool::load(&dir).at("pool")
}

/// The router's profiler and voters: built-in, or LLM ones on the configured endpoint.
fn roles(
    wb: &Workbench,
    seed: u64,
    tokens: &TokenCounter,
) -> (Arc<dyn Profiler>, Vec<Arc<dyn Voter>>) {
    let voters = wb.cfg.roles.voters;
    let roles_max_tokens = wb.cfg.roles.max_tokens;
    let profiler: Arc<dyn Profiler> = match &wb.chat {
        Some(chat) if wb.cfg.roles.asks_llm("profiler") => Arc::new(LlmProfiler::new(
            chat.clone(),
            LlmProfilerSettings {
                seed,
                max_tokens: roles_max_tokens.unwrap_or(LlmProfilerSettings::default().max_tokens),
                ..LlmProfilerSettings::default()
            },
            tokens.clone(),
        )),
        _ => Arc::new(BuiltinProfiler::new(
            harness_envs::labels::builtin_labellers(),
        )),
    };
    let panel: Vec<Arc<dyn Voter>> = match &wb.chat {
        Some(chat) if wb.cfg.roles.asks_llm("voters") => (0..voters)
            .map(|v| {
                Arc::new(LlmVoter::new(
                    format!("llm-{v}"),
                    chat.clone(),
                    call_seed(seed, v as u32),
                    LlmVoterSettings {
                        max_tokens: roles_max_tokens
                            .unwrap_or(LlmVoterSettings::default().max_tokens),
                        ..LlmVoterSettings::default()
                    },
                    tokens.clone(),
                )) as Arc<dyn Voter>
            })
            .collect(),
        _ => BuiltinVoter::panel(voters, seed)
            .into_iter()
            .map(|v| Arc::new(v) as Arc<dyn Voter>)
            .collect(),
    };
    (profiler, panel)
}

fn calibrator(
    wb: &Workbench,
    pool: &SiblingPool,
    policy: Arc<dyn Policy>,
    profiler: Arc<dyn Profiler>,
    evidence: EvidenceCell,
    mode: ReanchorMode,
    dir: PathBuf,
) -> Result<Calibrator> {
    Calibrator::new(
        Arc::new(pool.clone()),
        policy,
        wb.environments(),
        wb.validation.clone(),
        profiler,
        evidence,
        CalibratorSettings {
            paired: PairedSettings {
                rollouts_per_task: wb.cfg.calibration.rollouts_per_task,
                concurrency: wb.cfg.rollout.concurrency,
                ..PairedSettings::default()
            },
            mode,
            dir: Some(dir),
            features: wb.cfg.calibration.task_features,
            ..CalibratorSettings::default()
        },
    )
    .at("calibrate")
}

/// The first calibration with the initial policy, into `calibration/`.
pub async fn calibrate(wb: &Workbench, pool: &SiblingPool) -> Result<Calibration> {
    let policy = wb.local_policy(&wb.checkpoint, "initial-policy")?;
    let tokens = TokenCounter::new();
    let (profiler, _) = roles(wb, wb.cfg.seed, &tokens);
    let cal = calibrator(
        wb,
        pool,
        policy,
        profiler,
        EvidenceCell::new(),
        ReanchorMode::Adaptive,
        wb.layout.calibration(),
    )?;
    let bar = wb.progress.spinner(format!(
        "calibration: {} members x {} validation tasks",
        pool.len(),
        wb.validation.len()
    ));
    let (calibration, rollouts) = cal
        .run(&CalibrationPoint {
            index: 0,
            update: 0,
            is_final: false,
            seed: harness_rollout::seed::derive_seed(
                wb.cfg.seed,
                harness_rollout::seed::Phase::Calibrate,
                0,
                "",
                0,
                0,
            ),
            checkpoint: Some(wb.checkpoint.clone()),
        })
        .await
        .at("calibrate")?;
    bar.finish_and_clear();
    let mut rates: Vec<String> = calibration
        .validation_success
        .iter()
        .map(|(id, rate)| {
            let name = pool.get(id).map_or(id.to_string(), |h| h.name.clone());
            format!("{name} {:.2}", rate)
        })
        .collect();
    rates.sort();
    wb.progress.println(format!(
        "calibration: {rollouts} paired rollouts; validation success: {}",
        rates.join(", ")
    ));
    let p = &calibration.profiler;
    if p.rejected_answers > 0 || p.failures > 0 || p.usage != Default::default() {
        wb.progress.println(format!(
            "calibration profiler {}: {} malformed answers rejected and asked again; {} siblings \
             left with an empty profile after the retry budget",
            p.profiler, p.rejected_answers, p.failures
        ));
    }
    Ok(calibration)
}

/// What a method trained.
#[derive(Debug, Clone)]
pub struct Trained {
    /// The method.
    pub method: Method,
    /// Its run directory.
    pub run_dir: PathBuf,
    /// The trained checkpoint.
    pub checkpoint: PathBuf,
    /// Wall seconds of the run (this invocation).
    pub seconds: f64,
}

/// The rescue-training configuration of a method.
pub fn rescue_config(wb: &Workbench, pool: &SiblingPool, method: Method) -> RescueConfig {
    let cfg = &wb.cfg;
    let strategy = match method {
        Method::Grpo => Strategy::Grpo,
        Method::H0Rescue => Strategy::H0Rescue,
        Method::RandomHarness => Strategy::RandomHarness,
        Method::HarnessS | Method::HarnessSFixed => Strategy::Router {
            allocation: router_allocation(cfg.train.group_size, pool.len().saturating_sub(1)),
        },
    };
    RescueConfig {
        seed: cfg.seed,
        updates: cfg.train.updates,
        group_size: cfg.train.group_size,
        batch_tasks: cfg.train.batch_tasks,
        strategy,
        concurrency: cfg.rollout.concurrency,
        sampling: SamplingParams {
            temperature: cfg.rollout.temperature,
            ..SamplingParams::default()
        },
        calibrate_every: cfg.calibration.every,
        // The first calibration is the `calibrate` stage's, loaded below.
        initial_calibration: false,
        final_calibration: true,
        eval_every: cfg.train.eval_every,
        eval_k: cfg.train.eval_k,
        checkpoint_every: cfg.train.checkpoint_every,
        ..RescueConfig::default()
    }
}

/// Top-K (one rescue rollout under each of K siblings, the paper's Top-8) when the pool has K
/// siblings; a smaller pool gets Top-m x n with the most siblings m that divide K (the paper's
/// "Top-4 x 2" allocation), so the rescue group keeps K rollouts.
pub fn router_allocation(k: usize, siblings: usize) -> harness_rollout::Allocation {
    if siblings >= k {
        return harness_rollout::Allocation::TopK;
    }
    let m = (1..=siblings.max(1))
        .rev()
        .find(|m| k.is_multiple_of(*m))
        .unwrap_or(1);
    harness_rollout::Allocation::TopMXN { m, n: k / m }
}

/// The router's counters of a routed method's training (this process's share of a resumed
/// run), in `train/<method>/`.
pub const ROUTER_STATS_FILE: &str = "router_stats.json";

/// One line on the voters' answers: how many were malformed and what was done with them.
pub fn voter_summary(s: &harness_router::RouterStats) -> String {
    let rejected: u64 = s.rejected.values().sum();
    let reasons = if s.rejected.is_empty() {
        String::new()
    } else {
        let by: Vec<String> = s
            .rejected
            .iter()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect();
        format!(" ({})", by.join(", "))
    };
    format!(
        "voters: {} selections, {} valid ballots; {rejected} malformed answers rejected and \
         asked again{reasons}; {} ballots dropped after the retry budget; {} selections filled \
         by validation success",
        s.selections, s.ballots, s.dropped, s.filled_selections
    )
}

/// Rescue-train `method` from the initial checkpoint into `train/<method>/`; `resume`
/// continues a killed run from its latest checkpoint. The run folder is locked (its `.lock`
/// file) for the whole stage: a second training run on the same folder, a concurrent
/// `--resume` say, is refused at once instead of interleaving checkpoints and run files.
pub async fn train(
    wb: &Workbench,
    pool: &SiblingPool,
    method: Method,
    resume: bool,
) -> Result<Trained> {
    let cfg = &wb.cfg;
    let run_dir = wb.layout.train(method);
    let _lock = harness_core::fsutil::DirLock::acquire(&run_dir).at("train")?;
    let rescue = rescue_config(wb, pool, method);
    rescue.validate(pool).at("train")?;
    if let Strategy::Router {
        allocation: harness_rollout::Allocation::TopMXN { m, n },
    } = rescue.strategy
    {
        wb.progress.println(format!(
            "{}: the pool has {} siblings for K = {}: rescue with Top-{m} x {n}",
            method.name(),
            pool.len() - 1,
            rescue.group_size
        ));
    }
    let local = wb.local_policy(&wb.checkpoint, method.name())?;
    let acting = wb.acting_policy(&local)?;
    let trainer_cfg = TrainerConfig {
        seed: cfg.seed,
        // Eq. 16's weight needs pi_old at the rollout temperature.
        temperature: f64::from(cfg.rollout.temperature),
        schedule: Schedule {
            lr: cfg.policy.learning_rate,
            total_steps: cfg.train.updates,
            ..TrainerConfig::default().schedule
        },
        ..TrainerConfig::default()
    };
    let learner = CandleLearner::new(local.clone(), trainer_cfg).at("train")?;
    let tokens = TokenCounter::new();
    type Routing = (Option<Arc<dyn HarnessSelector>>, Option<Arc<dyn Calibrate>>);
    let mut routed_by = None;
    let (selector, calibrator): Routing = match method {
        Method::HarnessS | Method::HarnessSFixed => {
            let first = Calibration::load_latest(&wb.layout.calibration())
                .at("train")?
                .ok_or_else(|| {
                    Error::input(
                        "train",
                        wb.layout.calibration(),
                        "no calibration here: run `harness-s calibrate` first",
                    )
                })?;
            let evidence = EvidenceCell::new();
            evidence.set(first).at("train")?;
            let (profiler, voters) = roles(wb, cfg.seed, &tokens);
            let mode = if method == Method::HarnessS {
                ReanchorMode::Adaptive
            } else {
                ReanchorMode::Fixed
            };
            let cal = calibrator(
                wb,
                pool,
                acting.clone(),
                profiler,
                evidence.clone(),
                mode,
                run_dir.join("calibrations"),
            )?;
            let router = Arc::new(
                AdaptiveRouter::new(evidence, voters, RouterSettings::default()).at("train")?,
            );
            routed_by = Some(router.clone());
            (
                Some(router as Arc<dyn HarnessSelector>),
                Some(Arc::new(cal) as Arc<dyn Calibrate>),
            )
        }
        Method::RandomHarness => (
            Some(Arc::new(RandomSelector::new(pool)) as Arc<dyn HarnessSelector>),
            None,
        ),
        Method::Grpo | Method::H0Rescue => (None, None),
    };
    let weight_sync = remote_sync(wb, &local, &acting, &run_dir)?;
    if let Some(sync) = &weight_sync
        && !resume
    {
        // The engine may still hold another method's trained weights: every method starts
        // from the initial checkpoint.
        sync.sync(0).await.at("train")?;
    }
    let setup = TrainingSetup {
        policy: acting,
        environments: vec![wb.env.clone()],
        pool: pool.clone(),
        train_tasks: wb.train.clone(),
        validation_tasks: wb.validation.clone(),
        learner: Box::new(learner),
        selector,
        calibrator,
        weight_sync,
    };
    let started = Instant::now();
    let mut trainer = if resume {
        RescueTrainer::resume(rescue.clone(), setup, &run_dir).at("train")?
    } else {
        RescueTrainer::new(rescue.clone(), setup, &run_dir).at("train")?
    };
    let bar = wb
        .progress
        .bar(rescue.updates, format!("train {}", method.name()));
    bar.set_position(trainer.updates_done());
    while trainer.updates_done() < rescue.updates {
        let record = trainer.step().await.at("train")?;
        bar.set_position(trainer.updates_done());
        tracing::info!(
            method = method.name(),
            update = record.update,
            eg_rate = record.eg_rate,
            rescue_trigger_rate = record.rescue_trigger_rate,
            "update done"
        );
    }
    bar.set_message(format!("train {}: final re-anchoring", method.name()));
    trainer.finish().await.at("train")?;
    bar.finish_and_clear();
    if let Some(router) = &routed_by {
        let stats = router.stats();
        let path = run_dir.join(ROUTER_STATS_FILE);
        let text = serde_json::to_string_pretty(&stats).expect("router stats serialise");
        harness_core::fsutil::write_atomic(&path, text.as_bytes()).at("train")?;
        wb.progress
            .println(format!("{}: {}", method.name(), voter_summary(&stats)));
    }
    let checkpoint = wb.layout.final_checkpoint(method);
    local.save_hf(&checkpoint).at("train")?;
    let seconds = started.elapsed().as_secs_f64();
    wb.progress.println(format!(
        "trained {} ({} updates) in {seconds:.0}s; metrics in {}",
        method.label_for(&rescue.strategy, rescue.group_size),
        rescue.updates,
        run_dir.join(METRICS_FILE).display()
    ));
    Ok(Trained {
        method,
        run_dir,
        checkpoint,
        seconds,
    })
}

/// For a remote engine: save the learner's weights where the engine reloads them.
fn remote_sync(
    wb: &Workbench,
    local: &Arc<CandlePolicy>,
    acting: &Arc<dyn Policy>,
    run_dir: &Path,
) -> Result<Option<Arc<dyn WeightSync>>> {
    if wb.cfg.rollout.engine == RolloutEngine::Local {
        return Ok(None);
    }
    let dir = wb
        .cfg
        .rollout
        .weights_dir
        .clone()
        .unwrap_or_else(|| run_dir.join("engine-weights"));
    let saver = local.clone();
    let cfg = wb.cfg.rollout.clone();
    let policy_name = acting.name().to_string();
    let reloader = {
        let url = cfg.engine_url.clone().unwrap_or_default();
        let kind = match cfg.engine {
            RolloutEngine::Vllm => harness_openai::EngineKind::Vllm,
            _ => harness_openai::EngineKind::Sglang,
        };
        let mut config = harness_openai::RemotePolicyConfig::new(
            url,
            cfg.served_model.clone().unwrap_or_default(),
            kind,
        );
        if let Some(key) = &wb.secrets.engine_api_key {
            config.endpoint = config.endpoint.with_api_key(key.clone());
        }
        Arc::new(
            harness_openai::RemotePolicy::new(
                config,
                Arc::new(harness_openai::candle::CandleEncoder::new(
                    local.policy_model().clone(),
                )),
            )
            .at("rollout engine")?,
        )
    };
    let sync = SaveAndReload::new(
        format!("{policy_name}-reload"),
        dir,
        move |dir| {
            saver.save_hf(dir).map_err(|e| harness_core::Error::Policy {
                policy: "candle".into(),
                message: e.to_string(),
            })
        },
        move |dir| {
            let remote = reloader.clone();
            Box::pin(async move {
                remote
                    .reload_weights(&dir)
                    .await
                    .map_err(|e| e.into_policy("remote"))
            })
        },
    );
    Ok(Some(Arc::new(sync)))
}

/// What the test episodes of one checkpoint left: per task its result, its rewards, and the
/// decision-point choices of each DBBench episode.
struct TestEpisodes {
    per_task: Vec<TaskResult>,
    rewards: Vec<Vec<f32>>,
    decisions: Vec<Vec<Vec<harness_envs::labels::Decision>>>,
}

/// Run `policy` k times per test task under the harness `choice` picks (H0 without one).
async fn test_episodes(
    wb: &Workbench,
    policy: &dyn Policy,
    pool: &SiblingPool,
    choice: &BTreeMap<String, harness_core::HarnessId>,
    label: &str,
) -> Result<TestEpisodes> {
    let k = wb.cfg.eval.k;
    let options = EpisodeOptions {
        sampling: SamplingParams {
            temperature: wb.cfg.rollout.temperature,
            ..SamplingParams::default()
        },
    };
    let base = pool.base();
    let jobs: Vec<(usize, usize)> = (0..wb.test.len())
        .flat_map(|t| (0..k).map(move |a| (t, a)))
        .collect();
    let bar = wb.progress.bar(jobs.len() as u64, format!("test {label}"));
    let seed = wb.cfg.seed ^ TEST_SEED_SALT;
    type Outcome = (usize, f32, Vec<harness_envs::labels::Decision>);
    let outcomes: Vec<harness_core::Result<Outcome>> = futures::stream::iter(jobs)
        .map(|(t, a)| {
            let task: &Task = &wb.test[t];
            let harness = choice
                .get(&task.id)
                .and_then(|id| pool.get(id))
                .unwrap_or(base);
            let env = wb.env.clone();
            let options = options.clone();
            let bar = bar.clone();
            async move {
                // The same episode seed per (task, attempt) for every method and harness.
                let episode_seed = call_seed(seed, (t * k + a) as u32);
                let trajectory =
                    run_episode_with(policy, harness, env.as_ref(), task, episode_seed, &options)
                        .await?;
                bar.inc(1);
                let decisions = if trajectory.env == harness_envs::dbbench::ENV_NAME {
                    harness_envs::labels::dbbench_decisions(&trajectory)
                } else {
                    Vec::new()
                };
                Ok((t, trajectory.reward(), decisions))
            }
        })
        .buffered(wb.cfg.rollout.concurrency)
        .collect()
        .await;
    bar.finish_and_clear();
    let mut rewards = vec![Vec::new(); wb.test.len()];
    let mut decisions = vec![Vec::new(); wb.test.len()];
    for outcome in outcomes {
        let (t, r, d) = outcome.at("evaluate")?;
        rewards[t].push(r);
        decisions[t].push(d);
    }
    let per_task = wb
        .test
        .iter()
        .zip(&rewards)
        .map(|(task, r)| TaskResult {
            task: task.id.clone(),
            harness: choice
                .get(&task.id)
                .map_or_else(|| pool.base_id().to_string(), |id| id.to_string()),
            successes: r.iter().filter(|&&x| x >= 1.0).count(),
            attempts: r.len(),
        })
        .collect();
    Ok(TestEpisodes {
        per_task,
        rewards,
        decisions,
    })
}

/// Count the decision-point choices of H0 test episodes by task family.
fn behaviour_record(
    wb: &Workbench,
    method: &str,
    label: &str,
    episodes: &TestEpisodes,
) -> BehaviourRecord {
    let mut record = BehaviourRecord {
        method: method.to_string(),
        label: label.to_string(),
        mode: "h0".into(),
        episodes: BTreeMap::new(),
        choices: BTreeMap::new(),
        probe: BTreeMap::new(),
    };
    for (task, per_attempt) in wb.test.iter().zip(&episodes.decisions) {
        let family = wb.family_of(task);
        *record.episodes.entry(family.clone()).or_default() += per_attempt.len();
        for decision in per_attempt.iter().flatten() {
            let choice = decision.choice.as_str().to_string();
            *record
                .choices
                .entry(family.clone())
                .or_default()
                .entry(decision.point.as_str().to_string())
                .or_default()
                .entry(choice)
                .or_default() += 1;
        }
    }
    record
}

fn record(
    wb: &Workbench,
    method: &str,
    label: &str,
    mode: &str,
    per_task: Vec<TaskResult>,
    rewards: &[Vec<f32>],
    seconds: f64,
) -> TestRecord {
    let (pass_at_k, avg_at_k) = pass_and_avg_at_k(rewards);
    TestRecord {
        method: method.to_string(),
        label: label.to_string(),
        mode: mode.to_string(),
        k: wb.cfg.eval.k,
        tasks: wb.test.len(),
        pass_at_k,
        avg_at_k,
        rollouts: rewards.iter().map(Vec::len).sum(),
        seconds,
        per_task,
    }
}

/// Test evaluation of the initial checkpoint (`method = None`) or a trained method under H0,
/// plus, for Harness-S, Rank-1 with the final calibration and Table 5 before and after.
/// Appends to `eval/test.jsonl` and `eval/rank.jsonl`, replacing the method's earlier lines.
pub async fn evaluate(
    wb: &Workbench,
    pool: &SiblingPool,
    method: Option<Method>,
) -> Result<Vec<TestRecord>> {
    let (name, label, checkpoint) = match method {
        None => (
            "initial",
            "Initial policy".to_string(),
            wb.checkpoint.clone(),
        ),
        Some(m) => {
            let dir = wb.layout.final_checkpoint(m);
            if !dir.join("config.json").is_file() {
                return Err(Error::input(
                    "evaluate",
                    &dir,
                    format!(
                        "no trained checkpoint: run `harness-s train --method {}` first",
                        m.name()
                    ),
                ));
            }
            let strategy = rescue_config(wb, pool, m).strategy;
            (
                m.name(),
                m.label_for(&strategy, wb.cfg.train.group_size),
                dir,
            )
        }
    };
    let local = wb.local_policy(&checkpoint, name)?;
    let policy: Arc<dyn Policy> = local.clone();
    let started = Instant::now();
    let h0 = test_episodes(wb, policy.as_ref(), pool, &BTreeMap::new(), name).await?;
    let mut behaviour = behaviour_record(wb, name, &label, &h0);
    if wb.cfg.env.name == "default" {
        let bar = wb.progress.spinner("decision-point probe under H0");
        behaviour.probe = harness_warmstart::probe_decisions(
            &local,
            &wb.base,
            &wb.test,
            wb.cfg.seed ^ TEST_SEED_SALT,
        )
        .await
        .at("evaluate")?;
        bar.finish_and_clear();
    }
    let mut records = vec![record(
        wb,
        name,
        &label,
        "h0",
        h0.per_task,
        &h0.rewards,
        started.elapsed().as_secs_f64(),
    )];
    let mut routing = Vec::new();
    let mut ranks = Vec::new();
    if method == Some(Method::HarnessS) {
        let calibrations = wb.layout.train(Method::HarnessS).join("calibrations");
        let last = Calibration::load_latest(&calibrations)
            .at("evaluate")?
            .ok_or_else(|| Error::input("evaluate", &calibrations, "no final calibration"))?;
        let first = Calibration::load_latest(&wb.layout.calibration())
            .at("evaluate")?
            .ok_or_else(|| Error::input("evaluate", wb.layout.calibration(), "no calibration"))?;
        let initial: Arc<dyn Policy> = wb.local_policy(&wb.checkpoint, "initial")?;
        for (stage, calibration, stage_policy) in
            [("before", first, initial), ("after", last, policy.clone())]
        {
            let tokens = TokenCounter::new();
            let (_, voters) = roles(wb, wb.cfg.seed, &tokens);
            let evidence = EvidenceCell::new();
            evidence.set(calibration).at("evaluate")?;
            let router =
                AdaptiveRouter::new(evidence, voters, RouterSettings::default()).at("evaluate")?;
            let bar = wb
                .progress
                .spinner(format!("router ranks ({stage} training)"));
            let started = Instant::now();
            let report = evaluate_ranks(
                &router,
                stage_policy.as_ref(),
                pool,
                &wb.environments(),
                &wb.test,
                &RankEvalSettings {
                    ranks: wb.cfg.eval.ranks.min(pool.len()),
                    attempts: wb.cfg.eval.k as u32,
                    concurrency: wb.cfg.rollout.concurrency,
                    options: EpisodeOptions {
                        sampling: SamplingParams {
                            temperature: wb.cfg.rollout.temperature,
                            ..SamplingParams::default()
                        },
                    },
                    seed: wb.cfg.seed ^ TEST_SEED_SALT,
                },
            )
            .await
            .at("evaluate")?;
            bar.finish_and_clear();
            if stage == "after" {
                // Rank-1 of Table 1: each test task under the harness the router ranks first,
                // with the same episode seeds as the H0 evaluation.
                let choice: BTreeMap<String, harness_core::HarnessId> = report
                    .rankings
                    .iter()
                    .filter_map(|(task, ids)| Some((task.clone(), ids.first()?.clone())))
                    .collect();
                let routed =
                    test_episodes(wb, policy.as_ref(), pool, &choice, "harness_s rank-1").await?;
                records.push(record(
                    wb,
                    name,
                    &label,
                    "rank1",
                    routed.per_task,
                    &routed.rewards,
                    started.elapsed().as_secs_f64(),
                ));
            }
            for task in &wb.test {
                let Some(first) = report.rankings.get(&task.id).and_then(|ids| ids.first()) else {
                    continue;
                };
                routing.push(RoutingRecord {
                    stage: stage.into(),
                    method: name.into(),
                    task: task.id.clone(),
                    family: wb.family_of(task),
                    rank1: first.to_string(),
                    rank1_name: pool
                        .get(first)
                        .map_or_else(|| first.to_string(), |h| h.name.clone()),
                    rank1_is_h0: first == pool.base_id(),
                });
            }
            ranks.push(RankRecord {
                stage: stage.into(),
                method: name.into(),
                report,
            });
        }
    }
    replace_lines(&wb.layout.test_results(), name, &records)?;
    if !behaviour.choices.is_empty() {
        replace_lines(&wb.layout.behaviour_results(), name, &[behaviour])?;
    }
    if !ranks.is_empty() {
        replace_lines(&wb.layout.rank_results(), name, &ranks)?;
        replace_lines(&wb.layout.routing_results(), name, &routing)?;
    }
    for r in &records {
        wb.progress.println(format!(
            "test {} under {}: Pass@{} {:.3}, Avg@{} {:.3} ({} tasks)",
            r.label, r.mode, r.k, r.pass_at_k, r.k, r.avg_at_k, r.tasks
        ));
    }
    Ok(records)
}

/// Whether `eval/test.jsonl` already holds the H0 evaluation of `method` (`None`: initial).
pub fn has_test_record(wb: &Workbench, method: Option<Method>) -> Result<bool> {
    let name = method.map_or("initial", Method::name);
    let path = wb.layout.test_results();
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(false);
    };
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let record: TestRecord = serde_json::from_str(line).map_err(|e| {
            Error::input(
                "evaluate",
                &path,
                format!("line {}: not a test record: {e}", n + 1),
            )
        })?;
        if record.method == name && record.mode == "h0" {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Rewrite a JSONL file without `method`'s old lines, then with `lines` appended.
fn replace_lines<T: Serialize>(path: &Path, method: &str, lines: &[T]) -> Result<()> {
    let mut kept = String::new();
    if let Ok(text) = std::fs::read_to_string(path) {
        for (n, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let value: serde_json::Value = serde_json::from_str(line).map_err(|e| {
                Error::input("evaluate", path, format!("line {}: not JSON: {e}", n + 1))
            })?;
            if value["method"] != method {
                kept.push_str(line);
                kept.push('\n');
            }
        }
    }
    for line in lines {
        kept.push_str(&serde_json::to_string(line).unwrap_or_else(|_| unreachable!("plain data")));
        kept.push('\n');
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|e| Error::input("evaluate", dir, e.to_string()))?;
    }
    harness_core::fsutil::write_atomic(path, kept.as_bytes()).at("evaluate")
}

#[cfg(test)]
mod tests {
    use super::router_allocation;
    use crate::config::Method;
    use harness_rollout::{Allocation, Strategy};

    #[test]
    fn a_top_k_request_on_a_small_pool_is_labelled_by_what_runs() {
        let on = |siblings| Strategy::Router {
            allocation: router_allocation(4, siblings),
        };
        assert_eq!(
            Method::HarnessS.label_for(&on(3), 4),
            "Harness-S (Top-2 x 2, adaptive)"
        );
        assert_eq!(
            Method::HarnessSFixed.label_for(&on(3), 4),
            "Top-2 x 2, fixed profiles"
        );
        assert_eq!(
            Method::HarnessS.label_for(&on(7), 4),
            "Harness-S (Top-4, adaptive)"
        );
        assert_eq!(Method::Grpo.label_for(&Strategy::Grpo, 4), "GRPO");
    }

    #[test]
    fn a_small_pool_gets_top_m_by_n_with_k_rollouts() {
        assert_eq!(router_allocation(4, 6), Allocation::TopK);
        assert_eq!(router_allocation(4, 4), Allocation::TopK);
        assert_eq!(router_allocation(4, 3), Allocation::TopMXN { m: 2, n: 2 });
        assert_eq!(router_allocation(8, 5), Allocation::TopMXN { m: 4, n: 2 });
        assert_eq!(router_allocation(3, 2), Allocation::TopMXN { m: 1, n: 3 });
        assert_eq!(router_allocation(4, 0), Allocation::TopMXN { m: 1, n: 4 });
    }
}
