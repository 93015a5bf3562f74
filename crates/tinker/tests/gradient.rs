//! The key correctness check: the per-token gradient the learner turns into loss weights equals
//! the candle autograd gradient of grpo-candle's GRPO objective (`grpo_loss`) on the same data,
//! for random groups, log-probs on both sides of both clip bounds, weights past the cap, and
//! tasks without scored tokens.

use candle_core::{Device, Tensor, Var};
use grpo_candle::train::objective::{GrpoConfig, TokenTerms, grpo_loss};
use harness_core::{
    FinishReason, Group, GroupOrigin, Outcome, PolicyTurnRecord, Split, Task, Termination,
    Trajectory, TurnSampling,
};
use harness_tinker::{GrpoSettings, TokenTerm, build_batch, eq15};
use proptest::prelude::*;

fn trajectory(reward: f32, turns: Vec<(Vec<u32>, Vec<u32>, Vec<f32>)>) -> Trajectory {
    Trajectory {
        task_id: "t".into(),
        env: "e".into(),
        harness_id: harness_core::HarnessId("h".into()),
        harness_name: "H".into(),
        seed: 0,
        policy: "p".into(),
        messages: vec![],
        turns: turns
            .into_iter()
            .map(|(context_tokens, tokens, logprobs)| PolicyTurnRecord {
                message_index: None,
                context_tokens,
                tokens,
                logprobs,
                finish: FinishReason::Stop,
                sampling: Some(TurnSampling {
                    temperature: 1.0,
                    top_p: 1.0,
                    top_k: None,
                    greedy: false,
                }),
            })
            .collect(),
        final_answer: None,
        outcome: Outcome {
            reward,
            details: serde_json::Value::Null,
        },
        termination: Termination::EnvDone,
        policy_version: None,
        counts: Default::default(),
    }
}

/// Groups of trajectories of up to three turns of up to four tokens (some turns empty, so some
/// tasks have no scored token), rewards 0/1.
fn groups() -> impl Strategy<Value = Vec<Group>> {
    let turn = (
        prop::collection::vec(1u32..50, 1..4),
        prop::collection::vec((1u32..50, -3.0f32..-0.05), 0..4),
    )
        .prop_map(|(ctx, toks)| {
            let (t, q): (Vec<u32>, Vec<f32>) = toks.into_iter().unzip();
            (ctx, t, q)
        });
    let traj = (
        prop_oneof![Just(0f32), Just(1f32)],
        prop::collection::vec(turn, 0..3),
    )
        .prop_map(|(r, turns)| trajectory(r, turns));
    prop::collection::vec(prop::collection::vec(traj, 1..5), 1..4).prop_map(|gs| {
        gs.into_iter()
            .enumerate()
            .map(|(i, trajectories)| Group {
                task: Task::new(format!("t{i}"), "e", Split::Train, "x", 0),
                trajectories,
                origin: GroupOrigin::Base,
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn per_token_gradient_equals_grpo_candle_autograd(
        gs in groups(),
        deltas in prop::collection::vec((-0.6f64..0.6, -1.0f64..1.0), 64),
    ) {
        let settings = GrpoSettings::default();
        let batch = build_batch(&gs, &settings).unwrap();
        // Per scored token: pi_old near q (weights on both sides of the cap), pi_theta near
        // pi_old (ratios on both sides of both bounds).
        let mut terms = Vec::new();
        let mut k = 0;
        for s in &batch.sequences {
            for &lq in &s.rollout_logp {
                let (d_new, d_old) = deltas[k % deltas.len()];
                let old = ((lq + d_old).min(-0.01)) as f32 as f64;
                let new = (old + d_new) as f32 as f64;
                terms.push(TokenTerm {
                    logp_new: new,
                    logp_old: old,
                    logp_rollout: lq,
                    advantage: s.advantage,
                    coef: batch.coef(s.task),
                });
                k += 1;
            }
        }
        let ours = eq15(&terms, &settings);

        let t = terms.len();
        let dev = Device::Cpu;
        let mk = |f: &dyn Fn(&TokenTerm) -> f64| {
            Tensor::from_vec(terms.iter().map(|x| f(x) as f32).collect::<Vec<_>>(), t, &dev).unwrap()
        };
        let new = Var::from_tensor(&mk(&|x| x.logp_new)).unwrap();
        let tt = TokenTerms {
            logp_old: mk(&|x| x.logp_old),
            logp_rollout: mk(&|x| x.logp_rollout),
            advantage: mk(&|x| x.advantage),
            coef: mk(&|x| x.coef),
        };
        let (loss, stats) = grpo_loss(new.as_tensor(), &tt, &GrpoConfig::default()).unwrap();
        let candle_loss = f64::from(loss.to_scalar::<f32>().unwrap());
        prop_assert!((ours.loss - candle_loss).abs() < 1e-5 * (1.0 + candle_loss.abs()), "{} vs {}", ours.loss, candle_loss);
        prop_assert_eq!(ours.clipped_low, stats.clipped_low);
        prop_assert_eq!(ours.clipped_high, stats.clipped_high);
        prop_assert_eq!(ours.weight_clipped, stats.weight_clipped);
        if t == 0 {
            return Ok(());
        }
        let grads = loss.backward().unwrap();
        let g: Vec<f32> = grads.get(new.as_tensor()).unwrap().to_vec1().unwrap();
        for (i, (a, b)) in ours.grad.iter().zip(&g).enumerate() {
            let b = f64::from(*b);
            prop_assert!((a - b).abs() < 1e-5 * (1.0 + b.abs()), "token {}: {} vs autograd {}", i, a, b);
        }
    }
}

/// grpo-candle's advantages and the learner's agree (Eq. 6), and a task without scored tokens
/// still counts in |B|.
#[test]
fn advantages_and_task_shares_match_grpo_candle() {
    let rewards = [1.0f32, 0.0, 0.0, 1.0, 1.0];
    let ours = harness_tinker::group_advantages(&rewards, 1e-6);
    let theirs = grpo_candle::train::objective::group_advantages(&rewards, 1e-6);
    for (a, b) in ours.iter().zip(&theirs) {
        assert!((a - f64::from(*b)).abs() < 1e-6);
    }
    let g = |trajs: Vec<Trajectory>| Group {
        task: Task::new("t", "e", Split::Train, "x", 0),
        trajectories: trajs,
        origin: GroupOrigin::Base,
    };
    let empty = g(vec![
        trajectory(1.0, vec![]),
        trajectory(0.0, vec![(vec![1], vec![], vec![])]),
    ]);
    let full = g(vec![
        trajectory(1.0, vec![(vec![1, 2], vec![3, 4], vec![-1.0, -1.0])]),
        trajectory(0.0, vec![(vec![1, 2], vec![5], vec![-1.0])]),
    ]);
    let b = build_batch(&[empty, full], &GrpoSettings::default()).unwrap();
    assert_eq!(b.task_tokens, vec![0, 3]);
    assert!((b.coef(1) - 1.0 / 6.0).abs() < 1e-15);
}
