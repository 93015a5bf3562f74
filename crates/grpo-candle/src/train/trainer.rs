//! The GRPO trainer: groups of trajectories in, one (or a few) AdamW updates out.
//!
//! Data flow of [`Trainer::step`]:
//! 0. [`Trainer::step`] checks every turn's recorded sampling settings against the trainer's own
//!    (see "Which q" below) and refuses rollouts it cannot weight correctly.
//! 1. Every trajectory's policy turns become training sequences in their own generating context:
//!    turns without generated tokens (a context overflow) are skipped; consecutive turns whose
//!    `context_tokens` extend the previous turn's context + tokens are packed into one sequence;
//!    any other turn starts a new one. Only generated tokens are scored (the loss mask); harness
//!    text and observations are context.
//! 2. Advantages per group (Eq. 6); each token's share `1 / (|B| N_x)` of Eq. 15.
//! 3. The groups are split into `updates_per_step` mini-batches (shuffled with the trainer's RNG
//!    when more than one). Each mini-batch is one optimizer update, accumulated over micro-batches
//!    that fit a padded-token budget; on the CPU several micro-batches run at once, one per
//!    thread, and their gradients are summed in order.
//! 4. `pi_old` is the policy before the step. The first update runs on unchanged weights, so its
//!    old log-probs are the current ones detached and no extra pass is made; later mini-batches get
//!    theirs from a forward-only pass before the first update.
//! 5. Global grad-norm clipping, AdamW with decoupled weight decay, warmup + cosine/linear decay.
//!    A mini-batch without scored tokens makes no update: the step counter, the schedule and
//!    AdamW's bias correction stay where they were, and [`StepMetrics::skipped_updates`] counts it.
//!
//! # Which q
//! The trainer's `pi_old` is the model at [`TrainerConfig::temperature`] over the full
//! vocabulary, so Eq. 16's `w = clip(pi_old / q, 0, 2)` is an importance weight only when `q`
//! is that same distribution. A rollout sampled with top-p < 1 or a top-k records `q`
//! renormalised over the kept tokens (every `w` is then biased), a greedy rollout records
//! log q = 0 (a point mass), and one at another temperature compares different distributions:
//! [`Trainer::step`] refuses all three with an error naming the trajectory, the turn and the
//! setting. [`Trainer::step_rollouts`] takes plain log-probs and cannot check them; its caller
//! vouches for them. [`StepMetrics::weight_mean`] and [`StepMetrics::weight_clip_frac`] show a
//! remaining mismatch (on-policy they are 1 and 0).
//!
//! [`Trainer::save_checkpoint`] writes the model (through a callback, e.g. the HF writer), the
//! optimizer moments, the step and the RNG state into a folder atomically; [`Trainer::resume`]
//! continues bit-identically on the CPU.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Device, Tensor, Var, WithDType};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ops::fused::cpu_slice;
use crate::ops::logprob::{LogProbConfig, token_logprobs};
use crate::train::objective::{
    GUIDE_PERCENTILE, GrpoConfig, GuideStats, GuideTerms, LossStats, TokenTerms, group_advantages,
    grpo_loss, guide_loss, quantile,
};
use harness_core::TokenScoring;

/// What the trainer needs from a causal language model.
///
/// # Design
/// The trainer never asks for logits: it takes the final hidden states and the lm_head matrix
/// and computes the chosen tokens' log-probs with the chunked op of [`crate::ops::logprob`], so the
/// `[tokens, vocab]` tensor never exists. Parameters are candle [`Var`]s the trainer updates in
/// place; their names are the checkpoint's names (optimizer state is keyed by them).
pub trait TrainableLm: Send + Sync {
    /// Final hidden states (after the last norm) for right-padded token ids `[B, T]` (u32):
    /// `[B, T, H]`. Position `t` may only depend on positions `<= t`.
    fn hidden_states(&self, input_ids: &Tensor) -> Result<Tensor>;

    /// The `[V, H]` output projection (the embedding matrix when tied).
    fn lm_head_weight(&self) -> Tensor;

    /// Every trainable parameter, with a stable unique name.
    fn trainable_vars(&self) -> Vec<(String, Var)>;

    /// Called after every optimizer update of the variables, so that what was derived from the
    /// old weights (the sampler's prefix cache) is invalidated.
    fn weights_changed(&self) {}
}

impl TrainableLm for crate::model::Qwen {
    fn hidden_states(&self, input_ids: &Tensor) -> Result<Tensor> {
        self.forward_hidden(input_ids)
    }

    fn lm_head_weight(&self) -> Tensor {
        crate::model::Qwen::lm_head_weight(self)
    }

    fn trainable_vars(&self) -> Vec<(String, Var)> {
        self.named_vars()
    }

    fn weights_changed(&self) {
        self.mark_weights_changed();
    }
}

/// One policy call as the trainer needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnTokens {
    /// The prompt (generating context).
    pub context: Vec<u32>,
    /// The generated tokens (the only scored tokens).
    pub tokens: Vec<u32>,
    /// The rollout backend's log-prob of each generated token (`q`): at the trainer's
    /// temperature over the full vocabulary (see "Which q" in the module docs).
    pub logprobs: Vec<f32>,
}

/// One trajectory: its reward and its policy turns, in order.
#[derive(Debug, Clone, PartialEq)]
pub struct RolloutRecord {
    /// R in {0, 1} (any real reward works).
    pub reward: f32,
    /// Policy turns.
    pub turns: Vec<TurnTokens>,
}

/// One task's retained rollouts (a GRPO group).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct TaskRollouts {
    /// The group's trajectories.
    pub rollouts: Vec<RolloutRecord>,
}

impl From<&harness_core::Group> for TaskRollouts {
    fn from(g: &harness_core::Group) -> Self {
        TaskRollouts {
            rollouts: g
                .trajectories
                .iter()
                .map(|t| RolloutRecord {
                    reward: t.reward(),
                    turns: t
                        .turns
                        .iter()
                        .map(|turn| TurnTokens {
                            context: turn.context_tokens.clone(),
                            tokens: turn.tokens.clone(),
                            logprobs: turn.logprobs.clone(),
                        })
                        .collect(),
                })
                .collect(),
        }
    }
}

/// How the learning rate moves after warmup.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecayKind {
    /// Stay at the peak.
    Constant,
    /// Linear to `min_lr_ratio * lr` at `total_steps`.
    Linear,
    /// Half cosine to `min_lr_ratio * lr` at `total_steps`.
    Cosine,
}

/// Learning-rate schedule: linear warmup from `lr / warmup_steps`, then the decay.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    /// Peak learning rate.
    pub lr: f64,
    /// Updates of linear warmup.
    pub warmup_steps: u64,
    /// Updates over which the decay runs (warmup included).
    pub total_steps: u64,
    /// Decay shape.
    pub decay: DecayKind,
    /// Final learning rate as a fraction of the peak.
    pub min_lr_ratio: f64,
}

impl Schedule {
    /// Learning rate of update number `step` (0-based).
    pub fn lr_at(&self, step: u64) -> f64 {
        if step < self.warmup_steps {
            return self.lr * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps).max(1);
        let progress = ((step - self.warmup_steps) as f64 / span as f64).clamp(0.0, 1.0);
        let factor = match self.decay {
            DecayKind::Constant => 1.0,
            DecayKind::Linear => 1.0 - (1.0 - self.min_lr_ratio) * progress,
            DecayKind::Cosine => {
                self.min_lr_ratio
                    + (1.0 - self.min_lr_ratio)
                        * 0.5
                        * (1.0 + (std::f64::consts::PI * progress).cos())
            }
        };
        self.lr * factor
    }
}

/// AdamW hyper-parameters (decoupled weight decay, as `torch.optim.AdamW`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct AdamWConfig {
    /// First-moment decay.
    pub beta1: f64,
    /// Second-moment decay.
    pub beta2: f64,
    /// Denominator epsilon.
    pub eps: f64,
    /// Decoupled weight decay.
    pub weight_decay: f64,
    /// Also decay 1-D parameters (norm scales, biases); off by default.
    pub decay_1d: bool,
}

impl Default for AdamWConfig {
    fn default() -> Self {
        Self {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.01,
            decay_1d: false,
        }
    }
}

/// Everything the trainer is configured with.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TrainerConfig {
    /// The objective.
    pub grpo: GrpoConfig,
    /// The optimizer.
    pub adamw: AdamWConfig,
    /// The learning-rate schedule.
    pub schedule: Schedule,
    /// Global gradient-norm cap (`None`: no clipping).
    pub max_grad_norm: Option<f64>,
    /// Padded tokens (`batch x longest`) per micro-batch; a longer sequence gets its own.
    pub micro_batch_tokens: usize,
    /// Optimizer updates per call to [`Trainer::step`] (mini-batches of groups). The paper's
    /// setting is 1: the whole batch in one update against the pre-update policy.
    pub updates_per_step: usize,
    /// Seed of the trainer's RNG (mini-batch shuffling).
    pub seed: u64,
    /// Temperature the trainer's `pi_theta` is computed at (logits divided by it), over the full
    /// vocabulary. Rollouts must be sampled at this temperature without top-p or top-k, so that
    /// the correction weight of Eq. 16 compares like with like; [`Trainer::step`] refuses
    /// rollouts recorded with other settings. Default 1.
    #[serde(default = "one")]
    pub temperature: f64,
    /// Micro-batches run at once, each on its own CPU thread with its own activations. 0 (the
    /// default) picks: on the CPU with candle's elementwise pool off (`CANDLE_NUM_THREADS=1`),
    /// one per rayon thread (`RAYON_NUM_THREADS`); otherwise one. Results do not depend on it:
    /// gradients are summed in micro-batch order. Running whole micro-batches side by side uses
    /// the cores better than splitting every op across them on small and mid-sized models
    /// (figures in `bench/README.md`).
    #[serde(default)]
    pub parallel_micro_batches: usize,
    /// Chunks of the log-prob op.
    #[serde(skip, default)]
    pub logprob: LogProbConfig,
}

