//! The records a run writes: one [`GroupRecord`] per task per update (`groups.jsonl`), one
//! [`UpdateRecord`] per update plus [`EvalRecord`]s and [`CalibrationRecord`]s
//! (`metrics.jsonl`), and the [`Cost`] totals (`cost.json`, the shape of Tables 9 and 10).
//! Field names are part of the interface: plots and tables are made from these files.

use std::collections::BTreeMap;

use harness_core::{GroupOrigin, HarnessId, RescueObjective, UpdateReport, Usage};
use serde::{Deserialize, Serialize};

/// One task of one update: how its group was formed and what was retained.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupRecord {
    /// The update (1-based: the first update is 1).
    pub update: u64,
    /// The task's id.
    pub task_id: String,
    /// The task's draw number in the run's task order.
    pub draw: u64,
    /// How the retained group was formed.
    pub origin: GroupOrigin,
    /// Rewards of the initial group (the K H0 rollouts, or a fixed mixture's rollouts).
    pub base_rewards: Vec<f32>,
    /// The harnesses chosen for the rescue, in the selector's order (empty without rescue).
    pub rescue_harnesses: Vec<HarnessId>,
    /// Rewards of the rescue rollouts (empty without rescue).
    pub rescue_rewards: Vec<f32>,
    /// Whether the group went to the learner (dynamic sampling drops groups without variance).
    pub retained: bool,
    /// Rewards of the retained group, in trajectory order (empty when not retained).
    pub retained_rewards: Vec<f32>,
    /// The generating harness of each retained trajectory.
    pub retained_harnesses: Vec<HarnessId>,
    /// Policy tokens of the retained group.
    pub policy_tokens: usize,
    /// The policy version that generated the group's rollouts.
    pub policy_version: u64,
}

impl GroupRecord {
    /// Whether a rescue was triggered (all base rollouts failed under a rescue strategy).
    pub fn rescued(&self) -> bool {
        self.origin == GroupOrigin::Rescue
    }
}

/// Rescue use of one harness in one update.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HarnessUse {
    /// Rescue rollouts under it.
    pub rollouts: usize,
    /// Of which successful.
    pub successes: usize,
}

/// One line of `metrics.jsonl` per update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct UpdateRecord {
    /// Always `"update"`.
    pub kind: String,
    /// The update (1-based).
    pub update: u64,
    /// The strategy's label.
    pub strategy: String,
    /// Tasks whose groups were formed (dynamic sampling may form more than it retains).
    pub tasks: usize,
    /// Groups handed to the learner.
    pub retained_groups: usize,
    /// Retained groups with both a success and a failure / retained groups.
    pub eg_rate: f64,
    /// Policy tokens in effective retained groups / all retained policy tokens.
    pub effective_token_share: f64,
    /// Tasks whose initial group had no success / tasks.
    pub all_fail_rate: f64,
    /// Tasks that triggered a rescue / tasks.
    pub rescue_trigger_rate: f64,
    /// Rescue-triggering tasks with at least one successful fresh rollout / rescue-triggering
    /// tasks (`null` when none triggered).
    pub rescue_success: Option<f64>,
    /// Rescue rollouts and successes per harness.
    pub rescue_use: BTreeMap<HarnessId, HarnessUse>,
    /// Mean reward of the initial groups.
    pub base_reward_mean: f64,
    /// Mean reward of the retained groups.
    pub retained_reward_mean: f64,
    /// Initial rollouts (H0, or a fixed mixture's).
    pub rollouts_base: usize,
    /// Rescue rollouts.
    pub rollouts_rescue: usize,
    /// Policy tokens of the retained groups.
    pub policy_tokens: usize,
    /// Whether the learner took an optimizer step.
    pub applied: bool,
    /// `-J` of Eq. 15.
    pub loss: f64,
    /// Gradient norm before clipping.
    pub grad_norm: f64,
    /// Ratio clip fraction at `1 - eta_-` (Eq. 7).
    pub clip_frac_low: f64,
    /// Ratio clip fraction at `1 + eta_+` (Eq. 7).
    pub clip_frac_high: f64,
    /// Mean importance weight of Eq. 16.
    pub weight_mean: f64,
    /// Fraction of tokens whose importance weight was clipped at 2 (Eq. 16).
    pub weight_clipped_frac: f64,
    /// Learning rate.
    pub lr: f64,
    /// Tokens the learner scored.
    pub learner_tokens: usize,
    /// The policy version after the update (what the next rollouts use).
    pub policy_version: u64,
    /// Seconds in rollouts (base and rescue) and selection.
    pub rollout_seconds: f64,
    /// Seconds in the learner's update and the weight sync.
    pub update_seconds: f64,
    /// Seconds in calibration before this update.
    pub calibration_seconds: f64,
    /// Turns of this update's rollouts (base and rescue) whose prompt did not extend the
    /// previous turn's context + completion (`Counts::prefix_breaks`: agent programs whose
    /// history or chat template drifted from what the policy sampled). Left out of the line
    /// when 0, so runs without agent programs write what they wrote before.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub prefix_breaks: u64,
    /// How rescued trajectories were scored (`RescueConfig::rescue_objective`); lines written
    /// before the setting existed read as the paper's, `generating`.
    #[serde(default)]
    pub rescue_objective: RescueObjective,
    /// The learner's figures of the rescue objective (its report's `rescue_*` extras that are
    /// not 0: `rescue_masked_tokens`, `rescue_h0_tokens`, `rescue_h0_gamma`,
    /// `rescue_h0_ratio_mean`). Left out when empty.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rescue_figures: BTreeMap<String, f64>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Compute an update's metrics from its group records and the learner's report.
