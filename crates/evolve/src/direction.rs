//! Repair directions `D_g(H)` (paper Eq. 2): 2-3 related root causes per direction, each
//! supported by at least 2 distinct failed tasks (Table 8, "Repair direction"). Causes with less
//! support are reported, not edited for.

use harness_core::HarnessId;
use serde::{Deserialize, Serialize};

use crate::cause::{Cause, FailureAnalysis, Family, family_of};
use crate::settings::EvolveSettings;

/// One repair direction of one parent: the causes an edit targets.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Direction {
    /// A readable id, unique in its round (`g1-d3`).
    pub id: String,
    /// The parent it edits.
    pub parent: HarnessId,
    /// The related causes it targets (2-3 under the paper's settings).
    pub causes: Vec<Cause>,
    /// 0 for the first proposal along these causes; later proposals along the same causes ask
    /// the editor for a different mechanism (the paper's "other candidate briefs provide context
    /// for seeking different mechanisms, triggers, or recovery strategies").
    pub variant: usize,
}

impl Direction {
    /// The cause kinds, joined (`stopped-paging+budget-before-completion`).
    pub fn label(&self) -> String {
        self.causes
            .iter()
            .map(|c| c.kind.as_str())
            .collect::<Vec<_>>()
            .join("+")
    }

    /// Every targeted failed task, sorted and distinct.
    pub fn targeted_tasks(&self) -> Vec<String> {
        let mut tasks: Vec<String> = self.causes.iter().flat_map(|c| c.tasks.clone()).collect();
        tasks.sort();
        tasks.dedup();
        tasks
    }
}

/// A cause that no direction targets, and why.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReportedCause {
    /// The cause's kind.
    pub kind: String,
    /// Its failed tasks.
    pub tasks: Vec<String>,
    /// Why no edit targets it.
    pub reason: String,
}

/// The cause groups of one parent, before the proposal budget is spent.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DirectionPlan {
    /// Groups of related, well-supported causes.
    pub groups: Vec<Vec<Cause>>,
    /// Causes left out, with the reason.
    pub reported: Vec<ReportedCause>,
}

/// Split `causes` (already ordered) into chunks of `min..=max`, as even as possible, and the
/// causes no chunk can take. With `k` chunks every size lies in `min..=max` exactly when
/// `ceil(n / max) <= k <= floor(n / min)`; when no such `k` exists (e.g. 3 causes in chunks of
/// exactly 2), the largest number of full chunks is formed and the rest is returned.
fn chunk(causes: Vec<Cause>, min: usize, max: usize) -> (Vec<Vec<Cause>>, Vec<Cause>) {
    let n = causes.len();
    if n < min || min == 0 {
        return (Vec::new(), causes);
    }
    let (fewest, most) = (n.div_ceil(max), n / min);
    let mut it = causes.into_iter();
    if fewest <= most {
        let k = fewest;
        let (base, extra) = (n / k, n % k);
        let out = (0..k)
            .map(|i| it.by_ref().take(base + usize::from(i < extra)).collect())
            .collect();
        return (out, Vec::new());
    }
    let out = (0..most).map(|_| it.by_ref().take(max).collect()).collect();
    (out, it.collect())
}

/// Group one parent's analysed causes into directions (Table 8, "Repair direction"): causes
/// below `min_failed_tasks_per_cause` distinct failed tasks are reported; the others are grouped
/// with related causes, i.e. causes of the same [`Family`] (by support), `min..=max` causes per
/// group. A cause whose family has too few well-supported causes for a group is a direction of
/// its own: one root cause, never paired with an unrelated one.
pub fn plan_directions(analysis: &FailureAnalysis, settings: &EvolveSettings) -> DirectionPlan {
    let (min, max) = (
        settings.min_causes_per_direction,
        settings.max_causes_per_direction,
    );
    let mut plan = DirectionPlan::default();
    let mut eligible: Vec<Cause> = Vec::new();
    for cause in &analysis.causes {
        let mut tasks = cause.tasks.clone();
        tasks.sort();
        tasks.dedup();
        if tasks.len() < settings.min_failed_tasks_per_cause {
            plan.reported.push(ReportedCause {
                kind: cause.kind.clone(),
                reason: format!(
                    "supported by {} distinct failed task(s); a direction needs at least {} per cause",
                    tasks.len(),
                    settings.min_failed_tasks_per_cause
                ),
                tasks,
            });
        } else {
            eligible.push(Cause {
                tasks,
                ..cause.clone()
            });
        }
    }
    eligible.sort_by(|a, b| {
        family_of(&a.kind)
            .cmp(&family_of(&b.kind))
            .then_with(|| b.tasks.len().cmp(&a.tasks.len()))
            .then_with(|| a.kind.cmp(&b.kind))
    });
    let mut families: Vec<(Family, Vec<Cause>)> = Vec::new();
    for cause in eligible {
        let family = family_of(&cause.kind);
        match families.last_mut() {
            Some((f, list)) if *f == family => list.push(cause),
            _ => families.push((family, vec![cause])),
        }
    }
    for (_, list) in families {
        let (groups, left) = chunk(list, min, max);
        let first = plan.groups.len();
        plan.groups.extend(groups);
        for cause in left {
            // A cause left over joins a related group with room, else stands alone.
            match plan.groups[first..].iter_mut().find(|g| g.len() < max) {
                Some(group) => group.push(cause),
                None => plan.groups.push(vec![cause]),
            }
        }
    }
    plan
}

/// Spend a round's proposal budget over the parents' plans (Eq. 2's `C_g`): round-robin over
/// parents, each taking its next group in turn (after its last group it starts again with the
/// next variant), until `budget` directions are chosen. Parents without groups get none.
pub fn allocate(
    round: usize,
    plans: &[(HarnessId, DirectionPlan)],
    budget: usize,
) -> Vec<Direction> {
    let mut out = Vec::new();
    if plans.iter().all(|(_, p)| p.groups.is_empty()) {
        return out;
    }
    // Every pass adds at least one direction, so this ends after at most `budget` passes.
    for k in 0.. {
        for (parent, plan) in plans {
            if out.len() == budget {
                return out;
            }
            let m = plan.groups.len();
            if m == 0 {
                continue;
            }
            out.push(Direction {
                id: format!("g{round}-d{}", out.len() + 1),
                parent: parent.clone(),
                causes: plan.groups[k % m].clone(),
                variant: k / m,
            });
        }
    }
    out
}