impl TrainerConfig {
    /// Micro-batches run at once for a model on `device`: [`Self::parallel_micro_batches`], or
    /// when it is 0 the choice it describes.
    pub fn micro_batches_at_once(&self, device: &Device) -> usize {
        match self.parallel_micro_batches {
            // candle's elementwise thread pool takes one caller at a time: with it on
            // (`CANDLE_NUM_THREADS` > 1), concurrent micro-batches queue for it and lose more
            // than they gain, so they are used only when it is off.
            0 if device.is_cpu() && candle_core::utils::barrier_pool().n_workers() == 0 => {
                candle_core::utils::get_num_threads().max(1)
            }
            0 => 1,
            n => n,
        }
    }
}

impl Default for TrainerConfig {
    fn default() -> Self {
        Self {
            grpo: GrpoConfig::default(),
            adamw: AdamWConfig::default(),
            schedule: Schedule {
                lr: 1e-6,
                warmup_steps: 0,
                total_steps: 1,
                decay: DecayKind::Constant,
                min_lr_ratio: 0.0,
            },
            max_grad_norm: Some(1.0),
            micro_batch_tokens: 16_384,
            updates_per_step: 1,
            seed: 0,
            temperature: 1.0,
            parallel_micro_batches: 0,
            logprob: LogProbConfig::default(),
        }
    }
}

/// What one [`Trainer::step`] did.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct StepMetrics {
    /// Optimizer updates done after this step (the trainer's step counter).
    pub step: u64,
    /// Learning rate of the last update.
    pub lr: f64,
    /// `-J` (Eq. 15), summed over this call's updates' mini-batches (averaged when several).
    pub loss: f64,
    /// Global gradient norm before clipping (mean over updates).
    pub grad_norm: f64,
    /// Updates made.
    pub updates: usize,
    /// Mini-batches skipped because they had no scored tokens (Eq. 15 gives them no gradient):
    /// no optimizer update, so neither the step counter nor the learning-rate schedule nor
    /// AdamW's bias correction moved for them. A step with no scored tokens at all reports
    /// `updates == 0` and skips every planned mini-batch.
    #[serde(default)]
    pub skipped_updates: usize,
    /// Groups in the batch.
    pub groups: usize,
    /// Groups with both successes and failures.
    pub effective_groups: usize,
    /// Policy tokens of effective groups (the effective token share is this over
    /// `policy_tokens`).
    pub effective_policy_tokens: usize,
    /// Training sequences after packing.
    pub sequences: usize,
    /// Scored policy tokens.
    pub policy_tokens: usize,
    /// Positions run through the model (padding excluded).
    pub sequence_tokens: usize,
    /// Micro-batches run (training passes).
    pub micro_batches: usize,
    /// Whether the separate pass for `pi_old` was needed.
    pub old_logprob_pass: bool,
    /// Fraction of policy tokens clipped at `1 - eta_-` (with `A < 0`).
    pub clip_frac_low: f64,
    /// Fraction of policy tokens clipped at `1 + eta_+` (with `A > 0`).
    pub clip_frac_high: f64,
    /// Mean, min, max of the ratio `rho`.
    pub ratio_mean: f64,
    /// Smallest `rho`.
    pub ratio_min: f64,
    /// Largest `rho`.
    pub ratio_max: f64,
    /// Mean of the correction weight `w = clip(pi_old / q, 0, 2)` (Eq. 16) over policy tokens:
    /// 1 on-policy; away from 1 when the rollout's `q` is not the trainer's `pi_old` (another
    /// temperature, truncated sampling, stale weights).
    pub weight_mean: f64,
    /// Smallest `w`.
    pub weight_min: f64,
    /// Largest `w`.
    pub weight_max: f64,
    /// Fraction of policy tokens whose `pi_old / q` exceeded the cap (`w` clipped at 2).
    #[serde(default)]
    pub weight_clip_frac: f64,
    /// Mean entropy of the policy's next-token distribution at scored positions.
    pub entropy_mean: f64,
    /// Wall-clock seconds.
    pub seconds: f64,
    /// Of which in gradient clipping and the optimizer update.
    pub optimizer_seconds: f64,
    /// Policy tokens of rescued trajectories left unscored by the `masked` rescue objective
    /// (generated before the sibling's first intervention).
    #[serde(default)]
    pub masked_tokens: usize,
    /// Policy tokens scored under H0's context by the `h0` rescue objective (part of
    /// `policy_tokens`; the clip and weight figures above are over the other tokens).
    #[serde(default)]
    pub h0_tokens: usize,
    /// Guide's `gamma` of the step: the 90th percentile of the `h0` tokens' ratios
    /// `pi_theta(y | c_H0) / q(y | c_H)` under the weights at the start of the step (0 without
    /// such tokens).
    #[serde(default)]
    pub h0_gamma: f64,
    /// Mean of those ratios over the step's passes (0 without such tokens).
    #[serde(default)]
    pub h0_ratio_mean: f64,
}

/// A training sequence: one packed run of turns of one trajectory.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sequence {
    /// Index of the group (task) in the batch.
    pub task: usize,
    /// Token ids: contexts and generated tokens, in order.
    pub ids: Vec<u32>,
    /// Positions `p >= 1` of generated tokens (the loss mask), ascending.
    pub policy_pos: Vec<usize>,
    /// `log q` of each scored token.
    pub rollout_logp: Vec<f32>,
    /// The trajectory's advantage.
    pub advantage: f32,
    /// Scored with the `h0` rescue objective's Guide-shaped ratio ([`guide_loss`]) instead of
    /// the paper's clipped one: `ids` is H0's re-rendered context and `rollout_logp` the
    /// behaviour log-probs in the generating context.
    pub guide: bool,
}

/// Packs one trajectory's turns into sequences (see the module docs).
pub(crate) fn pack_turns(
    task: usize,
    advantage: f32,
    turns: &[TurnTokens],
) -> Result<Vec<Sequence>> {
    pack_turns_from(task, advantage, turns, 0, false)
}

/// [`pack_turns`] where the turns before `first_scored` stay in the context but are not scored
/// (the `masked` rescue objective), and the sequences are marked `guide` when asked.
pub(crate) fn pack_turns_from(
    task: usize,
    advantage: f32,
    turns: &[TurnTokens],
    first_scored: usize,
    guide: bool,
) -> Result<Vec<Sequence>> {
    let mut out: Vec<Sequence> = Vec::new();
    let mut cur: Option<Sequence> = None;
    for (k, turn) in turns.iter().enumerate() {
        if turn.tokens.len() != turn.logprobs.len() {
            return Err(Error::Msg(format!(
                "turn {k}: {} generated tokens but {} rollout log-probs",
                turn.tokens.len(),
                turn.logprobs.len()
            )));
        }
        // A turn without tokens (the prompt overflowed the context limit) has nothing to score;
        // packing its context would run the model over tokens it never generated from, possibly
        // past its context length.
        if turn.tokens.is_empty() {
            continue;
        }
        let extends = cur
            .as_ref()
            .is_some_and(|s| turn.context.len() >= s.ids.len() && turn.context.starts_with(&s.ids));
        let seq = if extends {
            let s = cur.as_mut().expect("checked above");
            let n = s.ids.len();
            s.ids.extend_from_slice(&turn.context[n..]);
            s
        } else {
            if let Some(done) = cur.take() {
                out.push(done);
            }
            cur.insert(Sequence {
                task,
                ids: turn.context.clone(),
                policy_pos: Vec::new(),
                rollout_logp: Vec::new(),
                advantage,
                guide,
            })
        };
        for (&tok, &lq) in turn.tokens.iter().zip(&turn.logprobs) {
            let p = seq.ids.len();
            seq.ids.push(tok);
            // A token with no context at all cannot be scored.
            if p >= 1 && k >= first_scored {
                seq.policy_pos.push(p);
                seq.rollout_logp.push(lq);
            }
        }
    }
    out.extend(cur);
    out.retain(|s| !s.policy_pos.is_empty());
    Ok(out)
}

/// A trajectory's turns in H0's re-rendered contexts (the `h0` rescue objective): the generated
/// tokens and their rollout log-probs stay; `contexts[k]` replaces turn `k`'s context.
fn h0_turns(
    group: usize,
    trajectory: usize,
    turns: &[TurnTokens],
    contexts: &[Vec<u32>],
) -> Result<Vec<TurnTokens>> {
    if contexts.len() != turns.len() {
        return Err(Error::Msg(format!(
            "group {group}, trajectory {trajectory}: {} H0 contexts for {} turns; expected one per turn",
            contexts.len(),
            turns.len()
        )));
    }
    turns
        .iter()
        .zip(contexts)
        .enumerate()
        .map(|(k, (t, c))| {
            if !t.tokens.is_empty() && c.is_empty() {
                return Err(Error::Msg(format!(
                    "group {group}, trajectory {trajectory}, turn {k}: generated tokens but no H0 context"
                )));
            }
            Ok(TurnTokens {
                context: c.clone(),
                tokens: t.tokens.clone(),
                logprobs: t.logprobs.clone(),
            })
        })
        .collect()
}

