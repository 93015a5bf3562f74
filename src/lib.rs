//! # harness-s
//!
//! Agent reinforcement learning with *sibling harnesses*. This root package is the
//! `harness-s` command line (`cargo run --release --bin harness-s -- --help`), the runnable
//! examples (`cargo run --release --example full_pipeline`) and the cross-crate tests. As a
//! library it re-exports `harness-core` as [`core`] (the data model and the seams: tasks,
//! harnesses, the agent loop, trajectories, groups, and the traits the other crates
//! implement) and `harness-pipeline` as [`pipeline`] (the main job's configuration and stages,
//! which the binary and the example call). Every other workspace crate (`harness-envs`,
//! `grpo-candle`, `harness-openai`, `harness-rollout`, ...) is used under its own name; a
//! stack that needs only the data model depends on `harness-core` alone, which pulls in no
//! candle and no HTTP stack.

pub use harness_core as core;
pub use harness_pipeline as pipeline;

// The README's example compiles and runs as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
