//! Table 4: behaviour transfer from training rescues to held-out instances under H0 (RQ4).
//!
//! The paper traces a kind of task whose training instance failed all K initial H0 attempts,
//! was rescued by a sibling, and whose successful rescue entered a policy update, to a
//! *different*, held-out instance of the same kind that the trained policy solves under H0
//! where the baseline fails, naming the behaviour that carried over. Here the kind is the
//! task's family ([`Workbench::family_of`]), and everything comes from the run's files and the
//! environment's labellers, never from hand-written text:
//!
//! 1. From `train/<method>/groups.jsonl`: the method's rescued groups with a successful rescue
//!    rollout that entered an update the learner applied (its `metrics.jsonl` line says
//!    `applied: true`), by family, and how often H0's own attempts succeeded on
//!    that family in training (0: the kind was never solved under H0 in training).
//! 2. From `trajectories.jsonl`: the first such successful rescue rollout, labelled.
//! 3. From `eval/episodes.jsonl`: held-out test instances of that family where an attempt of
//!    the trained policy under H0 succeeds while the initial policy and plain GRPO failed every
//!    attempt (the same episode seeds for all), labelled. Without plain GRPO's H0 episodes
//!    there is no Table 4.
//! 4. The behaviours that made the difference: labels on which the trained success differs from
//!    the initial policy's failed attempt with the same seed, in the direction the rescue rollout
//!    also differs (the environment labeller's features, and for DBBench each decision-point
//!    choice as a flag).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use harness_core::{Trajectory, TrajectoryLabeller, TrajectoryLabels};
use harness_rollout::{GROUPS_FILE, GroupRecord, METRICS_FILE, TRAJECTORIES_FILE, UpdateRecord};

use crate::config::Method;
use crate::error::{Error, Result, StageExt};
use crate::setup::Workbench;

/// The prefix of a decision-point flag among the labels (`decision:after_change=commit`).
pub const DECISION_PREFIX: &str = "decision:";

/// Held-out cases kept per method and family (the first test tasks in order).
pub const CASES_PER_FAMILY: usize = 3;

pub use harness_report::layout::{
    AttemptRecord, BehaviourDiff, EpisodeLine as EpisodeRecord, RescueEvidence, TransferCase,
};

/// The labels of one trajectory: its environment's labeller, and for DBBench each decision
/// point's choice as a flag.
pub fn behaviour_labels(
    labellers: &[Arc<dyn TrajectoryLabeller>],
    trajectory: &Trajectory,
) -> TrajectoryLabels {
    let mut labels = labellers
        .iter()
        .find(|l| l.env() == trajectory.env)
        .map(|l| l.label(trajectory))
        .unwrap_or_default();
    if trajectory.env == harness_envs::dbbench::ENV_NAME {
        for d in harness_envs::labels::dbbench_decisions(trajectory) {
            labels.insert(
                format!(
                    "{DECISION_PREFIX}{}={}",
                    d.point.as_str(),
                    d.choice.as_str()
                ),
                1.0,
            );
        }
    }
    labels
}

/// `eval/episodes.jsonl`'s lines for one H0 evaluation.
pub(crate) fn episode_records(
    wb: &Workbench,
    method: &str,
    rewards: &[Vec<f32>],
    labels: &[Vec<TrajectoryLabels>],
    llm_labels: &[Vec<Option<TrajectoryLabels>>],
) -> Vec<EpisodeRecord> {
    wb.test
        .iter()
        .zip(rewards.iter().zip(labels).zip(llm_labels))
        .map(|(task, ((r, l), m))| EpisodeRecord {
            method: method.to_string(),
            task: task.id.clone(),
            family: wb.family_of(task),
            attempts: r
                .iter()
                .zip(l)
                .zip(m)
                .map(|((&reward, labels), llm_labels)| AttemptRecord {
                    reward,
                    labels: labels.clone(),
                    llm_labels: llm_labels.clone(),
                })
                .collect(),
        })
        .collect()
}

/// The records of a JSONL run file (none when it is absent), read as the report reads them.
fn read_jsonl<T: serde::de::DeserializeOwned>(
    path: &std::path::Path,
    what: &str,
) -> Result<Vec<T>> {
    Ok(harness_report::layout::read_jsonl(path, what)
        .at("evaluate")?
        .unwrap_or_default()
        .into_iter()
        .map(|(_, t)| t)
        .collect())
}

