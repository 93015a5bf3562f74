//! [`CandleLearner`]: harness-core's [`Learner`] seam on the candle policy and the GRPO
//! [`Trainer`], so the rescue loop (harness-rollout) updates the very weights its episodes
//! sample from without knowing anything about candle.

use std::path::Path;
use std::sync::Arc;

use async_trait::async_trait;
use harness_core::{Group, Learner, RescueObjective, TokenScoring, UpdateReport};
use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::sample::policy::CandlePolicy;
use crate::train::trainer::{StepMetrics, Trainer, TrainerConfig};

/// The learner's own counters inside a checkpoint folder (beside the trainer's files).
/// The file [`CandleLearner`] writes into each checkpoint folder (its counters and RNG).
pub const LEARNER_FILE: &str = "candle_learner.json";

#[derive(Serialize, Deserialize)]
struct SavedLearner {
    policy_version: u64,
}

/// A [`Trainer`] updating a shared [`CandlePolicy`] in place.
///
/// Updates take the policy's [`CandlePolicy::update_guard`], so no row is decoded on
/// half-updated weights; the next rollouts sample from the new weights directly (policy version
/// bumped per applied update, no weight sync needed in process). Checkpoints hold the weights in
/// HF format (loadable by vLLM or SGLang), the AdamW moments, the step counter, the trainer's
/// RNG and the policy version.
pub struct CandleLearner {
    name: String,
    policy: Arc<CandlePolicy>,
    trainer: Trainer,
    policy_version: u64,
}

impl std::fmt::Debug for CandleLearner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandleLearner")
            .field("name", &self.name)
            .field("step", &self.trainer.step_count())
            .field("policy_version", &self.policy_version)
            .finish_non_exhaustive()
    }
}

impl CandleLearner {
    /// A learner training `policy`'s weights with a fresh trainer.
    pub fn new(policy: Arc<CandlePolicy>, cfg: TrainerConfig) -> Result<Self> {
        let trainer = Trainer::new(policy.model(), cfg)?;
        Ok(CandleLearner {
            name: "candle-grpo".into(),
            policy,
            trainer,
            policy_version: 0,
        })
    }

    /// The policy it trains.
    pub fn policy(&self) -> &Arc<CandlePolicy> {
        &self.policy
    }

    /// The trainer.
    pub fn trainer(&self) -> &Trainer {
        &self.trainer
    }

    fn error(&self, e: impl std::fmt::Display) -> harness_core::Error {
        harness_core::Error::Learner {
            learner: self.name.clone(),
            message: e.to_string(),
        }
    }
}