pub fn summarize(
    update: u64,
    strategy: &str,
    groups: &[GroupRecord],
    report: &UpdateReport,
) -> UpdateRecord {
    let ratio = |a: usize, b: usize| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    let mean = |v: Vec<f32>| {
        if v.is_empty() {
            0.0
        } else {
            v.iter().map(|x| f64::from(*x)).sum::<f64>() / v.len() as f64
        }
    };
    let effective = |r: &[f32]| r.iter().any(|x| *x >= 1.0) && r.iter().any(|x| *x < 1.0);
    let retained: Vec<&GroupRecord> = groups.iter().filter(|g| g.retained).collect();
    let effective_groups = retained
        .iter()
        .filter(|g| effective(&g.retained_rewards))
        .count();
    let policy_tokens: usize = retained.iter().map(|g| g.policy_tokens).sum();
    let effective_tokens: usize = retained
        .iter()
        .filter(|g| effective(&g.retained_rewards))
        .map(|g| g.policy_tokens)
        .sum();
    let all_fail = groups
        .iter()
        .filter(|g| !g.base_rewards.iter().any(|x| *x >= 1.0))
        .count();
    let rescued: Vec<&GroupRecord> = groups.iter().filter(|g| g.rescued()).collect();
    let rescue_ok = rescued
        .iter()
        .filter(|g| g.rescue_rewards.iter().any(|x| *x >= 1.0))
        .count();
    let mut rescue_use: BTreeMap<HarnessId, HarnessUse> = BTreeMap::new();
    for g in &rescued {
        for (id, r) in g.retained_harnesses.iter().zip(&g.retained_rewards) {
            let u = rescue_use.entry(id.clone()).or_default();
            u.rollouts += 1;
            u.successes += usize::from(*r >= 1.0);
        }
    }
    UpdateRecord {
        kind: "update".into(),
        update,
        strategy: strategy.to_string(),
        tasks: groups.len(),
        retained_groups: retained.len(),
        eg_rate: ratio(effective_groups, retained.len()),
        effective_token_share: ratio(effective_tokens, policy_tokens),
        all_fail_rate: ratio(all_fail, groups.len()),
        rescue_trigger_rate: ratio(rescued.len(), groups.len()),
        rescue_success: (!rescued.is_empty()).then(|| ratio(rescue_ok, rescued.len())),
        rescue_use,
        base_reward_mean: mean(
            groups
                .iter()
                .flat_map(|g| g.base_rewards.iter().copied())
                .collect(),
        ),
        retained_reward_mean: mean(
            retained
                .iter()
                .flat_map(|g| g.retained_rewards.iter().copied())
                .collect(),
        ),
        rollouts_base: groups.iter().map(|g| g.base_rewards.len()).sum(),
        rollouts_rescue: groups.iter().map(|g| g.rescue_rewards.len()).sum(),
        policy_tokens,
        applied: report.applied,
        loss: report.loss,
        grad_norm: report.grad_norm,
        clip_frac_low: report.clip_frac_low,
        clip_frac_high: report.clip_frac_high,
        weight_mean: report.weight_mean,
        weight_clipped_frac: report.weight_clipped_frac,
        lr: report.lr,
        learner_tokens: report.policy_tokens,
        policy_version: report.policy_version,
        prefix_breaks: 0,
        rescue_objective: RescueObjective::default(),
        rescue_figures: report
            .extra
            .iter()
            .filter(|(k, v)| k.starts_with("rescue_") && **v != 0.0)
            .map(|(k, v)| (k.clone(), *v))
            .collect(),
        rollout_seconds: 0.0,
        update_seconds: 0.0,
        calibration_seconds: 0.0,
    }
}

