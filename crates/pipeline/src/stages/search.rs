//! Stage 3 for the search methods of Table 1, which look for one harness `H_best` instead of
//! rescue-training on the pool (paper, "Implementation of Comparison Variants"):
//!
//! - **Meta-Harness**: with the initial policy frozen, `harness_evolve::meta_harness`'s search
//!   (a proposer that reads the whole search history, every candidate's harness, score and
//!   sampled traces and every earlier proposal's outcome, revises any candidate; every
//!   candidate is validated and scored on training tasks) keeps the best candidate by training
//!   success. Its budget is `search.proposals` scored candidates, by default
//!   `search.meta_harness_budget_ratio` (the paper's Table 10 ratio, 8,000 / 4,010 search
//!   rollouts) times the search rollouts evolution spent in this run folder, divided by what a
//!   candidate costs: one greedy rollout (Table 8's executor) on each of
//!   `evolve.train_tasks_per_round` training tasks. A proposal that scores nothing (refused,
//!   a duplicate of a scored candidate, a slot left empty) runs no rollout and spends no
//!   budget; `search.max_unscored_in_a_row` of them in a row stop the search early. When
//!   evolution's stage cost is missing, the ratio applies to evolution's proposals.
//!   `search.jsonl` records each round's budget, rollouts, proposals and whether it stopped
//!   early.
//! - **WHALE**: alternating search and rejection-sampling fine-tuning: a harness search with
//!   the current policy (its proposer revises the current `H_best` from its failures), then the phase's share of `train.updates`, each update sampling
//!   `train.group_size` rollouts of `train.batch_tasks` training tasks under that search's
//!   `H_best` at the rollout temperature and taking one SFT step (grpo-candle's trainer at
//!   `search.whale_sft_learning_rate`) on the successful ones; `search.whale_rounds` such
//!   phases, then a last
//!   search with the final policy, whose `H_best` the policy is evaluated under ("the selected
//!   policy and its fixed H_best"). The search budget (`search.proposals` scored candidates,
//!   by default as many as evolution's proposals) is split evenly over the searches, each
//!   starting from the previous `H_best`; as for Meta-Harness, a proposal that scores nothing
//!   spends no budget and `search.max_unscored_in_a_row` of them stop a search.
//!   The searches score candidates on a held-out slice of the training split (the first
//!   `evolve.train_tasks_per_round` tasks of WHALE's shuffled order), and the SFT phases train
//!   on the other tasks only, so no candidate is judged on tasks the policy was just tuned on.
//!   Training rollouts equal plain GRPO's for the same updates, as in Table 10.
//!
//! Both write `train/<method>/h_best.json` (the harness the test evaluation runs every task
//! under), `search.jsonl` (one line per search round) and [`STAGE_COST_FILE`]; WHALE also
//! `sft.jsonl` (one line per update) and its policy in `final/`. A killed search starts again
//! from the beginning (its rounds are minutes on the default).
//!
//! [`STAGE_COST_FILE`]: super::cost::STAGE_COST_FILE

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use grpo_candle::train::sft::{SftConfig, SftTrainer, sft_sequences};
use grpo_candle::train::trainer::{DecayKind, Schedule};
use harness_core::{
    EpisodeOptions, Harness, Policy, SamplingParams, Task, Trajectory, call_seed, run_episode_with,
};
use harness_evolve::meta_harness::{
    AnalystEditorProposer, Attempt, HistoryBounds, HistoryProposer, MetaCandidate,
    MetaHarnessSearch, Proposer,
};
use serde::{Deserialize, Serialize};

use super::cost::{self, STAGE_COST_FILE, StageCost, Tokens};
use super::evolve::{counting_executor, evolve_settings, search_roles, tokens_of};
use super::train::Trained;
use crate::config::Method;
use crate::error::{Error, Result, StageExt};
use crate::methods::StrategyKind;
use crate::setup::Workbench;

