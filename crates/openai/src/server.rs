//! A local OpenAI-compatible server for any [`TokenGenerator`] + [`PromptEncoder`] (the candle
//! policy in the `serve` example).
//!
//! Routes:
//! - `GET /health`, `GET /v1/models`;
//! - `POST /v1/chat/completions`: messages and tools rendered through the encoder's chat
//!   template; `<tool_call>` blocks in the output come back as `tool_calls`;
//! - `POST /v1/completions`: text or token-id prompts (one or a batch), with vLLM's
//!   `return_token_ids` (`choices[i].token_ids`, `choices[i].prompt_token_ids`),
//!   `return_tokens_as_token_ids` and log-probs in `choices[i].logprobs.token_logprobs`;
//! - `POST /generate`: SGLang's native API with `input_ids` and `return_logprob`;
//! - `POST /update_weights_from_disk` (SGLang), `POST /collective_rpc` with
//!   `reload_weights` and `POST /reset_prefix_cache` (vLLM dev mode), when a [`WeightLoader`] is
//!   given. A request-named folder must lie under [`ServerConfig::reload_root`] (403 otherwise),
//!   and one reload runs at a time: a second one meanwhile is answered 409, not queued.
//!
//! With [`ServerConfig::api_key`] set, every route answers 401 without that bearer key.
//!
//! Both OpenAI routes serve `n` choices per prompt through
//! [`TokenGenerator::generate_choices`] (an engine prefills the prompt once for all of them;
//! choice `i` is seeded [`crate::choice_seed`]`(seed, i)`, usage counts the prompt once), and
//! `stream: true` as server-sent events in OpenAI's chunk format ending with `data: [DONE]` (see
//! [`stream`]); a client that disconnects mid-stream stops its sequences' decoding.
//! `response_format: {"type": "json_object"}` reaches the generator as
//! [`OutputFormat::JsonObject`] (the candle generator then decodes under a JSON grammar);
//! `json_schema` is refused with a 400 rather than silently not enforced.
//!
//! Bad requests get a 4xx with an OpenAI-style `{"error": {"message", "type", "param", "code"}}`
//! body and the server keeps serving. Every request is handled on its own task and calls the
//! generator directly, so concurrent requests reach the generator concurrently and it batches
//! them; the server never serialises generation.

pub mod stream;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use async_trait::async_trait;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use harness_core::{FinishReason, OutputFormat, SamplingParams};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::task::JoinHandle;

use crate::engine::{
    PromptEncoder, TokenGenerator, TokenOutput, TokenRequest, TokenSink, check_output,
};
use crate::error::{Error, Result};
use crate::protocol::{
    ChatChoice, ChatCompletionRequest, ChatCompletionResponse, ChatLogprobs, ChatTokenLogprob,
    CompletionChoice, CompletionLogprobs, CompletionRequest, CompletionResponse, MessageContent,
    PromptField, SglangGenerateRequest, WireMessage, WireToolCall, WireUsage, from_wire_messages,
    split_tool_calls,
};

/// Loads new weights into the served model (for the weight-sync endpoints).
#[async_trait]
pub trait WeightLoader: Send + Sync {
    /// Load the HF checkpoint in `dir`.
    async fn load(&self, dir: &Path) -> harness_core::Result<()>;
}

/// A secret clients must send as `Authorization: Bearer <key>`; its `Debug` hides it.
#[derive(Clone, PartialEq, Eq)]
pub struct ApiKey(String);

impl ApiKey {
    /// A key; an empty one is refused (it would let a request with an empty bearer through).
    pub fn new(key: impl Into<String>) -> Option<Self> {
        let key = key.into();
        (!key.is_empty()).then_some(ApiKey(key))
    }

    /// Whether `presented` is this key, in time that does not depend on where they differ.
    pub fn matches(&self, presented: &str) -> bool {
        constant_time_eq(self.0.as_bytes(), presented.as_bytes())
    }
}

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(<redacted>)")
    }
}

/// Byte equality that reads every byte of the longer input whatever the contents, so the
/// answer's timing does not tell a caller how long a prefix of the key it guessed.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    let mut diff = a.len() ^ b.len();
    for i in 0..a.len().max(b.len()) {
        let x = a.get(i).copied().unwrap_or(0);
        let y = b.get(i).copied().unwrap_or(0);
        diff |= usize::from(x ^ y);
    }
    std::hint::black_box(diff) == 0
}

