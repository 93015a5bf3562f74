//! # harness-core
//!
//! The data model and the agent loop of harness-s, the library for agent reinforcement learning
//! with *sibling harnesses*. Every other crate of the workspace builds on this one:
//! environments implement [`Environment`], the candle policy and remote serving engines implement
//! [`Policy`], the LLM roles implement [`ChatModel`], and the router implements
//! [`HarnessSelector`]. The crate itself depends on no ML, HTTP or async-runtime crate.
//!
//! - [`Task`] and [`Split`]: what to solve.
//! - [`Harness`]: everything around the model (prompt and slots, named rules, skills, context and
//!   memory policy, hooks, tool view, limits, lineage) as validated JSON data with a content-hash
//!   [`HarnessId`], plus structured [`HarnessEdit`]s addressed by path.
//! - [`run_episode`]: renders the context, asks the policy, parses `<tool_call>` actions, applies
//!   hooks, steps the environment and records a [`Trajectory`] with every policy turn's context
//!   tokens, generated tokens and rollout log-probs.
//! - [`Group`]: one task's retained trajectories for a GRPO update.
//! - The seams the training loop meets the rest through: [`HarnessSelector`] (which siblings
//!   rescue a task), [`Calibrate`] (re-anchoring the router's evidence) and [`Learner`] (the
//!   policy update).
//!
//! ```
//! use harness_core::{Harness, HarnessEdit, EditOp};
//! use serde_json::json;
//!
//! let base: Harness = Harness::from_json(r#"{
//!     "name": "H0",
//!     "prompt": {
//!         "system": "You solve tasks with tools.\n{action_guidance}",
//!         "slots": {"action_guidance": "Call one tool at a time."}
//!     }
//! }"#)?;
//! base.validate()?;
//!
//! // The paper's S8 sibling: warn when the action budget runs low.
//! let edit = HarnessEdit::new(vec![EditOp::set(
//!     "state.hooks.low-budget-completion",
//!     json!({"action": "warn", "condition": "remaining_steps_lte", "event": "after_tool",
//!            "message": "Budget is low: submit soon.", "parameters": {"threshold": 3}}),
//! )], "reserve budget for submission");
//! let (sibling, undo) = edit.apply_with_inverse(&base)?;
//! assert_ne!(sibling.id(), base.id());
//! assert_eq!(undo.apply(&sibling)?.id(), base.id());
//! # Ok::<(), harness_core::Error>(())
//! ```

pub mod action;
pub mod calibrate;
pub mod chat;
pub mod env;
pub mod episode;
pub mod error;
pub mod fsutil;
pub mod harness;
pub mod labels;
pub mod learner;
pub mod objective;
pub mod policy;
pub mod selector;
pub mod task;
pub mod trajectory;

pub use action::{ActionParser, ParsedAction, TOOL_CALL_FORMAT, ToolCall, ToolCallParser};
pub use calibrate::{Calibrate, CalibrationPoint, CalibrationSummary};
pub use chat::{ChatMessage, ChatModel, ChatRequest, ChatResponse, Role, Usage};
pub use env::{EnvSession, Environment, Observation, Outcome, ToolKind, ToolSpec};
pub use episode::{
    EpisodeOptions, call_seed, cut_text, invalid_action_message, run_episode, run_episode_with,
};
pub use error::{Error, Location, Result};
pub use harness::{
    CONDITIONS, CompiledHook, Condition, ContextPolicy, EditOp, Harness, HarnessEdit, HarnessId,
    HookAction, HookEvent, HookSpec, Limits, Lineage, LocalEval, MemoryPolicy, NOTE_TOOL,
    ProgramSpec, PromptRule, PromptSpec, Skill, ToolView, canonical_json,
};
pub use labels::{
    BehaviourFeature, FeatureKind, GenericLabeller, Step, TrajectoryLabeller, TrajectoryLabels,
    steps,
};
pub use learner::{Learner, UpdateReport};
pub use objective::{
    Intervention, RescueObjective, TokenScoring, first_intervention, h0_request,
    h0_rerender_refusal, prompt_difference, render_history,
};
pub use policy::{
    FinishReason, OutputFormat, Policy, PolicyRequest, PolicyTurn, SamplingParams, TurnSampling,
};
pub use selector::{HarnessSelector, SelectionMode, SelectionRequest};
pub use task::{Split, Task};
pub use trajectory::{
    Counts, Group, GroupOrigin, PolicyTurnRecord, Source, Termination, Trajectory,
    TrajectoryMessage, append_jsonl, pass_and_avg_at_k, read_jsonl,
};

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
