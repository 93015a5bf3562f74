//! Stage 4: the test evaluation. Each method's policy on the test tasks, in the modes its
//! [`crate::methods::METHODS`] entry names (H0, the router's Rank-1), with the same episode
//! seeds for every method; for Harness-S the router's Rank-1..R before and after training
//! (Table 5); beside the scores, the H0 episodes' decision-point choices and the router's
//! Rank-1 harness per test task.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use futures::StreamExt;
use grpo_candle::CandlePolicy;
use harness_core::{
    EpisodeOptions, Harness, HarnessSelector, Policy, SamplingParams, SelectionMode,
    SelectionRequest, Task, call_seed, pass_and_avg_at_k, run_episode_with,
};
use harness_pool::SiblingPool;
use harness_router::{
    AdaptiveRouter, Calibration, EvidenceCell, RankEvalSettings, RankReport, RouterSettings,
    TokenCounter, evaluate_ranks,
};
use serde::{Deserialize, Serialize};

use super::cost::{self, StageCost};
use super::roles::{first_calibration, roles};
use super::search::load_h_best;
use super::train::{checkpoint_of, method_label};
use crate::config::Method;
use crate::error::{Error, Result, StageExt};
use crate::setup::Workbench;
use harness_report::EvalMode;

/// Seeds of the test evaluation, apart from every training and calibration seed.
const TEST_SEED_SALT: u64 = 0x7e57_7e57_7e57_7e57;

/// The initial checkpoint is evaluated under H0.
const INITIAL_MODES: &[EvalMode] = &[EvalMode::H0];

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
    /// The same probe under each declarative sibling of the pool, by harness name: the context
    /// lock (does the good decision move only where a sibling's context is present?).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub probe_siblings: BTreeMap<String, BTreeMap<String, harness_warmstart::FamilyProbe>>,
}

/// One line of `eval/cross.jsonl` (RQ6, Figure 4): a checkpoint on the test tasks under a
/// harness that was never in its training pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrossRecord {
    /// The unseen harness's id.
    pub harness: String,
    /// Its name.
    pub harness_name: String,
    /// The evaluation (`mode` is `unseen`).
    #[serde(flatten)]
    pub test: TestRecord,
}

/// The harnesses RQ6 evaluates as unseen, and those it was offered and left out as
/// `(name, reason)`.
pub type UnseenSelection = (Vec<Harness>, Vec<(String, String)>);

/// What an agent program of the pool declares about itself, as the mechanisms of a
/// declarative harness: the hooks its environment hands the program (`AGENT_HOOKS`, as
/// `harness_external::agents::mirror_sibling` writes them for the bundled agent). Its system
/// prompt (`AGENT_SYSTEM`) is H0's, rendered, and is not compared. A program that declares no
/// hooks is its own code, and nothing of it can be compared.
fn program_mechanisms(
    program: &Harness,
    base: &Harness,
) -> Vec<harness_core::harness::mechanism::Mechanism> {
    let Ok(external) = harness_external::program::ExternalHarness::from_harness(program) else {
        return Vec::new();
    };
    let mut declared = base.clone();
    let hooks = external
        .env
        .get("AGENT_HOOKS")
        .and_then(|text| serde_json::from_str::<Vec<serde_json::Value>>(text).ok())
        .unwrap_or_default();
    for mut hook in hooks {
        let Some(name) = hook["name"].as_str().map(str::to_string) else {
            continue;
        };
        if let Some(fields) = hook.as_object_mut() {
            fields.remove("name");
        }
        if let Ok(spec) = serde_json::from_value::<harness_core::harness::HookSpec>(hook) {
            declared.hooks.insert(name, spec);
        }
    }
    harness_core::harness::mechanism::mechanisms(&declared, base)
}

