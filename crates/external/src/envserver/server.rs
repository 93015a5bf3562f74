//! The environment server: one [`Environment`] behind the routes of [`super`]'s protocol.
//!
//! ```no_run
//! use std::sync::Arc;
//! use harness_external::envserver::server::{EnvServer, EnvServerConfig, EnvServerHandle};
//!
//! # async fn run(env: Arc<dyn harness_core::Environment>) -> harness_external::Result<()> {
//! let server = EnvServer::new(env, EnvServerConfig::default())?;
//! let handle = EnvServerHandle::spawn("127.0.0.1:0".parse().unwrap(), server).await?;
//! println!("serving on {}", handle.base_url());
//! # Ok(())
//! # }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Path, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use harness_core::{EnvSession, Environment, Outcome, Split, TOOL_CALL_FORMAT, Task};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use super::{
    ErrorBody, ErrorDetail, FinishRequest, FinishResponse, Health, PROTOCOL, PublicTask,
    SessionState, SessionStatus, StartRequest, StartResponse, StepRequest, StepResponse, TaskList,
    bearer, fresh_token, same_secret,
};
use crate::error::{Error, Result};

/// Session limits of an [`EnvServer`].
#[derive(Debug, Clone, PartialEq)]
pub struct EnvServerConfig {
    /// A session unused this long is removed with its state.
    pub idle_timeout: Duration,
    /// A session this old is removed with its state, used or not.
    pub max_lifetime: Duration,
    /// The most sessions held at once; one more start is answered 503.
    pub max_sessions: usize,
    /// How often expired sessions are swept (they are also refused on access in between).
    pub sweep_interval: Duration,
    /// The runner's credential (`Authorization: Bearer <token>`; see [`super`]'s authority):
    /// with one, only it lists tasks, opens, reads and closes sessions, and a session's own
    /// token authorises that session's step, finish and episode only. `None` serves every
    /// client everything (the open protocol, for a trusted network and for tests' controls).
    pub runner_token: Option<String>,
    /// Requests a program (one session's token) may have in flight at once; one more is
    /// answered 429 at once.
    pub max_requests_per_program: usize,
    /// Requests all programs together may have in flight at once; one more is answered 503.
    /// The runner's own requests are not counted, so programs cannot crowd it out.
    pub max_program_requests: usize,
    /// The longest a request may take, body and environment work included (a verification
    /// too); past it the request is answered 503 and its work dropped.
    pub request_timeout: Duration,
}

impl Default for EnvServerConfig {
    fn default() -> Self {
        EnvServerConfig {
            idle_timeout: Duration::from_secs(600),
            max_lifetime: Duration::from_secs(3600),
            max_sessions: 1024,
            sweep_interval: Duration::from_secs(1),
            runner_token: None,
            max_requests_per_program: 4,
            max_program_requests: 256,
            request_timeout: Duration::from_secs(600),
        }
    }
}

impl EnvServerConfig {
    /// Refuse zero durations and a zero session limit, naming the field.
    pub fn validate(&self) -> Result<()> {
        for (field, value) in [
            ("idle_timeout", self.idle_timeout),
            ("max_lifetime", self.max_lifetime),
            ("sweep_interval", self.sweep_interval),
            ("request_timeout", self.request_timeout),
        ] {
            if value.is_zero() {
                return Err(Error::config(field, "expected a duration above zero"));
            }
        }
        for (field, value) in [
            ("max_sessions", self.max_sessions),
            ("max_requests_per_program", self.max_requests_per_program),
            ("max_program_requests", self.max_program_requests),
        ] {
            if value == 0 {
                return Err(Error::config(field, "expected at least 1"));
            }
        }
        if let Some(token) = &self.runner_token
            && (token.len() < 16 || !token.bytes().all(|b| b.is_ascii_graphic()))
        {
            return Err(Error::config(
                "runner_token",
                "expected at least 16 printable ASCII characters without spaces (e.g. envserver::fresh_token())",
            ));
        }
        Ok(())
    }
}

