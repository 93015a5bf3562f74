//! Supervised fine-tuning on recorded trajectories: the warm start of the embedded default.
//!
//! A randomly initialised tiny policy earns no reward, so GRPO has no signal. The warm start
//! records demonstrations with a
//! [`TeacherForcedPolicy`](crate::train::teacher::TeacherForcedPolicy) (an oracle's turns in the
//! student's own tokens), then minimises the mean negative log-likelihood of the policy tokens of
//! the successful ones with [`SftTrainer`].
//!
//! Training sequences are built exactly as the GRPO trainer builds them
//! ([`crate::train::trainer`]): consecutive turns of a trajectory whose context extends the
//! previous turn's context + tokens are packed into one sequence, every other turn starts a new
//! one, and only generated tokens are scored (the loss mask); system prompt, task, harness
//! messages and observations are context. Log-probs come from the chunked op
//! ([`crate::ops::logprob`]), so the `[tokens, vocab]` logits never exist. Each update is one
//! AdamW step (the trainer's [`AdamWConfig`] and [`Schedule`]) on the gradient of
//! `-(1/N) sum_{policy tokens} log pi(y_t | y_<t)` over the update's `N` policy tokens,
//! accumulated over micro-batches that fit a padded-token budget, with global grad-norm clipping.
//! Everything is seeded; on the CPU two runs give the same weights bit for bit.
//!
//! # Example
//! ```
//! use candle_core::{DType, Device};
//! use grpo_candle::train::sft::{SftConfig, SftTrainer, SftSequence};
//! use grpo_candle::{PolicyModel, TinySpec};
//!
//! let spec = TinySpec { num_merges: 16, hidden_size: 32, intermediate_size: 32, head_dim: 8, ..TinySpec::default() };
//! let pm = PolicyModel::tiny(&spec, DType::F32, &Device::Cpu)?;
//! // Normally: `sft_sequences(&trajectories, true)?` from episodes recorded under a
//! // `TeacherForcedPolicy`; here one hand-made sequence whose last three tokens are scored.
//! let seqs = vec![SftSequence { ids: vec![5, 6, 7, 8, 9, 10], policy_pos: vec![3, 4, 5] }];
//! let mut sft = SftTrainer::new(&pm.model, SftConfig::default())?;
//! let before = sft.evaluate(&pm.model, &seqs)?.loss;
//! let metrics = sft.fit(&pm.model, &seqs, 20)?;
//! assert!(metrics.last().unwrap().loss < before);
//! # Ok::<(), grpo_candle::Error>(())
//! ```
//!
//! With a [`CandlePolicy`] that episodes sample from concurrently, use
//! [`SftTrainer::fit_policy`], which holds [`CandlePolicy::update_guard`] while it changes the
//! weights.

use std::time::Instant;

use candle_core::{DType, Tensor, Var};
use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::ops::logprob::LogProbConfig;
use crate::sample::policy::CandlePolicy;
use crate::train::trainer::{
    AdamWConfig, DecayKind, Moments, Optim, Schedule, Sequence, TrainableLm, TurnTokens,
    apply_adamw, micro_batches, pack_turns, score_sequences,
};

/// One training sequence: token ids and the positions whose token is scored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SftSequence {
    /// Contexts and generated tokens of one or more packed turns, in order.
    pub ids: Vec<u32>,
    /// Positions `p >= 1` of generated tokens (the loss mask), ascending; the token at `p` is
    /// predicted from `ids[..p]`.
    pub policy_pos: Vec<usize>,
}

impl SftSequence {
    /// The loss mask: `true` at the positions of generated tokens.
    pub fn loss_mask(&self) -> Vec<bool> {
        let mut mask = vec![false; self.ids.len()];
        for &p in &self.policy_pos {
            mask[p] = true;
        }
        mask
    }

    /// The scored tokens, in order.
    pub fn targets(&self) -> Vec<u32> {
        self.policy_pos.iter().map(|&p| self.ids[p]).collect()
    }

