//! The run directory and its files, read into plain data: one [`SeedRun`] per seed (the
//! directory itself, or each `seed-<s>/` under it), each with its methods' training records,
//! its test and Rank-r evaluations, and its evolution's diversity views.
//!
//! ```text
//! <out>/ (or <out>/seed-<s>/ per seed)
//!   run.json                 the resolved run configuration ("seed")
//!   evolve/                  harness-evolve's write_reports (diversity.json, figure*.svg, rounds.json)
//!   train/<method>/          harness-rollout run dirs: metrics.jsonl, groups.jsonl, cost.json
//!   eval/test.jsonl          one TestEval per line
//!   eval/rank.jsonl          one RankLine per line (Table 5)
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use harness_core::HarnessId;
use harness_evolve::DiversityReport;
use harness_evolve::round::RoundReport;
use harness_rollout::{
    COST_FILE, CalibrationRecord, Cost, EvalRecord, GROUPS_FILE, GroupRecord, METRICS_FILE,
    UpdateRecord,
};
use harness_router::RankReport;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::{Error, Result};

/// The run configuration file of a seed.
pub const RUN_FILE: &str = "run.json";
/// The folder of the training runs, one sub-folder per method.
pub const TRAIN_DIR: &str = "train";
/// The folder of harness-evolve's reports.
pub const EVOLVE_DIR: &str = "evolve";
/// The test evaluations, relative to a seed's folder.
pub const TEST_FILE: &str = "eval/test.jsonl";
/// The Rank-r evaluations, relative to a seed's folder.
pub const RANK_FILE: &str = "eval/rank.jsonl";
/// Decision-point choices of the H0 test episodes, one line per method.
pub const BEHAVIOUR_FILE: &str = "eval/behaviour.jsonl";
/// The router's Rank-1 harness per test task, one line per task, stage and method.
pub const ROUTING_FILE: &str = "eval/routing.jsonl";
/// Test evaluations under harnesses outside the training pool (RQ6), in a seed's folder.
pub const CROSS_FILE: &str = "eval/cross.jsonl";
/// A stage's spending, inside its folder (`evolve/`, `calibration/`, `train/<method>/`).
pub const STAGE_COST_FILE: &str = "stage_cost.json";
/// The first calibration's folder, in a seed's folder.
pub const CALIBRATION_DIR: &str = "calibration";
/// Every H0 test attempt's reward and behaviour labels, in a seed's folder.
pub const EPISODES_FILE: &str = "eval/episodes.jsonl";
/// The agent programs (external harnesses) of the pool a seed trained on, names by id.
pub const PROGRAMS_FILE: &str = "programs.json";
/// A method's calibrations during training, inside `train/<method>/`.
pub const METHOD_CALIBRATIONS_DIR: &str = "calibrations";
/// A method's harness-search rounds, inside `train/<method>/`.
pub const SEARCH_FILE: &str = "search.jsonl";

/// One H0 test attempt.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AttemptRecord {
    /// Its reward.
    pub reward: f32,
    /// Its behaviour labels (a labeller's features; `decision:<point>=<choice>` flags).
    pub labels: BTreeMap<String, f64>,
    /// The LLM labeller's labels of the same features, 0 or 1 (absent: no LLM labeller ran;
    /// empty: its answers stayed unusable).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub llm_labels: Option<BTreeMap<String, f64>>,
}

/// One line of `eval/episodes.jsonl`: one test task's H0 attempts of one checkpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EpisodeLine {
    /// The method (`initial` before training).
    pub method: String,
    /// The test task.
    pub task: String,
    /// Its family.
    pub family: String,
    /// Its attempts, in seed order (the same seeds for every method).
    pub attempts: Vec<AttemptRecord>,
}

/// Table 4's transfer cases, in a seed's folder.
pub const TRANSFER_FILE: &str = "eval/transfer.jsonl";

/// The rescue diagnostics per method, in a seed's folder.
pub const DIAGNOSTICS_FILE: &str = "eval/diagnostics.jsonl";

/// How a method's rescue rollouts first departed from H0's context (counts of rollouts).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct InterventionCounts {
    /// The first prompt already differed (prompt rules, skills, tool view): token 0.
    pub prompt: usize,
    /// A harness message (a hook's) after the first policy turn was the first difference.
    pub message: usize,
    /// No difference at all (H0 rescue, or a sibling whose hooks never fired).
    pub none: usize,
}

/// One task family's rescue diagnostics of a method.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FamilyDiagnostics {
    /// Training groups of the family.
    pub groups: usize,
    /// Of which held at least one H0 success among their initial rollouts (GRPO's own signal).
    pub groups_with_h0_success: usize,
    /// Rescued groups that went to the learner.
    pub rescued_groups: usize,
    /// Their successful rescue rollouts.
    pub successful_rescues: usize,
    /// Of which made the family's planted mistake before the sibling's first intervention.
    pub planted_before_intervention: usize,
}

/// One line of `eval/diagnostics.jsonl`: why a method's rescue does or does not carry over to
/// H0, from its training files (see harness-pipeline's `stages::diagnostics`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DiagnosticsLine {
    /// The method.
    pub method: String,
    /// Its label.
    pub label: String,
    /// Rescue rollouts of retained rescued groups.
    pub rescue_rollouts: usize,
    /// Of which successful.
    pub successful_rescues: usize,
    /// Their policy tokens.
    pub policy_tokens: usize,
    /// Of which generated before the sibling's first intervention (an H0-identical context).
    pub tokens_before: usize,
    /// Policy tokens of rescue rollouts with positive advantage (Eq. 6 within the group).
    pub positive_tokens: usize,
    /// Of which before the first intervention.
    pub positive_tokens_before: usize,
    /// Where the rollouts first departed from H0.
    pub interventions: InterventionCounts,
    /// Per task family.
    pub families: BTreeMap<String, FamilyDiagnostics>,
}

