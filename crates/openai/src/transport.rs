//! Endpoint configuration and the shared HTTP machinery: per-attempt timeouts, retries with
//! seeded exponential backoff and jitter, `Retry-After`, and a concurrency limit.

use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use reqwest::StatusCode;
use reqwest::header::{HeaderMap, RETRY_AFTER};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::Semaphore;

use crate::error::{Error, Result};

/// When and how often a failed request is tried again.
///
/// Retried: HTTP 429, HTTP 5xx, connections that fail or drop before the whole answer arrived,
/// and (when `retry_timeouts` is set) attempts that ran past the timeout. Everything else (other
/// 4xx, an answer that does not parse) fails at once. The delay before attempt `n + 1` is
/// `min(max_backoff, initial_backoff * 2^(n-1))`, shrunk by a random factor in
/// `[1 - jitter, 1]` drawn from a generator seeded with `seed`; a `Retry-After` header (seconds
/// or an HTTP date) raises the delay to what the server asked for, up to `max_retry_after`.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryConfig {
    /// Attempts in all, the first included (1 disables retries).
    pub max_attempts: u32,
    /// The delay before the first retry.
    pub initial_backoff: Duration,
    /// The longest computed delay.
    pub max_backoff: Duration,
    /// Fraction of each delay that is randomised, in `[0, 1]`.
    pub jitter: f64,
    /// The longest wait a `Retry-After` header can impose.
    pub max_retry_after: Duration,
    /// Retry attempts that timed out.
    pub retry_timeouts: bool,
    /// Seed of the jitter generator, so that a run's waits are reproducible.
    pub seed: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            max_attempts: 4,
            initial_backoff: Duration::from_millis(500),
            max_backoff: Duration::from_secs(20),
            jitter: 0.5,
            max_retry_after: Duration::from_secs(60),
            retry_timeouts: true,
            seed: 0,
        }
    }
}

impl RetryConfig {
    /// No retries: every failure is final.
    pub fn none() -> Self {
        RetryConfig {
            max_attempts: 1,
            ..Self::default()
        }
    }
}

/// Where an endpoint is and how to talk to it.
#[derive(Clone)]
pub struct EndpointConfig {
    /// The URL every request path is appended to. For [`crate::ChatClient`] this is the
    /// OpenAI-SDK style base that ends in `/v1` (`https://api.openai.com/v1`,
    /// `http://127.0.0.1:8000/v1`); for [`crate::RemotePolicy`] it is the server root
    /// (`http://127.0.0.1:8000`), because SGLang's `/generate` is not under `/v1`.
    pub base_url: String,
    /// Sent as `Authorization: Bearer <key>` when set. The library never reads environment
    /// variables: binaries do, and pass the key here.
    pub api_key: Option<String>,
    /// The limit on one attempt, from connecting until the whole answer has arrived.
    pub timeout: Duration,
    /// The limit on establishing a connection.
    pub connect_timeout: Duration,
    /// At most this many requests are in flight at once (across all tasks using the client).
    pub max_concurrency: usize,
    /// Retries.
    pub retry: RetryConfig,
}

impl fmt::Debug for EndpointConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointConfig")
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("timeout", &self.timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("max_concurrency", &self.max_concurrency)
            .field("retry", &self.retry)
            .finish()
    }
}

impl EndpointConfig {
    /// An endpoint at `base_url` with no key, a 120 s timeout, 16 concurrent requests and the
    /// default retries.
    pub fn new(base_url: impl Into<String>) -> Self {
        EndpointConfig {
            base_url: base_url.into(),
            api_key: None,
            timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            max_concurrency: 16,
            retry: RetryConfig::default(),
        }
    }

    /// The same endpoint with an API key.
    pub fn with_api_key(mut self, key: impl Into<String>) -> Self {
        self.api_key = Some(key.into());
        self
    }

    /// The same endpoint with another per-attempt timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The same endpoint with another concurrency limit.
    pub fn with_max_concurrency(mut self, n: usize) -> Self {
        self.max_concurrency = n;
        self
    }

