//! The server under hostile input (issue 25 item 3): the API key on every route, weight reloads
//! confined to an allowed root, request limits (stop strings, a default `max_tokens`, a bounded
//! queue).

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{ByteEncoder, MODEL, ScriptedGenerator, loopback};
use harness_openai::{ApiKey, ServerConfig, ServerHandle, ServerState, TokenGenerator};
use serde_json::{Value, json};

async fn serve(config: ServerConfig, generator: Arc<dyn TokenGenerator>) -> ServerHandle {
    let state = Arc::new(ServerState::new(config, Arc::new(ByteEncoder), generator));
    ServerHandle::spawn(loopback(), state).await.unwrap()
}

fn scripted() -> Arc<dyn TokenGenerator> {
    Arc::new(ScriptedGenerator::new(Duration::ZERO))
}

async fn send(
    method: reqwest::Method,
    url: &str,
    key: Option<&str>,
    body: Option<&Value>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut request = harness_openai::http_client().request(method, url);
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body {
        request = request.json(body);
    }
    let response = request.send().await.unwrap();
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let value = response.json::<Value>().await.unwrap_or(Value::Null);
    (status, headers, value)
}

#[tokio::test]
async fn with_an_api_key_every_route_refuses_a_missing_or_wrong_key_with_401() {
    let mut config = ServerConfig::new(MODEL, 4096);
    config.api_key = ApiKey::new("sk-test-secret");
    let server = serve(config, scripted()).await;
    let base = server.base_url();
    let completion = json!({"model": MODEL, "prompt": [97, 98], "max_tokens": 4});
    let routes = [
        (reqwest::Method::GET, "/health", None),
        (reqwest::Method::GET, "/v1/models", None),
        (reqwest::Method::POST, "/v1/completions", Some(&completion)),
        (
            reqwest::Method::POST,
            "/v1/chat/completions",
            Some(&completion),
        ),
        (reqwest::Method::POST, "/generate", Some(&completion)),
        (
            reqwest::Method::POST,
            "/update_weights_from_disk",
            Some(&completion),
        ),
        (reqwest::Method::POST, "/collective_rpc", Some(&completion)),
        (reqwest::Method::POST, "/reset_prefix_cache", None),
        (reqwest::Method::GET, "/no/such/route", None),
    ];
    for (method, route, body) in routes {
        let url = format!("{base}{route}");
        for key in [
            None,
            Some("sk-test-secreT"),
            Some("sk-test-secret-longer"),
            Some(""),
        ] {
            let (status, _, value) = send(method.clone(), &url, key, body).await;
            assert_eq!(status, 401, "{method} {route} with {key:?}");
            assert_eq!(value["error"]["type"], "invalid_request_error", "{value}");
            assert!(
                value["error"]["message"]
                    .as_str()
                    .unwrap()
                    .contains("API key"),
                "{value}"
            );
        }
    }
    // The right key passes.
    let (status, _, value) = send(
        reqwest::Method::GET,
        &format!("{base}/health"),
        Some("sk-test-secret"),
        None,
    )
    .await;
    assert_eq!((status, value["status"].as_str()), (200, Some("ok")));
    let (status, _, value) = send(
        reqwest::Method::POST,
        &format!("{base}/v1/completions"),
        Some("sk-test-secret"),
        Some(&completion),
    )
    .await;
    assert_eq!(status, 200, "{value}");
    // Its Debug does not show the key.
    let shown = format!("{:?}", ApiKey::new("sk-test-secret").unwrap());
    assert!(!shown.contains("secret"), "{shown}");
    assert!(ApiKey::new("").is_none());
    server.shutdown().await.unwrap();
}

/// A loader that takes its time and counts what it loaded.
struct SlowLoader {
    delay: Duration,
    loaded: std::sync::Mutex<Vec<std::path::PathBuf>>,
}

#[async_trait::async_trait]
impl harness_openai::WeightLoader for SlowLoader {
    async fn load(&self, dir: &std::path::Path) -> harness_core::Result<()> {
        tokio::time::sleep(self.delay).await;
        self.loaded.lock().unwrap().push(dir.to_path_buf());
        Ok(())
    }
}

