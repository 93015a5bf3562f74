//! Stage 1: Directional Harness Evolution from H0 into a frozen Sibling Harness Pool
//! (paper Eqs. 2-4, Table 8), or the environment's built-in siblings; and loading the pool the
//! later stages train on.

use std::sync::Arc;
use std::time::Instant;

use harness_core::{Policy, SamplingParams};
use harness_evolve::exec::{Executor, SharedPolicy};
use harness_evolve::report::{round_summary, write_reports};
use harness_evolve::{Analyst, BuiltinEditor, Editor, Evolution, EvolveSettings, RuleAnalyst};
use harness_pool::SiblingPool;

use crate::config::PoolSource;
use crate::error::{Error, Result, StageExt};
use crate::setup::Workbench;

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
