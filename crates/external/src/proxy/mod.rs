//! The recording proxy: an OpenAI-compatible `/v1/chat/completions` endpoint in front of the
//! acting policy (any [`harness_core::Policy`]: the in-process candle policy, or a vLLM/SGLang
//! engine through harness-openai's `RemotePolicy`) that records, per episode, what the policy
//! actually sampled.
//!
//! A runner opens an episode ([`RecordingProxy::open_episode`]) and hands the program the
//! proxy's base URL and the episode's key; the program uses the key as its API key (the
//! OpenAI SDK's `api_key`, so a `base_url` swap is all it changes). Every call is answered by
//! the policy and recorded under that key: the prompt token ids, the sampled token ids and
//! their log-probs, the sampling settings (see [`record`]). Closing the episode
//! ([`RecordingProxy::close_episode`]) returns the [`EpisodeRecord`], from which the runner
//! assembles the [`harness_core::Trajectory`] with the verifier's outcome.
//!
//! What the proxy does with a request:
//! - `Authorization: Bearer <episode key>` selects the episode; an unknown (or closed) key is
//!   answered 401. Keys are 128-bit random values, so one episode cannot write into another.
//! - An episode has at most [`ProxyConfig::max_requests_per_episode`] calls in flight (one
//!   more is answered 429 at once), and every request at most
//!   [`ProxyConfig::request_timeout`] (503): a program that floods the proxy holds no more of
//!   the policy than that.
//! - Messages and tools are rendered by the policy's own chat template; an assistant message
//!   that carries a reply the proxy sent (the same content up to surrounding whitespace and
//!   the same tool calls up to JSON layout) is given back the policy's own generated text, so
//!   that a program which keeps its history intact produces prompts that extend the previous
//!   turn token for token. Anything else is the program's text, and where it changes the
//!   history the prefix check counts it (see [`record`]).
//! - The `k`-th call of an episode samples with seed [`harness_core::call_seed`]`(seed, k)`,
//!   ignoring the request's `seed`, so that one seed drives a run. Temperature and `top_p`
//!   are the request's unless the episode ([`EpisodeSpec::sampling`]) or the proxy
//!   ([`ProxyConfig::sampling`]) pins them; either way the turn records the settings it was
//!   drawn under.
//! - `max_tokens` / `max_completion_tokens` are capped by the episode's
//!   `limits.max_output_tokens`; a prompt over `limits.max_context_tokens` is answered 400
//!   (`context_length_exceeded`) and recorded as a turn without tokens; calls beyond
//!   `limits.max_model_calls` are answered 429 and counted.
//! - A `user` or `system` message whose `name` is `hook:<name>` is the program's own harness
//!   message (a hook's warning, a nudge): it is recorded with source `harness` and
//!   `hook = <name>`, like the built-in loop's hook messages (see [`record`]); the name is not
//!   shown to the policy. Other messages get the source [`record`] infers from their role.
//! - `tools` are offered to the template; `<tool_call>` blocks in the generated text come back
//!   as `tool_calls` (any `tool_choice` but `"none"` is treated as `"auto"`). `n` must be 1.
//! - `logprobs: true` returns each sampled token's log-prob with the token written
//!   `token_id:<id>` (vLLM's `return_tokens_as_token_ids` convention).
//! - `stream: true` answers with server-sent events in OpenAI's chunk format (a role chunk,
//!   the content, the tool calls, the finish reason, a usage chunk when
//!   `stream_options.include_usage` is set, then `data: [DONE]`). The chunks are written once
//!   the turn is generated: the [`harness_core::Policy`] seam returns whole turns.

pub mod record;
mod server;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use harness_core::{Policy, SamplingParams};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

pub use record::{EpisodeEnd, EpisodeRecord, EpisodeSpec, PrefixPolicy};
pub use server::router;

use crate::error::{Error, Result};
use record::EpisodeLog;

/// How the proxy answers and records.
#[derive(Debug, Clone, PartialEq)]
pub struct ProxyConfig {
    /// The model name the answers carry (requests may name any model).
    pub model: String,
    /// What an episode with a prefix break becomes.
    pub prefix_policy: PrefixPolicy,
    /// Sampling settings every call uses, whatever the request says (`None`: the request's
    /// `temperature` and `top_p`, defaulting to 1). A trainer whose importance weight needs
    /// one temperature and no truncation pins them here.
    pub sampling: Option<SamplingParams>,
    /// The most episodes open at once; one more is refused. Each program holds one episode
    /// (one key), the one its runner opened.
    pub max_episodes: usize,
    /// Calls one episode (one key) may have in flight at once; one more is answered 429 at
    /// once, so that a program flooding the proxy holds no more of the policy than this.
    pub max_requests_per_episode: usize,
    /// The longest a request may take, body and generation included; past it the request is
    /// answered 503 and its work dropped.
    pub request_timeout: std::time::Duration,
}