/// What the server serves and its limits.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// The model name clients must send (and `/v1/models` lists).
    pub model: String,
    /// The context length: prompts of this many tokens or more are refused, and generation
    /// stops when prompt plus output reach it.
    pub max_model_len: usize,
    /// `max_tokens` of a completion that does not say (OpenAI's default is 16).
    pub default_completion_tokens: usize,
    /// The most prompts one `/v1/completions` request may batch.
    pub max_prompts_per_request: usize,
    /// The most choices (`n`) one request may ask for.
    pub max_choices: usize,
    /// The checkpoint directory being served (vLLM-style `reload_weights` reloads it).
    pub model_dir: Option<PathBuf>,
    /// When set, every route (`/health` included) answers 401 unless the request carries
    /// `Authorization: Bearer <key>`. The binary fills it from `--api-key` or an environment
    /// variable; this crate reads neither.
    pub api_key: Option<ApiKey>,
    /// The folder under which `/update_weights_from_disk` may name checkpoints. Both it and the
    /// requested path are canonicalized (so `..` and symlinks that leave it are refused with a
    /// 403); unset, reloads from a request-named path are refused. vLLM's `reload_weights`
    /// reloads [`Self::model_dir`], which the server chose, and needs no root.
    pub reload_root: Option<PathBuf>,
    /// `max_tokens` of a chat completion that does not say (instead of the rest of the
    /// context, which one careless client could spend the decoding thread on).
    pub default_chat_tokens: usize,
    /// The most stop strings one request may give (OpenAI allows 4).
    pub max_stop_strings: usize,
    /// The longest stop string in bytes: every decoded step is matched against each of them, on
    /// the one decoding thread every client shares.
    pub max_stop_bytes: usize,
    /// The most generation requests (`/v1/completions`, `/v1/chat/completions`, `/generate`)
    /// admitted at once, decoding or waiting for the generator, streams until they end; one
    /// more is answered 503 with `Retry-After` instead of queueing without bound.
    pub max_queued_requests: usize,
}

impl ServerConfig {
    /// Serve `model` with a context of `max_model_len` tokens.
    pub fn new(model: impl Into<String>, max_model_len: usize) -> Self {
        ServerConfig {
            model: model.into(),
            max_model_len,
            default_completion_tokens: 16,
            max_prompts_per_request: 64,
            max_choices: 64,
            model_dir: None,
            api_key: None,
            reload_root: None,
            default_chat_tokens: 2048,
            max_stop_strings: 4,
            max_stop_bytes: 256,
            max_queued_requests: 256,
        }
    }
}

/// Counters the server keeps (read them through [`ServerState::stats`]).
#[derive(Debug, Default)]
pub struct ServerStats {
    requests: AtomicU64,
    rejected: AtomicU64,
    generations: AtomicU64,
    generated_tokens: AtomicU64,
    in_flight: AtomicU64,
    peak_in_flight: AtomicU64,
}

/// A copy of the counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StatsSnapshot {
    /// Requests received on the generation routes.
    pub requests: u64,
    /// Requests answered with a 4xx.
    pub rejected: u64,
    /// Generator calls made.
    pub generations: u64,
    /// Tokens generated.
    pub generated_tokens: u64,
    /// The most generator calls in flight at once.
    pub peak_in_flight: u64,
}

struct InFlight<'a>(&'a ServerStats);