/// The harness a search method is evaluated under, in `train/<method>/`.
pub const H_BEST_FILE: &str = "h_best.json";
/// One line per search round, in `train/<method>/`.
pub const SEARCH_FILE: &str = "search.jsonl";
/// One line per WHALE update, in `train/whale/`.
pub const SFT_FILE: &str = "sft.jsonl";

/// Seeds of WHALE's rejection-sampling rollouts, apart from every other stage's.
const WHALE_SEED_SALT: u64 = 0x5741_4c45_5741_4c45;

/// One search round (a line of `search.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SearchRecord {
    /// The round (1-based; Meta-Harness has one).
    pub round: usize,
    /// Policy updates applied before the round's search (WHALE; 0 for Meta-Harness).
    pub updates_before: u64,
    /// Candidates the round's search could score (its share of the budget); proposals that
    /// scored nothing did not count.
    pub budget: usize,
    /// The training tasks its candidates were scored on (for WHALE, a slice no SFT phase
    /// trains on).
    #[serde(default)]
    pub scored_on: Vec<String>,
    /// The proposer that spent the budget (`history-proposer`, `llm-proposer` for Meta-Harness;
    /// `analyst-editor-proposer` for WHALE).
    #[serde(default)]
    pub proposer: String,
    /// Every scored candidate, the round's starting harness first.
    pub candidates: Vec<MetaCandidate>,
    /// Every proposal of the round in order: the candidate it revised, what it targeted and
    /// whether it was scored or rejected.
    #[serde(default)]
    pub attempts: Vec<Attempt>,
    /// Proposals rejected by validation.
    pub rejected: usize,
    /// Slots the proposer left empty.
    pub empty: usize,
    /// The round stopped before its budget was spent: `search.max_unscored_in_a_row`
    /// proposals in a row scored nothing (absent in files written before the setting).
    #[serde(default)]
    pub stopped_unscored: bool,
    /// The round's H_best: id.
    pub best: String,
    /// Its name.
    pub best_name: String,
    /// Its training success.
    pub best_score: f64,
    /// Episodes the search ran.
    pub rollouts: u64,
    /// Wall seconds.
    pub seconds: f64,
}

/// One rollout of WHALE's SFT data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainedOn {
    /// Its task.
    pub task: String,
    /// The harness it ran under.
    pub harness: String,
    /// Its reward.
    pub reward: f32,
    /// Its generated (policy) tokens.
    pub policy_tokens: usize,
}

/// One WHALE update (a line of `sft.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SftRecord {
    /// The update (1-based).
    pub update: u64,
    /// The search round whose H_best the rollouts ran under.
    pub round: usize,
    /// That harness's name.
    pub harness: String,
    /// Rollouts sampled.
    pub rollouts: usize,
    /// The tasks they were sampled on.
    #[serde(default)]
    pub tasks: Vec<String>,
    /// Successful ones (the SFT data).
    pub successes: usize,
    /// Mean NLL of their policy tokens before the step.
    pub loss: f64,
    /// Policy tokens trained on.
    pub tokens: usize,
    /// The step size of the update (`search.whale_sft_learning_rate` on its schedule); absent
    /// when no step was taken, and in files written before the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    /// No successful rollout: no step was taken.
    pub skipped: bool,
    /// The rollouts the step trained on: the successful ones, and only those.
    pub trained_on: Vec<TrainedOn>,
    /// Seconds of rollouts.
    pub rollout_seconds: f64,
    /// Seconds of the SFT step.
    pub update_seconds: f64,
}

/// The H_best a search method saved, for the test evaluation.
pub fn load_h_best(wb: &Workbench, method: Method) -> Result<Harness> {
    let path = wb.layout.train(method).join(H_BEST_FILE);
    if !path.is_file() {
        return Err(Error::input(
            "evaluate",
            &path,
            format!(
                "no H_best: run `harness-s train --method {}` first",
                method.name()
            ),
        ));
    }
    Harness::load(&path).at("evaluate")
}

/// Whether `method`'s search finished (its H_best, and WHALE's policy, are saved).
pub fn is_searched(wb: &Workbench, method: Method) -> bool {
    let dir = wb.layout.train(method);
    dir.join(H_BEST_FILE).is_file()
        && (!method.updates_weights() || dir.join("final").join("config.json").is_file())
}

