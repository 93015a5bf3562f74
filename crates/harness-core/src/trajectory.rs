//! Trajectories (one episode's record) and groups (one task's retained rollouts).

use std::fmt::Write as _;
use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::chat::Role;
use crate::env::Outcome;
use crate::error::{Error, Location, Result};
use crate::harness::HarnessId;
use crate::policy::{FinishReason, TurnSampling};
use crate::task::Task;

/// Who produced a message. Only [`Source::Policy`] tokens enter the training loss.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Source {
    /// The task's instruction.
    Task,
    /// The harness: system prompt, hook messages, memory, protocol errors.
    Harness,
    /// The environment: observations.
    Environment,
    /// The policy: generated turns.
    Policy,
}

/// One message of an episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrajectoryMessage {
    /// The chat role it is rendered with.
    pub role: Role,
    /// Who produced it.
    pub source: Source,
    /// The text as recorded (observations already cut by the tool view).
    pub content: String,
    /// The tool's name for tool responses.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The hook that injected it, for hook messages.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook: Option<String>,
}

/// One policy call with what training needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyTurnRecord {
    /// Index of the assistant message this turn produced (`None` when the prompt overflowed and
    /// nothing was generated).
    pub message_index: Option<usize>,
    /// The prompt tokens (the generating context).
    pub context_tokens: Vec<u32>,
    /// The generated tokens: the only tokens marked for the loss.
    pub tokens: Vec<u32>,
    /// The rollout backend's log-prob of each generated token (`q`, Eq. 16).
    pub logprobs: Vec<f32>,
    /// Why generation stopped.
    pub finish: FinishReason,
    /// The sampling settings the turn was requested with: what `logprobs` are probabilities
    /// under. `None` in trajectories written before the settings were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<TurnSampling>,
}

/// Why an episode ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Termination {
    /// The environment reported the episode done (a submit tool ran).
    EnvDone,
    /// The policy answered without a tool call and no hook held it back.
    PolicyFinished,
    /// `limits.max_model_calls` was reached.
    MaxModelCalls,
    /// `limits.max_env_actions` was reached.
    MaxEnvActions,
    /// The rendered context exceeded `limits.max_context_tokens`.
    ContextLimit,
    /// An external harness (an agent program) crashed, ran past its time limit, or exited
    /// without finishing its session; the reason is in the outcome's details.
    ProgramFailed,
}

/// Counters of an episode.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Counts {
    /// Policy calls.
    pub model_calls: u32,
    /// Tool calls sent to the environment.
    pub env_actions: u32,
    /// Turns whose text did not parse as an action.
    pub parse_failures: u32,
    /// Observations flagged as errors.
    pub tool_errors: u32,
    /// Tool calls refused by `block` hooks or the tool view.
    pub refused_actions: u32,
    /// Finish attempts refused by `block`/`require` hooks.
    pub refused_finishes: u32,
    /// Messages injected by hooks.
    pub hook_messages: u32,
    /// Generated tokens.
    pub policy_tokens: u32,
    /// Turns whose prompt tokens did not extend the previous turn's context and generated
    /// tokens (the prefix check): counted for agent programs by harness-external's recording
    /// proxy; the built-in loop does not count them (0).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub prefix_breaks: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The complete record of one episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Trajectory {
    /// The task's id.
    pub task_id: String,
    /// The environment's name.
    pub env: String,
    /// The generating harness.
    pub harness_id: HarnessId,
    /// Its human name.
    pub harness_name: String,
    /// The episode seed.
    pub seed: u64,
    /// The policy's name.
    pub policy: String,
    /// Every message, in order.
    pub messages: Vec<TrajectoryMessage>,
    /// Every policy call, in order.
    pub turns: Vec<PolicyTurnRecord>,
    /// The policy's closing text, when it finished by answering.
    #[serde(default)]
    pub final_answer: Option<String>,
    /// The verifier's judgement.
    pub outcome: Outcome,
    /// Why the episode ended.
    pub termination: Termination,
    /// Counters.
    pub counts: Counts,
    /// The version of the weights the policy sampled this episode from, when the trainer
    /// tracks versions (every training rollout of the rescue loop records it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<u64>,
}

impl Trajectory {
    /// R in {0, 1}.
    pub fn reward(&self) -> f32 {
        self.outcome.reward
    }

    /// Whether the verifier accepted the episode.
    pub fn is_success(&self) -> bool {
        self.outcome.is_success()
    }

    /// Total generated tokens.
    pub fn policy_tokens(&self) -> usize {
        self.turns.iter().map(|t| t.tokens.len()).sum()
    }

