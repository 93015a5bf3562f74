//! The decision-point probe: how likely a checkpoint is to make each planted family's good
//! decision under H0, on fixed contexts.
//!
//! Behaviour frequencies (paper Table 3) count what sampled episodes did, so they move only
//! when a decision flips often enough to change a sample. The probe reads the policy's
//! probabilities instead. For each test task of a planted family the demonstration script
//! ([`DemoScript`]) drives two episodes under H0 that are identical up to the family's
//! decision point (its second policy turn):
//!
//! | family | context at the decision | good turn | planted turn |
//! |---|---|---|---|
//! | change | the change succeeded | commit an empty answer | check the table |
//! | recheck | the query returned its result | commit the result | run the query again |
//! | quoting | the unquoted statement failed | the statement with names quoted | the same statement again |
//! | quoting under [`Organism::PromptRules`] | the task, before any statement | the statement with names quoted | the statement unquoted |
//!
//! Under [`Organism::PromptRules`] the recheck family is not planted and is not probed.
//!
//! Both turns are teacher-forced through the checkpoint ([`TeacherForcedPolicy`]), which
//! gives the checkpoint's own log-probability of each token (temperature 1, full vocabulary).
//! The two turns share a prefix of tokens (`<tool_call>` and the JSON up to the argument's
//! name, or in a statement up to the first name that needs quotes); the decision is the first
//! token where they part. The probe reads the two candidates' log-probabilities there, given
//! the same context and prefix, and reports per family the mean over tasks of
//! - `p_good`: the two-way probability of the good token, `sigmoid(log p(good) - log p(planted))`;
//! - `p_good_token`: the probability of the good token itself;
//! - `log_ratio`: `log p(good) - log p(planted)`.
//!
//! Under a sibling (the context lock) the same two twins run under the sibling's harness; neither
//! follows the sibling's repair, so the contexts still agree up to the decision and the probe
//! reads how likely the checkpoint is to decide well *in the sibling's context*.
//!
//! Comparing whole turns instead would mostly measure their lengths (a commit is a few tokens,
//! a statement dozens). The contexts come from the script, not from the checkpoint's own
//! samples, so every checkpoint is read on the same contexts.

use std::collections::BTreeMap;
use std::sync::Arc;

use grpo_candle::{CandlePolicy, TeacherForcedPolicy};
use harness_core::{EpisodeOptions, Harness, Policy, Task, run_episode_with};
use serde::{Deserialize, Serialize};

use crate::demo::{Cues, DemoScript};
use crate::environment::Family;
use crate::error::{Error, Result};
use crate::organism::Organism;

/// The index of the decision turn among an episode's policy turns: the second, except for the
/// quoting family under [`Organism::PromptRules`], whose decision is the first statement.
fn decision_turn(organism: Organism, family: Family) -> usize {
    match (organism, family) {
        (Organism::PromptRules, Family::Quoting) => 0,
        _ => 1,
    }
}

/// The latest decision turn of any family.
const DECISION_TURN: usize = 1;

/// One family's probe over the test tasks.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct FamilyProbe {
    /// Tasks probed (the family's test tasks whose decision point the script reaches).
    pub tasks: usize,
    /// Mean over tasks of `sigmoid(log p(good) - log p(planted))` at the first token where the
    /// good and the planted turn part.
    pub p_good: f64,
    /// Mean over tasks of the good token's probability there.
    pub p_good_token: f64,
    /// Mean over tasks of `log p(good) - log p(planted)` there (nats).
    pub log_ratio: f64,
    /// Each probed task's two-way probability (task id -> `p_good`), for intervals paired by
    /// task.
    pub per_task: BTreeMap<String, f64>,
}