/// Run the search of `method` (Meta-Harness or WHALE) into `train/<method>/`.
pub async fn search(wb: &Workbench, method: Method) -> Result<Trained> {
    let cfg = &wb.cfg;
    let run_dir = wb.layout.train(method);
    let _lock = harness_core::fsutil::DirLock::acquire(&run_dir).at("search")?;
    for file in [H_BEST_FILE, SEARCH_FILE, SFT_FILE] {
        // A killed search starts again: stale lines would mix two runs.
        let _ = std::fs::remove_file(run_dir.join(file));
    }
    let started = Instant::now();
    let policy = wb.local_policy(&wb.checkpoint, method.name())?;
    let settings = evolve_settings(wb);
    let evolution = evolution_spend(wb, &settings);
    // WHALE: search, fine-tune, ..., search: `whale_rounds` fine-tuning phases, each after a
    // search with the current policy, and a last search with the final policy, so the H_best
    // it is evaluated under was selected for it. Meta-Harness: one search.
    let phases = match method.spec().strategy {
        StrategyKind::Whale => cfg.search.whale_rounds,
        _ => 0,
    };
    let rounds = phases + 1;
    let updates = if method.updates_weights() {
        cfg.train.updates
    } else {
        0
    };
    let mut sft = SftTrainer::new(
        policy.model(),
        SftConfig {
            schedule: Schedule {
                lr: cfg.search.whale_sft_learning_rate,
                warmup_steps: 0,
                total_steps: updates.max(1),
                decay: DecayKind::Constant,
                min_lr_ratio: 1.0,
            },
            seed: cfg.seed,
            ..SftConfig::default()
        },
    )
    .at("search")?;
    let order = shuffled(&wb.train, cfg.seed);
    // WHALE scores its search candidates on a held-out slice of the training split, the
    // first `evolve.train_tasks_per_round` tasks of its order, and fine-tunes on the rest: a
    // candidate is never judged on tasks the policy was just fine-tuned on under the current
    // H_best. Meta-Harness updates no weights and scores on the same first tasks.
    let (search_tasks, sft_tasks) =
        split_search_tasks(&order, cfg, method).map_err(|message| Error::Config {
            file: wb.layout.config(),
            field: "evolve.train_tasks_per_round".into(),
            message,
        })?;
    // A scored candidate costs one greedy rollout on each task it is scored on (each round also
    // scores its starting harness, outside the budget).
    let per_proposal = cfg.evolve.train_tasks_per_round.min(search_tasks.len());
    let total_budget = search_budget(cfg, method, evolution, per_proposal);
    let mut next_task = 0usize;
    let mut best = wb.base.clone();
    let mut tokens: BTreeMap<String, Tokens> = BTreeMap::new();
    let mut search_rollouts = 0u64;
    // Proposals spent: every slot of every round, a scored candidate, a rejected one or one
    // the proposer left empty (the starting harness is not a proposal).
    let mut spent = 0u64;
    let mut search_seconds = 0.0;
    let mut training_rollouts = 0u64;
    let mut done = 0u64;
    let bar = wb
        .progress
        .spinner(format!("{}: harness search", method.name()));
    for round in 1..=rounds {
        let budget = share(total_budget, rounds, round);
        let mut round_settings = settings.clone();
        round_settings.proposal_budgets = vec![budget];
        round_settings.seed = call_seed(cfg.seed, round as u32);
        let proposer = search_proposer(wb, method, &round_settings);
        let (executor, counter) = counting_executor(wb, policy.clone() as Arc<dyn Policy>);
        let meta = MetaHarnessSearch {
            settings: round_settings.clone(),
            max_unscored_in_a_row: cfg.search.max_unscored_in_a_row,
            executor,
            proposer: proposer.clone(),
            train: search_tasks.iter().map(|&i| wb.train[i].clone()).collect(),
        };
        bar.set_message(format!(
            "{}: search round {round}/{rounds} ({budget} candidates)",
            method.name()
        ));
        let round_started = Instant::now();
        let result = meta.run(best.clone()).await.at("search")?;
        let seconds = round_started.elapsed().as_secs_f64();
        best = result.best.clone();
        let score = result
            .candidates
            .iter()
            .find(|c| c.id == best.id())
            .map_or(0.0, MetaCandidate::score);
        for (role, t) in tokens_of(&result.usage) {
            let sum = tokens.entry(role).or_default();
            sum.calls += t.calls;
            sum.prompt_tokens += t.prompt_tokens;
            sum.completion_tokens += t.completion_tokens;
        }
        search_rollouts += counter.count();
        spent += (result.candidates.len().saturating_sub(1) + result.rejected.len() + result.empty)
            as u64;
        search_seconds += seconds;
        append(
            &run_dir.join(SEARCH_FILE),
            &SearchRecord {
                round,
                updates_before: done,
                budget,
                scored_on: search_tasks
                    .iter()
                    .take(cfg.evolve.train_tasks_per_round)
                    .map(|&i| wb.train[i].id.clone())
                    .collect(),
                proposer: proposer.name().to_string(),
                candidates: result.candidates.clone(),
                attempts: result.attempts.clone(),
                rejected: result.rejected.len(),
                empty: result.empty,
                stopped_unscored: result.stopped_unscored,
                best: best.id().to_string(),
                best_name: best.name.clone(),
                best_score: score,
                rollouts: counter.count(),
                seconds,
            },
        )?;
        wb.progress.println(format!(
            "{} round {round}: {} candidates scored, {} rejected{}; H_best {} solves {:.0}% of {} training tasks",
            method.name(),
            result.candidates.len(),
            result.rejected.len(),
            if result.stopped_unscored {
                format!(
                    ", stopped after {} proposals in a row scored nothing",
                    cfg.search.max_unscored_in_a_row
                )
            } else {
                String::new()
            },
            best.name,
            100.0 * score,
            result.candidates.first().map_or(0, |c| c.tasks)
        ));
        let round_updates = if round <= phases {
            share(updates as usize, phases, round)
        } else {
            0
        };
        for _ in 0..round_updates {
            bar.set_message(format!(
                "{}: update {}/{updates} under {}",
                method.name(),
                done + 1,
                best.name
            ));
            let tasks: Vec<&Task> = (0..cfg.train.batch_tasks)
                .map(|j| &wb.train[sft_tasks[(next_task + j) % sft_tasks.len()]])
                .collect();
            next_task = (next_task + tasks.len()) % sft_tasks.len();
            let rollout_started = Instant::now();
            let seed = call_seed(cfg.seed ^ WHALE_SEED_SALT, done as u32);
            let rollouts = sample(wb, policy.as_ref(), &best, &tasks, seed).await?;
            let rollout_seconds = rollout_started.elapsed().as_secs_f64();
            training_rollouts += rollouts.len() as u64;
            let successes: Vec<Trajectory> = rollouts
                .iter()
                .filter(|t| t.is_success())
                .cloned()
                .collect();
            let update_started = Instant::now();
            let seqs = sft_sequences(&successes, true).at("search")?;
            let metrics = sft.fit_policy(&policy, &seqs, 1).at("search")?;
            done += 1;
            let m = metrics.first();
            append(
                &run_dir.join(SFT_FILE),
                &SftRecord {
                    update: done,
                    round,
                    harness: best.name.clone(),
                    rollouts: rollouts.len(),
                    tasks: tasks.iter().map(|t| t.id.clone()).collect(),
                    successes: successes.len(),
                    loss: m.map_or(0.0, |m| m.loss),
                    tokens: m.map_or(0, |m| m.tokens),
                    lr: m.filter(|m| !m.skipped).map(|m| m.lr),
                    skipped: m.is_none_or(|m| m.skipped),
                    trained_on: successes
                        .iter()
                        .map(|t| TrainedOn {
                            task: t.task_id.clone(),
                            harness: t.harness_id.to_string(),
                            reward: t.reward(),
                            policy_tokens: t.policy_tokens(),
                        })
                        .collect(),
                    rollout_seconds,
                    update_seconds: update_started.elapsed().as_secs_f64(),
                },
            )?;
        }
    }
    bar.finish_and_clear();
    let mut rollouts = BTreeMap::from([("search".to_string(), search_rollouts)]);
    let mut seconds = BTreeMap::from([("search".to_string(), search_seconds)]);
    if method.updates_weights() {
        rollouts.insert("training".into(), training_rollouts);
        seconds.insert(
            "training".into(),
            started.elapsed().as_secs_f64() - search_seconds,
        );
    }
    cost::write(
        &StageCost {
            stage: "search".into(),
            rollouts,
            seconds,
            tokens,
            shared: Vec::new(),
            proposals: Some(spent),
        },
        &run_dir,
    )?;
    best.save(run_dir.join(H_BEST_FILE)).at("search")?;
    let checkpoint = if method.updates_weights() {
        let dir = wb.layout.final_checkpoint(method);
        policy.save_hf(&dir).at("search")?;
        dir
    } else {
        wb.checkpoint.clone()
    };
    let seconds = started.elapsed().as_secs_f64();
    wb.progress.println(format!(
        "{}: H_best {} after {rounds} search round(s) and {done} SFT updates, in {seconds:.0}s",
        method.label(),
        best.name
    ));
    Ok(Trained {
        method,
        run_dir,
        checkpoint,
        seconds,
    })
}