    /// A readable transcript.
    pub fn transcript(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "=== task {} | env {} | harness {} ({}) | seed {} | policy {}",
            self.task_id, self.env, self.harness_name, self.harness_id, self.seed, self.policy
        );
        for (i, message) in self.messages.iter().enumerate() {
            let who = match (message.source, &message.name, &message.hook) {
                (Source::Environment, Some(tool), _) => format!("environment ({tool})"),
                (Source::Harness, _, Some(hook)) => format!("harness hook `{hook}`"),
                (source, _, _) => format!("{source:?}").to_lowercase(),
            };
            let _ = writeln!(out, "--- [{i}] {who} as {:?}", message.role);
            let _ = writeln!(out, "{}", message.content.trim_end());
        }
        let c = &self.counts;
        let _ = writeln!(
            out,
            "=== reward {} | ended by {:?} | {} model calls, {} env actions, {} parse failures, {} tool errors, {} policy tokens",
            self.outcome.reward,
            self.termination,
            c.model_calls,
            c.env_actions,
            c.parse_failures,
            c.tool_errors,
            c.policy_tokens
        );
        if !self.outcome.details.is_null() {
            let _ = writeln!(out, "verifier: {}", self.outcome.details);
        }
        out
    }
}

/// Append trajectories to a JSONL file (one per line), creating it if needed.
pub fn append_jsonl(path: impl AsRef<Path>, trajectories: &[Trajectory]) -> Result<()> {
    let path = path.as_ref();
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| Error::io(path, e))?;
    let mut writer = std::io::BufWriter::new(file);
    for trajectory in trajectories {
        let line = serde_json::to_string(trajectory)
            .unwrap_or_else(|_| unreachable!("trajectories are plain data"));
        writeln!(writer, "{line}").map_err(|e| Error::io(path, e))?;
    }
    writer.flush().map_err(|e| Error::io(path, e))
}

/// Read every trajectory of a JSONL file; errors name the file and line.
pub fn read_jsonl(path: impl AsRef<Path>) -> Result<Vec<Trajectory>> {
    let path = path.as_ref();
    let file = std::fs::File::open(path).map_err(|e| Error::io(path, e))?;
    let mut out = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.map_err(|e| Error::io(path, e))?;
        if line.trim().is_empty() {
            continue;
        }
        let deserializer = &mut serde_json::Deserializer::from_str(&line);
        let trajectory =
            serde_path_to_error::deserialize(deserializer).map_err(|e| Error::Parse {
                location: Location::at(format!("line {}: {}", i + 1, e.path())).in_file(path),
                message: e.into_inner().to_string(),
            })?;
        out.push(trajectory);
    }
    Ok(out)
}

/// How a group was formed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GroupOrigin {
    /// The initial rollouts under the base harness.
    Base,
    /// Fresh rollouts replacing an all-failure base group (Eq. 5).
    Rescue,
    /// A fixed mixture of harnesses chosen before sampling.
    Mixture,
}

/// The trajectories retained for one task in one update.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    /// The task.
    pub task: Task,
    /// The retained trajectories; each keeps its own generating harness.
    pub trajectories: Vec<Trajectory>,
    /// How the group was formed.
    pub origin: GroupOrigin,
}

impl Group {
    /// The rewards, in trajectory order.
    pub fn rewards(&self) -> Vec<f32> {
        self.trajectories.iter().map(Trajectory::reward).collect()
    }

    /// Whether the group has both a success and a failure (a non-zero advantage).
    pub fn is_effective(&self) -> bool {
        let successes = self.trajectories.iter().filter(|t| t.is_success()).count();
        successes > 0 && successes < self.trajectories.len()
    }

    /// The distinct harnesses that produced the group.
    pub fn harness_ids(&self) -> Vec<HarnessId> {
        let mut ids: Vec<HarnessId> = self
            .trajectories
            .iter()
            .map(|t| t.harness_id.clone())
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }
}

/// Pass@k and Avg@k over tasks, from per-task rewards (each task's attempts in one vector).
pub fn pass_and_avg_at_k(per_task: &[Vec<f32>]) -> (f64, f64) {
    if per_task.is_empty() {
        return (0.0, 0.0);
    }
    let n = per_task.len() as f64;
    let pass = per_task
        .iter()
        .filter(|r| r.iter().any(|x| *x >= 1.0))
        .count() as f64
        / n;
    let avg = per_task
        .iter()
        .map(|r| {
            if r.is_empty() {
                0.0
            } else {
                r.iter().map(|x| f64::from(*x)).sum::<f64>() / r.len() as f64
            }
        })
        .sum::<f64>()
        / n;
    (pass, avg)
}