/// External-model use of one role.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tokens {
    /// Answered requests.
    pub calls: u64,
    /// Prompt tokens the provider reported.
    pub prompt_tokens: u64,
    /// Completion tokens the provider reported.
    pub completion_tokens: u64,
}

impl Tokens {
    /// Prompt plus completion tokens.
    pub fn total(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }
}

/// `stage_cost.json`: what one stage spent (Table 10).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct StageCost {
    /// `evolve`, `calibrate`, `search` (Meta-Harness, WHALE), `train`, or `none` (a method
    /// without a training stage, recorded for the stages it shares).
    pub stage: String,
    /// Episodes by kind: `search` (harness search), `training` (training rollouts, discarded
    /// base attempts included), `calibration` (paired validation runs).
    #[serde(default)]
    pub rollouts: BTreeMap<String, u64>,
    /// Wall seconds by the same kinds.
    #[serde(default)]
    pub seconds: BTreeMap<String, f64>,
    /// External-model use by role (analyst, editor, proposer, profiler, voter, ...).
    #[serde(default)]
    pub tokens: BTreeMap<String, Tokens>,
    /// The seed's shared stages this method's pipeline also ran on: `evolve` (the pool it
    /// rescues or routes with) and `calibrate` (the first calibration it reads).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub shared: Vec<String>,
    /// A harness search's proposals: evolution's budget (`evolve.proposal_budgets` summed), or
    /// what a Meta-Harness or WHALE search spent (scored, rejected and empty slots of every
    /// round); absent for stages that search nothing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proposals: Option<u64>,
}

/// A behaviour on which a transfer case's trained success differs from the initial failure.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BehaviourDiff {
    /// The label (a labeller feature, or `decision:<point>=<choice>`).
    pub feature: String,
    /// Its value on the training rescue rollout.
    pub rescue: f64,
    /// On the trained policy's successful held-out attempt.
    pub trained: f64,
    /// On the initial policy's failed attempt with the same seed.
    pub initial: f64,
}

/// The training rescue a case traces back to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RescueEvidence {
    /// The rescued training task.
    pub task: String,
    /// The update its group entered.
    pub update: u64,
    /// The policy version that update produced: the update's `metrics.jsonl` line says the
    /// learner applied it (`applied: true`). `None` in files written before the check.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<u64>,
    /// The sibling whose rollout succeeded: id.
    pub harness: String,
    /// Its name.
    pub harness_name: String,
}

/// One line of `eval/transfer.jsonl` (Table 4): a kind a method rescued in training, traced to a
/// held-out test instance that the trained policy solves under H0 where the initial policy
/// failed, with the behaviours that made the difference.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TransferCase {
    /// The trained method.
    pub method: String,
    /// Its label.
    pub label: String,
    /// The kind (task family).
    pub family: String,
    /// H0 attempts of the method's training on this family.
    pub h0_training_attempts: usize,
    /// Of which successful (0: never solved under H0 in training).
    pub h0_training_successes: usize,
    /// Training groups of this family with a successful rescue that entered an update.
    pub rescued_groups: usize,
    /// The first of them.
    pub rescue: RescueEvidence,
    /// The held-out test task (`None`: no held-out instance of the family qualifies).
    pub test_task: Option<String>,
    /// The attempt (seed) compared.
    pub attempt: usize,
    /// Attempts per test task.
    pub attempts: usize,
    /// The trained policy's successes on the test task under H0.
    pub trained_successes: usize,
    /// The initial policy's (0 in every case).
    pub initial_successes: usize,
    /// Plain GRPO's, when GRPO was evaluated.
    pub grpo_successes: Option<usize>,
    /// The behaviours that made the difference, largest change first.
    pub behaviours: Vec<BehaviourDiff>,
}

/// One line of `eval/cross.jsonl`: a checkpoint on the test tasks under a harness that was
/// never in its training pool.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CrossLine {
    /// The unseen harness's id.
    pub harness: String,
    /// Its name.
    pub harness_name: String,
    /// The evaluation.
    #[serde(flatten)]
    pub test: TestEval,
}

/// One line of `eval/behaviour.jsonl`: what one checkpoint's H0 test episodes chose at each
/// decision point, by task family.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BehaviourLine {
    /// The method (`initial` before training).
    pub method: String,
    /// Its label.
    #[serde(default)]
    pub label: Option<String>,
    /// `h0`.
    pub mode: String,
    /// Episodes per family.
    pub episodes: BTreeMap<String, usize>,
    /// `family -> decision point -> choice -> episodes`.
    pub choices: BTreeMap<String, BTreeMap<String, BTreeMap<String, usize>>>,
    /// The decision-point probe per family (absent where the environment has none).
    #[serde(default)]
    pub probe: BTreeMap<String, ProbeCell>,
    /// The same probe under each declarative sibling of the pool (harness name -> family ->
    /// probe): the context lock, the good decision's probability where a sibling's context
    /// differs from H0's.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub probe_siblings: BTreeMap<String, BTreeMap<String, ProbeCell>>,
}

/// One family's decision-point probe in `eval/behaviour.jsonl`: the checkpoint's probability
/// of the good decision on the demonstration script's fixed contexts.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ProbeCell {
    /// Test tasks probed.
    pub tasks: usize,
    /// Mean two-way probability of the good token where the good and planted turns part.
    pub p_good: f64,
    /// Mean probability of the good token itself.
    #[serde(default)]
    pub p_good_token: f64,
    /// Mean log-ratio good / planted there (nats).
    #[serde(default)]
    pub log_ratio: f64,
    /// Each probed task's two-way probability.
    #[serde(default)]
    pub per_task: BTreeMap<String, f64>,
}