    /// The same endpoint with other retries.
    pub fn with_retry(mut self, retry: RetryConfig) -> Self {
        self.retry = retry;
        self
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
        if self.max_concurrency == 0 {
            return Err(Error::config("max_concurrency", "must be at least 1"));
        }
        if self.timeout.is_zero() {
            return Err(Error::config("timeout", "must be positive"));
        }
        if self.retry.max_attempts == 0 {
            return Err(Error::config(
                "retry.max_attempts",
                "must be at least 1 (1 means no retries)",
            ));
        }
        if !(0.0..=1.0).contains(&self.retry.jitter) {
            return Err(Error::config(
                "retry.jitter",
                format!("expected a fraction in [0, 1], got {}", self.retry.jitter),
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

/// A decoded answer and how many attempts it took.
#[derive(Debug)]
pub(crate) struct Reply<T> {
    pub value: T,
    pub attempts: u32,
}

/// The outcome of one attempt.
enum Attempt<T> {
    Done(T),
    Retry {
        status: Option<u16>,
        message: String,
        retry_after: Option<Duration>,
    },
    Fail {
        status: Option<u16>,
        message: String,
    },
}

/// The HTTP client shared by [`crate::ChatClient`] and [`crate::RemotePolicy`].
pub(crate) struct Transport {
    client: reqwest::Client,
    base: String,
    config: EndpointConfig,
    permits: Semaphore,
    rng: Mutex<ChaCha8Rng>,
}

impl fmt::Debug for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transport")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Makes rustls' `ring` provider the process's TLS crypto provider, unless the program installed
/// one already (that one is then kept). Every `reqwest::Client` needs one: the workspace builds
/// reqwest without its default provider (aws-lc-rs, a C library built from source), so a
/// program that builds a `reqwest::Client` of its own calls this first; the crate's own transport does.
pub fn install_tls_provider() {
    // An error means a provider is installed already, which is what is wanted.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// A `reqwest::Client` with default settings, after [`install_tls_provider`].
pub fn http_client() -> reqwest::Client {
    install_tls_provider();
    reqwest::Client::new()
}

impl Transport {
    pub fn new(config: EndpointConfig) -> Result<Self> {
        config.validate()?;
        install_tls_provider();
        let client = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| Error::config("endpoint", format!("cannot build an HTTP client: {e}")))?;
        Ok(Transport {
            client,
            base: config.base_url.trim().trim_end_matches('/').to_string(),
            permits: Semaphore::new(config.max_concurrency),
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(config.retry.seed)),
            config,
        })
    }

    /// The full URL of `path` (which starts with `/`).
    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// POST `body` as JSON to `path` and decode the JSON answer, retrying as configured.
    /// `timeout` overrides the per-attempt timeout (weight reloads take longer than requests).
    pub async fn post_json<B, T>(
        &self,
        path: &str,
        body: &B,
        timeout: Option<Duration>,
    ) -> Result<Reply<T>>
    where
        B: Serialize + ?Sized,
        T: DeserializeOwned,
    {
        let bytes = serde_json::to_vec(body).map_err(|e| Error::Protocol {
            endpoint: self.url(path),
            message: format!("cannot encode the request: {e}"),
        })?;
        self.send("POST", path, Some(bytes), timeout).await
    }

    /// GET `path` and decode the JSON answer, retrying as configured.
    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<Reply<T>> {
        self.send("GET", path, None, None).await
    }

    async fn send<T: DeserializeOwned>(
        &self,
        method: &'static str,
        path: &str,
        body: Option<Vec<u8>>,
        timeout: Option<Duration>,
    ) -> Result<Reply<T>> {
        let url = self.url(path);
        let retry = &self.config.retry;
        let mut attempt = 0u32;
        loop {
            attempt += 1;
            let outcome = {
                // The permit is held for one attempt only: a request that waits out a backoff
                // does not keep others from running.
                let _permit = self
                    .permits
                    .acquire()
                    .await
                    .map_err(|_| Error::Server("the concurrency limiter was closed".into()))?;
                self.attempt::<T>(method, &url, body.as_deref(), timeout)
                    .await
            };
            let (status, message, retry_after) = match outcome {
                Attempt::Done(value) => {
                    return Ok(Reply {
                        value,
                        attempts: attempt,
                    });
                }
                Attempt::Fail { status, message } => {
                    return Err(Error::Request {
                        method,
                        endpoint: url,
                        status,
                        attempts: attempt,
                        message,
                    });
                }
                Attempt::Retry {
                    status,
                    message,
                    retry_after,
                } => (status, message, retry_after),
            };
            if attempt >= retry.max_attempts {
                return Err(Error::Request {
                    method,
                    endpoint: url,
                    status,
                    attempts: attempt,
                    message,
                });
            }
            let delay = self.backoff(attempt, retry_after);
            tracing::warn!(
                %url, attempt, ?status, %message, delay_ms = delay.as_millis() as u64,
                "retrying request"
            );
            tokio::time::sleep(delay).await;
        }
    }

    /// The wait after failed attempt number `attempt` (1-based).
    fn backoff(&self, attempt: u32, retry_after: Option<Duration>) -> Duration {
        let retry = &self.config.retry;
        let exp = retry
            .initial_backoff
            .saturating_mul(1u32 << (attempt - 1).min(20))
            .min(retry.max_backoff);
        let u: f64 = self
            .rng
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .r#gen::<f64>();
        let jittered = exp.mul_f64(1.0 - retry.jitter * u);
        match retry_after {
            Some(asked) => jittered.max(asked.min(retry.max_retry_after)),
            None => jittered,
        }
    }

    async fn attempt<T: DeserializeOwned>(
        &self,
        method: &'static str,
        url: &str,
        body: Option<&[u8]>,
        timeout: Option<Duration>,
    ) -> Attempt<T> {
        let mut req = match method {
            "GET" => self.client.get(url),
            _ => self.client.post(url),
        };
        req = req.timeout(timeout.unwrap_or(self.config.timeout));
        if let Some(key) = &self.config.api_key {
            req = req.bearer_auth(key);
        }
        if let Some(body) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_vec());
        }
        let response = match req.send().await {
            Ok(r) => r,
            Err(e) => return self.transport_failure(None, &e),
        };
        let status = response.status();
        let retry_after = parse_retry_after(response.headers());
        let bytes = match response.bytes().await {
            Ok(b) => b,
            // The connection dropped or stalled mid-answer.
            Err(e) => return self.transport_failure(Some(status.as_u16()), &e),
        };
        if status.is_success() {
            // An empty body (vLLM's control endpoints) reads as JSON `null`.
            let body: &[u8] = if bytes.iter().all(u8::is_ascii_whitespace) {
                b"null"
            } else {
                &bytes
            };
            return match serde_json::from_slice::<T>(body) {
                Ok(v) => Attempt::Done(v),
                Err(e) => Attempt::Fail {
                    status: Some(status.as_u16()),
                    message: format!(
                        "the answer does not parse: {e}; body starts with: {}",
                        snippet(&bytes)
                    ),
                },
            };
        }
        let message = format!("HTTP {status}: {}", error_message(&bytes));
        if status == StatusCode::TOO_MANY_REQUESTS || status.is_server_error() {
            Attempt::Retry {
                status: Some(status.as_u16()),
                message,
                retry_after,
            }
        } else {
            Attempt::Fail {
                status: Some(status.as_u16()),
                message,
            }
        }
    }

    fn transport_failure<T>(&self, status: Option<u16>, e: &reqwest::Error) -> Attempt<T> {
        let mut message = if e.is_timeout() {
            format!(
                "timed out after {:?} (per-attempt timeout)",
                self.config.timeout
            )
        } else if e.is_connect() {
            format!("cannot connect: {}", error_chain(e))
        } else {
            format!("connection failed: {}", error_chain(e))
        };
        if status.is_some() {
            message.push_str(" (while reading the answer)");
        }
        if e.is_timeout() && !self.config.retry.retry_timeouts {
            Attempt::Fail { status, message }
        } else {
            Attempt::Retry {
                status,
                message,
                retry_after: None,
            }
        }
    }
}

/// The error and its sources on one line (reqwest's top-level message is terse).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.contains(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        source = s.source();
    }
    out
}

