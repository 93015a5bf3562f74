//! # harness-external
//!
//! Bring your own harness: the pieces that let an agent program in any language act in
//! harness-s episodes, with the token bookkeeping right.
//!
//! - [`envserver`]: any [`harness_core::Environment`] served over HTTP with JSON bodies (list
//!   tasks, start a session, step with a tool call, finish and verify on the server), with
//!   session timeouts and isolated sessions; and [`envserver::client::RemoteEnv`], an
//!   `Environment` that talks to such a server, so that the agent loop and the conformance
//!   suite run on a remote environment unchanged.
//! - [`proxy`]: a recording OpenAI-compatible proxy in front of the acting policy. A program
//!   talks to it with its usual OpenAI client and a per-episode key; the proxy records each
//!   call's prompt token ids, sampled token ids, log-probs and sampling settings, assembles
//!   the episode's `Trajectory` from what was sampled (never by re-tokenising text), and
//!   counts the turns whose prompt does not extend the previous context (the prefix check).
//! - [`agents`]: the bundled standard-library Python DBBench agent, and
//!   [`agents::mirror_sibling`], which makes it speak a declarative H0's prompts with a
//!   sibling's hooks: an agent program as a sibling a harness-s-trained policy knows.
//! - [`program`]: agent programs as harnesses (`{"kind": "external", "command": [...], "env":
//!   {...}, "limits": {...}}`), each run once per episode by a [`program::ProgramRunner`]
//!   with the proxy's and the environment server's addresses; a crash, a hang past the limit
//!   or an unfinished session is a failed episode with its reason, and the program's process
//!   group is killed when it ends; with a sandbox set, each program runs in harness-envs'
//!   bubblewrap sandbox, and nothing it starts outlives it; the program holds a token for its
//!   own session's step and finish only, and whatever it does, only its episode fails.
//! - [`relay`]: the network of a sandboxed program, a namespace of its own where only the
//!   environment server and the proxy are reachable.
//!
//! It sits beside harness-openai (whose wire types it reuses) and depends on harness-core's
//! seams and harness-envs' sandbox only: it never sees candle, the trainer or an environment's
//! internals.
//!
//! ```no_run
//! use std::sync::Arc;
//! use harness_core::{Environment, Split};
//! use harness_external::envserver::client::RemoteEnv;
//! use harness_external::envserver::server::{EnvServer, EnvServerConfig, EnvServerHandle};
//!
//! # async fn run(env: Arc<dyn Environment>) -> harness_external::Result<()> {
//! let server = EnvServer::new(env, EnvServerConfig::default())?;
//! let handle = EnvServerHandle::spawn("127.0.0.1:0".parse().unwrap(), server).await?;
//! let remote = RemoteEnv::connect(handle.base_url()).await?;
//! let tasks = remote.tasks(Split::Train)?;
//! let session = remote.reset(&tasks[0], 7).await?;
//! println!("{} tools", session.tools().len());
//! # Ok(())
//! # }
//! ```

pub mod agents;
pub mod envserver;
pub mod error;
pub mod program;
pub mod proxy;
pub mod relay;

pub use error::{Error, Result};

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
