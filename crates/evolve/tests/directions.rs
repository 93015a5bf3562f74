//! Direction rules (Table 8, "Repair direction"): causes supported by fewer than 2 distinct
//! failed tasks are reported, not edited for; every direction holds 2-3 causes.

use harness_core::HarnessId;
use harness_evolve::EvolveSettings;
use harness_evolve::cause::{Cause, FailureAnalysis};
use harness_evolve::direction::{allocate, plan_directions};

fn cause(kind: &str, tasks: &[&str]) -> Cause {
    Cause {
        kind: kind.into(),
        summary: kind.into(),
        tasks: tasks.iter().map(|t| t.to_string()).collect(),
        evidence: Vec::new(),
        tools: Vec::new(),
    }
}

fn analysis(causes: Vec<Cause>) -> FailureAnalysis {
    let mut a = FailureAnalysis {
        failures: causes.iter().map(|c| c.tasks.len()).sum(),
        causes,
        ..FailureAnalysis::default()
    };
    a.normalise();
    a
}

#[test]
fn thin_causes_are_reported_not_edited() {
    let settings = EvolveSettings::paper();
    let plan = plan_directions(
        &analysis(vec![
            cause("stopped-paging", &["a", "b", "c"]),
            cause("budget-before-completion", &["d", "e"]),
            // Two trajectories of one task are one distinct failed task.
            cause("repeated-failing-call", &["f", "f"]),
            cause("edited-tests", &["g"]),
        ]),
        &settings,
    );
    let reported: Vec<&str> = plan.reported.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(reported, vec!["edited-tests", "repeated-failing-call"]);
    assert!(
        plan.reported
            .iter()
            .all(|r| r.reason.contains("at least 2"))
    );
    assert_eq!(plan.groups.len(), 1);
    let kinds: Vec<&str> = plan.groups[0].iter().map(|c| c.kind.as_str()).collect();
    assert_eq!(kinds, vec!["stopped-paging", "budget-before-completion"]);
}

#[test]
fn every_direction_holds_two_or_three_related_causes() {
    let settings = EvolveSettings::paper();
    for n in 2..=9usize {
        let kinds = [
            "stopped-paging",
            "union-not-intersection",
            "budget-before-completion",
            "finished-without-submit",
            "repeated-failing-call",
            "unknown-schema-name",
            "call-without-docs",
            "no-readback",
            "edit-without-retest",
        ];
        let causes: Vec<Cause> = kinds[..n]
            .iter()
            .enumerate()
            .map(|(i, k)| cause(k, &[&format!("{i}a"), &format!("{i}b")]))
            .collect();
        let plan = plan_directions(&analysis(causes), &settings);
        assert!(plan.reported.is_empty(), "n = {n}: {:?}", plan.reported);
        let total: usize = plan.groups.iter().map(Vec::len).sum();
        assert_eq!(total, n, "every eligible cause is targeted");
        for group in &plan.groups {
            assert!(
                (2..=3).contains(&group.len()),
                "n = {n}: group of {}",
                group.len()
            );
        }
    }
    // Related causes go together: both coverage causes share a direction.
    let plan = plan_directions(
        &analysis(vec![
            cause("stopped-paging", &["a", "b"]),
            cause("budget-before-completion", &["c", "d"]),
            cause("union-not-intersection", &["e", "f"]),
            cause("finished-without-submit", &["g", "h"]),
        ]),
        &settings,
    );
    let groups: Vec<Vec<&str>> = plan
        .groups
        .iter()
        .map(|g| g.iter().map(|c| c.kind.as_str()).collect())
        .collect();
    assert!(
        groups.contains(&vec!["stopped-paging", "union-not-intersection"]),
        "{groups:?}"
    );
    assert!(
        groups.contains(&vec!["budget-before-completion", "finished-without-submit"]),
        "{groups:?}"
    );
}

#[test]
fn a_lone_cause_makes_no_direction() {
    let settings = EvolveSettings::paper();
    let plan = plan_directions(
        &analysis(vec![cause("stopped-paging", &["a", "b", "c"])]),
        &settings,
    );
    assert!(plan.groups.is_empty());
    assert_eq!(plan.reported.len(), 1);
    assert!(plan.reported[0].reason.contains("2-3"));
}

#[test]
fn the_budget_is_spent_round_robin_with_new_variants() {
    let settings = EvolveSettings::paper();
    let plan = plan_directions(
        &analysis(vec![
            cause("stopped-paging", &["a", "b"]),
            cause("union-not-intersection", &["c", "d"]),
            cause("budget-before-completion", &["e", "f"]),
            cause("finished-without-submit", &["g", "h"]),
        ]),
        &settings,
    );
    let p1 = HarnessId("p1".into());
    let p2 = HarnessId("p2".into());
    let directions = allocate(2, &[(p1.clone(), plan.clone()), (p2.clone(), plan)], 8);
    assert_eq!(directions.len(), 8);
    assert_eq!(directions.iter().filter(|d| d.parent == p1).count(), 4);
    assert_eq!(directions[0].id, "g2-d1");
    let variants: Vec<usize> = directions
        .iter()
        .filter(|d| d.parent == p2)
        .map(|d| d.variant)
        .collect();
    assert_eq!(variants, vec![0, 0, 1, 1]);
    assert!(allocate(1, &[(p1, Default::default())], 7).is_empty());
}

#[test]
fn no_direction_falls_outside_the_configured_bounds_whatever_they_are() {
    let kinds = [
        "stopped-paging",
        "union-not-intersection",
        "budget-before-completion",
        "finished-without-submit",
        "repeated-failing-call",
        "unknown-schema-name",
        "call-without-docs",
        "no-readback",
        "edit-without-retest",
    ];
    for (min, max) in [(2, 2), (3, 3), (3, 4), (2, 3), (1, 2), (4, 5)] {
        for n in 1..=kinds.len() {
            let mut settings = EvolveSettings::paper();
            settings.min_causes_per_direction = min;
            settings.max_causes_per_direction = max;
            let causes: Vec<Cause> = kinds[..n]
                .iter()
                .enumerate()
                .map(|(i, k)| cause(k, &[&format!("{i}a"), &format!("{i}b")]))
                .collect();
            let plan = plan_directions(&analysis(causes), &settings);
            for group in &plan.groups {
                assert!(
                    (min..=max).contains(&group.len()),
                    "bounds {min}-{max}, {n} causes: a direction of {}",
                    group.len()
                );
            }
            // Every cause is either in a direction or reported, never dropped.
            let placed: usize = plan.groups.iter().map(Vec::len).sum();
            assert_eq!(
                placed + plan.reported.len(),
                n,
                "bounds {min}-{max}, {n} causes"
            );
        }
    }
}