/// One session's state, behind its own lock so that sessions step concurrently.
struct Slot {
    task_id: String,
    /// The session's token (see [`super`]'s authority).
    token: String,
    /// Requests made with the session's token now in flight.
    in_flight: AtomicUsize,
    /// What the start answered, for `GET /v1/sessions/{id}/episode`.
    started_as: StartResponse,
    started: Instant,
    last_used: Mutex<Instant>,
    max_steps: Option<u32>,
    state: tokio::sync::Mutex<SlotState>,
}

struct SlotState {
    /// The environment's episode; dropped (freeing its database, files, ...) once verified.
    session: Option<Box<dyn EnvSession>>,
    steps: u32,
    tool_errors: u32,
    done: bool,
    outcome: Option<Outcome>,
}

impl Slot {
    fn expired(&self, now: Instant, config: &EnvServerConfig) -> bool {
        let idle = now.duration_since(*self.last_used.lock().unwrap_or_else(|p| p.into_inner()));
        idle > config.idle_timeout || now.duration_since(self.started) > config.max_lifetime
    }

    fn touch(&self) {
        *self.last_used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
    }
}

/// An [`Environment`] served over HTTP (see the protocol in [`super`]).
pub struct EnvServer {
    env: Arc<dyn Environment>,
    tasks: HashMap<String, Task>,
    by_split: BTreeMap<Split, Vec<String>>,
    config: EnvServerConfig,
    sessions: Mutex<HashMap<String, Arc<Slot>>>,
    /// Requests made with session tokens now in flight, all sessions together.
    program_requests: Arc<AtomicUsize>,
}

/// Who made a request to a session's route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// The runner (or anyone, when the server is open): every route, the whole outcome.
    Runner,
    /// The session's own program: step, finish and episode; no verdict.
    Program,
}

/// A request counted against a program's and all programs' bounds, released when dropped.
struct InFlight {
    slot: Option<Arc<Slot>>,
    all: Arc<AtomicUsize>,
}

impl Drop for InFlight {
    fn drop(&mut self) {
        if let Some(slot) = &self.slot {
            slot.in_flight.fetch_sub(1, Ordering::SeqCst);
        }
        self.all.fetch_sub(1, Ordering::SeqCst);
    }
}

impl EnvServer {
    /// Serve `env`'s built-in tasks of every split. Task ids must be unique across splits.
    pub fn new(env: Arc<dyn Environment>, config: EnvServerConfig) -> Result<Arc<Self>> {
        config.validate()?;
        let mut tasks = HashMap::new();
        let mut by_split = BTreeMap::new();
        for split in Split::ALL {
            let listed = env.tasks(split)?;
            let mut ids = Vec::with_capacity(listed.len());
            for task in listed {
                if let Some(old) = tasks.get(&task.id).map(|t: &Task| t.split) {
                    return Err(Error::config(
                        "tasks",
                        format!(
                            "environment `{}` lists task `{}` twice (in {old} and {split}); task ids must be unique to be served",
                            env.name(),
                            task.id
                        ),
                    ));
                }
                ids.push(task.id.clone());
                tasks.insert(task.id.clone(), task);
            }
            by_split.insert(split, ids);
        }
        Ok(Arc::new(EnvServer {
            env,
            tasks,
            by_split,
            config,
            sessions: Mutex::new(HashMap::new()),
            program_requests: Arc::new(AtomicUsize::new(0)),
        }))
    }

    /// The served environment's name.
    pub fn env_name(&self) -> &str {
        self.env.name()
    }

    /// Sessions held now (open or finished, not yet expired or closed).
    pub fn session_count(&self) -> usize {
        self.lock_sessions().len()
    }

    /// Remove every expired session; returns how many were removed.
    pub fn sweep(&self) -> usize {
        let now = Instant::now();
        let mut sessions = self.lock_sessions();
        let before = sessions.len();
        sessions.retain(|_, slot| !slot.expired(now, &self.config));
        before - sessions.len()
    }

