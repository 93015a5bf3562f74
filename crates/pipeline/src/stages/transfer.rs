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
//!    rollout that entered an update, by family, and how often H0's own attempts succeeded on
//!    that family in training (0: the kind was never solved under H0 in training).
//! 2. From `trajectories.jsonl`: the first such successful rescue rollout, labelled.
//! 3. From `eval/episodes.jsonl`: held-out test instances of that family where an attempt of
//!    the trained policy under H0 succeeds while the initial policy, and plain GRPO when it was
//!    evaluated, failed every attempt (the same episode seeds for all), labelled.
//! 4. The behaviours that made the difference: labels on which the trained success differs from
//!    the initial policy's failed attempt with the same seed, in the direction the rescue rollout
//!    also differs (the environment labeller's features, and for DBBench each decision-point
//!    choice as a flag).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use harness_core::{Trajectory, TrajectoryLabeller, TrajectoryLabels};
use harness_rollout::{GROUPS_FILE, GroupRecord, TRAJECTORIES_FILE};

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
) -> Vec<EpisodeRecord> {
    wb.test
        .iter()
        .zip(rewards.iter().zip(labels))
        .map(|(task, (r, l))| EpisodeRecord {
            method: method.to_string(),
            task: task.id.clone(),
            family: wb.family_of(task),
            attempts: r
                .iter()
                .zip(l)
                .map(|(&reward, labels)| AttemptRecord {
                    reward,
                    labels: labels.clone(),
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

/// Table 4's cases of `method` from its training files and the H0 test `episodes` just run;
/// empty for a method without rescue groups, or before the initial policy's evaluation.
pub(crate) fn transfer_cases(
    wb: &Workbench,
    method: Method,
    label: &str,
    episodes: &[EpisodeRecord],
) -> Result<Vec<TransferCase>> {
    let run = wb.layout.train(method);
    let groups: Vec<GroupRecord> =
        read_jsonl(&run.join(GROUPS_FILE), "a harness-rollout GroupRecord")?;
    if !groups.iter().any(GroupRecord::rescued) {
        return Ok(Vec::new());
    }
    let all: Vec<EpisodeRecord> = read_jsonl(
        &wb.layout.episode_results(),
        "an episode line {method, task, family, attempts}",
    )?;
    let of = |m: &str| -> BTreeMap<&str, &EpisodeRecord> {
        all.iter()
            .filter(|e| e.method == m)
            .map(|e| (e.task.as_str(), e))
            .collect()
    };
    let initial = of("initial");
    if initial.is_empty() {
        tracing::warn!(
            "{}: no H0 test episodes of the initial policy; Table 4 needs them",
            method.name()
        );
        return Ok(Vec::new());
    }
    let grpo = of(Method::Grpo.name());
    let family_of_train: BTreeMap<&str, String> = wb
        .train
        .iter()
        .map(|t| (t.id.as_str(), wb.family_of(t)))
        .collect();
    // Per family: H0 attempts and successes in training, and the rescued groups.
    struct Family<'a> {
        attempts: usize,
        successes: usize,
        rescued: Vec<&'a GroupRecord>,
    }
    let mut families: BTreeMap<String, Family> = BTreeMap::new();
    for g in &groups {
        let Some(family) = family_of_train.get(g.task_id.as_str()) else {
            continue;
        };
        let f = families.entry(family.clone()).or_insert(Family {
            attempts: 0,
            successes: 0,
            rescued: Vec::new(),
        });
        if g.origin != harness_core::GroupOrigin::Mixture {
            f.attempts += g.base_rewards.len();
            f.successes += g.base_rewards.iter().filter(|&&r| r >= 1.0).count();
        }
        if g.rescued() && g.retained && g.rescue_rewards.iter().any(|&r| r >= 1.0) {
            f.rescued.push(g);
        }
    }
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
            // The paper's cases are ones "where GRPO fails": with plain GRPO evaluated, it
            // must have failed every attempt too.
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
