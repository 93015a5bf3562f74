//! Any [`harness_core::Environment`] over HTTP with JSON bodies: [`server`] serves one,
//! [`client::RemoteEnv`] is an [`harness_core::Environment`] that talks to such a server (so the
//! agent loop, the conformance suite and the rollout code run unchanged on a remote
//! environment), and this module holds the wire types both sides share.
//!
//! # The protocol (`harness-s-env/1`)
//!
//! The shape follows SkyRL-Gym's and OpenEnv's conventions (list, reset/start, step, verify),
//! with an explicit session id so that one server runs many episodes at once. Every body is
//! JSON; unknown fields are refused with a 400 naming the field.
//!
//! | request | who | body | answer |
//! | --- | --- | --- | --- |
//! | `GET /health` | anyone | | `{"status": "ok", "env": "dbbench", "protocol": "harness-s-env/1", "sessions": 3}` |
//! | `GET /v1/tasks?split=train` | runner | | `{"env", "split", "tasks": [{"id", "env", "split", "instruction", "seed"}]}` |
//! | `POST /v1/sessions` | runner | `{"task_id": "dbbench/train-0", "seed": 7, "max_steps": 30}` (`seed` defaults to the task's, `max_steps` to none) | 201 `{"session_id", "token", "env", "task": {...}, "initial_observation", "tools": [{"name", "description", "parameters", "kind"}], "max_steps", "idle_timeout_s", "max_lifetime_s"}` |
//! | `POST /v1/sessions/{id}/step` | runner, its program | `{"name": "execute_sql", "arguments": {"query": "SELECT 1"}}` | `{"observation": {"text", "error", "pagination", "done"}, "steps": 1}` |
//! | `POST /v1/sessions/{id}/finish` | runner, its program | `{"final_answer": null, "action_format": null}` (both optional) | `{"outcome": {"reward": 1.0, "details": {...}}, "steps": 4}`; the program gets `"outcome": null` |
//! | `GET /v1/sessions/{id}` | runner | | `{"session_id", "task_id", "state": "open" or "finished", "steps", "tool_errors", "done", "outcome"}` |
//! | `GET /v1/sessions/{id}/episode` | runner, its program | | the start's answer again (task, initial observation, tools) without the token: what a program handed only the session id reads first |
//! | `DELETE /v1/sessions/{id}` | runner | | 204 |
//!
//! # Authority
//! With [`server::EnvServerConfig::runner_token`] set (as every [`crate::program::ProgramEnv`]
//! sets it, to a fresh random value), a request presents `Authorization: Bearer <token>`:
//! - the **runner token** authorises every route: only the runner lists tasks, opens sessions,
//!   reads outcomes and closes sessions;
//! - a **session token** (the `token` of the start's answer, handed to the episode's program)
//!   authorises its own session's `step`, `finish` and `episode` and nothing else: no listing,
//!   no new sessions, no other session, no status. Its `finish` runs the verifier and answers
//!   `"outcome": null`: the verifier's details (DBBench's gold answers, the hidden tests'
//!   traceback) and the reward stay with the runner, as a harness shows its policy no verdict.
//!
//! Anything else is refused (401 without a token, 403 with one that does not authorise the
//! request; a session that does not exist answers the same 403 as another's, so a token learns
//! nothing about other sessions). Without a runner token the server is open as before: every
//! client may do everything (the standalone `env-serve` on a trusted network).
//!
//! # Bounds
//! Requests made with a session token are bounded per session
//! ([`server::EnvServerConfig::max_requests_per_program`] at once, one more is answered 429)
//! and together ([`server::EnvServerConfig::max_program_requests`], 503); every request is
//! bounded in time ([`server::EnvServerConfig::request_timeout`], 503), and a program holds
//! exactly one session: the one the runner opened for it.
//!
//! - **Tasks** are listed without their metadata: ground truth lives there and never leaves
//!   the server. A session is started by task id, never from a client-supplied task.
//! - **Tool misuse** (an unknown tool, bad arguments) is an observation with `"error": true`
//!   and status 200, as in the agent loop; a status >= 400 means the request itself was refused.
//! - **Verification is the server's**: `finish` runs the environment's verifier once and keeps
//!   the outcome; a second `finish` or a `GET` returns the same outcome, and steps after
//!   `finish` are refused (409). `final_answer` is the closing text of a program that finished
//!   without a submit tool; `action_format` names the environment's action format the program
//!   acted in, when the environment reads closing text only in some format (DBBench's classic
//!   text format).
//! - **Limits**: `max_steps` caps the session's steps (the next one is refused with 429).
//! - **Timeouts**: a session unused for `idle_timeout_s`, or older than `max_lifetime_s`, is
//!   removed with its state; requests naming it then get 404.
//! - **Isolation**: session ids are 128-bit random values; a request can reach only the session
//!   its id names, and each session owns its environment state (the environment's
//!   [`harness_core::EnvSession`]).
//! - **Errors** are `{"error": {"message": "...", "code": 400}}`.

