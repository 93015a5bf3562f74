//! Parent selection by joint validation coverage (paper Eq. 3).
//!
//! `P_{g+1} in argmax_{P subset of C_g^valid, 1 <= |P| <= B} |U_{H in P} V(H)|`: at most `B`
//! children whose union of solved validation tasks is largest, each task counted once, so
//! parents that cover one another's failures win over parents that solve the same tasks.
//!
//! The maximisation is maximum coverage, NP-hard in general. For the sizes the paper uses (at
//! most 8 children per round, `B = 4`) [`select_parents`] solves it exactly by branch and bound;
//! past [`EXACT_LIMIT`] subsets it falls back to the greedy algorithm, whose union is at least
//! `(1 - 1/e)` of the optimum (Nemhauser, Wolsey and Fisher, 1978), and states that bound.
//!
//! Ties are broken deterministically, in this order: more covered tasks; fewer parents; higher
//! individual success (the parents' `|V(H)|` sorted from largest, compared element by element);
//! then the parents' ids sorted, compared as lists (smaller first).

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Largest number of candidate subsets (`sum_{k<=B} C(n, k)`) solved exactly.
pub const EXACT_LIMIT: u128 = 2_000_000;

/// `1 - 1/e`, the greedy algorithm's approximation ratio for maximum coverage.
pub const GREEDY_RATIO: f64 = 1.0 - 1.0 / std::f64::consts::E;

/// How a [`Cover`] was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CoverMethod {
    /// Branch and bound: an optimum of Eq. 3 under the tie rules.
    Exact,
    /// Greedy: within `1 - 1/e` of the optimum.
    Greedy,
}

/// The selected parents and what they cover.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Cover {
    /// The parents, in the order the tie rules rank them (most individual success first).
    pub parents: Vec<String>,
    /// `|U V(H)|` over the parents.
    pub covered: usize,
    /// How they were found.
    pub method: CoverMethod,
    /// For a greedy cover, the largest union any selection could reach as far as the
    /// `(1 - 1/e)` guarantee tells: `covered / (1 - 1/e)`, capped by the tasks solved at all.
    /// `None` for an exact cover.
    pub optimum_at_most: Option<usize>,
}

/// A parent-selection instance: the `select_parents` example reads it as
/// `{"b": n, "solved": {id: [task ids]}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CoverInstance {
    /// B, the parent slots.
    pub b: usize,
    /// V(H) of each candidate.
    pub solved: BTreeMap<String, BTreeSet<String>>,
}

impl CoverInstance {
    /// Parse an instance; errors name the field.
    pub fn from_json(text: &str) -> Result<Self> {
        let deserializer = &mut serde_json::Deserializer::from_str(text);
        let instance: CoverInstance =
            serde_path_to_error::deserialize(deserializer).map_err(|e| {
                Error::input(
                    e.path().to_string(),
                    format!(
                        "{}; expected {{\"b\": n, \"solved\": {{id: [task ids]}}}}",
                        e.into_inner()
                    ),
                )
            })?;
        if instance.b == 0 {
            return Err(Error::input("b", "expected at least 1 parent slot"));
        }
        Ok(instance)
    }

    /// Solve it with [`select_parents`].
    pub fn solve(&self) -> Cover {
        select_parents(&self.solved, self.b)
    }
}

/// Candidates as bitsets over the tasks they solve, sorted by the tie order.
struct Prepared<'a> {
    ids: Vec<&'a str>,
    sets: Vec<Vec<u64>>,
    sizes: Vec<usize>,
    universe: usize,
}

fn prepare(solved: &BTreeMap<String, BTreeSet<String>>) -> Prepared<'_> {
    let mut tasks: BTreeMap<&str, usize> = BTreeMap::new();
    for set in solved.values() {
        for t in set {
            let next = tasks.len();
            tasks.entry(t.as_str()).or_insert(next);
        }
    }
    let words = tasks.len().div_ceil(64).max(1);
    let mut entries: Vec<(&str, Vec<u64>, usize)> = solved
        .iter()
        .map(|(id, set)| {
            let mut bits = vec![0u64; words];
            for t in set {
                let i = tasks[t.as_str()];
                bits[i / 64] |= 1 << (i % 64);
            }
            (id.as_str(), bits, set.len())
        })
        .collect();
    // Larger sets first (tighter bounds early), then ids.
    entries.sort_by(|a, b| b.2.cmp(&a.2).then_with(|| a.0.cmp(b.0)));
    Prepared {
        ids: entries.iter().map(|e| e.0).collect(),
        sizes: entries.iter().map(|e| e.2).collect(),
        sets: entries.into_iter().map(|e| e.1).collect(),
        universe: tasks.len(),
    }
}

fn count(bits: &[u64]) -> usize {
    bits.iter().map(|w| w.count_ones() as usize).sum()
}

fn union_into(acc: &mut [u64], other: &[u64]) {
    for (a, b) in acc.iter_mut().zip(other) {
        *a |= b;
    }
}