/// The proposer of `method`'s search rounds. Meta-Harness's reads the whole search history
/// (paper, "Implementation of Comparison Variants": the proposer sees earlier implementations,
/// scores and traces): with `roles.llm_roles` naming `proposer`, an LLM that gets the history as
/// a prompt; otherwise the built-in [`HistoryProposer`] over the same history, with the
/// analyst and editor evolution uses. WHALE's searches revise their current H_best from its
/// failures ([`AnalystEditorProposer`]).
fn search_proposer(
    wb: &Workbench,
    method: Method,
    settings: &harness_evolve::EvolveSettings,
) -> Arc<dyn Proposer> {
    let cfg = &wb.cfg;
    let bounds = HistoryBounds {
        detailed_candidates: cfg.search.history_candidates,
        traces_per_candidate: cfg.search.history_traces,
        trace_chars: cfg.search.history_trace_chars,
    };
    match (method.spec().strategy, &wb.chat) {
        (StrategyKind::MetaHarness, Some(chat)) if cfg.roles.asks_llm("proposer") => Arc::new(
            harness_evolve::LlmProposer::new(chat.clone(), settings.llm_retries, bounds)
                .with_max_tokens(cfg.roles.max_tokens)
                .with_sampling(0.6, settings.seed),
        ),
        (StrategyKind::MetaHarness, _) => {
            let (analyst, editor) = search_roles(wb, settings);
            Arc::new(HistoryProposer::new(
                analyst,
                editor,
                settings.clone(),
                bounds,
            ))
        }
        _ => {
            let (analyst, editor) = search_roles(wb, settings);
            Arc::new(AnalystEditorProposer {
                analyst,
                editor,
                settings: settings.clone(),
            })
        }
    }
}

