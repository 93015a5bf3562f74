//! Load benchmark: 64 concurrent chat requests against the local server; prints requests/s and
//! generated tokens/s. A benchmark, not a test.
//!
//! ```text
//! # in-process server on a tiny random candle policy (127.0.0.1, free port):
//! cargo run --release -p harness-openai --example load
//! # or against a running `serve` (loopback only):
//! cargo run --release -p harness-openai --example load -- --url http://127.0.0.1:8000 --served-model-name tiny:0
//! ```

#[path = "support/candle.rs"]
mod candle;

use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use harness_core::{ChatMessage, ChatModel, ChatRequest};
use harness_openai::{
    ChatClient, ChatClientConfig, RetryConfig, ServerConfig, ServerHandle, ServerState,
};

#[derive(Parser, Debug)]
struct Args {
    /// A running server's root URL; without it an in-process server is started.
    #[arg(long)]
    url: Option<String>,
    /// The served model's name (with --url).
    #[arg(long, default_value = "tiny:0")]
    served_model_name: String,
    /// The model of the in-process server (folder or `tiny[:seed]`).
    #[arg(long, default_value = "tiny:0")]
    model: String,
    /// Concurrent requests.
    #[arg(long, default_value_t = 64)]
    requests: usize,
    /// Tokens per request.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Batch size of the in-process server's sampler.
    #[arg(long, default_value_t = 64)]
    max_batch: usize,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (base, name, _server) = match &args.url {
        Some(url) => (
            url.trim_end_matches('/').to_string(),
            args.served_model_name.clone(),
            None,
        ),
        None => {
            let model = candle::load_model(&args.model)?;
            let max_len = model.model.config().max_position_embeddings;
            let generator = Arc::new(candle::CandleGenerator::new(model.clone(), args.max_batch));
            let state = ServerState::new(
                ServerConfig::new(args.model.clone(), max_len),
                Arc::new(candle::CandleEncoder::new(model)),
                generator,
            );
            let server = ServerHandle::spawn(([127, 0, 0, 1], 0).into(), Arc::new(state)).await?;
            (server.base_url(), args.model.clone(), Some(server))
        }
    };
    let mut config = ChatClientConfig::new(format!("{base}/v1"), name);
    config.endpoint = config
        .endpoint
        .with_max_concurrency(args.requests.max(1))
        .with_timeout(Duration::from_secs(600))
        .with_retry(RetryConfig::none());
    let client = Arc::new(ChatClient::new(config)?);
    let started = Instant::now();
    let tasks: Vec<_> = (0..args.requests)
        .map(|i| {
            let client = client.clone();
            let max_tokens = args.max_tokens;
            tokio::spawn(async move {
                let mut request = ChatRequest::new(
                    "load",
                    vec![
                        ChatMessage::system("You are a helpful assistant."),
                        ChatMessage::user(format!(
                            "Question {i}: list the tables of the database."
                        )),
                    ],
                );
                request.max_tokens = max_tokens;
                request.temperature = 1.0;
                request.seed = Some(i as u64);
                client.complete(request).await
            })
        })
        .collect();
    let mut failed = 0;
    for t in tasks {
        if t.await?.is_err() {
            failed += 1;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let usage = client.ledger().role("load");
    println!(
        "{} requests ({} failed) in {:.2} s: {:.1} requests/s, {} generated tokens, {:.1} tokens/s ({} prompt tokens)",
        args.requests,
        failed,
        secs,
        usage.requests as f64 / secs,
        usage.completion_tokens,
        usage.completion_tokens as f64 / secs,
        usage.prompt_tokens
    );
    anyhow::ensure!(failed == 0, "{failed} requests failed");
    Ok(())
}
