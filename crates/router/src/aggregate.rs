//! Vote aggregation (paper Eq. 9) and the Top-K selections of rescue (Eq. 10) and inference
//! (Eq. 12).
//!
//! q_s(H | x) = sum over voters v of omega(rank_v(H | x)), with omega = 1, 3/4, 1/2, 1/4 for
//! ranks 1-4 and 0 for unlisted candidates ("Inference voting"). Ties are broken by validation
//! success, then by harness id. Rescue takes the Top-K of the pool without H0; inference ranks the
//! full pool with H0. When fewer than K candidates received any vote, the rest are filled by
//! validation success, then id, and the filled ids are reported.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use harness_core::HarnessId;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// omega of Eq. 9: the weight of each rank, best first; ranks past the end weigh 0.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct RankWeights(pub Vec<f64>);

impl Default for RankWeights {
    /// The paper's weights ("Inference voting": "weights 1, 3/4, 1/2, and 1/4").
    fn default() -> Self {
        RankWeights(vec![1.0, 0.75, 0.5, 0.25])
    }
}

impl RankWeights {
    /// The weight of a 0-based rank.
    pub fn weight(&self, rank: usize) -> f64 {
        self.0.get(rank).copied().unwrap_or(0.0)
    }

    /// Weights must be finite, non-negative and non-increasing (omega "decreases with rank").
    pub fn validate(&self) -> Result<()> {
        if self.0.is_empty() {
            return Err(Error::setting(
                "weights",
                "expected at least one rank weight",
            ));
        }
        for (i, w) in self.0.iter().enumerate() {
            if !w.is_finite() || *w < 0.0 {
                return Err(Error::setting(
                    format!("weights[{i}]"),
                    format!("{w} is not a finite non-negative number"),
                ));
            }
            if i > 0 && *w > self.0[i - 1] {
                return Err(Error::setting(
                    format!("weights[{i}]"),
                    format!(
                        "{w} is larger than the weight of the rank before ({}); expected non-increasing weights",
                        self.0[i - 1]
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// One candidate's aggregated score.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Scored {
    /// The harness.
    pub id: HarnessId,
    /// q(H | x), Eq. 9.
    pub score: f64,
    /// Ballots that listed it.
    pub votes: usize,
}

/// Sum the rank weights of valid ballots over `candidates` (Eq. 9) and sort best first: by
/// score, then validation success (missing counts as 0), then id. Ballot ids outside
/// `candidates` are ignored (ballots are checked before they get here).
pub fn aggregate(
    candidates: &[HarnessId],
    validation_success: &BTreeMap<HarnessId, f64>,
    ballots: &[Vec<HarnessId>],
    weights: &RankWeights,
) -> Vec<Scored> {
    let mut scores: BTreeMap<&HarnessId, (f64, usize)> =
        candidates.iter().map(|c| (c, (0.0, 0))).collect();
    for ballot in ballots {
        for (rank, id) in ballot.iter().enumerate() {
            if let Some(entry) = scores.get_mut(id) {
                entry.0 += weights.weight(rank);
                entry.1 += 1;
            }
        }
    }
    let mut out: Vec<Scored> = scores
        .into_iter()
        .map(|(id, (score, votes))| Scored {
            id: id.clone(),
            score,
            votes,
        })
        .collect();
    let success = |id: &HarnessId| validation_success.get(id).copied().unwrap_or(0.0);
    out.sort_by(|a, b| {
        b.score
            .partial_cmp(&a.score)
            .unwrap_or(Ordering::Equal)
            .then_with(|| {
                success(&b.id)
                    .partial_cmp(&success(&a.id))
                    .unwrap_or(Ordering::Equal)
            })
            .then_with(|| a.id.cmp(&b.id))
    });
    out
}

/// The harnesses chosen for a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Selection {
    /// K distinct ids, best first.
    pub ids: Vec<HarnessId>,
    /// The selected ids that received no vote and were filled by validation success, then id.
    pub filled: Vec<HarnessId>,
    /// The ranking the selection was cut from.
    pub ranking: Vec<Scored>,
}

/// The Top-K of a ranking, excluding `excluded` (H0 in rescue, Eq. 10; `None` in inference,
/// Eq. 12). The ranking already orders unvoted candidates by validation success, then id, so
/// the fill is the unvoted tail of the Top-K.
pub fn top_k(ranking: Vec<Scored>, k: usize, excluded: Option<&HarnessId>) -> Result<Selection> {
    let ranking: Vec<Scored> = ranking
        .into_iter()
        .filter(|s| Some(&s.id) != excluded)
        .collect();
    let distinct: BTreeSet<&HarnessId> = ranking.iter().map(|s| &s.id).collect();
    if k == 0 {
        return Err(Error::Selection(
            "k is 0; expected at least 1 harness".into(),
        ));
    }
    if distinct.len() < k {
        return Err(Error::Selection(format!(
            "asked for {k} distinct harnesses but only {} candidates are eligible{}",
            distinct.len(),
            if excluded.is_some() {
                " (the base harness is excluded in rescue)"
            } else {
                ""
            }
        )));
    }
    let chosen = &ranking[..k];
    Ok(Selection {
        ids: chosen.iter().map(|s| s.id.clone()).collect(),
        filled: chosen
            .iter()
            .filter(|s| s.votes == 0)
            .map(|s| s.id.clone())
            .collect(),
        ranking,
    })
}

/// The `aggregate_ballots` example's computation, as a function of its JSON input
/// `{"candidates": [ids], "validation_success": {id: rate}, "ballots": [[id, ...], ...], "k": n}`:
/// returns `{"ranking": [{"id", "score"}, ...], "dropped_ballots": n, "filled": [ids]}`, the
/// Top-`k` best first. A ballot is dropped (and counted) unless it lists exactly
/// [`crate::BALLOT_LEN`] distinct candidates (every candidate when there are fewer); no
/// harness is excluded (the input names no H0).
pub fn aggregate_json(input: &serde_json::Value) -> Result<serde_json::Value> {
    use serde_json::{Value, json};
    let field = |name: &str, expected: &str| Error::setting(name, format!("expected {expected}"));
    let candidates: Vec<HarnessId> = serde_json::from_value(input["candidates"].clone())
        .map_err(|_| field("candidates", "an array of harness ids"))?;
    let validation_success: BTreeMap<HarnessId, f64> = match input.get("validation_success") {
        None | Some(Value::Null) => BTreeMap::new(),
        Some(v) => serde_json::from_value(v.clone())
            .map_err(|_| field("validation_success", "an object of id -> rate"))?,
    };
    let k = input["k"]
        .as_u64()
        .ok_or_else(|| field("k", "a positive integer"))? as usize;
    let raw = input["ballots"]
        .as_array()
        .ok_or_else(|| field("ballots", "an array of ballots"))?;
    let rules = crate::ballot::BallotRules {
        candidates: &candidates,
        excluded_base: None,
        len: crate::ballot::BallotRules::len_for(candidates.len(), crate::ballot::BALLOT_LEN),
    };
    let mut ballots = Vec::new();
    let mut dropped = 0usize;
    for (i, ballot) in raw.iter().enumerate() {
        let checked = serde_json::from_value::<Vec<String>>(ballot.clone())
            .map_err(|_| "not an array of ids".to_string())
            .and_then(|b| rules.check(&b).map_err(|e| e.to_string()));
        match checked {
            Ok(b) => ballots.push(b),
            Err(e) => {
                dropped += 1;
                tracing::warn!(ballot = i, error = %e, "malformed ballot dropped");
            }
        }
    }
    let ranking = aggregate(
        &candidates,
        &validation_success,
        &ballots,
        &RankWeights::default(),
    );
    let selection = top_k(ranking, k, None)?;
    let score = |id: &HarnessId| {
        selection
            .ranking
            .iter()
            .find(|s| &s.id == id)
            .map_or(0.0, |s| s.score)
    };
    Ok(json!({
        "ranking": selection.ids.iter().map(|id| json!({"id": id, "score": score(id)})).collect::<Vec<_>>(),
        "dropped_ballots": dropped,
        "filled": selection.filled,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> HarnessId {
        HarnessId(s.into())
    }

    #[test]
    fn paper_weights_and_validation() {
        let w = RankWeights::default();
        assert_eq!(
            (0..5).map(|r| w.weight(r)).collect::<Vec<_>>(),
            [1.0, 0.75, 0.5, 0.25, 0.0]
        );
        assert!(w.validate().is_ok());
        assert!(RankWeights(vec![0.5, 1.0]).validate().is_err());
        assert!(RankWeights(vec![f64::NAN]).validate().is_err());
        assert!(RankWeights(vec![]).validate().is_err());
    }

    #[test]
    fn top_k_refuses_zero_and_too_few() {
        let ranking = aggregate(
            &[id("a"), id("b")],
            &BTreeMap::new(),
            &[],
            &RankWeights::default(),
        );
        assert!(top_k(ranking.clone(), 0, None).is_err());
        assert!(top_k(ranking.clone(), 2, Some(&id("a"))).is_err());
        let s = top_k(ranking, 1, Some(&id("a"))).unwrap();
        assert_eq!(s.ids, vec![id("b")]);
        assert_eq!(s.filled, vec![id("b")]);
    }
}