/// The `round`-th (1-based) of `parts` near-equal shares of `total`; the first rounds take the
/// remainder.
fn share(total: usize, parts: usize, round: usize) -> usize {
    total / parts + usize::from(round <= total % parts)
}

/// What evolution spent, from which the search methods' default budgets follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EvolutionSpend {
    /// Its proposals (the sum of `evolve.proposal_budgets`).
    pub proposals: usize,
    /// Its search rollouts, when its stage ran in this run folder (`evolve/stage_cost.json`).
    pub rollouts: Option<u64>,
}

/// The candidates `method`'s search scores (all of WHALE's searches together):
/// `search.proposals`; else, for Meta-Harness, `search.meta_harness_budget_ratio` times
/// evolution's search rollouts, in candidates of `rollouts_per_proposal` rollouts each (the paper's Table 10 gives
/// Meta-Harness about twice Harness-S's search rollouts: 8,000 against 4,010), or the ratio
/// times evolution's proposals when evolution's rollouts are not known; for WHALE, evolution's
/// proposals.
pub fn search_budget(
    cfg: &crate::config::RunConfig,
    method: Method,
    evolution: EvolutionSpend,
    rollouts_per_proposal: usize,
) -> usize {
    if let Some(p) = cfg.search.proposals {
        return p;
    }
    let ratio = cfg.search.meta_harness_budget_ratio;
    match (method.spec().strategy, evolution.rollouts) {
        (StrategyKind::MetaHarness, Some(rollouts)) if rollouts > 0 => {
            let per = rollouts_per_proposal.max(1) as f64;
            ((rollouts as f64 * ratio / per).round() as usize).max(1)
        }
        (StrategyKind::MetaHarness, _) => {
            ((evolution.proposals as f64 * ratio).round() as usize).max(1)
        }
        _ => evolution.proposals,
    }
}

