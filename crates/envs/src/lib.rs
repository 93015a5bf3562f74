//! # harness-envs
//!
//! The built-in environments in one place: the three kinds the paper trains and evaluates on,
//! running offline with verifiers that can be trusted, and tau2-bench's retail
//! customer-service domain, each a crate of its own re-exported here under its module name
//! ([`dbbench`] is `harness-dbbench`, [`appworld`] `harness-appworld`, [`swe`] `harness-swe`,
//! [`tau_retail`] `harness-tau-retail`); depend on one of those alone to build only that world.
//! Each implements [`harness_core::Environment`], has train/validation/test splits (generated
//! from a seed, or the benchmark's), and passes the conformance suite of `harness-testkit`.
//! Environments never call a model. [`labels`] gathers each world's behaviour labeller, and
//! [`starter_pool`] gives each one's base harness with its built-in siblings as a frozen
//! `harness-pool` pool.

// The repository-repair world runs the policy's code in harness-sandbox (user namespaces,
// `prctl`, `close_range`, seccomp, bubblewrap), which is Linux-only: on another target the
// build stops here with that reason.
#[cfg(not(target_os = "linux"))]
compile_error!(
    "harness-envs builds on Linux only: the repository-repair world runs the policy's code in harness-sandbox, which uses Linux namespaces, prctl, close_range and seccomp (bubblewrap). The data model (harness-core), the trainer (grpo-candle) and the router build elsewhere."
);

pub mod labels;
pub mod starter;

pub use harness_appworld as appworld;
pub use harness_dbbench as dbbench;
pub use harness_swe as swe;
pub use harness_tau_retail as tau_retail;

pub use starter::{STARTER_ENVIRONMENTS, starter_pool};

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
