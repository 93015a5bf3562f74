//! Eq. 9 aggregation on hand-made ballots (ties at every level) and property tests of
//! aggregation and of the rescue / inference cuts (Eqs. 10 and 12).

use std::collections::{BTreeMap, BTreeSet};

use harness_core::HarnessId;
use harness_router::{RankWeights, Scored, aggregate, top_k};
use proptest::prelude::*;

fn id(s: &str) -> HarnessId {
    HarnessId(s.into())
}

fn ids(names: &[&str]) -> Vec<HarnessId> {
    names.iter().map(|n| id(n)).collect()
}

fn scores(ranking: &[Scored]) -> Vec<(String, f64)> {
    ranking.iter().map(|s| (s.id.0.clone(), s.score)).collect()
}

#[test]
fn sums_the_paper_weights_and_scores_unlisted_candidates_zero() {
    let candidates = ids(&["a", "b", "c", "d", "e", "f"]);
    let ballots = vec![ids(&["a", "b", "c", "d"]), ids(&["c", "a", "e", "b"])];
    let ranking = aggregate(
        &candidates,
        &BTreeMap::new(),
        &ballots,
        &RankWeights::default(),
    );
    assert_eq!(
        scores(&ranking),
        vec![
            ("a".into(), 1.75), // 1 + 3/4
            ("c".into(), 1.5),  // 1/2 + 1
            ("b".into(), 1.0),  // 3/4 + 1/4
            ("e".into(), 0.5),  // 1/2
            ("d".into(), 0.25), // 1/4
            ("f".into(), 0.0),  // unlisted
        ]
    );
    assert_eq!(ranking[5].votes, 0);
    assert_eq!(ranking[0].votes, 2);
}

#[test]
fn ties_break_by_validation_success_then_id() {
    let candidates = ids(&["a", "b", "c", "d", "e", "f"]);
    // Score tie a = b = 1.75 (a: 1 + 3/4, b: 3/4 + 1); c = d = 0.75 (c: 1/2 + 1/4,
    // d: 1/4 + 1/2); e and f unlisted.
    let ballots = vec![ids(&["a", "b", "c", "d"]), ids(&["b", "a", "d", "c"])];
    // b beats a on validation success; c and d tie on it too, so the id decides; f beats e.
    let success = BTreeMap::from([
        (id("a"), 0.2),
        (id("b"), 0.6),
        (id("c"), 0.4),
        (id("d"), 0.4),
        (id("e"), 0.1),
        (id("f"), 0.3),
    ]);
    let ranking = aggregate(&candidates, &success, &ballots, &RankWeights::default());
    let order: Vec<&str> = ranking.iter().map(|s| s.id.0.as_str()).collect();
    assert_eq!(order, vec!["b", "a", "c", "d", "f", "e"]);

    // Every level tied: the same scores and rates everywhere, so the id alone orders them.
    let all_tied = aggregate(&candidates, &BTreeMap::new(), &[], &RankWeights::default());
    let order: Vec<&str> = all_tied.iter().map(|s| s.id.0.as_str()).collect();
    assert_eq!(order, vec!["a", "b", "c", "d", "e", "f"]);
}

#[test]
fn rescue_excludes_h0_and_fills_by_validation_success() {
    let candidates = ids(&["h0", "a", "b", "c", "d", "e"]);
    let success = BTreeMap::from([(id("h0"), 0.9), (id("d"), 0.5), (id("e"), 0.7)]);
    // H0 tops the votes, but rescue excludes it (Eq. 10); only a and b got votes.
    let ballots = vec![ids(&["h0", "a", "b"])];
    let ranking = aggregate(&candidates, &success, &ballots, &RankWeights::default());
    let rescue = top_k(ranking.clone(), 4, Some(&id("h0"))).unwrap();
    assert_eq!(rescue.ids, ids(&["a", "b", "e", "d"]));
    assert_eq!(rescue.filled, ids(&["e", "d"]));
    // Inference keeps H0 (Eq. 12).
    let inference = top_k(ranking, 1, None).unwrap();
    assert_eq!(inference.ids, ids(&["h0"]));
    assert!(inference.filled.is_empty());
}

#[test]
fn rank_weights_are_a_setting() {
    let candidates = ids(&["a", "b"]);
    let ballots = vec![ids(&["a", "b"]), ids(&["b", "a"]), ids(&["b", "a"])];
    // Borda-like weights 1, 0.9 change nothing about the order here but do change the scores.
    let ranking = aggregate(
        &candidates,
        &BTreeMap::new(),
        &ballots,
        &RankWeights(vec![1.0, 0.9]),
    );
    assert_eq!(scores(&ranking), vec![("b".into(), 2.9), ("a".into(), 2.8)]);
}

/// Up to 8 candidates `c0..`, H0 being `c0`, and ballots of 4 distinct candidates each.
fn case() -> impl Strategy<
    Value = (
        Vec<HarnessId>,
        BTreeMap<HarnessId, f64>,
        Vec<Vec<HarnessId>>,
    ),
