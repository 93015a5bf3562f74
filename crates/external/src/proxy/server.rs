//! The proxy's routes: `POST /v1/chat/completions`, `GET /v1/models`, `GET /health`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use harness_core::{
    FinishReason, PolicyRequest, PolicyTurn, SamplingParams, ToolCall, TurnSampling, call_seed,
};
use harness_openai::protocol::{
    ChatChoice, ChatCompletionRequest, ChatCompletionResponse, ChatLogprobs, ChatTokenLogprob,
    MessageContent, WireMessage, WireToolCall, WireUsage, from_wire_messages, split_tool_calls,
};
use serde_json::{Value, json};

use super::RecordingProxy;
use super::record::{EpisodeLog, reply_key};

/// An OpenAI-style error answer.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    kind: &'static str,
    code: Option<&'static str>,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            kind,
            code: None,
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": Value::Null,
                "code": self.code.map_or(json!(self.status.as_u16()), |c| json!(c)),
            }
        });
        (self.status, axum::Json(body)).into_response()
    }
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn lock(log: &std::sync::Mutex<EpisodeLog>) -> std::sync::MutexGuard<'_, EpisodeLog> {
    log.lock().unwrap_or_else(|p| p.into_inner())
}

async fn health() -> Response {
    axum::Json(json!({"status": "ok"})).into_response()
}

async fn models(State(proxy): State<Arc<RecordingProxy>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{"id": proxy.config.model, "object": "model", "created": 0, "owned_by": "harness-s"}]
    }))
    .into_response()
}

async fn chat(
    State(proxy): State<Arc<RecordingProxy>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    match chat_inner(&proxy, &headers, &body).await {
        Ok(response) => response,
        Err(e) => {
            proxy.counters.refused_calls.fetch_add(1, Ordering::SeqCst);
            e.into_response()
        }
    }
}

/// The sampling settings of a request, or the pinned ones.
fn sampling(
    proxy: &RecordingProxy,
    pinned_for_episode: Option<&SamplingParams>,
    req: &ChatCompletionRequest,
) -> Result<SamplingParams, ApiError> {
    let stop = req.stop.clone().map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > 4 {
        return Err(ApiError::bad(format!(
            "`stop`: at most 4 stop strings are allowed, got {}",
            stop.len()
        )));
    }
    if let Some(pinned) = pinned_for_episode.or(proxy.config.sampling.as_ref()) {
        return Ok(SamplingParams {
            stop,
            ..pinned.clone()
        });
    }
    let temperature = req.temperature.unwrap_or(1.0);
    if !(temperature.is_finite() && temperature >= 0.0) {
        return Err(ApiError::bad(format!(
            "`temperature`: expected a finite number >= 0, got {temperature}"
        )));
    }
    let top_p = req.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(ApiError::bad(format!(
            "`top_p`: expected a number in (0, 1], got {top_p}"
        )));
    }
    Ok(SamplingParams {
        temperature,
        top_p,
        top_k: None,
        stop,
    })
}

/// The reply as the program sees it: content and tool calls.
struct Reply {
    content: String,
    calls: Vec<ToolCall>,
    finish: &'static str,
}

fn reply_of(turn: &PolicyTurn, wants_calls: bool) -> Reply {
    match wants_calls.then(|| split_tool_calls(&turn.text)).flatten() {
        Some((head, calls)) => Reply {
            content: head,
            calls,
            finish: "tool_calls",
        },
        None => Reply {
            content: turn.text.clone(),
            calls: Vec::new(),
            finish: match turn.finish {
                FinishReason::Length => "length",
                _ => "stop",
            },
        },
    }
}

fn logprobs_of(turn: &PolicyTurn) -> ChatLogprobs {
    ChatLogprobs {
        content: Some(
            turn.tokens
                .iter()
                .zip(&turn.logprobs)
                .map(|(t, &logprob)| ChatTokenLogprob {
                    token: format!("token_id:{t}"),
                    logprob,
                    bytes: None,
                    top_logprobs: Vec::new(),
                })
                .collect(),
        ),
    }
}

