//! Your own learner: implement [`Learner`] to turn the rescue loop's retained groups into a
//! policy update, and train with [`harness_rollout::run_training`].
//!
//! ```text
//! cargo run --release --example custom_learner
//! ```
//!
//! The learner here trains the `custom_policy` example's menu policy (a softmax over whole
//! actions) with the group-relative policy gradient: each trajectory's advantage is its reward
//! minus its group's mean, over the group's standard deviation (GRPO), and every sampled action
//! moves its logits by `lr * A * d log pi(a) / d logits`. A learner owns the trainable state
//! (weights, optimizer, step counter): the loop never sees it, and checkpoints go through
//! [`Learner::save_checkpoint`] and [`Learner::load_checkpoint`], so a killed run resumes
//! exactly. grpo-candle's `CandleLearner` (a language model in process) and harness-tinker's
//! `TinkerLearner` (a remote trainer over the Tinker protocol) implement the same trait.

#[allow(dead_code)]
#[path = "custom_policy.rs"]
pub mod custom_policy;

use std::path::Path;
use std::sync::{Arc, RwLock};

use async_trait::async_trait;
use custom_policy::{Logits, MenuPolicy, answer_menu, evaluate, softmax, tasks};
use harness_core::{Group, Harness, Learner, Result, Role, Split, UpdateReport};
use harness_pool::SiblingPool;
use harness_rollout::{RescueConfig, Strategy, TrainingSetup, run_training};
use harness_testkit::ScriptedEnv;
use serde::{Deserialize, Serialize};

/// What a checkpoint holds: everything the next update depends on.
#[derive(Serialize, Deserialize)]
struct State {
    logits: Logits,
    steps: u64,
}

/// Group-relative policy gradient on the menu policy's logits.
pub struct MenuLearner {
    logits: Arc<RwLock<Logits>>,
    prior: Vec<f64>,
    lr: f64,
    steps: u64,
}

impl MenuLearner {
    /// A learner of `policy`'s logits with learning rate `lr`.
    pub fn new(policy: &MenuPolicy, lr: f64) -> Self {
        MenuLearner {
            logits: policy.logits.clone(),
            prior: policy.prior.clone(),
            lr,
            steps: 0,
        }
    }
}

/// GRPO's advantages: `(r - mean) / (std + eps)` within a group (all zero without variance).
fn group_advantages(rewards: &[f32]) -> Vec<f64> {
    let n = rewards.len() as f64;
    let mean = rewards.iter().map(|r| f64::from(*r)).sum::<f64>() / n;
    let var = rewards
        .iter()
        .map(|r| (f64::from(*r) - mean).powi(2))
        .sum::<f64>()
        / n;
    rewards
        .iter()
        .map(|r| (f64::from(*r) - mean) / (var.sqrt() + 1e-6))
        .collect()
}

#[async_trait]
impl Learner for MenuLearner {
    fn name(&self) -> &str {
        "menu-pg"
    }