impl<'a> InFlight<'a> {
    fn enter(stats: &'a ServerStats) -> Self {
        let now = stats.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        stats.peak_in_flight.fetch_max(now, Ordering::SeqCst);
        InFlight(stats)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Everything the handlers share.
pub struct ServerState {
    config: ServerConfig,
    encoder: Arc<dyn PromptEncoder>,
    generator: Arc<dyn TokenGenerator>,
    loader: Option<Arc<dyn WeightLoader>>,
    /// Held while weights load: a second reload meanwhile is answered 409 rather than queued,
    /// so that two full copies of the weights are never being read at once.
    reloading: tokio::sync::Mutex<()>,
    /// One permit per admitted generation request ([`ServerConfig::max_queued_requests`]).
    admission: Arc<Semaphore>,
    next_id: AtomicU64,
    stats: ServerStats,
}

impl ServerState {
    /// Serve `generator` with `encoder`'s chat template and tokenizer.
    pub fn new(
        config: ServerConfig,
        encoder: Arc<dyn PromptEncoder>,
        generator: Arc<dyn TokenGenerator>,
    ) -> Self {
        ServerState {
            encoder,
            generator,
            loader: None,
            reloading: tokio::sync::Mutex::new(()),
            admission: Arc::new(Semaphore::new(config.max_queued_requests.max(1))),
            next_id: AtomicU64::new(0),
            stats: ServerStats::default(),
            config,
        }
    }

    /// A place for one more generation request, or the 503 that says to come back later.
    #[allow(clippy::result_large_err)]
    fn admit(&self) -> std::result::Result<OwnedSemaphorePermit, Response> {
        self.admission.clone().try_acquire_owned().map_err(|_| {
            tracing::debug!("request queue full: answered 503");
            let mut response = ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                kind: "server_error",
                param: None,
                message: format!(
                    "the server is busy ({} requests queued); retry later",
                    self.config.max_queued_requests
                ),
            }
            .into_response();
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            response
        })
    }

    /// Also serve the weight-sync endpoints with `loader`.
    pub fn with_loader(mut self, loader: Arc<dyn WeightLoader>) -> Self {
        self.loader = Some(loader);
        self
    }

    /// The configuration.
    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// The counters so far.
    pub fn stats(&self) -> StatsSnapshot {
        let s = &self.stats;
        StatsSnapshot {
            requests: s.requests.load(Ordering::SeqCst),
            rejected: s.rejected.load(Ordering::SeqCst),
            generations: s.generations.load(Ordering::SeqCst),
            generated_tokens: s.generated_tokens.load(Ordering::SeqCst),
            peak_in_flight: s.peak_in_flight.load(Ordering::SeqCst),
        }
    }

    fn id(&self, prefix: &str) -> String {
        format!("{prefix}-{}", self.next_id.fetch_add(1, Ordering::SeqCst))
    }

    /// Run the generator with contract checks and counters.
    async fn run(&self, request: TokenRequest) -> std::result::Result<TokenOutput, ApiError> {
        let mut out = self.run_choices(request, 1, None).await?;
        Ok(out.remove(0))
    }

    /// `n` choices of one prompt (one shared prefill where the generator supports it), their
    /// tokens streamed to `sink` when given.
    async fn run_choices(
        &self,
        request: TokenRequest,
        n: usize,
        sink: Option<TokenSink>,
    ) -> std::result::Result<Vec<TokenOutput>, ApiError> {
        let max = request.max_new_tokens;
        let outs = {
            let _guard = InFlight::enter(&self.stats);
            self.stats.generations.fetch_add(n as u64, Ordering::SeqCst);
            self.generator.generate_choices(request, n, sink).await
        }
        .map_err(|e| ApiError::internal(format!("generation failed: {e}")))?;
        if outs.len() != n {
            return Err(ApiError::internal(format!(
                "the generator broke its contract: {} outputs for n = {n}",
                outs.len()
            )));
        }
        for out in &outs {
            check_output(out, max, Some(self.generator.vocab_size())).map_err(|m| {
                ApiError::internal(format!("the generator broke its contract: {m}"))
            })?;
            self.stats
                .generated_tokens
                .fetch_add(out.tokens.len() as u64, Ordering::SeqCst);
        }
        Ok(outs)
    }
}

/// An OpenAI-style error answer.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    kind: &'static str,
    param: Option<&'static str>,
    message: String,
}

impl ApiError {
    fn bad(param: Option<&'static str>, message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            param,
            message: message.into(),
        }
    }

    fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            kind: "server_error",
            param: None,
            message: message.into(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.status.as_u16(),
            }
        });
        (self.status, axum::Json(body)).into_response()
    }
}

type ApiResult = std::result::Result<Response, ApiError>;

fn parse<T: DeserializeOwned>(body: &Bytes) -> std::result::Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "malformed JSON"
        } else {
            "invalid request"
        };
        ApiError::bad(None, format!("{what}: {e}"))
    })
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn finish_str(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Length => "length",
        _ => "stop",
    }
}

fn check_model(state: &ServerState, model: &str) -> std::result::Result<(), ApiError> {
    if model == state.config.model {
        Ok(())
    } else {
        Err(ApiError {
            status: StatusCode::NOT_FOUND,
            kind: "invalid_request_error",
            param: Some("model"),
            message: format!(
                "The model `{model}` does not exist; this server serves `{}`.",
                state.config.model
            ),
        })
    }
}

fn check_max_tokens(
    name: &'static str,
    value: Option<i64>,
) -> std::result::Result<Option<usize>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) if v >= 1 => Ok(Some(v as usize)),
        Some(v) => Err(ApiError::bad(
            Some(name),
            format!("{name} must be at least 1, got {v}"),
        )),
    }
}

fn sampling(
    config: &ServerConfig,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    stop: Vec<String>,
) -> std::result::Result<SamplingParams, ApiError> {
    if stop.len() > config.max_stop_strings {
        return Err(ApiError::bad(
            Some("stop"),
            format!(
                "at most {} stop strings are allowed, got {}",
                config.max_stop_strings,
                stop.len()
            ),
        ));
    }
    if let Some(long) = stop.iter().find(|s| s.len() > config.max_stop_bytes) {
        return Err(ApiError::bad(
            Some("stop"),
            format!(
                "a stop string may be at most {} bytes long, got one of {} bytes",
                config.max_stop_bytes,
                long.len()
            ),
        ));
    }
    let temperature = temperature.unwrap_or(1.0);
    if !temperature.is_finite() || temperature < 0.0 {
        return Err(ApiError::bad(
            Some("temperature"),
            format!("temperature must be a finite number >= 0, got {temperature}"),
        ));
    }
    let top_p = top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad(
            Some("top_p"),
            format!("top_p must be in (0, 1], got {top_p}"),
        ));
    }
    let top_k = match top_k {
        None | Some(-1) | Some(0) => None,
        Some(k) if k > 0 => Some(k as usize),
        Some(k) => {
            return Err(ApiError::bad(
                Some("top_k"),
                format!("top_k must be -1 (disabled) or positive, got {k}"),
            ));
        }
    };
    Ok(SamplingParams {
        temperature,
        top_p,
        top_k,
        stop,
    })
}