/// Evolution's spend in this run folder: its proposals, and its search rollouts when its
/// stage cost was written.
fn evolution_spend(wb: &Workbench, settings: &harness_evolve::EvolveSettings) -> EvolutionSpend {
    evolution_spend_in(&wb.layout.evolve(), settings.proposal_budgets.iter().sum())
}

/// [`evolution_spend`] from evolution's folder `dir` (no stage cost there when the pool was
/// given rather than evolved).
fn evolution_spend_in(dir: &Path, proposals: usize) -> EvolutionSpend {
    let rollouts = std::fs::read_to_string(dir.join(STAGE_COST_FILE))
        .ok()
        .and_then(|text| serde_json::from_str::<StageCost>(&text).ok())
        .and_then(|cost| cost.rollouts.get("search").copied());
    EvolutionSpend {
        proposals,
        rollouts,
    }
}

/// The training tasks (indices into `order`'s split) a search scores candidates on, and those
/// WHALE fine-tunes on: disjoint for WHALE (the first `evolve.train_tasks_per_round` of the
/// order held out for the search), the whole order for both otherwise.
pub fn split_search_tasks(
    order: &[usize],
    cfg: &crate::config::RunConfig,
    method: Method,
) -> std::result::Result<(Vec<usize>, Vec<usize>), String> {
    let held_out = cfg.evolve.train_tasks_per_round;
    if !matches!(method.spec().strategy, StrategyKind::Whale) {
        return Ok((order.to_vec(), order.to_vec()));
    }
    if order.len() <= held_out {
        return Err(format!(
            "WHALE holds out {held_out} training tasks for its searches and fine-tunes on the rest; the training split has {}: expected fewer held-out tasks than training tasks",
            order.len()
        ));
    }
    Ok((order[..held_out].to_vec(), order[held_out..].to_vec()))
}

/// The indices of `tasks` in a seeded order.
fn shuffled(tasks: &[Task], seed: u64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..tasks.len()).collect();
    order.sort_by_key(|&i| call_seed(seed ^ WHALE_SEED_SALT, i as u32));
    order
}

/// `train.group_size` rollouts of each task under `harness` at the rollout temperature.
async fn sample(
    wb: &Workbench,
    policy: &dyn Policy,
    harness: &Harness,
    tasks: &[&Task],
    seed: u64,
) -> Result<Vec<Trajectory>> {
    let g = wb.cfg.train.group_size;
    let options = EpisodeOptions {
        sampling: SamplingParams {
            temperature: wb.cfg.rollout.temperature,
            ..SamplingParams::default()
        },
    };
    let jobs: Vec<(usize, usize)> = (0..tasks.len())
        .flat_map(|t| (0..g).map(move |a| (t, a)))
        .collect();
    let out: Vec<harness_core::Result<Trajectory>> = futures::stream::iter(jobs)
        .map(|(t, a)| {
            let options = options.clone();
            let env = wb.env.clone();
            let task = tasks[t];
            async move {
                run_episode_with(
                    policy,
                    harness,
                    env.as_ref(),
                    task,
                    call_seed(seed, (t * g + a) as u32),
                    &options,
                )
                .await
            }
        })
        .buffered(wb.cfg.rollout.concurrency)
        .collect()
        .await;
    out.into_iter()
        .collect::<harness_core::Result<Vec<_>>>()
        .at("search")
}