    async fn update(&mut self, groups: &[Group]) -> Result<UpdateReport> {
        let start = std::time::Instant::now();
        let mut logits = self.logits.write().unwrap_or_else(|e| e.into_inner());
        let mut gradients: Vec<(String, Vec<f64>)> = Vec::new();
        let (mut loss, mut tokens) = (0.0, 0usize);
        for group in groups {
            let advantages = group_advantages(&group.rewards());
            for (trajectory, advantage) in group.trajectories.iter().zip(advantages) {
                // The context key the policy used: the first user message.
                let context = trajectory
                    .messages
                    .iter()
                    .find(|m| m.role == Role::User)
                    .map(|m| m.content.clone())
                    .unwrap_or_default();
                let row = logits
                    .by_context
                    .get(&context)
                    .unwrap_or(&self.prior)
                    .clone();
                for turn in &trajectory.turns {
                    let temperature = turn
                        .sampling
                        .map_or(1.0, |s| f64::from(s.temperature))
                        .max(1e-6);
                    let p = softmax(&row, temperature);
                    for &action in &turn.tokens {
                        let a = action as usize;
                        // d log pi(a) / d logit_b = (1[a = b] - pi(b)) / T.
                        let grad: Vec<f64> = (0..row.len())
                            .map(|b| advantage * (f64::from(u8::from(a == b)) - p[b]) / temperature)
                            .collect();
                        loss -= advantage * p[a].ln();
                        tokens += 1;
                        gradients.push((context.clone(), grad));
                    }
                }
            }
        }
        if tokens == 0 {
            // Nothing to score: the step counter and the weights stay as they are.
            return Ok(UpdateReport {
                applied: false,
                optimizer_steps: self.steps,
                policy_version: self.steps,
                lr: self.lr,
                ..UpdateReport::default()
            });
        }
        let scale = self.lr / tokens as f64;
        let mut norm = 0.0;
        for (context, grad) in gradients {
            let row = logits
                .by_context
                .entry(context)
                .or_insert_with(|| self.prior.clone());
            for (l, g) in row.iter_mut().zip(&grad) {
                *l += scale * g;
                norm += g * g;
            }
        }
        self.steps += 1;
        Ok(UpdateReport {
            applied: true,
            optimizer_steps: self.steps,
            policy_version: self.steps,
            loss: loss / tokens as f64,
            grad_norm: norm.sqrt() / tokens as f64,
            lr: self.lr,
            policy_tokens: tokens,
            seconds: start.elapsed().as_secs_f64(),
            ..UpdateReport::default()
        })
    }

    fn save_checkpoint(&self, dir: &Path) -> Result<()> {
        let state = State {
            logits: self
                .logits
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .clone(),
            steps: self.steps,
        };
        let path = dir.join("menu-learner.json");
        let text = serde_json::to_string(&state).map_err(|e| harness_core::Error::Learner {
            learner: self.name().into(),
            message: e.to_string(),
        })?;
        std::fs::write(&path, text).map_err(|e| harness_core::Error::io(&path, e))
    }

    fn load_checkpoint(&mut self, dir: &Path) -> Result<()> {
        let path = dir.join("menu-learner.json");
        let text = std::fs::read_to_string(&path).map_err(|e| harness_core::Error::io(&path, e))?;
        let state: State =
            serde_json::from_str(&text).map_err(|e| harness_core::Error::Learner {
                learner: self.name().into(),
                message: format!("{}: {e}", path.display()),
            })?;
        *self.logits.write().unwrap_or_else(|e| e.into_inner()) = state.logits;
        self.steps = state.steps;
        Ok(())
    }
}

/// Train the menu policy with plain GRPO for a few updates; Avg@3 on the training tasks before
/// and after (fractions), and the number of updates applied.
pub async fn run(run_dir: &Path) -> anyhow::Result<(f64, f64, u64)> {
    let policy = Arc::new(answer_menu());
    let h0 = Harness::new("H0", "Answer with the submit tool.");
    let pool = SiblingPool::starter(h0.clone(), [], serde_json::Value::Null)?;
    let train = tasks(6, Split::Train);
    let (_, before) = evaluate(policy.as_ref(), &h0, &train, 3).await?;

    let cfg = RescueConfig {
        seed: 7,
        updates: 15,
        group_size: 4,
        batch_tasks: 6,
        strategy: Strategy::Grpo,
        ..RescueConfig::default()
    };
    let setup = TrainingSetup {
        policy: policy.clone(),
        environments: vec![Arc::new(ScriptedEnv::new(1))],
        pool,
        train_tasks: train.clone(),
        validation_tasks: Vec::new(),
        learner: Box::new(MenuLearner::new(&policy, 2.0)),
        selector: None,
        calibrator: None,
        weight_sync: None,
    };
    let cost = run_training(cfg, setup, run_dir, false).await?;
    let (_, after) = evaluate(policy.as_ref(), &h0, &train, 3).await?;
    Ok((before, after, cost.updates))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let dir = std::env::temp_dir().join(format!("custom-learner-{}", std::process::id()));
    let (before, after, updates) = run(&dir).await?;
    println!(
        "Avg@3 on the training tasks: {:.1} before, {:.1} after {updates} updates (run files in {})",
        before * 100.0,
        after * 100.0,
        dir.display()
    );
    Ok(())
}