    fn lock_sessions(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The settings.
    pub fn config(&self) -> &EnvServerConfig {
        &self.config
    }

    /// Refuse a request to a runner-only route unless it presents the runner token (or the
    /// server is open).
    fn runner_only(&self, headers: &HeaderMap, what: &str) -> std::result::Result<(), ApiError> {
        let Some(runner) = &self.config.runner_token else {
            return Ok(());
        };
        match bearer(headers) {
            Some(token) if same_secret(token, runner) => Ok(()),
            Some(_) => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!(
                    "{what} is the runner's: a program's session token authorises only its own session's step, finish and episode"
                ),
            )),
            None => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                format!("{what} needs the runner's credential (`Authorization: Bearer <token>`)"),
            )),
        }
    }

    /// Who may use session `id`'s `step`, `finish` or `episode` with these headers, and the
    /// request's place in the programs' bounds. A program's token must be the session's own;
    /// a missing or other session answers the same 403, so a token learns nothing of others.
    fn session_caller(
        &self,
        headers: &HeaderMap,
        id: &str,
    ) -> std::result::Result<(Caller, Option<InFlight>), ApiError> {
        let token = bearer(headers);
        let runner = match (&self.config.runner_token, token) {
            (None, _) => true,
            (Some(runner), Some(token)) => same_secret(token, runner),
            (Some(_), None) => {
                return Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    format!(
                        "session `{id}` needs its token (HARNESS_SESSION_TOKEN) as `Authorization: Bearer <token>`"
                    ),
                ));
            }
        };
        // A request bearing the session's own token counts against the program's bounds, in
        // an open server too.
        let own = token.and_then(|token| {
            self.lock_sessions()
                .get(id)
                .filter(|slot| same_secret(token, &slot.token))
                .cloned()
        });
        if !runner && own.is_none() {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                format!("this token does not authorise session `{id}`"),
            ));
        }
        let in_flight = match own {
            Some(slot) => Some(self.admit(slot)?),
            None => None,
        };
        Ok((
            if runner {
                Caller::Runner
            } else {
                Caller::Program
            },
            in_flight,
        ))
    }

    /// Count a program's request, or refuse it when its program or all programs are at their
    /// bound.
    fn admit(&self, slot: Arc<Slot>) -> std::result::Result<InFlight, ApiError> {
        let mine = slot.in_flight.fetch_add(1, Ordering::SeqCst);
        let all = self.program_requests.fetch_add(1, Ordering::SeqCst);
        let guard = InFlight {
            slot: Some(slot),
            all: self.program_requests.clone(),
        };
        if mine >= self.config.max_requests_per_program {
            return Err(ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                format!(
                    "this session has {} requests in flight, its limit (max_requests_per_program); wait for their answers",
                    self.config.max_requests_per_program
                ),
            ));
        }
        if all >= self.config.max_program_requests {
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                format!(
                    "programs have {} requests in flight, the server's limit (max_program_requests); retry later",
                    self.config.max_program_requests
                ),
            ));
        }
        Ok(guard)
    }

    /// The session `id` names, touched; expired sessions are removed and refused.
    fn slot(&self, id: &str) -> std::result::Result<Arc<Slot>, ApiError> {
        let now = Instant::now();
        let mut sessions = self.lock_sessions();
        match sessions.get(id) {
            Some(slot) if slot.expired(now, &self.config) => {
                sessions.remove(id);
                Err(ApiError::new(
                    StatusCode::NOT_FOUND,
                    format!(
                        "session `{id}` expired (idle timeout {:?}, lifetime {:?}) and its state is gone",
                        self.config.idle_timeout, self.config.max_lifetime
                    ),
                ))
            }
            Some(slot) => {
                slot.touch();
                Ok(slot.clone())
            }
            None => Err(ApiError::new(
                StatusCode::NOT_FOUND,
                format!("no session `{id}`: it was never started, was closed, or expired"),
            )),
        }
    }
}

/// An error answer: `{"error": {"message", "code"}}`.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    message: String,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
        }
    }

    fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorBody {
            error: ErrorDetail {
                message: self.message,
                code: self.status.as_u16(),
            },
        };
        (self.status, axum::Json(body)).into_response()
    }
}