fn gain(acc: &[u64], other: &[u64]) -> usize {
    acc.iter()
        .zip(other)
        .map(|(a, b)| (b & !a).count_ones() as usize)
        .sum()
}

/// The tie order of Eq. 3's argmax: `Greater` means `a` is the better selection.
pub fn compare_selections(
    a: (&[&str], usize, &[usize]),
    b: (&[&str], usize, &[usize]),
) -> Ordering {
    let (ids_a, covered_a, sizes_a) = a;
    let (ids_b, covered_b, sizes_b) = b;
    let sorted_desc = |s: &[usize]| {
        let mut v = s.to_vec();
        v.sort_unstable_by(|x, y| y.cmp(x));
        v
    };
    let sorted_ids = |s: &[&str]| {
        let mut v: Vec<String> = s.iter().map(|x| x.to_string()).collect();
        v.sort();
        v
    };
    covered_a
        .cmp(&covered_b)
        .then_with(|| ids_b.len().cmp(&ids_a.len()))
        .then_with(|| sorted_desc(sizes_a).cmp(&sorted_desc(sizes_b)))
        .then_with(|| sorted_ids(ids_b).cmp(&sorted_ids(ids_a)))
}

fn subsets_up_to(n: usize, b: usize) -> u128 {
    let mut total: u128 = 0;
    let mut c: u128 = 1;
    for k in 1..=b.min(n) {
        c = c * (n - k + 1) as u128 / k as u128;
        total = total.saturating_add(c);
    }
    total
}

/// Select at most `b` parents maximising joint coverage (Eq. 3): exact when the instance has at
/// most [`EXACT_LIMIT`] candidate subsets, greedy with the `(1 - 1/e)` bound otherwise. With no
/// candidates the selection is empty; with `b = 0` too.
pub fn select_parents(solved: &BTreeMap<String, BTreeSet<String>>, b: usize) -> Cover {
    if subsets_up_to(solved.len(), b) <= EXACT_LIMIT {
        select_exact(solved, b)
    } else {
        select_greedy(solved, b)
    }
}

struct Best {
    chosen: Vec<usize>,
    covered: usize,
}

fn finish(p: &Prepared<'_>, chosen: &[usize], covered: usize, method: CoverMethod) -> Cover {
    let mut order: Vec<usize> = chosen.to_vec();
    order.sort_by(|&x, &y| {
        p.sizes[y]
            .cmp(&p.sizes[x])
            .then_with(|| p.ids[x].cmp(p.ids[y]))
    });
    let optimum_at_most = match method {
        CoverMethod::Exact => None,
        CoverMethod::Greedy => {
            Some(((covered as f64 / GREEDY_RATIO).floor() as usize).min(p.universe))
        }
    };
    Cover {
        parents: order.iter().map(|&i| p.ids[i].to_string()).collect(),
        covered,
        method,
        optimum_at_most,
    }
}

/// Exact branch and bound over subsets of size 1 to `b`, with the tie rules of the module docs.
pub fn select_exact(solved: &BTreeMap<String, BTreeSet<String>>, b: usize) -> Cover {
    let p = prepare(solved);
    let n = p.ids.len();
    if n == 0 || b == 0 {
        return finish(&p, &[], 0, CoverMethod::Exact);
    }
    let mut best = Best {
        chosen: vec![0],
        covered: p.sizes[0],
    };
    let words = p.sets[0].len();
    let mut chosen = Vec::with_capacity(b);
    search(&p, b, 0, &mut chosen, &vec![0u64; words], &mut best);
    finish(&p, &best.chosen, best.covered, CoverMethod::Exact)
}

fn better(p: &Prepared<'_>, a: &[usize], covered_a: usize, best: &Best) -> bool {
    let ids = |s: &[usize]| s.iter().map(|&i| p.ids[i]).collect::<Vec<&str>>();
    let sizes = |s: &[usize]| s.iter().map(|&i| p.sizes[i]).collect::<Vec<usize>>();
    compare_selections(
        (&ids(a), covered_a, &sizes(a)),
        (&ids(&best.chosen), best.covered, &sizes(&best.chosen)),
    ) == Ordering::Greater
}

fn search(
    p: &Prepared<'_>,
    b: usize,
    start: usize,
    chosen: &mut Vec<usize>,
    union: &[u64],
    best: &mut Best,
) {
    let covered = count(union);
    if !chosen.is_empty() && better(p, chosen, covered, best) {
        best.chosen = chosen.clone();
        best.covered = covered;
    }
    let slots = b - chosen.len();
    if slots == 0 || start >= p.ids.len() {
        return;
    }
    // Upper bound: the current union plus the `slots` largest marginal gains left. A branch
    // that cannot reach the best coverage cannot win (coverage is the first tie rule).
    let mut gains: Vec<usize> = (start..p.ids.len())
        .map(|i| gain(union, &p.sets[i]))
        .collect();
    gains.sort_unstable_by(|x, y| y.cmp(x));
    let bound = covered + gains.iter().take(slots).sum::<usize>();
    if bound < best.covered {
        return;
    }
    for i in start..p.ids.len() {
        let mut next = union.to_vec();
        union_into(&mut next, &p.sets[i]);
        chosen.push(i);
        search(p, b, i + 1, chosen, &next, best);
        chosen.pop();
    }
}