/// The behaviours on which `trained` differs from `initial` in the direction `rescue` does too.
pub fn behaviour_diffs(
    rescue: &TrajectoryLabels,
    trained: &TrajectoryLabels,
    initial: &TrajectoryLabels,
) -> Vec<BehaviourDiff> {
    let keys: BTreeSet<&String> = rescue
        .keys()
        .chain(trained.keys())
        .chain(initial.keys())
        .collect();
    let value = |l: &TrajectoryLabels, k: &String| l.get(k).copied().unwrap_or(0.0);
    let mut out: Vec<BehaviourDiff> = keys
        .into_iter()
        .filter_map(|k| {
            let (r, t, i) = (value(rescue, k), value(trained, k), value(initial, k));
            let same_way = (t - i).signum() == (r - i).signum();
            (t != i && r != i && same_way).then(|| BehaviourDiff {
                feature: k.clone(),
                rescue: r,
                trained: t,
                initial: i,
            })
        })
        .collect();
    // Decisions first (where the planted behaviours are decided), then other flags, then counts;
    // within each, the largest change first.
    let rank = |d: &BehaviourDiff| {
        let flag = [d.rescue, d.trained, d.initial]
            .iter()
            .all(|&v| v == 0.0 || v == 1.0);
        match (d.feature.starts_with(DECISION_PREFIX), flag) {
            (true, _) => 0,
            (false, true) => 1,
            (false, false) => 2,
        }
    };
    out.sort_by(|a, b| {
        rank(a)
            .cmp(&rank(b))
            .then_with(|| {
                (b.trained - b.initial)
                    .abs()
                    .total_cmp(&(a.trained - a.initial).abs())
            })
            .then_with(|| a.feature.cmp(&b.feature))
    });
    out
}

/// Per family of a method's training: H0 attempts and successes, and the rescued groups whose
/// successful rescue entered an applied update.
#[derive(Debug, Default)]
pub(crate) struct FamilyRescues<'a> {
    /// H0 attempts of the method's training on the family (mixture groups left out).
    pub attempts: usize,
    /// Of which successful.
    pub successes: usize,
    /// Rescued groups, retained, with a successful rescue rollout, in an applied update.
    pub rescued: Vec<&'a GroupRecord>,
}

/// The policy version each applied update produced, from a method's `metrics.jsonl` records
/// (an update the learner skipped, `applied: false`, is absent).
pub(crate) fn applied_updates(records: &[UpdateRecord]) -> BTreeMap<u64, u64> {
    records
        .iter()
        .filter(|r| r.kind == "update" && r.applied)
        .map(|r| (r.update, r.policy_version))
        .collect()
}

/// Group a method's training groups by family. A rescue counts only when its group was
/// retained, holds a successful rescue rollout, and its update is in `applied` (the paper's
/// "entered a policy update"; a retained group of a skipped update changed no weight).
pub(crate) fn rescued_families<'a>(
    groups: &'a [GroupRecord],
    applied: &BTreeMap<u64, u64>,
    family_of_train: &BTreeMap<&str, String>,
) -> BTreeMap<String, FamilyRescues<'a>> {
    let mut families: BTreeMap<String, FamilyRescues> = BTreeMap::new();
    for g in groups {
        let Some(family) = family_of_train.get(g.task_id.as_str()) else {
            continue;
        };
        let f = families.entry(family.clone()).or_default();
        if g.origin != harness_core::GroupOrigin::Mixture {
            f.attempts += g.base_rewards.len();
            f.successes += g.base_rewards.iter().filter(|&&r| r >= 1.0).count();
        }
        if g.rescued()
            && g.retained
            && applied.contains_key(&g.update)
            && g.rescue_rewards.iter().any(|&r| r >= 1.0)
        {
            f.rescued.push(g);
        }
    }
    families
}

/// Plain GRPO's H0 test episodes by task, one for every test task: Table 4's cases are ones
/// where GRPO fails too, so a run without them has no Table 4 (an error, never a relaxed
/// condition).
pub(crate) fn grpo_episodes<'a>(
    all: &'a [EpisodeRecord],
    test: &[harness_core::Task],
) -> std::result::Result<BTreeMap<&'a str, &'a EpisodeRecord>, String> {
    let grpo: BTreeMap<&str, &EpisodeRecord> = all
        .iter()
        .filter(|e| e.method == Method::Grpo.name())
        .map(|e| (e.task.as_str(), e))
        .collect();
    if grpo.is_empty() {
        return Err(format!(
            "Table 4 compares with plain GRPO under H0 and this run has no H0 test episodes of \
             `{}` (add it to train.methods)",
            Method::Grpo.name()
        ));
    }
    if let Some(t) = test.iter().find(|t| !grpo.contains_key(t.id.as_str())) {
        return Err(format!(
            "plain GRPO's H0 test episodes lack test task `{}`: eval/episodes.jsonl is from \
             another test split",
            t.id
        ));
    }
    Ok(grpo)
}