fn snippet(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let cut: String = text.chars().take(300).collect();
    if cut.len() < text.len() {
        format!("{cut}...")
    } else {
        cut
    }
}

/// The human message of an error body: OpenAI's `{"error": {"message"}}`, vLLM's
/// `{"message"}`, FastAPI's `{"detail"}`, or the text itself.
pub(crate) fn error_message(bytes: &[u8]) -> String {
    if let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes) {
        let candidates = [
            v.pointer("/error/message"),
            v.get("error").filter(|e| e.is_string()),
            v.get("message"),
            v.get("detail"),
        ];
        if let Some(c) = candidates.into_iter().flatten().next() {
            return match c {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
        }
    }
    let s = snippet(bytes);
    if s.is_empty() {
        "(empty body)".into()
    } else {
        s
    }
}

/// `Retry-After` as delta-seconds (decimals accepted) or an IMF-fixdate HTTP date.
pub(crate) fn parse_retry_after(headers: &HeaderMap) -> Option<Duration> {
    let value = headers.get(RETRY_AFTER)?.to_str().ok()?.trim();
    if let Ok(secs) = value.parse::<f64>() {
        return (secs.is_finite() && secs >= 0.0).then(|| Duration::from_secs_f64(secs));
    }
    let at = parse_http_date(value)?;
    let now = SystemTime::now().duration_since(UNIX_EPOCH).ok()?.as_secs();
    Some(Duration::from_secs(at.saturating_sub(now)))
}