/// The harnesses of `eval.harnesses` that RQ6 may call unseen, each once, in the order given:
/// `"unseen"` the environment's unseen set (the embedded default's
/// [`harness_warmstart::environment::unseen_harnesses`]), `"builtin"` its hand-written
/// siblings, a path a saved pool's members besides its H0 or one harness JSON file. A harness
/// in `pool`, or sharing a hook message, rule text or mechanism with a declarative pool member,
/// with the hooks an agent program of the pool declares, or (on the embedded default) with a
/// harness the warm start demonstrated under, is left out;
/// the second list names each with the reason.
pub fn unseen_selection(wb: &Workbench, pool: &SiblingPool) -> Result<UnseenSelection> {
    use harness_core::harness::mechanism::{mechanisms, shared_mechanism};
    let mut out: Vec<Harness> = Vec::new();
    let mut left_out: Vec<(String, String)> = Vec::new();
    let base = pool.base();
    // The warm start's demonstrations first (on the embedded default), then the pool.
    let mut known: Vec<(String, Vec<harness_core::harness::mechanism::Mechanism>)> = Vec::new();
    if wb.cfg.env.name == "default" {
        known.extend(
            harness_warmstart::environment::demonstrated_harnesses(base)
                .iter()
                .map(|h| {
                    (
                        format!("the warm start's demonstrations under {}", h.name),
                        mechanisms(h, base),
                    )
                }),
        );
    }
    known.extend(pool.auxiliaries().map(|h| {
        let m = if h.is_external() {
            program_mechanisms(h, base)
        } else {
            mechanisms(h, base)
        };
        (format!("pool member {}", h.name), m)
    }));
    for (i, source) in wb.cfg.eval.harnesses.iter().enumerate() {
        let found: Vec<Harness> = if source == "unseen" {
            if wb.cfg.env.name != "default" {
                return Err(Error::Config {
                    file: wb.layout.config(),
                    field: format!("eval.harnesses[{i}]"),
                    message: format!(
                        "`unseen` is the embedded default's unseen set; env `{}` has none: name \"builtin\", a pool directory or a harness JSON file",
                        wb.cfg.env.name
                    ),
                });
            }
            harness_warmstart::environment::unseen_harnesses(base)
        } else if source == "builtin" {
            wb.builtin_siblings.clone()
        } else {
            let path = Path::new(source);
            if path.join(harness_pool::POOL_FILE).is_file() {
                let other = SiblingPool::load(path).at("evaluate")?;
                other.auxiliaries().cloned().collect()
            } else if path.is_file() {
                vec![Harness::load(path).at("evaluate")?]
            } else {
                return Err(Error::Config {
                    file: wb.layout.config(),
                    field: format!("eval.harnesses[{i}]"),
                    message: format!(
                        "`{source}` is not \"unseen\", \"builtin\", a pool directory (with {}) or a harness JSON file",
                        harness_pool::POOL_FILE
                    ),
                });
            }
        };
        for h in found {
            let id = h.id();
            if out.iter().any(|o| o.id() == id) || left_out.iter().any(|(n, _)| *n == h.name) {
                continue;
            }
            if pool.contains(&id) {
                left_out.push((h.name.clone(), "it is in the training pool".into()));
                continue;
            }
            let mine = mechanisms(&h, base);
            let clash = known.iter().find_map(|(who, m)| {
                shared_mechanism(&mine, m).map(|why| format!("{why}, with {who}"))
            });
            match clash {
                Some(why) => left_out.push((h.name.clone(), why)),
                None => out.push(h),
            }
        }
    }
    Ok((out, left_out))
}

