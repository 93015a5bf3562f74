//! # harness-openai
//!
//! OpenAI-compatible backends for harness-s. At scale, the LLM roles (editor, failure analyst,
//! profiler, voters) run on any provider and rollouts run on a serving engine; this crate makes
//! both real, and serves a local token-level policy (grpo-candle's) over the same API:
//!
//! - [`ChatClient`]: a [`harness_core::ChatModel`] for any `/v1/chat/completions` endpoint, with
//!   timeouts, seeded exponential backoff with jitter on 429/5xx/dropped connections (honouring
//!   `Retry-After`), a concurrency limit and token usage per role in a shared [`UsageLedger`].
//! - [`RemotePolicy`]: a [`harness_core::Policy`] that renders and tokenizes locally through a
//!   [`PromptEncoder`] and samples on vLLM (`/v1/completions` with token-id prompts and
//!   log-probs) or SGLang (`/generate` with `input_ids`), returning the engine's token ids and
//!   log-probs for the importance weight; [`RemotePolicy::sync_weights`] pushes new weights.
//! - [`server`]: an axum server exposing any [`TokenGenerator`] + [`PromptEncoder`] as an
//!   OpenAI-compatible (and SGLang-compatible) endpoint.
//!
//! It sits beside grpo-candle (which implements [`PromptEncoder`] and [`TokenGenerator`] for the
//! candle policy) and is the only crate of the workspace with HTTP dependencies.
//!
//! ```no_run
//! use harness_core::{ChatMessage, ChatModel, ChatRequest};
//! use harness_openai::{ChatClient, ChatClientConfig, UsageLedger};
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! // Binaries read the key from the environment; the library takes it as a value.
//! let key = std::env::var("OPENAI_API_KEY")?;
//! let mut config = ChatClientConfig::new("https://api.openai.com/v1", "gpt-4o-mini");
//! config.endpoint = config.endpoint.with_api_key(key).with_max_concurrency(8);
//! let ledger = UsageLedger::new();
//! let client = ChatClient::with_ledger(config, ledger.clone())?;
//! let answer = client
//!     .complete(ChatRequest::new("editor", vec![ChatMessage::user("Propose one harness edit.")]))
//!     .await?;
//! println!("{}\n{:?}", answer.text, ledger.role("editor"));
//! # Ok(())
//! # }
//! ```

#![cfg_attr(docsrs, feature(doc_cfg))]

#[cfg(feature = "candle")]
#[cfg_attr(docsrs, doc(cfg(feature = "candle")))]
pub mod candle;
pub mod chat;
pub mod engine;
pub mod error;
pub mod protocol;
pub mod remote;
pub mod server;
pub mod transport;
pub mod usage;

pub use chat::{ChatClient, ChatClientConfig};
pub use engine::{
    EncodedPolicy, PromptEncoder, StreamedToken, TokenGenerator, TokenOutput, TokenRequest,
    TokenSink, choice_seed,
};
pub use error::{Error, Result};
pub use remote::{EngineKind, ReloadMethod, RemotePolicy, RemotePolicyConfig};
pub use server::{ApiKey, ServerConfig, ServerHandle, ServerState, WeightLoader};
pub use transport::{EndpointConfig, RetryConfig, http_client, install_tls_provider};
pub use usage::{RequestUsage, UsageLedger};

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use harness_core::{ChatModel, Policy};

    // Trait objects are how pipelines wire these at run time: keep them object safe.
    #[test]
    fn traits_are_object_safe() {
        fn _chat(_: Arc<dyn ChatModel>) {}
        fn _policy(_: Arc<dyn Policy>) {}
        fn _encoder(_: Arc<dyn super::PromptEncoder>) {}
        fn _generator(_: Arc<dyn super::TokenGenerator>) {}
        fn _loader(_: Arc<dyn super::WeightLoader>) {}
    }
}

// The README's examples compile and run as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
struct ReadmeDoctests;
