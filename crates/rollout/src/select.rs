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

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use harness_core::{Harness, Split, Task};

    use super::*;

    fn pool() -> SiblingPool {
        SiblingPool::starter(
            Harness::new("H0", "Answer."),
            ["a", "b", "c", "d"].map(|n| Harness::new(n, format!("Answer, {n}."))),
            serde_json::Value::Null,
        )
        .unwrap()
    }

    fn request(k: usize, mode: SelectionMode, seed: u64) -> SelectionRequest {
        SelectionRequest {
            task: Task::new("t", "env", Split::Train, "Do it.", 0),
            k,
            mode,
            seed,
        }
    }

    #[tokio::test]
    async fn random_selector_is_seeded_and_respects_the_mode() {
        let pool = pool();
        let random = RandomSelector::new(&pool);
        let first = random
            .select(&request(4, SelectionMode::Rescue, 1))
            .await
            .unwrap();
        assert_eq!(
            first,
            random
                .select(&request(4, SelectionMode::Rescue, 1))
                .await
                .unwrap()
        );
        assert!(!first.contains(pool.base_id()));
        assert_eq!(first.iter().collect::<BTreeSet<_>>().len(), 4);
        let mut orders = BTreeSet::new();
        for seed in 0..16 {
            orders.insert(
                random
                    .select(&request(2, SelectionMode::Rescue, seed))
                    .await
                    .unwrap(),
            );
        }
        assert!(
            orders.len() > 1,
            "different seeds draw different selections"
        );
        // More than the eligible members: all of them, once each.
        let rescue = random
            .select(&request(9, SelectionMode::Rescue, 1))
            .await
            .unwrap();
        assert_eq!(rescue.iter().collect::<BTreeSet<_>>().len(), 4);
        let all = random
            .select(&request(5, SelectionMode::Inference, 1))
            .await
            .unwrap();
        assert!(all.contains(pool.base_id()));
        assert_eq!(all.len(), 5);
    }
}