    fn check(&self, i: usize) -> Result<()> {
        let ok = self.ids.len() >= 2
            && self.policy_pos.windows(2).all(|w| w[0] < w[1])
            && self
                .policy_pos
                .iter()
                .all(|&p| p >= 1 && p < self.ids.len());
        if ok {
            Ok(())
        } else {
            Err(Error::Request(format!(
                "sft sequence {i}: policy positions must be ascending, in 1..{} (got {:?})",
                self.ids.len(),
                self.policy_pos
            )))
        }
    }
}

/// Sequences of one trajectory's turns (packed as the GRPO trainer packs them).
pub fn turn_sequences(turns: &[TurnTokens]) -> Result<Vec<SftSequence>> {
    Ok(pack_turns(0, 0.0, turns)?
        .into_iter()
        .map(|s| SftSequence {
            ids: s.ids,
            policy_pos: s.policy_pos,
        })
        .collect())
}

/// The training sequences of `trajectories`, in order; with `successful_only`, of the successful
/// ones only (the verifier accepted the episode).
pub fn sft_sequences(
    trajectories: &[harness_core::Trajectory],
    successful_only: bool,
) -> Result<Vec<SftSequence>> {
    let mut out = Vec::new();
    for (i, t) in trajectories.iter().enumerate() {
        if successful_only && !t.is_success() {
            continue;
        }
        let turns: Vec<TurnTokens> = t
            .turns
            .iter()
            .map(|turn| TurnTokens {
                context: turn.context_tokens.clone(),
                tokens: turn.tokens.clone(),
                logprobs: turn.logprobs.clone(),
            })
            .collect();
        let seqs = turn_sequences(&turns)
            .map_err(|e| Error::Msg(format!("trajectory {i} (task `{}`): {e}", t.task_id)))?;
        out.extend(seqs);
    }
    Ok(out)
}

/// Everything [`SftTrainer`] is configured with.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SftConfig {
    /// The optimizer (the GRPO trainer's AdamW).
    pub adamw: AdamWConfig,
    /// The learning-rate schedule, in updates.
    pub schedule: Schedule,
    /// Global gradient-norm cap (`None`: no clipping).
    pub max_grad_norm: Option<f64>,
    /// Padded tokens (`batch x longest`) per micro-batch; a longer sequence gets its own.
    pub micro_batch_tokens: usize,
    /// Sequences per update in [`SftTrainer::fit`] (0: every sequence in every update). Batches
    /// walk through a seeded shuffle of the sequences, reshuffled every epoch.
    pub batch_sequences: usize,
    /// Seed of the trainer's RNG (the shuffle of [`SftTrainer::fit`]).
    pub seed: u64,
    /// Chunks of the log-prob op.
    #[serde(skip, default)]
    pub logprob: LogProbConfig,
}

impl Default for SftConfig {
    /// Settings that warm-start the embedded tiny policy in a few dozen updates: lr `1e-2`
    /// after 5 warmup updates, constant, clipping at 1, full batches. (A real Qwen checkpoint
    /// wants a learning rate around `1e-5`.)
    fn default() -> Self {
        SftConfig {
            adamw: AdamWConfig::default(),
            schedule: Schedule {
                lr: 1e-2,
                warmup_steps: 5,
                total_steps: 100,
                decay: DecayKind::Constant,
                min_lr_ratio: 1.0,
            },
            max_grad_norm: Some(1.0),
            micro_batch_tokens: 8192,
            batch_sequences: 0,
            seed: 0,
            logprob: LogProbConfig::default(),
        }
    }
}

/// Mean negative log-likelihood of policy tokens (see [`SftTrainer::evaluate`]).
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct NllStats {
    /// `-(1/N) sum log pi(y_t | y_<t)` over the `N` policy tokens (0 without tokens).
    pub loss: f64,
    /// Policy tokens scored (`N`).
    pub tokens: usize,
    /// Fraction of policy tokens with probability above 1/2 (such a token is the greedy choice).
    pub confident_frac: f64,
}

