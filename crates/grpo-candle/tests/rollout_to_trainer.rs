//! Real `CandlePolicy` rollouts through harness-core's `run_episode` into the GRPO trainer, on a
//! tiny model built here: on-policy, the first update's ratio (Eq. 13) is exactly 1 and the
//! correction weight (Eq. 16) is 1 within float tolerance on every policy token, and only the
//! tokens the policy generated are scored.

use candle_core::{DType, Device};
use grpo_candle::train::trainer::{Trainer, TrainerConfig};
use grpo_candle::{CandlePolicy, PolicyModel, PolicyOptions, TinySpec};
use harness_core::{
    EpisodeOptions, FinishReason, Group, GroupOrigin, Harness, SamplingParams, Termination,
    Trajectory, run_episode_with,
};
use harness_testkit::ScriptedEnv;
use serde_json::json;

/// H0 with a `require` hook that refuses to finish before `submit` ran, so that a random tiny
/// model's text answers do not end the episode and every episode has several turns whose
/// contexts extend each other (the trainer packs them).
fn harness(max_context_tokens: u32) -> Harness {
    let mut h = Harness::new("H0", "Use the tools, then submit.");
    h.hooks.insert(
        "submit-first".into(),
        serde_json::from_value(json!({"action": "require", "event": "before_finish",
            "condition": "tool_called", "parameters": {"name": "submit"},
            "message": "Submit the answer with the submit tool first."}))
        .expect("hook"),
    );
    h.limits.max_model_calls = 3;
    h.limits.max_output_tokens = 10;
    h.limits.max_context_tokens = max_context_tokens;
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn candle_rollouts_train_on_policy_with_unit_ratio_and_weight() {
    let spec = TinySpec {
        num_merges: 64,
        hidden_size: 32,
        num_layers: 1,
        intermediate_size: 64,
        head_dim: 8,
        seed: 3,
        ..TinySpec::default()
    };
    let policy = CandlePolicy::new(
        PolicyModel::tiny(&spec, DType::F32, &Device::Cpu).expect("tiny model"),
        PolicyOptions::default(),
    );
    let env = ScriptedEnv::new(2);
    // The trainer computes pi_old at temperature 0.8 over the whole vocabulary: sample so.
    let options = EpisodeOptions {
        sampling: SamplingParams {
            temperature: 0.8,
            ..SamplingParams::default()
        },
    };
    let mut groups = Vec::new();
    for task_no in 0..2u64 {
        let task = env.task(&format!("t{task_no}"), "5");
        let mut trajectories: Vec<Trajectory> = Vec::new();
        for attempt in 0..2u64 {
            let seed = 10 * task_no + attempt;
            let mut t = run_episode_with(&policy, &harness(4096), &env, &task, seed, &options)
                .await
                .expect("episode runs");
            if attempt == 1 {
                // The same episode again with the context limit at its second prompt: the third
                // call overflows and is recorded with its whole context and no tokens (the
                // trainer must not run it through the model).
                let limit = t.turns[1].context_tokens.len() as u32;
                t = run_episode_with(&policy, &harness(limit), &env, &task, seed, &options)
                    .await
                    .expect("episode runs");
                assert_eq!(t.termination, Termination::ContextLimit);
                let last = t.turns.last().expect("turns");
                assert!(last.tokens.is_empty() && last.finish == FinishReason::ContextOverflow);
            }
            // A random model solves nothing; give each group a success and a failure so the
            // update has non-zero advantages (Eq. 6).
            t.outcome.reward = attempt as f32;
            trajectories.push(t);
        }
        groups.push(Group {
            task,
            trajectories,
            origin: GroupOrigin::Base,
        });
    }
    let all: Vec<&Trajectory> = groups.iter().flat_map(|g| &g.trajectories).collect();
    assert!(
        all.iter().all(|t| t.turns.len() >= 2),
        "multi-turn episodes"
    );

    let cfg = TrainerConfig {
        temperature: f64::from(options.sampling.temperature),
        micro_batch_tokens: 512,
        ..TrainerConfig::default()
    };
    let mut trainer = Trainer::new(policy.model(), cfg).expect("trainer");
    let m = {
        let _guard = policy.update_guard();
        trainer.step(policy.model(), &groups).expect("step")
    };
    assert!(!m.old_logprob_pass);
    assert_eq!(
        (m.updates, m.skipped_updates, m.effective_groups),
        (1, 0, 2)
    );
    // Eq. 13 on the first mini-batch: pi_theta and pi_old are the same weights.
    assert_eq!((m.ratio_min, m.ratio_max), (1.0, 1.0), "{m:?}");
    // Eq. 16: the trainer's pi_old reproduces the sampler's q on every policy token.
    assert!(
        (m.weight_min - 1.0).abs() < 1e-3 && (m.weight_max - 1.0).abs() < 1e-3,
        "{m:?}"
    );
    assert_eq!(m.weight_clip_frac, 0.0);
    // Exactly the generated tokens are scored: harness text, the task and observations are
    // context only.
    let generated: usize = all.iter().map(|t| t.policy_tokens()).sum();
    assert!(generated > 0);
    assert_eq!(m.policy_tokens, generated);
    // Positions run through the model: each sequence ends at its last generated token, so at
    // most every generating turn's context + tokens, and never an overflow turn's context.
    let upper: usize = all
        .iter()
        .flat_map(|t| &t.turns)
        .filter(|turn| !turn.tokens.is_empty())
        .map(|turn| turn.context_tokens.len() + turn.tokens.len() - 1)
        .sum();
    assert!(
        m.sequence_tokens <= upper,
        "{} > {upper}",
        m.sequence_tokens
    );
    if m.sequences == all.len() {
        // Each trajectory packed into one sequence: exactly up to its last generated token.
        let exact: usize = all
            .iter()
            .map(|t| {
                let last = t
                    .turns
                    .iter()
                    .rfind(|turn| !turn.tokens.is_empty())
                    .unwrap();
                last.context_tokens.len() + last.tokens.len() - 1
            })
            .sum();
        assert_eq!(m.sequence_tokens, exact);
    }
}