/// Table 4 of a seed, once every method of `train.methods` was evaluated: the cases of each
/// rescue-trained method (written to `eval/transfer.jsonl`). Without plain GRPO's H0 test
/// episodes the file is removed and the reason is returned (the report says it).
pub fn transfer(wb: &Workbench, pool: &harness_pool::SiblingPool) -> Result<Option<String>> {
    let path = wb.layout.transfer_results();
    let all: Vec<EpisodeRecord> = read_jsonl(
        &wb.layout.episode_results(),
        "an episode line {method, task, family, attempts}",
    )?;
    let grpo = match grpo_episodes(&all, &wb.test) {
        Ok(g) => g,
        Err(why) => {
            if path.is_file() {
                std::fs::remove_file(&path)
                    .map_err(|e| Error::input("evaluate", &path, e.to_string()))?;
            }
            return Ok(Some(why));
        }
    };
    let mut lines = Vec::new();
    for &method in &wb.cfg.train.methods {
        let episodes: Vec<EpisodeRecord> = all
            .iter()
            .filter(|e| e.method == method.name())
            .cloned()
            .collect();
        if episodes.is_empty() {
            continue;
        }
        let label = super::method_label(wb, pool, method)?;
        lines.extend(transfer_cases(wb, method, &label, &episodes, &all, &grpo)?);
    }
    let mut text = String::new();
    for c in &lines {
        text.push_str(&serde_json::to_string(c).unwrap_or_else(|_| unreachable!("plain data")));
        text.push('\n');
    }
    harness_core::fsutil::write_atomic(&path, text.as_bytes()).at("evaluate")?;
    Ok(None)
}

