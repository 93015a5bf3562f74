//! Choosing rescue harnesses: the strict check of a selector's answer, and [`RandomSelector`],
//! the paper's "Random Harness" baseline as a [`HarnessSelector`].

use std::collections::HashSet;

use async_trait::async_trait;
use harness_core::{HarnessId, HarnessSelector, SelectionMode, SelectionRequest};
use harness_pool::SiblingPool;
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};

/// Check a selector's rescue answer: exactly `asked` distinct auxiliary members of `pool`.
/// Anything else is an error naming the selector and what it returned, never a silent fill.
pub fn check_rescue_selection(
    selector: &str,
    task: &str,
    asked: usize,
    returned: &[HarnessId],
    pool: &SiblingPool,
) -> Result<()> {
    let fail = |problem: String| Error::Selector {
        selector: selector.to_string(),
        task: task.to_string(),
        asked,
        returned: returned.to_vec(),
        problem,
    };
    if returned.len() != asked {
        return Err(fail(format!(
            "{} harnesses instead of {asked}",
            returned.len()
        )));
    }
    let mut seen = HashSet::new();
    for id in returned {
        if id == pool.base_id() {
            return Err(fail(format!(
                "`{id}` is the base harness H0, which rescue excludes (Eq. 10)"
            )));
        }
        if !pool.contains(id) {
            return Err(fail(format!("`{id}` is not a member of the pool")));
        }
        if !seen.insert(id) {
            return Err(fail(format!("`{id}` appears twice")));
        }
    }
    Ok(())
}

/// `k` distinct ids from `candidates`, uniformly at random from `seed` (all of them, shuffled,
/// when there are fewer).
pub fn sample_distinct(candidates: &[HarnessId], k: usize, seed: u64) -> Vec<HarnessId> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut ids = candidates.to_vec();
    ids.shuffle(&mut rng);
    ids.truncate(k);
    ids
}

/// Picks harnesses uniformly at random from the request's seed: auxiliaries only in
/// [`SelectionMode::Rescue`], the whole pool in [`SelectionMode::Inference`].
#[derive(Debug, Clone)]
pub struct RandomSelector {
    base: HarnessId,
    auxiliaries: Vec<HarnessId>,
}

impl RandomSelector {
    /// A selector over `pool`'s members.
    pub fn new(pool: &SiblingPool) -> Self {
        RandomSelector {
            base: pool.base_id().clone(),
            auxiliaries: pool.auxiliaries().map(|h| h.id()).collect(),
        }
    }
}

#[async_trait]
impl HarnessSelector for RandomSelector {
    fn name(&self) -> &str {
        "random"
    }

    async fn select(&self, request: &SelectionRequest) -> harness_core::Result<Vec<HarnessId>> {
        let candidates = match request.mode {
            SelectionMode::Rescue => self.auxiliaries.clone(),
            SelectionMode::Inference => std::iter::once(self.base.clone())
                .chain(self.auxiliaries.iter().cloned())
                .collect(),
        };
        Ok(sample_distinct(&candidates, request.k, request.seed))
    }
}