/// Greedy maximum coverage: repeatedly add the candidate with the largest marginal gain (ties:
/// larger `|V(H)|`, then smaller id) until `b` parents are chosen or nothing adds a task. Its
/// union is at least `(1 - 1/e)` of the optimum; [`Cover::optimum_at_most`] states the bound.
pub fn select_greedy(solved: &BTreeMap<String, BTreeSet<String>>, b: usize) -> Cover {
    let p = prepare(solved);
    let n = p.ids.len();
    if n == 0 || b == 0 {
        return finish(&p, &[], 0, CoverMethod::Greedy);
    }
    let mut union = vec![0u64; p.sets[0].len()];
    let mut chosen: Vec<usize> = Vec::new();
    while chosen.len() < b {
        // `prepare` sorted by size then id, so the first maximum is the tie winner.
        let pick = (0..n)
            .filter(|i| !chosen.contains(i))
            .map(|i| (gain(&union, &p.sets[i]), i))
            .fold(None::<(usize, usize)>, |acc, (g, i)| match acc {
                Some((bg, _)) if bg >= g => acc,
                _ => Some((g, i)),
            });
        match pick {
            Some((g, i)) if g > 0 || chosen.is_empty() => {
                union_into(&mut union, &p.sets[i]);
                chosen.push(i);
            }
            _ => break,
        }
    }
    let covered = count(&union);
    finish(&p, &chosen, covered, CoverMethod::Greedy)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn instance(pairs: &[(&str, &[&str])]) -> BTreeMap<String, BTreeSet<String>> {
        pairs
            .iter()
            .map(|(id, tasks)| {
                (
                    id.to_string(),
                    tasks.iter().map(|t| t.to_string()).collect(),
                )
            })
            .collect()
    }

    #[test]
    fn complementary_parents_beat_the_best_individuals() {
        // A and B are individually best but overlap; C and D are complementary.
        let solved = instance(&[
            ("A", &["1", "2", "3", "4"]),
            ("B", &["1", "2", "3", "5"]),
            ("C", &["1", "2", "6"]),
            ("D", &["4", "5", "7"]),
        ]);
        let cover = select_exact(&solved, 2);
        assert_eq!(cover.covered, 6);
        assert_eq!(cover.parents, vec!["A", "D"]);
        let greedy = select_greedy(&solved, 2);
        assert!(greedy.covered <= cover.covered);
        assert!(greedy.optimum_at_most.unwrap() >= cover.covered);
    }

    #[test]
    fn ties_prefer_fewer_parents_then_success_then_id() {
        // {X} covers everything alone: adding Y changes nothing, so one parent wins.
        let solved = instance(&[("X", &["1", "2"]), ("Y", &["1"])]);
        assert_eq!(select_exact(&solved, 4).parents, vec!["X"]);
        // Equal coverage and size: the smaller id wins.
        let solved = instance(&[("b", &["1"]), ("a", &["1"])]);
        assert_eq!(select_exact(&solved, 2).parents, vec!["a"]);
        // Nothing solved: one parent still (|P| >= 1), the smallest id.
        let solved = instance(&[("z", &[]), ("m", &[])]);
        let cover = select_exact(&solved, 3);
        assert_eq!((cover.parents, cover.covered), (vec!["m".to_string()], 0));
    }

    #[test]
    fn large_instances_fall_back_to_greedy_with_the_bound() {
        let solved: BTreeMap<String, BTreeSet<String>> = (0..200)
            .map(|i| {
                let tasks = (0..5)
                    .map(|k| format!("t{}", (i * 7 + k * 13) % 150))
                    .collect();
                (format!("h{i:03}"), tasks)
            })
            .collect();
        let cover = select_parents(&solved, 8);
        assert_eq!(cover.method, CoverMethod::Greedy);
        assert!(cover.parents.len() <= 8);
        let bound = cover.optimum_at_most.unwrap();
        assert!(bound as f64 * GREEDY_RATIO <= cover.covered as f64 + 1.0);
    }

    #[test]
    fn instance_json_errors_name_the_field() {
        let err = CoverInstance::from_json(r#"{"b": 2, "solved": {"a": [1]}}"#).unwrap_err();
        assert!(err.to_string().contains("solved.a"), "{err}");
        let err = CoverInstance::from_json(r#"{"b": 0, "solved": {}}"#).unwrap_err();
        assert!(err.to_string().contains('b'), "{err}");
    }
}
