//! [`TinkerClient`]: the Tinker REST protocol over HTTP, with per-request timeouts, retries and
//! futures polled until they are done or failed.
//!
//! # Retries
//! A request is tried again (up to [`RetryPolicy::max_attempts`] in all, with doubling
//! back-off) when the server answered 429 or 5xx, or when the connection could not be made.
//! Both mean the server did not apply it. A request whose answer was lost after it was sent
//! (a dropped connection, a timeout) is tried again only when it changes nothing on the server
//! (`forward`, `retrieve_future`, heartbeats, capabilities); for the others
//! (`forward_backward`, `optim_step`, `save_*`, `load_weights`, `create_*`) the client stops
//! with [`Error::Ambiguous`], so no gradient and no optimizer step is ever applied twice.
//!
//! # Futures
//! [`TinkerClient::wait_future`] polls `retrieve_future` until the result arrives, the server
//! reports a failure ([`Error::FutureFailed`]) or [`TinkerConfig::future_timeout`] passes
//! ([`Error::FutureTimeout`]). Both answers of a pending future are understood: the hosted
//! service's `{"type": "try_again"}` and SkyRL's long poll that ends in HTTP 408. A future the
//! server does not know (HTTP 404, e.g. after a restart) is an error naming it.
//!
//! # Sampler weights
//! [`TinkerClient::download_sampler_weights`] fetches a sampler checkpoint's archive
//! (`GET /api/v1/training_runs/{model}/checkpoints/{id}/archive`), following by hand the one
//! hop servers answer with (SkyRL: 302 to `.../download`; hosted: 200 `{"url": ...}`, a signed
//! storage URL). The API key goes only to URLs of the base URL's origin, never to storage.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use reqwest::{Method, StatusCode, Url};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

use crate::error::{Error, Result};
use crate::protocol::*;

/// When a failed request is tried again.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (1: no retries).
    pub max_attempts: u32,
    /// Delay before the first retry; doubled for each further one.
    pub initial_backoff: Duration,
    /// The longest delay.
    pub max_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        RetryPolicy {
            max_attempts: 5,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(15),
        }
    }
}

/// Where the server is and how to talk to it.
#[derive(Clone)]
pub struct TinkerConfig {
    /// The server root, e.g. `http://127.0.0.1:8000` (paths `/api/v1/...` are appended).
    pub base_url: String,
    /// Sent as `X-API-Key` and `Authorization: Bearer` when set (hosted Tinker). The library
    /// never reads environment variables: binaries do and pass the key here.
    pub api_key: Option<String>,
    /// Limit on one request, from connecting until the whole answer arrived.
    pub timeout: Duration,
    /// Limit on establishing a connection.
    pub connect_timeout: Duration,
    /// Limit on one `retrieve_future` request (servers that long-poll hold it open; running
    /// past it only means "poll again").
    pub poll_request_timeout: Duration,
    /// Pause between polls of a pending future.
    pub poll_interval: Duration,
    /// How long a future may stay pending before [`Error::FutureTimeout`].
    pub future_timeout: Duration,
    /// Retries.
    pub retry: RetryPolicy,
}

impl std::fmt::Debug for TinkerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TinkerConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("poll_request_timeout", &self.poll_request_timeout)
            .field("future_timeout", &self.future_timeout)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

impl TinkerConfig {
    /// A server at `base_url` with no key, 120 s requests, 60 s polls every 200 ms, futures
    /// allowed 30 minutes (the first `forward_backward` compiles), and the default retries.
    pub fn new(base_url: impl Into<String>) -> Self {
        TinkerConfig {
            base_url: base_url.into(),
            api_key: None,
            timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            poll_request_timeout: Duration::from_secs(60),
            poll_interval: Duration::from_millis(200),
            future_timeout: Duration::from_secs(1800),
            retry: RetryPolicy::default(),
        }
    }

    /// Check every field; the error names the field and what was expected.
    pub fn validate(&self) -> Result<()> {
        let url = self.base_url.trim();
        if !(url.starts_with("http://") || url.starts_with("https://")) {
            return Err(Error::config(
                "base_url",
                format!(
                    "expected an http:// or https:// URL, got `{}`",
                    self.base_url
                ),
            ));
        }
        for (field, d) in [
            ("timeout", self.timeout),
            ("connect_timeout", self.connect_timeout),
            ("poll_request_timeout", self.poll_request_timeout),
            ("future_timeout", self.future_timeout),
        ] {
            if d.is_zero() {
                return Err(Error::config(field, "must be positive"));
            }
        }
        if self.retry.max_attempts == 0 {
            return Err(Error::config(
                "retry.max_attempts",
                "must be at least 1 (1 means no retries)",
            ));
        }
        if let Some(key) = &self.api_key
            && (key.is_empty() || key.chars().any(|c| c.is_control()))
        {
            return Err(Error::config("api_key", "must be non-empty printable text"));
        }
        Ok(())
    }
}

