//! The [`Learner`] seam: the rescue loop hands each batch's retained groups to a learner and
//! never sees how the update is made (grpo-candle's trainer in process, or a remote training
//! engine over the Tinker protocol).

use std::collections::BTreeMap;
use std::path::Path;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::objective::{RescueObjective, TokenScoring};
use crate::trajectory::Group;
use crate::{Error, Result};

/// What one policy update did, as plain numbers for `metrics.jsonl`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UpdateReport {
    /// Whether an optimizer step was taken. `false` when the batch had no scored policy token:
    /// then nothing moved (step counter, schedule, optimizer moments) and the loss is 0.
    pub applied: bool,
    /// Optimizer steps taken so far, after this update.
    pub optimizer_steps: u64,
    /// Version of the weights rollouts should use from now on (bumped by every applied update).
    pub policy_version: u64,
    /// `-J` of Eq. 15.
    pub loss: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Learning rate of the update.
    pub lr: f64,
    /// Scored policy tokens.
    pub policy_tokens: usize,
    /// Fraction of policy tokens whose ratio was clipped at `1 - eta_-` (Eq. 7).
    pub clip_frac_low: f64,
    /// Fraction of policy tokens whose ratio was clipped at `1 + eta_+` (Eq. 7).
    pub clip_frac_high: f64,
    /// Mean importance weight `w` of Eq. 16 over policy tokens.
    pub weight_mean: f64,
    /// Fraction of policy tokens whose `pi_old / q` was clipped to 2 (Eq. 16).
    pub weight_clipped_frac: f64,
    /// Wall-clock seconds of the update.
    pub seconds: f64,
    /// Anything else the learner reports (entropy, ratio range, ...), by name.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub extra: BTreeMap<String, f64>,
}

/// Turns retained groups into a policy update.
///
/// # Example
/// `examples/custom_learner.rs` in the repository implements a group-relative policy-gradient learner, trained in the rescue loop
/// (`cargo run --release --example custom_learner`; `tests/extension_examples.rs` runs it).
///
/// # Design
/// The learner owns the trainable state: weights, optimizer moments, step counter and RNG.
/// Checkpointing goes through it, so a crash-safe run can save and restore everything the next
/// update depends on without knowing what that is. It is async because a learner may be a
/// remote engine; an in-process learner does its work inline.
#[async_trait]
pub trait Learner: Send {
    /// A short name for logs and errors.
    fn name(&self) -> &str {
        "learner"
    }

    /// One update on the batch's retained groups (each trajectory scored in its own generating
    /// context; only policy tokens enter the loss).
    async fn update(&mut self, groups: &[Group]) -> Result<UpdateReport>;

    /// Whether this learner computes `objective` for rescued trajectories; the rescue loop asks
    /// before its first rollout. The default computes only the paper's objective
    /// ([`RescueObjective::Generating`], Eqs. 13-16) and refuses the others, naming the setting.
    fn check_rescue_objective(&self, objective: RescueObjective) -> Result<()> {
        if objective.is_paper() {
            return Ok(());
        }
        Err(Error::Learner {
            learner: self.name().to_string(),
            message: format!(
                "`rescue_objective = \"{objective}\"` is not computed by this learner: it scores every policy token in its generating context (the paper's objective, Eqs. 13-16); expected `rescue_objective = \"generating\"`, or an in-process learner (grpo-candle) for `masked` and `h0`"
            ),
        })
    }

    /// One update where each trajectory's tokens are scored as `scoring[g][j]` says (one entry
    /// per trajectory of each group, see [`TokenScoring`]). The default accepts only the paper's
    /// scoring and hands the groups to [`Learner::update`].
    async fn update_scored(
        &mut self,
        groups: &[Group],
        scoring: &[Vec<TokenScoring>],
    ) -> Result<UpdateReport> {
        if let Some(other) = scoring.iter().flatten().find(|s| !s.is_paper()) {
            return Err(Error::Learner {
                learner: self.name().to_string(),
                message: format!(
                    "asked to score rescued tokens as {other:?}; this learner computes only the paper's objective (every token in its generating context)"
                ),
            });
        }
        self.update(groups).await
    }

    /// Write everything the next update depends on into `dir` (created; the caller makes the
    /// write atomic by writing into a fresh folder and renaming it).
    fn save_checkpoint(&self, dir: &Path) -> Result<()>;

    /// Restore the state written by [`Learner::save_checkpoint`].
    fn load_checkpoint(&mut self, dir: &Path) -> Result<()>;
}