impl ServerState {
    /// Validate a prompt and return how many tokens may be generated after it.
    fn check_prompt(
        &self,
        param: &'static str,
        prompt: &[u32],
        max_tokens: usize,
    ) -> std::result::Result<usize, ApiError> {
        if prompt.is_empty() {
            return Err(ApiError::bad(Some(param), "the prompt is empty"));
        }
        let vocab = self.generator.vocab_size();
        if let Some(t) = prompt.iter().find(|t| **t as usize >= vocab) {
            return Err(ApiError::bad(
                Some(param),
                format!("token id {t} is outside the vocabulary (size {vocab})"),
            ));
        }
        let limit = self.config.max_model_len;
        if prompt.len() >= limit {
            return Err(ApiError::bad(
                Some(param),
                format!(
                    "This model's maximum context length is {limit} tokens, but the prompt has {} tokens.",
                    prompt.len()
                ),
            ));
        }
        Ok(max_tokens.min(limit - prompt.len()))
    }

    fn default_seed(&self) -> u64 {
        // Requests without a seed still get distinct, reproducible-per-order seeds.
        harness_core::call_seed(0x5EED, self.next_id.fetch_add(1, Ordering::SeqCst) as u32)
    }
}

/// `ok`, or 503 with the reason when the generator cannot answer (its decoding thread died), so
/// that a supervisor restarts the server instead of routing requests to it.
async fn health(State(state): State<Arc<ServerState>>) -> Response {
    match state.generator.health() {
        Ok(()) => axum::Json(json!({"status": "ok"})).into_response(),
        Err(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            axum::Json(json!({"status": "unhealthy", "reason": reason})),
        )
            .into_response(),
    }
}

async fn models(State(state): State<Arc<ServerState>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": state.config.model,
            "object": "model",
            "created": 0,
            "owned_by": "harness-s",
            "max_model_len": state.config.max_model_len,
        }]
    }))
    .into_response()
}

fn counted(state: &ServerState, result: ApiResult) -> Response {
    state.stats.requests.fetch_add(1, Ordering::SeqCst);
    match result {
        Ok(r) => r,
        Err(e) => {
            if e.status.is_client_error() {
                state.stats.rejected.fetch_add(1, Ordering::SeqCst);
                tracing::debug!(status = %e.status, message = %e.message, "rejected request");
            } else {
                tracing::warn!(status = %e.status, message = %e.message, "request failed");
            }
            e.into_response()
        }
    }
}

async fn completions(State(state): State<Arc<ServerState>>, body: Bytes) -> Response {
    let permit = match state.admit() {
        Ok(permit) => permit,
        Err(busy) => return busy,
    };
    let result = completions_inner(&state, &body, permit).await;
    counted(&state, result)
}

fn check_n(state: &ServerState, n: Option<u32>) -> std::result::Result<usize, ApiError> {
    let max = state.config.max_choices;
    match n {
        None => Ok(1),
        Some(n) if n >= 1 && n as usize <= max => Ok(n as usize),
        Some(n) => Err(ApiError::bad(
            Some("n"),
            format!("n must be between 1 and {max}, got {n}"),
        )),
    }
}

/// `stream_options.include_usage` of a streaming request (OpenAI's final usage chunk).
fn include_usage(extra: &serde_json::Map<String, Value>) -> bool {
    extra
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        == Some(true)
}

/// `response_format` of a request: `{"type": "text"}` (or none) or `{"type": "json_object"}`,
/// which constrains decoding to one JSON object. Schemas (`json_schema`) are refused rather than
/// ignored, so that a client relying on one learns it is not enforced here.
fn output_format(
    extra: &serde_json::Map<String, Value>,
) -> std::result::Result<OutputFormat, ApiError> {
    let Some(format) = extra.get("response_format") else {
        return Ok(OutputFormat::Text);
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(OutputFormat::Text),
        Some("json_object") => Ok(OutputFormat::JsonObject),
        Some("json_schema") => Err(ApiError::bad(
            Some("response_format"),
            "`json_schema` is not supported: this server constrains answers to `json_object` \
             (any JSON object); validate the fields on the client",
        )),
        _ => Err(ApiError::bad(
            Some("response_format"),
            format!(
                "expected {{\"type\": \"text\"}} or {{\"type\": \"json_object\"}}, got {format}"
            ),
        )),
    }
}

