//! The [`Environment`] seam: tasks with tools and a verifier.

use std::sync::Arc;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::Result;
use crate::action::{ActionParser, ToolCall};
use crate::harness::Harness;
use crate::policy::{Policy, SamplingParams};
use crate::task::{Split, Task};
use crate::trajectory::Trajectory;

/// What a tool is for; the loop and some hook conditions treat the kinds differently.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolKind {
    /// Acts on or reads the environment's state.
    #[default]
    Action,
    /// Reads documentation or schemas (`api_docs`, `show_schema`): a "schema lookup".
    Lookup,
    /// Submits the episode's result (`complete_task`, `commit_final_answer`, `submit`);
    /// `before_finish` hooks apply to it.
    Submit,
}

/// A tool as the policy sees it: a name, a description and JSON-schema parameters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolSpec {
    /// The name the policy calls.
    pub name: String,
    /// What it does.
    pub description: String,
    /// A JSON schema (`{"type": "object", "properties": ..., "required": [...]}`).
    pub parameters: serde_json::Value,
    /// What it is for.
    #[serde(default)]
    pub kind: ToolKind,
}

impl ToolSpec {
    /// An action tool.
    pub fn new(
        name: impl Into<String>,
        description: impl Into<String>,
        parameters: serde_json::Value,
    ) -> Self {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            parameters,
            kind: ToolKind::Action,
        }
    }

    /// The same tool with another kind.
    pub fn with_kind(mut self, kind: ToolKind) -> Self {
        self.kind = kind;
        self
    }
}

/// What an environment answers to one tool call.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Observation {
    /// The text the policy sees.
    pub text: String,
    /// The call failed (unknown tool, bad arguments, an error the tool reported).
    #[serde(default)]
    pub error: bool,
    /// The result is one page of a longer listing (drives the `pagination_present` condition).
    #[serde(default)]
    pub pagination: bool,
    /// The episode is over (the task was submitted).
    #[serde(default)]
    pub done: bool,
}

impl Observation {
    /// A successful observation.
    pub fn ok(text: impl Into<String>) -> Self {
        Observation {
            text: text.into(),
            ..Self::default()
        }
    }

    /// A failed call.
    pub fn error(text: impl Into<String>) -> Self {
        Observation {
            text: text.into(),
            error: true,
            ..Self::default()
        }
    }

    /// Mark as one page of a listing.
    pub fn paginated(mut self) -> Self {
        self.pagination = true;
        self
    }

    /// Mark the episode as finished.
    pub fn finished(mut self) -> Self {
        self.done = true;
        self
    }
}

/// The verifier's judgement of an episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Outcome {
    /// R in {0, 1}.
    pub reward: f32,
    /// What was checked and what was found, for transcripts and failure analysis.
    #[serde(default)]
    pub details: serde_json::Value,
}

impl Outcome {
    /// A success (R = 1).
    pub fn success(details: serde_json::Value) -> Self {
        Outcome {
            reward: 1.0,
            details,
        }
    }

    /// A failure (R = 0).
    pub fn failure(details: serde_json::Value) -> Self {
        Outcome {
            reward: 0.0,
            details,
        }
    }

    /// R = 1.
    pub fn is_success(&self) -> bool {
        self.reward >= 1.0
    }
}

/// A family of tasks with tools and a verifier.
///
/// # Example
/// `examples/custom_environment.rs` in the repository implements an environment of its own, checked with harness-testkit's conformance suite
/// (`cargo run --release --example custom_environment`; `tests/extension_examples.rs` runs it).
///
/// # Design
/// `reset` returns an independent [`EnvSession`] per episode, so one environment value serves
/// many concurrent episodes without sharing mutable state; sessions own their database, file
/// tree or app state and drop it when the episode ends. Environments never call a model.
#[async_trait]
pub trait Environment: Send + Sync {
    /// The name tasks refer to in [`Task::env`].
    fn name(&self) -> &str;

    /// Start an episode of `task`. The same task and seed give the same initial state.
    async fn reset(&self, task: &Task, seed: u64) -> Result<Box<dyn EnvSession>>;

    /// The built-in tasks of a split (environments that only serve external tasks return none).
    fn tasks(&self, split: Split) -> Result<Vec<Task>> {
        let _ = split;
        Ok(Vec::new())
    }

    /// Run one episode of an external harness (an agent program, [`Harness::program`]) on
    /// `task`: [`crate::run_episode`] hands such harnesses here instead of running its own
    /// loop. An environment that can host programs serves itself over HTTP and puts a
    /// recording proxy in front of `policy` (harness-external's `ProgramEnv`); the trajectory's
    /// turns are the tokens the policy sampled, sampled with `sampling`. The default refuses.
    async fn run_program(
        &self,
        policy: &dyn Policy,
        harness: &Harness,
        task: &Task,
        seed: u64,
        sampling: &SamplingParams,
    ) -> Result<Trajectory> {
        let _ = (policy, task, seed, sampling);
        Err(crate::Error::invalid(
            "program",
            format!(
                "harness `{}` is an agent program, and environment `{}` cannot run programs; wrap it in harness_external::program::ProgramEnv",
                harness.name,
                self.name()
            ),
        ))
    }
}

/// One running episode of an [`Environment`].
#[async_trait]
pub trait EnvSession: Send {
    /// The tools available in this episode.
    fn tools(&self) -> Vec<ToolSpec>;

    /// Apply one tool call. Tool misuse is an [`Observation`] with `error` set; `Err` means the
    /// environment itself failed.
    async fn step(&mut self, call: &ToolCall) -> Result<Observation>;

    /// Judge the episode. `final_answer` is the policy's closing text when it finished without
    /// a submit tool.
    async fn verify(&mut self, final_answer: Option<&str>) -> Result<Outcome>;

    /// Extra text shown with the instruction at the start (a table's columns, a repository's
    /// layout). Deterministic in the task and seed.
    fn initial_observation(&self) -> String {
        String::new()
    }

    /// A parser for an action format this environment defines (e.g. DBBench's classic text
    /// format), looked up by the harness's `tool_view.format`.
    fn action_parser(&self, format: &str) -> Option<Arc<dyn ActionParser>> {
        let _ = format;
        None
    }
}
