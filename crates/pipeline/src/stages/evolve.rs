//! Stage 1: Directional Harness Evolution from H0 into a frozen Sibling Harness Pool
//! (paper Eqs. 2-4, Table 8), or the environment's built-in siblings; and loading the pool the
//! later stages train on.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use harness_core::{Policy, SamplingParams};
use harness_evolve::exec::{Executor, PolicySource};
use harness_evolve::report::{round_summary, write_reports};
use harness_evolve::{Analyst, BuiltinEditor, Editor, Evolution, EvolveSettings, RuleAnalyst};
use harness_pool::SiblingPool;

use super::cost::{self, StageCost, Tokens};
use crate::config::PoolSource;
use crate::error::{Error, Result, StageExt};
use crate::setup::Workbench;

/// Build the pool into `evolve/pool`: evolution from H0 (writing its round reports and
/// diversity views into `evolve/`), or, with `evolve.source = "builtin"`, H0 with the
/// environment's hand-written siblings.
pub async fn evolve(wb: &Workbench) -> Result<SiblingPool> {
    let cfg = &wb.cfg;
    if cfg.evolve.source == PoolSource::Builtin {
        let pool = wb.with_programs(wb.builtin_pool()?)?;
        pool.save(wb.layout.pool()).at("evolve")?;
        wb.progress.println(format!(
            "pool: H0 and the environment's {} built-in siblings (no evolution){}",
            wb.builtin_siblings.len(),
            programs_note(wb)
        ));
        return Ok(pool);
    }
    let settings = evolve_settings(wb);
    let budget: usize = settings.proposal_budgets.iter().sum();
    let (analyst, editor) = search_roles(wb, &settings);
    let policy = wb.local_policy(&wb.checkpoint, "initial-policy")?;
    let (executor, counter) = counting_executor(wb, policy as Arc<dyn Policy>);
    let evolution = Evolution {
        settings,
        executor,
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
    // The search's episodes; the diversity views below are analysis, not search.
    let search_rollouts = counter.count();
    let search_seconds = started.elapsed().as_secs_f64();
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
    // The agent programs join the frozen pool after evolution, which edits declarative
    // harnesses only.
    let pool = wb.with_programs(result.pool.clone())?;
    pool.save(wb.layout.pool()).at("evolve")?;
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
    if !wb.programs.is_empty() {
        wb.progress.println(format!(
            "pool: the {} evolved members{}",
            result.pool.len(),
            programs_note(wb)
        ));
    }
    cost::write(
        &StageCost {
            stage: "evolve".into(),
            rollouts: [("search".to_string(), search_rollouts)].into(),
            seconds: [("search".to_string(), search_seconds)].into(),
            tokens: tokens_of(&result.usage),
            shared: Vec::new(),
            proposals: Some(budget as u64),
        },
        &wb.layout.evolve(),
    )?;
    Ok(pool)
}

/// The run's agent programs, as a note on the pool line.
fn programs_note(wb: &Workbench) -> String {
    if wb.programs.is_empty() {
        return String::new();
    }
    let names: Vec<&str> = wb.programs.iter().map(|p| p.name.as_str()).collect();
    let s = if names.len() == 1 { "" } else { "s" };
    format!(
        " and {} agent program{s} as sibling{s} ({})",
        names.len(),
        names.join(", ")
    )
}

/// Directional Harness Evolution's settings: Table 8's, with the run's budgets, seed and
/// concurrency (Meta-Harness and WHALE search with the same ones).
pub(crate) fn evolve_settings(wb: &Workbench) -> EvolveSettings {
    let cfg = &wb.cfg;
    let mut settings = EvolveSettings::paper();
    settings.proposal_budgets = cfg.evolve.proposal_budgets.clone();
    settings.parent_slots = cfg.evolve.parent_slots;
    settings.train_tasks_per_round = cfg.evolve.train_tasks_per_round;
    settings.local_eval_tasks = cfg.evolve.local_eval_tasks;
    settings.local_eval_controls = cfg.evolve.local_eval_controls;
    settings.revisions = cfg.evolve.revisions;
    settings.seed = cfg.seed;
    settings.concurrency = cfg.rollout.concurrency;
    // The base harness's limits are the run's: its own (the embedded default's compact H0 keeps
    // episodes short), or Table 8's when `env.execution_limits = "paper"` put them on H0.
    settings.limits = None;
    settings
}

/// The analyst and editor of a harness search: LLM ones on the roles' endpoint when
/// `roles.llm_roles` names them, else the built-in ones.
pub(crate) fn search_roles(
    wb: &Workbench,
    settings: &EvolveSettings,
) -> (Arc<dyn Analyst>, Arc<dyn Editor>) {
    let cfg = &wb.cfg;
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
    (analyst, editor)
}

/// Counts the episodes an [`Executor`] runs (one policy hand-out per episode).
#[derive(Clone, Default)]
pub(crate) struct RolloutCounter(Arc<AtomicU64>);

impl RolloutCounter {
    /// Episodes so far.
    pub(crate) fn count(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

struct CountingSource {
    policy: Arc<dyn Policy>,
    counter: RolloutCounter,
}

impl PolicySource for CountingSource {
    fn policy_for(&self, _task: &harness_core::Task) -> harness_evolve::Result<Arc<dyn Policy>> {
        self.counter.0.fetch_add(1, Ordering::Relaxed);
        Ok(self.policy.clone())
    }

    fn name(&self) -> String {
        self.policy.name().to_string()
    }
}

/// A search's executor (greedy rollouts, Table 8) for `policy`, with a counter of the episodes
/// it runs.
pub(crate) fn counting_executor(
    wb: &Workbench,
    policy: Arc<dyn Policy>,
) -> (Executor, RolloutCounter) {
    let counter = RolloutCounter::default();
    let executor = Executor {
        policy: Arc::new(CountingSource {
            policy,
            counter: counter.clone(),
        }),
        env: wb.env.clone(),
        sampling: SamplingParams::greedy(),
        concurrency: wb.cfg.rollout.concurrency,
    };
    (executor, counter)
}

/// External-model tokens per role of a harness search.
pub(crate) fn tokens_of(usage: &harness_evolve::usage::UsageByRole) -> BTreeMap<String, Tokens> {
    usage
        .iter()
        .filter(|(_, u)| u.calls > 0)
        .map(|(role, u)| {
            (
                role.clone(),
                Tokens {
                    calls: u.calls,
                    prompt_tokens: u.prompt_tokens,
                    completion_tokens: u.completion_tokens,
                },
            )
        })
        .collect()
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
    let pool = SiblingPool::load(&dir).at("pool")?;
    if pool.base().id() != wb.base.id() && wb.cfg.external.h0.is_some() {
        return Err(Error::input(
            "pool",
            &dir,
            format!(
                "its H0 is `{}`, not the program external.h0 names (`{}`): give a pool built on that program, or leave `pool` unset (with evolve.source = \"builtin\")",
                pool.base().name,
                wb.base.name
            ),
        ));
    }
    // Table 8's limits on H0 (`env.execution_limits = "paper"`): a saved pool whose H0 runs under
    // others would train and evaluate under them while the search methods use the run's H0.
    if let Some(limits) = wb.cfg.env.execution_limits.limits()
        && !pool.base().is_external()
        && pool.base().limits != limits
    {
        return Err(Error::input(
            "pool",
            &dir,
            format!(
                "its H0 `{}` runs under other limits than Table 8's, which env.execution_limits = \"paper\" asks for: give a pool evolved under them, or set env.execution_limits = \"harness\"",
                pool.base().name
            ),
        ));
    }
    // A pool saved before the run's programs were configured gets them too.
    wb.with_programs(pool)
}
