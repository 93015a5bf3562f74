//! [`RemoteEnv`]: an [`Environment`] served by an environment server (see [`super`]), so the
//! agent loop, the conformance suite and the rollout code run on it unchanged.
//!
//! Action formats an environment defines (DBBench's classic text format) are parsed on the
//! client, which cannot receive code over HTTP: register their parsers with
//! [`RemoteEnv::with_parser`]. The format a session was parsed in is sent with `finish`, so the
//! server's verifier reads the closing text as the environment would in process.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use harness_core::{
    ActionParser, EnvSession, Environment, Observation, Outcome, Split, Task, ToolCall, ToolSpec,
};
use reqwest::Method;
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::{
    ErrorBody, FinishRequest, FinishResponse, Health, PROTOCOL, SessionStatus, StartRequest,
    StartResponse, StepResponse, TaskList,
};
use crate::error::{Error, Result};

/// Send one request (with `token` as its bearer credential, when given) and read its JSON
/// answer; an error status becomes [`Error::Request`] carrying the server's message.
pub(crate) async fn call<T: DeserializeOwned>(
    http: &reqwest::Client,
    token: Option<&str>,
    method: Method,
    url: String,
    body: Option<String>,
) -> Result<T> {
    let verb = match method.as_str() {
        "GET" => "GET",
        "DELETE" => "DELETE",
        _ => "POST",
    };
    let mut request = http.request(method, &url);
    if let Some(token) = token {
        request = request.bearer_auth(token);
    }
    if let Some(body) = body {
        request = request
            .header(reqwest::header::CONTENT_TYPE, "application/json")
            .body(body);
    }
    let fail = |status: Option<u16>, message: String| Error::Request {
        method: verb,
        url: url.clone(),
        status,
        message,
    };
    let response = request
        .send()
        .await
        .map_err(|e| fail(None, e.to_string()))?;
    let status = response.status();
    let bytes = response
        .bytes()
        .await
        .map_err(|e| fail(Some(status.as_u16()), e.to_string()))?;
    if !status.is_success() {
        let message = serde_json::from_slice::<ErrorBody>(&bytes)
            .map(|b| b.error.message)
            .unwrap_or_else(|_| String::from_utf8_lossy(&bytes).chars().take(500).collect());
        return Err(fail(Some(status.as_u16()), message));
    }
    serde_json::from_slice(&bytes).map_err(|e| Error::Protocol {
        url: url.clone(),
        message: format!("the answer does not parse: {e}"),
    })
}

/// A request body as JSON text.
pub(crate) fn to_json<T: Serialize>(value: &T) -> String {
    serde_json::to_string(value).unwrap_or_else(|_| unreachable!("wire types are plain data"))
}

/// How a [`RemoteEnv`] talks to its server.
#[derive(Debug, Clone)]
pub struct RemoteEnvConfig {
    /// The longest a request may take (a step of a slow environment included).
    pub request_timeout: Duration,
    /// The runner's credential, sent with every request: a server with a runner token
    /// (`EnvServerConfig::runner_token`) serves only it. `None` for an open server.
    pub token: Option<String>,
}

impl Default for RemoteEnvConfig {
    fn default() -> Self {
        RemoteEnvConfig {
            request_timeout: Duration::from_secs(600),
            token: None,
        }
    }
}

/// An environment behind an environment server.
pub struct RemoteEnv {
    name: String,
    base: String,
    http: reqwest::Client,
    token: Option<String>,
    tasks: Vec<Task>,
    parsers: BTreeMap<String, Arc<dyn ActionParser>>,
}

