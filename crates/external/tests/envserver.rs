//! The environment server: DBBench served over HTTP passes the environment conformance suite
//! through [`RemoteEnv`] (in both of its action formats), an episode over HTTP equals the same
//! episode in process, and the protocol's promises hold: no ground truth leaves the server,
//! bad requests are named, sessions are isolated, finish is final, limits and timeouts apply.

use std::sync::Arc;
use std::time::Duration;

use harness_core::{Environment, Policy, Split, Task, run_episode};
use harness_envs::dbbench::{
    self, DbBench, DbBenchTextParser, DbBenchToolParser, GeneratorConfig, base_harness,
    text_harness,
};
use harness_external::envserver::client::RemoteEnv;
use harness_external::envserver::server::{EnvServer, EnvServerConfig, EnvServerHandle};
use harness_external::envserver::{
    FinishResponse, SessionStatus, StartResponse, StepResponse, TaskList,
};
use harness_testkit::conformance::{ConformanceConfig, check_environment};
use serde_json::{Value, json};

fn local_env() -> DbBench {
    DbBench::generated(&GeneratorConfig {
        seed: 11,
        train: 5,
        validation: 5,
        test: 5,
    })
}

async fn serve(config: EnvServerConfig) -> (EnvServerHandle, DbBench) {
    let env = local_env();
    let server = EnvServer::new(Arc::new(env.clone()), config).unwrap();
    let handle = EnvServerHandle::spawn("127.0.0.1:0".parse().unwrap(), server)
        .await
        .unwrap();
    (handle, env)
}

async fn remote(handle: &EnvServerHandle) -> RemoteEnv {
    RemoteEnv::connect(handle.base_url())
        .await
        .unwrap()
        .with_parser(Arc::new(DbBenchToolParser))
        .with_parser(Arc::new(DbBenchTextParser))
}

/// The local task with its metadata: oracles read the ground truth there, which the server
/// never sends.
fn local_task(env: &DbBench, id: &str) -> Task {
    env.all_tasks()
        .iter()
        .find(|t| t.id == id)
        .cloned()
        .expect("the server lists the local tasks")
}

#[tokio::test]
async fn dbbench_over_http_passes_the_conformance_suite() {
    let (handle, local) = serve(EnvServerConfig::default()).await;
    let env = remote(&handle).await;
    let mut tasks = Vec::new();
    for split in Split::ALL {
        tasks.extend(env.tasks(split).unwrap());
    }
    assert_eq!(tasks.len(), 15);
    let oracle = |task: &Task| -> Box<dyn Policy> {
        Box::new(dbbench::OraclePolicy::new(&local_task(&local, &task.id)).unwrap())
    };
    let config = ConformanceConfig {
        harness: base_harness(),
        concurrency: 8,
        ..ConformanceConfig::default()
    };
    let report = check_environment(&env, &tasks, &oracle, &config).await;
    assert!(report.failures.is_empty(), "{:#?}", report.failures);
    assert!(report.episodes > 40, "{} episodes", report.episodes);
    assert!(report.probes > 5, "{} probes", report.probes);
}

#[tokio::test]
async fn the_text_format_reaches_the_servers_verifier() {
    // In the classic text format DBBench reads the closing text as the answer: the server's
    // verifier does so only when the client forwards the format the episode was parsed in.
    let (handle, local) = serve(EnvServerConfig::default()).await;
    let env = remote(&handle).await;
    let tasks = env.tasks(Split::Validation).unwrap();
    let oracle = |task: &Task| -> Box<dyn Policy> {
        Box::new(dbbench::OraclePolicy::text_format(&local_task(&local, &task.id)).unwrap())
    };
    let config = ConformanceConfig {
        harness: text_harness(),
        concurrency: 4,
        ..ConformanceConfig::default()
    };
    let report = check_environment(&env, &tasks, &oracle, &config).await;
    assert!(report.failures.is_empty(), "{:#?}", report.failures);

    // Without the text parser the harness's format is unknown on this client: an error that
    // names the field, as in process.
    let bare = RemoteEnv::connect(handle.base_url()).await.unwrap();
    let policy = dbbench::OraclePolicy::text_format(&local_task(&local, &tasks[0].id)).unwrap();
    let err = run_episode(&policy, &text_harness(), &bare, &tasks[0], 1)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("tool_view.format"), "{err}");
}

#[tokio::test]
async fn an_episode_over_http_equals_the_episode_in_process() {
    let (handle, local) = serve(EnvServerConfig::default()).await;
    let env = remote(&handle).await;
    for task in env.tasks(Split::Train).unwrap() {
        let full = local_task(&local, &task.id);
        let policy = dbbench::OraclePolicy::new(&full).unwrap();
        let there = run_episode(&policy, &base_harness(), &env, &task, 3)
            .await
            .unwrap();
        let policy = dbbench::OraclePolicy::new(&full).unwrap();
        let here = run_episode(&policy, &base_harness(), &local, &full, 3)
            .await
            .unwrap();
        assert_eq!(there.messages, here.messages, "{}", task.id);
        assert_eq!(there.outcome, here.outcome, "{}", task.id);
        assert_eq!(there.counts, here.counts, "{}", task.id);
        assert!(there.is_success(), "{}", there.transcript());
    }
}