/// One line of `eval/routing.jsonl`: the router's Rank-1 harness for one test task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoutingLine {
    /// Before or after training.
    pub stage: RankStage,
    /// The routed method.
    pub method: String,
    /// The test task.
    pub task: String,
    /// Its family (reported, never routed on).
    pub family: String,
    /// The Rank-1 harness's id.
    pub rank1: String,
    /// Its name.
    pub rank1_name: String,
    /// Whether Rank-1 is H0.
    pub rank1_is_h0: bool,
}
/// The evolution's diversity views, inside [`EVOLVE_DIR`].
pub const DIVERSITY_FILE: &str = "diversity.json";
/// The evolution's round reports, inside [`EVOLVE_DIR`].
pub const ROUNDS_FILE: &str = "rounds.json";
/// The SVGs harness-evolve draws itself, inside [`EVOLVE_DIR`].
pub const EVOLVE_SVGS: [&str; 3] = ["figure1a.svg", "figure1b.svg", "figure5.svg"];

/// The harness a test evaluation ran under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EvalMode {
    /// The base harness for every task.
    H0,
    /// The router's top-ranked harness, chosen per task before its attempts.
    Rank1,
    /// One harness selected by a search (Meta-Harness, WHALE), the same for every task.
    #[serde(rename = "hbest")]
    HBest,
    /// A harness outside the training pool (`eval/cross.jsonl`).
    Unseen,
}

impl EvalMode {
    /// Every mode.
    pub const ALL: [EvalMode; 4] = [
        EvalMode::H0,
        EvalMode::Rank1,
        EvalMode::HBest,
        EvalMode::Unseen,
    ];

    /// The `mode` field of `eval/test.jsonl` (and of the other evaluation files).
    pub fn name(self) -> &'static str {
        match self {
            EvalMode::H0 => "h0",
            EvalMode::Rank1 => "rank1",
            EvalMode::HBest => "hbest",
            EvalMode::Unseen => "unseen",
        }
    }
}

/// One task of a test evaluation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestTaskOutcome {
    /// The task's id.
    pub task: String,
    /// The harness its attempts ran under.
    pub harness: HarnessId,
    /// Successful attempts.
    pub successes: u32,
    /// Attempts.
    pub attempts: u32,
}

/// One line of `eval/test.jsonl`: a checkpoint evaluated on the test tasks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TestEval {
    /// The method whose checkpoint it is (`initial` for the warm start before training).
    pub method: String,
    /// The method's display label.
    #[serde(default)]
    pub label: Option<String>,
    /// The harness it ran under.
    pub mode: EvalMode,
    /// Attempts per task.
    pub k: usize,
    /// Test tasks.
    pub tasks: usize,
    /// Fraction of tasks with at least one success in `k` attempts.
    pub pass_at_k: f64,
    /// Mean success over all attempts.
    pub avg_at_k: f64,
    /// Rollouts it ran.
    pub rollouts: u64,
    /// Seconds it took.
    pub seconds: f64,
    /// Per task.
    #[serde(default)]
    pub per_task: Vec<TestTaskOutcome>,
}

/// Whether a Rank-r evaluation came before or after training.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RankStage {
    /// The warm-started policy.
    Before,
    /// The trained policy.
    After,
}

/// One line of `eval/rank.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RankLine {
    /// Before or after training.
    pub stage: RankStage,
    /// The method whose router and policy were evaluated.
    pub method: String,
    /// harness-router's Rank-r report.
    pub report: RankReport,
}

/// One method's training run (`train/<method>/`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MethodRun {
    /// Its folder.
    pub dir: PathBuf,
    /// `metrics.jsonl` lines of kind `update`, in file order.
    pub updates: Vec<UpdateRecord>,
    /// `metrics.jsonl` lines of kind `eval`.
    pub evals: Vec<EvalRecord>,
    /// `metrics.jsonl` lines of kind `calibration`.
    pub calibrations: Vec<CalibrationRecord>,
    /// `groups.jsonl`.
    pub groups: Vec<GroupRecord>,
    /// `cost.json`, when written.
    pub cost: Option<Cost>,
    /// Each calibration in `calibrations/` (a routed method's re-anchorings), as paired
    /// outcomes of every sibling against H0, in index order.
    pub checkpoints: Vec<PairedCheckpoint>,
    /// `stage_cost.json`, when written.
    pub stage_cost: Option<StageCost>,
    /// `search.jsonl` (Meta-Harness, WHALE): one line per search round.
    pub searches: Vec<SearchRound>,
}

/// One round of a Meta-Harness or WHALE search, the fields of a `search.jsonl` line the report
/// reads.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct SearchRound {
    /// The round (1-based).
    pub round: usize,
    /// Candidates the round could score (its share of the search budget).
    pub budget: usize,
    /// Every scored candidate, the round's starting harness first.
    #[serde(default)]
    pub candidates: Vec<Value>,
    /// Proposals refused by validation or duplicating a scored candidate.
    pub rejected: usize,
    /// Slots the proposer left empty.
    pub empty: usize,
    /// The round stopped before its budget was spent (a run of proposals that scored nothing;
    /// absent in files written before the setting).
    #[serde(default)]
    pub stopped_unscored: bool,
    /// Episodes the round's search ran.
    pub rollouts: u64,
}

impl SearchRound {
    /// Candidates the round scored (its starting harness not counted).
    pub fn scored(&self) -> usize {
        self.candidates.len().saturating_sub(1)
    }
}

/// One calibration's paired outcomes (Figure 1c): per sibling, the validation tasks it solves
/// where H0 fails and the ones H0 solves where it fails, at the policy of that checkpoint.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PairedCheckpoint {
    /// The calibration's index.
    pub index: u32,
    /// Policy updates applied before it.
    pub update: u64,
    /// Whether it re-anchored the final policy.
    pub is_final: bool,
    /// Validation tasks.
    pub tasks: usize,
    /// H0's validation success (mean per-task rate).
    pub h0_success: f64,
    /// Per sibling name: (repaired, regressed) against H0.
    pub siblings: BTreeMap<String, (usize, usize)>,
    /// The task features the router's evidence was built from.
    pub features: harness_router::FeatureSource,
}