/// Validation under H0, as its own `metrics.jsonl` line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EvalRecord {
    /// Always `"eval"`.
    pub kind: String,
    /// Updates applied before the evaluation.
    pub update: u64,
    /// Attempts per task.
    pub k: usize,
    /// Validation tasks.
    pub tasks: usize,
    /// Fraction of tasks with at least one success in `k` attempts.
    pub pass_at_k: f64,
    /// Mean success over all attempts.
    pub avg_at_k: f64,
    /// Seconds.
    pub eval_seconds: f64,
}

/// A calibration, as its own `metrics.jsonl` line.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CalibrationRecord {
    /// Always `"calibration"`.
    pub kind: String,
    /// Updates applied before it.
    pub update: u64,
    /// The calibration index `s`.
    pub index: u32,
    /// Whether it is the re-anchoring with the final policy.
    pub is_final: bool,
    /// Validation episodes it ran.
    pub rollouts: usize,
    /// Validation success per harness.
    pub validation_success: BTreeMap<HarnessId, f64>,
    /// Seconds (as the calibrator reported them).
    pub calibration_seconds: f64,
}

/// Training rollouts by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RolloutCounts {
    /// Initial rollouts under H0.
    pub base: u64,
    /// Rescue rollouts.
    pub rescue: u64,
    /// Fixed-mixture rollouts.
    pub mixture: u64,
    /// All training rollouts (discarded base attempts included, as in Table 9).
    pub total: u64,
}

/// `cost.json`: the shape of the paper's Tables 9 and 10.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Cost {
    /// The strategy's label.
    pub strategy: String,
    /// Updates applied.
    pub updates: u64,
    /// Training rollouts.
    pub training_rollouts: RolloutCounts,
    /// What plain GRPO spends on the same updates: updates x tasks per update x K.
    pub plain_grpo_rollouts: u64,
    /// `training_rollouts.total / plain_grpo_rollouts` (Table 9's parentheses).
    pub rollouts_relative_to_plain_grpo: f64,
    /// Validation rollouts (evaluation, not training).
    pub eval_rollouts: u64,
    /// Calibration rollouts (paired validation executions).
    pub calibration_rollouts: u64,
    /// Seconds in training rollouts.
    pub rollout_seconds: f64,
    /// Seconds in updates (and weight syncs).
    pub update_seconds: f64,
    /// Seconds in calibration.
    pub calibration_seconds: f64,
    /// Seconds in validation.
    pub eval_seconds: f64,
    /// External LLM tokens by role (profiler, voters, ...), from the calibrator.
    pub external_llm_tokens: BTreeMap<String, Usage>,
}

impl Cost {
    /// Add one update's figures.
    pub fn add_update(
        &mut self,
        record: &UpdateRecord,
        mixture: bool,
        group_size: usize,
        batch_tasks: usize,
    ) {
        self.updates = record.update;
        let base = record.rollouts_base as u64;
        if mixture {
            self.training_rollouts.mixture += base;
        } else {
            self.training_rollouts.base += base;
        }
        self.training_rollouts.rescue += record.rollouts_rescue as u64;
        self.training_rollouts.total += base + record.rollouts_rescue as u64;
        self.plain_grpo_rollouts = self.updates * (group_size * batch_tasks) as u64;
        self.rollouts_relative_to_plain_grpo = if self.plain_grpo_rollouts == 0 {
            0.0
        } else {
            self.training_rollouts.total as f64 / self.plain_grpo_rollouts as f64
        };
        self.rollout_seconds += record.rollout_seconds;
        self.update_seconds += record.update_seconds;
    }

    /// Add a calibration's figures.
    pub fn add_calibration(&mut self, summary: &harness_core::CalibrationSummary) {
        self.calibration_rollouts += summary.rollouts as u64;
        self.calibration_seconds += summary.seconds;
        self.add_external_usage(&summary.usage);
    }

    /// Add external LLM tokens by role (the profiler's at calibrations, the voters' at rescue
    /// selection).
    pub fn add_external_usage(&mut self, usage: &BTreeMap<String, Usage>) {
        for (role, usage) in usage {
            let total = self.external_llm_tokens.entry(role.clone()).or_default();
            total.prompt_tokens += usage.prompt_tokens;
            total.completion_tokens += usage.completion_tokens;
        }
    }
}