type ApiResult = std::result::Result<Response, ApiError>;

/// Parse a request body, naming the field that is wrong and what was expected.
fn parse<T: DeserializeOwned>(body: &Bytes, what: &str) -> std::result::Result<T, ApiError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        ApiError::bad(format!(
            "{what}: at `{path}`: {} (see the protocol: harness_external::envserver)",
            e.into_inner()
        ))
    })
}

fn json<T: Serialize>(status: StatusCode, value: &T) -> Response {
    (status, axum::Json(value)).into_response()
}

fn flatten(result: ApiResult) -> Response {
    result.unwrap_or_else(IntoResponse::into_response)
}

async fn health(State(server): State<Arc<EnvServer>>) -> Response {
    json(
        StatusCode::OK,
        &Health {
            status: "ok".into(),
            env: server.env.name().to_string(),
            protocol: PROTOCOL.into(),
            sessions: server.session_count(),
        },
    )
}

async fn list_tasks(
    State(server): State<Arc<EnvServer>>,
    headers: HeaderMap,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    flatten((|| {
        server.runner_only(&headers, "listing tasks")?;
        let raw = query.get("split").ok_or_else(|| {
            ApiError::bad("query parameter `split`: expected train, validation or test")
        })?;
        let split = Split::ALL
            .into_iter()
            .find(|s| s.as_str() == raw)
            .ok_or_else(|| {
                ApiError::bad(format!(
                    "query parameter `split`: expected train, validation or test, got `{raw}`"
                ))
            })?;
        let tasks = server.by_split[&split]
            .iter()
            .map(|id| PublicTask::from(&server.tasks[id]))
            .collect();
        Ok(json(
            StatusCode::OK,
            &TaskList {
                env: server.env.name().to_string(),
                split,
                tasks,
            },
        ))
    })())
}

async fn start(State(server): State<Arc<EnvServer>>, headers: HeaderMap, body: Bytes) -> Response {
    flatten(start_inner(&server, &headers, &body).await)
}

async fn start_inner(server: &Arc<EnvServer>, headers: &HeaderMap, body: &Bytes) -> ApiResult {
    server.runner_only(headers, "opening a session")?;
    let req: StartRequest = parse(body, "start request")?;
    let task = server.tasks.get(&req.task_id).ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            format!(
                "start request: at `task_id`: environment `{}` has no task `{}` (GET /v1/tasks?split=... lists them)",
                server.env.name(),
                req.task_id
            ),
        )
    })?;
    if req.max_steps == Some(0) {
        return Err(ApiError::bad(
            "start request: at `max_steps`: expected at least 1",
        ));
    }
    server.sweep();
    if server.session_count() >= server.config.max_sessions {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!(
                "the server holds its limit of {} sessions; finish or close some, or retry later",
                server.config.max_sessions
            ),
        ));
    }
    let seed = req.seed.unwrap_or(task.seed);
    let session = server.env.reset(task, seed).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the environment could not start task `{}`: {e}", task.id),
        )
    })?;
    let token = fresh_token();
    let mut response = StartResponse {
        session_id: fresh_token(),
        token: None,
        env: server.env.name().to_string(),
        task: PublicTask::from(task),
        initial_observation: session.initial_observation(),
        tools: session.tools(),
        max_steps: req.max_steps,
        idle_timeout_s: server.config.idle_timeout.as_secs_f64(),
        max_lifetime_s: server.config.max_lifetime.as_secs_f64(),
    };
    let now = Instant::now();
    let slot = Slot {
        task_id: task.id.clone(),
        token: token.clone(),
        in_flight: AtomicUsize::new(0),
        // The `episode` answer, which a program reads, does not repeat the token.
        started_as: response.clone(),
        started: now,
        last_used: Mutex::new(now),
        max_steps: req.max_steps,
        state: tokio::sync::Mutex::new(SlotState {
            session: Some(session),
            steps: 0,
            tool_errors: 0,
            done: false,
            outcome: None,
        }),
    };
    server
        .lock_sessions()
        .insert(response.session_id.clone(), Arc::new(slot));
    response.token = Some(token);
    Ok(json(StatusCode::CREATED, &response))
}