impl PairedCheckpoint {
    /// The paired view of one calibration: a task counts as solved by a member when at least
    /// half of its attempts succeeded.
    pub fn of(cal: &harness_router::Calibration) -> Self {
        let solved = |o: Option<&harness_router::TaskOutcome>| {
            o.is_some_and(|o| o.attempts > 0 && 2 * o.successes >= o.attempts)
        };
        let mut siblings = BTreeMap::new();
        for m in cal.members.iter().filter(|m| m.id != cal.base) {
            let (mut repaired, mut regressed) = (0, 0);
            for row in cal.outcomes.values() {
                let (s, b) = (solved(row.get(&m.id)), solved(row.get(&cal.base)));
                repaired += usize::from(s && !b);
                regressed += usize::from(b && !s);
            }
            siblings.insert(m.name.clone(), (repaired, regressed));
        }
        PairedCheckpoint {
            index: cal.index,
            update: cal.update,
            is_final: cal.is_final,
            tasks: cal.outcomes.len(),
            h0_success: cal.success(&cal.base),
            siblings,
            features: cal.features,
        }
    }
}

impl MethodRun {
    /// Updates the run made: the distinct update numbers of its update records, or, without
    /// metrics, the largest update of its group records.
    pub fn update_count(&self) -> u64 {
        if self.updates.is_empty() {
            self.groups.iter().map(|g| g.update).max().unwrap_or(0)
        } else {
            let mut u: Vec<u64> = self.updates.iter().map(|r| r.update).collect();
            u.sort_unstable();
            u.dedup();
            u.len() as u64
        }
    }
}

/// What harness-evolve left in `evolve/`.
#[derive(Debug, Clone, PartialEq)]
pub struct EvolveRun {
    /// The folder.
    pub dir: PathBuf,
    /// `diversity.json`, when written.
    pub diversity: Option<DiversityReport>,
    /// `rounds.json`, when written.
    pub rounds: Option<Vec<RoundReport>>,
    /// The SVGs evolution drew itself (of [`EVOLVE_SVGS`], those present).
    pub svgs: Vec<PathBuf>,
}

/// One seed's run.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SeedRun {
    /// Its folder.
    pub dir: PathBuf,
    /// `run.json`'s `seed`, or the number in a `seed-<s>` folder name.
    pub seed: Option<u64>,
    /// `run.json`, when present.
    pub config: Option<Value>,
    /// `train/<method>/` by method name.
    pub methods: BTreeMap<String, MethodRun>,
    /// `eval/test.jsonl`, when present.
    pub test: Option<Vec<TestEval>>,
    /// `eval/rank.jsonl`, when present.
    pub rank: Option<Vec<RankLine>>,
    /// `eval/behaviour.jsonl`, when present.
    pub behaviour: Option<Vec<BehaviourLine>>,
    /// `eval/routing.jsonl`, when present.
    pub routing: Option<Vec<RoutingLine>>,
    /// The first calibration (`calibration/`), as paired outcomes.
    pub first_calibration: Vec<PairedCheckpoint>,
    /// `evolve/`, when present.
    pub evolve: Option<EvolveRun>,
    /// `eval/cross.jsonl`, when present.
    pub cross: Option<Vec<CrossLine>>,
    /// `evolve/stage_cost.json`, when present.
    pub evolve_cost: Option<StageCost>,
    /// `calibration/stage_cost.json`, when present.
    pub calibration_cost: Option<StageCost>,
    /// `eval/transfer.jsonl`, when present.
    pub transfer: Option<Vec<TransferCase>>,
    /// `eval/diagnostics.jsonl`, when present.
    pub diagnostics: Option<Vec<DiagnosticsLine>>,
    /// `eval/episodes.jsonl`, when present.
    pub episodes: Option<Vec<EpisodeLine>>,
    /// `programs.json`: the pool's agent programs, names by id (empty without the file).
    pub programs: BTreeMap<HarnessId, String>,
}

impl SeedRun {
    /// The test evaluation of `method` under `mode`.
    pub fn test_eval(&self, method: &str, mode: EvalMode) -> Option<&TestEval> {
        self.test
            .as_ref()?
            .iter()
            .find(|t| t.method == method && t.mode == mode)
    }

    /// A short name for the seed ("seed 3", or the folder name).
    pub fn name(&self) -> String {
        match self.seed {
            Some(s) => format!("seed {s}"),
            None => self.dir.file_name().map_or_else(
                || self.dir.display().to_string(),
                |n| n.to_string_lossy().into(),
            ),
        }
    }
}

/// A whole run: one or more seeds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Run {
    /// The folder given.
    pub dir: PathBuf,
    /// Its seeds, in seed order (one for the single-seed layout).
    pub seeds: Vec<SeedRun>,
    /// With `seed-<s>/` folders, an `evolve/` beside them: one evolution shared by the seeds.
    pub shared_evolve: Option<EvolveRun>,
}

/// Built-in display labels, for methods `eval/test.jsonl` does not label.
pub fn builtin_label(method: &str) -> String {
    match method {
        "initial" => "Initial (warm start)".into(),
        "grpo" => "GRPO".into(),
        "h0_rescue" => "GRPO (H0 rescue)".into(),
        "random_harness" => "Random-harness rescue".into(),
        "harness_s" => "Harness-S".into(),
        "harness_s_fixed" => "Harness-S (fixed profiles)".into(),
        "mixture_sibling" => "GRPO mixed harness (H0 + best sibling)".into(),
        "mixture_top4" => "GRPO mixed harness (H0 + up to Top-4 siblings)".into(),
        "dynamic_sampling" => "Dynamic sampling (DAPO filter; not a paper row)".into(),
        "rule_router" => "Rule-router rescue (adaptive re-anchoring)".into(),
        "router_4x2" => "Voter router (Top-4 x 2)".into(),
        "he_only" => "Harness-S (HE only)".into(),
        "meta_harness" => "Meta-Harness (frozen policy, H_best)".into(),
        "whale" => "WHALE (search + rejection-sampling SFT, H_best)".into(),
        other => other.into(),
    }
}

