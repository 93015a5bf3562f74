//! The GRPO trainer driving the real (tiny) Qwen3 model on the CPU.

use std::path::Path;

use candle_core::{DType, Device, Tensor};
use grpo_candle::ops::logprob::LogProbConfig;
use grpo_candle::train::trainer::{
    DecayKind, RolloutRecord, Schedule, TaskRollouts, TrainableLm, Trainer, TrainerConfig,
    TurnTokens,
};
use grpo_candle::{Qwen, QwenConfig};
use rand::{Rng, SeedableRng};

const VOCAB: usize = 50;

fn tiny_model(dtype: DType) -> Qwen {
    let mut cfg = QwenConfig::tiny_qwen3(VOCAB);
    cfg.num_hidden_layers = 1;
    cfg.hidden_size = 32;
    cfg.intermediate_size = 48;
    cfg.head_dim = 8;
    Qwen::new_random(&cfg, 7, dtype, &Device::Cpu).unwrap()
}

/// `tasks` groups of `k` trajectories with 1-2 turns each, random rewards and rollout log-probs.
fn synthetic_groups(seed: u64, tasks: usize, k: usize) -> Vec<TaskRollouts> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let tok = |n: usize, rng: &mut rand_chacha::ChaCha8Rng| -> Vec<u32> {
        (0..n).map(|_| rng.gen_range(0..VOCAB as u32)).collect()
    };
    (0..tasks)
        .map(|_| TaskRollouts {
            rollouts: (0..k)
                .map(|_| {
                    let ctx = tok(rng.gen_range(2..6), &mut rng);
                    let gen1 = tok(rng.gen_range(1..5), &mut rng);
                    let mut turns = vec![TurnTokens {
                        logprobs: gen1.iter().map(|_| -rng.gen_range(0.5f32..4.0)).collect(),
                        context: ctx.clone(),
                        tokens: gen1.clone(),
                    }];
                    if rng.gen_bool(0.5) {
                        let mut ctx2 = ctx.clone();
                        ctx2.extend(&gen1);
                        ctx2.extend(tok(2, &mut rng)); // an observation
                        let gen2 = tok(rng.gen_range(1..4), &mut rng);
                        turns.push(TurnTokens {
                            logprobs: gen2.iter().map(|_| -rng.gen_range(0.5f32..4.0)).collect(),
                            context: ctx2,
                            tokens: gen2,
                        });
                    }
                    RolloutRecord {
                        reward: if rng.gen_bool(0.5) { 1.0 } else { 0.0 },
                        turns,
                    }
                })
                .collect(),
        })
        .collect()
}

fn config(micro_batch_tokens: usize, updates_per_step: usize) -> TrainerConfig {
    TrainerConfig {
        schedule: Schedule {
            lr: 1e-2,
            warmup_steps: 1,
            total_steps: 6,
            decay: DecayKind::Cosine,
            min_lr_ratio: 0.1,
        },
        micro_batch_tokens,
        updates_per_step,
        seed: 11,
        logprob: LogProbConfig {
            token_chunk: 16,
            vocab_chunk: 16,
            ..LogProbConfig::default()
        },
        ..TrainerConfig::default()
    }
}

fn weights(model: &Qwen) -> Vec<(String, Vec<f32>)> {
    model
        .named_vars()
        .into_iter()
        .map(|(n, v)| {
            let t = v.as_tensor().to_dtype(DType::F32).unwrap();
            (n, t.flatten_all().unwrap().to_vec1().unwrap())
        })
        .collect()
}