pub mod client;
pub mod server;

use harness_core::{Observation, Outcome, Split, Task, ToolCall, ToolSpec};
use serde::{Deserialize, Serialize};

/// The protocol's name and version, reported by `GET /health`.
pub const PROTOCOL: &str = "harness-s-env/1";

/// A task as the server shows it: everything but the metadata (where ground truth lives).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublicTask {
    /// The task's id.
    pub id: String,
    /// The environment's name.
    pub env: String,
    /// Its split.
    pub split: Split,
    /// What the user asks for.
    pub instruction: String,
    /// The seed of the task's initial state.
    pub seed: u64,
}

impl From<&Task> for PublicTask {
    fn from(task: &Task) -> Self {
        PublicTask {
            id: task.id.clone(),
            env: task.env.clone(),
            split: task.split,
            instruction: task.instruction.clone(),
            seed: task.seed,
        }
    }
}

impl PublicTask {
    /// The task with empty metadata.
    pub fn to_task(&self) -> Task {
        Task::new(
            self.id.clone(),
            self.env.clone(),
            self.split,
            self.instruction.clone(),
            self.seed,
        )
    }
}

/// `GET /health`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Health {
    /// `ok`.
    pub status: String,
    /// The environment's name.
    pub env: String,
    /// [`PROTOCOL`].
    pub protocol: String,
    /// Sessions held now.
    pub sessions: usize,
}

/// `GET /v1/tasks?split=...`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskList {
    /// The environment's name.
    pub env: String,
    /// The split listed.
    pub split: Split,
    /// Its tasks, in the environment's order.
    pub tasks: Vec<PublicTask>,
}

/// `POST /v1/sessions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartRequest {
    /// The task to run, by id.
    pub task_id: String,
    /// The episode seed (default: the task's seed).
    #[serde(default)]
    pub seed: Option<u64>,
    /// The most steps the session accepts (default: no limit beyond the environment's own).
    #[serde(default)]
    pub max_steps: Option<u32>,
}

/// The answer to [`StartRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartResponse {
    /// The session's id: the capability every later request presents.
    pub session_id: String,
    /// The session's token: it authorises this session's `step`, `finish` and `episode` and
    /// nothing else (see the module docs). Absent from the `episode` answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
    /// The environment's name.
    pub env: String,
    /// The task.
    pub task: PublicTask,
    /// Text shown with the instruction at the start.
    pub initial_observation: String,
    /// The tools of the episode.
    pub tools: Vec<ToolSpec>,
    /// The session's step limit, when it has one.
    pub max_steps: Option<u32>,
    /// Seconds without a request after which the session is removed.
    pub idle_timeout_s: f64,
    /// Seconds after its start at which the session is removed.
    pub max_lifetime_s: f64,
}

/// `POST /v1/sessions/{id}/step` takes a [`ToolCall`] (`{"name", "arguments"}`).
pub type StepRequest = ToolCall;

/// The answer to a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepResponse {
    /// What the environment answered.
    pub observation: Observation,
    /// Steps taken so far in the session, this one included.
    pub steps: u32,
}

/// `POST /v1/sessions/{id}/finish`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinishRequest {
    /// The closing text, for a program that finished without a submit tool.
    #[serde(default)]
    pub final_answer: Option<String>,
    /// The environment's action format the program acted in (see the module docs).
    #[serde(default)]
    pub action_format: Option<String>,
}

/// The answer to [`FinishRequest`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FinishResponse {
    /// The verifier's judgement; `None` for a program (a session token), which is not shown
    /// the verdict.
    #[serde(default)]
    pub outcome: Option<Outcome>,
    /// Steps taken in the session.
    pub steps: u32,
}

/// Where a session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionState {
    /// Steps are accepted.
    Open,
    /// Verified; the outcome is final.
    Finished,
}

/// `GET /v1/sessions/{id}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SessionStatus {
    /// The session's id.
    pub session_id: String,
    /// Its task's id.
    pub task_id: String,
    /// Open or finished.
    pub state: SessionState,
    /// Steps taken.
    pub steps: u32,
    /// Steps answered with an error observation.
    #[serde(default)]
    pub tool_errors: u32,
    /// Whether an observation said the episode is done (a submit tool ran).
    pub done: bool,
    /// The outcome, once finished.
    pub outcome: Option<Outcome>,
}

/// A fresh random credential (a runner token, a session token): 128 random bits in hex.
pub fn fresh_token() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// The bearer token of a request's `Authorization` header, if any.
pub(crate) fn bearer(headers: &axum::http::HeaderMap) -> Option<&str> {
    headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|t| !t.is_empty())
}

/// Compare two secrets in time that does not depend on where they first differ.
pub(crate) fn same_secret(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |acc, (x, y)| acc | (x ^ y))
            == 0
}

/// The body of every error answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The message and status of an error answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ErrorDetail {
    /// What went wrong and what was expected.
    pub message: String,
    /// The HTTP status.
    pub code: u16,
}