/// Splits sequence indices into micro-batches of at most `budget` padded tokens (the model sees
/// `len - 1` positions of each sequence), longest first.
pub(crate) fn micro_batches(seqs: &[Sequence], idx: &[usize], budget: usize) -> Vec<Vec<usize>> {
    let mut order: Vec<usize> = idx.to_vec();
    order.sort_by(|&a, &b| seqs[b].ids.len().cmp(&seqs[a].ids.len()).then(a.cmp(&b)));
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut cur: Vec<usize> = Vec::new();
    let mut cur_max = 0usize;
    for i in order {
        let len = seqs[i].ids.len() - 1;
        let new_max = cur_max.max(len);
        if !cur.is_empty() && new_max * (cur.len() + 1) > budget {
            out.push(std::mem::take(&mut cur));
            cur_max = 0;
        }
        cur_max = cur_max.max(len);
        cur.push(i);
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// Per-parameter AdamW state.
pub(crate) struct Moments {
    pub(crate) m: Tensor,
    pub(crate) v: Tensor,
}

/// The optimizer settings an update needs (shared by the GRPO and supervised trainers).
pub(crate) struct Optim<'a> {
    pub(crate) adamw: &'a AdamWConfig,
    pub(crate) schedule: &'a Schedule,
    pub(crate) max_grad_norm: Option<f64>,
}

/// Clips the accumulated gradient to `optim.max_grad_norm` and applies one AdamW update with
/// decoupled weight decay (1-D parameters undecayed unless `decay_1d`) at the schedule's rate for
/// `*step`, which it advances. Returns (lr, grad norm before clipping).
pub(crate) fn apply_adamw(
    vars: &[(String, Var)],
    moments: &mut [Moments],
    step: &mut u64,
    optim: &Optim<'_>,
    grads: Vec<Option<Tensor>>,
) -> Result<(f64, f64)> {
    let mut sq = 0.0f64;
    for g in grads.iter().flatten() {
        sq += sum_of_squares(g)?;
    }
    let norm = sq.sqrt();
    let grad_scale = match optim.max_grad_norm {
        Some(max) if norm > max => max / (norm + 1e-6),
        _ => 1.0,
    };
    let lr = optim.schedule.lr_at(*step);
    *step += 1;
    let a = optim.adamw;
    let t = *step as i32;
    for (k, g) in grads.into_iter().enumerate() {
        let Some(g) = g else { continue };
        let (_, var) = &vars[k];
        let decay = a.weight_decay != 0.0 && (a.decay_1d || var.rank() >= 2);
        let h = AdamStep {
            beta1: a.beta1,
            beta2: a.beta2,
            eps: a.eps,
            lr,
            decay_factor: if decay {
                1.0 - lr * a.weight_decay
            } else {
                1.0
            },
            bc1: 1.0 - a.beta1.powi(t),
            bc2: 1.0 - a.beta2.powi(t),
            grad_scale,
        };
        let st = &mut moments[k];
        let (theta, m, v) = match adamw_cpu(var.as_tensor(), &g, &st.m, &st.v, &h)? {
            Some(out) => out,
            None => adamw_tensor(var.as_tensor(), &g, &st.m, &st.v, &h)?,
        };
        st.m = m;
        st.v = v;
        var.set(&theta)?;
    }
    Ok((lr, norm))
}

/// Log-probs and entropies of the scored tokens of sequences `mb`, concatenated in order: a
/// right-padded batch where the hidden state at `p - 1` predicts the token at `p`, with the
/// logits divided by `temperature`.
pub(crate) fn score_sequences(
    model: &dyn TrainableLm,
    seqs: &[Sequence],
    mb: &[usize],
    logprob: &LogProbConfig,
    temperature: f64,
) -> Result<(Tensor, Tensor)> {
    let weight = model.lm_head_weight();
    let dev = weight.device().clone();
    let width = mb.iter().map(|&i| seqs[i].ids.len() - 1).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(mb.len() * width);
    let mut rows = Vec::new();
    let mut targets = Vec::new();
    for (b, &i) in mb.iter().enumerate() {
        let s = &seqs[i];
        ids.extend_from_slice(&s.ids[..s.ids.len() - 1]);
        ids.extend(std::iter::repeat_n(0u32, width - (s.ids.len() - 1)));
        for &p in &s.policy_pos {
            // The hidden state at p - 1 predicts the token at p.
            rows.push((b * width + p - 1) as u32);
            targets.push(s.ids[p]);
        }
    }
    let input = Tensor::from_vec(ids, (mb.len(), width), &dev)?;
    let hidden = model.hidden_states(&input)?;
    let h = hidden.dim(2)?;
    let hidden = hidden.reshape((mb.len() * width, h))?;
    let n = rows.len();
    let rows = Tensor::from_vec(rows, n, &dev)?;
    let targets = Tensor::from_vec(targets, n, &dev)?;
    let mut picked = hidden.index_select(&rows, 0)?;
    if temperature != 1.0 {
        // (h / T) W^T = (h W^T) / T.
        picked = (picked * (1.0 / temperature))?;
    }
    let out = token_logprobs(&picked, &weight, &targets, logprob)?;
    Ok((out.logp, out.entropy))
}

/// What one micro-batch's forward and backward pass contributes to an update.
struct MicroBatchResult {
    loss: f64,
    stats: LossStats,
    guide_stats: GuideStats,
    entropy_sum: f64,
    /// Per trainable variable, in the trainer's order.
    grads: Vec<Option<Tensor>>,
}

/// Everything a micro-batch pass reads; shared by passes running at once.
struct MicroBatchPass<'a> {
    model: &'a dyn TrainableLm,
    seqs: &'a [Sequence],
    vars: &'a [(String, Var)],
    cfg: &'a TrainerConfig,
    /// `pi_old` per sequence for mini-batches after the first (`None`: on-policy, the pass's own
    /// detached log-probs).
    old_logp: Option<&'a HashMap<usize, Vec<f32>>>,
    coef_of: &'a (dyn Fn(&Sequence) -> f32 + Sync),
    /// Guide's `gamma` for the `h0` rescue objective's tokens (`None`: the batch has none).
    gamma: Option<f64>,
}

impl MicroBatchPass<'_> {
    fn run(&self, mb: &[usize]) -> Result<MicroBatchResult> {
        let (seqs, cfg) = (self.seqs, self.cfg);
        let (logp_new, entropy) =
            score_sequences(self.model, seqs, mb, &cfg.logprob, cfg.temperature)?;
        let dev = logp_new.device().clone();
        let logp_old = match self.old_logp {
            None => logp_new.detach().to_dtype(DType::F32)?,
            Some(old) => {
                let v: Vec<f32> = mb.iter().flat_map(|i| old[i].iter().copied()).collect();
                let n = v.len();
                Tensor::from_vec(v, n, &dev)?
            }
        };
        let mut q = Vec::new();
        let mut a = Vec::new();
        let mut c = Vec::new();
        let mut guide_pos = Vec::new();
        for &i in mb {
            let s = &seqs[i];
            if s.guide {
                guide_pos.extend((q.len()..q.len() + s.policy_pos.len()).map(|p| p as u32));
            }
            q.extend_from_slice(&s.rollout_logp);
            a.extend(std::iter::repeat_n(s.advantage, s.policy_pos.len()));
            c.extend(std::iter::repeat_n((self.coef_of)(s), s.policy_pos.len()));
        }
        let t = q.len();
        let mut guide_stats = GuideStats::default();
        let (loss, stats) = if guide_pos.is_empty() {
            let terms = TokenTerms {
                logp_old,
                logp_rollout: Tensor::from_vec(q, t, &dev)?,
                advantage: Tensor::from_vec(a, t, &dev)?,
                coef: Tensor::from_vec(c, t, &dev)?,
            };
            grpo_loss(&logp_new, &terms, &cfg.grpo)?
        } else {
            // The micro-batch mixes the paper's tokens and the `h0` objective's: each part
            // through its own loss, selected by position (index_select keeps the gradient).
            let is_guide: std::collections::HashSet<u32> = guide_pos.iter().copied().collect();
            let paper_pos: Vec<u32> = (0..t as u32).filter(|p| !is_guide.contains(p)).collect();
            let pick = |v: &[f32], pos: &[u32]| -> Vec<f32> {
                pos.iter().map(|&p| v[p as usize]).collect()
            };
            let gather = |x: &Tensor, pos: &[u32]| -> candle_core::Result<Tensor> {
                x.contiguous()?
                    .index_select(&Tensor::from_vec(pos.to_vec(), pos.len(), &dev)?, 0)
            };
            let gamma = self.gamma.ok_or_else(|| {
                Error::Msg("internal: h0 tokens in a micro-batch but no gamma".into())
            })?;
            let (n_g, n_p) = (guide_pos.len(), paper_pos.len());
            let guide_terms = GuideTerms {
                logp_behaviour: Tensor::from_vec(pick(&q, &guide_pos), n_g, &dev)?,
                advantage: Tensor::from_vec(pick(&a, &guide_pos), n_g, &dev)?,
                coef: Tensor::from_vec(pick(&c, &guide_pos), n_g, &dev)?,
            };
            let (g_loss, g_stats) =
                guide_loss(&gather(&logp_new, &guide_pos)?, &guide_terms, gamma)?;
            guide_stats = g_stats;
            let terms = TokenTerms {
                logp_old: if paper_pos.is_empty() {
                    logp_old.narrow(0, 0, 0)?
                } else {
                    gather(&logp_old, &paper_pos)?
                },
                logp_rollout: Tensor::from_vec(pick(&q, &paper_pos), n_p, &dev)?,
                advantage: Tensor::from_vec(pick(&a, &paper_pos), n_p, &dev)?,
                coef: Tensor::from_vec(pick(&c, &paper_pos), n_p, &dev)?,
            };
            if paper_pos.is_empty() {
                (g_loss, LossStats::default())
            } else {
                let (p_loss, p_stats) =
                    grpo_loss(&gather(&logp_new, &paper_pos)?, &terms, &cfg.grpo)?;
                ((p_loss + g_loss)?, p_stats)
            }
        };
        let entropy_sum = entropy
            .to_dtype(DType::F64)?
            .sum_all()?
            .to_scalar::<f64>()?;
        let loss_value = loss.to_dtype(DType::F64)?.to_scalar::<f64>()?;
        let grads = loss.backward()?;
        Ok(MicroBatchResult {
            loss: loss_value,
            stats,
            guide_stats,
            entropy_sum,
            grads: self
                .vars
                .iter()
                .map(|(_, var)| grads.get(var.as_tensor()).cloned())
                .collect(),
        })
    }
}