async fn serve_with_loader(
    root: Option<&std::path::Path>,
    delay: Duration,
) -> (ServerHandle, Arc<SlowLoader>) {
    let mut config = ServerConfig::new(MODEL, 4096);
    config.reload_root = root.map(std::path::Path::to_path_buf);
    config.model_dir = root.map(std::path::Path::to_path_buf);
    let loader = Arc::new(SlowLoader {
        delay,
        loaded: Default::default(),
    });
    let state = Arc::new(
        ServerState::new(config, Arc::new(ByteEncoder), scripted()).with_loader(loader.clone()),
    );
    (
        ServerHandle::spawn(loopback(), state).await.unwrap(),
        loader,
    )
}

async fn reload(base: &str, path: &std::path::Path) -> (u16, Value) {
    let body = json!({"model_path": path.to_str().unwrap()});
    let (status, _, value) = send(
        reqwest::Method::POST,
        &format!("{base}/update_weights_from_disk"),
        None,
        Some(&body),
    )
    .await;
    (status, value)
}

#[tokio::test]
async fn weight_reloads_only_load_folders_under_the_reload_root() {
    let work = tempfile::tempdir().unwrap();
    let root = work.path().join("checkpoints");
    let inside = root.join("step-1");
    let outside = work.path().join("elsewhere");
    std::fs::create_dir_all(&inside).unwrap();
    std::fs::create_dir_all(&outside).unwrap();
    let (server, loader) = serve_with_loader(Some(&root), Duration::ZERO).await;
    let base = server.base_url();

    let (status, value) = reload(&base, &inside).await;
    assert_eq!(status, 200, "{value}");
    // Outside, through `..`, and through a symlink that leaves the root: all 403, none loaded.
    #[cfg(unix)]
    std::os::unix::fs::symlink(&outside, root.join("link")).unwrap();
    let mut attacks = vec![
        outside.clone(),
        root.join("step-1/../../elsewhere"),
        std::path::PathBuf::from("/"),
    ];
    if cfg!(unix) {
        attacks.push(root.join("link"));
    }
    for attack in attacks {
        let (status, value) = reload(&base, &attack).await;
        assert_eq!(status, 403, "{}: {value}", attack.display());
        assert_eq!(value["success"], false);
        assert!(
            value["message"]
                .as_str()
                .unwrap()
                .contains("outside the reload root"),
            "{value}"
        );
    }
    // A missing folder is a 400 naming it.
    let (status, value) = reload(&base, &root.join("step-9")).await;
    assert_eq!(status, 400, "{value}");
    assert!(value["message"].as_str().unwrap().contains("step-9"));
    assert_eq!(
        *loader.loaded.lock().unwrap(),
        vec![inside.canonicalize().unwrap()]
    );
    server.shutdown().await.unwrap();

    // Without a root, no request-named path is loaded at all.
    let (server, loader) = serve_with_loader(None, Duration::ZERO).await;
    let (status, value) = reload(&server.base_url(), &inside).await;
    assert_eq!(status, 403, "{value}");
    assert!(value["message"].as_str().unwrap().contains("reload root"));
    assert!(loader.loaded.lock().unwrap().is_empty());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_second_reload_while_one_runs_is_answered_409() {
    let root = tempfile::tempdir().unwrap();
    let (server, loader) = serve_with_loader(Some(root.path()), Duration::from_millis(800)).await;
    let base = server.base_url();
    let first = tokio::spawn({
        let base = base.clone();
        let dir = root.path().to_path_buf();
        async move { reload(&base, &dir).await }
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, value) = reload(&base, root.path()).await;
    assert_eq!(status, 409, "{value}");
    assert!(
        value["message"]
            .as_str()
            .unwrap()
            .contains("already in progress")
    );
    // vLLM's route shares the guard.
    let (status, _, value) = send(
        reqwest::Method::POST,
        &format!("{base}/collective_rpc"),
        None,
        Some(&json!({"method": "reload_weights"})),
    )
    .await;
    assert_eq!(status, 409, "{value}");
    let (status, value) = first.await.unwrap();
    assert_eq!(status, 200, "{value}");
    // Once it finished, the next reload goes through.
    let (status, value) = reload(&base, root.path()).await;
    assert_eq!(status, 200, "{value}");
    assert_eq!(loader.loaded.lock().unwrap().len(), 2);
    server.shutdown().await.unwrap();
}

/// Records the budget of every request and answers one letter after `delay`.
struct Recording {
    delay: Duration,
    budgets: std::sync::Mutex<Vec<usize>>,
}

#[async_trait::async_trait]
impl TokenGenerator for Recording {
    fn vocab_size(&self) -> usize {
        common::VOCAB
    }

    async fn generate(
        &self,
        request: harness_openai::TokenRequest,
    ) -> harness_core::Result<harness_openai::TokenOutput> {
        self.budgets.lock().unwrap().push(request.max_new_tokens);
        tokio::time::sleep(self.delay).await;
        Ok(harness_openai::TokenOutput {
            tokens: vec![u32::from(b'a')],
            logprobs: vec![-0.5],
            finish: harness_core::FinishReason::Stop,
        })
    }
}

fn recording(delay: Duration) -> Arc<Recording> {
    Arc::new(Recording {
        delay,
        budgets: Default::default(),
    })
}

#[tokio::test]
async fn stop_strings_are_capped_in_count_and_length() {
    let generator = recording(Duration::ZERO);
    let server = serve(ServerConfig::new(MODEL, 4096), generator.clone()).await;
    let base = server.base_url();
    let huge = "x".repeat(16 << 20);
    let five: Vec<String> = (0..5).map(|i| format!("s{i}")).collect();
    let cases = [
        (json!([huge.clone()]), "bytes"),
        (json!(huge), "bytes"),
        (json!(five), "at most 4 stop strings"),
        (json!(["y".repeat(257)]), "bytes"),
    ];
    for (stop, expected) in cases {
        let bodies = [
            (
                "/v1/chat/completions",
                json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stop": stop}),
            ),
            (
                "/v1/completions",
                json!({"model": MODEL, "prompt": "hi", "stop": stop}),
            ),
            (
                "/generate",
                json!({"input_ids": [97], "sampling_params": {"max_new_tokens": 4, "stop": stop}}),
            ),
        ];
        for (route, body) in bodies {
            if route == "/generate" && stop.is_string() {
                continue; // SGLang's `stop` is a list.
            }
            let (status, _, value) = send(
                reqwest::Method::POST,
                &format!("{base}{route}"),
                None,
                Some(&body),
            )
            .await;
            assert_eq!(
                status,
                400,
                "{route}: {}",
                &value.to_string()[..200.min(value.to_string().len())]
            );
            assert_eq!(value["error"]["param"], "stop");
            let message = value["error"]["message"].as_str().unwrap();
            assert!(message.contains(expected), "{route}: {message}");
            assert!(message.len() < 200, "the message echoes the stop string");
        }
    }
    assert!(
        generator.budgets.lock().unwrap().is_empty(),
        "a refused request reached the generator"
    );
    // Four stop strings of 256 bytes are served.
    let stop: Vec<String> = (0..4).map(|i| format!("{i}").repeat(256)).collect();
    let body = json!({"model": MODEL, "prompt": "hi", "max_tokens": 3, "stop": stop});
    let (status, _, value) = send(
        reqwest::Method::POST,
        &format!("{base}/v1/completions"),
        None,
        Some(&body),
    )
    .await;
    assert_eq!(status, 200, "{value}");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_chat_without_max_tokens_gets_the_default_budget_not_the_whole_context() {
    let generator = recording(Duration::ZERO);
    let mut config = ServerConfig::new(MODEL, 1 << 20);
    config.default_chat_tokens = 100;
    let server = serve(config, generator.clone()).await;
    let url = format!("{}/v1/chat/completions", server.base_url());
    let messages = json!([{"role": "user", "content": "hi"}]);
    for body in [
        json!({"model": MODEL, "messages": messages}),
        json!({"model": MODEL, "messages": messages, "stream": true}),
        json!({"model": MODEL, "messages": messages, "max_tokens": 7}),
        json!({"model": MODEL, "messages": messages, "max_completion_tokens": 5000}),
    ] {
        let response = harness_openai::http_client()
            .post(&url)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), 200);
        response.bytes().await.unwrap();
    }
    assert_eq!(*generator.budgets.lock().unwrap(), vec![100, 100, 7, 5000]);
    assert_eq!(ServerConfig::new(MODEL, 1 << 20).default_chat_tokens, 2048);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_full_request_queue_answers_503_with_retry_after() {
    let generator = recording(Duration::from_millis(1500));
    let mut config = ServerConfig::new(MODEL, 4096);
    config.max_queued_requests = 2;
    let server = serve(config, generator.clone()).await;
    let base = server.base_url();
    let completion = json!({"model": MODEL, "prompt": "hi", "max_tokens": 2});
    // One plain request and one stream fill the queue.
    let plain = tokio::spawn({
        let url = format!("{base}/v1/completions");
        let body = completion.clone();
        async move { send(reqwest::Method::POST, &url, None, Some(&body)).await.0 }
    });
    let stream = tokio::spawn({
        let url = format!("{base}/v1/chat/completions");
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stream": true});
        async move {
            let response = harness_openai::http_client()
                .post(&url)
                .json(&body)
                .send()
                .await
                .unwrap();
            let status = response.status().as_u16();
            response.bytes().await.unwrap();
            status
        }
    });
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(generator.budgets.lock().unwrap().len(), 2);
    for route in ["/v1/completions", "/v1/chat/completions", "/generate"] {
        let body = match route {
            "/generate" => json!({"input_ids": [97], "sampling_params": {"max_new_tokens": 2}}),
            "/v1/chat/completions" => {
                json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
            }
            _ => completion.clone(),
        };
        let (status, headers, value) = send(
            reqwest::Method::POST,
            &format!("{base}{route}"),
            None,
            Some(&body),
        )
        .await;
        assert_eq!(status, 503, "{route}: {value}");
        assert_eq!(headers.get("retry-after").unwrap(), "1");
        assert_eq!(value["error"]["type"], "server_error");
    }
    // Other routes still answer.
    let (status, _, _) = send(reqwest::Method::GET, &format!("{base}/health"), None, None).await;
    assert_eq!(status, 200);
    assert_eq!(plain.await.unwrap(), 200);
    assert_eq!(stream.await.unwrap(), 200);
    // Their places are free again.
    let (status, _, value) = send(
        reqwest::Method::POST,
        &format!("{base}/v1/completions"),
        None,
        Some(&completion),
    )
    .await;
    assert_eq!(status, 200, "{value}");
    assert_eq!(generator.budgets.lock().unwrap().len(), 3);
    server.shutdown().await.unwrap();
}

/// A generator whose decoding thread has died.
struct Dead;

#[async_trait::async_trait]
impl TokenGenerator for Dead {
    fn vocab_size(&self) -> usize {
        common::VOCAB
    }

    fn health(&self) -> Result<(), String> {
        Err("the decoding thread has stopped".into())
    }

    async fn generate(
        &self,
        _: harness_openai::TokenRequest,
    ) -> harness_core::Result<harness_openai::TokenOutput> {
        Err(harness_core::Error::Policy {
            policy: "dead".into(),
            message: "the decoding thread stopped".into(),
        })
    }
}

#[tokio::test]
async fn health_is_503_when_the_generator_cannot_answer() {
    let server = serve(ServerConfig::new(MODEL, 4096), Arc::new(Dead)).await;
    let url = format!("{}/health", server.base_url());
    let (status, _, value) = send(reqwest::Method::GET, &url, None, None).await;
    assert_eq!(status, 503, "{value}");
    assert_eq!(value["status"], "unhealthy");
    assert!(
        value["reason"]
            .as_str()
            .unwrap()
            .contains("decoding thread")
    );
    server.shutdown().await.unwrap();
    let server = serve(ServerConfig::new(MODEL, 4096), scripted()).await;
    let url = format!("{}/health", server.base_url());
    let (status, _, value) = send(reqwest::Method::GET, &url, None, None).await;
    assert_eq!((status, value["status"].as_str()), (200, Some("ok")));
    server.shutdown().await.unwrap();
}

/// [`common::ByteEncoder`] that counts the tokens it decodes.
#[derive(Default)]
struct CountingEncoder(std::sync::atomic::AtomicUsize);

impl harness_openai::PromptEncoder for CountingEncoder {
    fn encode(
        &self,
        messages: &[harness_core::ChatMessage],
        tools: &[harness_core::ToolSpec],
    ) -> harness_core::Result<Vec<u32>> {
        ByteEncoder.encode(messages, tools)
    }

    fn decode(&self, tokens: &[u32]) -> harness_core::Result<String> {
        self.0
            .fetch_add(tokens.len(), std::sync::atomic::Ordering::SeqCst);
        ByteEncoder.decode(tokens)
    }
}

/// Answers the bytes of a text with two- and three-byte characters, cut at the limit.
struct Multibyte;

#[async_trait::async_trait]
impl TokenGenerator for Multibyte {
    fn vocab_size(&self) -> usize {
        common::VOCAB
    }

    async fn generate(
        &self,
        request: harness_openai::TokenRequest,
    ) -> harness_core::Result<harness_openai::TokenOutput> {
        let tokens: Vec<u32> = "héllo 日本語 wörld "
            .bytes()
            .cycle()
            .take(request.max_new_tokens)
            .map(u32::from)
            .collect();
        Ok(harness_openai::TokenOutput {
            logprobs: vec![-1.0; tokens.len()],
            tokens,
            finish: harness_core::FinishReason::Length,
        })
    }
}

#[tokio::test]
async fn a_stream_decodes_a_window_of_recent_tokens_not_the_whole_text_per_token() {
    let encoder = Arc::new(CountingEncoder::default());
    let state = Arc::new(ServerState::new(
        ServerConfig::new(MODEL, 1 << 16),
        encoder.clone(),
        Arc::new(Multibyte),
    ));
    let server = ServerHandle::spawn(loopback(), state).await.unwrap();
    let url = format!("{}/v1/completions", server.base_url());
    let tokens = 2001; // ends inside a character
    let whole = json!({"model": MODEL, "prompt": [97], "max_tokens": tokens});
    let (status, _, value) = send(reqwest::Method::POST, &url, None, Some(&whole)).await;
    assert_eq!(status, 200);
    let want = value["choices"][0]["text"].as_str().unwrap().to_string();
    assert!(
        want.contains("日本語") && want.ends_with('\u{FFFD}'),
        "{want}"
    );
    let count = |e: &CountingEncoder| e.0.load(std::sync::atomic::Ordering::SeqCst);
    let before = count(&encoder);
    let mut streamed = whole.clone();
    streamed["stream"] = json!(true);
    let body = harness_openai::http_client()
        .post(&url)
        .json(&streamed)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let mut text = String::new();
    for event in common::sse_events(&body) {
        if event == "[DONE]" {
            continue;
        }
        let chunk: Value = serde_json::from_str(&event).unwrap();
        text.push_str(chunk["choices"][0]["text"].as_str().unwrap_or_default());
    }
    assert_eq!(text, want, "the chunks do not add up to the answer");
    // Whole-text decoding reads about tokens² / 2 = 2 million tokens; a window, a few per token
    // (and the final answer once).
    let decoded = count(&encoder) - before;
    assert!(
        decoded <= 40 * tokens,
        "decoded {decoded} tokens for a {tokens}-token stream"
    );
    server.shutdown().await.unwrap();
}

/// [`common::ByteEncoder`] whose chat template takes a while, like a long prompt's.
struct SlowEncoder;

impl harness_openai::PromptEncoder for SlowEncoder {
    fn encode(
        &self,
        messages: &[harness_core::ChatMessage],
        tools: &[harness_core::ToolSpec],
    ) -> harness_core::Result<Vec<u32>> {
        std::thread::sleep(Duration::from_millis(1500));
        ByteEncoder.encode(messages, tools)
    }

    fn decode(&self, tokens: &[u32]) -> harness_core::Result<String> {
        ByteEncoder.decode(tokens)
    }
}

// One runtime thread, as `#[tokio::test]` has: tokenizing on it would stall every connection.
#[tokio::test]
async fn tokenizing_a_prompt_does_not_stall_other_requests() {
    let state = Arc::new(ServerState::new(
        ServerConfig::new(MODEL, 4096),
        Arc::new(SlowEncoder),
        scripted(),
    ));
    let server = ServerHandle::spawn(loopback(), state).await.unwrap();
    let base = server.base_url();
    let chat = tokio::spawn({
        let url = format!("{base}/v1/chat/completions");
        let body = json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4});
        async move { send(reqwest::Method::POST, &url, None, Some(&body)).await.0 }
    });
    // Measured from before the pause: a runtime blocked by the tokenizer would wake late.
    let started = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, _, _) = send(reqwest::Method::GET, &format!("{base}/health"), None, None).await;
    let waited = started.elapsed();
    assert_eq!(status, 200);
    assert!(
        waited < Duration::from_millis(900),
        "/health waited {waited:?} for a tokenizer"
    );
    assert_eq!(chat.await.unwrap(), 200);
    server.shutdown().await.unwrap();
}