/// The paper's name of a router strategy as `metrics.jsonl` records it: `router_top_k` is Top-K
/// (with K when the run's group size is known), `router_top_{m}x{n}` is Top-m x n; `None` for a
/// strategy that does not route.
pub fn allocation_label(strategy: &str, group_size: Option<u64>) -> Option<String> {
    let rest = strategy.strip_prefix("router_top_")?;
    if rest == "k" {
        return Some(match group_size {
            Some(k) => format!("Top-{k}"),
            None => "Top-K".into(),
        });
    }
    let (m, n) = rest.split_once('x')?;
    let (m, n): (u64, u64) = (m.parse().ok()?, n.parse().ok()?);
    Some(format!("Top-{m} x {n}"))
}

/// The display order of methods: the initial checkpoint, then harness-pipeline's method table
/// in its order (the paper's Table 1 and 2 rows; harness-pipeline checks that the two lists
/// agree). Methods not listed follow by name.
pub const METHOD_ORDER: &[&str] = &[
    "initial",
    "grpo",
    "h0_rescue",
    "mixture_sibling",
    "mixture_top4",
    "mixture_program",
    "dynamic_sampling",
    "random_harness",
    "rule_router",
    "router_4x2",
    "harness_s_fixed",
    "meta_harness",
    "he_only",
    "whale",
    "harness_s",
];

/// The display order of a method: its place in [`METHOD_ORDER`], then its name.
pub(crate) fn method_rank(method: &str) -> (usize, String) {
    let i = METHOD_ORDER
        .iter()
        .position(|m| *m == method)
        .unwrap_or(METHOD_ORDER.len());
    (i, method.to_string())
}

impl Run {
    /// Every method seen in any seed (training folder or test evaluation), in display order.
    pub fn methods(&self) -> Vec<String> {
        let mut all: Vec<String> = self
            .seeds
            .iter()
            .flat_map(|s| {
                s.methods
                    .keys()
                    .cloned()
                    .chain(s.test.iter().flatten().map(|t| t.method.clone()))
            })
            .collect();
        all.sort_by_key(|m| method_rank(m));
        all.dedup();
        all
    }

    /// The display label of `method`. A routed method is labelled by the rescue allocation its
    /// `metrics.jsonl` records (`Harness-S (Top-4, adaptive)`, `Top-2 x 2, fixed profiles`), so a
    /// table never names a strategy other than the one that ran; other methods take the first
    /// label `eval/test.jsonl` gives them, else the built-in one.
    pub fn label(&self, method: &str) -> String {
        let ran = self.allocations(method);
        if !ran.is_empty() {
            let alloc = ran.join(" / ");
            match method {
                "harness_s" => return format!("Harness-S ({alloc}, adaptive)"),
                "harness_s_fixed" => return format!("{alloc}, fixed profiles"),
                _ => {}
            }
        }
        self.seeds
            .iter()
            .flat_map(|s| s.test.iter().flatten())
            .find(|t| t.method == method && t.label.is_some())
            .and_then(|t| t.label.clone())
            .unwrap_or_else(|| builtin_label(method))
    }

    /// The router allocations `method`'s update records name, over every seed, distinct and in
    /// seed order (`Top-4`, `Top-2 x 2`); empty for a method that routes nothing.
    pub fn allocations(&self, method: &str) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for seed in &self.seeds {
            let k = seed
                .config
                .as_ref()
                .and_then(|c| c.pointer("/train/group_size"))
                .and_then(Value::as_u64);
            for u in seed.methods.get(method).iter().flat_map(|m| &m.updates) {
                if let Some(label) = allocation_label(&u.strategy, k)
                    && !out.contains(&label)
                {
                    out.push(label);
                }
            }
        }
        out
    }
}

/// The suffix of a compressed report input ([`export_seed`]): `eval/test.jsonl` may be stored
/// as `eval/test.jsonl.gz`, read when the plain file is absent.
pub const GZ_SUFFIX: &str = ".gz";

fn gz_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(GZ_SUFFIX);
    PathBuf::from(name)
}

thread_local! {
    /// While [`seed_inputs`] reads a seed: every file [`read_text`] returned, with its text.
    static READ_LOG: std::cell::RefCell<Option<Vec<(PathBuf, String)>>> =
        const { std::cell::RefCell::new(None) };
}

/// The text of `path`, or of `path.gz` (gzip) when `path` is absent; `None` when neither is.
fn read_text(path: &Path) -> Result<Option<String>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let gz = gz_path(path);
            let file = match std::fs::File::open(&gz) {
                Ok(f) => f,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
                Err(e) => return Err(Error::io(&gz, e)),
            };
            let mut text = String::new();
            std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(file), &mut text)
                .map_err(|e| Error::io(&gz, e))?;
            text
        }
        Err(e) => return Err(Error::io(path, e)),
    };
    READ_LOG.with(|log| {
        if let Some(files) = log.borrow_mut().as_mut() {
            files.push((path.to_path_buf(), text.clone()));
        }
    });
    Ok(Some(text))
}

