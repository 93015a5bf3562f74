//! Voters (paper Eq. 9 and "Inference voting"): each of V voters sees the task, the current
//! profiles, validation success rates and the outcomes on the most similar validation tasks,
//! and returns a ballot ranking four distinct candidates.
//!
//! The [`Voter`] trait has two implementations: the LLM voter ([`crate::LlmVoter`]) and the
//! built-in [`BuiltinVoter`], which scores candidates by how well their profile conditions
//! match the task and by their success on similar validation tasks, perturbed by its own seed
//! so that several built-in voters differ.

use std::collections::{BTreeMap, BTreeSet};

use async_trait::async_trait;
use harness_core::{HarnessId, SelectionMode, Task, Usage};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::ballot::BallotError;
use crate::error::Result;
use crate::features::{FeatureSource, condition_match, task_tokens};
use crate::profile::{Entry, Profile};

/// What a voter knows about one candidate.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    /// Its id (what a ballot lists).
    pub id: HarnessId,
    /// Its name.
    pub name: String,
    /// Its execution description (H0's too: "The base harness uses its execution description
    /// and validation evidence").
    pub description: String,
    /// Whether it is H0.
    pub is_base: bool,
    /// Its validation success at the current calibration.
    pub validation_success: f64,
    /// Its profile (H0 and unprofiled siblings have none).
    pub profile: Option<Profile>,
}

/// One similar validation task and every candidate's success on it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SimilarOutcome {
    /// The validation task.
    pub task_id: String,
    /// Its instruction.
    pub instruction: String,
    /// Its BM25 similarity to the routed task (best = 1).
    pub similarity: f64,
    /// Success rate per candidate.
    pub success: BTreeMap<HarnessId, f64>,
}

/// What a voter is asked.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct VoteRequest {
    /// The task to route.
    pub task: Task,
    /// Rescue (H0 excluded) or inference (H0 included).
    pub mode: SelectionMode,
    /// The eligible candidates, in the router's (stable) order; LLM voters shuffle them.
    pub candidates: Vec<Candidate>,
    /// The most similar validation tasks.
    pub similar: Vec<SimilarOutcome>,
    /// Where the task's features come from (the calibration's choice).
    #[serde(default)]
    pub features: FeatureSource,
    /// Exactly how many ids the ballot must list.
    pub ballot_len: usize,
    /// The seed of this call (differs per voter and per retry).
    pub seed: u64,
    /// 0 for the first request, then 1, 2, ... for retries after malformed ballots.
    pub attempt: u32,
}

impl VoteRequest {
    /// A candidate's similarity-weighted success on the similar tasks (`None` without any).
    pub fn similar_success(&self, id: &HarnessId) -> Option<f64> {
        let (mut num, mut den) = (0.0, 0.0);
        for s in &self.similar {
            if let Some(rate) = s.success.get(id) {
                num += s.similarity * rate;
                den += s.similarity;
            }
        }
        (den > 0.0).then(|| num / den)
    }
}

/// A voter's answer: a ballot (ids, best first) or why none could be read, and its cost.
#[derive(Debug, Clone, PartialEq)]
pub struct VoteAnswer {
    /// The ballot as the voter wrote it, unchecked; the router validates it.
    pub ballot: std::result::Result<Vec<String>, BallotError>,
    /// External tokens spent.
    pub usage: Option<Usage>,
}

/// Ranks candidates for a task.
///
/// # Design
/// A voter returns ids as written, unchecked: the router owns the ballot rules (length,
/// distinctness, no H0 in rescue), so one rule set applies to every voter, and retries a voter
/// whose ballot breaks them with `attempt` increased. A voter returns `Err` only when it cannot
/// run at all; the router then drops that voter's ballot for this task and counts it.
#[async_trait]
pub trait Voter: Send + Sync {
    /// A short name for logs.
    fn name(&self) -> &str;

    /// One ballot.
    async fn vote(&self, request: &VoteRequest) -> Result<VoteAnswer>;
}

