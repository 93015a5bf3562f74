//! # harness-s
//!
//! Agent reinforcement learning with *sibling harnesses*. This root package hosts the runnable
//! examples (`cargo run --release --example full_pipeline`) and the cross-crate tests. As a
//! library it only re-exports `harness-core` as [`core`]: the data model and the
//! seams (tasks, harnesses, the agent loop, trajectories, groups, and the traits the other
//! crates implement). Every other workspace crate (`harness-envs`, `grpo-candle`,
//! `harness-openai`, `harness-testkit`, ...) is used under its own name, so depending on this
//! package does not pull in candle or an HTTP stack.

pub use harness_core as core;
