//! Parent selection (Eq. 3): the exact search equals brute force on random small instances and
//! is never worse than greedy.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use harness_evolve::cover::{select_exact, select_greedy, select_parents};
use proptest::prelude::*;

type Instance = BTreeMap<String, BTreeSet<String>>;

/// Every subset of size 1..=b, ranked by the documented tie rules written out here on their own
/// (not the implementation's comparator): most tasks covered, then fewer parents, then higher
/// individual success (sizes compared largest first), then the smallest ids.
fn brute_force(solved: &Instance, b: usize) -> (Vec<String>, usize) {
    let ids: Vec<&String> = solved.keys().collect();
    let n = ids.len();
    let mut best: Option<(BruteKey, Vec<String>, usize)> = None;
    for mask in 1u32..(1 << n) {
        if mask.count_ones() as usize > b {
            continue;
        }
        let mut chosen: Vec<String> = (0..n)
            .filter(|i| mask & (1 << i) != 0)
            .map(|i| ids[i].clone())
            .collect();
        chosen.sort();
        let union: BTreeSet<&String> = chosen.iter().flat_map(|id| solved[id].iter()).collect();
        let mut sizes: Vec<usize> = chosen.iter().map(|id| solved[id].len()).collect();
        sizes.sort_unstable_by(|x, y| y.cmp(x));
        let key = (
            union.len(),
            Reverse(chosen.len()),
            sizes,
            Reverse(chosen.clone()),
        );
        if best.as_ref().is_none_or(|(k, _, _)| key > *k) {
            best = Some((key, chosen, union.len()));
        }
    }
    best.map(|(_, ids, covered)| (ids, covered))
        .unwrap_or((Vec::new(), 0))
}

/// The ranking key of one selection in [`brute_force`]; larger is better.
type BruteKey = (usize, Reverse<usize>, Vec<usize>, Reverse<Vec<String>>);

fn instances() -> impl Strategy<Value = (Instance, usize)> {
    (1usize..=9, 1usize..=5).prop_flat_map(|(n, b)| {
        (
            proptest::collection::vec(proptest::collection::btree_set(0u8..14, 0..8), n).prop_map(
                |sets| {
                    sets.into_iter()
                        .enumerate()
                        .map(|(i, s)| {
                            (
                                format!("h{i}"),
                                s.into_iter().map(|t| format!("t{t}")).collect(),
                            )
                        })
                        .collect()
                },
            ),
            Just(b),
        )
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn exact_equals_brute_force_and_beats_greedy((solved, b) in instances()) {
        let exact = select_exact(&solved, b);
        let (mut parents, covered) = (exact.parents.clone(), exact.covered);
        parents.sort();
        prop_assert_eq!((parents, covered), brute_force(&solved, b));
        let greedy = select_greedy(&solved, b);
        prop_assert!(greedy.covered <= exact.covered);
        prop_assert!(greedy.parents.len() <= b);
        prop_assert!(greedy.optimum_at_most.unwrap() >= exact.covered);
        // Paper-sized instances take the exact path.
        prop_assert_eq!(select_parents(&solved, b), exact);
    }
}