/// How a request may be retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Changes server state: retried only when the server cannot have applied it.
    Mutating,
    /// Changes nothing: retried after any transport failure.
    Idempotent,
    /// A `retrieve_future` poll: a timeout means "still pending".
    Poll,
}

/// What to do after a lost answer.
enum Lost {
    /// Try again (the request changes nothing).
    Retry(String),
    /// A poll ran past its timeout: the future is still pending.
    Pending,
}

fn pending(attempts: u32) -> Answer {
    Answer {
        status: StatusCode::REQUEST_TIMEOUT,
        body: String::new(),
        attempts,
    }
}

/// An answer the transport did not retry.
struct Answer {
    status: StatusCode,
    body: String,
    attempts: u32,
}

/// One poll's view of a future.
#[derive(Debug, Clone, PartialEq)]
pub enum FutureState {
    /// Not done yet.
    Pending,
    /// Done: the operation's result.
    Done(Value),
    /// The operation failed: the server's message.
    Failed(String),
}

/// A client for one Tinker server. Cheap to clone (the connection pool is shared).
#[derive(Clone)]
pub struct TinkerClient {
    cfg: Arc<TinkerConfig>,
    http: reqwest::Client,
    /// Follows no redirect: archive downloads follow their one hop by hand, so that the key
    /// is sent to the base URL's origin only.
    raw: reqwest::Client,
    seq: Arc<AtomicU64>,
}

impl std::fmt::Debug for TinkerClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TinkerClient")
            .field("cfg", &self.cfg)
            .finish_non_exhaustive()
    }
}

fn detail(body: &str) -> String {
    // FastAPI: {"detail": "..."}; hosted: {"error": "..."}.
    if let Ok(v) = serde_json::from_str::<Value>(body) {
        for key in ["detail", "error", "message"] {
            match v.get(key) {
                Some(Value::String(s)) => return s.clone(),
                Some(other) if !other.is_null() => return other.to_string(),
                _ => {}
            }
        }
    }
    excerpt(body)
}

fn excerpt(body: &str) -> String {
    let t = body.trim();
    if t.chars().count() > 300 {
        format!("{}...", t.chars().take(300).collect::<String>())
    } else if t.is_empty() {
        "(empty body)".into()
    } else {
        t.to_string()
    }
}

