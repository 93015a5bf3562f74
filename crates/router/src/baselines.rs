//! The paper's routing baselines (Table 2, "Rescue allocation variants"): Rule Router ranks
//! pool members by success on similar validation tasks, without profiles. Top-8 with fixed
//! profiles is the [`crate::AdaptiveRouter`] with a calibrator in
//! [`crate::ReanchorMode::Fixed`]. Random Harness, which needs no evidence, is harness-rollout's
//! `RandomSelector`.

use std::cmp::Ordering;

use async_trait::async_trait;
use harness_core::{HarnessId, HarnessSelector, SelectionRequest};

use crate::error::Error;
use crate::router::EvidenceCell;

fn eligible_error(k: usize, n: usize) -> harness_core::Error {
    Error::Selection(format!(
        "asked for {k} distinct harnesses but only {n} candidates are eligible"
    ))
    .into()
}

/// Rule Router (w/o Profile): ranks candidates by their similarity-weighted success on the
/// most similar validation tasks, then validation success, then id. Reads the same evidence
/// cell as the adaptive router (so it is re-anchored by the same calibrator) but never its
/// profiles.
#[derive(Debug, Clone)]
pub struct RuleRouter {
    evidence: EvidenceCell,
    similar_tasks: usize,
}

impl RuleRouter {
    /// A rule router over `evidence`, looking at `similar_tasks` neighbours (at least 1).
    pub fn new(evidence: EvidenceCell, similar_tasks: usize) -> Self {
        RuleRouter {
            evidence,
            similar_tasks: similar_tasks.max(1),
        }
    }

    /// Every eligible candidate with its similar-task success, best first.
    pub fn rank(&self, request: &SelectionRequest) -> crate::Result<Vec<(HarnessId, f64)>> {
        let evidence = self.evidence.require()?;
        let similar = evidence.similar(&request.task, self.similar_tasks);
        let cal = &evidence.calibration;
        let mut ranked: Vec<(HarnessId, f64, f64)> = evidence
            .candidates(request.mode)
            .into_iter()
            .map(|c| {
                let (mut num, mut den) = (0.0, 0.0);
                for s in &similar {
                    if let Some(r) = s.success.get(&c.id) {
                        num += s.similarity * r;
                        den += s.similarity;
                    }
                }
                let score = if den > 0.0 {
                    num / den
                } else {
                    c.validation_success
                };
                let overall = cal.success(&c.id);
                (c.id, score, overall)
            })
            .collect();
        ranked.sort_by(|a, b| {
            b.1.partial_cmp(&a.1)
                .unwrap_or(Ordering::Equal)
                .then_with(|| b.2.partial_cmp(&a.2).unwrap_or(Ordering::Equal))
                .then_with(|| a.0.cmp(&b.0))
        });
        Ok(ranked.into_iter().map(|(id, s, _)| (id, s)).collect())
    }
}

#[async_trait]
impl HarnessSelector for RuleRouter {
    fn name(&self) -> &str {
        "rule-router"
    }

    async fn select(&self, request: &SelectionRequest) -> harness_core::Result<Vec<HarnessId>> {
        let ranked = self.rank(request)?;
        if request.k == 0 || ranked.len() < request.k {
            return Err(eligible_error(request.k, ranked.len()));
        }
        Ok(ranked
            .into_iter()
            .take(request.k)
            .map(|(id, _)| id)
            .collect())
    }
}