impl std::fmt::Debug for RemoteEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteEnv")
            .field("name", &self.name)
            .field("base", &self.base)
            .field("tasks", &self.tasks.len())
            .field("parsers", &self.parsers.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl RemoteEnv {
    /// Connect to the open server at `base_url` (`http://host:port`) with default settings:
    /// check its protocol and fetch its task lists (the [`Environment::tasks`] seam is
    /// synchronous).
    pub async fn connect(base_url: impl Into<String>) -> Result<Self> {
        Self::connect_with(base_url, &RemoteEnvConfig::default()).await
    }

    /// [`RemoteEnv::connect`] as the runner of a server with the runner token `token`.
    pub async fn connect_as(base_url: impl Into<String>, token: impl Into<String>) -> Result<Self> {
        let config = RemoteEnvConfig {
            token: Some(token.into()),
            ..RemoteEnvConfig::default()
        };
        Self::connect_with(base_url, &config).await
    }

    /// [`RemoteEnv::connect`] with `config`.
    pub async fn connect_with(
        base_url: impl Into<String>,
        config: &RemoteEnvConfig,
    ) -> Result<Self> {
        let base = base_url.into().trim_end_matches('/').to_string();
        if !(base.starts_with("http://") || base.starts_with("https://")) {
            return Err(Error::config(
                "base_url",
                format!("expected an http:// or https:// URL, got `{base}`"),
            ));
        }
        harness_openai::install_tls_provider();
        let http = reqwest::Client::builder()
            .timeout(config.request_timeout)
            .build()
            .map_err(|e| Error::config("base_url", format!("cannot build an HTTP client: {e}")))?;
        let token = config.token.clone();
        let health: Health = call(
            &http,
            token.as_deref(),
            Method::GET,
            format!("{base}/health"),
            None,
        )
        .await?;
        if health.protocol != PROTOCOL {
            return Err(Error::Protocol {
                url: format!("{base}/health"),
                message: format!(
                    "the server speaks `{}`, this client `{PROTOCOL}`",
                    health.protocol
                ),
            });
        }
        let mut tasks = Vec::new();
        for split in Split::ALL {
            let list: TaskList = call(
                &http,
                token.as_deref(),
                Method::GET,
                format!("{base}/v1/tasks?split={split}"),
                None,
            )
            .await?;
            tasks.extend(list.tasks.iter().map(|t| t.to_task()));
        }
        Ok(RemoteEnv {
            name: health.env,
            base,
            http,
            token,
            tasks,
            parsers: BTreeMap::new(),
        })
    }

    /// Parse turns in `parser`'s format (by its [`ActionParser::format`] name) when a harness
    /// asks for it.
    pub fn with_parser(mut self, parser: Arc<dyn ActionParser>) -> Self {
        self.parsers.insert(parser.format().to_string(), parser);
        self
    }

    /// The server's address.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    /// Start a session of `task_id` with at most `max_steps` steps.
    pub async fn start(
        &self,
        task_id: &str,
        seed: u64,
        max_steps: Option<u32>,
    ) -> Result<RemoteSession> {
        let request = StartRequest {
            task_id: task_id.to_string(),
            seed: Some(seed),
            max_steps,
        };
        let started: StartResponse = call(
            &self.http,
            self.token.as_deref(),
            Method::POST,
            format!("{}/v1/sessions", self.base),
            Some(to_json(&request)),
        )
        .await?;
        Ok(RemoteSession {
            env: self.name.clone(),
            url: format!("{}/v1/sessions/{}", self.base, started.session_id),
            http: self.http.clone(),
            token: self.token.clone(),
            started,
            parsers: self.parsers.clone(),
            format: Mutex::new(None),
        })
    }
}

impl RemoteEnv {
    /// Session `session_id`'s status and outcome (the runner's route).
    pub async fn status(&self, session_id: &str) -> Result<SessionStatus> {
        call(
            &self.http,
            self.token.as_deref(),
            Method::GET,
            format!("{}/v1/sessions/{session_id}", self.base),
            None,
        )
        .await
    }
}

#[async_trait]
impl Environment for RemoteEnv {
    fn name(&self) -> &str {
        &self.name
    }

    async fn reset(&self, task: &Task, seed: u64) -> harness_core::Result<Box<dyn EnvSession>> {
        let session = self
            .start(&task.id, seed, None)
            .await
            .map_err(|e| e.into_env_error(&self.name))?;
        Ok(Box::new(session))
    }

    /// The tasks the server listed at connection time (without their metadata).
    fn tasks(&self, split: Split) -> harness_core::Result<Vec<Task>> {
        Ok(self
            .tasks
            .iter()
            .filter(|t| t.split == split)
            .cloned()
            .collect())
    }
}

/// One session on an environment server. Dropping it closes the session on the server (in the
/// background, when a tokio runtime is running).
pub struct RemoteSession {
    env: String,
    url: String,
    http: reqwest::Client,
    token: Option<String>,
    started: StartResponse,
    parsers: BTreeMap<String, Arc<dyn ActionParser>>,
    format: Mutex<Option<String>>,
}

impl RemoteSession {
    /// The session's id.
    pub fn id(&self) -> &str {
        &self.started.session_id
    }

    /// What the server answered to the start.
    pub fn started(&self) -> &StartResponse {
        &self.started
    }

    async fn post<T: DeserializeOwned, B: Serialize + Sync>(
        &self,
        what: &str,
        body: &B,
    ) -> harness_core::Result<T> {
        call(
            &self.http,
            self.token.as_deref(),
            Method::POST,
            format!("{}/{what}", self.url),
            Some(to_json(body)),
        )
        .await
        .map_err(|e| e.into_env_error(&self.env))
    }
}

#[async_trait]
impl EnvSession for RemoteSession {
    fn tools(&self) -> Vec<ToolSpec> {
        self.started.tools.clone()
    }

    async fn step(&mut self, call: &ToolCall) -> harness_core::Result<Observation> {
        let answer: StepResponse = self.post("step", call).await?;
        Ok(answer.observation)
    }

    async fn verify(&mut self, final_answer: Option<&str>) -> harness_core::Result<Outcome> {
        let request = FinishRequest {
            final_answer: final_answer.map(str::to_string),
            action_format: self
                .format
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        };
        let answer: FinishResponse = self.post("finish", &request).await?;
        answer.outcome.ok_or_else(|| harness_core::Error::Environment {
            env: self.env.clone(),
            message: format!(
                "{}/finish withheld the outcome: the server answers it to the runner's credential only (RemoteEnvConfig::token)",
                self.url
            ),
        })
    }

    fn initial_observation(&self) -> String {
        self.started.initial_observation.clone()
    }

    fn action_parser(&self, format: &str) -> Option<Arc<dyn ActionParser>> {
        let parser = self.parsers.get(format).cloned()?;
        *self.format.lock().unwrap_or_else(|p| p.into_inner()) = Some(format.to_string());
        Some(parser)
    }
}

impl Drop for RemoteSession {
    fn drop(&mut self) {
        // Free the server's state now rather than at its idle timeout.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let mut request = self.http.delete(&self.url);
            if let Some(token) = &self.token {
                request = request.bearer_auth(token);
            }
            runtime.spawn(async move {
                let _ = request.send().await;
            });
        }
    }
}
