//! Stage 3: rescue training of one method from the initial checkpoint (Algorithm 1), with the
//! strategy, selector and calibrator its [`crate::methods::METHODS`] entry names.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use grpo_candle::CandlePolicy;
use grpo_candle::train::learner::CandleLearner;
use grpo_candle::train::trainer::{Schedule, TrainerConfig};
use harness_core::{Calibrate, HarnessSelector, Learner, Policy, SamplingParams};
use harness_pool::SiblingPool;
use harness_rollout::{
    COST_FILE, METRICS_FILE, RandomSelector, RescueConfig, RescueTrainer, SaveAndReload, Strategy,
    TrainingSetup, WeightSync,
};
use harness_router::{
    AdaptiveRouter, EvidenceCell, RouterSettings, RuleRouter, TokenCounter, Voter,
};

use super::cost::{self, StageCost, counted_tokens};
use super::roles::{calibrator, first_calibration, roles};
use crate::config::{LearnerKind, Method, RolloutEngine};
use crate::error::{Error, Result, StageExt};
use crate::methods::{SelectorKind, StrategyKind};
use crate::setup::Workbench;
use crate::tinker::TinkerRun;

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

/// The strategy `method` trains with on `pool` (`None` for a method that updates no
/// weights). A fixed mixture picks its siblings by the first calibration's validation success.
pub fn strategy(wb: &Workbench, pool: &SiblingPool, method: Method) -> Result<Option<Strategy>> {
    let needs_calibration = matches!(method.spec().strategy, StrategyKind::Mixture { .. });
    let calibration = if needs_calibration {
        Some(first_calibration(wb, "train")?)
    } else {
        None
    };
    method
        .strategy(
            wb.cfg.train.group_size,
            pool,
            calibration.as_ref().map(|c| &c.validation_success),
        )
        .map_err(|message| Error::Config {
            file: wb.layout.config(),
            field: "train.methods".into(),
            message: format!("{}: {message}", method.name()),
        })
}

/// The rescue-training configuration of a method; an error for a method that updates no
/// weights.
pub fn rescue_config(wb: &Workbench, pool: &SiblingPool, method: Method) -> Result<RescueConfig> {
    let cfg = &wb.cfg;
    let strategy = strategy(wb, pool, method)?.ok_or_else(|| nothing_to_train(wb, method))?;
    // The rescue objective acts on sibling rescues only; the other methods keep the paper's
    // (RescueConfig::validate refuses a non-paper objective for them).
    let rescue_objective = if strategy.rescues_with_siblings() {
        cfg.train.rescue_objective
    } else {
        harness_core::RescueObjective::Generating
    };
    Ok(RescueConfig {
        seed: cfg.seed,
        updates: cfg.train.updates,
        group_size: cfg.train.group_size,
        batch_tasks: cfg.train.batch_tasks,
        strategy,
        rescue_objective,
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
    })
}

fn nothing_to_train(wb: &Workbench, method: Method) -> Error {
    Error::input(
        "train",
        wb.layout.train(method),
        format!(
            "{} updates no weights: there is nothing to train; evaluate it with `harness-s eval --method {}`",
            method.name(),
            method.name()
        ),
    )
}

/// Whether the routers' voters are LLM calls (`roles.llm` set and the voters asked), rather than
/// the built-in offline voters.
pub(crate) fn llm_voters(wb: &Workbench) -> bool {
    wb.chat.is_some() && wb.cfg.roles.asks_llm("voters")
}

/// The label of `method` in the tables, for the strategy it runs on `pool`.
pub fn method_label(wb: &Workbench, pool: &SiblingPool, method: Method) -> Result<String> {
    Ok(match strategy(wb, pool, method)? {
        Some(s) => method.label_for(&s, wb.cfg.train.group_size, llm_voters(wb)),
        None => method.label().to_string(),
    })
}

/// The checkpoint `method` is evaluated with: its trained `final/` checkpoint, or the initial
/// checkpoint for a method that updates no weights.
pub fn checkpoint_of(wb: &Workbench, method: Method) -> Result<PathBuf> {
    if !method.updates_weights() {
        return Ok(wb.checkpoint.clone());
    }
    let dir = wb.layout.final_checkpoint(method);
    if !dir.join("config.json").is_file() {
        return Err(Error::input(
            "evaluate",
            &dir,
            format!(
                "no trained checkpoint: run `harness-s train --method {}` first",
                method.name()
            ),
        ));
    }
    Ok(dir)
}

