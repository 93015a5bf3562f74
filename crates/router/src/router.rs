//! The Adaptive Harness Router: voters' ballots on the current calibration's evidence,
//! aggregated by Eq. 9, cut to the Top-K of the pool without H0 for rescue (Eq. 10) or ranked
//! over the full pool with H0 for inference (Eq. 12).
//!
//! The evidence lives in an [`EvidenceCell`] that the calibrator (`crate::reanchor`) replaces
//! at every re-anchoring; a selection reads the latest one, so routing uses "the latest
//! profiles between checkpoints".

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use async_trait::async_trait;
use harness_core::{
    HarnessId, HarnessSelector, SelectionMode, SelectionRequest, Task, Usage, call_seed,
};
use serde::{Deserialize, Serialize};

use crate::aggregate::{RankWeights, Selection, aggregate, top_k};
use crate::ballot::{BALLOT_LEN, BallotError, BallotRules};
use crate::calibration::Calibration;
use crate::error::{Error, Result};
use crate::similar::SimilarIndex;
use crate::vote::{Candidate, SimilarOutcome, VoteRequest, Voter};

/// A calibration with its similarity index over the calibration's validation tasks.
#[derive(Debug)]
pub struct Evidence {
    /// The calibration.
    pub calibration: Calibration,
    /// BM25 over its tasks.
    pub index: SimilarIndex,
}

impl Evidence {
    /// Index a (validated) calibration.
    pub fn new(calibration: Calibration) -> Result<Self> {
        calibration.validate()?;
        let index = SimilarIndex::build(&calibration.tasks, calibration.features)?;
        Ok(Evidence { calibration, index })
    }

    /// The `n` validation tasks most similar to `task`, with every member's success on each.
    pub fn similar(&self, task: &Task, n: usize) -> Vec<SimilarOutcome> {
        let by_id: BTreeMap<&str, &Task> = self
            .calibration
            .tasks
            .iter()
            .map(|t| (t.id.as_str(), t))
            .collect();
        self.index
            .similar(task, n)
            .into_iter()
            .map(|nb| SimilarOutcome {
                instruction: by_id
                    .get(nb.task_id.as_str())
                    .map(|t| t.instruction.clone())
                    .unwrap_or_default(),
                success: self
                    .calibration
                    .outcomes
                    .get(&nb.task_id)
                    .map(|row| row.iter().map(|(id, o)| (id.clone(), o.rate())).collect())
                    .unwrap_or_default(),
                task_id: nb.task_id,
                similarity: nb.similarity,
            })
            .collect()
    }

    /// The eligible candidates of a mode, in member order (H0 first in inference).
    pub fn candidates(&self, mode: SelectionMode) -> Vec<Candidate> {
        let cal = &self.calibration;
        cal.members
            .iter()
            .filter(|m| mode == SelectionMode::Inference || m.id != cal.base)
            .map(|m| Candidate {
                id: m.id.clone(),
                name: m.name.clone(),
                description: m.description.clone(),
                is_base: m.id == cal.base,
                validation_success: cal.success(&m.id),
                profile: cal.profiles.get(&m.id).cloned(),
            })
            .collect()
    }
}

/// The router's current evidence, shared between the router (reads) and the calibrator
/// (replaces it at each re-anchoring). Clones share the same cell.
#[derive(Debug, Clone, Default)]
pub struct EvidenceCell {
    inner: Arc<RwLock<Option<Arc<Evidence>>>>,
}

impl EvidenceCell {
    /// An empty cell.
    pub fn new() -> Self {
        Self::default()
    }

    /// The latest evidence.
    pub fn get(&self) -> Option<Arc<Evidence>> {
        self.inner.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The latest evidence, or [`Error::NotCalibrated`].
    pub fn require(&self) -> Result<Arc<Evidence>> {
        self.get().ok_or(Error::NotCalibrated)
    }

    /// Replace the evidence with a new calibration (validated and indexed first, so a bad
    /// calibration never replaces a good one).
    pub fn set(&self, calibration: Calibration) -> Result<()> {
        let evidence = Arc::new(Evidence::new(calibration)?);
        *self.inner.write().unwrap_or_else(|p| p.into_inner()) = Some(evidence);
        Ok(())
    }
}

/// Settings of the adaptive router.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouterSettings {
    /// omega of Eq. 9 (the paper's 1, 3/4, 1/2, 1/4 by default).
    pub weights: RankWeights,
    /// Ids per ballot (the paper's 4; fewer when fewer candidates are eligible).
    pub ballot_len: usize,
    /// Requests per voter and task, retries of malformed ballots included.
    pub ballot_attempts: u32,
    /// Similar validation tasks shown to voters.
    pub similar_tasks: usize,
}