/// `metrics.jsonl` figures from a trainer step.
pub fn update_report(m: &StepMetrics, applied: bool, policy_version: u64) -> UpdateReport {
    let extra = [
        ("ratio_mean", m.ratio_mean),
        ("ratio_min", m.ratio_min),
        ("ratio_max", m.ratio_max),
        ("weight_min", m.weight_min),
        ("weight_max", m.weight_max),
        ("entropy_mean", m.entropy_mean),
        ("effective_groups", m.effective_groups as f64),
        ("sequences", m.sequences as f64),
        ("micro_batches", m.micro_batches as f64),
        ("skipped_updates", m.skipped_updates as f64),
        ("optimizer_seconds", m.optimizer_seconds),
        ("rescue_masked_tokens", m.masked_tokens as f64),
        ("rescue_h0_tokens", m.h0_tokens as f64),
        ("rescue_h0_gamma", m.h0_gamma),
        ("rescue_h0_ratio_mean", m.h0_ratio_mean),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    UpdateReport {
        applied,
        optimizer_steps: m.step,
        policy_version,
        loss: m.loss,
        grad_norm: m.grad_norm,
        lr: m.lr,
        policy_tokens: m.policy_tokens,
        clip_frac_low: m.clip_frac_low,
        clip_frac_high: m.clip_frac_high,
        weight_mean: m.weight_mean,
        weight_clipped_frac: m.weight_clip_frac,
        seconds: m.seconds,
        extra,
    }
}

#[async_trait]
impl Learner for CandleLearner {
    fn name(&self) -> &str {
        &self.name
    }

    async fn update(&mut self, groups: &[Group]) -> harness_core::Result<UpdateReport> {
        self.update_scored(groups, &[]).await
    }

    /// Every rescue objective: the paper's, `masked` and `h0` (see
    /// [`Trainer::step_scored_rollouts`]).
    fn check_rescue_objective(&self, _objective: RescueObjective) -> harness_core::Result<()> {
        Ok(())
    }

    async fn update_scored(
        &mut self,
        groups: &[Group],
        scoring: &[Vec<TokenScoring>],
    ) -> harness_core::Result<UpdateReport> {
        // The step is CPU/GPU work done inline (the Learner contract for in-process learners);
        // the policy's decoding thread is idle meanwhile because the guard stops admissions.
        let metrics = {
            let _guard = self.policy.update_guard();
            self.trainer
                .step_scored(self.policy.model(), groups, scoring)
        }
        .map_err(|e| self.error(e))?;
        let applied = metrics.updates > 0;
        if applied {
            self.policy_version += 1;
        }
        Ok(update_report(&metrics, applied, self.policy_version))
    }

    fn save_checkpoint(&self, dir: &Path) -> harness_core::Result<()> {
        let policy = &self.policy;
        self.trainer
            .save_checkpoint(dir, |d| policy.save_hf(d))
            .map_err(|e| self.error(e))?;
        let json = serde_json::to_vec(&SavedLearner {
            policy_version: self.policy_version,
        })
        .unwrap_or_else(|_| unreachable!("plain data"));
        harness_core::fsutil::write_atomic(&dir.join(LEARNER_FILE), &json)
    }

    fn load_checkpoint(&mut self, dir: &Path) -> harness_core::Result<()> {
        let path = dir.join(LEARNER_FILE);
        let text = std::fs::read_to_string(&path).map_err(|e| harness_core::Error::io(&path, e))?;
        let saved: SavedLearner =
            serde_json::from_str(&text).map_err(|e| harness_core::Error::Parse {
                location: harness_core::Location::at("").in_file(&path),
                message: format!("{e}; expected {{\"policy_version\": <integer>}}"),
            })?;
        self.policy.load_weights(dir).map_err(|e| self.error(e))?;
        let logprob = self.trainer.config().logprob;
        self.trainer =
            Trainer::resume(self.policy.model(), dir, logprob).map_err(|e| self.error(e))?;
        self.policy_version = saved.policy_version;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::checkpoint::{PolicyModel, TinySpec};
    use crate::sample::policy::PolicyOptions;
    use candle_core::{DType, Device};
    use harness_core::{
        FinishReason, GroupOrigin, Outcome, PolicyTurnRecord, Role, Source, Split, Task,
        Termination, Trajectory, TrajectoryMessage, TurnSampling,
    };

    fn policy() -> Arc<CandlePolicy> {
        let spec = TinySpec {
            num_merges: 16,
            ..TinySpec::default()
        };
        let model = PolicyModel::tiny(&spec, DType::F32, &Device::Cpu).unwrap();
        Arc::new(CandlePolicy::new(model, PolicyOptions::default()))
    }

    fn trajectory(seed: u64, reward: f32, tokens: Vec<u32>) -> Trajectory {
        let n = tokens.len();
        Trajectory {
            task_id: "t".into(),
            env: "e".into(),
            harness_id: harness_core::HarnessId("h".into()),
            harness_name: "H0".into(),
            seed,
            policy: "tiny".into(),
            messages: vec![TrajectoryMessage {
                role: Role::Assistant,
                source: Source::Policy,
                content: String::new(),
                name: None,
                hook: None,
            }],
            turns: vec![PolicyTurnRecord {
                message_index: Some(0),
                context_tokens: vec![1, 2, 3, 4],
                tokens,
                logprobs: vec![-3.0; n],
                finish: FinishReason::Stop,
                sampling: Some(TurnSampling {
                    temperature: 1.0,
                    top_p: 1.0,
                    top_k: None,
                    greedy: false,
                }),
            }],
            final_answer: None,
            outcome: Outcome {
                reward,
                details: serde_json::Value::Null,
            },
            termination: Termination::PolicyFinished,
            policy_version: None,
            counts: Default::default(),
        }
    }

    fn group() -> Group {
        Group {
            task: Task::new("t", "e", Split::Train, "do it", 0),
            trajectories: vec![
                trajectory(1, 1.0, vec![5, 6, 7]),
                trajectory(2, 0.0, vec![8, 9]),
            ],
            origin: GroupOrigin::Base,
        }
    }

    fn weights(p: &CandlePolicy) -> Vec<f32> {
        let mut vars = crate::train::trainer::TrainableLm::trainable_vars(p.model());
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        vars.iter()
            .flat_map(|(_, v)| {
                v.as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap()
            })
            .collect()
    }

    #[tokio::test]
    async fn a_checkpointed_learner_continues_bit_identically() {
        let cfg = TrainerConfig::default();
        let mut a = CandleLearner::new(policy(), cfg).unwrap();
        let first = a.update(&[group()]).await.unwrap();
        assert!(first.applied && first.loss.is_finite());
        assert_eq!(first.policy_version, 1);
        assert_eq!(
            first.policy_tokens, 5,
            "only the generated tokens are scored"
        );
        let dir = tempfile::tempdir().unwrap();
        a.save_checkpoint(dir.path()).unwrap();
        let second = a.update(&[group()]).await.unwrap();

        let mut b = CandleLearner::new(policy(), cfg).unwrap();
        b.load_checkpoint(dir.path()).unwrap();
        assert_eq!(b.trainer().step_count(), 1);
        let resumed = b.update(&[group()]).await.unwrap();
        assert_eq!(resumed.policy_version, 2);
        assert_eq!(resumed.loss.to_bits(), second.loss.to_bits());
        assert_eq!(weights(a.policy()), weights(b.policy()));
    }
}
