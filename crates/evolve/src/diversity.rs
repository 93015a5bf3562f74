//! The paper's diversity views of a pool ("Sibling Harness Diversity" and Figure 1): repaired
//! and regressed tasks per sibling against H0 (Figure 1a), individual success against the
//! oracle union of one rollout per sibling and H0's pass@K at the same rollout count
//! (Figure 1b), and the directed overlap `|R_i n R_j| / |R_i|` of the siblings' repairs of H0
//! failures (Figure 5).

use std::collections::{BTreeMap, BTreeSet};

use harness_core::{HarnessId, SamplingParams, Task};
use harness_pool::SiblingPool;
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::exec::Executor;

/// One sibling's figures against H0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SiblingFigures {
    /// Its id.
    pub id: HarnessId,
    /// Its name.
    pub name: String,
    /// Validation tasks solved.
    pub solved: usize,
    /// Solved / tasks.
    pub success_rate: f64,
    /// R_i: H0 failures it solves (Figure 1a, "repaired").
    pub repaired: Vec<String>,
    /// H0 successes it fails (Figure 1a, "regressed").
    pub regressed: Vec<String>,
    /// Repaired minus regressed (Figure 1a's "Delta Solved").
    pub delta_solved: i64,
}

/// Figure 1b's three kinds of bar.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Coverage {
    /// K: siblings, and so rollouts per task, compared.
    pub k: usize,
    /// Tasks solved by at least one sibling's single rollout (oracle coverage).
    pub oracle_union: usize,
    /// Tasks solved by at least one of K rollouts of H0 (pass@K), when measured.
    pub h0_pass_at_k: Option<usize>,
    /// H0's single-rollout solved count.
    pub h0_solved: usize,
}

/// Every view, as JSON-ready data.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DiversityReport {
    /// Validation tasks compared.
    pub tasks: usize,
    /// H0's id.
    pub h0: HarnessId,
    /// Per sibling (Figure 1a and the bars of Figure 1b).
    pub siblings: Vec<SiblingFigures>,
    /// Figure 1b's union and pass@K.
    pub coverage: Coverage,
    /// Figure 5: `overlap[i][j] = |R_i n R_j| / |R_i|` for `i != j` (`None` on the diagonal and
    /// for rows whose sibling repairs nothing).
    pub overlap: Vec<Vec<Option<f64>>>,
    /// The mean over distinct ordered pairs with a defined value (the paper reports 62.47%).
    pub mean_overlap: Option<f64>,
    /// `|U R_i|`: H0 failures some sibling repairs (the paper: 29 for nine siblings).
    pub union_repaired: usize,
}

/// Compute the views from solved sets: `h0` and each sibling's `(id, name, V(H))` on `tasks`
/// validation tasks, and optionally H0's pass@K count.
pub fn diversity(
    h0: (&HarnessId, &BTreeSet<String>),
    siblings: &[(HarnessId, String, BTreeSet<String>)],
    tasks: usize,
    h0_pass_at_k: Option<usize>,
) -> DiversityReport {
    let (h0_id, h0_solved) = h0;
    let rate = |n: usize| {
        if tasks == 0 {
            0.0
        } else {
            n as f64 / tasks as f64
        }
    };
    let figures: Vec<SiblingFigures> = siblings
        .iter()
        .map(|(id, name, solved)| {
            let repaired: Vec<String> = solved.difference(h0_solved).cloned().collect();
            let regressed: Vec<String> = h0_solved.difference(solved).cloned().collect();
            SiblingFigures {
                id: id.clone(),
                name: name.clone(),
                solved: solved.len(),
                success_rate: rate(solved.len()),
                delta_solved: repaired.len() as i64 - regressed.len() as i64,
                repaired,
                regressed,
            }
        })
        .collect();
    let repair_sets: Vec<BTreeSet<String>> = figures
        .iter()
        .map(|f| f.repaired.iter().cloned().collect())
        .collect();
    let n = figures.len();
    let mut overlap = vec![vec![None; n]; n];
    let mut values = Vec::new();
    for i in 0..n {
        for j in 0..n {
            if i == j || repair_sets[i].is_empty() {
                continue;
            }
            let shared = repair_sets[i].intersection(&repair_sets[j]).count();
            let v = shared as f64 / repair_sets[i].len() as f64;
            overlap[i][j] = Some(v);
            values.push(v);
        }
    }
    let union: BTreeSet<&String> = siblings.iter().flat_map(|(_, _, s)| s.iter()).collect();
    let union_repaired: BTreeSet<&String> = repair_sets.iter().flatten().collect();
    DiversityReport {
        tasks,
        h0: h0_id.clone(),
        coverage: Coverage {
            k: n,
            oracle_union: union.len(),
            h0_pass_at_k,
            h0_solved: h0_solved.len(),
        },
        siblings: figures,
        mean_overlap: (!values.is_empty())
            .then(|| values.iter().sum::<f64>() / values.len() as f64),
        overlap,
        union_repaired: union_repaired.len(),
    }
}