async fn completions_inner(
    state: &Arc<ServerState>,
    body: &Bytes,
    permit: OwnedSemaphorePermit,
) -> ApiResult {
    let req: CompletionRequest = parse(body)?;
    check_model(state, &req.model)?;
    if req.echo == Some(true) {
        return Err(ApiError::bad(Some("echo"), "echo is not supported"));
    }
    let n = check_n(state, req.n)?;
    if req.logprobs.is_some_and(|n| n > 20) {
        return Err(ApiError::bad(
            Some("logprobs"),
            "logprobs must be at most 20",
        ));
    }
    let max_tokens = check_max_tokens("max_tokens", req.max_tokens)?
        .unwrap_or(state.config.default_completion_tokens);
    let params = sampling(
        &state.config,
        req.temperature,
        req.top_p,
        req.top_k,
        req.stop.clone().map(|s| s.into_vec()).unwrap_or_default(),
    )?;
    let prompts: Vec<Vec<u32>> = match &req.prompt {
        PromptField::Tokens(t) => vec![t.clone()],
        PromptField::TokenBatch(b) => b.clone(),
        PromptField::Text(t) => encode_texts(state, vec![t.clone()]).await?,
        // Counted before any is tokenized.
        PromptField::Texts(ts) if ts.len() > state.config.max_prompts_per_request => {
            return Err(too_many_prompts(state, ts.len()));
        }
        PromptField::Texts(ts) => encode_texts(state, ts.clone()).await?,
    };
    if prompts.is_empty() || prompts.len() > state.config.max_prompts_per_request {
        return Err(too_many_prompts(state, prompts.len()));
    }
    if prompts.len() * n
        > state
            .config
            .max_prompts_per_request
            .max(state.config.max_choices)
    {
        return Err(ApiError::bad(
            Some("n"),
            format!(
                "{} prompts x n = {n} choices is more than this server answers in one request",
                prompts.len()
            ),
        ));
    }
    let seed = req.seed.unwrap_or_else(|| state.default_seed());
    let format = output_format(&req.extra)?;
    let mut requests = Vec::with_capacity(prompts.len());
    for p in &prompts {
        let budget = state.check_prompt("prompt", p, max_tokens)?;
        requests.push(TokenRequest {
            prompt: p.clone(),
            max_new_tokens: budget,
            sampling: params.clone(),
            seed,
            format,
        });
    }
    let as_ids = req.return_tokens_as_token_ids == Some(true);
    let with_ids = req.return_token_ids == Some(true);
    if req.stream == Some(true) {
        let shape = stream::Shape::Completion {
            logprobs: req.logprobs,
            as_ids,
            with_ids,
        };
        return Ok(stream::respond(
            state.clone(),
            requests,
            n,
            shape,
            include_usage(&req.extra),
            permit,
        ));
    }
    let jobs = requests.into_iter().map(|r| state.run_choices(r, n, None));
    let outputs = futures::future::try_join_all(jobs).await?;
    let mut choices = Vec::with_capacity(outputs.len() * n);
    let (mut prompt_total, mut completion_total) = (0, 0);
    for (p, (outs, prompt)) in outputs.into_iter().zip(prompts).enumerate() {
        // Usage counts a prompt once, however many choices share it.
        prompt_total += prompt.len();
        for (i, out) in outs.into_iter().enumerate() {
            completion_total += out.tokens.len();
            let text = decode(state, &out.tokens)?;
            let logprobs = match req.logprobs {
                None => None,
                Some(top) => Some(completion_logprobs(state, &out, as_ids, top)?),
            };
            choices.push(CompletionChoice {
                // OpenAI's order: the n choices of prompt 0, then those of prompt 1, ...
                index: (p * n + i) as u32,
                text,
                logprobs,
                finish_reason: Some(finish_str(out.finish).into()),
                token_ids: with_ids.then(|| out.tokens.clone()),
                prompt_token_ids: with_ids.then(|| prompt.clone()),
            });
        }
    }
    Ok(axum::Json(CompletionResponse {
        id: state.id("cmpl"),
        object: "text_completion".into(),
        created: now(),
        model: state.config.model.clone(),
        choices,
        usage: Some(WireUsage::new(prompt_total, completion_total)),
    })
    .into_response())
}

fn too_many_prompts(state: &ServerState, got: usize) -> ApiError {
    ApiError::bad(
        Some("prompt"),
        format!(
            "expected 1 to {} prompts, got {got}",
            state.config.max_prompts_per_request
        ),
    )
}

/// Run tokenizer work (a chat template, a long prompt) on tokio's blocking pool: on the async
/// runtime it would stall every other connection, `/health` included, while it runs.
async fn off_runtime<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> std::result::Result<T, ApiError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| ApiError::internal(format!("the tokenizer task failed: {e}")))
}

async fn encode_texts(
    state: &ServerState,
    texts: Vec<String>,
) -> std::result::Result<Vec<Vec<u32>>, ApiError> {
    let encoder = state.encoder.clone();
    off_runtime(move || {
        texts
            .iter()
            .map(|t| encoder.encode_text(t))
            .collect::<harness_core::Result<Vec<_>>>()
    })
    .await?
    .map_err(|e| ApiError::bad(Some("prompt"), format!("cannot tokenize the prompt: {e}")))
}