/// The GRPO trainer: optimizer state, step counter and RNG around a model's [`Var`]s.
pub struct Trainer {
    cfg: TrainerConfig,
    vars: Vec<(String, Var)>,
    moments: Vec<Moments>,
    step: u64,
    rng: ChaCha8Rng,
}

/// File names inside a checkpoint folder.
const STATE_JSON: &str = "trainer_state.json";
const OPTIMIZER_FILE: &str = "optimizer.safetensors";

#[derive(Serialize, Deserialize)]
struct SavedState {
    step: u64,
    rng_seed: [u8; 32],
    rng_stream: u64,
    rng_word_pos: u128,
    config: TrainerConfig,
    var_names: Vec<String>,
}

impl Trainer {
    /// A fresh trainer for `model`'s parameters.
    pub fn new(model: &dyn TrainableLm, cfg: TrainerConfig) -> Result<Self> {
        let vars = model.trainable_vars();
        let mut seen = std::collections::HashSet::new();
        for (name, _) in &vars {
            if !seen.insert(name.as_str()) {
                return Err(Error::Msg(format!(
                    "trainable variable `{name}` appears twice"
                )));
            }
        }
        if !(cfg.temperature > 0.0 && cfg.temperature.is_finite()) {
            return Err(Error::Msg(format!(
                "trainer config: temperature must be positive, got {}",
                cfg.temperature
            )));
        }
        if cfg.micro_batch_tokens == 0 || cfg.updates_per_step == 0 {
            return Err(Error::Msg(format!(
                "trainer config: micro_batch_tokens ({}) and updates_per_step ({}) must be positive",
                cfg.micro_batch_tokens, cfg.updates_per_step
            )));
        }
        let moments = vars
            .iter()
            .map(|(_, v)| {
                let z = v.as_tensor().zeros_like()?;
                Ok(Moments { m: z.clone(), v: z })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(Self {
            cfg,
            vars,
            moments,
            step: 0,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
        })
    }

    /// Updates done so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// The configuration.
    pub fn config(&self) -> &TrainerConfig {
        &self.cfg
    }

    /// One GRPO step on harness-core groups. Refuses, before changing anything, groups whose
    /// turns were sampled with settings the trainer's `pi_old` does not describe (see "Which q"
    /// in the module docs), or whose settings were not recorded.
    pub fn step(
        &mut self,
        model: &dyn TrainableLm,
        groups: &[harness_core::Group],
    ) -> Result<StepMetrics> {
        self.step_scored(model, groups, &[])
    }

    /// [`Trainer::step`] with each trajectory's tokens scored as `scoring[g][j]` says (the
    /// rescue objectives of [`harness_core::objective`]); an empty `scoring` is the paper's
    /// objective for every trajectory.
    pub fn step_scored(
        &mut self,
        model: &dyn TrainableLm,
        groups: &[harness_core::Group],
        scoring: &[Vec<TokenScoring>],
    ) -> Result<StepMetrics> {
        let vocab = model.lm_head_weight().dim(0)?;
        self.check_sampling(groups, vocab)?;
        let tasks: Vec<TaskRollouts> = groups.iter().map(TaskRollouts::from).collect();
        self.step_scored_rollouts(model, &tasks, scoring)
    }

    /// Checks that every turn with tokens was sampled at the trainer's temperature, without
    /// greedy decoding or truncation, so that Eq. 16's `pi_old / q` is an importance weight.
    pub fn check_sampling(&self, groups: &[harness_core::Group], vocab: usize) -> Result<()> {
        let want = self.cfg.temperature;
        for (g, group) in groups.iter().enumerate() {
            for (j, t) in group.trajectories.iter().enumerate() {
                for (k, turn) in t.turns.iter().enumerate() {
                    if turn.tokens.is_empty() {
                        continue;
                    }
                    let fail = |field: &str, message: String| Error::Rollout {
                        location: format!(
                            "group {g} (task `{}`), trajectory {j} (harness `{}`, seed {}), `turns[{k}].{field}`",
                            group.task.id, t.harness_name, t.seed
                        ),
                        message,
                    };
                    let Some(s) = turn.sampling else {
                        return Err(fail(
                            "sampling",
                            format!(
                                "no sampling settings recorded (a trajectory written before they were); expected temperature {want} without top-p or top-k, as the trainer's pi_old"
                            ),
                        ));
                    };
                    if s.greedy {
                        return Err(fail(
                            "sampling.greedy",
                            format!(
                                "greedy decoding records log q = 0 (a point mass), so pi_old / q is no importance weight; expected sampling at temperature {want}"
                            ),
                        ));
                    }
                    if s.top_p < 1.0 {
                        return Err(fail(
                            "sampling.top_p",
                            format!(
                                "top_p {}: q is renormalised over the nucleus while the trainer's pi_old is not truncated; expected top_p = 1",
                                s.top_p
                            ),
                        ));
                    }
                    if let Some(top_k) = s.top_k.filter(|&top_k| top_k < vocab) {
                        return Err(fail(
                            "sampling.top_k",
                            format!(
                                "top_k {top_k} (vocabulary {vocab}): q is renormalised over the top k while the trainer's pi_old is not truncated; expected no top_k"
                            ),
                        ));
                    }
                    let got = f64::from(s.temperature);
                    if (got - want).abs() > 1e-6 * want.max(1.0) {
                        return Err(fail(
                            "sampling.temperature",
                            format!(
                                "sampled at temperature {got} but the trainer computes pi_old at {want}; set TrainerConfig::temperature to the rollout temperature"
                            ),
                        ));
                    }
                }
            }
        }
        Ok(())
    }

    /// One GRPO step on plain rollouts (what [`Trainer::step`] converts groups into). The
    /// rollout log-probs cannot be checked here: they must be at the trainer's temperature
    /// over the full vocabulary.
    pub fn step_rollouts(
        &mut self,
        model: &dyn TrainableLm,
        tasks: &[TaskRollouts],
    ) -> Result<StepMetrics> {
        self.step_scored_rollouts(model, tasks, &[])
    }

    /// [`Trainer::step_rollouts`] with per-trajectory scoring (see [`Trainer::step_scored`]).
    ///
    /// * [`TokenScoring::FromTurn`] (`masked`): the turns before `first_turn` stay in the
    ///   packed context but are not scored; they leave `N_x` of Eq. 15.
    /// * [`TokenScoring::H0`] (`h0`): the turns are packed in H0's re-rendered contexts and
    ///   their tokens enter [`guide_loss`] with the ratio to the recorded rollout log-prob `q`
    ///   (the sampler under the sibling's context; the trainer's temperature and no truncation
    ///   are checked by [`Trainer::step_scored`] as for every turn). Using `q` rather than a
    ///   forward pass of the pre-update weights in the sibling's context avoids a second pass
    ///   over every rescued token, and is exactly `pi_old(y | c_H)` on-policy (the paper's
    ///   setting of one update per batch); the Eq. 16 weight is then 1 and is not applied.
    ///   Guide's `gamma` is the 90th percentile of these tokens' ratios over the whole batch,
    ///   from one forward-only pass with the weights at the start of the step. They count in
    ///   `N_x` like any scored token (Eq. 15).
    pub fn step_scored_rollouts(
        &mut self,
        model: &dyn TrainableLm,
        tasks: &[TaskRollouts],
        scoring: &[Vec<TokenScoring>],
    ) -> Result<StepMetrics> {
        if !scoring.is_empty() {
            if scoring.len() != tasks.len() {
                return Err(Error::Msg(format!(
                    "scoring for {} groups but {} groups",
                    scoring.len(),
                    tasks.len()
                )));
            }
            for (x, (s, t)) in scoring.iter().zip(tasks).enumerate() {
                if s.len() != t.rollouts.len() {
                    return Err(Error::Msg(format!(
                        "group {x}: scoring for {} trajectories but {} trajectories",
                        s.len(),
                        t.rollouts.len()
                    )));
                }
            }
        }
        let started = Instant::now();
        let mut metrics = StepMetrics {
            groups: tasks.len(),
            ..StepMetrics::default()
        };
        // 1-2. Sequences, advantages, N_x.
        let mut seqs: Vec<Sequence> = Vec::new();
        let mut task_tokens = vec![0usize; tasks.len()];
        for (x, task) in tasks.iter().enumerate() {
            let rewards: Vec<f32> = task.rollouts.iter().map(|r| r.reward).collect();
            let succ = rewards.iter().filter(|&&r| r > 0.0).count();
            let effective = succ > 0 && succ < rewards.len();
            metrics.effective_groups += effective as usize;
            let adv = group_advantages(&rewards, self.cfg.grpo.adv_eps);
            for (j, (r, &a)) in task.rollouts.iter().zip(&adv).enumerate() {
                let how = scoring.get(x).and_then(|g| g.get(j));
                let packed = match how {
                    None | Some(TokenScoring::Generating) => pack_turns(x, a, &r.turns)?,
                    Some(TokenScoring::FromTurn { first_turn }) => {
                        metrics.masked_tokens += r.turns[..(*first_turn).min(r.turns.len())]
                            .iter()
                            .map(|t| t.tokens.len())
                            .sum::<usize>();
                        pack_turns_from(x, a, &r.turns, *first_turn, false)?
                    }
                    Some(TokenScoring::H0 { contexts }) => {
                        let turns = h0_turns(x, j, &r.turns, contexts)?;
                        pack_turns_from(x, a, &turns, 0, true)?
                    }
                };
                for s in packed {
                    if s.guide {
                        metrics.h0_tokens += s.policy_pos.len();
                    }
                    task_tokens[x] += s.policy_pos.len();
                    if effective {
                        metrics.effective_policy_tokens += s.policy_pos.len();
                    }
                    seqs.push(s);
                }
            }
        }
        metrics.sequences = seqs.len();
        metrics.policy_tokens = task_tokens.iter().sum();
        metrics.sequence_tokens = seqs.iter().map(|s| s.ids.len() - 1).sum();

        // 3. Mini-batches of groups.
        let n_updates = self.cfg.updates_per_step.min(tasks.len()).max(1);
        if seqs.is_empty() {
            // Nothing to score (no groups, or no generated tokens): no update, no step.
            tracing::warn!(
                "GRPO step: no scored tokens in {} groups; no optimizer update",
                tasks.len()
            );
            metrics.skipped_updates = n_updates;
            metrics.step = self.step;
            metrics.seconds = started.elapsed().as_secs_f64();
            return Ok(metrics);
        }
        let mut order: Vec<usize> = (0..tasks.len()).collect();
        if n_updates > 1 {
            order.shuffle(&mut self.rng);
        }
        let mut mb_of_task = vec![0usize; tasks.len()];
        let mut mb_tasks = vec![0usize; n_updates];
        for (k, &x) in order.iter().enumerate() {
            let mb = k * n_updates / tasks.len().max(1);
            mb_of_task[x] = mb;
            mb_tasks[mb] += 1;
        }
        // Eq. 15 per mini-batch: coefficient 1 / (|B_mb| N_x).
        let coef_of = |s: &Sequence| -> f32 {
            let b = mb_tasks[mb_of_task[s.task]] as f64;
            (1.0 / (b * task_tokens[s.task] as f64)) as f32
        };
        let mut mb_seqs: Vec<Vec<usize>> = vec![Vec::new(); n_updates];
        for (i, s) in seqs.iter().enumerate() {
            mb_seqs[mb_of_task[s.task]].push(i);
        }
        let real_updates = mb_seqs.iter().filter(|idx| !idx.is_empty()).count();
        metrics.skipped_updates = n_updates - real_updates;
        if metrics.skipped_updates > 0 {
            tracing::warn!(
                "GRPO step: {} of {n_updates} mini-batches have no scored tokens; no optimizer update for them",
                metrics.skipped_updates
            );
        }

        // 4. pi_old for mini-batches after the first.
        let mut old_logp: HashMap<usize, Vec<f32>> = HashMap::new();
        if n_updates > 1 {
            metrics.old_logprob_pass = true;
            let later: Vec<usize> = mb_seqs[1..].iter().flatten().copied().collect();
            for mb in micro_batches(&seqs, &later, self.cfg.micro_batch_tokens) {
                let (lp, _) =
                    score_sequences(model, &seqs, &mb, &self.cfg.logprob, self.cfg.temperature)?;
                let lp: Vec<f32> = lp.detach().to_dtype(DType::F32)?.to_vec1()?;
                let mut off = 0;
                for &i in &mb {
                    let n = seqs[i].policy_pos.len();
                    old_logp.insert(i, lp[off..off + n].to_vec());
                    off += n;
                }
            }
        }

        // Guide's gamma for the `h0` tokens: the batch's 90th percentile of their ratios under
        // the weights at the start of the step (a forward-only pass, detached).
        let guide_seqs: Vec<usize> = (0..seqs.len()).filter(|&i| seqs[i].guide).collect();
        let gamma = if guide_seqs.is_empty() {
            None
        } else {
            let mut ratios = Vec::with_capacity(metrics.h0_tokens);
            for mb in micro_batches(&seqs, &guide_seqs, self.cfg.micro_batch_tokens) {
                let (lp, _) =
                    score_sequences(model, &seqs, &mb, &self.cfg.logprob, self.cfg.temperature)?;
                let lp: Vec<f32> = lp.detach().to_dtype(DType::F32)?.to_vec1()?;
                let q = mb
                    .iter()
                    .flat_map(|&i| seqs[i].rollout_logp.iter().copied());
                ratios.extend(lp.iter().zip(q).map(|(&n, q)| f64::from(n - q).exp()));
            }
            // All ratios underflowing to 0 would give gamma 0 (r / (r + 0) is undefined there).
            let gamma = quantile(&ratios, GUIDE_PERCENTILE)
                .unwrap_or(1.0)
                .max(f64::MIN_POSITIVE);
            metrics.h0_gamma = gamma;
            Some(gamma)
        };

        let mut stats = LossStats::default();
        let mut guide_stats = GuideStats::default();
        let mut entropy_sum = 0.0f64;
        let parallel = self
            .cfg
            .micro_batches_at_once(model.lm_head_weight().device());
        for (u, idx) in mb_seqs.iter().enumerate() {
            if idx.is_empty() {
                // Eq. 15 gives these tasks no gradient. An AdamW step would still advance the
                // schedule and the bias correction `1 - beta^t` and decay the weights, for nothing.
                continue;
            }
            let mut acc: Vec<Option<Tensor>> = vec![None; self.vars.len()];
            let mut loss_total = 0.0f64;
            let mbs = micro_batches(&seqs, idx, self.cfg.micro_batch_tokens);
            let pass = MicroBatchPass {
                model,
                seqs: &seqs,
                vars: &self.vars,
                cfg: &self.cfg,
                old_logp: (u > 0).then_some(&old_logp),
                coef_of: &coef_of,
                gamma,
            };
            // Up to `parallel` micro-batches at a time; results are merged in micro-batch order,
            // so the update does not depend on how many ran at once.
            for wave in mbs.chunks(parallel) {
                let results: Vec<Result<MicroBatchResult>> = if wave.len() > 1 {
                    use rayon::prelude::*;
                    wave.par_iter().map(|mb| pass.run(mb)).collect()
                } else {
                    wave.iter().map(|mb| pass.run(mb)).collect()
                };
                for r in results {
                    let r = r?;
                    metrics.micro_batches += 1;
                    stats.merge(&r.stats);
                    guide_stats.merge(&r.guide_stats);
                    entropy_sum += r.entropy_sum;
                    loss_total += r.loss;
                    for (slot, g) in acc.iter_mut().zip(r.grads) {
                        if let Some(g) = g {
                            *slot = Some(match slot.take() {
                                Some(prev) => (prev + g)?,
                                None => g,
                            });
                        }
                    }
                }
            }
            let opt_started = Instant::now();
            let updated = self.apply_update(acc);
            // Even a failed update may have changed some variables.
            model.weights_changed();
            let (lr, gn) = updated?;
            metrics.optimizer_seconds += opt_started.elapsed().as_secs_f64();
            metrics.lr = lr;
            metrics.grad_norm += gn / real_updates as f64;
            metrics.loss += loss_total / real_updates as f64;
            metrics.updates += 1;
        }
        let tok = stats.tokens.max(1) as f64;
        if guide_stats.tokens > 0 {
            metrics.h0_ratio_mean = guide_stats.ratio_sum / guide_stats.tokens as f64;
        }
        metrics.entropy_mean = entropy_sum / (stats.tokens + guide_stats.tokens).max(1) as f64;
        metrics.step = self.step;
        metrics.clip_frac_low = stats.clipped_low as f64 / tok;
        metrics.clip_frac_high = stats.clipped_high as f64 / tok;
        metrics.ratio_mean = stats.ratio_sum / tok;
        metrics.ratio_min = stats.ratio_min;
        metrics.ratio_max = stats.ratio_max;
        metrics.weight_mean = stats.weight_sum / tok;
        metrics.weight_min = stats.weight_min;
        metrics.weight_max = stats.weight_max;
        metrics.weight_clip_frac = stats.weight_clipped as f64 / tok;
        metrics.seconds = started.elapsed().as_secs_f64();
        Ok(metrics)
    }

    /// Clips the accumulated gradient and applies AdamW; returns (lr, grad norm before clipping).
    fn apply_update(&mut self, grads: Vec<Option<Tensor>>) -> Result<(f64, f64)> {
        let optim = Optim {
            adamw: &self.cfg.adamw,
            schedule: &self.cfg.schedule,
            max_grad_norm: self.cfg.max_grad_norm,
        };
        apply_adamw(&self.vars, &mut self.moments, &mut self.step, &optim, grads)
    }

    /// Writes a checkpoint folder: the model through `save_model` (e.g. the HF writer), the
    /// optimizer moments, the step and the RNG state. The folder appears complete or not at all:
    /// everything is written to `<dir>.partial` and renamed into place.
    pub fn save_checkpoint(
        &self,
        dir: &Path,
        save_model: impl FnOnce(&Path) -> Result<()>,
    ) -> Result<()> {
        let tmp = sibling(dir, "partial");
        if tmp.exists() {
            std::fs::remove_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        }
        std::fs::create_dir_all(&tmp).map_err(|e| Error::io(&tmp, e))?;
        save_model(&tmp)?;
        let mut tensors: HashMap<String, Tensor> = HashMap::new();
        for ((name, _), st) in self.vars.iter().zip(&self.moments) {
            tensors.insert(format!("m.{name}"), st.m.clone());
            tensors.insert(format!("v.{name}"), st.v.clone());
        }
        let opt_path = tmp.join(OPTIMIZER_FILE);
        candle_core::safetensors::save(&tensors, &opt_path)?;
        let state = SavedState {
            step: self.step,
            rng_seed: self.rng.get_seed(),
            rng_stream: self.rng.get_stream(),
            rng_word_pos: self.rng.get_word_pos(),
            config: self.cfg,
            var_names: self.vars.iter().map(|(n, _)| n.clone()).collect(),
        };
        let json = serde_json::to_string_pretty(&state)
            .map_err(|e| Error::Msg(format!("serialising trainer state: {e}")))?;
        crate::model::loading::write_atomic(&tmp.join(STATE_JSON), json.as_bytes())?;
        // Swap the finished folder into place.
        let old = sibling(dir, "old");
        if dir.exists() {
            if old.exists() {
                std::fs::remove_dir_all(&old).map_err(|e| Error::io(&old, e))?;
            }
            std::fs::rename(dir, &old).map_err(|e| Error::io(dir, e))?;
        }
        std::fs::rename(&tmp, dir).map_err(|e| Error::io(dir, e))?;
        if old.exists() {
            std::fs::remove_dir_all(&old).map_err(|e| Error::io(&old, e))?;
        }
        Ok(())
    }

    /// A trainer continuing from a checkpoint folder written by [`Trainer::save_checkpoint`].
    /// `model` must already hold the checkpoint's weights (load them from the same folder).
    /// The saved configuration is used, except the log-prob chunking from `logprob`.
    pub fn resume(model: &dyn TrainableLm, dir: &Path, logprob: LogProbConfig) -> Result<Self> {
        let state_path = dir.join(STATE_JSON);
        let text = std::fs::read_to_string(&state_path).map_err(|e| Error::io(&state_path, e))?;
        let state: SavedState = serde_json::from_str(&text)
            .map_err(|e| Error::config(&state_path, "(root)", e.to_string()))?;
        let mut cfg = state.config;
        cfg.logprob = logprob;
        let mut trainer = Trainer::new(model, cfg)
            .map_err(|e| Error::config(&state_path, "config", e.to_string()))?;
        let names: Vec<&String> = trainer.vars.iter().map(|(n, _)| n).collect();
        if names.len() != state.var_names.len()
            || names.iter().zip(&state.var_names).any(|(a, b)| *a != b)
        {
            return Err(Error::config(
                &state_path,
                "var_names",
                "the model's trainable variables differ from the checkpoint's",
            ));
        }
        let opt_path = dir.join(OPTIMIZER_FILE);
        let dev = trainer
            .vars
            .first()
            .map(|(_, v)| v.device().clone())
            .unwrap_or(Device::Cpu);
        // Read through the checkpoint loader: errors name the file, and a malformed one is an
        // error rather than a panic inside the safetensors reader.
        let wanted = trainer
            .vars
            .iter()
            .flat_map(|(name, _)| [format!("m.{name}"), format!("v.{name}")])
            .collect();
        let tensors =
            crate::model::loading::load_tensors(std::slice::from_ref(&opt_path), &wanted, &dev)?;
        for ((name, var), st) in trainer.vars.iter().zip(trainer.moments.iter_mut()) {
            for (prefix, slot) in [("m", &mut st.m), ("v", &mut st.v)] {
                let key = format!("{prefix}.{name}");
                let t = tensors.get(&key).ok_or_else(|| Error::Weights {
                    path: opt_path.clone(),
                    name: key.clone(),
                    message: "missing".into(),
                })?;
                if t.dims() != var.dims() || t.dtype() != var.dtype() {
                    return Err(Error::Weights {
                        path: opt_path.clone(),
                        name: key,
                        message: format!(
                            "expected {:?} {:?}, found {:?} {:?}",
                            var.dims(),
                            var.dtype(),
                            t.dims(),
                            t.dtype()
                        ),
                    });
                }
                *slot = t.clone();
            }
        }
        trainer.step = state.step;
        let mut rng = ChaCha8Rng::from_seed(state.rng_seed);
        rng.set_stream(state.rng_stream);
        rng.set_word_pos(state.rng_word_pos);
        trainer.rng = rng;
        Ok(trainer)
    }
}

/// One AdamW update's scalars (decoupled decay as in `torch.optim.AdamW`).
#[derive(Debug, Clone, Copy)]
struct AdamStep {
    beta1: f64,
    beta2: f64,
    eps: f64,
    lr: f64,
    /// `1 - lr * weight_decay`, or 1 where the parameter is not decayed.
    decay_factor: f64,
    /// Bias corrections `1 - beta^t`.
    bc1: f64,
    bc2: f64,
    /// Gradient-clipping factor.
    grad_scale: f64,
}

/// `sum g^2` in f64.
fn sum_of_squares(g: &Tensor) -> candle_core::Result<f64> {
    if g.device().is_cpu() && g.dtype() == DType::F32 {
        return cpu_slice::<f32, f64>(g, |x| Ok(x.iter().map(|&v| (v as f64) * (v as f64)).sum()));
    }
    g.to_dtype(DType::F64)?.sqr()?.sum_all()?.to_scalar::<f64>()
}

/// AdamW with tensor ops (any device and dtype): returns new (theta, m, v).
fn adamw_tensor(
    theta: &Tensor,
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
    h: &AdamStep,
) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let g = if h.grad_scale != 1.0 {
        (g * h.grad_scale)?
    } else {
        g.clone()
    };
    let m = ((m * h.beta1)? + (&g * (1.0 - h.beta1))?)?;
    let v = ((v * h.beta2)? + (g.sqr()? * (1.0 - h.beta2))?)?;
    let theta = if h.decay_factor != 1.0 {
        (theta * h.decay_factor)?
    } else {
        theta.clone()
    };
    let denom = ((&v / h.bc2)?.sqrt()? + h.eps)?;
    let update = ((&m / h.bc1)? / denom)?;
    let theta = (theta - (update * h.lr)?)?;
    Ok((theta, m, v))
}

/// The same update fused into one pass over contiguous f32/f64 CPU buffers (the tensor version
/// makes about a dozen passes, each allocating a parameter-sized buffer). `None` elsewhere.
fn adamw_cpu(
    theta: &Tensor,
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
    h: &AdamStep,
) -> candle_core::Result<Option<(Tensor, Tensor, Tensor)>> {
    let all_cpu = [theta, g, m, v].iter().all(|t| t.device().is_cpu());
    let same = [g, m, v].iter().all(|t| t.dtype() == theta.dtype());
    if !all_cpu || !same {
        return Ok(None);
    }
    match theta.dtype() {
        DType::F32 => adamw_cpu_typed::<f32>(theta, g, m, v, h).map(Some),
        DType::F64 => adamw_cpu_typed::<f64>(theta, g, m, v, h).map(Some),
        _ => Ok(None),
    }
}

fn adamw_cpu_typed<T: WithDType + num_traits::Float>(
    theta: &Tensor,
    g: &Tensor,
    m: &Tensor,
    v: &Tensor,
    h: &AdamStep,
) -> candle_core::Result<(Tensor, Tensor, Tensor)> {
    let n = theta.elem_count();
    let mut new_theta = vec![T::zero(); n];
    let mut new_m = vec![T::zero(); n];
    let mut new_v = vec![T::zero(); n];
    let c = |x: f64| T::from_f64(x);
    let (b1, b2, eps, lr) = (c(h.beta1), c(h.beta2), c(h.eps), c(h.lr));
    let (one_b1, one_b2) = (c(1.0 - h.beta1), c(1.0 - h.beta2));
    let (df, bc1, bc2, gs) = (c(h.decay_factor), c(h.bc1), c(h.bc2), c(h.grad_scale));
    let scaled = h.grad_scale != 1.0;
    let decayed = h.decay_factor != 1.0;
    cpu_slice::<T, ()>(theta, |th| {
        cpu_slice::<T, ()>(g, |gr| {
            cpu_slice::<T, ()>(m, |mm| {
                cpu_slice::<T, ()>(v, |vv| {
                    let chunk = 1 << 14;
                    let outs: Vec<_> = new_theta
                        .chunks_mut(chunk)
                        .zip(new_m.chunks_mut(chunk))
                        .zip(new_v.chunks_mut(chunk))
                        .collect();
                    crate::ops::fused::par_each(outs, |i, ((ot, om), ov)| {
                        let r = i * chunk..(i * chunk + ot.len());
                        let (th, gr, mm, vv) =
                            (&th[r.clone()], &gr[r.clone()], &mm[r.clone()], &vv[r]);
                        for j in 0..ot.len() {
                            let gj = if scaled { gr[j] * gs } else { gr[j] };
                            let mj = mm[j] * b1 + gj * one_b1;
                            let vj = vv[j] * b2 + (gj * gj) * one_b2;
                            let tj = if decayed { th[j] * df } else { th[j] };
                            let denom = (vj / bc2).sqrt() + eps;
                            ot[j] = tj - ((mj / bc1) / denom) * lr;
                            om[j] = mj;
                            ov[j] = vj;
                        }
                    });
                    Ok(())
                })
            })
        })
    })?;
    let (shape, dev) = (theta.shape().clone(), theta.device().clone());
    Ok((
        Tensor::from_vec(new_theta, shape.clone(), &dev)?,
        Tensor::from_vec(new_m, shape.clone(), &dev)?,
        Tensor::from_vec(new_v, shape, &dev)?,
    ))
}

fn one() -> f64 {
    1.0
}

fn sibling(dir: &Path, suffix: &str) -> PathBuf {
    let mut name = dir
        .file_name()
        .map(|n| n.to_os_string())
        .unwrap_or_default();
    name.push(format!(".{suffix}"));
    dir.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn turn(context: &[u32], tokens: &[u32]) -> TurnTokens {
        TurnTokens {
            context: context.to_vec(),
            tokens: tokens.to_vec(),
            logprobs: tokens.iter().map(|&t| -(t as f32) / 10.0).collect(),
        }
    }

    #[test]
    fn extending_turns_are_packed_and_only_generated_tokens_are_scored() {
        // Turn 2's context is turn 1's context + tokens + an observation (7, 8).
        let turns = [turn(&[1, 2], &[3, 4]), turn(&[1, 2, 3, 4, 7, 8], &[5])];
        let seqs = pack_turns(0, 0.5, &turns).unwrap();
        assert_eq!(seqs.len(), 1);
        let s = &seqs[0];
        assert_eq!(s.ids, vec![1, 2, 3, 4, 7, 8, 5]);
        assert_eq!(s.policy_pos, vec![2, 3, 6]);
        assert_eq!(s.rollout_logp, vec![-0.3, -0.4, -0.5]);
        assert_eq!(s.advantage, 0.5);
    }

    #[test]
    fn a_turn_whose_context_was_rewritten_starts_a_new_sequence() {
        // A harness that truncates history: turn 2's context does not extend turn 1's.
        let turns = [
            turn(&[1, 2], &[3]),
            turn(&[1, 9, 3], &[4, 5]),
            turn(&[1, 9, 3, 4, 5, 6], &[7]),
        ];
        let seqs = pack_turns(2, -1.0, &turns).unwrap();
        assert_eq!(seqs.len(), 2);
        assert_eq!(seqs[0].ids, vec![1, 2, 3]);
        assert_eq!(seqs[0].policy_pos, vec![2]);
        assert_eq!(seqs[1].ids, vec![1, 9, 3, 4, 5, 6, 7]);
        assert_eq!(seqs[1].policy_pos, vec![3, 4, 6]);
        assert!(seqs.iter().all(|s| s.task == 2));
    }

    #[test]
    fn prefix_of_previous_turn_is_not_an_extension() {
        // Same context again (a retry): not an extension of context + tokens.
        let turns = [turn(&[1, 2], &[3]), turn(&[1, 2], &[4])];
        let seqs = pack_turns(0, 1.0, &turns).unwrap();
        assert_eq!(seqs.len(), 2);
    }

    #[test]
    fn unscorable_and_empty_turns_are_dropped_and_mismatches_rejected() {
        let seqs = pack_turns(0, 1.0, &[turn(&[], &[5, 6])]).unwrap();
        assert_eq!(seqs[0].policy_pos, vec![1]);
        assert!(pack_turns(0, 1.0, &[turn(&[1], &[])]).unwrap().is_empty());
        let mut bad = turn(&[1], &[2, 3]);
        bad.logprobs.pop();
        assert!(pack_turns(0, 1.0, &[bad]).is_err());
    }

    #[test]
    fn a_trailing_context_overflow_turn_is_not_packed() {
        // The last call's prompt overflowed: its whole context (turn 1 + a long observation)
        // is recorded with no tokens. Nothing of it may reach the model.
        let mut overflow = vec![1, 2, 3, 4];
        overflow.extend(10..40);
        let turns = [turn(&[1, 2], &[3, 4]), turn(&overflow, &[])];
        let seqs = pack_turns(0, 1.0, &turns).unwrap();
        assert_eq!(seqs.len(), 1);
        assert_eq!(seqs[0].ids, vec![1, 2, 3, 4]);
        assert_eq!(seqs[0].policy_pos, vec![2, 3]);
        // An overflow in the middle does not break the packing of the turns around it.
        let mut third = vec![1, 2, 3, 4, 7];
        third.push(8);
        let turns = [
            turn(&[1, 2], &[3, 4]),
            turn(&overflow, &[]),
            turn(&[1, 2, 3, 4, 7], &[8]),
        ];
        let seqs = pack_turns(0, 1.0, &turns).unwrap();
        assert_eq!(seqs.len(), 1);
        assert_eq!(seqs[0].ids, third);
        assert_eq!(seqs[0].policy_pos, vec![2, 3, 5]);
    }

    #[test]
    fn micro_batches_respect_the_padded_token_budget() {
        let lens = [10usize, 3, 7, 7, 2, 30];
        let seqs: Vec<Sequence> = lens
            .iter()
            .map(|&n| Sequence {
                task: 0,
                ids: vec![1; n + 1],
                policy_pos: vec![1],
                rollout_logp: vec![0.0],
                advantage: 0.0,
                guide: false,
            })
            .collect();
        let idx: Vec<usize> = (0..seqs.len()).collect();
        let mbs = micro_batches(&seqs, &idx, 20);
        let mut seen: Vec<usize> = mbs.iter().flatten().copied().collect();
        seen.sort();
        assert_eq!(seen, idx);
        for mb in &mbs {
            let width = mb.iter().map(|&i| lens[i]).max().unwrap();
            assert!(mb.len() == 1 || width * mb.len() <= 20, "{mb:?}");
        }
        assert_eq!(mbs[0], vec![5]); // the 30-token sequence alone
    }

    #[test]
    fn schedule_warms_up_then_decays() {
        let s = Schedule {
            lr: 1.0,
            warmup_steps: 4,
            total_steps: 14,
            decay: DecayKind::Cosine,
            min_lr_ratio: 0.1,
        };
        assert_eq!(s.lr_at(0), 0.25);
        assert_eq!(s.lr_at(3), 1.0);
        assert!((s.lr_at(4) - 1.0).abs() < 1e-12);
        assert!((s.lr_at(9) - 0.55).abs() < 1e-12);
        assert!((s.lr_at(14) - 0.1).abs() < 1e-12);
        assert!((s.lr_at(100) - 0.1).abs() < 1e-12);
        let lin = Schedule {
            decay: DecayKind::Linear,
            ..s
        };
        assert!((lin.lr_at(9) - 0.55).abs() < 1e-12);
        let c = Schedule {
            decay: DecayKind::Constant,
            ..s
        };
        assert_eq!(c.lr_at(50), 1.0);
    }

    #[test]
    fn fused_cpu_adamw_matches_the_tensor_version() {
        let dev = Device::Cpu;
        for dtype in [DType::F32, DType::F64] {
            let mk = |seed: u64| {
                use rand::Rng;
                let mut rng = ChaCha8Rng::seed_from_u64(seed);
                let v: Vec<f64> = (0..10_001).map(|_| rng.r#gen::<f64>() - 0.5).collect();
                Tensor::from_vec(v, (73, 137), &dev)
                    .unwrap()
                    .to_dtype(dtype)
                    .unwrap()
            };
            let (theta, g, m) = (mk(1), mk(2), mk(3));
            let v = mk(4).abs().unwrap();
            let h = AdamStep {
                beta1: 0.9,
                beta2: 0.999,
                eps: 1e-8,
                lr: 1e-3,
                decay_factor: 1.0 - 1e-3 * 0.1,
                bc1: 1.0 - 0.9f64.powi(3),
                bc2: 1.0 - 0.999f64.powi(3),
                grad_scale: 0.5,
            };
            let fused = adamw_cpu(&theta, &g, &m, &v, &h).unwrap().unwrap();
            let plain = adamw_tensor(&theta, &g, &m, &v, &h).unwrap();
            for (a, b) in [
                (&fused.0, &plain.0),
                (&fused.1, &plain.1),
                (&fused.2, &plain.2),
            ] {
                let d = (a - b)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .flatten_all()
                    .unwrap()
                    .max(0)
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap()
                    .to_scalar::<f64>()
                    .unwrap();
                assert!(d < 1e-6, "{dtype:?}: {d}");
            }
        }
        let bf = Tensor::zeros(3, DType::BF16, &dev).unwrap();
        let h = AdamStep {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            lr: 1e-3,
            decay_factor: 1.0,
            bc1: 0.1,
            bc2: 0.001,
            grad_scale: 1.0,
        };
        assert!(adamw_cpu(&bf, &bf, &bf, &bf, &h).unwrap().is_none());
    }

    #[test]
    fn an_empty_batch_makes_no_update() {
        struct NoModel;
        impl TrainableLm for NoModel {
            fn hidden_states(&self, _: &Tensor) -> Result<Tensor> {
                Err(Error::Msg("must not be called".into()))
            }
            fn lm_head_weight(&self) -> Tensor {
                Tensor::zeros((2, 2), DType::F32, &Device::Cpu).unwrap()
            }
            fn trainable_vars(&self) -> Vec<(String, Var)> {
                vec![(
                    "w".into(),
                    Var::zeros((2, 2), DType::F32, &Device::Cpu).unwrap(),
                )]
            }
        }
        let mut t = Trainer::new(&NoModel, TrainerConfig::default()).unwrap();
        let m = t.step_rollouts(&NoModel, &[]).unwrap();
        assert_eq!((m.updates, m.step, t.step_count()), (0, 0, 0));
        let empty = TaskRollouts {
            rollouts: vec![RolloutRecord {
                reward: 1.0,
                turns: vec![turn(&[1], &[])],
            }],
        };
        let m = t.step_rollouts(&NoModel, &[empty]).unwrap();
        assert_eq!((m.updates, m.groups, m.policy_tokens), (0, 1, 0));
        assert_eq!((m.skipped_updates, t.step_count()), (1, 0));
    }

    #[test]
    fn trainable_lm_is_object_safe() {
        fn _obj_safe(_: &dyn TrainableLm) {}
    }

    /// A model whose next-token distribution is uniform over 16 tokens whatever the context
    /// (zero hidden states): `log pi_theta = -ln 16` for every token, so each loss below can be
    /// written out by hand from the recorded `q`.
    struct Uniform {
        w: Var,
    }

    impl TrainableLm for Uniform {
        fn hidden_states(&self, ids: &Tensor) -> Result<Tensor> {
            let (b, t) = ids.dims2()?;
            Ok(Tensor::zeros((b, t, 2), DType::F32, &Device::Cpu)?)
        }
        fn lm_head_weight(&self) -> Tensor {
            self.w.as_tensor().clone()
        }
        fn trainable_vars(&self) -> Vec<(String, Var)> {
            vec![("w".into(), self.w.clone())]
        }
    }

    fn uniform() -> Uniform {
        Uniform {
            w: Var::zeros((16, 2), DType::F32, &Device::Cpu).unwrap(),
        }
    }

    fn qturn(context: &[u32], tokens: &[u32], q: &[f32]) -> TurnTokens {
        TurnTokens {
            context: context.to_vec(),
            tokens: tokens.to_vec(),
            logprobs: q.iter().map(|p| p.ln()).collect(),
        }
    }

    /// Group A (a rescue): rewards (1, 0), A = (+1, -1). Trajectory 1: turn 0 generates (1, 2)
    /// with q = (1/8, 1/8), turn 1 generates (1) with q = 1/32 after an observation;
    /// trajectory 2: one turn, (2, 3) with q = (1/16, 1/16). Group B (H0): rewards (0, 1),
    /// A = (-1, +1); (1) with q = 1/16 and (2, 3) with q = (1/16, 1/16). |B| = 2.
    fn two_groups() -> Vec<TaskRollouts> {
        let a = TaskRollouts {
            rollouts: vec![
                RolloutRecord {
                    reward: 1.0,
                    turns: vec![
                        qturn(&[5, 6], &[1, 2], &[0.125, 0.125]),
                        qturn(&[5, 6, 1, 2, 7], &[1], &[1.0 / 32.0]),
                    ],
                },
                RolloutRecord {
                    reward: 0.0,
                    turns: vec![qturn(&[5, 6], &[2, 3], &[1.0 / 16.0, 1.0 / 16.0])],
                },
            ],
        };
        let b = TaskRollouts {
            rollouts: vec![
                RolloutRecord {
                    reward: 0.0,
                    turns: vec![qturn(&[4], &[1], &[1.0 / 16.0])],
                },
                RolloutRecord {
                    reward: 1.0,
                    turns: vec![qturn(&[4], &[2, 3], &[1.0 / 16.0, 1.0 / 16.0])],
                },
            ],
        };
        vec![a, b]
    }

    fn paper_scoring() -> Vec<Vec<TokenScoring>> {
        vec![vec![TokenScoring::Generating; 2]; 2]
    }

    /// On-policy, rho = 1 and w = clip((1/16) / q, 0, 2): A's tokens weigh (0.5, 0.5, 2) and
    /// (1, 1), B's (1) and (1, 1).
    /// * Paper: J_A = (0.5 + 0.5 + 2 - 1 - 1) / 5 = 0.2, J_B = (-1 + 1 + 1) / 3 = 1/3,
    ///   loss = -(0.2 + 1/3) / 2 = -0.266667.
    /// * Masked, trajectory 1 of A from turn 1 (its first intervention), trajectory 2 from
    ///   turn 0 (a prompt sibling): J_A = (2 - 1 - 1) / 3 = 0, loss = -(0 + 1/3) / 2 = -0.166667.
    #[test]
    fn the_masked_objective_matches_a_hand_computation() {
        let model = uniform();
        let mut t = Trainer::new(&model, TrainerConfig::default()).unwrap();
        let paper = t
            .step_scored_rollouts(&model, &two_groups(), &paper_scoring())
            .unwrap();
        assert!(
            (paper.loss - -(0.2 + 1.0 / 3.0) / 2.0).abs() < 1e-6,
            "{}",
            paper.loss
        );
        assert_eq!((paper.policy_tokens, paper.masked_tokens), (8, 0));

        let mut scoring = paper_scoring();
        scoring[0] = vec![
            TokenScoring::FromTurn { first_turn: 1 },
            TokenScoring::FromTurn { first_turn: 0 },
        ];
        let mut t = Trainer::new(&model, TrainerConfig::default()).unwrap();
        let masked = t
            .step_scored_rollouts(&model, &two_groups(), &scoring)
            .unwrap();
        assert!(
            (masked.loss - -(1.0 / 3.0) / 2.0).abs() < 1e-6,
            "{}",
            masked.loss
        );
        assert_eq!((masked.policy_tokens, masked.masked_tokens), (6, 2));
        // Masking every turn of A leaves B alone in the batch, still over |B| = 2.
        scoring[0] = vec![TokenScoring::FromTurn { first_turn: 9 }; 2];
        let none = t
            .step_scored_rollouts(&model, &two_groups(), &scoring)
            .unwrap();
        assert!(
            (none.loss - -(1.0 / 3.0) / 2.0).abs() < 1e-6,
            "{}",
            none.loss
        );
        assert_eq!(none.masked_tokens, 5);
    }

    /// A re-scored under H0's contexts (other ids, same tokens): r = (1/16) / q =
    /// (0.5, 0.5, 2) and (1, 1); gamma = the 0.9-quantile of (0.5, 0.5, 1, 1, 2) =
    /// 1 + 0.6 (2 - 1) = 1.6. J_A = [0.5/2.1 + 0.5/2.1 + 2/3.6 - 1/2.6 - 1/2.6] / 5
    /// = (1.031746 - 0.769231) / 5 = 0.052503; B as the paper's, J_B = 1/3;
    /// loss = -(0.052503 + 0.333333) / 2 = -0.192918.
    #[test]
    fn the_h0_objective_matches_a_hand_computation() {
        let model = uniform();
        let mut scoring = paper_scoring();
        scoring[0] = vec![
            TokenScoring::H0 {
                contexts: vec![vec![9, 9], vec![9, 9, 1, 2, 7]],
            },
            TokenScoring::H0 {
                contexts: vec![vec![9, 9]],
            },
        ];
        let mut t = Trainer::new(&model, TrainerConfig::default()).unwrap();
        let m = t
            .step_scored_rollouts(&model, &two_groups(), &scoring)
            .unwrap();
        let j_a: f64 = (0.5 / 2.1 + 0.5 / 2.1 + 2.0 / 3.6 - 1.0 / 2.6 - 1.0 / 2.6) / 5.0;
        assert!((j_a - 0.052_503).abs() < 1e-6);
        assert!(
            (m.loss - -(j_a + 1.0 / 3.0) / 2.0).abs() < 1e-6,
            "{}",
            m.loss
        );
        assert!((m.h0_gamma - 1.6).abs() < 1e-5, "{}", m.h0_gamma);
        assert_eq!((m.h0_tokens, m.policy_tokens), (5, 8));
        assert!((m.h0_ratio_mean - 1.0).abs() < 1e-5, "{}", m.h0_ratio_mean);
        // The paper's figures cover B's tokens only: on-policy, no clipping, w = 1.
        assert!((m.weight_mean - 1.0).abs() < 1e-5, "{}", m.weight_mean);
        // A mismatched scoring is refused.
        let mut short = scoring.clone();
        short[0].pop();
        assert!(
            t.step_scored_rollouts(&model, &two_groups(), &short)
                .is_err()
        );
        let mut missing = scoring;
        missing[0][1] = TokenScoring::H0 { contexts: vec![] };
        assert!(
            t.step_scored_rollouts(&model, &two_groups(), &missing)
                .is_err()
        );
    }

    #[test]
    fn masked_turns_stay_in_the_context_without_being_scored() {
        let turns = [turn(&[1, 2], &[3, 4]), turn(&[1, 2, 3, 4, 7, 8], &[5])];
        let seqs = pack_turns_from(0, 0.5, &turns, 1, false).unwrap();
        assert_eq!(seqs.len(), 1);
        assert_eq!(seqs[0].ids, vec![1, 2, 3, 4, 7, 8, 5]);
        assert_eq!(seqs[0].policy_pos, vec![6]);
        assert_eq!(seqs[0].rollout_logp, vec![-0.5]);
        // Control: from turn 0 it is plain packing.
        assert_eq!(
            pack_turns_from(0, 0.5, &turns, 0, false).unwrap(),
            pack_turns(0, 0.5, &turns).unwrap()
        );
        assert!(
            pack_turns_from(0, 0.5, &turns, 2, false)
                .unwrap()
                .is_empty()
        );
    }
}
