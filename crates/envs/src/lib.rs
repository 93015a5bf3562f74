//! # harness-envs
//!
//! Environments of the three kinds the paper trains and evaluates on, running offline with
//! verifiers that can be trusted. Each implements [`harness_core::Environment`], generates its
//! own tasks from a seed with train/validation/test splits, and passes the conformance suite of
//! `harness-testkit`. Environments never call a model. [`starter_pool`] gives each one's base
//! harness with its built-in siblings as a frozen `harness-pool` pool.

pub mod appworld;
pub mod dbbench;
pub mod error;
pub mod labels;
mod sibling;
pub mod starter;
pub mod swe;

pub use error::{Error, Result};
pub use starter::{STARTER_ENVIRONMENTS, starter_pool};