fn append<T: Serialize>(path: &Path, line: &T) -> Result<()> {
    harness_core::fsutil::append_json_line(path, line).at("search")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whale_scores_candidates_on_tasks_it_never_fine_tunes_on() {
        let mut cfg = crate::config::RunConfig::preset(crate::config::Preset::Quick);
        cfg.evolve.train_tasks_per_round = 3;
        let order: Vec<usize> = vec![7, 2, 9, 4, 0, 5];
        let (search, sft) = split_search_tasks(&order, &cfg, Method::Whale).unwrap();
        assert_eq!(search, [7, 2, 9]);
        assert_eq!(sft, [4, 0, 5]);
        assert!(search.iter().all(|t| !sft.contains(t)));
        // Meta-Harness tunes nothing: it scores on the order's first tasks as before.
        let (search, _) = split_search_tasks(&order, &cfg, Method::MetaHarness).unwrap();
        assert_eq!(search, order);
        cfg.evolve.train_tasks_per_round = 6;
        let e = split_search_tasks(&order, &cfg, Method::Whale).unwrap_err();
        assert!(e.contains("holds out 6") && e.contains("has 6"), "{e}");
    }

    #[test]
    fn meta_harness_gets_the_papers_budget_ratio_and_whale_evolutions() {
        let mut cfg = crate::config::RunConfig::preset(crate::config::Preset::Quick);
        let spent = |rollouts| EvolutionSpend {
            proposals: 12,
            rollouts,
        };
        // Twice evolution's search rollouts (597 of them), in proposals of 11 rollouts each.
        assert_eq!(
            search_budget(&cfg, Method::MetaHarness, spent(Some(597)), 11),
            108
        );
        assert_eq!(
            search_budget(&cfg, Method::MetaHarness, spent(Some(4010)), 1),
            8000
        );
        // Without evolution's rollouts: twice its proposals.
        assert_eq!(
            search_budget(&cfg, Method::MetaHarness, spent(None), 11),
            24
        );
        assert_eq!(
            search_budget(&cfg, Method::MetaHarness, spent(Some(0)), 11),
            24
        );
        assert_eq!(search_budget(&cfg, Method::Whale, spent(Some(597)), 11), 12);
        cfg.search.meta_harness_budget_ratio = 1.0;
        assert_eq!(
            search_budget(&cfg, Method::MetaHarness, spent(Some(44)), 11),
            4
        );
        cfg.search.proposals = Some(5);
        assert_eq!(
            search_budget(&cfg, Method::MetaHarness, spent(Some(597)), 11),
            5
        );
    }

    #[test]
    fn evolutions_rollouts_come_from_its_stage_cost_when_it_ran() {
        let dir = tempfile::tempdir().unwrap();
        let given = evolution_spend_in(dir.path(), 12);
        assert_eq!(
            given,
            EvolutionSpend {
                proposals: 12,
                rollouts: None
            }
        );
        std::fs::write(
            dir.path().join(STAGE_COST_FILE),
            r#"{"stage": "evolve", "rollouts": {"search": 597}, "proposals": 12}"#,
        )
        .unwrap();
        assert_eq!(evolution_spend_in(dir.path(), 12).rollouts, Some(597));
    }

    #[test]
    fn shares_add_up_and_differ_by_at_most_one() {
        for total in 0..20 {
            for parts in 1..6 {
                let s: Vec<usize> = (1..=parts).map(|r| share(total, parts, r)).collect();
                assert_eq!(s.iter().sum::<usize>(), total);
                assert!(s.iter().max().unwrap() - s.iter().min().unwrap() <= 1);
            }
        }
    }
}