fn decode(state: &ServerState, tokens: &[u32]) -> std::result::Result<String, ApiError> {
    state
        .encoder
        .decode(tokens)
        .map_err(|e| ApiError::internal(format!("cannot decode the output: {e}")))
}

fn completion_logprobs(
    state: &ServerState,
    out: &TokenOutput,
    as_ids: bool,
    top: u32,
) -> std::result::Result<CompletionLogprobs, ApiError> {
    let mut tokens = Vec::with_capacity(out.tokens.len());
    let mut text_offset = Vec::with_capacity(out.tokens.len());
    let mut offset = 0usize;
    for &t in &out.tokens {
        let piece = decode(state, &[t])?;
        text_offset.push(offset);
        offset += piece.chars().count();
        tokens.push(if as_ids {
            format!("token_id:{t}")
        } else {
            piece
        });
    }
    // Only the sampled token's log-prob is known to a plain sampler: it is reported as the
    // single "top" alternative when alternatives are asked for.
    let top_logprobs = (top > 0).then(|| {
        tokens
            .iter()
            .zip(&out.logprobs)
            .map(|(t, lp)| Some([(t.clone(), *lp)].into_iter().collect()))
            .collect()
    });
    Ok(CompletionLogprobs {
        tokens,
        token_logprobs: out.logprobs.iter().map(|lp| Some(*lp)).collect(),
        top_logprobs,
        text_offset,
    })
}

fn chat_logprobs(
    state: &ServerState,
    out: &TokenOutput,
) -> std::result::Result<ChatLogprobs, ApiError> {
    let content = out
        .tokens
        .iter()
        .zip(&out.logprobs)
        .map(|(&t, &logprob)| {
            let token = decode(state, &[t])?;
            Ok(ChatTokenLogprob {
                bytes: Some(token.as_bytes().to_vec()),
                token,
                logprob,
                top_logprobs: Vec::new(),
            })
        })
        .collect::<std::result::Result<_, ApiError>>()?;
    Ok(ChatLogprobs {
        content: Some(content),
    })
}

async fn chat_completions(State(state): State<Arc<ServerState>>, body: Bytes) -> Response {
    let permit = match state.admit() {
        Ok(permit) => permit,
        Err(busy) => return busy,
    };
    let result = chat_inner(&state, &body, permit).await;
    counted(&state, result)
}

/// A chat answer's message: `<tool_call>` blocks become `tool_calls` when tools were offered
/// (ids `call_<turn>_<k>`), and the finish reason says so.
fn chat_message(
    text: String,
    finish: FinishReason,
    wants_calls: bool,
    turn: u64,
) -> (WireMessage, &'static str) {
    match wants_calls.then(|| split_tool_calls(&text)).flatten() {
        Some((head, calls)) => (
            WireMessage {
                role: "assistant".into(),
                content: (!head.is_empty()).then_some(MessageContent::Text(head)),
                name: None,
                tool_calls: calls
                    .iter()
                    .enumerate()
                    .map(|(k, c)| WireToolCall::from_call(format!("call_{turn}_{k}"), c))
                    .collect(),
                tool_call_id: None,
            },
            "tool_calls",
        ),
        None => (WireMessage::text("assistant", text), finish_str(finish)),
    }
}