impl ProxyConfig {
    /// Answer as `model`, with the defaults: own contexts, the request's sampling, 4,096
    /// episodes.
    pub fn new(model: impl Into<String>) -> Self {
        ProxyConfig {
            model: model.into(),
            prefix_policy: PrefixPolicy::OwnContext,
            sampling: None,
            max_episodes: 4096,
            max_requests_per_episode: 4,
            request_timeout: std::time::Duration::from_secs(600),
        }
    }

    /// Refuse unusable values, naming the field.
    pub fn validate(&self) -> Result<()> {
        if self.model.trim().is_empty() {
            return Err(Error::config(
                "model",
                "expected a model name, got an empty one",
            ));
        }
        if self.max_episodes == 0 {
            return Err(Error::config("max_episodes", "expected at least 1"));
        }
        if self.max_requests_per_episode == 0 {
            return Err(Error::config(
                "max_requests_per_episode",
                "expected at least 1",
            ));
        }
        if self.request_timeout.is_zero() {
            return Err(Error::config(
                "request_timeout",
                "expected a duration above zero",
            ));
        }
        if let Some(s) = &self.sampling {
            if !(s.temperature.is_finite() && s.temperature >= 0.0) {
                return Err(Error::config(
                    "sampling.temperature",
                    format!("expected a finite number >= 0, got {}", s.temperature),
                ));
            }
            if !(s.top_p > 0.0 && s.top_p <= 1.0) {
                return Err(Error::config(
                    "sampling.top_p",
                    format!("expected a number in (0, 1], got {}", s.top_p),
                ));
            }
        }
        Ok(())
    }
}

/// Counters over every episode the proxy served (the run's prefix-check metrics).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProxyStats {
    /// Episodes opened.
    pub episodes: u64,
    /// Turns recorded.
    pub turns: u64,
    /// Turns that broke the prefix check.
    pub prefix_breaks: u64,
    /// Episodes closed with at least one prefix break.
    pub episodes_with_breaks: u64,
    /// Episodes closed masked out of the loss.
    pub masked_episodes: u64,
    /// Calls refused (unknown key, malformed, over a limit).
    pub refused_calls: u64,
}

#[derive(Debug, Default)]
struct Counters {
    episodes: AtomicU64,
    turns: AtomicU64,
    prefix_breaks: AtomicU64,
    episodes_with_breaks: AtomicU64,
    masked_episodes: AtomicU64,
    refused_calls: AtomicU64,
}

/// The proxy: a policy, its configuration and the open episodes.
pub struct RecordingProxy {
    policy: Arc<dyn Policy>,
    config: ProxyConfig,
    episodes: Mutex<HashMap<String, Arc<Mutex<EpisodeLog>>>>,
    /// Calls in flight per open episode's key.
    in_flight: Mutex<HashMap<String, usize>>,
    counters: Counters,
    next_id: AtomicU64,
}

impl RecordingProxy {
    /// A proxy in front of `policy`.
    pub fn new(policy: Arc<dyn Policy>, config: ProxyConfig) -> Result<Arc<Self>> {
        config.validate()?;
        Ok(Arc::new(RecordingProxy {
            policy,
            config,
            episodes: Mutex::new(HashMap::new()),
            in_flight: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            next_id: AtomicU64::new(0),
        }))
    }