/// What one update did.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SftMetrics {
    /// Updates done after this one (the trainer's step counter).
    pub step: u64,
    /// Learning rate of the update.
    pub lr: f64,
    /// Mean NLL of the update's policy tokens, before the update.
    pub loss: f64,
    /// Fraction of the update's policy tokens with probability above 1/2, before the update.
    pub confident_frac: f64,
    /// Global gradient norm before clipping.
    pub grad_norm: f64,
    /// Sequences in the update.
    pub sequences: usize,
    /// Scored policy tokens.
    pub tokens: usize,
    /// Positions run through the model (padding excluded).
    pub sequence_tokens: usize,
    /// Micro-batches run.
    pub micro_batches: usize,
    /// The update was skipped because no sequence had a scored token: the step counter, the
    /// learning-rate schedule and AdamW's bias correction did not move.
    #[serde(default)]
    pub skipped: bool,
    /// Wall-clock seconds.
    pub seconds: f64,
}

/// Supervised fine-tuning: AdamW on the mean NLL of policy tokens (see the
/// [module docs](self)).
pub struct SftTrainer {
    cfg: SftConfig,
    vars: Vec<(String, Var)>,
    moments: Vec<Moments>,
    step: u64,
    rng: ChaCha8Rng,
    /// Shuffled order of the current epoch of [`SftTrainer::fit`] and the position in it.
    order: Vec<usize>,
    cursor: usize,
}

impl std::fmt::Debug for SftTrainer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SftTrainer")
            .field("cfg", &self.cfg)
            .field("vars", &self.vars.len())
            .field("step", &self.step)
            .finish()
    }
}

impl SftTrainer {
    /// A fresh trainer for `model`'s parameters.
    pub fn new(model: &dyn TrainableLm, cfg: SftConfig) -> Result<Self> {
        if cfg.micro_batch_tokens == 0 {
            return Err(Error::Msg(
                "sft config: micro_batch_tokens must be positive".into(),
            ));
        }
        let vars = model.trainable_vars();
        let moments = vars
            .iter()
            .map(|(_, v)| {
                let z = v.as_tensor().zeros_like()?;
                Ok(Moments { m: z.clone(), v: z })
            })
            .collect::<candle_core::Result<Vec<_>>>()?;
        Ok(SftTrainer {
            cfg,
            vars,
            moments,
            step: 0,
            rng: ChaCha8Rng::seed_from_u64(cfg.seed),
            order: Vec::new(),
            cursor: 0,
        })
    }

    /// Updates done so far.
    pub fn step_count(&self) -> u64 {
        self.step
    }

    /// The configuration.
    pub fn config(&self) -> &SftConfig {
        &self.cfg
    }

    /// Mean NLL of the policy tokens of `seqs` under `model`, without changing anything.
    pub fn evaluate(&self, model: &dyn TrainableLm, seqs: &[SftSequence]) -> Result<NllStats> {
        check_all(seqs)?;
        let (internal, idx) = internal(seqs);
        let mut sum = 0.0f64;
        let mut confident = 0usize;
        let mut tokens = 0usize;
        for mb in micro_batches(&internal, &idx, self.cfg.micro_batch_tokens) {
            let lp: Vec<f64> = score_sequences(model, &internal, &mb, &self.cfg.logprob, 1.0)?
                .0
                .detach()
                .to_dtype(DType::F64)?
                .to_vec1()?;
            tokens += lp.len();
            sum -= lp.iter().sum::<f64>();
            confident += lp.iter().filter(|&&l| l > -std::f64::consts::LN_2).count();
        }
        let n = tokens.max(1) as f64;
        Ok(NllStats {
            loss: sum / n,
            tokens,
            confident_frac: confident as f64 / n,
        })
    }

    /// One update on every sequence of `seqs`.
    pub fn step(&mut self, model: &dyn TrainableLm, seqs: &[SftSequence]) -> Result<SftMetrics> {
        self.update(model, seqs, None)
    }