#[test]
fn one_on_policy_step_skips_the_old_pass_and_updates_every_weight() {
    let model = tiny_model(DType::F32);
    let before = weights(&model);
    let mut trainer = Trainer::new(&model, config(64, 1)).unwrap();
    let groups = synthetic_groups(1, 3, 4);
    let version = model.weights_version();
    let m = trainer.step_rollouts(&model, &groups).unwrap();
    // The update marks the weights changed, so a sampler's prefix cache drops its entries.
    assert_ne!(model.weights_version(), version);
    assert!(!m.old_logprob_pass);
    assert_eq!((m.ratio_min, m.ratio_max, m.ratio_mean), (1.0, 1.0, 1.0));
    assert_eq!(m.clip_frac_low + m.clip_frac_high, 0.0);
    assert_eq!(m.updates, 1);
    assert_eq!(m.step, 1);
    assert_eq!(m.groups, 3);
    let eff = groups
        .iter()
        .filter(|g| {
            let s = g.rollouts.iter().filter(|r| r.reward > 0.0).count();
            s > 0 && s < g.rollouts.len()
        })
        .count();
    assert_eq!(m.effective_groups, eff);
    assert!(m.loss.is_finite() && m.grad_norm > 0.0 && m.entropy_mean > 0.0);
    assert!(m.micro_batches > 1, "budget 64 should split the batch");
    assert!(m.weight_min >= 0.0 && m.weight_max <= 2.0);
    let after = weights(&model);
    let changed = before
        .iter()
        .zip(&after)
        .filter(|(a, b)| a.1 != b.1)
        .count();
    assert_eq!(changed, before.len(), "every parameter should move");
}

#[test]
fn gradient_accumulation_does_not_change_the_step() {
    // f64 so that summation order differences stay far below the tolerance.
    let run = |budget: usize| {
        let model = tiny_model(DType::F64);
        let mut cfg = config(budget, 1);
        cfg.max_grad_norm = None;
        let mut trainer = Trainer::new(&model, cfg).unwrap();
        let m = trainer
            .step_rollouts(&model, &synthetic_groups(2, 3, 4))
            .unwrap();
        (m, weights(&model))
    };
    let (m_small, w_small) = run(8);
    let (m_big, w_big) = run(100_000);
    assert!(m_small.micro_batches > m_big.micro_batches);
    assert_eq!(m_big.micro_batches, 1);
    assert!((m_small.loss - m_big.loss).abs() < 1e-10 * (1.0 + m_big.loss.abs()));
    assert!((m_small.grad_norm - m_big.grad_norm).abs() < 1e-9 * m_big.grad_norm);
    for (a, b) in w_small.iter().zip(&w_big) {
        for (x, y) in a.1.iter().zip(&b.1) {
            assert!((x - y).abs() < 1e-5, "{}: {x} vs {y}", a.0);
        }
    }
}

#[test]
fn concurrent_micro_batches_give_the_same_update_bit_for_bit() {
    // Two steps (the second with two updates, so mini-batches after the first read pi_old) with
    // micro-batches run one at a time and three at a time.
    let run = |parallel: usize| {
        let model = tiny_model(DType::F32);
        let mut cfg = config(24, 1);
        cfg.parallel_micro_batches = parallel;
        let mut trainer = Trainer::new(&model, cfg).unwrap();
        let m1 = trainer
            .step_rollouts(&model, &synthetic_groups(3, 3, 4))
            .unwrap();
        let mut trainer2 = Trainer::new(&model, config(24, 2)).unwrap();
        let m2 = trainer2
            .step_rollouts(&model, &synthetic_groups(4, 4, 3))
            .unwrap();
        (m1, m2, weights(&model))
    };
    let (a1, a2, wa) = run(1);
    let (b1, b2, wb) = run(3);
    assert!(
        a1.micro_batches >= 3,
        "budget 24 should give several micro-batches"
    );
    assert_eq!(a1.micro_batches, b1.micro_batches);
    assert_eq!((a1.loss, a1.grad_norm), (b1.loss, b1.grad_norm));
    assert_eq!((a2.loss, a2.grad_norm), (b2.loss, b2.grad_norm));
    assert_eq!(
        (a1.entropy_mean, a1.ratio_mean),
        (b1.entropy_mean, b1.ratio_mean)
    );
    assert_eq!(wa, wb);
}

