//! # harness-envs
//!
//! Environments of the three kinds the paper trains and evaluates on, running offline with
//! verifiers that can be trusted, and tau2-bench's retail customer-service domain
//! ([`tau_retail`], loaded from the benchmark's data folder). Each implements
//! [`harness_core::Environment`], has train/validation/test splits (generated from a seed, or
//! the benchmark's), and passes the conformance suite of `harness-testkit`. Environments never call a model. [`starter_pool`] gives each one's base
//! harness with its built-in siblings as a frozen `harness-pool` pool.

pub mod appworld;
pub mod dbbench;
pub mod error;
pub mod labels;
mod sibling;
pub mod starter;
pub mod swe;
pub mod tau_retail;

pub use error::{Error, Result};
pub use starter::{STARTER_ENVIRONMENTS, starter_pool};

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