async fn step(
    State(server): State<Arc<EnvServer>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    flatten(step_inner(&server, &headers, &id, &body).await)
}

async fn step_inner(server: &EnvServer, headers: &HeaderMap, id: &str, body: &Bytes) -> ApiResult {
    let (_caller, _in_flight) = server.session_caller(headers, id)?;
    let call: StepRequest = parse(body, "step request")?;
    let slot = server.slot(id)?;
    let mut state = slot.state.lock().await;
    let steps = state.steps;
    if let Some(max) = slot.max_steps
        && steps >= max
    {
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            format!("session `{id}` has taken its limit of {max} steps; finish it"),
        ));
    }
    let Some(session) = state.session.as_mut() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "session `{id}` is finished (or its verification was cut off); it takes no more steps"
            ),
        ));
    };
    let observation = session.step(&call).await.map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("the environment failed on this step: {e}"),
        )
    })?;
    state.steps += 1;
    state.tool_errors += u32::from(observation.error);
    state.done |= observation.done;
    slot.touch();
    Ok(json(
        StatusCode::OK,
        &StepResponse {
            observation,
            steps: state.steps,
        },
    ))
}

async fn finish(
    State(server): State<Arc<EnvServer>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    body: Bytes,
) -> Response {
    flatten(finish_inner(&server, &headers, &id, &body).await)
}

async fn finish_inner(
    server: &EnvServer,
    headers: &HeaderMap,
    id: &str,
    body: &Bytes,
) -> ApiResult {
    let (caller, _in_flight) = server.session_caller(headers, id)?;
    // The verdict is the runner's: a program learns that its session is finished, no more.
    let shown = |outcome: &Outcome| match caller {
        Caller::Runner => Some(outcome.clone()),
        Caller::Program => None,
    };
    let req: FinishRequest = if body.iter().all(u8::is_ascii_whitespace) {
        FinishRequest::default()
    } else {
        parse(body, "finish request")?
    };
    let slot = server.slot(id)?;
    let mut state = slot.state.lock().await;
    if let Some(outcome) = &state.outcome {
        return Ok(json(
            StatusCode::OK,
            &FinishResponse {
                outcome: shown(outcome),
                steps: state.steps,
            },
        ));
    }
    // A verification cut off by the request's time limit dropped the episode with it.
    let Some(mut session) = state.session.take() else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "session `{id}` lost its episode: its verification ran past the request time limit ({:?})",
                server.config.request_timeout
            ),
        ));
    };
    if let Some(format) = req
        .action_format
        .as_deref()
        .filter(|f| *f != TOOL_CALL_FORMAT)
        && session.action_parser(format).is_none()
    {
        let env = server.env.name();
        state.session = Some(session);
        return Err(ApiError::bad(format!(
            "finish request: at `action_format`: environment `{env}` has no action format `{format}`; expected `{TOOL_CALL_FORMAT}` or one the environment defines"
        )));
    }
    let outcome = match session.verify(req.final_answer.as_deref()).await {
        Ok(outcome) => outcome,
        Err(e) => {
            state.session = Some(session);
            return Err(ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("the verifier failed: {e}"),
            ));
        }
    };
    let answer = FinishResponse {
        outcome: shown(&outcome),
        steps: state.steps,
    };
    state.outcome = Some(outcome);
    slot.touch();
    Ok(json(StatusCode::OK, &answer))
}

async fn status(
    State(server): State<Arc<EnvServer>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    flatten(status_inner(&server, &headers, &id).await)
}

async fn status_inner(server: &EnvServer, headers: &HeaderMap, id: &str) -> ApiResult {
    server.runner_only(headers, "reading a session's status and outcome")?;
    let slot = server.slot(id)?;
    let state = slot.state.lock().await;
    Ok(json(
        StatusCode::OK,
        &SessionStatus {
            session_id: id.to_string(),
            task_id: slot.task_id.clone(),
            state: match state.outcome {
                Some(_) => SessionState::Finished,
                None => SessionState::Open,
            },
            steps: state.steps,
            tool_errors: state.tool_errors,
            done: state.done,
            outcome: state.outcome.clone(),
        },
    ))
}

