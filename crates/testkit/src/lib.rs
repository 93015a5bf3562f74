//! # harness-testkit
//!
//! Test support shared by the crates of harness-s, in the spirit of tower-test's mock pair:
//!
//! - [`ScriptedPolicy`] replays fixed turns (or a closure's turns) and reports fake but
//!   consistent token ids and log-probs, so trajectories look like real ones to the trainer.
//! - [`ScriptedEnv`] is a small environment with a paginated listing, a failing tool, a lookup
//!   tool and a submit tool, whose verifier checks the submitted answer.
//! - [`conformance`] is the episode-protocol suite every [`harness_core::Environment`] must pass.
//! - [`data`] finds benchmark data outside the repository through an environment variable:
//!   a test without it says it was skipped and why, and fails under `CI=true`.
//! - [`mutate`] makes hostile copies of valid files (cuts, bit flips, huge numbers, depth bombs)
//!   and checks that a loader refuses them with an error naming the file, without panicking
//!   and within a memory budget.
//!
//! ```
//! use harness_core::{run_episode, Harness, ToolCall};
//! use harness_testkit::{ScriptedEnv, ScriptedPolicy};
//! use serde_json::json;
//!
//! let env = ScriptedEnv::new(3);
//! let task = env.task("t0", "42");
//! let policy = ScriptedPolicy::new(vec![
//!     ToolCall::new("submit", json!({"answer": "42"})).to_tool_call_block(),
//! ]);
//! let harness = Harness::new("H0", "Solve the task.");
//! let trajectory = futures::executor::block_on(run_episode(&policy, &harness, &env, &task, 7))?;
//! assert!(trajectory.is_success());
//! # Ok::<(), harness_core::Error>(())
//! ```

pub mod conformance;
pub mod data;
pub mod harness_sensitive;
pub mod mutate;
mod policy;
mod scripted_env;

pub use policy::{FnPolicy, ScriptedPolicy, byte_tokens, render_fake_context};
pub use scripted_env::ScriptedEnv;

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