    /// The configuration.
    pub fn config(&self) -> &ProxyConfig {
        &self.config
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Mutex<EpisodeLog>>>> {
        self.episodes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Start recording an episode; returns the key the program sends as its API key.
    pub fn open_episode(&self, spec: EpisodeSpec) -> Result<String> {
        let limits = &spec.limits;
        for (field, value) in [
            ("limits.max_model_calls", limits.max_model_calls),
            ("limits.max_context_tokens", limits.max_context_tokens),
            ("limits.max_output_tokens", limits.max_output_tokens),
        ] {
            if value == 0 {
                return Err(Error::config(field, "expected at least 1"));
            }
        }
        let mut episodes = self.lock();
        if episodes.len() >= self.config.max_episodes {
            return Err(Error::config(
                "max_episodes",
                format!(
                    "{} episodes are open already; close some first",
                    self.config.max_episodes
                ),
            ));
        }
        let key = format!("hs-episode-{:032x}", rand::random::<u128>());
        let log = EpisodeLog::new(spec, self.config.prefix_policy);
        episodes.insert(key.clone(), Arc::new(Mutex::new(log)));
        self.counters.episodes.fetch_add(1, Ordering::SeqCst);
        Ok(key)
    }

    /// Stop recording `key`'s episode and return what was recorded; the key is refused from
    /// now on. A call still being generated for it is answered but not recorded.
    pub fn close_episode(&self, key: &str) -> Result<EpisodeRecord> {
        let log = self.lock().remove(key).ok_or_else(|| {
            Error::config(
                "episode key",
                format!("no open episode has the key `{key}`"),
            )
        })?;
        let log = match Arc::try_unwrap(log) {
            Ok(log) => log.into_inner().unwrap_or_else(|p| p.into_inner()),
            // A handler still holds it: take what is recorded and leave it an empty log,
            // which nobody reads.
            Err(shared) => {
                let mut guard = shared.lock().unwrap_or_else(|p| p.into_inner());
                let empty = EpisodeLog::new(guard.spec().clone(), self.config.prefix_policy);
                std::mem::replace(&mut *guard, empty)
            }
        };
        let record = log.finish();
        if record.prefix_breaks > 0 {
            self.counters
                .episodes_with_breaks
                .fetch_add(1, Ordering::SeqCst);
        }
        if record.masked() {
            self.counters.masked_episodes.fetch_add(1, Ordering::SeqCst);
        }
        Ok(record)
    }

    /// Count a call of `key`'s episode in flight; `None` when the episode has
    /// [`ProxyConfig::max_requests_per_episode`] in flight already.
    pub(crate) fn admit(self: &Arc<Self>, key: &str) -> Option<InFlight> {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let n = in_flight.entry(key.to_string()).or_insert(0);
        if *n >= self.config.max_requests_per_episode {
            return None;
        }
        *n += 1;
        Some(InFlight {
            proxy: self.clone(),
            key: key.to_string(),
        })
    }

    /// Episodes open now.
    pub fn open_episodes(&self) -> usize {
        self.lock().len()
    }

    /// The counters so far.
    pub fn stats(&self) -> ProxyStats {
        let c = &self.counters;
        ProxyStats {
            episodes: c.episodes.load(Ordering::SeqCst),
            turns: c.turns.load(Ordering::SeqCst),
            prefix_breaks: c.prefix_breaks.load(Ordering::SeqCst),
            episodes_with_breaks: c.episodes_with_breaks.load(Ordering::SeqCst),
            masked_episodes: c.masked_episodes.load(Ordering::SeqCst),
            refused_calls: c.refused_calls.load(Ordering::SeqCst),
        }
    }
}

/// A call counted in flight for its episode; released when dropped.
pub(crate) struct InFlight {
    proxy: Arc<RecordingProxy>,
    key: String,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut in_flight = self
            .proxy
            .in_flight
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = in_flight.get_mut(&self.key) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&self.key);
            }
        }
    }
}

/// A proxy serving on a tokio task; it stops when [`ProxyHandle::shutdown`] is called or the
/// handle is dropped.
pub struct ProxyHandle {
    addr: SocketAddr,
    proxy: Arc<RecordingProxy>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
}

impl ProxyHandle {
    /// Bind `addr` (port 0 picks a free port) and serve.
    pub async fn spawn(addr: SocketAddr, proxy: Arc<RecordingProxy>) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| Error::Server(format!("cannot bind {addr}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Server(format!("no local address: {e}")))?;
        let (stop, stopped) = oneshot::channel::<()>();
        let app = router(proxy.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        Ok(ProxyHandle {
            addr,
            proxy,
            stop: Some(stop),
            task: Some(task),
        })
    }

    /// The OpenAI base URL programs use: `http://<addr>/v1`.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The proxy.
    pub fn proxy(&self) -> &Arc<RecordingProxy> {
        &self.proxy
    }

    /// Stop accepting, let in-flight requests finish, and wait for the server task.
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            task.await
                .map_err(|e| Error::Server(format!("proxy task failed: {e}")))?
                .map_err(|e| Error::Server(format!("proxy failed: {e}")))?;
        }
        Ok(())
    }
}

impl Drop for ProxyHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