/// Probe `student` at each planted family's decision point on `tasks` under `h0` (see the
/// module documentation), for the organism's variant `organism`. Families without a probed task
/// are absent; tasks of a family the variant does not plant, and quoting tasks whose unquoted
/// statement runs, have no decision point.
pub async fn probe_decisions(
    student: &Arc<CandlePolicy>,
    h0: &Harness,
    tasks: &[Task],
    seed: u64,
    organism: Organism,
) -> Result<BTreeMap<String, FamilyProbe>> {
    let env = crate::warm::demo_env();
    // Both twins ignore the harness's repairs (the good twin decides well by itself, the
    // planted one does the planted thing), so a repairing sibling's context is probed too.
    let cues = Arc::new(Cues {
        organism,
        ..Cues::default()
    });
    // Nothing after the decision turn is read: without hooks (which may read the remaining
    // calls) the episode can stop there, with the same contexts up to it.
    let mut harness = h0.clone();
    if harness.hooks.is_empty() {
        harness.limits.max_model_calls =
            harness.limits.max_model_calls.min(DECISION_TURN as u32 + 1);
    }
    let h0 = &harness;
    let options = EpisodeOptions::default();
    let mut sums: BTreeMap<Family, ([f64; 4], BTreeMap<String, f64>)> = BTreeMap::new();
    for (i, task) in tasks.iter().enumerate() {
        let Some(family) = Family::of_task(task) else {
            continue;
        };
        let mut turns = Vec::with_capacity(2);
        let mut reached = true;
        for good in [true, false] {
            let script = DemoScript::new(task, Arc::clone(&cues), good)?;
            if !organism.plants(family) || (family == Family::Quoting && !script.first_fails()) {
                reached = false;
                break;
            }
            let forced = TeacherForcedPolicy::new(Arc::new(script), Arc::clone(student));
            let policy: &dyn Policy = &forced;
            let episode = run_episode_with(policy, h0, &env, task, seed ^ i as u64, &options)
                .await
                .map_err(|e| Error::Demo(format!("probe on `{}`: {e}", task.id)))?;
            let Some(turn) = episode.turns.get(decision_turn(organism, family)) else {
                reached = false;
                break;
            };
            if turn.tokens.is_empty() {
                reached = false;
                break;
            }
            turns.push(turn.clone());
        }
        if !reached {
            continue;
        }
        let (good, planted) = (&turns[0], &turns[1]);
        if good.context_tokens != planted.context_tokens {
            return Err(Error::Demo(format!(
                "probe on `{}`: the good and planted episodes reach the decision with different contexts",
                task.id
            )));
        }
        let Some(at) = good
            .tokens
            .iter()
            .zip(&planted.tokens)
            .position(|(a, b)| a != b)
        else {
            continue;
        };
        let (lg, lp) = (
            f64::from(good.logprobs[at]),
            f64::from(planted.logprobs[at]),
        );
        let ratio = lg - lp;
        let (entry, per_task) = sums.entry(family).or_default();
        entry[0] += 1.0;
        entry[1] += sigmoid(ratio);
        entry[2] += lg.exp();
        entry[3] += ratio;
        per_task.insert(task.id.clone(), sigmoid(ratio));
    }
    Ok(sums
        .into_iter()
        .map(|(family, ([n, p, token, r], per_task))| {
            (
                family.as_str().to_string(),
                FamilyProbe {
                    tasks: n as usize,
                    p_good: p / n,
                    p_good_token: token / n,
                    log_ratio: r / n,
                    per_task,
                },
            )
        })
        .collect())
}

fn sigmoid(x: f64) -> f64 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

#[cfg(test)]
mod tests {
    use super::sigmoid;

    #[test]
    fn sigmoid_is_stable_at_both_ends() {
        assert_eq!(sigmoid(0.0), 0.5);
        assert!((sigmoid(800.0) - 1.0).abs() < 1e-12);
        assert!(sigmoid(-800.0) >= 0.0 && sigmoid(-800.0) < 1e-300);
        assert!((sigmoid(2.0) + sigmoid(-2.0) - 1.0).abs() < 1e-12);
    }
}