/// The files [`read_seed`] reads in the seed folder `dir`, each with its text, by their plain
/// names relative to `dir` (also where the folder holds them compressed), in reading order:
/// what a report of the seed needs, and nothing else (no checkpoint, weights, trajectories or
/// rendered report). Fails where `read_seed` does.
pub fn seed_inputs(dir: &Path) -> Result<Vec<(PathBuf, String)>> {
    READ_LOG.with(|log| *log.borrow_mut() = Some(Vec::new()));
    let read = read_seed(dir);
    let files = READ_LOG
        .with(|log| log.borrow_mut().take())
        .unwrap_or_default();
    read?;
    let mut out: Vec<(PathBuf, String)> = Vec::new();
    for (path, text) in files {
        // read_seed reads only inside `dir`; a file read twice is written once.
        if let Ok(rel) = path.strip_prefix(dir)
            && !out.iter().any(|(seen, _)| seen == rel)
        {
            out.push((rel.to_path_buf(), text));
        }
    }
    Ok(out)
}

/// Write the [`seed_inputs`] of the seed folder `src` under `dst`, each gzip-compressed
/// (`<name>.gz`, byte-identical for identical inputs), and return the files written. A report
/// read from `dst` equals one read from `src` apart from folder names.
pub fn export_seed(src: &Path, dst: &Path) -> Result<Vec<PathBuf>> {
    use std::io::Write;
    let mut written = Vec::new();
    for (rel, text) in seed_inputs(src)? {
        let target = gz_path(&dst.join(&rel));
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).map_err(|e| Error::io(parent, e))?;
        }
        let file = std::fs::File::create(&target).map_err(|e| Error::io(&target, e))?;
        let mut enc = flate2::GzBuilder::new()
            .mtime(0)
            .write(file, flate2::Compression::best());
        enc.write_all(text.as_bytes())
            .and_then(|()| enc.finish().map(drop))
            .map_err(|e| Error::io(&target, e))?;
        written.push(target);
    }
    Ok(written)
}

/// Deserialize `value` as `T`, naming the JSON field at fault.
fn from_value<T: DeserializeOwned>(
    value: Value,
    path: &Path,
    line: usize,
    what: &str,
) -> Result<T> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let field = e.path().to_string();
        Error::parse(
            path,
            line,
            format!("expected {what}; at `{field}`: {}", e.into_inner()),
        )
    })
}

/// The non-blank lines of a JSONL file as JSON values, with their 1-based line numbers.
///
/// A last line that a crash cut off (no newline after it, and it does not parse) is skipped
/// with a warning, so a killed run still reports every record it finished; a line that does
/// not parse anywhere else is an error naming the file and the line.
fn jsonl_values(path: &Path, text: &str) -> Result<Vec<(usize, Value)>> {
    let last = text.lines().count();
    let cut_off = !text.ends_with('\n');
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        match serde_json::from_str(line) {
            Ok(value) => out.push((i + 1, value)),
            Err(e) if cut_off && i + 1 == last => {
                tracing::warn!(
                    file = %path.display(),
                    line = i + 1,
                    "skipping the last line, cut off before its end (a run stopped while \
                     writing it): {e}"
                );
            }
            Err(e) => {
                return Err(Error::parse(
                    path,
                    i + 1,
                    format!("expected one JSON object per line: {e}"),
                ));
            }
        }
    }
    Ok(out)
}

/// Read a JSONL file of `T` with each record's 1-based line (`None` when the file is absent).
pub fn read_jsonl<T: DeserializeOwned>(path: &Path, what: &str) -> Result<Option<Vec<(usize, T)>>> {
    let Some(text) = read_text(path)? else {
        return Ok(None);
    };
    jsonl_values(path, &text)?
        .into_iter()
        .map(|(line, v)| Ok((line, from_value(v, path, line, what)?)))
        .collect::<Result<Vec<_>>>()
        .map(Some)
}

fn without_lines<T>(lines: Option<Vec<(usize, T)>>) -> Option<Vec<T>> {
    lines.map(|l| l.into_iter().map(|(_, t)| t).collect())
}

/// Read a JSON file of `T` (`None` when the file is absent).
pub fn read_json<T: DeserializeOwned>(path: &Path, what: &str) -> Result<Option<T>> {
    let Some(text) = read_text(path)? else {
        return Ok(None);
    };
    let de = &mut serde_json::Deserializer::from_str(&text);
    let value = serde_path_to_error::deserialize(de).map_err(|e| {
        let field = e.path().to_string();
        let inner = e.into_inner();
        Error::parse(
            path,
            inner.line(),
            format!("expected {what}; at `{field}`: {inner}"),
        )
    })?;
    Ok(Some(value))
}

/// Read `metrics.jsonl`: update, eval and calibration lines by their `kind`.
fn read_metrics(path: &Path, run: &mut MethodRun) -> Result<()> {
    let Some(text) = read_text(path)? else {
        return Ok(());
    };
    for (line, value) in jsonl_values(path, &text)? {
        let kind = value
            .get("kind")
            .and_then(Value::as_str)
            .map(str::to_string);
        match kind.as_deref() {
            Some("update") => run.updates.push(from_value(
                value,
                path,
                line,
                "a harness-rollout UpdateRecord (kind \"update\")",
            )?),
            Some("eval") => run.evals.push(from_value(
                value,
                path,
                line,
                "a harness-rollout EvalRecord (kind \"eval\")",
            )?),
            Some("calibration") => run.calibrations.push(from_value(
                value,
                path,
                line,
                "a harness-rollout CalibrationRecord (kind \"calibration\")",
            )?),
            other => {
                return Err(Error::parse(
                    path,
                    line,
                    format!(
                        "expected `kind` to be \"update\", \"eval\" or \"calibration\", found {}",
                        other.map_or("none".to_string(), |k| format!("\"{k}\""))
                    ),
                ));
            }
        }
    }
    Ok(())
}

const STAGE_COST_WHAT: &str = "a stage cost {stage, rollouts: {kind: n}, seconds: {kind: s}, tokens: {role: {calls, prompt_tokens, completion_tokens}}, shared}";