async fn episode(
    State(server): State<Arc<EnvServer>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    flatten((|| {
        let (_caller, _in_flight) = server.session_caller(&headers, &id)?;
        let slot = server.slot(&id)?;
        Ok(json(StatusCode::OK, &slot.started_as))
    })())
}

async fn close(
    State(server): State<Arc<EnvServer>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Response {
    if let Err(e) = server.runner_only(&headers, "closing a session") {
        return e.into_response();
    }
    match server.lock_sessions().remove(&id) {
        Some(_) => StatusCode::NO_CONTENT.into_response(),
        None => ApiError::new(StatusCode::NOT_FOUND, format!("no session `{id}`")).into_response(),
    }
}

async fn not_found() -> Response {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no such route; see the protocol in harness_external::envserver",
    )
    .into_response()
}

/// Answer 503 to a request that runs past `limit` (reading its body included), dropping its
/// work, so that no client holds a handler for long.
pub(crate) async fn time_limited(limit: Duration, request: Request, next: Next) -> Response {
    match tokio::time::timeout(limit, next.run(request)).await {
        Ok(response) => response,
        Err(_) => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the request ran past the server's limit of {limit:?} (request_timeout) and was dropped"),
        )
        .into_response(),
    }
}

/// The server's routes.
pub fn router(server: Arc<EnvServer>) -> Router {
    let limit = server.config.request_timeout;
    Router::new()
        .route("/health", get(health))
        .route("/v1/tasks", get(list_tasks))
        .route("/v1/sessions", post(start))
        .route("/v1/sessions/{id}", get(status).delete(close))
        .route("/v1/sessions/{id}/episode", get(episode))
        .route("/v1/sessions/{id}/step", post(step))
        .route("/v1/sessions/{id}/finish", post(finish))
        .fallback(not_found)
        // Tool arguments may carry a file's contents; the conformance suite sends 1 MiB.
        .layer(DefaultBodyLimit::max(16 << 20))
        .layer(axum::middleware::from_fn(move |request, next| {
            time_limited(limit, request, next)
        }))
        .with_state(server)
}

/// A server running on tokio tasks (the routes and a sweeper of expired sessions); it stops
/// when [`EnvServerHandle::shutdown`] is called or the handle is dropped.
pub struct EnvServerHandle {
    addr: SocketAddr,
    server: Arc<EnvServer>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<std::io::Result<()>>>,
    sweeper: JoinHandle<()>,
}

impl EnvServerHandle {
    /// Bind `addr` (port 0 picks a free port) and serve.
    pub async fn spawn(addr: SocketAddr, server: Arc<EnvServer>) -> Result<Self> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|e| Error::Server(format!("cannot bind {addr}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Server(format!("no local address: {e}")))?;
        let (stop, stopped) = oneshot::channel::<()>();
        let app = router(server.clone());
        let task = tokio::spawn(async move {
            axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        let sweeping = server.clone();
        let sweeper = tokio::spawn(async move {
            let mut tick = tokio::time::interval(sweeping.config.sweep_interval);
            loop {
                tick.tick().await;
                let removed = sweeping.sweep();
                if removed > 0 {
                    tracing::debug!(removed, "expired environment sessions removed");
                }
            }
        });
        Ok(EnvServerHandle {
            addr,
            server,
            stop: Some(stop),
            task: Some(task),
            sweeper,
        })
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://<addr>`.
    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The server.
    pub fn server(&self) -> &Arc<EnvServer> {
        &self.server
    }

    /// Stop accepting, let in-flight requests finish, and wait for the server task.
    pub async fn shutdown(mut self) -> Result<()> {
        self.sweeper.abort();
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

impl Drop for EnvServerHandle {
    fn drop(&mut self) {
        self.sweeper.abort();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}
