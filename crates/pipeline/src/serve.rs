//! The `serve` stage: a checkpoint (a trained method's, or the initial one) behind the
//! project's OpenAI- and SGLang-compatible server, with weight reloading, so any OpenAI client,
//! harness-openai's `RemotePolicy`, or the LLM roles of another run can use it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

pub use harness_openai::ApiKey;
use harness_openai::{ServerConfig, ServerHandle, ServerState};

use crate::error::{Result, StageExt};
use crate::setup::load_model;
use harness_openai::candle::{CandleEncoder, CandleGenerator, CandleLoader};

/// Settings of a served checkpoint.
#[derive(Debug, Clone)]
pub struct ServeSettings {
    /// Where to listen (port 0 picks a free one).
    pub addr: SocketAddr,
    /// The model name clients send.
    pub served_model: String,
    /// Most requests decoded together.
    pub max_batch: usize,
    /// The bearer key every route asks for (none: the server is open to anyone who can reach
    /// it).
    pub api_key: Option<ApiKey>,
    /// The folder `/update_weights_from_disk` may load checkpoints from (none: only the served
    /// checkpoint is reloaded, through vLLM's `reload_weights`).
    pub reload_root: Option<PathBuf>,
}

/// Start serving the checkpoint in `dir`; the handle's `base_url` is the server root.
pub async fn serve(dir: &Path, settings: &ServeSettings) -> Result<ServerHandle> {
    let model = load_model(dir)?;
    let max_len = model.model.config().max_position_embeddings;
    let mut config = ServerConfig::new(settings.served_model.clone(), max_len);
    config.model_dir = Some(dir.to_path_buf());
    config.api_key = settings.api_key.clone();
    config.reload_root = settings.reload_root.clone();
    let generator = Arc::new(CandleGenerator::new(model.clone(), settings.max_batch));
    let state = ServerState::new(
        config,
        Arc::new(CandleEncoder::new(model)),
        generator.clone(),
    )
    .with_loader(Arc::new(CandleLoader(generator)));
    ServerHandle::spawn(settings.addr, Arc::new(state))
        .await
        .at("serve")
}