async fn chat_inner(
    proxy: &Arc<RecordingProxy>,
    headers: &HeaderMap,
    body: &Bytes,
) -> Result<Response, ApiError> {
    let key = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim)
        .unwrap_or("");
    let log = proxy.lock().get(key).cloned().ok_or_else(|| {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "no open episode has this API key: send the episode key the runner handed you (HARNESS_PROXY_KEY) as `Authorization: Bearer <key>`",
        )
    })?;
    let _in_flight = proxy.admit(key).ok_or_else(|| {
        lock(&log).refuse();
        ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!(
                "this episode has {} calls in flight, its limit (max_requests_per_episode); wait for their answers",
                proxy.config.max_requests_per_episode
            ),
        )
    })?;
    let refuse = |e: ApiError| {
        lock(&log).refuse();
        e
    };
    let de = &mut serde_json::Deserializer::from_slice(body);
    let req: ChatCompletionRequest = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        refuse(ApiError::bad(format!(
            "chat completion request: at `{path}`: {}",
            e.into_inner()
        )))
    })?;
    if req.n.unwrap_or(1) != 1 {
        return Err(refuse(ApiError::bad(format!(
            "`n`: the proxy records one completion per turn, so n must be 1, got {}",
            req.n.unwrap_or(1)
        ))));
    }
    if req.messages.is_empty() {
        return Err(refuse(ApiError::bad("`messages`: must not be empty")));
    }
    let mut messages = from_wire_messages(&req.messages).map_err(|m| refuse(ApiError::bad(m)))?;
    let pinned = lock(&log).spec().sampling.clone();
    let params = sampling(proxy, pinned.as_ref(), &req).map_err(refuse)?;
    let asked = req.max_completion_tokens.or(req.max_tokens);
    if let Some(n) = asked.filter(|n| *n < 1) {
        return Err(refuse(ApiError::bad(format!(
            "`max_tokens`: expected at least 1, got {n}"
        ))));
    }
    let tools: Vec<_> = req.tools.iter().map(|t| t.to_spec()).collect();
    let wants_calls =
        !tools.is_empty() && req.tool_choice.as_ref().and_then(Value::as_str) != Some("none");
    let (call, spec) = {
        let mut log = lock(&log);
        log.restore(&req.messages, &mut messages);
        let spec = log.spec().clone();
        let call = log.begin_call().ok_or_else(|| {
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "limit_exceeded",
                format!(
                    "the episode has made its limit of {} model calls",
                    spec.limits.max_model_calls
                ),
            )
        })?;
        (call, spec)
    };
    let limits = spec.limits;
    let max_new_tokens = asked.map_or(limits.max_output_tokens as usize, |n| {
        (n as usize).min(limits.max_output_tokens as usize)
    });
    let turn_sampling = TurnSampling::from(&params);
    let request = PolicyRequest {
        messages: messages.clone(),
        tools,
        max_new_tokens,
        max_context_tokens: limits.max_context_tokens as usize,
        sampling: params,
        seed: call_seed(spec.seed, call),
    };
    let turn = proxy.policy.generate(request).await.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "server_error",
            format!("the policy failed: {e}"),
        )
    })?;
    let overflow = turn.finish == FinishReason::ContextOverflow;
    let reply = reply_of(&turn, wants_calls);
    let extends = lock(&log).record(
        &messages,
        &turn,
        turn_sampling,
        (!overflow).then(|| reply_key(&reply.content, &reply.calls)),
    );
    proxy.counters.turns.fetch_add(1, Ordering::SeqCst);
    if !extends {
        proxy.counters.prefix_breaks.fetch_add(1, Ordering::SeqCst);
    }
    if overflow {
        return Err(ApiError {
            status: StatusCode::BAD_REQUEST,
            kind: "invalid_request_error",
            code: Some("context_length_exceeded"),
            message: format!(
                "the prompt has {} tokens, more than the episode's limit of {}",
                turn.context_tokens.len(),
                limits.max_context_tokens
            ),
        });
    }
    let id = format!("chatcmpl-{}", proxy.next_id.fetch_add(1, Ordering::SeqCst));
    let wire_calls: Vec<WireToolCall> = reply
        .calls
        .iter()
        .enumerate()
        .map(|(k, c)| WireToolCall::from_call(format!("call_{call}_{k}"), c))
        .collect();
    let logprobs = (req.logprobs == Some(true)).then(|| logprobs_of(&turn));
    let usage = WireUsage::new(turn.context_tokens.len(), turn.tokens.len());
    if req.stream == Some(true) {
        let include_usage = req
            .extra
            .get("stream_options")
            .and_then(|o| o.get("include_usage"))
            .and_then(Value::as_bool)
            == Some(true);
        return Ok(stream(StreamParts {
            id,
            model: proxy.config.model.clone(),
            reply,
            calls: wire_calls,
            logprobs,
            usage: include_usage.then_some(usage),
        }));
    }
    let message = WireMessage {
        role: "assistant".into(),
        content: (!reply.content.is_empty() || wire_calls.is_empty())
            .then(|| MessageContent::Text(reply.content.clone())),
        name: None,
        tool_calls: wire_calls,
        tool_call_id: None,
    };
    Ok(axum::Json(ChatCompletionResponse {
        id,
        object: "chat.completion".into(),
        created: now(),
        model: proxy.config.model.clone(),
        choices: vec![ChatChoice {
            index: 0,
            message,
            finish_reason: Some(reply.finish.into()),
            logprobs,
        }],
        usage: Some(usage),
    })
    .into_response())
}