    /// One update on the sequences of `trajectories` (the successful ones with
    /// `successful_only`).
    pub fn step_trajectories(
        &mut self,
        model: &dyn TrainableLm,
        trajectories: &[harness_core::Trajectory],
        successful_only: bool,
    ) -> Result<SftMetrics> {
        let seqs = sft_sequences(trajectories, successful_only)?;
        self.step(model, &seqs)
    }

    /// `updates` updates on batches of [`SftConfig::batch_sequences`] sequences drawn from a
    /// seeded shuffle of `seqs` (every sequence once per epoch), or on all of them when that is 0.
    pub fn fit(
        &mut self,
        model: &dyn TrainableLm,
        seqs: &[SftSequence],
        updates: usize,
    ) -> Result<Vec<SftMetrics>> {
        self.fit_impl(model, seqs, updates, None)
    }

    /// [`SftTrainer::fit`] on a policy's model, holding [`CandlePolicy::update_guard`] while the
    /// weights change so that concurrent sampling never sees half-updated weights.
    pub fn fit_policy(
        &mut self,
        policy: &CandlePolicy,
        seqs: &[SftSequence],
        updates: usize,
    ) -> Result<Vec<SftMetrics>> {
        self.fit_impl(policy.model(), seqs, updates, Some(policy))
    }

    fn fit_impl(
        &mut self,
        model: &dyn TrainableLm,
        seqs: &[SftSequence],
        updates: usize,
        policy: Option<&CandlePolicy>,
    ) -> Result<Vec<SftMetrics>> {
        check_all(seqs)?;
        let batch = self.cfg.batch_sequences;
        let mut out = Vec::with_capacity(updates);
        if seqs.is_empty() {
            return Ok(out);
        }
        for _ in 0..updates {
            let metrics = if batch == 0 || batch >= seqs.len() {
                self.update(model, seqs, policy)?
            } else {
                let mut picked = Vec::with_capacity(batch);
                while picked.len() < batch {
                    if self.cursor >= self.order.len() || self.order.len() != seqs.len() {
                        self.order = (0..seqs.len()).collect();
                        self.order.shuffle(&mut self.rng);
                        self.cursor = 0;
                    }
                    picked.push(seqs[self.order[self.cursor]].clone());
                    self.cursor += 1;
                }
                self.update(model, &picked, policy)?
            };
            out.push(metrics);
        }
        Ok(out)
    }

    fn update(
        &mut self,
        model: &dyn TrainableLm,
        seqs: &[SftSequence],
        policy: Option<&CandlePolicy>,
    ) -> Result<SftMetrics> {
        let started = Instant::now();
        check_all(seqs)?;
        let (internal, idx) = internal(seqs);
        let total: usize = internal.iter().map(|s| s.policy_pos.len()).sum();
        let mut metrics = SftMetrics {
            sequences: seqs.len(),
            tokens: total,
            sequence_tokens: internal.iter().map(|s| s.ids.len() - 1).sum(),
            ..SftMetrics::default()
        };
        if total == 0 {
            // No gradient: an AdamW step would still advance the schedule and the bias
            // correction and decay the weights, for nothing.
            tracing::warn!("SFT update: no scored tokens; no optimizer update");
            metrics.skipped = true;
            metrics.step = self.step;
            metrics.seconds = started.elapsed().as_secs_f64();
            return Ok(metrics);
        }
        let scale = 1.0 / total as f64;
        let mut acc: Vec<Option<Tensor>> = vec![None; self.vars.len()];
        let mut nll = 0.0f64;
        let mut confident = 0usize;
        for mb in micro_batches(&internal, &idx, self.cfg.micro_batch_tokens) {
            metrics.micro_batches += 1;
            let logp = score_sequences(model, &internal, &mb, &self.cfg.logprob, 1.0)?.0;
            let lp: Vec<f64> = logp.detach().to_dtype(DType::F64)?.to_vec1()?;
            nll -= lp.iter().sum::<f64>();
            confident += lp.iter().filter(|&&l| l > -std::f64::consts::LN_2).count();
            // This micro-batch's share of the update's mean NLL.
            let loss = (logp.sum_all()? * (-scale))?;
            let grads = loss.backward()?;
            for (k, (_, var)) in self.vars.iter().enumerate() {
                if let Some(g) = grads.get(var.as_tensor()) {
                    acc[k] = Some(match acc[k].take() {
                        Some(prev) => (prev + g)?,
                        None => g.clone(),
                    });
                }
            }
        }
        metrics.loss = nll * scale;
        metrics.confident_frac = confident as f64 * scale;
        let (lr, norm) = {
            let _guard = policy.map(CandlePolicy::update_guard);
            let updated = apply_adamw(
                &self.vars,
                &mut self.moments,
                &mut self.step,
                &Optim {
                    adamw: &self.cfg.adamw,
                    schedule: &self.cfg.schedule,
                    max_grad_norm: self.cfg.max_grad_norm,
                },
                acc,
            );
            // Even a failed update may have changed some variables.
            model.weights_changed();
            updated?
        };
        metrics.lr = lr;
        metrics.grad_norm = norm;
        metrics.step = self.step;
        metrics.seconds = started.elapsed().as_secs_f64();
        Ok(metrics)
    }
}