fn id_string(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

impl TinkerClient {
    /// A client for `cfg` (validated).
    pub fn new(cfg: TinkerConfig) -> Result<Self> {
        cfg.validate()?;
        Ok(TinkerClient {
            http: build_http(&cfg, reqwest::redirect::Policy::default())?,
            raw: build_http(&cfg, reqwest::redirect::Policy::none())?,
            cfg: Arc::new(cfg),
            seq: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The same settings over a new connection pool, for use on another async runtime
    /// (connections belong to the runtime that opened them).
    pub fn detached(&self) -> Result<Self> {
        Ok(TinkerClient {
            cfg: self.cfg.clone(),
            http: build_http(&self.cfg, reqwest::redirect::Policy::default())?,
            raw: build_http(&self.cfg, reqwest::redirect::Policy::none())?,
            seq: self.seq.clone(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &TinkerConfig {
        &self.cfg
    }

    fn next_seq(&self) -> u64 {
        self.seq.fetch_add(1, Ordering::SeqCst)
    }

    fn url(&self, endpoint: &str) -> String {
        format!(
            "{}/api/v1/{endpoint}",
            self.cfg.base_url.trim_end_matches('/')
        )
    }

    /// Send with retries; any answer that is not retried comes back (2xx or not).
    async fn send<B: Serialize + ?Sized>(
        &self,
        method: Method,
        endpoint: &str,
        body: Option<&B>,
        kind: Kind,
    ) -> Result<Answer> {
        let retry = &self.cfg.retry;
        let mut pause = retry.initial_backoff;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let mut req = self.http.request(method.clone(), self.url(endpoint));
            req = req.timeout(if kind == Kind::Poll {
                self.cfg.poll_request_timeout
            } else {
                self.cfg.timeout
            });
            if let Some(key) = &self.cfg.api_key {
                req = req.header("X-API-Key", key).bearer_auth(key);
            }
            if let Some(b) = body {
                req = req.json(b);
            }
            let (status, message) = match req.send().await {
                Ok(resp) => {
                    let status = resp.status();
                    match resp.text().await {
                        Ok(text)
                            if status.is_server_error()
                                || status == StatusCode::TOO_MANY_REQUESTS =>
                        {
                            (Some(status.as_u16()), detail(&text))
                        }
                        Ok(text) => {
                            return Ok(Answer {
                                status,
                                body: text,
                                attempts: attempt,
                            });
                        }
                        // The head arrived but the body was cut: the server handled it.
                        Err(e) => match self.lost(endpoint, kind, e)? {
                            Lost::Retry(m) => (None, m),
                            Lost::Pending => return Ok(pending(attempt)),
                        },
                    }
                }
                Err(e) if e.is_connect() => (None, format!("cannot connect: {e}")),
                Err(e) => match self.lost(endpoint, kind, e)? {
                    Lost::Retry(m) => (None, m),
                    Lost::Pending => return Ok(pending(attempt)),
                },
            };
            if attempt >= retry.max_attempts {
                return Err(Error::Http {
                    endpoint: endpoint.to_string(),
                    status,
                    attempts: attempt,
                    message,
                });
            }
            tracing::warn!(endpoint, attempt, ?status, %message, "tinker request failed; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(retry.max_backoff);
        }
    }

    /// A request whose answer was lost: retry if it changes nothing, else stop.
    fn lost(&self, endpoint: &str, kind: Kind, e: reqwest::Error) -> Result<Lost> {
        let what = if e.is_timeout() {
            format!("no answer within the timeout: {e}")
        } else {
            format!("connection lost: {e}")
        };
        match kind {
            Kind::Poll if e.is_timeout() => Ok(Lost::Pending),
            Kind::Idempotent | Kind::Poll => Ok(Lost::Retry(what)),
            Kind::Mutating => Err(Error::Ambiguous {
                endpoint: endpoint.to_string(),
                message: what,
            }),
        }
    }

    async fn call<B: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        method: Method,
        endpoint: &str,
        body: Option<&B>,
        kind: Kind,
    ) -> Result<R> {
        let a = self.send(method, endpoint, body, kind).await?;
        if !a.status.is_success() {
            return Err(Error::Http {
                endpoint: endpoint.to_string(),
                status: Some(a.status.as_u16()),
                attempts: a.attempts,
                message: detail(&a.body),
            });
        }
        decode(endpoint, &a.body)
    }

    /// Submit a future-returning operation; its future id.
    async fn submit<B: Serialize + ?Sized>(
        &self,
        endpoint: &str,
        body: &B,
    ) -> Result<FutureResponse> {
        self.call(Method::POST, endpoint, Some(body), Kind::Mutating)
            .await
    }

    /// Submit and wait for the result, decoded as `R`.
    async fn run<B: Serialize + ?Sized, R: DeserializeOwned>(
        &self,
        endpoint: &str,
        body: &B,
    ) -> Result<R> {
        let f = self.submit(endpoint, body).await?;
        let value = self
            .wait_future(&id_string(&f.request_id), endpoint)
            .await?;
        serde_json::from_value(value.clone()).map_err(|e| Error::Decode {
            endpoint: endpoint.to_string(),
            message: format!("{e} in result {}", excerpt(&value.to_string())),
        })
    }

    /// `create_session`: a new session's id.
    pub async fn create_session(&self, tags: Vec<String>) -> Result<String> {
        let body = CreateSessionRequest {
            tags,
            user_metadata: None,
            sdk_version: concat!("harness-tinker/", env!("CARGO_PKG_VERSION")).into(),
            kind: "create_session",
        };
        let r: CreateSessionResponse = self
            .call(Method::POST, "create_session", Some(&body), Kind::Mutating)
            .await?;
        if let Some(w) = r.warning_message.as_deref().or(r.error_message.as_deref()) {
            tracing::warn!(session = %r.session_id, message = w, "tinker create_session");
        }
        Ok(r.session_id)
    }

    /// `session_heartbeat`: keeps the session (and its models) alive.
    pub async fn session_heartbeat(&self, session_id: &str) -> Result<()> {
        let body = SessionHeartbeatRequest {
            session_id: session_id.to_string(),
            kind: "session_heartbeat",
        };
        let _: Value = self
            .call(
                Method::POST,
                "session_heartbeat",
                Some(&body),
                Kind::Idempotent,
            )
            .await?;
        Ok(())
    }

    /// `get_server_capabilities`: the base models the server trains.
    pub async fn get_server_capabilities(&self) -> Result<ServerCapabilities> {
        self.call::<(), _>(
            Method::GET,
            "get_server_capabilities",
            None,
            Kind::Idempotent,
        )
        .await
    }

    /// `create_model`: a LoRA adapter on `base_model` in `session_id`; the model's id once the
    /// server created it.
    pub async fn create_model(
        &self,
        session_id: &str,
        base_model: &str,
        lora: &LoraConfig,
    ) -> Result<String> {
        let body = CreateModelRequest {
            session_id: session_id.to_string(),
            model_seq_id: 0,
            base_model: base_model.to_string(),
            lora_config: lora.clone(),
            kind: "create_model",
        };
        let f = self.submit("create_model", &body).await?;
        let result = self
            .wait_future(&id_string(&f.request_id), "create_model")
            .await?;
        result
            .get("model_id")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or(f.model_id)
            .ok_or_else(|| Error::Decode {
                endpoint: "create_model".into(),
                message: format!(
                    "no `model_id` in the answer or the result {}",
                    excerpt(&result.to_string())
                ),
            })
    }

    /// `forward`: the loss function's outputs (e.g. `logprobs`) without a gradient.
    pub async fn forward(
        &self,
        model_id: &str,
        input: &ForwardBackwardInput,
    ) -> Result<ForwardBackwardOutput> {
        let body = ForwardRequest {
            model_id,
            forward_input: input,
            seq_id: self.next_seq(),
        };
        // The submit creates a future but changes no weights or gradients: safe to repeat.
        let f: FutureResponse = self
            .call(Method::POST, "forward", Some(&body), Kind::Idempotent)
            .await?;
        let v = self
            .wait_future(&id_string(&f.request_id), "forward")
            .await?;
        decode_value("forward", v)
    }

    /// `forward_backward`: accumulates the loss's gradient on the server.
    pub async fn forward_backward(
        &self,
        model_id: &str,
        input: &ForwardBackwardInput,
    ) -> Result<ForwardBackwardOutput> {
        let body = ForwardBackwardRequest {
            model_id,
            forward_backward_input: input,
            seq_id: self.next_seq(),
        };
        self.run("forward_backward", &body).await
    }

    /// `optim_step`: one Adam step on the accumulated gradient; the server's metrics.
    pub async fn optim_step(&self, model_id: &str, adam: AdamParams) -> Result<Value> {
        let body = OptimStepRequest {
            model_id,
            adam_params: adam,
            seq_id: self.next_seq(),
        };
        self.run("optim_step", &body).await
    }

    /// `save_weights`: a training checkpoint (adapter and optimizer state) named `name`; its
    /// `tinker://` path for [`TinkerClient::load_weights`].
    pub async fn save_weights(&self, model_id: &str, name: &str) -> Result<String> {
        check_name(name)?;
        let body = SaveWeightsRequest {
            model_id,
            path: name,
            seq_id: self.next_seq(),
            kind: "save_weights",
        };
        let out: SaveWeightsOutput = self.run("save_weights", &body).await?;
        out.path.ok_or_else(|| Error::Decode {
            endpoint: "save_weights".into(),
            message: "no `path` in the result".into(),
        })
    }

    /// `save_weights_for_sampler`: weights for sampling named `name` (SkyRL's server with
    /// external vLLM engines pushes them there); the result.
    pub async fn save_weights_for_sampler(
        &self,
        model_id: &str,
        name: &str,
    ) -> Result<SaveWeightsOutput> {
        check_name(name)?;
        let body = SaveWeightsRequest {
            model_id,
            path: name,
            seq_id: self.next_seq(),
            kind: "save_weights_for_sampler",
        };
        self.run("save_weights_for_sampler", &body).await
    }

    /// `load_weights`: restore a training checkpoint (`tinker://<model>/weights/<name>`) into
    /// `model_id`.
    pub async fn load_weights(&self, model_id: &str, path: &str) -> Result<()> {
        let body = LoadWeightsRequest {
            model_id,
            path,
            seq_id: self.next_seq(),
            kind: "load_weights",
        };
        let _: Value = self.run("load_weights", &body).await?;
        Ok(())
    }

    /// Fetch the archive of the sampler weights saved at `path` (`tinker://<model>/<name>` or
    /// `tinker://<model>/sampler_weights/<name>`, as `save_weights_for_sampler` returned it) and
    /// unpack its adapter (`adapter_model.safetensors`, `adapter_config.json`) into `dest`, a
    /// folder replaced whole once both files are written.
    ///
    /// The archive endpoint's answer is followed one hop by hand: a redirect (`Location`) or a
    /// JSON `{"url": ...}`. The API key is sent only where the URL has the base URL's origin
    /// (scheme, host, port). Each GET is retried on 425, 429, 5xx and transport failures (it
    /// changes nothing). A body over `max_bytes`, and unpacked files over 16 x `max_bytes`,
    /// are errors; so is any archive entry other than the two files ([`crate::archive`]).
    pub async fn download_sampler_weights(
        &self,
        path: &str,
        dest: &Path,
        max_bytes: u64,
    ) -> Result<()> {
        let (model, id) = crate::archive::split_tinker_path(path)?;
        let first = Url::parse(&self.url(&crate::archive::archive_endpoint(&model, &id)))
            .map_err(|e| Error::config("base_url", format!("cannot build the archive URL: {e}")))?;
        let a = self.get_capped(&first, max_bytes).await?;
        let next = if a.status.is_redirection() {
            let loc = a.location.ok_or_else(|| {
                Error::Protocol(format!(
                    "{}: HTTP {} without a `Location`",
                    shown(&first),
                    a.status
                ))
            })?;
            first.join(&loc).map_err(|e| {
                Error::Protocol(format!("{}: bad `Location` `{loc}`: {e}", shown(&first)))
            })?
        } else if a.status.is_success() && (a.json || looks_like_url_json(&a.body)) {
            let v: Value = decode("archive", &String::from_utf8_lossy(&a.body))?;
            let u = v
                .get("url")
                .and_then(Value::as_str)
                .ok_or_else(|| Error::Decode {
                    endpoint: "archive".into(),
                    message: format!("no `url` in {}", excerpt(&String::from_utf8_lossy(&a.body))),
                })?;
            first
                .join(u)
                .map_err(|e| Error::Protocol(format!("{}: bad `url`: {e}", shown(&first))))?
        } else if a.status.is_success() {
            return self.unpack(a.body, path, dest, max_bytes).await;
        } else {
            return Err(archive_error(&first, path, &a));
        };
        let b = self.get_capped(&next, max_bytes).await?;
        if !b.status.is_success() {
            if b.status.is_redirection() {
                return Err(Error::Protocol(format!(
                    "{}: a second redirect (HTTP {}); only one hop is followed",
                    shown(&next),
                    b.status
                )));
            }
            return Err(archive_error(&next, path, &b));
        }
        self.unpack(b.body, path, dest, max_bytes).await
    }

    async fn unpack(&self, body: Vec<u8>, path: &str, dest: &Path, max_bytes: u64) -> Result<()> {
        let (what, dest) = (path.to_string(), dest.to_path_buf());
        let unpacked = max_bytes.saturating_mul(16);
        tokio::task::spawn_blocking(move || {
            crate::archive::unpack_adapter(&body, &dest, &what, unpacked)
        })
        .await
        .map_err(|e| Error::Protocol(format!("unpacking {path} panicked or was cancelled: {e}")))?
    }

    /// GET `url` with retries, reading at most `max_bytes` of body; the key only for the base
    /// URL's origin.
    async fn get_capped(&self, url: &Url, max_bytes: u64) -> Result<Fetched> {
        let same_origin = Url::parse(self.cfg.base_url.trim())
            .map(|b| b.origin() == url.origin())
            .unwrap_or(false);
        let label = shown(url);
        let retry = &self.cfg.retry;
        let mut pause = retry.initial_backoff;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let mut req = self.raw.get(url.clone()).timeout(self.cfg.timeout);
            if same_origin && let Some(key) = &self.cfg.api_key {
                req = req.header("X-API-Key", key).bearer_auth(key);
            }
            let (status, message) = match req.send().await {
                Ok(resp) => {
                    let status = resp.status();
                    match read_capped(resp, max_bytes, &label).await {
                        Ok(f)
                            if status.is_server_error() || matches!(status.as_u16(), 425 | 429) =>
                        {
                            (
                                Some(status.as_u16()),
                                detail(&String::from_utf8_lossy(&f.body)),
                            )
                        }
                        Ok(mut f) => {
                            f.attempts = attempt;
                            return Ok(f);
                        }
                        Err(BodyError::TooBig(e)) => return Err(e),
                        Err(BodyError::Lost(m)) => (Some(status.as_u16()), m),
                    }
                }
                Err(e) if e.is_connect() => (None, format!("cannot connect: {e}")),
                Err(e) if e.is_timeout() => (None, format!("no answer within the timeout: {e}")),
                Err(e) => (None, format!("connection lost: {e}")),
            };
            if attempt >= retry.max_attempts {
                return Err(Error::Http {
                    endpoint: label,
                    status,
                    attempts: attempt,
                    message,
                });
            }
            tracing::warn!(url = %label, attempt, ?status, %message, "tinker archive download failed; retrying");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(retry.max_backoff);
        }
    }

    /// One poll of `retrieve_future`.
    pub async fn retrieve_future(&self, request_id: &str) -> Result<FutureState> {
        let body = RetrieveFutureRequest { request_id };
        let a = self
            .send(Method::POST, "retrieve_future", Some(&body), Kind::Poll)
            .await?;
        match a.status.as_u16() {
            200..=299 => {
                let v: Value = decode("retrieve_future", &a.body)?;
                if v.get("type").and_then(Value::as_str) == Some("try_again") {
                    return Ok(FutureState::Pending);
                }
                if let Some(err) = v.get("error").filter(|e| !e.is_null()) {
                    let only_error = v.as_object().is_some_and(|o| {
                        o.keys()
                            .all(|k| matches!(k.as_str(), "error" | "category" | "status" | "type"))
                    });
                    if only_error {
                        return Ok(FutureState::Failed(match err {
                            Value::String(s) => s.clone(),
                            other => other.to_string(),
                        }));
                    }
                }
                Ok(FutureState::Done(v))
            }
            // SkyRL's long poll ran out (or ours did): still pending.
            408 => Ok(FutureState::Pending),
            // SkyRL reports a failed operation as 400 with its message.
            400 => Ok(FutureState::Failed(detail(&a.body))),
            404 => Err(Error::FutureFailed {
                operation: "retrieve_future".into(),
                request_id: request_id.to_string(),
                message: format!(
                    "the server does not know this future ({}); was it restarted?",
                    detail(&a.body)
                ),
            }),
            s => Err(Error::Http {
                endpoint: "retrieve_future".into(),
                status: Some(s),
                attempts: a.attempts,
                message: detail(&a.body),
            }),
        }
    }

    /// Poll `request_id` (of `operation`) until done; its result.
    pub async fn wait_future(&self, request_id: &str, operation: &str) -> Result<Value> {
        let start = Instant::now();
        loop {
            match self.retrieve_future(request_id).await {
                Ok(FutureState::Done(v)) => return Ok(v),
                Ok(FutureState::Failed(message)) => {
                    return Err(Error::FutureFailed {
                        operation: operation.to_string(),
                        request_id: request_id.to_string(),
                        message,
                    });
                }
                Ok(FutureState::Pending) => {}
                Err(Error::FutureFailed { message, .. }) => {
                    return Err(Error::FutureFailed {
                        operation: operation.to_string(),
                        request_id: request_id.to_string(),
                        message,
                    });
                }
                Err(e) => return Err(e),
            }
            let waited = start.elapsed();
            if waited >= self.cfg.future_timeout {
                return Err(Error::FutureTimeout {
                    operation: operation.to_string(),
                    request_id: request_id.to_string(),
                    waited,
                });
            }
            tokio::time::sleep(self.cfg.poll_interval.min(self.cfg.future_timeout - waited)).await;
        }
    }
}

/// One GET's answer, its body read up to the cap.
struct Fetched {
    status: StatusCode,
    location: Option<String>,
    json: bool,
    body: Vec<u8>,
    attempts: u32,
}

/// Why a body was not read.
enum BodyError {
    /// Over the cap: final.
    TooBig(Error),
    /// The connection failed mid-body: retried.
    Lost(String),
}

async fn read_capped(
    mut resp: reqwest::Response,
    max_bytes: u64,
    label: &str,
) -> std::result::Result<Fetched, BodyError> {
    let too_big = |n: String| {
        BodyError::TooBig(Error::Protocol(format!(
            "{label}: the body is {n} bytes, over the cap of {max_bytes} bytes"
        )))
    };
    if let Some(n) = resp.content_length()
        && n > max_bytes
    {
        return Err(too_big(n.to_string()));
    }
    let header = |name: reqwest::header::HeaderName| {
        resp.headers()
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let location = header(reqwest::header::LOCATION);
    let json = header(reqwest::header::CONTENT_TYPE).is_some_and(|c| c.contains("json"));
    let status = resp.status();
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(c)) => {
                if body.len() as u64 + c.len() as u64 > max_bytes {
                    return Err(too_big(format!("more than {max_bytes}")));
                }
                body.extend_from_slice(&c);
            }
            Ok(None) => break,
            Err(e) => return Err(BodyError::Lost(format!("the body was cut: {e}"))),
        }
    }
    Ok(Fetched {
        status,
        location,
        json,
        body,
        attempts: 0,
    })
}

/// A JSON object with a `url` (a server that labels its JSON otherwise); a tar or gzip never
/// starts with `{`.
fn looks_like_url_json(body: &[u8]) -> bool {
    body.first() == Some(&b'{')
        && serde_json::from_slice::<Value>(body).is_ok_and(|v| v.get("url").is_some())
}

/// An archive GET that failed for good; a 404 says which checkpoint is missing.
fn archive_error(url: &Url, path: &str, a: &Fetched) -> Error {
    let d = detail(&String::from_utf8_lossy(&a.body));
    Error::Http {
        endpoint: shown(url),
        status: Some(a.status.as_u16()),
        attempts: a.attempts,
        message: if a.status == StatusCode::NOT_FOUND {
            format!("the server has no archive of {path} ({d})")
        } else {
            d
        },
    }
}

fn build_http(cfg: &TinkerConfig, redirect: reqwest::redirect::Policy) -> Result<reqwest::Client> {
    // reqwest is built without a TLS crypto provider (see harness-openai's
    // `install_tls_provider`): make rustls' `ring` the process's, unless one is installed.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .connect_timeout(cfg.connect_timeout)
        .redirect(redirect)
        .build()
        .map_err(|e| Error::config("base_url", format!("cannot build the HTTP client: {e}")))
}

/// A short unique suffix for checkpoint names (servers refuse a name twice per model) and
/// temporary folders.
pub(crate) fn nonce() -> String {
    static COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let n = COUNT.fetch_add(1, Ordering::Relaxed);
    format!("{:x}{n:x}", nanos & 0xffff_ffff_ffff)
}

/// `url` without its query and fragment (a signed storage URL's query is a credential).
fn shown(url: &Url) -> String {
    let mut u = url.clone();
    u.set_query(None);
    u.set_fragment(None);
    u.to_string()
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 255
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(Error::config(
            "checkpoint name",
            format!("expected 1-255 letters, digits, `_` or `-`, got `{name}`"),
        ));
    }
    Ok(())
}

fn decode<R: DeserializeOwned>(endpoint: &str, body: &str) -> Result<R> {
    serde_json::from_str(body).map_err(|e| Error::Decode {
        endpoint: endpoint.to_string(),
        message: format!("{e} in {}", excerpt(body)),
    })
}

fn decode_value<R: DeserializeOwned>(endpoint: &str, v: Value) -> Result<R> {
    serde_json::from_value(v.clone()).map_err(|e| Error::Decode {
        endpoint: endpoint.to_string(),
        message: format!("{e} in result {}", excerpt(&v.to_string())),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_errors_name_the_field() {
        let bad = TinkerConfig::new("localhost:8000");
        assert!(bad.validate().unwrap_err().to_string().contains("base_url"));
        let mut bad = TinkerConfig::new("http://x");
        bad.retry.max_attempts = 0;
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("retry.max_attempts")
        );
        assert!(check_name("v1-ok_2").is_ok());
        assert!(
            check_name("a/b")
                .unwrap_err()
                .to_string()
                .contains("checkpoint name")
        );
    }

    #[test]
    fn details_come_from_fastapi_and_hosted_bodies() {
        assert_eq!(
            detail(r#"{"detail": "Model not found"}"#),
            "Model not found"
        );
        assert_eq!(detail(r#"{"error": "boom", "category": "x"}"#), "boom");
        assert_eq!(detail("plain"), "plain");
    }
}