async fn chat_inner(
    state: &Arc<ServerState>,
    body: &Bytes,
    permit: OwnedSemaphorePermit,
) -> ApiResult {
    let req: ChatCompletionRequest = parse(body)?;
    check_model(state, &req.model)?;
    let n = check_n(state, req.n)?;
    if req.messages.is_empty() {
        return Err(ApiError::bad(
            Some("messages"),
            "messages must not be empty",
        ));
    }
    let limit = match check_max_tokens("max_completion_tokens", req.max_completion_tokens)? {
        Some(n) => Some(n),
        None => check_max_tokens("max_tokens", req.max_tokens)?,
    };
    let params = sampling(
        &state.config,
        req.temperature,
        req.top_p,
        None,
        req.stop.clone().map(|s| s.into_vec()).unwrap_or_default(),
    )?;
    let format = output_format(&req.extra)?;
    let messages =
        from_wire_messages(&req.messages).map_err(|m| ApiError::bad(Some("messages"), m))?;
    let tools: Vec<_> = req.tools.iter().map(|t| t.to_spec()).collect();
    let encoder = state.encoder.clone();
    let specs = tools.clone();
    let prompt = off_runtime(move || encoder.encode(&messages, &specs))
        .await?
        .map_err(|e| {
            ApiError::bad(
                Some("messages"),
                format!("cannot render the conversation: {e}"),
            )
        })?;
    let budget = state.check_prompt(
        "messages",
        &prompt,
        limit.unwrap_or(state.config.default_chat_tokens),
    )?;
    let request = TokenRequest {
        prompt: prompt.clone(),
        max_new_tokens: budget,
        sampling: params,
        seed: req.seed.unwrap_or_else(|| state.default_seed()),
        format,
    };
    let wants_calls =
        !tools.is_empty() && req.tool_choice.as_ref().and_then(Value::as_str) != Some("none");
    let logprobs = req.logprobs == Some(true);
    if req.stream == Some(true) {
        let shape = stream::Shape::Chat {
            logprobs,
            tools: wants_calls,
        };
        return Ok(stream::respond(
            state.clone(),
            vec![request],
            n,
            shape,
            include_usage(&req.extra),
            permit,
        ));
    }
    let outs = state.run_choices(request, n, None).await?;
    let mut choices = Vec::with_capacity(n);
    let mut completion_total = 0;
    for (i, out) in outs.into_iter().enumerate() {
        completion_total += out.tokens.len();
        let text = decode(state, &out.tokens)?;
        let turn = state.next_id.fetch_add(1, Ordering::SeqCst);
        let (message, finish) = chat_message(text, out.finish, wants_calls, turn);
        choices.push(ChatChoice {
            index: i as u32,
            message,
            finish_reason: Some(finish.into()),
            logprobs: match logprobs {
                true => Some(chat_logprobs(state, &out)?),
                false => None,
            },
        });
    }
    Ok(axum::Json(ChatCompletionResponse {
        id: state.id("chatcmpl"),
        object: "chat.completion".into(),
        created: now(),
        model: state.config.model.clone(),
        choices,
        usage: Some(WireUsage::new(prompt.len(), completion_total)),
    })
    .into_response())
}

async fn sglang_generate(State(state): State<Arc<ServerState>>, body: Bytes) -> Response {
    let _permit = match state.admit() {
        Ok(permit) => permit,
        Err(busy) => return busy,
    };
    let result = sglang_inner(&state, &body).await;
    counted(&state, result)
}

async fn sglang_inner(state: &ServerState, body: &Bytes) -> ApiResult {
    let req: SglangGenerateRequest = parse(body)?;
    if req.stream {
        return Err(ApiError::bad(Some("stream"), "streaming is not supported"));
    }
    let sp = &req.sampling_params;
    let max_tokens =
        check_max_tokens("sampling_params.max_new_tokens", Some(sp.max_new_tokens))?.unwrap_or(1);
    let params = sampling(
        &state.config,
        Some(sp.temperature),
        Some(sp.top_p),
        Some(sp.top_k),
        sp.stop.clone(),
    )?;
    let budget = state.check_prompt("input_ids", &req.input_ids, max_tokens)?;
    let out = state
        .run(TokenRequest {
            prompt: req.input_ids.clone(),
            max_new_tokens: budget,
            sampling: params,
            seed: sp.sampling_seed.unwrap_or_else(|| state.default_seed()),
            format: OutputFormat::Text,
        })
        .await?;
    let text = decode(state, &out.tokens)?;
    let mut meta = json!({
        "id": state.id("gen"),
        "finish_reason": {"type": finish_str(out.finish)},
        "prompt_tokens": req.input_ids.len(),
        "completion_tokens": out.tokens.len(),
    });
    if req.return_logprob {
        meta["output_token_logprobs"] = out
            .tokens
            .iter()
            .zip(&out.logprobs)
            .map(|(t, lp)| json!([lp, t, Value::Null]))
            .collect();
    }
    Ok(
        axum::Json(json!({"text": text, "output_ids": out.tokens, "meta_info": meta}))
            .into_response(),
    )
}

async fn load_weights(state: &ServerState, dir: &Path) -> std::result::Result<(), ApiError> {
    let Some(loader) = &state.loader else {
        return Err(ApiError::bad(
            None,
            "this server was started without a weight loader",
        ));
    };
    let Ok(_reloading) = state.reloading.try_lock() else {
        return Err(ApiError {
            status: StatusCode::CONFLICT,
            kind: "invalid_request_error",
            param: None,
            message: "a weight reload is already in progress; retry when it has finished".into(),
        });
    };
    loader.load(dir).await.map_err(|e| {
        ApiError::bad(
            Some("model_path"),
            format!("cannot load `{}`: {e}", dir.display()),
        )
    })
}