fn check_all(seqs: &[SftSequence]) -> Result<()> {
    seqs.iter().enumerate().try_for_each(|(i, s)| s.check(i))
}

/// The trainer's sequence type for its micro-batcher, with the indices of the sequences that
/// have scored tokens.
fn internal(seqs: &[SftSequence]) -> (Vec<Sequence>, Vec<usize>) {
    let internal: Vec<Sequence> = seqs
        .iter()
        .map(|s| Sequence {
            task: 0,
            ids: s.ids.clone(),
            policy_pos: s.policy_pos.clone(),
            rollout_logp: Vec::new(),
            advantage: 0.0,
            guide: false,
        })
        .collect();
    let idx = (0..internal.len())
        .filter(|&i| !internal[i].policy_pos.is_empty())
        .collect();
    (internal, idx)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Qwen;
    use crate::model::config::QwenConfig;

    fn model(seed: u64) -> Qwen {
        let mut cfg = QwenConfig::tiny_qwen3(40);
        cfg.num_hidden_layers = 1;
        cfg.hidden_size = 16;
        cfg.intermediate_size = 32;
        cfg.head_dim = 8;
        cfg.num_attention_heads = 2;
        cfg.num_key_value_heads = 1;
        Qwen::new_random(&cfg, seed, DType::F32, &candle_core::Device::Cpu).unwrap()
    }

    fn seqs() -> Vec<SftSequence> {
        (0..5u32)
            .map(|k| {
                let n = 6 + 2 * k as usize;
                let ids: Vec<u32> = (0..n as u32).map(|i| (i * 7 + k * 3) % 40).collect();
                SftSequence {
                    ids,
                    policy_pos: (n / 2..n).collect(),
                }
            })
            .collect()
    }

    fn weights(m: &Qwen) -> Vec<f32> {
        m.named_vars()
            .iter()
            .flat_map(|(_, v)| {
                v.as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            })
            .collect()
    }

    fn cfg(micro_batch_tokens: usize, batch_sequences: usize) -> SftConfig {
        SftConfig {
            micro_batch_tokens,
            batch_sequences,
            seed: 3,
            logprob: LogProbConfig {
                token_chunk: 4,
                vocab_chunk: 16,
                ..LogProbConfig::default()
            },
            ..SftConfig::default()
        }
    }

    #[test]
    fn fitting_is_seeded_and_deterministic() {
        let run = || {
            let m = model(1);
            let mut t = SftTrainer::new(&m, cfg(64, 2)).unwrap();
            let metrics = t.fit(&m, &seqs(), 6).unwrap();
            (
                weights(&m),
                metrics.iter().map(|x| x.loss).collect::<Vec<_>>(),
            )
        };
        let (a, la) = run();
        let (b, lb) = run();
        assert_eq!(a, b);
        assert_eq!(la, lb);
        assert_ne!(a, weights(&model(1)));
    }

    #[test]
    fn micro_batching_does_not_change_the_update() {
        let m1 = model(2);
        let m2 = model(2);
        let mut one = SftTrainer::new(&m1, cfg(10_000, 0)).unwrap();
        let mut many = SftTrainer::new(&m2, cfg(12, 0)).unwrap();
        let version = m1.weights_version();
        let a = one.step(&m1, &seqs()).unwrap();
        // The update marks the weights changed, so a sampler's prefix cache drops its entries.
        assert_ne!(m1.weights_version(), version);
        let b = many.step(&m2, &seqs()).unwrap();
        assert_eq!(a.micro_batches, 1);
        assert!(b.micro_batches >= 4);
        assert_eq!(a.tokens, b.tokens);
        assert!((a.loss - b.loss).abs() < 1e-5, "{a:?} vs {b:?}");
        assert!((a.grad_norm - b.grad_norm).abs() < 1e-4 * a.grad_norm.max(1.0));
        for (x, y) in weights(&m1).iter().zip(weights(&m2)) {
            assert!((x - y).abs() < 1e-4, "{x} vs {y}");
        }
    }

    #[test]
    fn batches_cover_every_sequence_once_per_epoch() {
        let m = model(3);
        let mut t = SftTrainer::new(&m, cfg(64, 2)).unwrap();
        let data = seqs();
        // 5 sequences in batches of 2: every epoch of the shuffle is a permutation.
        let metrics = t.fit(&m, &data, 5).unwrap();
        assert!(metrics.iter().all(|x| x.sequences == 2));
        assert_eq!(t.order.len(), 5);
        let mut sorted = t.order.clone();
        sorted.sort();
        assert_eq!(sorted, (0..5).collect::<Vec<_>>());
        assert_eq!(t.step_count(), 5);
    }

    #[test]
    fn the_loss_falls_and_bad_sequences_are_rejected() {
        let m = model(4);
        let mut t = SftTrainer::new(&m, cfg(64, 0)).unwrap();
        let data = seqs();
        let before = t.evaluate(&m, &data).unwrap();
        t.fit(&m, &data, 30).unwrap();
        let after = t.evaluate(&m, &data).unwrap();
        assert!(after.loss < 0.5 * before.loss, "{before:?} -> {after:?}");
        assert_eq!(
            before.tokens,
            data.iter().map(|s| s.policy_pos.len()).sum::<usize>()
        );
        let bad = SftSequence {
            ids: vec![1, 2, 3],
            policy_pos: vec![0, 2],
        };
        assert!(t.step(&m, &[bad]).is_err());
        let unsorted = SftSequence {
            ids: vec![1, 2, 3],
            policy_pos: vec![2, 1],
        };
        assert!(t.evaluate(&m, &[unsorted]).is_err());
        // Sequences with nothing to score are skipped, not an error.
        let empty = SftSequence {
            ids: vec![1, 2],
            policy_pos: vec![],
        };
        assert_eq!(t.evaluate(&m, &[empty]).unwrap().tokens, 0);
    }

    #[test]
    fn an_update_without_scored_tokens_is_a_reported_no_op() {
        let m = model(5);
        let mut t = SftTrainer::new(&m, cfg(64, 0)).unwrap();
        let before = weights(&m);
        let empty = SftSequence {
            ids: vec![1, 2],
            policy_pos: vec![],
        };
        for batch in [vec![], vec![empty]] {
            let metrics = t.step(&m, &batch).unwrap();
            assert!(metrics.skipped && metrics.tokens == 0, "{metrics:?}");
            assert_eq!((metrics.step, t.step_count()), (0, 0));
        }
        assert_eq!(weights(&m), before);
        // The next real update is the first: warmup's first rate and bias correction at t = 1.
        let first = t.step(&m, &seqs()).unwrap();
        assert_eq!(first.step, 1);
        assert_eq!(first.lr, t.cfg.schedule.lr_at(0));
    }
}