/// Measure the views for a pool: the siblings' solved sets come from `solved` (one greedy
/// rollout each, as the evolution's validation runs made them); H0's pass@K runs K fresh
/// rollouts of H0 with `h0_sampling` (temperature sampling, so they can differ), K being the
/// number of siblings: the same executor rollout count as the oracle union.
pub async fn measure(
    executor: &Executor,
    pool: &SiblingPool,
    solved: &BTreeMap<HarnessId, BTreeSet<String>>,
    validation: &[Task],
    stage_seed: u64,
    h0_sampling: &SamplingParams,
) -> Result<DiversityReport> {
    let empty = BTreeSet::new();
    let h0_id = pool.base_id().clone();
    let h0_solved = solved.get(&h0_id).unwrap_or(&empty);
    let siblings: Vec<(HarnessId, String, BTreeSet<String>)> = pool
        .auxiliaries()
        .map(|h| {
            (
                h.id(),
                h.name.clone(),
                solved.get(&h.id()).cloned().unwrap_or_default(),
            )
        })
        .collect();
    let k = siblings.len();
    let mut any: BTreeSet<String> = BTreeSet::new();
    for r in 0..k {
        let seed = harness_core::call_seed(stage_seed, 0x1b00 + r as u32);
        let runs = executor
            .run_with(pool.base(), validation, seed, h0_sampling)
            .await?;
        any.extend(
            runs.iter()
                .filter(|t| t.is_success())
                .map(|t| t.task_id.clone()),
        );
    }
    let pass_at_k = (k > 0).then_some(any.len());
    Ok(diversity(
        (&h0_id, h0_solved),
        &siblings,
        validation.len(),
        pass_at_k,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(ids: &[&str]) -> BTreeSet<String> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn figures_follow_their_definitions() {
        let h0 = HarnessId("h0".into());
        let h0_solved = set(&["a", "b"]);
        let siblings = vec![
            (HarnessId("s1".into()), "S1".into(), set(&["a", "c", "d"])),
            (HarnessId("s2".into()), "S2".into(), set(&["a", "b", "c"])),
            (HarnessId("s3".into()), "S3".into(), set(&["b"])),
        ];
        let report = diversity((&h0, &h0_solved), &siblings, 5, Some(2));
        // Figure 1a.
        assert_eq!(report.siblings[0].repaired, vec!["c", "d"]);
        assert_eq!(report.siblings[0].regressed, vec!["b"]);
        assert_eq!(report.siblings[0].delta_solved, 1);
        assert_eq!(report.siblings[2].delta_solved, -1);
        // Figure 1b.
        assert_eq!(report.coverage.oracle_union, 4);
        assert_eq!(report.coverage.h0_pass_at_k, Some(2));
        assert!((report.siblings[1].success_rate - 0.6).abs() < 1e-12);
        // Figure 5: directed, row-normalised; S3 repairs nothing, so its row is empty.
        assert_eq!(report.overlap[0][1], Some(0.5));
        assert_eq!(report.overlap[1][0], Some(1.0));
        assert_eq!(report.overlap[0][0], None);
        assert_eq!(report.overlap[2][0], None);
        assert_eq!(report.overlap[0][2], Some(0.0));
        assert_eq!(report.union_repaired, 2);
        let mean = report.mean_overlap.unwrap();
        assert!((mean - (0.5 + 0.0 + 1.0 + 0.0) / 4.0).abs() < 1e-12);
    }
}