/// Seconds since the epoch of an IMF-fixdate such as `Sun, 06 Nov 1994 08:49:37 GMT`.
fn parse_http_date(s: &str) -> Option<u64> {
    let rest = s.split_once(", ")?.1;
    let parts: Vec<&str> = rest.split_whitespace().collect();
    if parts.len() != 5 || parts[4] != "GMT" {
        return None;
    }
    let day: u64 = parts[0].parse().ok()?;
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| *m == parts[1])? as u64 + 1;
    let year: i64 = parts[2].parse().ok()?;
    let hms: Vec<u64> = parts[3]
        .split(':')
        .map(|x| x.parse().ok())
        .collect::<Option<_>>()?;
    if hms.len() != 3 || !(1..=31).contains(&day) {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let m = month as i64;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + (hms[0] * 3600 + hms[1] * 60 + hms[2]) as i64;
    u64::try_from(secs).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_and_seconds_parse() {
        assert_eq!(
            parse_http_date("Sun, 06 Nov 1994 08:49:37 GMT"),
            Some(784_111_777)
        );
        assert_eq!(parse_http_date("yesterday"), None);
        let mut h = HeaderMap::new();
        h.insert(RETRY_AFTER, "2".parse().unwrap());
        assert_eq!(parse_retry_after(&h), Some(Duration::from_secs(2)));
        h.insert(RETRY_AFTER, "0.25".parse().unwrap());
        assert_eq!(parse_retry_after(&h), Some(Duration::from_millis(250)));
        h.insert(
            RETRY_AFTER,
            "Sun, 06 Nov 1994 08:49:37 GMT".parse().unwrap(),
        );
        assert_eq!(parse_retry_after(&h), Some(Duration::ZERO));
    }

    #[test]
    fn backoff_grows_is_capped_jittered_and_seeded() {
        let retry = RetryConfig {
            initial_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_millis(350),
            jitter: 0.5,
            seed: 7,
            ..RetryConfig::default()
        };
        let cfg = EndpointConfig::new("http://127.0.0.1:1").with_retry(retry);
        let a = Transport::new(cfg.clone()).unwrap();
        let b = Transport::new(cfg).unwrap();
        let da: Vec<Duration> = (1..=4).map(|n| a.backoff(n, None)).collect();
        let db: Vec<Duration> = (1..=4).map(|n| b.backoff(n, None)).collect();
        assert_eq!(da, db, "same seed, same waits");
        let caps = [100u64, 200, 350, 350];
        for (d, cap) in da.iter().zip(caps) {
            assert!(*d <= Duration::from_millis(cap), "{d:?} > {cap} ms");
            assert!(*d >= Duration::from_millis(cap / 2), "{d:?} < {cap}/2 ms");
        }
        // Retry-After raises the wait, bounded by max_retry_after.
        assert_eq!(
            a.backoff(1, Some(Duration::from_secs(3))),
            Duration::from_secs(3)
        );
        assert_eq!(
            a.backoff(1, Some(Duration::from_secs(3600))),
            Duration::from_secs(60)
        );
    }

    #[test]
    fn bad_configs_name_the_field() {
        let bad = EndpointConfig::new("localhost:8000");
        assert!(bad.validate().unwrap_err().to_string().contains("base_url"));
        let bad = EndpointConfig::new("http://x").with_max_concurrency(0);
        assert!(
            bad.validate()
                .unwrap_err()
                .to_string()
                .contains("max_concurrency")
        );
        let dbg = format!(
            "{:?}",
            EndpointConfig::new("http://x").with_api_key("sk-secret")
        );
        assert!(!dbg.contains("sk-secret"), "{dbg}");
    }
}
