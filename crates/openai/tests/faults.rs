//! Faults on loopback: 429 with Retry-After, 5xx, connections closed mid-answer, stalls past
//! the timeout. The clients retry as configured, end with a clear error, and a retried request
//! yields exactly one answer (nothing dropped, nothing duplicated into a trajectory).

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use common::{ByteEncoder, Fault, FaultServer, MODEL, ScriptedGenerator, start_server};
use harness_core::{
    ChatMessage, ChatModel, ChatRequest, Harness, Policy, PolicyRequest, SamplingParams,
    run_episode,
};
use harness_openai::{
    ChatClient, ChatClientConfig, EncodedPolicy, EngineKind, RemotePolicy, RemotePolicyConfig,
    RetryConfig, TokenGenerator, TokenOutput, TokenRequest, UsageLedger,
};
use harness_testkit::ScriptedEnv;
use serde_json::json;

const OK_CHAT: &str = r#"{"id":"c1","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;

fn ok(body: &str) -> Fault {
    Fault::Reply(200, Vec::new(), body.to_string())
}

fn status(code: u16) -> Fault {
    Fault::Reply(
        code,
        Vec::new(),
        format!(r#"{{"error": {{"message": "injected {code}", "type": "server_error"}}}}"#),
    )
}

fn fast_retry(max_attempts: u32) -> RetryConfig {
    RetryConfig {
        max_attempts,
        initial_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(40),
        seed: 1,
        ..RetryConfig::default()
    }
}

fn client(server: &FaultServer, retry: RetryConfig, timeout: Duration) -> ChatClient {
    let mut config = ChatClientConfig::new(format!("{}/v1", server.base_url()), "m");
    config.endpoint = config
        .endpoint
        .with_api_key("sk-test")
        .with_retry(retry)
        .with_timeout(timeout);
    ChatClient::with_ledger(config, UsageLedger::new()).unwrap()
}

fn ask() -> ChatRequest {
    ChatRequest::new("editor", vec![ChatMessage::user("hi")])
}

#[tokio::test]
async fn a_429_is_retried_after_the_retry_after_delay() {
    let server = FaultServer::start(vec![
        Fault::Reply(429, vec![("retry-after".into(), "1".into())], "{}".into()),
        ok(OK_CHAT),
    ])
    .await;
    let client = client(&server, fast_retry(3), Duration::from_secs(10));
    let started = Instant::now();
    let answer = client.complete(ask()).await.unwrap();
    assert_eq!(answer.text, "ok");
    // The backoff alone would wait at most 10 ms: the server's one second was honoured.
    assert!(
        started.elapsed() >= Duration::from_millis(950),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(server.count(), 2);
    let usage = client.ledger().role("editor");
    assert_eq!(
        (usage.requests, usage.attempts, usage.failed_requests),
        (1, 2, 0)
    );
    assert_eq!(usage.total_tokens(), 4);
    // Both attempts carried the same body and the key.
    let bodies = server.requests.lock().unwrap().clone();
    assert_eq!(bodies[0], bodies[1]);
    for head in server.heads.lock().unwrap().iter() {
        assert!(head.contains("authorization: bearer sk-test"), "{head}");
    }
}

#[tokio::test]
async fn a_500_then_200_succeeds_once() {
    let server = FaultServer::start(vec![status(500), ok(OK_CHAT)]).await;
    let client = client(&server, fast_retry(3), Duration::from_secs(10));
    assert_eq!(client.complete(ask()).await.unwrap().text, "ok");
    assert_eq!(server.count(), 2);
    assert_eq!(client.ledger().role("editor").requests, 1);
}

#[tokio::test]
async fn connections_closed_before_or_during_the_answer_are_retried() {
    let server = FaultServer::start(vec![
        Fault::CloseMidBody,
        Fault::CloseBeforeAnswer,
        ok(OK_CHAT),
    ])
    .await;
    let client = client(&server, fast_retry(4), Duration::from_secs(10));
    assert_eq!(client.complete(ask()).await.unwrap().text, "ok");
    assert_eq!(server.count(), 3);
    assert_eq!(client.ledger().role("editor").attempts, 3);
}

#[tokio::test]
async fn a_stall_past_the_timeout_is_retried_then_reported_clearly() {
    let server = FaultServer::start(vec![Fault::Stall(Duration::from_secs(5))]).await;
    let client = client(&server, fast_retry(3), Duration::from_millis(200));
    let started = Instant::now();
    let err = client.complete(ask()).await.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let text = err.to_string();
    assert!(matches!(err, harness_core::Error::Chat { .. }), "{err:?}");
    assert!(
        text.contains(&format!("{}/v1/chat/completions", server.base_url())),
        "{text}"
    );
    assert!(text.contains("3 attempts"), "{text}");
    assert!(text.contains("timed out"), "{text}");
    assert_eq!(server.count(), 3);
    let usage = client.ledger().role("editor");
    assert_eq!(
        (usage.requests, usage.failed_requests, usage.attempts),
        (0, 1, 3)
    );
}

#[tokio::test]
async fn persistent_5xx_ends_in_an_error_naming_endpoint_status_and_attempts() {
    let server = FaultServer::start(vec![status(503)]).await;
    let client = client(&server, fast_retry(4), Duration::from_secs(10));
    let text = client.complete(ask()).await.unwrap_err().to_string();
    assert!(text.contains("/v1/chat/completions"), "{text}");
    assert!(text.contains("HTTP 503"), "{text}");
    assert!(text.contains("4 attempts"), "{text}");
    assert!(text.contains("injected 503"), "{text}");
    assert_eq!(server.count(), 4);
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let server = FaultServer::start(vec![status(400), ok(OK_CHAT)]).await;
    let client = client(&server, fast_retry(4), Duration::from_secs(10));
    let text = client.complete(ask()).await.unwrap_err().to_string();
    assert!(
        text.contains("HTTP 400") && text.contains("injected 400"),
        "{text}"
    );
    assert!(
        text.contains("1 attempt:") || text.contains("1 attempt "),
        "{text}"
    );
    assert_eq!(server.count(), 1);
}

#[tokio::test]
async fn remote_policy_retries_and_returns_exactly_the_answered_turn() {
    let completion = json!({
        "id": "cmpl-1", "object": "text_completion", "created": 0, "model": MODEL,
        "choices": [{
            "index": 0, "text": "hi", "finish_reason": "stop",
            "token_ids": [104, 105, 256],
            "logprobs": {"tokens": ["token_id:104", "token_id:105", "token_id:256"],
                         "token_logprobs": [-0.5, -0.25, -0.125]}
        }],
        "usage": {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13}
    });
    let server = FaultServer::start(vec![
        status(502),
        Fault::CloseMidBody,
        ok(&completion.to_string()),
    ])
    .await;
    let mut config = RemotePolicyConfig::new(server.base_url(), MODEL, EngineKind::Vllm);
    config.endpoint = config.endpoint.with_retry(fast_retry(3));
    let policy = RemotePolicy::new(config, Arc::new(ByteEncoder)).unwrap();
    let request = PolicyRequest {
        messages: vec![ChatMessage::user("hello")],
        tools: Vec::new(),
        max_new_tokens: 16,
        max_context_tokens: 1000,
        sampling: SamplingParams::default(),
        seed: u64::MAX,
    };
    let turn = policy.generate(request.clone()).await.unwrap();
    assert_eq!(turn.tokens, vec![104, 105, 256]);
    assert_eq!(turn.logprobs, vec![-0.5, -0.25, -0.125]);
    assert_eq!(turn.text, "hi");
    assert_eq!(server.count(), 3);
    // The request the engine saw: token-id prompt, log-probs, token ids, a seed in i64 range.
    let sent: serde_json::Value =
        serde_json::from_str(&server.requests.lock().unwrap()[2]).unwrap();
    assert!(sent["prompt"].is_array());
    assert_eq!(sent["return_token_ids"], true);
    assert_eq!(sent["return_tokens_as_token_ids"], true);
    assert_eq!(sent["logprobs"], 1);
    assert_eq!(sent["seed"], i64::MAX);

    // When the engine keeps failing the policy fails: no empty turn is made up.
    let down = FaultServer::start(vec![status(500)]).await;
    let mut config = RemotePolicyConfig::new(down.base_url(), MODEL, EngineKind::Vllm);
    config.endpoint = config.endpoint.with_retry(fast_retry(2));
    let policy = RemotePolicy::new(config, Arc::new(ByteEncoder)).unwrap();
    let err = policy.generate(request).await.unwrap_err();
    assert!(matches!(err, harness_core::Error::Policy { .. }), "{err:?}");
    assert!(err.to_string().contains("2 attempts"), "{err}");
}

/// Fails every other call (the server answers those with HTTP 500).
struct Flaky {
    inner: ScriptedGenerator,
    calls: AtomicUsize,
}

#[async_trait]
impl TokenGenerator for Flaky {
    fn vocab_size(&self) -> usize {
        self.inner.vocab_size()
    }

    async fn generate(&self, request: TokenRequest) -> harness_core::Result<TokenOutput> {
        if self.calls.fetch_add(1, Ordering::SeqCst).is_multiple_of(2) {
            return Err(harness_core::Error::Policy {
                policy: "flaky".into(),
                message: "injected failure".into(),
            });
        }
        self.inner.generate(request).await
    }
}

#[tokio::test]
async fn an_episode_over_a_flaky_server_equals_the_in_process_episode() {
    let flaky = Arc::new(Flaky {
        inner: ScriptedGenerator::new(Duration::ZERO),
        calls: AtomicUsize::new(0),
    });
    let (server, _state) = start_server(flaky.clone(), 8192).await;
    let mut config = RemotePolicyConfig::new(server.base_url(), MODEL, EngineKind::Vllm);
    config.fold_seed_to_i63 = false;
    config.endpoint = config.endpoint.with_retry(fast_retry(3));
    let remote = RemotePolicy::new(config, Arc::new(ByteEncoder)).unwrap();
    let local = EncodedPolicy::new(
        "local",
        Arc::new(ByteEncoder),
        Arc::new(ScriptedGenerator::new(Duration::ZERO)),
    );
    let harness = Harness::from_json(
        r#"{"name": "H0", "prompt": {"system": "Use the tools. {guidance}", "slots": {"guidance": "Be brief."}}}"#,
    )
    .unwrap();
    let env = ScriptedEnv::new(2);
    let task = env.task("t1", "x");
    let want = run_episode(&local, &harness, &env, &task, 17)
        .await
        .unwrap();
    let got = run_episode(&remote, &harness, &env, &task, 17)
        .await
        .unwrap();
    assert!(want.turns.len() >= 2, "{want:?}");
    assert_eq!(
        got.turns, want.turns,
        "same turns, none dropped or repeated"
    );
    assert_eq!(got.messages, want.messages);
    assert_eq!(got.termination, want.termination);
    // Every turn cost one failed and one successful generator call.
    assert_eq!(flaky.calls.load(Ordering::SeqCst), 2 * got.turns.len());
    server.shutdown().await.unwrap();
}
