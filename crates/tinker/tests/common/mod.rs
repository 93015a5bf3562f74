//! Test support: the fake Tinker server (`harness_tinker::fake`, feature `fake`) and groups of
//! scripted trajectories.

#![allow(dead_code)]

pub use harness_tinker::fake::*;

use harness_core::{
    FinishReason, Group, GroupOrigin, Outcome, PolicyTurnRecord, Role, Source, Split, Task,
    Termination, Trajectory, TrajectoryMessage, TurnSampling,
};
use serde_json::Value;

/// The tensors of a safetensors file (f32 only), read by hand: name -> (shape, values).
pub fn read_safetensors(
    bytes: &[u8],
) -> std::collections::BTreeMap<String, (Vec<usize>, Vec<f32>)> {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    header
        .as_object()
        .unwrap()
        .iter()
        .filter(|(k, _)| *k != "__metadata__")
        .map(|(k, t)| {
            assert_eq!(t["dtype"], "F32");
            let shape: Vec<usize> = t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as usize)
                .collect();
            let (a, b) = (
                t["data_offsets"][0].as_u64().unwrap() as usize,
                t["data_offsets"][1].as_u64().unwrap() as usize,
            );
            let values = data[a..b]
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            (k.clone(), (shape, values))
        })
        .collect()
}

/// One trajectory: a harness system turn and an observation as context, then policy turns.
/// Turn 2's context extends turn 1's context + tokens (packed); turn 3 starts afresh.
pub fn trajectory(seed: u64, reward: f32, base: u32) -> Trajectory {
    let msg = |source, role| TrajectoryMessage {
        role,
        source,
        content: String::new(),
        name: None,
        hook: None,
    };
    let turn = |context: Vec<u32>, tokens: Vec<u32>, q: Vec<f32>| PolicyTurnRecord {
        message_index: Some(1),
        context_tokens: context,
        tokens,
        logprobs: q,
        finish: FinishReason::Stop,
        sampling: Some(TurnSampling {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            greedy: false,
        }),
    };
    let c1 = vec![1, 2, 3, base];
    let t1 = vec![base + 1, base + 2];
    let mut c2 = c1.clone();
    c2.extend(&t1);
    c2.extend([7, 8]); // an observation: context, never scored
    let t2 = vec![base + 3];
    let c3 = vec![9, 9, base];
    let t3 = vec![base + 4, base + 5];
    Trajectory {
        task_id: "t".into(),
        env: "e".into(),
        harness_id: harness_core::HarnessId(format!("h{seed}")),
        harness_name: "H0".into(),
        seed,
        policy: "fake".into(),
        messages: vec![
            msg(Source::Harness, Role::System),
            msg(Source::Policy, Role::Assistant),
        ],
        turns: vec![
            turn(c1, t1, vec![-1.2, -0.9]),
            turn(c2, t2, vec![-1.5]),
            turn(c3, t3, vec![-0.7, -2.5]),
        ],
        final_answer: None,
        outcome: Outcome {
            reward,
            details: Value::Null,
        },
        termination: Termination::PolicyFinished,
        policy_version: None,
        counts: Default::default(),
    }
}

pub fn group(id: &str, rewards: &[f32], base: u32) -> Group {
    Group {
        task: Task::new(id, "e", Split::Train, "do it", 0),
        trajectories: rewards
            .iter()
            .enumerate()
            .map(|(i, &r)| trajectory(i as u64, r, base + 10 * i as u32))
            .collect(),
        origin: GroupOrigin::Rescue,
    }
}