> {
    (5usize..9).prop_flat_map(|n| {
        let candidates: Vec<HarnessId> = (0..n).map(|i| HarnessId(format!("c{i}"))).collect();
        let rates = proptest::collection::vec(prop_oneof![Just(0.0), Just(0.5), 0.0f64..1.0], n);
        let ballot = Just(candidates.clone())
            .prop_shuffle()
            .prop_map(|c| c.into_iter().take(4).collect::<Vec<_>>());
        (
            Just(candidates.clone()),
            rates,
            proptest::collection::vec(ballot, 0..6),
        )
            .prop_map(|(c, r, b)| {
                let rates = c.iter().cloned().zip(r).collect();
                (c, rates, b)
            })
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn the_ranking_does_not_depend_on_candidate_order(
        (candidates, rates, ballots) in case(),
        seed in any::<u64>(),
    ) {
        let mut shuffled = candidates.clone();
        // A seeded rotation plus reversal: a different order of the same candidates.
        shuffled.rotate_left((seed % candidates.len() as u64) as usize);
        if seed % 2 == 0 { shuffled.reverse(); }
        let a = aggregate(&candidates, &rates, &ballots, &RankWeights::default());
        let b = aggregate(&shuffled, &rates, &ballots, &RankWeights::default());
        prop_assert_eq!(a, b);
    }

    #[test]
    fn unlisted_candidates_score_zero_and_scores_sum_to_the_ballot_weight(
        (candidates, rates, ballots) in case(),
    ) {
        let listed: BTreeSet<&HarnessId> = ballots.iter().flatten().collect();
        let ranking = aggregate(&candidates, &rates, &ballots, &RankWeights::default());
        for s in &ranking {
            if !listed.contains(&s.id) {
                prop_assert_eq!(s.score, 0.0);
                prop_assert_eq!(s.votes, 0);
            } else {
                prop_assert!(s.score > 0.0);
            }
        }
        let total: f64 = ranking.iter().map(|s| s.score).sum();
        prop_assert!((total - 2.5 * ballots.len() as f64).abs() < 1e-9);
        // Sorted by score, then validation success, then id.
        for w in ranking.windows(2) {
            let (x, y) = (&w[0], &w[1]);
            let rate = |id: &HarnessId| rates.get(id).copied().unwrap_or(0.0);
            prop_assert!(
                x.score > y.score
                    || (x.score == y.score && rate(&x.id) > rate(&y.id))
                    || (x.score == y.score && rate(&x.id) == rate(&y.id) && x.id < y.id)
            );
        }
    }

    #[test]
    fn rescue_never_returns_h0_and_always_k_distinct_ids(
        (candidates, rates, ballots) in case(),
        k in 1usize..5,
    ) {
        let base = candidates[0].clone();
        let ranking = aggregate(&candidates, &rates, &ballots, &RankWeights::default());
        let pick = top_k(ranking, k, Some(&base)).unwrap();
        prop_assert_eq!(pick.ids.len(), k);
        prop_assert!(!pick.ids.contains(&base));
        let distinct: BTreeSet<&HarnessId> = pick.ids.iter().collect();
        prop_assert_eq!(distinct.len(), k);
        // The fill is exactly the selected ids nobody voted for.
        let listed: BTreeSet<&HarnessId> = ballots.iter().flatten().collect();
        let unvoted: Vec<&HarnessId> = pick.ids.iter().filter(|i| !listed.contains(i)).collect();
        prop_assert_eq!(unvoted, pick.filled.iter().collect::<Vec<_>>());
    }
}

#[test]
fn aggregate_ballots_json_shape_as_the_example_prints_it() {
    let input = serde_json::json!({
        "candidates": ["a", "b", "c", "d", "e"],
        "validation_success": {"b": 0.5, "e": 0.9},
        "ballots": [["a", "b", "c", "d"], ["b", "a", "d", "c"], ["a", "a", "b", "c"], "junk", ["a", "b", "zz", "c"]],
        "k": 3
    });
    let out = harness_router::aggregate::aggregate_json(&input).unwrap();
    assert_eq!(
        out,
        serde_json::json!({
            "ranking": [{"id": "b", "score": 1.75}, {"id": "a", "score": 1.75}, {"id": "c", "score": 0.75}],
            "dropped_ballots": 3,
            "filled": []
        })
    );
    // Too few voted candidates: the fill is reported.
    let fill = harness_router::aggregate::aggregate_json(&serde_json::json!({
        "candidates": ["a", "b", "c"], "validation_success": {"c": 0.2}, "ballots": [], "k": 2
    }))
    .unwrap();
    assert_eq!(fill["filled"], serde_json::json!(["c", "a"]));
    assert!(harness_router::aggregate::aggregate_json(&serde_json::json!({"k": 1})).is_err());
}