fn read_method(dir: &Path) -> Result<MethodRun> {
    let mut run = MethodRun {
        dir: dir.to_path_buf(),
        ..MethodRun::default()
    };
    read_metrics(&dir.join(METRICS_FILE), &mut run)?;
    run.groups = without_lines(read_jsonl(
        &dir.join(GROUPS_FILE),
        "a harness-rollout GroupRecord",
    )?)
    .unwrap_or_default();
    run.cost = read_json(&dir.join(COST_FILE), "a harness-rollout Cost")?;
    run.checkpoints = read_checkpoints(&dir.join(METHOD_CALIBRATIONS_DIR))?;
    run.stage_cost = read_json(&dir.join(STAGE_COST_FILE), STAGE_COST_WHAT)?;
    run.searches = without_lines(read_jsonl(
        &dir.join(SEARCH_FILE),
        "a search round {round, budget, candidates, rejected, empty, rollouts}",
    )?)
    .unwrap_or_default();
    Ok(run)
}

/// The paired views of every `calibration-<index>.json` in `dir`, in index order (empty when
/// the folder is absent).
pub fn read_checkpoints(dir: &Path) -> Result<Vec<PairedCheckpoint>> {
    checkpoint_files(dir)
        .into_iter()
        .map(|(_, name)| {
            let path = dir.join(name);
            let text = read_text(&path)?.unwrap_or_default();
            let cal = harness_router::Calibration::from_json(&text)
                .map_err(|e| Error::parse(&path, 1, format!("expected a calibration: {e}")))?;
            Ok(PairedCheckpoint::of(&cal))
        })
        .collect()
}

/// The `calibration-<index>.json` files of `dir` (plain or `.gz`), by index, as plain names.
fn checkpoint_files(dir: &Path) -> Vec<(u32, String)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<(u32, String)> = entries
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let plain = name.strip_suffix(GZ_SUFFIX).unwrap_or(&name).to_string();
            let index = plain
                .strip_prefix("calibration-")?
                .strip_suffix(".json")?
                .parse()
                .ok()?;
            Some((index, plain))
        })
        .collect();
    files.sort();
    files.dedup();
    files
}

fn subdirs(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io(dir, e))? {
        let entry = entry.map_err(|e| Error::io(dir, e))?;
        let path = entry.path();
        if path.is_dir() {
            out.push(path);
        }
    }
    out.sort();
    Ok(out)
}

fn read_evolve(dir: &Path) -> Result<Option<EvolveRun>> {
    if !dir.is_dir() {
        return Ok(None);
    }
    Ok(Some(EvolveRun {
        dir: dir.to_path_buf(),
        diversity: read_json(
            &dir.join(DIVERSITY_FILE),
            "a harness-evolve DiversityReport",
        )?,
        rounds: read_json(
            &dir.join(ROUNDS_FILE),
            "a list of harness-evolve RoundReports",
        )?,
        svgs: EVOLVE_SVGS
            .iter()
            .map(|n| dir.join(n))
            .filter(|p| p.is_file())
            .collect(),
    }))
}

/// A seed's folder number, from a `seed-<s>` name.
fn seed_from_name(dir: &Path) -> Option<u64> {
    dir.file_name()?
        .to_str()?
        .strip_prefix("seed-")?
        .parse()
        .ok()
}