/// Top-K (one rescue rollout under each of K siblings, the paper's Top-8) when the pool has K
/// siblings; a smaller pool gets Top-m x n with the most siblings m that divide K (the paper's
/// "Top-4 x 2" allocation), so the rescue group keeps K rollouts.
pub fn router_allocation(k: usize, siblings: usize) -> harness_rollout::Allocation {
    crate::methods::allocation(k, 1, siblings)
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
    if !method.has_training_stage() {
        // Refused before the folder exists: a method without updates has no training run.
        return Err(nothing_to_train(wb, method));
    }
    if method.searches() {
        return super::search::search(wb, method).await;
    }
    let _lock = harness_core::fsutil::DirLock::acquire(&run_dir).at("train")?;
    let rescue = rescue_config(wb, pool, method)?;
    rescue.validate(pool).at("train")?;
    if let (
        Strategy::Router {
            allocation: harness_rollout::Allocation::TopMXN { m, n },
        },
        StrategyKind::Router { per_harness },
    ) = (&rescue.strategy, method.spec().strategy)
        && m * per_harness < rescue.group_size
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
    if resume {
        crate::tinker::check_resume(wb, &run_dir)?;
    }
    let engine_sync = remote_sync(wb, &local, &acting, &run_dir)?;
    let (learner, weight_sync): (Box<dyn Learner>, Option<Arc<dyn WeightSync>>) = match cfg.learner
    {
        LearnerKind::Candle => (
            Box::new(CandleLearner::new(local.clone(), trainer_cfg).at("train")?),
            engine_sync,
        ),
        LearnerKind::Tinker => {
            crate::tinker::preflight(wb).await?;
            // Every version is merged into these, the initial checkpoint's weights.
            let base = Arc::new(local.base_weights().at("train")?);
            let run = TinkerRun::connect(wb, local.clone()).await?;
            let sync =
                crate::tinker::sampler_sync(wb, &run, local.clone(), base, engine_sync, &run_dir)?;
            (Box::new(run), Some(sync))
        }
    };
    let tokens = TokenCounter::new();
    type Routing = (Option<Arc<dyn HarnessSelector>>, Option<Arc<dyn Calibrate>>);
    let mut routed_by = None;
    let (selector, calibrator): Routing = match method.spec().selector {
        SelectorKind::None => (None, None),
        SelectorKind::Random => (
            Some(Arc::new(RandomSelector::new(pool)) as Arc<dyn HarnessSelector>),
            None,
        ),
        kind @ (SelectorKind::Rule { reanchor } | SelectorKind::Voters { reanchor }) => {
            let first = first_calibration(wb, "train")?;
            let evidence = EvidenceCell::new();
            evidence.set(first).at("train")?;
            let (profiler, voters) = roles(wb, cfg.seed, &tokens);
            // The rule router reads validation successes, never profiles: its re-anchoring
            // profiles with the built-in labellers, so it pays for no LLM profile it does
            // not read.
            let profiler: Arc<dyn harness_router::Profiler> =
                if matches!(kind, SelectorKind::Rule { .. }) {
                    Arc::new(harness_router::BuiltinProfiler::new(
                        harness_envs::labels::builtin_labellers(),
                    ))
                } else {
                    profiler
                };
            let cal = calibrator(
                wb,
                pool,
                acting.clone(),
                profiler,
                evidence.clone(),
                reanchor,
                run_dir.join("calibrations"),
            )
            .await?;
            let (selector, router) = routed_selector(kind, evidence, voters)?;
            routed_by = router;
            (Some(selector), Some(Arc::new(cal) as Arc<dyn Calibrate>))
        }
    };
    if let Some(sync) = &weight_sync
        && !resume
    {
        // The engine may still hold another method's trained weights: every method starts
        // from the initial checkpoint. (A resumed trainer pushes its restored version itself.)
        harness_rollout::sync_with_retry(sync.as_ref(), 0, rescue.sync_retry)
            .await
            .at("train")?;
    }
    let env = wb.env_for(pool, acting.clone()).await?;
    let setup = TrainingSetup {
        policy: acting,
        environments: vec![env],
        pool: pool.clone(),
        train_tasks: wb.train.clone(),
        validation_tasks: wb.validation.clone(),
        learner,
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
    // The cost first: a kill between the two leaves no finished run without its cost.
    write_train_cost(&run_dir, method, &tokens)?;
    let checkpoint = wb.layout.final_checkpoint(method);
    if let Some(v) = local.weights_version()
        && v != trainer.policy_version()
    {
        return Err(Error::input(
            "train",
            &run_dir,
            format!(
                "the learner is at version {}, the policy holds version {v}: a weight sync was lost; run again to resume",
                trainer.policy_version()
            ),
        ));
    }
    local.save_hf(&checkpoint).at("train")?;
    let seconds = started.elapsed().as_secs_f64();
    wb.progress.println(format!(
        "trained {} ({} updates) in {seconds:.0}s; metrics in {}",
        method.label_for(&rescue.strategy, rescue.group_size, llm_voters(wb)),
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

/// Whether `method`'s training stage finished: its final checkpoint, or a search method's
/// H_best (and WHALE's policy).
pub fn is_trained(wb: &Workbench, method: Method) -> bool {
    if method.searches() {
        return super::search::is_searched(wb, method);
    }
    wb.layout
        .final_checkpoint(method)
        .join("config.json")
        .is_file()
}

/// The training stage's [`StageCost`]: rollouts, seconds and the calibrator's external tokens
/// from harness-rollout's `cost.json` (which a resumed run carries over), and the tokens of the
/// other roles (the voters) that this invocation's `tokens` counted.
fn write_train_cost(run_dir: &Path, method: Method, tokens: &TokenCounter) -> Result<()> {
    let path = run_dir.join(COST_FILE);
    let text =
        std::fs::read_to_string(&path).map_err(|e| Error::input("train", &path, e.to_string()))?;
    let cost: harness_rollout::Cost = serde_json::from_str(&text)
        .map_err(|e| Error::input("train", &path, format!("not a cost file: {e}")))?;
    let mut counted = counted_tokens(tokens);
    for (role, usage) in &cost.external_llm_tokens {
        let t = counted.entry(role.clone()).or_default();
        t.prompt_tokens = t.prompt_tokens.max(usage.prompt_tokens);
        t.completion_tokens = t.completion_tokens.max(usage.completion_tokens);
    }
    cost::write(
        &StageCost {
            stage: "train".into(),
            rollouts: [
                ("training".to_string(), cost.training_rollouts.total),
                ("calibration".to_string(), cost.calibration_rollouts),
            ]
            .into(),
            seconds: [
                (
                    "training".to_string(),
                    cost.rollout_seconds + cost.update_seconds,
                ),
                ("calibration".to_string(), cost.calibration_seconds),
            ]
            .into(),
            tokens: counted,
            shared: method.shared_stages(),
            proposals: None,
        },
        run_dir,
    )
}

/// A routed method's selector, and the Adaptive Harness Router behind it when there is one.
pub(crate) type RoutedSelector = (Arc<dyn HarnessSelector>, Option<Arc<AdaptiveRouter>>);

/// The selector of a routed method's rescue over the calibrator's `evidence`: for
/// [`SelectorKind::Rule`], Table 2's Rule Router (siblings ranked by success on the validation
/// tasks most similar to the task, as many as the voters see, no profiles); otherwise the
/// Adaptive Harness Router with `voters`, returned a second time for its counters.
pub(crate) fn routed_selector(
    kind: SelectorKind,
    evidence: EvidenceCell,
    voters: Vec<Arc<dyn Voter>>,
) -> Result<RoutedSelector> {
    if matches!(kind, SelectorKind::Rule { .. }) {
        let rule = RuleRouter::new(evidence, RouterSettings::default().similar_tasks);
        return Ok((Arc::new(rule), None));
    }
    let router =
        Arc::new(AdaptiveRouter::new(evidence, voters, RouterSettings::default()).at("train")?);
    Ok((router.clone(), Some(router)))
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

#[cfg(test)]
mod tests {
    use super::router_allocation;
    use crate::config::Method;
    use harness_rollout::{Allocation, Strategy};

    mod rule_router {
        use std::collections::BTreeMap;

        use harness_core::{Harness, HarnessId, SelectionMode, SelectionRequest, Split, Task};
        use harness_pool::SiblingPool;
        use harness_router::{
            CALIBRATION_FORMAT, Calibration, EvidenceCell, FeatureSource, MemberInfo, PairedLimits,
            TaskOutcome,
        };

        use super::super::routed_selector;
        use crate::config::Method;
        use crate::methods::SelectorKind;

        fn task(id: &str, split: Split, instruction: &str) -> Task {
            Task::new(id, "shop", split, instruction, 0)
        }

        /// Hand-made validation evidence: S1 solves the invoice-mail tasks, S2 the rent
        /// payments, S3 the shelf counts (four of them, so S3 has the best overall success).
        fn calibration(pool: &SiblingPool) -> Calibration {
            let kinds = [
                (
                    "mail",
                    "S1",
                    "send the invoice email to the billing contacts",
                    2,
                ),
                (
                    "pay",
                    "S2",
                    "pay the monthly rent through the payment app",
                    2,
                ),
                ("shelf", "S3", "count the boxes on the warehouse shelf", 4),
            ];
            let mut tasks = Vec::new();
            let mut outcomes: BTreeMap<String, BTreeMap<HarnessId, TaskOutcome>> = BTreeMap::new();
            for (kind, solver, instruction, n) in kinds {
                for i in 0..n {
                    let t = task(&format!("{kind}-{i}"), Split::Validation, instruction);
                    let row = pool
                        .members()
                        .iter()
                        .map(|h| {
                            let solved = h.name == solver;
                            let outcome = TaskOutcome {
                                successes: u32::from(solved),
                                attempts: 1,
                            };
                            (h.id(), outcome)
                        })
                        .collect();
                    outcomes.insert(t.id.clone(), row);
                    tasks.push(t);
                }
            }
            let validation_success = pool
                .members()
                .iter()
                .map(|h| {
                    let rates: Vec<f64> = outcomes.values().map(|r| r[&h.id()].rate()).collect();
                    (h.id(), rates.iter().sum::<f64>() / rates.len() as f64)
                })
                .collect();
            Calibration {
                format: CALIBRATION_FORMAT,
                index: 0,
                update: 0,
                is_final: false,
                seed: 0,
                checkpoint: None,
                base: pool.base_id().clone(),
                members: pool
                    .members()
                    .iter()
                    .map(|h| MemberInfo {
                        id: h.id(),
                        name: h.name.clone(),
                        description: String::new(),
                    })
                    .collect(),
                limits: PairedLimits::Base,
                rollouts_per_task: 1,
                tasks,
                validation_success,
                outcomes,
                profiles: BTreeMap::new(),
                profiler: Default::default(),
                features: FeatureSource::Text,
            }
        }

        #[tokio::test]
        async fn rule_router_ranks_by_success_on_the_most_similar_validation_tasks() {
            let spec = Method::parse("rule_router").unwrap().spec();
            assert!(matches!(spec.selector, SelectorKind::Rule { .. }));
            let pool = SiblingPool::starter(
                Harness::new("H0", "Base."),
                (1..=3).map(|i| Harness::new(format!("S{i}"), format!("Sibling {i}."))),
                serde_json::Value::Null,
            )
            .unwrap();
            let calibration = calibration(&pool);
            let name = |id: &HarnessId| pool.get(id).unwrap().name.clone();
            // The premise: S3 leads on overall validation success.
            let best = calibration
                .validation_success
                .iter()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .map(|(id, _)| name(id));
            assert_eq!(best.as_deref(), Some("S3"));
            let evidence = EvidenceCell::new();
            evidence.set(calibration).unwrap();
            let (selector, router) = routed_selector(spec.selector, evidence, Vec::new()).unwrap();
            assert!(router.is_none(), "the rule router asks no voters");
            let ask = |instruction: &str, k| SelectionRequest {
                task: task("new", Split::Train, instruction),
                k,
                mode: SelectionMode::Rescue,
                seed: 7,
            };
            let mail = selector
                .select(&ask(
                    "send the overdue invoice email to the billing contacts",
                    3,
                ))
                .await
                .unwrap();
            let mail: Vec<String> = mail.iter().map(name).collect();
            // S1 solved the similar tasks; S3, best overall, comes after it.
            assert_eq!(mail[0], "S1", "{mail:?}");
            let pay = selector
                .select(&ask("pay the rent through the payment app", 1))
                .await
                .unwrap();
            assert_eq!(pay.iter().map(name).collect::<Vec<_>>(), ["S2"]);
            let shelf = selector
                .select(&ask("count the boxes on the shelf", 1))
                .await
                .unwrap();
            assert_eq!(shelf.iter().map(name).collect::<Vec<_>>(), ["S3"]);
            // H0 is never a rescue candidate.
            assert!(!mail.contains(&"H0".to_string()));
        }
    }

    #[test]
    fn a_top_k_request_on_a_small_pool_is_labelled_by_what_runs() {
        let on = |siblings| Strategy::Router {
            allocation: router_allocation(4, siblings),
        };
        assert_eq!(
            Method::HarnessS.label_for(&on(3), 4, false),
            "Harness-S (Top-2 x 2, adaptive)"
        );
        assert_eq!(
            Method::HarnessSFixed.label_for(&on(3), 4, false),
            "Top-2 x 2, fixed profiles"
        );
        assert_eq!(
            Method::HarnessS.label_for(&on(7), 4, false),
            "Harness-S (Top-4, adaptive)"
        );
        assert_eq!(Method::Grpo.label_for(&Strategy::Grpo, 4, false), "GRPO");
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