/// The harnesses of [`unseen_selection`] that are evaluated.
pub fn unseen_harnesses(wb: &Workbench, pool: &SiblingPool) -> Result<Vec<Harness>> {
    Ok(unseen_selection(wb, pool)?.0)
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

/// What the test episodes of one checkpoint left: per task its result, its rewards, and the
/// decision-point choices of each DBBench episode.
struct TestEpisodes {
    per_task: Vec<TaskResult>,
    rewards: Vec<Vec<f32>>,
    decisions: Vec<Vec<Vec<harness_envs::labels::Decision>>>,
    /// Per task and attempt: the environment labeller's behaviour labels, with each
    /// decision-point choice as a flag (`super::transfer::behaviour_labels`).
    labels: Vec<Vec<harness_core::TrajectoryLabels>>,
    /// Per task and attempt: the LLM labeller's labels of the environment labeller's features
    /// (`None`: no LLM labeller; empty: its answers stayed unusable).
    llm_labels: Vec<Vec<Option<harness_core::TrajectoryLabels>>>,
}

/// The harness each test task runs under.
enum Under<'a> {
    /// The pool member `choice` names for the task (H0 for a task it does not name).
    Choice(&'a BTreeMap<String, harness_core::HarnessId>),
    /// One harness for every task (a search's H_best, an unseen harness).
    Fixed(&'a Harness),
}

/// What the LLM labeller spent on one checkpoint's H0 test attempts (a line of
/// `eval/labeller.jsonl`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LabellerUsage {
    /// The checkpoint (`initial` or a method).
    pub method: String,
    /// Chat requests, retries included.
    pub requests: u64,
    /// Prompt tokens the endpoint reported.
    pub prompt_tokens: u64,
    /// Completion tokens the endpoint reported.
    pub completion_tokens: u64,
    /// Malformed answers sent back.
    pub rejected_answers: usize,
    /// Attempts left without LLM labels (the report's Table 3 (LLM labels) leaves them out).
    pub unlabelled: usize,
}

/// Table 3's LLM labeller, when `roles.llm` is set and `roles.llm_roles` names `labeller`, with
/// its own token counter.
fn llm_labeller(
    wb: &Workbench,
) -> Option<(harness_router::LlmLabeller, harness_router::TokenCounter)> {
    let chat = wb
        .chat
        .as_ref()
        .filter(|_| wb.cfg.roles.asks_llm("labeller"))?;
    let tokens = harness_router::TokenCounter::new();
    let mut settings = harness_router::LlmLabellerSettings {
        seed: wb.cfg.seed,
        ..Default::default()
    };
    if let Some(max) = wb.cfg.roles.max_tokens {
        settings.max_tokens = max;
    }
    Some((
        harness_router::LlmLabeller::new(chat.clone(), settings, tokens.clone()),
        tokens,
    ))
}

/// Run `policy` k times per test task under the harness `under` picks.
async fn test_episodes(
    wb: &Workbench,
    policy: &Arc<dyn Policy>,
    pool: &SiblingPool,
    under: &Under<'_>,
    label: &str,
    llm: Option<&harness_router::LlmLabeller>,
) -> Result<TestEpisodes> {
    let k = wb.cfg.eval.k;
    let options = EpisodeOptions {
        sampling: SamplingParams {
            temperature: wb.cfg.rollout.temperature,
            ..SamplingParams::default()
        },
    };
    let base = pool.base();
    // Agent programs in the pool (or an unseen one) act through a proxy in front of `policy`.
    let env = match under {
        Under::Fixed(h) if h.is_external() && !pool.contains(&h.id()) => {
            let mut with = harness_pool::SiblingPool::new(pool.base().clone()).at("evaluate")?;
            with.add((*h).clone()).at("evaluate")?;
            wb.env_for(&with, policy.clone()).await?
        }
        _ => wb.env_for(pool, policy.clone()).await?,
    };
    let jobs: Vec<(usize, usize)> = (0..wb.test.len())
        .flat_map(|t| (0..k).map(move |a| (t, a)))
        .collect();
    let bar = wb.progress.bar(jobs.len() as u64, format!("test {label}"));
    let seed = wb.cfg.seed ^ TEST_SEED_SALT;
    type Outcome = (
        usize,
        f32,
        Vec<harness_envs::labels::Decision>,
        harness_core::TrajectoryLabels,
        Option<harness_core::TrajectoryLabels>,
    );
    let labellers = harness_envs::labels::builtin_labellers();
    let labellers = &labellers;
    let outcomes: Vec<harness_core::Result<Outcome>> = futures::stream::iter(jobs)
        .map(|(t, a)| {
            let task: &Task = &wb.test[t];
            let harness = match under {
                Under::Choice(choice) => choice
                    .get(&task.id)
                    .and_then(|id| pool.get(id))
                    .unwrap_or(base),
                Under::Fixed(h) => h,
            };
            let env = env.clone();
            let options = options.clone();
            let bar = bar.clone();
            async move {
                // The same episode seed per (task, attempt) for every method and harness.
                let episode_seed = call_seed(seed, (t * k + a) as u32);
                let trajectory = run_episode_with(
                    policy.as_ref(),
                    harness,
                    env.as_ref(),
                    task,
                    episode_seed,
                    &options,
                )
                .await?;
                bar.inc(1);
                let decisions = if trajectory.env == harness_envs::dbbench::ENV_NAME {
                    harness_envs::labels::dbbench_decisions(&trajectory)
                } else {
                    Vec::new()
                };
                let labels = super::transfer::behaviour_labels(labellers, &trajectory);
                // The paper's Table 3 labels complete trajectories with an LLM, on the
                // behaviours the environment's labeller measures.
                let llm_labels = match llm {
                    Some(llm) => {
                        let features = labellers
                            .iter()
                            .find(|l| l.env() == trajectory.env)
                            .map_or_else(harness_core::GenericLabeller::generic_features, |l| {
                                l.features()
                            });
                        // Unusable answers leave an empty map: labelled by nobody, counted.
                        Some(llm.label(&features, &trajectory).await.unwrap_or_default())
                    }
                    None => None,
                };
                Ok((t, trajectory.reward(), decisions, labels, llm_labels))
            }
        })
        .buffered(wb.cfg.rollout.concurrency)
        .collect()
        .await;
    bar.finish_and_clear();
    let mut rewards = vec![Vec::new(); wb.test.len()];
    let mut decisions = vec![Vec::new(); wb.test.len()];
    let mut labels = vec![Vec::new(); wb.test.len()];
    let mut llm_labels = vec![Vec::new(); wb.test.len()];
    for outcome in outcomes {
        let (t, r, d, l, m) = outcome.at("evaluate")?;
        rewards[t].push(r);
        decisions[t].push(d);
        labels[t].push(l);
        llm_labels[t].push(m);
    }
    let per_task = wb
        .test
        .iter()
        .zip(&rewards)
        .map(|(task, r)| TaskResult {
            task: task.id.clone(),
            harness: match under {
                Under::Choice(choice) => choice
                    .get(&task.id)
                    .map_or_else(|| pool.base_id().to_string(), |id| id.to_string()),
                Under::Fixed(h) => h.id().to_string(),
            },
            successes: r.iter().filter(|&&x| x >= 1.0).count(),
            attempts: r.len(),
        })
        .collect();
    Ok(TestEpisodes {
        per_task,
        rewards,
        decisions,
        labels,
        llm_labels,
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
        probe_siblings: BTreeMap::new(),
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

/// The test record of `name` under Rank-1: each test task under its `choice`, with the same
/// episode seeds as the H0 evaluation; `started` is when this evaluation began.
async fn rank1_record(
    wb: &Workbench,
    policy: &Arc<dyn Policy>,
    pool: &SiblingPool,
    choice: &BTreeMap<String, harness_core::HarnessId>,
    name: &str,
    label: &str,
    started: Instant,
) -> Result<TestRecord> {
    let routed = test_episodes(
        wb,
        policy,
        pool,
        &Under::Choice(choice),
        &format!("{name} rank-1"),
        None,
    )
    .await?;
    Ok(record(
        wb,
        name,
        label,
        EvalMode::Rank1.name(),
        routed.per_task,
        &routed.rewards,
        started.elapsed().as_secs_f64(),
    ))
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

/// Test evaluation of the initial checkpoint (`method = None`) or of a method, in the modes its
/// [`crate::methods::METHODS`] entry names: under H0, and under the router's Rank-1 (with the
/// method's final calibration, or the first for a method that updates no weights); for the
/// method with `rank_table` (Harness-S), Table 5 before and after training and Rank-1 from the
/// "after" ranking. Appends to `eval/test.jsonl` (and `eval/rank.jsonl`, `eval/routing.jsonl`,
/// `eval/behaviour.jsonl`), replacing the method's earlier lines.
pub async fn evaluate(
    wb: &Workbench,
    pool: &SiblingPool,
    method: Option<Method>,
) -> Result<Vec<TestRecord>> {
    let (name, label, checkpoint, modes, rank_table) = match method {
        None => (
            "initial",
            "Initial policy".to_string(),
            wb.checkpoint.clone(),
            INITIAL_MODES,
            false,
        ),
        Some(m) => {
            let checkpoint = checkpoint_of(wb, m)?;
            (
                m.name(),
                method_label(wb, pool, m)?,
                checkpoint,
                m.spec().eval,
                m.spec().rank_table,
            )
        }
    };
    let local = wb.local_policy(&checkpoint, name)?;
    let policy: Arc<dyn Policy> = local.clone();
    let mut records = Vec::new();
    let mut behaviour = None;
    if modes.contains(&EvalMode::H0) {
        let started = Instant::now();
        let none = BTreeMap::new();
        let labeller = llm_labeller(wb);
        let h0 = test_episodes(
            wb,
            &policy,
            pool,
            &Under::Choice(&none),
            name,
            labeller.as_ref().map(|(l, _)| l),
        )
        .await?;
        if let Some((labeller, tokens)) = &labeller {
            let used = tokens.role(harness_router::LABELLER_ROLE);
            let usage = LabellerUsage {
                method: name.to_string(),
                requests: used.requests,
                prompt_tokens: used.usage.prompt_tokens,
                completion_tokens: used.usage.completion_tokens,
                rejected_answers: labeller.rejected_answers(),
                unlabelled: labeller.failures(),
            };
            wb.progress.println(format!(
                "LLM labeller ({name}): {} requests, {} prompt and {} completion tokens, {} attempts unlabelled",
                usage.requests, usage.prompt_tokens, usage.completion_tokens, usage.unlabelled
            ));
            replace_lines(&wb.layout.labeller_usage(), name, &[usage])?;
        }
        let mut record_h0 = behaviour_record(wb, name, &label, &h0);
        if wb.cfg.env.name == "default" && !wb.base.is_external() {
            let bar = wb.progress.spinner("decision-point probe under H0");
            record_h0.probe = harness_warmstart::probe_decisions(
                &local,
                &wb.base,
                &wb.test,
                wb.cfg.seed ^ TEST_SEED_SALT,
                crate::organism::settings(&wb.cfg)?.organism,
            )
            .await
            .at("evaluate")?;
            bar.finish_and_clear();
            record_h0.probe_siblings = probe_siblings(wb, pool, &local).await?;
        }
        behaviour = Some(record_h0);
        let episodes =
            super::transfer::episode_records(wb, name, &h0.rewards, &h0.labels, &h0.llm_labels);
        replace_lines(&wb.layout.episode_results(), name, &episodes)?;
        if let Some(m) = method {
            let diagnostics = super::diagnostics::diagnostics(wb, pool, m, &label)?;
            replace_lines(&wb.layout.diagnostics_results(), name, &[diagnostics])?;
        }
        records.push(record(
            wb,
            name,
            &label,
            EvalMode::H0.name(),
            h0.per_task,
            &h0.rewards,
            started.elapsed().as_secs_f64(),
        ));
    }
    let mut routing = Vec::new();
    let mut ranks = Vec::new();
    if let (Some(m), true) = (method, rank_table) {
        let calibrations = wb.layout.train(m).join("calibrations");
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
            let router = rank_router(wb, calibration)?;
            let bar = wb
                .progress
                .spinner(format!("router ranks ({stage} training)"));
            let started = Instant::now();
            let environments = wb.environments_for(pool, stage_policy.clone()).await?;
            let report = evaluate_ranks(
                &router,
                stage_policy.as_ref(),
                pool,
                &environments,
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
            if stage == "after" && modes.contains(&EvalMode::Rank1) {
                // Rank-1 of Table 1: each test task under the harness the router ranks first,
                // with the same episode seeds as the H0 evaluation.
                let choice: BTreeMap<String, harness_core::HarnessId> = report
                    .rankings
                    .iter()
                    .filter_map(|(task, ids)| Some((task.clone(), ids.first()?.clone())))
                    .collect();
                records
                    .push(rank1_record(wb, &policy, pool, &choice, name, &label, started).await?);
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
    } else if let (Some(m), true) = (method, modes.contains(&EvalMode::Rank1)) {
        // Rank-1 without Table 5: a method that updates no weights routes with the first
        // calibration (Table 1's "Harness-S (HE only)"), a trained one with its last.
        let calibration = if m.updates_weights() {
            let calibrations = wb.layout.train(m).join("calibrations");
            Calibration::load_latest(&calibrations)
                .at("evaluate")?
                .ok_or_else(|| Error::input("evaluate", &calibrations, "no final calibration"))?
        } else {
            first_calibration(wb, "evaluate")?
        };
        let started = Instant::now();
        let choice = rank1_choices(wb, pool, calibration).await?;
        records.push(rank1_record(wb, &policy, pool, &choice, name, &label, started).await?);
    }
    if let (Some(m), true) = (method, modes.contains(&EvalMode::HBest)) {
        // Meta-Harness and WHALE: one searched harness for every test task, with the same
        // episode seeds as every other evaluation.
        let best = load_h_best(wb, m)?;
        let started = Instant::now();
        let run = test_episodes(
            wb,
            &policy,
            pool,
            &Under::Fixed(&best),
            &format!("{name} H_best"),
            None,
        )
        .await?;
        records.push(record(
            wb,
            name,
            &label,
            EvalMode::HBest.name(),
            run.per_task,
            &run.rewards,
            started.elapsed().as_secs_f64(),
        ));
    }
    let mut cross = Vec::new();
    let (unseen, left_out) = unseen_selection(wb, pool)?;
    if method.is_none() {
        for (harness, why) in &left_out {
            wb.progress.println(format!(
                "eval.harnesses: {harness} is not unseen ({why}): left out of Figure 4"
            ));
        }
        let record = serde_json::json!({
            "unseen": unseen.iter().map(|h| &h.name).collect::<Vec<_>>(),
            "left_out": left_out
                .iter()
                .map(|(h, why)| serde_json::json!({"harness": h, "reason": why}))
                .collect::<Vec<_>>(),
        });
        let path = wb.layout.cross_results().with_file_name("unseen.json");
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)
                .map_err(|e| Error::input("evaluate", dir, e.to_string()))?;
        }
        harness_core::fsutil::write_atomic(
            &path,
            serde_json::to_string_pretty(&record)
                .unwrap_or_else(|_| unreachable!("plain data"))
                .as_bytes(),
        )
        .at("evaluate")?;
    }
    if unseen.is_empty() && !wb.cfg.eval.harnesses.is_empty() {
        wb.progress.println(format!(
            "eval.harnesses: no harness of {:?} is unseen (see eval/unseen.json); no cross-harness evaluation (Figure 4) for {name}",
            wb.cfg.eval.harnesses
        ));
    }
    for unseen in unseen {
        let started = Instant::now();
        let run = test_episodes(
            wb,
            &policy,
            pool,
            &Under::Fixed(&unseen),
            &format!("{name} under {}", unseen.name),
            None,
        )
        .await?;
        let r = record(
            wb,
            name,
            &label,
            "unseen",
            run.per_task,
            &run.rewards,
            started.elapsed().as_secs_f64(),
        );
        cross.push(CrossRecord {
            harness: unseen.id().to_string(),
            harness_name: unseen.name.clone(),
            test: r,
        });
    }
    if let Some(m) = method
        && !m.has_training_stage()
    {
        // No training stage writes this method's cost: record the shared stages its row of
        // Table 10 counts (the pool and the first calibration of Rank-1).
        cost::write(
            &StageCost {
                stage: "none".into(),
                shared: m.shared_stages(),
                proposals: None,
                ..StageCost::default()
            },
            &wb.layout.train(m),
        )?;
    }
    replace_lines(&wb.layout.test_results(), name, &records)?;
    if !cross.is_empty() {
        replace_lines(&wb.layout.cross_results(), name, &cross)?;
    }
    for c in &cross {
        wb.progress.println(format!(
            "test {} under unseen {}: Pass@{} {:.3}, Avg@{} {:.3}",
            c.test.label, c.harness_name, c.test.k, c.test.pass_at_k, c.test.k, c.test.avg_at_k
        ));
    }
    if let Some(behaviour) = behaviour.filter(|b| !b.choices.is_empty()) {
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

/// The Adaptive Harness Router of the test evaluation: `calibration`'s evidence and a fresh
/// panel of the run's voters.
fn rank_router(wb: &Workbench, calibration: Calibration) -> Result<AdaptiveRouter> {
    let tokens = TokenCounter::new();
    let (_, voters) = roles(wb, wb.cfg.seed, &tokens);
    let evidence = EvidenceCell::new();
    evidence.set(calibration).at("evaluate")?;
    AdaptiveRouter::new(evidence, voters, RouterSettings::default()).at("evaluate")
}

/// Each test task's Rank-1 harness under `calibration` (Eq. 12: the full pool, H0 included),
/// asked as the Rank-r evaluation asks (the same ranks, seeds and voters), so the choices are
/// Table 5's Rank-1 for that calibration. Every choice is made before any test episode runs.
pub async fn rank1_choices(
    wb: &Workbench,
    pool: &SiblingPool,
    calibration: Calibration,
) -> Result<BTreeMap<String, harness_core::HarnessId>> {
    let router = rank_router(wb, calibration)?;
    let ranks = wb.cfg.eval.ranks.min(pool.len());
    let seed = wb.cfg.seed ^ TEST_SEED_SALT;
    let mut choice = BTreeMap::new();
    for (i, task) in wb.test.iter().enumerate() {
        let ids = router
            .select(&SelectionRequest {
                task: task.clone(),
                k: ranks,
                mode: SelectionMode::Inference,
                seed: call_seed(seed, i as u32),
            })
            .await
            .at("evaluate")?;
        let first = ids
            .into_iter()
            .next()
            .filter(|id| pool.contains(id))
            .ok_or_else(|| {
                Error::input(
                    "evaluate",
                    wb.layout.calibration(),
                    format!(
                        "the router named no pool member first for test task `{}`",
                        task.id
                    ),
                )
            })?;
        choice.insert(task.id.clone(), first);
    }
    Ok(choice)
}

/// Whether `eval/test.jsonl` already holds every evaluation of `method` (`None`: the
/// initial checkpoint under H0).
pub fn has_test_record(wb: &Workbench, pool: &SiblingPool, method: Option<Method>) -> Result<bool> {
    let name = method.map_or("initial", Method::name);
    let modes = method.map_or(INITIAL_MODES, |m| m.spec().eval);
    let path = wb.layout.test_results();
    let Ok(text) = std::fs::read_to_string(&path) else {
        return Ok(false);
    };
    let mut found = Vec::new();
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
        if record.method == name {
            found.push(record.mode);
        }
    }
    if !modes.iter().all(|m| found.iter().any(|f| f == m.name())) {
        return Ok(false);
    }
    // With unseen harnesses configured, the method's line under each of them is due too.
    let unseen = unseen_harnesses(wb, pool)?;
    if unseen.is_empty() {
        return Ok(true);
    }
    let cross = std::fs::read_to_string(wb.layout.cross_results()).unwrap_or_default();
    let done: Vec<String> = cross
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|v| v["method"] == name)
        .filter_map(|v| v["harness"].as_str().map(str::to_string))
        .collect();
    Ok(unseen.iter().all(|h| done.contains(&h.id().to_string())))
}

/// Rewrite a JSONL file without `method`'s old lines, then with `lines` appended.
/// The decision-point probe of `local` under every declarative sibling of `pool` (agent
/// programs have no script to teacher-force), keyed by harness name (the id appended where two
/// members share a name).
async fn probe_siblings(
    wb: &Workbench,
    pool: &SiblingPool,
    local: &Arc<CandlePolicy>,
) -> Result<BTreeMap<String, BTreeMap<String, harness_warmstart::FamilyProbe>>> {
    let mut out = BTreeMap::new();
    let siblings: Vec<&harness_core::Harness> =
        pool.auxiliaries().filter(|h| !h.is_external()).collect();
    if siblings.is_empty() {
        return Ok(out);
    }
    let organism = crate::organism::settings(&wb.cfg)?.organism;
    let bar = wb
        .progress
        .spinner("decision-point probe under each sibling");
    for sibling in siblings {
        let probe = harness_warmstart::probe_decisions(
            local,
            sibling,
            &wb.test,
            wb.cfg.seed ^ TEST_SEED_SALT,
            organism,
        )
        .await
        .at("evaluate")?;
        let mut key = sibling.name.clone();
        if out.contains_key(&key) {
            key = format!("{} ({})", sibling.name, sibling.id());
        }
        out.insert(key, probe);
    }
    bar.finish_and_clear();
    Ok(out)
}

pub(crate) fn replace_lines<T: Serialize>(path: &Path, method: &str, lines: &[T]) -> Result<()> {
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
    use super::program_mechanisms;
    use harness_external::agents::{DBBENCH_AGENT, MirrorSpec, mirror_sibling};
    use harness_warmstart::environment::{EpisodeLimits, compact_base};

    #[test]
    fn an_agent_programs_declared_hooks_count_as_its_mechanisms() {
        let base = compact_base(&EpisodeLimits::default());
        let mut hooks = base.hooks.clone();
        let hook: harness_core::harness::HookSpec = serde_json::from_value(serde_json::json!({
            "event": "after_tool",
            "action": "warn",
            "condition": "remaining_steps_lte",
            "parameters": {"threshold": 1},
            "message": "One step left: commit the answer now."
        }))
        .unwrap();
        hooks.insert("last-step".into(), hook);
        let program = mirror_sibling(MirrorSpec {
            base: &base,
            hooks,
            no_call_reply: None,
            command: vec!["python3".into(), "-c".into(), DBBENCH_AGENT.into()],
            name: "python-agent-last-step".into(),
            timeout_s: 60.0,
        })
        .unwrap()
        .to_harness();
        assert!(program.is_external());
        let found = program_mechanisms(&program, &base);
        assert!(
            found
                .iter()
                .any(|m| m.component == "hook" && m.text == "One step left: commit the answer now."),
            "{found:?}"
        );
        // H0's own hooks and prompt are not the program's.
        assert_eq!(found.len(), 1, "{found:?}");
        // A declarative harness is not a program: nothing to read.
        assert!(program_mechanisms(&base, &base).is_empty());
    }
}