impl Default for RouterSettings {
    fn default() -> Self {
        RouterSettings {
            weights: RankWeights::default(),
            ballot_len: BALLOT_LEN,
            ballot_attempts: 3,
            similar_tasks: 5,
        }
    }
}

impl RouterSettings {
    /// Check ranges.
    pub fn validate(&self) -> Result<()> {
        self.weights.validate()?;
        if self.ballot_len == 0 {
            return Err(Error::setting("ballot_len", "expected at least 1"));
        }
        if self.ballot_attempts == 0 {
            return Err(Error::setting("ballot_attempts", "expected at least 1"));
        }
        Ok(())
    }
}

/// Counters of a router since it was built.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouterStats {
    /// Selections made.
    pub selections: u64,
    /// Valid ballots aggregated.
    pub ballots: u64,
    /// Malformed answers rejected (each retry counts), by reason.
    pub rejected: BTreeMap<String, u64>,
    /// Ballots dropped after the retry budget.
    pub dropped: u64,
    /// Selections that needed a fill by validation success.
    pub filled_selections: u64,
    /// Ids filled in total.
    pub filled_ids: u64,
    /// External tokens the voters reported (role `voter`).
    pub voter_usage: Usage,
}

#[derive(Debug, Default)]
struct Counters {
    selections: AtomicU64,
    ballots: AtomicU64,
    dropped: AtomicU64,
    filled_selections: AtomicU64,
    filled_ids: AtomicU64,
    prompt_tokens: AtomicU64,
    completion_tokens: AtomicU64,
    rejected: Mutex<BTreeMap<String, u64>>,
}

/// One routing decision with its ballots.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Routed {
    /// The selection (ids, fill, the full ranking).
    pub selection: Selection,
    /// The valid ballots, one per voter that produced one.
    pub ballots: Vec<Vec<HarnessId>>,
    /// Malformed answers rejected on the way.
    pub rejected: usize,
    /// Voters whose ballot was dropped after the retry budget.
    pub dropped: usize,
    /// The calibration index the evidence came from.
    pub calibration: u32,
}

fn reason(e: &BallotError) -> &'static str {
    match e {
        BallotError::Unreadable { .. } => "unreadable",
        BallotError::WrongLength { .. } => "wrong_length",
        BallotError::Unknown { .. } => "unknown_id",
        BallotError::Duplicate { .. } => "duplicate",
        BallotError::BaseInRescue { .. } => "base_in_rescue",
        BallotError::VoterFailed { .. } => "voter_failed",
    }
}

/// The Adaptive Harness Router (Harness-S's router; with a fixed-profile calibrator it is the
/// paper's "Top-8 Fixed" variant).
pub struct AdaptiveRouter {
    name: String,
    evidence: EvidenceCell,
    voters: Vec<Arc<dyn Voter>>,
    settings: RouterSettings,
    counters: Counters,
}

impl AdaptiveRouter {
    /// A router reading `evidence`, with `voters`.
    pub fn new(
        evidence: EvidenceCell,
        voters: Vec<Arc<dyn Voter>>,
        settings: RouterSettings,
    ) -> Result<Self> {
        settings.validate()?;
        if voters.is_empty() {
            return Err(Error::setting("voters", "expected at least one voter"));
        }
        Ok(AdaptiveRouter {
            name: "adaptive-router".into(),
            evidence,
            voters,
            settings,
            counters: Counters::default(),
        })
    }