/// `requested` as a canonical folder inside the configured reload root, or why not.
fn allowed_reload_dir(
    config: &ServerConfig,
    requested: &str,
) -> std::result::Result<PathBuf, ApiError> {
    let forbidden = |message: String| ApiError {
        status: StatusCode::FORBIDDEN,
        kind: "invalid_request_error",
        param: Some("model_path"),
        message,
    };
    let Some(root) = &config.reload_root else {
        return Err(forbidden(
            "this server reloads no request-named path (its reload root is not set)".into(),
        ));
    };
    let root = root.canonicalize().map_err(|e| {
        ApiError::internal(format!(
            "the reload root `{}` cannot be resolved: {e}",
            root.display()
        ))
    })?;
    let dir = Path::new(requested).canonicalize().map_err(|e| {
        ApiError::bad(
            Some("model_path"),
            format!("cannot load `{requested}`: {e}"),
        )
    })?;
    if !dir.starts_with(&root) {
        return Err(forbidden(format!(
            "`{requested}` resolves to `{}`, outside the reload root `{}`",
            dir.display(),
            root.display()
        )));
    }
    if !dir.is_dir() {
        return Err(ApiError::bad(
            Some("model_path"),
            format!("`{requested}` is not a folder"),
        ));
    }
    Ok(dir)
}

async fn update_weights_from_disk(State(state): State<Arc<ServerState>>, body: Bytes) -> Response {
    let result = async {
        let req: Value = parse(&body)?;
        let Some(path) = req.get("model_path").and_then(Value::as_str) else {
            return Err(ApiError::bad(
                Some("model_path"),
                "model_path (a directory) is required",
            ));
        };
        let loaded = match allowed_reload_dir(&state.config, path) {
            // The canonical path: a symlink swapped in after the check is not followed.
            Ok(dir) => load_weights(&state, &dir).await,
            Err(e) => Err(e),
        };
        match loaded {
            Ok(()) => Ok(
                axum::Json(json!({"success": true, "message": format!("loaded {path}")}))
                    .into_response(),
            ),
            Err(e) => Ok((
                e.status,
                axum::Json(json!({"success": false, "message": e.message})),
            )
                .into_response()),
        }
    }
    .await;
    counted(&state, result)
}

async fn collective_rpc(State(state): State<Arc<ServerState>>, body: Bytes) -> Response {
    let result = async {
        let req: Value = parse(&body)?;
        match req.get("method").and_then(Value::as_str) {
            Some("reload_weights") => {
                let Some(dir) = state.config.model_dir.clone() else {
                    return Err(ApiError::bad(
                        None,
                        "this server does not know its model directory",
                    ));
                };
                load_weights(&state, &dir).await?;
                Ok(axum::Json(json!({"results": [null]})).into_response())
            }
            Some(other) => Err(ApiError::bad(
                Some("method"),
                format!("unsupported method `{other}`; only `reload_weights` is served"),
            )),
            None => Err(ApiError::bad(
                Some("method"),
                "missing 'method' in request body",
            )),
        }
    }
    .await;
    counted(&state, result)
}

async fn reset_prefix_cache() -> Response {
    StatusCode::OK.into_response()
}

async fn not_found() -> Response {
    ApiError {
        status: StatusCode::NOT_FOUND,
        kind: "invalid_request_error",
        param: None,
        message: "no such route".into(),
    }
    .into_response()
}

/// Refuse a request without the configured bearer key (OpenAI's 401 body).
async fn authorize(
    State(state): State<Arc<ServerState>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(key) = &state.config.api_key else {
        return next.run(request).await;
    };
    let presented = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    match presented {
        Some(p) if key.matches(p) => next.run(request).await,
        presented => ApiError {
            status: StatusCode::UNAUTHORIZED,
            kind: "invalid_request_error",
            param: None,
            message: match presented {
                None => "You didn't provide an API key: send `Authorization: Bearer <key>`.",
                Some(_) => "Incorrect API key provided.",
            }
            .into(),
        }
        .into_response(),
    }
}

/// The server's routes on `state`.
pub fn router(state: Arc<ServerState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/generate", post(sglang_generate))
        .route("/update_weights_from_disk", post(update_weights_from_disk))
        .route("/collective_rpc", post(collective_rpc))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .fallback(not_found)
        // Long token-id prompts (65k tokens) are about 0.5 MB of JSON.
        .layer(DefaultBodyLimit::max(32 << 20))
        // Outermost, so the fallback and the body limit are behind the key too.
        .layer(middleware::from_fn_with_state(state.clone(), authorize))
        .with_state(state)
}

/// A server running on a tokio task; it stops when [`ServerHandle::shutdown`] is called or the
/// handle is dropped.
pub struct ServerHandle {
    addr: SocketAddr,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl ServerHandle {
    /// Bind `addr` (port 0 picks a free port) and serve `state`.
    pub async fn spawn(addr: SocketAddr, state: Arc<ServerState>) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| Error::Server(format!("cannot bind {addr}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Server(format!("no local address: {e}")))?;
        let (stop, stopped) = oneshot::channel::<()>();
        let app = router(state);
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(ServerHandle {
            addr,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>` (the server root; chat clients append `/v1`).
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stop accepting, let in-flight requests finish, and wait for the server task.
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await
                .map_err(|e| Error::Server(format!("server task failed: {e}")))?
                .map_err(|e| Error::Server(format!("server failed: {e}")))?;
        }
        Ok(())
    }
}

impl Drop for ServerHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