async fn raw(
    http: &reqwest::Client,
    method: reqwest::Method,
    url: String,
    body: Option<Value>,
) -> (u16, Value) {
    let mut request = http.request(method, url);
    if let Some(body) = body {
        request = request.json(&body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let text = response.text().await.unwrap();
    (status, serde_json::from_str(&text).unwrap_or(Value::Null))
}

fn message(body: &Value) -> String {
    body["error"]["message"].as_str().unwrap_or("").to_string()
}

#[tokio::test]
async fn the_protocol_keeps_its_promises() {
    use reqwest::Method;
    let (handle, local) = serve(EnvServerConfig::default()).await;
    let base = handle.base_url();
    let http = harness_openai::http_client();

    // Task lists carry no metadata, so no ground truth.
    let (status, body) = raw(
        &http,
        Method::GET,
        format!("{base}/v1/tasks?split=train"),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let list: TaskList = serde_json::from_value(body.clone()).unwrap();
    assert_eq!(list.tasks.len(), 5);
    assert!(!body.to_string().contains("metadata"), "{body}");
    let task = local_task(&local, &list.tasks[0].id);
    let gold = dbbench::db_task(&task).unwrap().gold_sql.unwrap();
    assert!(!body.to_string().contains("gold_sql") && !body.to_string().contains(&gold));
    let (status, body) = raw(
        &http,
        Method::GET,
        format!("{base}/v1/tasks?split=dev"),
        None,
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        message(&body).contains("`split`") && message(&body).contains("dev"),
        "{body}"
    );

    // Bad bodies are named by field.
    let sessions = format!("{base}/v1/sessions");
    let (status, body) = raw(
        &http,
        Method::POST,
        sessions.clone(),
        Some(json!({"task_id": 5})),
    )
    .await;
    assert_eq!(status, 400);
    assert!(message(&body).contains("`task_id`"), "{body}");
    let (status, body) = raw(
        &http,
        Method::POST,
        sessions.clone(),
        Some(json!({"task_id": task.id, "sede": 1})),
    )
    .await;
    assert_eq!(status, 400);
    assert!(message(&body).contains("sede"), "{body}");
    let (status, body) = raw(
        &http,
        Method::POST,
        sessions.clone(),
        Some(json!({"task_id": "dbbench/nope"})),
    )
    .await;
    assert_eq!(status, 404);
    assert!(message(&body).contains("dbbench/nope"), "{body}");

    // Two sessions of one task: a change in one is invisible to the other.
    let start = |max_steps: Option<u32>| {
        let http = http.clone();
        let sessions = sessions.clone();
        let id = task.id.clone();
        async move {
            let (status, body) = raw(
                &http,
                Method::POST,
                sessions,
                Some(json!({"task_id": id, "seed": 1, "max_steps": max_steps})),
            )
            .await;
            assert_eq!(status, 201, "{body}");
            serde_json::from_value::<StartResponse>(body).unwrap()
        }
    };
    let a = start(None).await;
    let b = start(Some(2)).await;
    assert_ne!(a.session_id, b.session_id);
    assert_eq!(a.session_id.len(), 32);
    let table = dbbench::db_task(&task).unwrap().tables[0].name.clone();
    let sql = |id: &str, query: String| {
        let http = http.clone();
        let url = format!("{base}/v1/sessions/{id}/step");
        async move {
            let (status, body) = raw(
                &http,
                Method::POST,
                url,
                Some(json!({"name": "execute_sql", "arguments": {"query": query}})),
            )
            .await;
            (status, body)
        }
    };
    let count = format!("SELECT COUNT(*) FROM `{table}`");
    let (_, before) = sql(&b.session_id, count.clone()).await;
    let (status, _) = sql(&a.session_id, format!("DELETE FROM `{table}`")).await;
    assert_eq!(status, 200);
    let (_, in_a) = sql(&a.session_id, count.clone()).await;
    let (_, in_b) = sql(&b.session_id, count.clone()).await;
    let text = |v: &Value| {
        serde_json::from_value::<StepResponse>(v.clone())
            .unwrap()
            .observation
            .text
    };
    assert_eq!(text(&in_a), "[(0,)]", "{in_a}");
    assert_eq!(
        text(&in_b),
        text(&before),
        "session b saw session a's change"
    );
    assert_ne!(text(&in_b), "[(0,)]");

    // The step limit: b has taken its two steps.
    let (status, body) = sql(&b.session_id, count.clone()).await;
    assert_eq!(status, 429, "{body}");
    assert!(message(&body).contains("limit of 2 steps"), "{body}");

    // Unknown ids reach nothing.
    let (status, _) = sql(&"0".repeat(32), count.clone()).await;
    assert_eq!(status, 404);

    // Finish is the server's, final and repeatable; steps after it are refused.
    let finish = format!("{base}/v1/sessions/{}/finish", a.session_id);
    let (status, body) = raw(&http, Method::POST, finish.clone(), Some(json!({}))).await;
    assert_eq!(status, 200, "{body}");
    let first: FinishResponse = serde_json::from_value(body).unwrap();
    assert_eq!(first.steps, 2);
    let (_, body) = raw(&http, Method::POST, finish.clone(), None).await;
    let again: FinishResponse = serde_json::from_value(body).unwrap();
    assert_eq!(first, again);
    let (status, body) = sql(&a.session_id, count.clone()).await;
    assert_eq!(status, 409, "{body}");
    let (status, body) = raw(
        &http,
        Method::GET,
        format!("{base}/v1/sessions/{}", a.session_id),
        None,
    )
    .await;
    assert_eq!(status, 200);
    let state: SessionStatus = serde_json::from_value(body).unwrap();
    // An open server answers the outcome to anyone, as to the runner.
    assert!(first.outcome.is_some());
    assert_eq!(state.outcome, first.outcome);
    let (status, body) = raw(
        &http,
        Method::POST,
        format!("{base}/v1/sessions/{}/finish", b.session_id),
        Some(json!({"action_format": "smoke_signals"})),
    )
    .await;
    assert_eq!(status, 400);
    assert!(
        message(&body).contains("`action_format`") && message(&body).contains("smoke_signals"),
        "{body}"
    );

    // Close frees the session.
    let (status, _) = raw(
        &http,
        Method::DELETE,
        format!("{base}/v1/sessions/{}", b.session_id),
        None,
    )
    .await;
    assert_eq!(status, 204);
    assert_eq!(handle.server().session_count(), 1);
}

#[tokio::test]
async fn idle_and_old_sessions_expire() {
    let (handle, _) = serve(EnvServerConfig {
        idle_timeout: Duration::from_millis(300),
        max_lifetime: Duration::from_secs(3600),
        sweep_interval: Duration::from_millis(50),
        ..EnvServerConfig::default()
    })
    .await;
    let env = remote(&handle).await;
    let task = env.tasks(Split::Test).unwrap()[0].clone();
    let mut session = env.start(&task.id, 1, None).await.unwrap();
    assert_eq!(handle.server().session_count(), 1);
    tokio::time::sleep(Duration::from_millis(700)).await;
    // The sweeper removed it without any request.
    assert_eq!(handle.server().session_count(), 0);
    let call = harness_core::ToolCall::new("execute_sql", json!({"query": "SELECT 1"}));
    let err = harness_core::EnvSession::step(&mut session, &call)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("404") && err.contains(session.id()), "{err}");

    // A session in use still ends at its lifetime.
    let (handle, _) = serve(EnvServerConfig {
        idle_timeout: Duration::from_secs(3600),
        max_lifetime: Duration::from_millis(400),
        sweep_interval: Duration::from_secs(3600),
        ..EnvServerConfig::default()
    })
    .await;
    let env = remote(&handle).await;
    let mut session = env.start(&task.id, 1, None).await.unwrap();
    let mut refused = None;
    for _ in 0..40 {
        if let Err(e) = harness_core::EnvSession::step(&mut session, &call).await {
            refused = Some(e.to_string());
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let refused = refused.expect("the session outlived its lifetime");
    assert!(refused.contains("expired"), "{refused}");
}

#[test]
fn bad_configurations_name_the_field() {
    let env: Arc<dyn Environment> = Arc::new(local_env());
    for (config, field) in [
        (
            EnvServerConfig {
                idle_timeout: Duration::ZERO,
                ..EnvServerConfig::default()
            },
            "idle_timeout",
        ),
        (
            EnvServerConfig {
                max_sessions: 0,
                ..EnvServerConfig::default()
            },
            "max_sessions",
        ),
        (
            EnvServerConfig {
                max_requests_per_program: 0,
                ..EnvServerConfig::default()
            },
            "max_requests_per_program",
        ),
        (
            EnvServerConfig {
                max_program_requests: 0,
                ..EnvServerConfig::default()
            },
            "max_program_requests",
        ),
        (
            EnvServerConfig {
                request_timeout: Duration::ZERO,
                ..EnvServerConfig::default()
            },
            "request_timeout",
        ),
        (
            EnvServerConfig {
                runner_token: Some("short".into()),
                ..EnvServerConfig::default()
            },
            "runner_token",
        ),
    ] {
        let err = EnvServer::new(env.clone(), config)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains(field), "{err}");
    }
}
