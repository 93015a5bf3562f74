//! # harness-s
//!
//! Agent reinforcement learning with *sibling harnesses*. This umbrella crate re-exports the
//! workspace's library crates under one name and hosts the runnable examples
//! (`cargo run --release --example full_pipeline`).

pub use harness_core as core;
