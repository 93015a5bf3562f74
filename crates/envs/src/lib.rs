//! # harness-envs
//!
//! Environments of the three kinds the paper trains and evaluates on, running offline with
//! verifiers that can be trusted, and tau2-bench's retail customer-service domain
//! ([`tau_retail`], loaded from the benchmark's data folder). Each implements
//! [`harness_core::Environment`], has train/validation/test splits (generated from a seed, or
//! the benchmark's), and passes the conformance suite of `harness-testkit`. Environments never call a model. [`starter_pool`] gives each one's base
//! harness with its built-in siblings as a frozen `harness-pool` pool.

// The repository-repair world's sandbox (user namespaces, `prctl`, `close_range`, seccomp,
// bubblewrap), which the agent-program runner also uses, is Linux-only: on another target the
// build stops here with that reason instead of in the system calls.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "harness-envs builds on Linux only: the repository-repair world's sandbox and the agent-program runner use Linux namespaces, prctl, close_range and seccomp (bubblewrap). The data model (harness-core), the trainer (grpo-candle) and the router build elsewhere."
);

pub mod appworld;
pub mod dbbench;
pub mod error;
pub mod labels;
mod sibling;
pub mod starter;
#[cfg(target_os = "linux")]
pub mod swe;
pub mod tau_retail;

pub use error::{Error, Result};
pub use starter::{STARTER_ENVIRONMENTS, starter_pool};

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