/// Table 4's cases of `method` from its training files and its H0 test `episodes`; empty for a
/// method without rescue groups, or before the initial policy's evaluation.
fn transfer_cases(
    wb: &Workbench,
    method: Method,
    label: &str,
    episodes: &[EpisodeRecord],
    all: &[EpisodeRecord],
    grpo: &BTreeMap<&str, &EpisodeRecord>,
) -> Result<Vec<TransferCase>> {
    let run = wb.layout.train(method);
    let groups: Vec<GroupRecord> =
        read_jsonl(&run.join(GROUPS_FILE), "a harness-rollout GroupRecord")?;
    if !groups.iter().any(GroupRecord::rescued) {
        return Ok(Vec::new());
    }
    // metrics.jsonl mixes update lines with evaluation and calibration lines.
    let path = run.join(METRICS_FILE);
    let lines: Vec<serde_json::Value> = read_jsonl(&path, "a JSON object")?;
    let updates: Vec<UpdateRecord> = lines
        .into_iter()
        .filter(|l| l["kind"] == "update")
        .map(|l| {
            serde_json::from_value(l).map_err(|e| {
                Error::input(
                    "evaluate",
                    &path,
                    format!("an update line is not a harness-rollout UpdateRecord: {e}"),
                )
            })
        })
        .collect::<Result<_>>()?;
    let applied = applied_updates(&updates);
    let initial: BTreeMap<&str, &EpisodeRecord> = all
        .iter()
        .filter(|e| e.method == "initial")
        .map(|e| (e.task.as_str(), e))
        .collect();
    if initial.is_empty() {
        tracing::warn!(
            "{}: no H0 test episodes of the initial policy; Table 4 needs them",
            method.name()
        );
        return Ok(Vec::new());
    }
    let family_of_train: BTreeMap<&str, String> = wb
        .train
        .iter()
        .map(|t| (t.id.as_str(), wb.family_of(t)))
        .collect();
    let families = rescued_families(&groups, &applied, &family_of_train);
    let labellers = harness_envs::labels::builtin_labellers();
    // `trajectories.jsonl` holds each group's rollouts, base then rescue, in `groups.jsonl`'s
    // order: the first rescued group of a family owns the lines after its base attempts.
    let first_rescue: BTreeMap<(String, u64), String> = families
        .iter()
        .filter_map(|(family, f)| {
            let g = f.rescued.first()?;
            Some(((g.task_id.clone(), g.update), family.clone()))
        })
        .collect();
    let path = run.join(TRAJECTORIES_FILE);
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::input("evaluate", &path, e.to_string()))?;
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let mut rescue_of: BTreeMap<String, (RescueEvidence, TrajectoryLabels)> = BTreeMap::new();
    let mut at = 0usize;
    for g in &groups {
        let rescue_lines =
            at + g.base_rewards.len()..at + g.base_rewards.len() + g.rescue_rewards.len();
        at = rescue_lines.end;
        let Some(family) = first_rescue.get(&(g.task_id.clone(), g.update)) else {
            continue;
        };
        if rescue_of.contains_key(family) {
            continue;
        }
        for n in rescue_lines {
            let Some(line) = lines.get(n) else {
                return Err(Error::input(
                    "evaluate",
                    &path,
                    format!(
                        "{} lines, fewer than groups.jsonl's rollouts (line {} is due for task `{}` at update {})",
                        lines.len(),
                        n + 1,
                        g.task_id,
                        g.update
                    ),
                ));
            };
            let t: Trajectory = serde_json::from_str(line)
                .map_err(|e| Error::input("evaluate", &path, format!("line {}: {e}", n + 1)))?;
            if t.task_id != g.task_id {
                return Err(Error::input(
                    "evaluate",
                    &path,
                    format!(
                        "line {} is task `{}`, expected `{}` (groups.jsonl and trajectories.jsonl disagree)",
                        n + 1,
                        t.task_id,
                        g.task_id
                    ),
                ));
            }
            if t.is_success() {
                let evidence = RescueEvidence {
                    task: g.task_id.clone(),
                    update: g.update,
                    policy_version: applied.get(&g.update).copied(),
                    harness: t.harness_id.to_string(),
                    harness_name: t.harness_name.clone(),
                };
                rescue_of.insert(family.clone(), (evidence, behaviour_labels(&labellers, &t)));
                break;
            }
        }
    }
    let mut cases = Vec::new();
    for (family, (evidence, rescue_labels)) in &rescue_of {
        let f = &families[family];
        let case = |test: Option<(&EpisodeRecord, usize, Vec<BehaviourDiff>)>| {
            let (task, attempt, attempts, trained, behaviours) = match test {
                Some((e, a, b)) => (
                    Some(e.task.clone()),
                    a,
                    e.attempts.len(),
                    e.attempts.iter().filter(|x| x.reward >= 1.0).count(),
                    b,
                ),
                None => (None, 0, 0, 0, Vec::new()),
            };
            TransferCase {
                method: method.name().to_string(),
                label: label.to_string(),
                family: family.clone(),
                h0_training_attempts: f.attempts,
                h0_training_successes: f.successes,
                rescued_groups: f.rescued.len(),
                rescue: evidence.clone(),
                grpo_successes: task.as_deref().and_then(|t| {
                    grpo.get(t)
                        .map(|g| g.attempts.iter().filter(|x| x.reward >= 1.0).count())
                }),
                test_task: task,
                attempt,
                attempts,
                trained_successes: trained,
                initial_successes: 0,
                behaviours,
            }
        };
        let mut found = 0;
        for e in episodes.iter().filter(|e| &e.family == family) {
            if found == CASES_PER_FAMILY {
                break;
            }
            let Some(init) = initial.get(e.task.as_str()) else {
                continue;
            };
            if init.attempts.iter().any(|x| x.reward >= 1.0) {
                continue;
            }
            // The paper's cases are ones "where GRPO fails": plain GRPO failed every attempt
            // too (`grpo_episodes` holds every test task).
            if method != Method::Grpo
                && grpo
                    .get(e.task.as_str())
                    .is_some_and(|g| g.attempts.iter().any(|x| x.reward >= 1.0))
            {
                continue;
            }
            let Some(a) = (0..e.attempts.len().min(init.attempts.len()))
                .find(|&a| e.attempts[a].reward >= 1.0)
            else {
                continue;
            };
            let diffs = behaviour_diffs(
                rescue_labels,
                &e.attempts[a].labels,
                &init.attempts[a].labels,
            );
            cases.push(case(Some((e, a, diffs))));
            found += 1;
        }
        if found == 0 {
            cases.push(case(None));
        }
    }
    Ok(cases)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(update: u64, task: &str, rescue: &[f32]) -> GroupRecord {
        GroupRecord {
            update,
            task_id: task.into(),
            draw: update,
            origin: harness_core::GroupOrigin::Rescue,
            base_rewards: vec![0.0; 4],
            rescue_harnesses: Vec::new(),
            rescue_rewards: rescue.to_vec(),
            retained: true,
            retained_rewards: Vec::new(),
            retained_harnesses: Vec::new(),
            policy_tokens: 10,
            policy_version: update - 1,
        }
    }

    fn update(n: u64, applied: bool) -> UpdateRecord {
        let mut r: UpdateRecord = serde_json::from_value(serde_json::json!({
            "kind": "update", "update": n, "strategy": "router_top_k", "tasks": 1,
            "retained_groups": 1, "eg_rate": 0.0, "effective_token_share": 0.0,
            "all_fail_rate": 1.0, "rescue_trigger_rate": 1.0, "rescue_success": 1.0,
            "rescue_use": {}, "base_reward_mean": 0.0, "retained_reward_mean": 0.5,
            "rollouts_base": 4, "rollouts_rescue": 4, "policy_tokens": 10, "applied": applied,
            "loss": 0.0, "grad_norm": 0.0, "clip_frac_low": 0.0, "clip_frac_high": 0.0,
            "weight_mean": 1.0, "weight_clipped_frac": 0.0, "lr": 1e-5, "learner_tokens": 10,
            "policy_version": n, "rollout_seconds": 0.0, "update_seconds": 0.0,
            "calibration_seconds": 0.0
        }))
        .unwrap();
        r.policy_version = if applied { n } else { n - 1 };
        r
    }

    #[test]
    fn a_rescue_counts_only_when_its_update_was_applied() {
        let groups = vec![
            group(1, "t-change", &[0.0, 1.0, 0.0, 0.0]),
            group(2, "t-quoting", &[1.0, 0.0, 0.0, 0.0]),
            group(3, "t-recheck", &[0.0, 0.0, 0.0, 0.0]),
        ];
        // Update 2 was skipped by the learner (no scored token): its retained rescue changed no
        // weight and is no evidence for Table 4.
        let applied = applied_updates(&[update(1, true), update(2, false), update(3, true)]);
        assert_eq!(applied, BTreeMap::from([(1, 1), (3, 3)]));
        let family_of: BTreeMap<&str, String> = [
            ("t-change", "change".to_string()),
            ("t-quoting", "quoting".to_string()),
            ("t-recheck", "recheck".to_string()),
        ]
        .into_iter()
        .collect();
        let f = rescued_families(&groups, &applied, &family_of);
        assert_eq!(f["change"].rescued.len(), 1);
        assert!(f["quoting"].rescued.is_empty(), "skipped update 2 counted");
        // No successful rescue rollout: no evidence either.
        assert!(f["recheck"].rescued.is_empty());
        assert_eq!(f["quoting"].attempts, 4);
    }

    #[test]
    fn table4_without_plain_grpo_is_an_error_not_a_relaxed_condition() {
        let test: Vec<harness_core::Task> = ["a", "b"]
            .iter()
            .map(|id| harness_core::Task::new(*id, "env", harness_core::Split::Test, "", 0))
            .collect();
        let line = |method: &str, task: &str| EpisodeRecord {
            method: method.into(),
            task: task.into(),
            family: "all".into(),
            attempts: Vec::new(),
        };
        let only_initial = vec![line("initial", "a"), line("harness_s", "a")];
        let err = grpo_episodes(&only_initial, &test).unwrap_err();
        assert!(err.contains("add it to train.methods"), "{err}");
        let partial = vec![line("grpo", "a")];
        let err = grpo_episodes(&partial, &test).unwrap_err();
        assert!(err.contains("`b`"), "{err}");
        let full = vec![line("grpo", "a"), line("grpo", "b")];
        assert_eq!(grpo_episodes(&full, &test).unwrap().len(), 2);
    }

    fn labels(pairs: &[(&str, f64)]) -> TrajectoryLabels {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn a_difference_counts_only_where_the_rescue_went_the_same_way() {
        let rescue = labels(&[
            ("decision:after_change=commit", 1.0),
            ("sql_calls", 2.0),
            ("env_actions", 2.0),
            ("submitted", 1.0),
        ]);
        let trained = labels(&[
            ("decision:after_change=commit", 1.0),
            ("sql_calls", 5.0),
            ("env_actions", 2.0),
            ("submitted", 1.0),
        ]);
        let initial = labels(&[
            ("decision:after_change=check", 1.0),
            ("sql_calls", 3.0),
            ("env_actions", 5.0),
        ]);
        let d = behaviour_diffs(&rescue, &trained, &initial);
        let names: Vec<&str> = d.iter().map(|b| b.feature.as_str()).collect();
        // The commit flag moved the same way in the rescue and the check flag dropped in both
        // (decisions first); then the other flag; then the count, though its change is the
        // largest. sql_calls rose in the trained attempt but fell in the rescue: left out.
        assert_eq!(
            names,
            [
                "decision:after_change=check",
                "decision:after_change=commit",
                "submitted",
                "env_actions"
            ]
        );
        assert_eq!((d[1].rescue, d[1].trained, d[1].initial), (1.0, 1.0, 0.0));
        assert!(behaviour_diffs(&initial, &trained, &initial).is_empty());
    }
}