/// Read one seed's folder.
pub fn read_seed(dir: &Path) -> Result<SeedRun> {
    let run_file = dir.join(RUN_FILE);
    let config: Option<Value> = read_json(&run_file, "the run configuration, a JSON object")?;
    let seed = match &config {
        Some(c) if !c.is_object() => {
            return Err(Error::parse(
                &run_file,
                1,
                "expected the run configuration to be a JSON object",
            ));
        }
        Some(c) => match c.get("seed") {
            None | Some(Value::Null) => seed_from_name(dir),
            Some(s) => Some(s.as_u64().ok_or_else(|| {
                Error::parse(
                    &run_file,
                    1,
                    format!("expected `seed` to be a non-negative integer, found {s}"),
                )
            })?),
        },
        None => seed_from_name(dir),
    };
    let mut methods = BTreeMap::new();
    let train = dir.join(TRAIN_DIR);
    if train.is_dir() {
        for m in subdirs(&train)? {
            let name = m
                .file_name()
                .map(|n| n.to_string_lossy().to_string())
                .unwrap_or_default();
            methods.insert(name, read_method(&m)?);
        }
    }
    let test_path = dir.join(TEST_FILE);
    let test: Option<Vec<(usize, TestEval)>> = read_jsonl(
        &test_path,
        "a test evaluation {method, label, mode: \"h0\"|\"rank1\"|\"hbest\", k, tasks, pass_at_k, avg_at_k, rollouts, seconds, per_task}",
    )?;
    if let Some(test) = &test {
        for (i, (line, t)) in test.iter().enumerate() {
            if let Some((first, _)) = test[..i]
                .iter()
                .find(|(_, u)| u.method == t.method && u.mode == t.mode)
            {
                return Err(Error::parse(
                    &test_path,
                    *line,
                    format!(
                        "a second evaluation of method `{}` in mode {:?} (the first is on line {first}); expected one per method and mode",
                        t.method, t.mode
                    ),
                ));
            }
        }
    }
    let rank_path = dir.join(RANK_FILE);
    let rank: Option<Vec<(usize, RankLine)>> = read_jsonl(
        &rank_path,
        "a Rank-r line {stage: \"before\"|\"after\", method, report: harness-router RankReport}",
    )?;
    if let Some(rank) = &rank {
        for (i, (line, r)) in rank.iter().enumerate() {
            if let Some((first, _)) = rank[..i]
                .iter()
                .find(|(_, u)| u.method == r.method && u.stage == r.stage)
            {
                return Err(Error::parse(
                    &rank_path,
                    *line,
                    format!(
                        "a second {:?} report for method `{}` (the first is on line {first}); expected one per method and stage",
                        r.stage, r.method
                    ),
                ));
            }
        }
    }
    let (test, rank) = (without_lines(test), without_lines(rank));
    let behaviour = without_lines(read_jsonl(
        &dir.join(BEHAVIOUR_FILE),
        "a behaviour line {method, label, mode, episodes, choices: {family: {point: {choice: count}}}}",
    )?);
    let routing = without_lines(read_jsonl(
        &dir.join(ROUTING_FILE),
        "a routing line {stage, method, task, family, rank1, rank1_name, rank1_is_h0}",
    )?);
    let evolve = read_evolve(&dir.join(EVOLVE_DIR))?;
    let cross = without_lines(read_jsonl(
        &dir.join(CROSS_FILE),
        "a cross-harness evaluation {harness, harness_name, method, label, mode: \"unseen\", k, tasks, pass_at_k, avg_at_k, rollouts, seconds, per_task}",
    )?);
    let transfer = without_lines(read_jsonl(
        &dir.join(TRANSFER_FILE),
        "a transfer case {method, label, family, h0_training_attempts, h0_training_successes, rescued_groups, rescue: {task, update, harness, harness_name}, test_task, attempt, attempts, trained_successes, initial_successes, grpo_successes, behaviours}",
    )?);
    let diagnostics = without_lines(read_jsonl(
        &dir.join(DIAGNOSTICS_FILE),
        "a diagnostics line {method, label, rescue_rollouts, successful_rescues, policy_tokens, tokens_before, positive_tokens, positive_tokens_before, interventions, families}",
    )?);
    let episodes = without_lines(read_jsonl(
        &dir.join(EPISODES_FILE),
        "an episode line {method, task, family, attempts: [{reward, labels}]}",
    )?);
    let evolve_cost = read_json(&dir.join(EVOLVE_DIR).join(STAGE_COST_FILE), STAGE_COST_WHAT)?;
    let calibration_cost = read_json(
        &dir.join(CALIBRATION_DIR).join(STAGE_COST_FILE),
        STAGE_COST_WHAT,
    )?;
    if config.is_none()
        && methods.is_empty()
        && test.is_none()
        && rank.is_none()
        && evolve.is_none()
    {
        return Err(Error::layout(
            dir,
            "expected a run directory: run.json, train/<method>/, eval/ or evolve/ (or seed-<s>/ folders holding them)",
        ));
    }
    Ok(SeedRun {
        dir: dir.to_path_buf(),
        seed,
        config,
        methods,
        test,
        rank,
        behaviour,
        routing,
        first_calibration: read_checkpoints(&dir.join(CALIBRATION_DIR))?,
        evolve,
        cross,
        evolve_cost,
        calibration_cost,
        transfer,
        diagnostics,
        episodes,
        programs: read_json(
            &dir.join(PROGRAMS_FILE),
            "the pool's agent programs {harness id: name}",
        )?
        .unwrap_or_default(),
    })
}

/// Read a run: `out` itself, or every `seed-*/` folder under it (and an `evolve/` beside
/// them, shared by the seeds).
pub fn read_run(out: &Path) -> Result<Run> {
    if !out.is_dir() {
        return Err(Error::layout(
            out,
            "expected a run directory; it is not a folder",
        ));
    }
    let seed_dirs: Vec<PathBuf> = subdirs(out)?
        .into_iter()
        .filter(|d| {
            d.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("seed-"))
        })
        .collect();
    let mut seeds = if seed_dirs.is_empty() {
        vec![read_seed(out)?]
    } else {
        seed_dirs
            .iter()
            .map(|d| read_seed(d))
            .collect::<Result<Vec<_>>>()?
    };
    seeds.sort_by_key(|s| (s.seed, s.dir.clone()));
    let shared_evolve = if seed_dirs.is_empty() {
        None
    } else {
        read_evolve(&out.join(EVOLVE_DIR))?
    };
    Ok(Run {
        dir: out.to_path_buf(),
        seeds,
        shared_evolve,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize, PartialEq)]
    struct Line {
        n: u32,
    }

    #[test]
    fn eval_mode_names_are_their_file_values() {
        for mode in EvalMode::ALL {
            let json = serde_json::to_value(mode).unwrap();
            assert_eq!(json, mode.name(), "{mode:?}");
            let back: EvalMode = serde_json::from_value(json).unwrap();
            assert_eq!(back, mode);
        }
    }

    fn write(text: &str) -> (tempfile::TempDir, std::path::PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("groups.jsonl");
        std::fs::write(&path, text).unwrap();
        (dir, path)
    }

    #[test]
    fn a_cut_off_last_line_is_skipped() {
        let (_dir, path) = write("{\"n\": 1}\n{\"n\": 2}\n{\"n\": 3, \"gro");
        let lines: Vec<(usize, Line)> = read_jsonl(&path, "a line").unwrap().unwrap();
        assert_eq!(lines, [(1, Line { n: 1 }), (2, Line { n: 2 })]);
    }

    #[test]
    fn a_bad_line_elsewhere_is_an_error_naming_file_and_line() {
        // In the middle.
        let (_dir, path) = write("{\"n\": 1}\n{\"n\": 2, \"gro\n{\"n\": 3}\n");
        let err = read_jsonl::<Line>(&path, "a line").unwrap_err().to_string();
        assert!(err.contains("groups.jsonl:2:"), "{err}");
        // Last, but complete (a newline after it): not a crash's cut.
        let (_dir, path) = write("{\"n\": 1}\n{\"n\": 2, \"gro\n");
        let err = read_jsonl::<Line>(&path, "a line").unwrap_err().to_string();
        assert!(err.contains("groups.jsonl:2:"), "{err}");
    }
}
