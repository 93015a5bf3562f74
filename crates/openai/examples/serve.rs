//! Serve a candle policy as an OpenAI-compatible (and SGLang-compatible) endpoint.
//!
//! ```text
//! cargo run --release -p harness-openai --example serve -- --model <dir> --port 8000
//! cargo run --release -p harness-openai --example serve -- --model tiny:0 --port 8000
//! ```
//!
//! `--model` is a Hugging Face checkpoint folder (safetensors + config.json + tokenizer.json),
//! or `tiny[:seed]` for the embedded default's tiny random policy. Then point any OpenAI client
//! at `http://127.0.0.1:8000/v1`, or harness-openai's `RemotePolicy` at `http://127.0.0.1:8000`.
//! The server listens on 127.0.0.1 unless `--host` says otherwise.

#[path = "support/candle.rs"]
mod candle;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use harness_openai::{ApiKey, ServerConfig, ServerHandle, ServerState};

#[derive(Parser, Debug)]
#[command(about = "Serve a candle policy over an OpenAI-compatible HTTP API")]
struct Args {
    /// Checkpoint folder, or `tiny[:seed]`.
    #[arg(long)]
    model: String,
    /// Port to listen on (0 picks a free one).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: std::net::IpAddr,
    /// The model name clients send (default: the folder's name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Most requests decoded together.
    #[arg(long, default_value_t = 32)]
    max_batch: usize,
    /// Context length (default: the model's max_position_embeddings).
    #[arg(long)]
    max_model_len: Option<usize>,
    /// The environment variable holding the bearer key every route then asks for.
    #[arg(long, value_name = "NAME")]
    api_key_env: Option<String>,
    /// The folder under which /update_weights_from_disk may load checkpoints.
    #[arg(long, value_name = "DIR")]
    reload_root: Option<std::path::PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .init();
    let args = Args::parse();
    let model = candle::load_model(&args.model)
        .with_context(|| format!("loading the model `{}`", args.model))?;
    let name = args.served_model_name.clone().unwrap_or_else(|| {
        std::path::Path::new(&args.model)
            .file_name()
            .map_or_else(|| args.model.clone(), |n| n.to_string_lossy().into_owned())
    });
    let max_len = args
        .max_model_len
        .unwrap_or(model.model.config().max_position_embeddings);
    let mut config = ServerConfig::new(name.clone(), max_len);
    if !args.model.starts_with("tiny") {
        config.model_dir = Some(args.model.clone().into());
    }
    if let Some(var) = &args.api_key_env {
        let key = std::env::var(var).with_context(|| format!("--api-key-env {var}: not set"))?;
        config.api_key =
            Some(ApiKey::new(key).with_context(|| format!("--api-key-env {var}: empty"))?);
    }
    config.reload_root = args.reload_root.clone();
    let generator = Arc::new(candle::CandleGenerator::new(model.clone(), args.max_batch));
    let state = ServerState::new(
        config,
        Arc::new(candle::CandleEncoder::new(model)),
        generator.clone(),
    )
    .with_loader(Arc::new(candle::CandleLoader(generator)));
    let server =
        ServerHandle::spawn(SocketAddr::new(args.host, args.port), Arc::new(state)).await?;
    println!(
        "serving `{name}` (context {max_len}) at {} (OpenAI base URL {}/v1); Ctrl-C stops",
        server.base_url(),
        server.base_url()
    );
    tokio::signal::ctrl_c().await?;
    server.shutdown().await?;
    Ok(())
}