#[test]
fn several_updates_per_step_use_the_pre_update_policy_as_old() {
    let model = tiny_model(DType::F32);
    let mut trainer = Trainer::new(&model, config(64, 2)).unwrap();
    let m = trainer
        .step_rollouts(&model, &synthetic_groups(3, 4, 4))
        .unwrap();
    assert!(m.old_logprob_pass);
    assert_eq!(m.updates, 2);
    assert_eq!(trainer.step_count(), 2);
    // The second update sees the first one's effect on the ratio.
    assert!(m.ratio_min < 1.0 || m.ratio_max > 1.0);
}

#[test]
fn step_on_harness_core_groups() {
    use harness_core::trajectory::{Counts, Group, GroupOrigin, PolicyTurnRecord, Termination};
    use harness_core::{FinishReason, HarnessId, Outcome, Split, Task, Trajectory};
    let traj = |reward: f32| Trajectory {
        task_id: "t".into(),
        env: "e".into(),
        harness_id: HarnessId("h0".into()),
        harness_name: "H0".into(),
        seed: 0,
        policy: "p".into(),
        messages: vec![],
        turns: vec![PolicyTurnRecord {
            message_index: Some(1),
            context_tokens: vec![1, 2, 3],
            tokens: vec![4, 5],
            logprobs: vec![-1.0, -2.0],
            finish: FinishReason::Stop,
            sampling: Some(harness_core::TurnSampling {
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
        counts: Counts::default(),
    };
    let group = Group {
        task: Task::new("t", "e", Split::Train, "do it", 0),
        trajectories: vec![traj(1.0), traj(0.0)],
        origin: GroupOrigin::Base,
    };
    let model = tiny_model(DType::F32);
    let mut trainer = Trainer::new(&model, config(64, 1)).unwrap();
    let m = trainer.step(&model, &[group]).unwrap();
    assert_eq!(m.policy_tokens, 4);
    assert_eq!(m.effective_groups, 1);
    assert_eq!(m.sequences, 2);
}

fn save_model(model: &Qwen, dir: &Path) -> grpo_candle::Result<()> {
    let tensors: std::collections::HashMap<String, Tensor> = model
        .named_vars()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().clone()))
        .collect();
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors"))?;
    Ok(())
}

#[test]
fn resume_continues_bit_identically() {
    let cfg = config(48, 2); // two updates per step: exercises the RNG too
    let batches: Vec<Vec<TaskRollouts>> = (0..4).map(|s| synthetic_groups(100 + s, 4, 3)).collect();

    let straight = tiny_model(DType::F32);
    let mut t = Trainer::new(&straight, cfg).unwrap();
    for b in &batches {
        t.step_rollouts(&straight, b).unwrap();
    }

    let first = tiny_model(DType::F32);
    let mut t1 = Trainer::new(&first, cfg).unwrap();
    for b in &batches[..2] {
        t1.step_rollouts(&first, b).unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("ckpt");
    t1.save_checkpoint(&ckpt, |dir| save_model(&first, dir))
        .unwrap();
    // Saving again over an existing checkpoint replaces it.
    t1.save_checkpoint(&ckpt, |dir| save_model(&first, dir))
        .unwrap();
    assert!(!tmp.path().join("ckpt.partial").exists());
    drop((t1, first));

    let resumed = Qwen::load_safetensors(
        straight.config(),
        &[ckpt.join("model.safetensors")],
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let mut t2 = Trainer::resume(&resumed, &ckpt, cfg.logprob).unwrap();
    assert_eq!(t2.step_count(), 4);
    for b in &batches[2..] {
        t2.step_rollouts(&resumed, b).unwrap();
    }
    assert_eq!(t2.step_count(), t.step_count());
    let (a, b) = (weights(&straight), weights(&resumed));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.0, y.0);
        let same =
            x.1.iter()
                .zip(&y.1)
                .all(|(p, q)| p.to_bits() == q.to_bits());
        assert!(same, "{} differs after resume", x.0);
    }
}

#[test]
fn resume_rejects_a_different_model() {
    let model = tiny_model(DType::F32);
    let t = Trainer::new(&model, config(64, 1)).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("c");
    t.save_checkpoint(&ckpt, |_| Ok(())).unwrap();
    let mut other_cfg = QwenConfig::tiny_qwen3(VOCAB);
    other_cfg.num_hidden_layers = 2;
    let other = Qwen::new_random(&other_cfg, 1, DType::F32, &Device::Cpu).unwrap();
    let err = Trainer::resume(&other, &ckpt, LogProbConfig::default())
        .err()
        .unwrap();
    assert!(err.to_string().contains("var_names"), "{err}");
    let _: &dyn TrainableLm = &model;
}

#[test]
fn resume_from_an_hf_checkpoint_continues_bit_identically() {
    use grpo_candle::{PolicyModel, TinySpec};
    let spec = TinySpec {
        hidden_size: 32,
        num_layers: 1,
        intermediate_size: 48,
        head_dim: 8,
        num_merges: 16,
        ..TinySpec::default()
    };
    let cfg = config(64, 1);
    let batches: Vec<Vec<TaskRollouts>> = (0..3).map(|s| synthetic_groups(200 + s, 2, 3)).collect();

    let straight = PolicyModel::tiny(&spec, DType::F32, &Device::Cpu).unwrap();
    let mut t = Trainer::new(&straight.model, cfg).unwrap();
    for b in &batches {
        t.step_rollouts(&straight.model, b).unwrap();
    }

    let first = PolicyModel::tiny(&spec, DType::F32, &Device::Cpu).unwrap();
    let mut t1 = Trainer::new(&first.model, cfg).unwrap();
    t1.step_rollouts(&first.model, &batches[0]).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let ckpt = tmp.path().join("step-1");
    t1.save_checkpoint(&ckpt, |dir| first.save_hf(dir)).unwrap();
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "trainer_state.json",
    ] {
        assert!(ckpt.join(f).exists(), "{f} missing");
    }

    let loaded = PolicyModel::load_dir(&ckpt, DType::F32, &Device::Cpu).unwrap();
    let mut t2 = Trainer::resume(&loaded.model, &ckpt, cfg.logprob).unwrap();
    for b in &batches[1..] {
        t2.step_rollouts(&loaded.model, b).unwrap();
    }
    for (x, y) in weights(&straight.model).iter().zip(&weights(&loaded.model)) {
        assert_eq!(x.0, y.0);
        assert!(
            x.1.iter()
                .zip(&y.1)
                .all(|(p, q)| p.to_bits() == q.to_bits()),
            "{} differs after resume",
            x.0
        );
    }
}

/// Rollout log-probs computed from the model itself at temperature `t` (full logits).
fn model_logprobs(model: &Qwen, turn: &TurnTokens, t: f64) -> Vec<f32> {
    let mut ids = turn.context.clone();
    ids.extend(&turn.tokens);
    let n = ids.len();
    let input = Tensor::from_vec(ids[..n - 1].to_vec(), (1, n - 1), &Device::Cpu).unwrap();
    let logits = (model.forward_logits(&input).unwrap().squeeze(0).unwrap() / t).unwrap();
    let logsm = candle_nn::ops::log_softmax(&logits, candle_core::D::Minus1).unwrap();
    let c = turn.context.len();
    turn.tokens
        .iter()
        .enumerate()
        .map(|(k, &y)| {
            logsm
                .get(c + k - 1)
                .unwrap()
                .get(y as usize)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap()
        })
        .collect()
}

#[test]
fn temperature_matches_rollout_logprobs_taken_at_that_temperature() {
    let model = tiny_model(DType::F32);
    let mut groups = synthetic_groups(5, 2, 4);
    for g in &mut groups {
        for r in &mut g.rollouts {
            for turn in &mut r.turns {
                turn.logprobs = model_logprobs(&model, turn, 0.7);
            }
        }
    }
    let mut cfg = config(10_000, 1);
    cfg.temperature = 0.7;
    let mut trainer = Trainer::new(&model, cfg).unwrap();
    let m = trainer.step_rollouts(&model, &groups).unwrap();
    // pi_old at T = 0.7 equals q, so every correction weight is 1.
    assert!(
        (m.weight_min - 1.0).abs() < 1e-4 && (m.weight_max - 1.0).abs() < 1e-4,
        "{m:?}"
    );
    let share = m.effective_policy_tokens as f64 / m.policy_tokens as f64;
    assert!((0.0..=1.0).contains(&share));
    if m.effective_groups == m.groups {
        assert_eq!(m.effective_policy_tokens, m.policy_tokens);
    }
    // At T = 1 the same rollouts do not match: the weights move away from 1.
    let fresh = tiny_model(DType::F32);
    let mut t1 = Trainer::new(&fresh, config(10_000, 1)).unwrap();
    let m1 = t1.step_rollouts(&fresh, &groups).unwrap();
    assert!(m1.weight_max - m1.weight_min > 1e-3, "{m1:?}");
    let mut bad = config(64, 1);
    bad.temperature = 0.0;
    assert!(Trainer::new(&model, bad).is_err());
}

#[test]
fn a_mini_batch_without_scored_tokens_makes_no_update() {
    // Task 0 only overflowed its context (no tokens); task 1 has mixed rewards.
    let overflow = TaskRollouts {
        rollouts: (0..2)
            .map(|r| RolloutRecord {
                reward: r as f32,
                turns: vec![TurnTokens {
                    context: (0..30).collect(),
                    tokens: vec![],
                    logprobs: vec![],
                }],
            })
            .collect(),
    };
    let full = synthetic_groups(6, 2, 4);
    // Two updates per step: one mini-batch holds the overflow task alone.
    let with_empty = tiny_model(DType::F32);
    let mut a = Trainer::new(&with_empty, config(10_000, 2)).unwrap();
    let m = a
        .step_rollouts(&with_empty, &[overflow.clone(), full[0].clone()])
        .unwrap();
    assert_eq!((m.updates, m.skipped_updates, m.step), (1, 1, 1), "{m:?}");
    assert_eq!(a.step_count(), 1);
    // The same as one update on the task with tokens alone: same learning rate, same bias
    // correction, and the next update too.
    let alone = tiny_model(DType::F32);
    let mut b = Trainer::new(&alone, config(10_000, 1)).unwrap();
    let mb = b.step_rollouts(&alone, &full[..1]).unwrap();
    assert_eq!(m.lr, mb.lr);
    let second = a.step_rollouts(&with_empty, &full[1..]).unwrap();
    let second_b = b.step_rollouts(&alone, &full[1..]).unwrap();
    assert_eq!((second.step, second.lr), (second_b.step, second_b.lr));
    for (x, y) in weights(&with_empty).iter().zip(&weights(&alone)) {
        for (p, q) in x.1.iter().zip(&y.1) {
            assert!((p - q).abs() < 1e-6, "{}: {p} vs {q}", x.0);
        }
    }
    // A batch with no scored tokens at all is reported and leaves the trainer as it was.
    let none = a.step_rollouts(&with_empty, &[overflow]).unwrap();
    assert_eq!((none.updates, none.skipped_updates), (0, 1));
    assert_eq!(a.step_count(), 2);
}

/// A two-trajectory group (rewards 1 and 0) whose one turn per trajectory was sampled with
/// `sampling`, followed by a context-overflow turn with nothing recorded.
fn group_sampled_with(sampling: Option<harness_core::TurnSampling>) -> harness_core::Group {
    use harness_core::trajectory::{Counts, Group, GroupOrigin, PolicyTurnRecord, Termination};
    use harness_core::{FinishReason, HarnessId, Outcome, Split, Task, Trajectory};
    let traj = |reward: f32| Trajectory {
        task_id: "t".into(),
        env: "e".into(),
        harness_id: HarnessId("h0".into()),
        harness_name: "H0".into(),
        seed: 9,
        policy: "p".into(),
        messages: vec![],
        turns: vec![
            PolicyTurnRecord {
                message_index: Some(1),
                context_tokens: vec![1, 2, 3],
                tokens: vec![4, 5],
                logprobs: vec![-1.0, -2.0],
                finish: FinishReason::Stop,
                sampling,
            },
            PolicyTurnRecord {
                message_index: None,
                context_tokens: vec![1, 2, 3, 4, 5, 6],
                tokens: vec![],
                logprobs: vec![],
                finish: FinishReason::ContextOverflow,
                sampling: None,
            },
        ],
        final_answer: None,
        outcome: Outcome {
            reward,
            details: serde_json::Value::Null,
        },
        termination: Termination::ContextLimit,
        policy_version: None,
        counts: Counts::default(),
    };
    Group {
        task: Task::new("t", "e", Split::Train, "do it", 0),
        trajectories: vec![traj(1.0), traj(0.0)],
        origin: GroupOrigin::Base,
    }
}

#[test]
fn step_refuses_rollouts_sampled_unlike_its_pi_old() {
    use harness_core::TurnSampling;
    let plain = TurnSampling {
        temperature: 0.7,
        top_p: 1.0,
        top_k: None,
        greedy: false,
    };
    let model = tiny_model(DType::F32);
    let before = weights(&model);
    let mut cfg = config(64, 1);
    cfg.temperature = f64::from(0.7f32);
    let mut trainer = Trainer::new(&model, cfg).unwrap();
    let cases = [
        (
            Some(TurnSampling {
                top_p: 0.9,
                ..plain
            }),
            "sampling.top_p",
        ),
        (
            Some(TurnSampling {
                top_k: Some(5),
                ..plain
            }),
            "sampling.top_k",
        ),
        (
            Some(TurnSampling {
                temperature: 0.0,
                greedy: true,
                ..plain
            }),
            "sampling.greedy",
        ),
        (
            Some(TurnSampling {
                temperature: 1.0,
                ..plain
            }),
            "sampling.temperature",
        ),
        (None, "no sampling settings recorded"),
    ];
    for (sampling, expected) in cases {
        let err = trainer
            .step(&model, &[group_sampled_with(sampling)])
            .expect_err("mismatched sampling is refused");
        let text = err.to_string();
        assert!(
            text.contains(expected) && text.contains("task `t`") && text.contains("turns[0]"),
            "{text}"
        );
    }
    assert_eq!(trainer.step_count(), 0);
    assert_eq!(weights(&model), before);
    // A top-k at least the vocabulary truncates nothing; the overflow turn without settings
    // has no tokens and is not checked.
    let whole_vocab = TurnSampling {
        top_k: Some(VOCAB),
        ..plain
    };
    for ok in [plain, whole_vocab] {
        let m = trainer
            .step(&model, &[group_sampled_with(Some(ok))])
            .unwrap();
        assert_eq!((m.policy_tokens, m.sequences), (4, 2));
    }
}

#[test]
fn metrics_report_the_mean_weight_and_the_fraction_clipped() {
    let model = tiny_model(DType::F32);
    let mut groups = synthetic_groups(7, 2, 4);
    for g in &mut groups {
        for r in &mut g.rollouts {
            for turn in &mut r.turns {
                turn.logprobs = model_logprobs(&model, turn, 1.0);
            }
        }
    }
    let mut far = groups.clone();
    for g in &mut far {
        for r in &mut g.rollouts {
            for turn in &mut r.turns {
                // q far below pi_old: pi_old / q > 2 on every token.
                turn.logprobs.iter_mut().for_each(|l| *l -= 5.0);
            }
        }
    }
    let fresh = || tiny_model(DType::F32);
    let m_on = {
        let m = fresh();
        Trainer::new(&m, config(10_000, 1))
            .unwrap()
            .step_rollouts(&m, &groups)
            .unwrap()
    };
    assert!((m_on.weight_mean - 1.0).abs() < 1e-4, "{m_on:?}");
    assert_eq!(m_on.weight_clip_frac, 0.0);
    let m_far = {
        let m = fresh();
        Trainer::new(&m, config(10_000, 1))
            .unwrap()
            .step_rollouts(&m, &far)
            .unwrap()
    };
    assert_eq!((m_far.weight_mean, m_far.weight_clip_frac), (2.0, 1.0));
}