    /// The same router under another name (for logs and metrics).
    pub fn named(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The evidence cell the router reads.
    pub fn evidence(&self) -> &EvidenceCell {
        &self.evidence
    }

    /// Counters since the router was built.
    pub fn stats(&self) -> RouterStats {
        let c = &self.counters;
        RouterStats {
            selections: c.selections.load(Ordering::Relaxed),
            ballots: c.ballots.load(Ordering::Relaxed),
            rejected: c.rejected.lock().unwrap_or_else(|p| p.into_inner()).clone(),
            dropped: c.dropped.load(Ordering::Relaxed),
            filled_selections: c.filled_selections.load(Ordering::Relaxed),
            filled_ids: c.filled_ids.load(Ordering::Relaxed),
            voter_usage: Usage {
                prompt_tokens: c.prompt_tokens.load(Ordering::Relaxed),
                completion_tokens: c.completion_tokens.load(Ordering::Relaxed),
            },
        }
    }

    /// Collect one voter's ballot, retrying malformed ones within the budget.
    async fn ballot(
        &self,
        v: usize,
        voter: &dyn Voter,
        base: &VoteRequest,
        rules: BallotRules<'_>,
    ) -> (Option<Vec<HarnessId>>, usize) {
        let mut rejected = 0;
        for attempt in 0..self.settings.ballot_attempts {
            let mut request = base.clone();
            request.attempt = attempt;
            request.seed = call_seed(base.seed ^ (v as u64 + 1).rotate_left(40), attempt);
            let checked = match voter.vote(&request).await {
                Ok(answer) => {
                    if let Some(u) = answer.usage {
                        let c = &self.counters;
                        c.prompt_tokens
                            .fetch_add(u.prompt_tokens, Ordering::Relaxed);
                        c.completion_tokens
                            .fetch_add(u.completion_tokens, Ordering::Relaxed);
                    }
                    answer.ballot.and_then(|b| rules.check(&b))
                }
                Err(e) => Err(BallotError::VoterFailed {
                    message: e.to_string(),
                }),
            };
            match checked {
                Ok(ballot) => return (Some(ballot), rejected),
                Err(e) => {
                    rejected += 1;
                    *self
                        .counters
                        .rejected
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .entry(reason(&e).to_string())
                        .or_default() += 1;
                    tracing::warn!(voter = voter.name(), task = %base.task.id, attempt, error = %e, "malformed ballot rejected");
                }
            }
        }
        tracing::warn!(voter = voter.name(), task = %base.task.id, "ballot dropped after the retry budget");
        (None, rejected)
    }

    /// Rank candidates for `task` and cut the Top-`k` (Eq. 10 in rescue, Eq. 12 in inference).
    pub async fn route(
        &self,
        task: &Task,
        k: usize,
        mode: SelectionMode,
        seed: u64,
    ) -> Result<Routed> {
        let evidence = self.evidence.require()?;
        let cal = &evidence.calibration;
        let candidates = evidence.candidates(mode);
        let ids: Vec<HarnessId> = candidates.iter().map(|c| c.id.clone()).collect();
        let ballot_len = BallotRules::len_for(ids.len(), self.settings.ballot_len);
        let request = VoteRequest {
            task: task.clone(),
            mode,
            candidates,
            similar: evidence.similar(task, self.settings.similar_tasks),
            features: cal.features,
            ballot_len,
            seed,
            attempt: 0,
        };
        let rules = BallotRules {
            candidates: &ids,
            excluded_base: (mode == SelectionMode::Rescue).then_some(&cal.base),
            len: ballot_len,
        };
        let results = futures::future::join_all(
            self.voters
                .iter()
                .enumerate()
                .map(|(v, voter)| self.ballot(v, voter.as_ref(), &request, rules)),
        )
        .await;
        let rejected: usize = results.iter().map(|(_, r)| r).sum();
        let ballots: Vec<Vec<HarnessId>> = results.into_iter().filter_map(|(b, _)| b).collect();
        let dropped = self.voters.len() - ballots.len();
        let ranking = aggregate(
            &ids,
            &cal.validation_success,
            &ballots,
            &self.settings.weights,
        );
        let excluded = (mode == SelectionMode::Rescue).then_some(&cal.base);
        let selection = top_k(ranking, k, excluded)?;
        let c = &self.counters;
        c.selections.fetch_add(1, Ordering::Relaxed);
        c.ballots.fetch_add(ballots.len() as u64, Ordering::Relaxed);
        c.dropped.fetch_add(dropped as u64, Ordering::Relaxed);
        if !selection.filled.is_empty() {
            c.filled_selections.fetch_add(1, Ordering::Relaxed);
            c.filled_ids
                .fetch_add(selection.filled.len() as u64, Ordering::Relaxed);
            tracing::info!(task = %task.id, filled = ?selection.filled, "fewer than k candidates received votes; filled by validation success");
        }
        Ok(Routed {
            selection,
            ballots,
            rejected,
            dropped,
            calibration: cal.index,
        })
    }
}

#[async_trait]
impl HarnessSelector for AdaptiveRouter {
    fn name(&self) -> &str {
        &self.name
    }

    async fn select(&self, request: &SelectionRequest) -> harness_core::Result<Vec<HarnessId>> {
        Ok(self
            .route(&request.task, request.k, request.mode, request.seed)
            .await?
            .selection
            .ids)
    }

    fn usage(&self) -> std::collections::BTreeMap<String, harness_core::Usage> {
        let usage = self.stats().voter_usage;
        if usage == harness_core::Usage::default() {
            return std::collections::BTreeMap::new();
        }
        std::collections::BTreeMap::from([(crate::llm_voter::VOTER_ROLE.to_string(), usage)])
    }
}
