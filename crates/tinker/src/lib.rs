//! # harness-tinker
//!
//! Hands harness-s's policy update to a remote training engine that speaks the Tinker REST
//! protocol: hosted Tinker (LoRA) or SkyRL's self-hosted Tinker server (`skyrl-tx`: a JAX
//! backend on CPU, GPU or TPU, or SkyRL-train with FSDP or Megatron on Ray pushing weights into
//! vLLM). The rescue loop (harness-rollout) sees only harness-core's [`harness_core::Learner`]
//! and harness-rollout's [`harness_rollout::WeightSync`].
//!
//! - [`client`]: [`TinkerClient`], the protocol (`create_session`, `session_heartbeat`,
//!   `create_model`, `forward`, `forward_backward`, `optim_step`, `save_weights`,
//!   `save_weights_for_sampler`, `load_weights`, `retrieve_future`,
//!   `get_server_capabilities`) with timeouts, retries that never apply an update twice, and
//!   futures polled to completion; [`protocol`] holds the JSON bodies.
//! - [`objective`]: the paper's Eq. 15 and its gradient with respect to each policy token's
//!   log-prob, in f64.
//! - [`learner`]: [`TinkerLearner`]: `forward` for `pi_old`, the gradient in Rust, a weighted
//!   `forward_backward` whose gradient is exactly Eq. 15's, `optim_step`; checkpoints through
//!   `save_weights` / `load_weights`.
//! - [`sync`]: [`TinkerWeightSync`]: after each update, the weights saved for the rollout
//!   engine and the version recorded; optionally the adapter downloaded
//!   ([`TinkerClient::download_sampler_weights`], unpacked strictly by [`archive`]) for a
//!   sampler that runs the initial weights plus the LoRA in-process.
//! - `fake` (feature `fake`): an in-process fake Tinker server for tests, here and in the
//!   crates that drive the learner.
//!
//! ```no_run
//! # async fn demo() -> harness_tinker::Result<()> {
//! use harness_tinker::{ServerKind, TinkerClient, TinkerConfig, TinkerLearner, TinkerLearnerConfig};
//!
//! let client = TinkerClient::new(TinkerConfig::new("http://127.0.0.1:8000"))?;
//! let learner = TinkerLearner::connect(client, TinkerLearnerConfig::new("Qwen/Qwen3-4B", ServerKind::SkyrlTx)).await?;
//! # let _ = learner; Ok(()) }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod archive;
pub mod client;
pub mod error;
#[cfg(feature = "fake")]
#[cfg_attr(docsrs, doc(cfg(feature = "fake")))]
pub mod fake;
pub mod learner;
pub mod objective;
pub mod protocol;
pub mod sync;

pub use client::{FutureState, RetryPolicy, TinkerClient, TinkerConfig};
pub use error::{Error, Result};
pub use learner::{
    Batch, LEARNER_FILE, ObjectiveMode, SavedCheckpoint, SavedLora, SavedSettings, Sequence,
    ServerKind, TinkerLearner, TinkerLearnerConfig, TinkerModel, build_batch, read_saved,
};
pub use objective::{Eq15, GrpoSettings, TokenTerm, eq15, group_advantages, importance_weight};
pub use protocol::{
    AdamParams, Datum, ForwardBackwardInput, ForwardBackwardOutput, LoraConfig, LossFn,
};
pub use sync::{SyncTarget, SyncedWeights, TinkerWeightSync};

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