/// How the built-in voter weighs its evidence.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct BuiltinVoterWeights {
    /// Profile-condition match (prefer minus avoid), in [-1, 1].
    pub profile: f64,
    /// Success on similar validation tasks, in [0, 1].
    pub similar: f64,
    /// Overall validation success, in [0, 1].
    pub validation: f64,
    /// Amplitude of the voter's seeded perturbation, uniform in [-noise, noise].
    pub noise: f64,
}

impl Default for BuiltinVoterWeights {
    fn default() -> Self {
        BuiltinVoterWeights {
            profile: 1.0,
            similar: 1.0,
            validation: 0.5,
            noise: 0.1,
        }
    }
}

/// The built-in deterministic voter.
#[derive(Debug, Clone)]
pub struct BuiltinVoter {
    name: String,
    seed: u64,
    weights: BuiltinVoterWeights,
}

fn mix(a: u64, b: u64) -> u64 {
    harness_core::call_seed(a ^ b.rotate_left(23), (b >> 32) as u32 ^ b as u32)
}

fn id_hash(id: &HarnessId) -> u64 {
    id.0.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The best support-weighted condition match of `entries` for a task: match in [0, 1] times
/// n / (n + 1) for n supporting tasks, so repeated observations weigh more than single ones.
fn best_match(entries: &[Entry], have: &BTreeSet<String>) -> f64 {
    entries
        .iter()
        .map(|e| {
            let n = e.support.len() as f64;
            condition_match(&e.when, have) * n / (n + 1.0)
        })
        .fold(0.0, f64::max)
}

impl BuiltinVoter {
    /// A voter named `name` with its own `seed`.
    pub fn new(name: impl Into<String>, seed: u64) -> Self {
        BuiltinVoter {
            name: name.into(),
            seed,
            weights: BuiltinVoterWeights::default(),
        }
    }

    /// `n` voters `builtin-0..n` with seeds derived from `seed`.
    pub fn panel(n: usize, seed: u64) -> Vec<BuiltinVoter> {
        (0..n)
            .map(|i| BuiltinVoter::new(format!("builtin-{i}"), mix(seed, i as u64 + 1)))
            .collect()
    }

    /// The same voter with other weights.
    pub fn with_weights(mut self, weights: BuiltinVoterWeights) -> Self {
        self.weights = weights;
        self
    }

    /// Every candidate's score for the request, in candidate order.
    pub fn scores(&self, request: &VoteRequest) -> Vec<(HarnessId, f64)> {
        let have: BTreeSet<String> = task_tokens(&request.task, request.features)
            .into_iter()
            .collect();
        let w = self.weights;
        request
            .candidates
            .iter()
            .map(|c| {
                let profile = c.profile.as_ref().map_or(0.0, |p| {
                    best_match(&p.prefer, &have) - best_match(&p.avoid, &have)
                });
                let similar = request
                    .similar_success(&c.id)
                    .unwrap_or(c.validation_success);
                let mut rng = ChaCha8Rng::seed_from_u64(mix(
                    mix(self.seed, request.seed),
                    id_hash(&c.id) ^ u64::from(request.attempt),
                ));
                let noise = w.noise * rng.gen_range(-1.0..=1.0);
                let score = w.profile * profile
                    + w.similar * similar
                    + w.validation * c.validation_success
                    + noise;
                (c.id.clone(), score)
            })
            .collect()
    }
}

#[async_trait]
impl Voter for BuiltinVoter {
    fn name(&self) -> &str {
        &self.name
    }

    async fn vote(&self, request: &VoteRequest) -> Result<VoteAnswer> {
        let mut scores = self.scores(request);
        scores.sort_by(|a, b| {
            b.1.partial_cmp(&a.1)
                .unwrap_or(std::cmp::Ordering::Equal)
                .then_with(|| a.0.cmp(&b.0))
        });
        Ok(VoteAnswer {
            ballot: Ok(scores
                .into_iter()
                .take(request.ballot_len)
                .map(|(id, _)| id.0)
                .collect()),
            usage: None,
        })
    }
}
