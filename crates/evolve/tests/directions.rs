//! Direction rules (Table 8, "Repair direction"): causes supported by fewer than 2 distinct
//! failed tasks are reported, not edited for; a direction holds 2-3 related causes (one
//! family), or one root cause whose family has no other; unrelated causes never share one.

use harness_core::HarnessId;
use harness_evolve::EvolveSettings;
use harness_evolve::cause::{Cause, FailureAnalysis, family_of};
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
    let groups: Vec<Vec<&str>> = plan
        .groups
        .iter()
        .map(|g| g.iter().map(|c| c.kind.as_str()).collect())
        .collect();
    assert_eq!(
        groups,
        vec![vec!["stopped-paging"], vec!["budget-before-completion"]],
        "unrelated causes make a direction each"
    );
}

#[test]
fn every_direction_holds_related_causes_only() {
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
        let plan = plan_directions(&analysis(causes.clone()), &settings);
        assert!(plan.reported.is_empty(), "n = {n}: {:?}", plan.reported);
        let total: usize = plan.groups.iter().map(Vec::len).sum();
        assert_eq!(total, n, "every eligible cause is targeted");
        for group in &plan.groups {
            let family = family_of(&group[0].kind);
            assert!(
                group.iter().all(|c| family_of(&c.kind) == family),
                "n = {n}: a direction mixes families: {group:?}"
            );
            let relatives = causes
                .iter()
                .filter(|c| family_of(&c.kind) == family)
                .count();
            if relatives >= 2 {
                assert!(
                    (2..=3).contains(&group.len()),
                    "n = {n}: group of {} in a family of {relatives}",
                    group.len()
                );
            } else {
                assert_eq!(group.len(), 1, "n = {n}: a lone cause stands alone");
            }
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
fn a_lone_cause_is_a_direction_of_its_own() {
    let settings = EvolveSettings::paper();
    let plan = plan_directions(
        &analysis(vec![cause("stopped-paging", &["a", "b", "c"])]),
        &settings,
    );
    assert_eq!(plan.groups.len(), 1);
    assert_eq!(plan.groups[0][0].kind, "stopped-paging");
    assert!(plan.reported.is_empty());
}

#[test]
fn the_planted_dbbench_failures_make_three_directions() {
    // The embedded default's three planted failures are three root causes of three families:
    // each gets its own direction.
    let settings = EvolveSettings::paper();
    let plan = plan_directions(
        &analysis(vec![
            cause("no-commit-after-change", &["a", "b", "c"]),
            cause("rerun-instead-of-commit", &["d", "e"]),
            cause("unknown-schema-name", &["f", "g", "h", "i"]),
        ]),
        &settings,
    );
    let mut groups: Vec<Vec<&str>> = plan
        .groups
        .iter()
        .map(|g| g.iter().map(|c| c.kind.as_str()).collect())
        .collect();
    groups.sort();
    assert_eq!(
        groups,
        vec![
            vec!["no-commit-after-change"],
            vec!["rerun-instead-of-commit"],
            vec!["unknown-schema-name"]
        ]
    );
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
            let mut short = std::collections::BTreeMap::new();
            for group in &plan.groups {
                // At most `max` causes, all of one family; fewer than `min` only for what
                // the family could not fill (one such direction per family at most).
                let family = family_of(&group[0].kind);
                assert!(group.iter().all(|c| family_of(&c.kind) == family));
                assert!(
                    (1..=max).contains(&group.len()),
                    "bounds {min}-{max}, {n} causes: a direction of {}",
                    group.len()
                );
                if group.len() < min {
                    *short.entry(family).or_insert(0) += 1;
                }
            }
            assert!(
                short.values().all(|&k| k <= 1),
                "bounds {min}-{max}, {n} causes: {short:?}"
            );
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