struct StreamParts {
    id: String,
    model: String,
    reply: Reply,
    calls: Vec<WireToolCall>,
    logprobs: Option<ChatLogprobs>,
    usage: Option<WireUsage>,
}

/// The whole turn as server-sent events in OpenAI's chunk format.
fn stream(parts: StreamParts) -> Response {
    let created = now();
    let chunk = |choices: Value| {
        let value = json!({
            "id": parts.id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": parts.model,
            "choices": choices,
        });
        format!("data: {value}\n\n")
    };
    let mut body = chunk(json!([{
        "index": 0,
        "delta": {"role": "assistant", "content": ""},
        "logprobs": Value::Null,
        "finish_reason": Value::Null,
    }]));
    if !parts.reply.content.is_empty() || parts.logprobs.is_some() {
        body.push_str(&chunk(json!([{
            "index": 0,
            "delta": {"content": parts.reply.content},
            "logprobs": parts.logprobs,
            "finish_reason": Value::Null,
        }])));
    }
    if !parts.calls.is_empty() {
        let calls: Vec<Value> = parts
            .calls
            .iter()
            .enumerate()
            .map(|(k, c)| {
                let mut v = serde_json::to_value(c).unwrap_or(Value::Null);
                v["index"] = json!(k);
                v
            })
            .collect();
        body.push_str(&chunk(json!([{
            "index": 0,
            "delta": {"tool_calls": calls},
            "logprobs": Value::Null,
            "finish_reason": Value::Null,
        }])));
    }
    body.push_str(&chunk(json!([{
        "index": 0,
        "delta": {},
        "logprobs": Value::Null,
        "finish_reason": parts.reply.finish,
    }])));
    if let Some(usage) = parts.usage {
        let value = json!({
            "id": parts.id,
            "object": "chat.completion.chunk",
            "created": created,
            "model": parts.model,
            "choices": [],
            "usage": usage,
        });
        body.push_str(&format!("data: {value}\n\n"));
    }
    body.push_str("data: [DONE]\n\n");
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from(body),
    )
        .into_response()
}

async fn not_found() -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        "no such route: the proxy serves POST /v1/chat/completions and GET /v1/models",
    )
    .into_response()
}

/// Answer 503 to a request that runs past `limit` (reading its body included), dropping its
/// work.
async fn time_limited(
    limit: std::time::Duration,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "timeout_error",
            format!("the request ran past the proxy's limit of {limit:?} (request_timeout) and was dropped"),
        )
        .into_response(),
    }
}

/// The proxy's routes.
pub fn router(proxy: Arc<RecordingProxy>) -> Router {
    let limit = proxy.config.request_timeout;
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(32 << 20))
        .layer(axum::middleware::from_fn(move |request, next| {
            time_limited(limit, request, next)
        }))
        .with_state(proxy)
}
