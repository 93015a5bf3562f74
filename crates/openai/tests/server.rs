//! The local server over real HTTP on 127.0.0.1: token-level fidelity of the remote policy
//! (vLLM and SGLang APIs), a multi-turn tool-calling chat, bad input, weight reload and load.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{ByteEncoder, MODEL, ScriptedGenerator, start_server};
use harness_core::{
    ChatMessage, ChatModel, ChatRequest, FinishReason, Policy, PolicyRequest, SamplingParams,
    ToolSpec,
};
use harness_openai::protocol::{ChatCompletionRequest, WireMessage, WireTool};
use harness_openai::{
    ChatClient, ChatClientConfig, EncodedPolicy, EngineKind, RemotePolicy, RemotePolicyConfig,
    RetryConfig, TokenGenerator,
};
use serde_json::{Value, json};

fn policy_request(seed: u64, sampling: SamplingParams, max_new_tokens: usize) -> PolicyRequest {
    PolicyRequest {
        messages: vec![
            ChatMessage::system("You answer briefly."),
            ChatMessage::user(format!("Tell me something, #{seed}.")),
        ],
        tools: Vec::new(),
        max_new_tokens,
        max_context_tokens: 4096,
        sampling,
        seed,
    }
}

fn remote(base_url: &str, engine: EngineKind) -> RemotePolicy {
    let mut config = RemotePolicyConfig::new(base_url, MODEL, engine);
    // Bit-exact comparison with the in-process sampler on arbitrary u64 seeds.
    config.fold_seed_to_i63 = false;
    config.endpoint.timeout = Duration::from_secs(20);
    RemotePolicy::new(config, Arc::new(ByteEncoder)).unwrap()
}

#[tokio::test]
async fn remote_policy_matches_in_process_sampling_on_both_engine_apis() {
    let generator: Arc<dyn TokenGenerator> = Arc::new(ScriptedGenerator::new(Duration::ZERO));
    let (server, _state) = start_server(generator.clone(), 4096).await;
    let local = EncodedPolicy::new("local", Arc::new(ByteEncoder), generator);
    let cases = [
        (1u64, SamplingParams::default(), 64),
        (u64::MAX - 3, SamplingParams::default(), 8), // hits the length limit
        (
            42,
            SamplingParams {
                temperature: 0.7,
                top_p: 0.9,
                top_k: Some(20),
                stop: vec!["gamma".into()],
            },
            64,
        ),
    ];
    for engine in [EngineKind::Vllm, EngineKind::Sglang] {
        let policy = remote(&server.base_url(), engine);
        for (seed, sampling, max_new) in cases.clone() {
            let request = policy_request(seed, sampling, max_new);
            let want = local.generate(request.clone()).await.unwrap();
            let got = policy.generate(request).await.unwrap();
            assert_eq!(got.tokens, want.tokens, "{engine:?} seed {seed}");
            assert_eq!(got.context_tokens, want.context_tokens);
            assert_eq!(got.text, want.text);
            assert_eq!(got.finish, want.finish);
            assert_eq!(got.logprobs.len(), want.logprobs.len());
            for (a, b) in got.logprobs.iter().zip(&want.logprobs) {
                assert!((a - b).abs() <= 1e-5, "{engine:?} seed {seed}: {a} vs {b}");
            }
        }
    }
    // A different seed gives a different turn (the comparison above is not vacuous).
    let policy = remote(&server.base_url(), EngineKind::Vllm);
    let a = policy
        .generate(policy_request(5, SamplingParams::default(), 64))
        .await
        .unwrap();
    let mut other = policy_request(5, SamplingParams::default(), 64);
    other.seed = 6;
    let b = policy.generate(other).await.unwrap();
    assert_ne!(a.logprobs, b.logprobs);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn remote_policy_reports_context_overflow_without_calling_the_engine() {
    let generator = Arc::new(ScriptedGenerator::new(Duration::ZERO));
    let (server, state) = start_server(generator.clone(), 4096).await;
    let policy = remote(&server.base_url(), EngineKind::Vllm);
    let mut request = policy_request(1, SamplingParams::default(), 16);
    request.max_context_tokens = 10;
    let turn = policy.generate(request).await.unwrap();
    assert_eq!(turn.finish, FinishReason::ContextOverflow);
    assert!(turn.tokens.is_empty() && turn.context_tokens.len() > 10);
    assert_eq!(state.stats().requests, 0);
    server.shutdown().await.unwrap();
}

fn chat_client(server_base: &str) -> ChatClient {
    let mut config = ChatClientConfig::new(format!("{server_base}/v1"), MODEL);
    config.endpoint = config
        .endpoint
        .with_timeout(Duration::from_secs(20))
        .with_retry(RetryConfig::none());
    ChatClient::new(config).unwrap()
}

#[tokio::test]
async fn chat_client_completes_a_multi_turn_conversation_with_a_tool_call() {
    let (server, _state) =
        start_server(Arc::new(ScriptedGenerator::new(Duration::ZERO)), 4096).await;
    let client = chat_client(&server.base_url());
    let lookup = ToolSpec::new(
        "lookup",
        "Look a key up.",
        json!({"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}),
    );

    // Turn 1: the model calls the tool.
    let mut messages = vec![
        WireMessage::text("system", "Use tools."),
        WireMessage::text("user", "What is the answer?"),
    ];
    let request = |messages: Vec<WireMessage>| ChatCompletionRequest {
        model: String::new(),
        messages,
        tools: vec![WireTool::from_spec(&lookup)],
        tool_choice: Some(json!("auto")),
        temperature: Some(0.0),
        top_p: None,
        max_tokens: Some(200),
        max_completion_tokens: None,
        seed: Some(3),
        stop: None,
        n: None,
        stream: None,
        logprobs: Some(true),
        extra: Default::default(),
    };
    let first = client
        .chat("actor", request(messages.clone()))
        .await
        .unwrap();
    let choice = &first.choices[0];
    assert_eq!(choice.finish_reason.as_deref(), Some("tool_calls"));
    assert_eq!(choice.message.tool_calls.len(), 1);
    let call = &choice.message.tool_calls[0];
    assert_eq!(call.function.name, "lookup");
    assert!(serde_json::from_str::<Value>(&call.function.arguments).unwrap()["key"].is_string());
    let lps = choice.logprobs.as_ref().unwrap().content.as_ref().unwrap();
    assert_eq!(lps.len() as u64, first.usage.unwrap().completion_tokens);
    assert!(lps.iter().all(|t| t.logprob < 0.0));

    // Turn 2: the tool answers and the model uses the result.
    messages.push(choice.message.clone());
    messages.push(WireMessage {
        role: "tool".into(),
        content: Some(harness_openai::protocol::MessageContent::Text("42".into())),
        name: None,
        tool_calls: Vec::new(),
        tool_call_id: Some(call.id.clone()),
    });
    let second = client.chat("actor", request(messages)).await.unwrap();
    let choice = &second.choices[0];
    assert_eq!(choice.finish_reason.as_deref(), Some("stop"));
    assert!(choice.message.tool_calls.is_empty());
    let text = choice.message.content.as_ref().unwrap().text();
    assert_eq!(text, "The answer is 42.");

    // The same conversation through the text-only ChatModel seam: the raw `<tool_call>` text
    // and the tool message are mapped onto tool_calls / tool_call_id and back.
    let assistant = harness_openai::protocol::assistant_text(&first.choices[0].message);
    let answer = client
        .complete(ChatRequest::new(
            "editor",
            vec![
                ChatMessage::user("What is the answer?"),
                ChatMessage::assistant(assistant),
                ChatMessage::tool("lookup", "7"),
            ],
        ))
        .await
        .unwrap();
    assert_eq!(answer.text, "The answer is 7.");

    let ledger = client.ledger();
    assert_eq!(ledger.role("actor").requests, 2);
    assert_eq!(ledger.role("editor").requests, 1);
    assert!(ledger.role("actor").completion_tokens > 0);
    assert!(ledger.role("actor").prompt_tokens > 0);
    assert_eq!(
        client.models().await.unwrap(),
        vec![MODEL.to_string()],
        "/v1/models lists the served model"
    );
    server.shutdown().await.unwrap();
}

async fn post(url: &str, body: &str) -> (u16, Value) {
    let response = harness_openai::http_client()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let value = response.json::<Value>().await.unwrap_or(Value::Null);
    (status, value)
}

#[tokio::test]
async fn bad_input_gets_a_4xx_with_a_message_and_the_server_keeps_serving() {
    let (server, state) = start_server(Arc::new(ScriptedGenerator::new(Duration::ZERO)), 64).await;
    let base = server.base_url();
    let completions = format!("{base}/v1/completions");
    let chat = format!("{base}/v1/chat/completions");
    let long: Vec<u32> = vec![97; 64];
    let cases: Vec<(&str, String, u16, &str)> = vec![
        (&completions, "{\"model\": ".into(), 400, "malformed JSON"),
        (&chat, "not json at all".into(), 400, "malformed JSON"),
        (
            &completions,
            json!({"model": "nope", "prompt": [1, 2]}).to_string(),
            404,
            "does not exist",
        ),
        (
            &chat,
            json!({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}).to_string(),
            404,
            "does not exist",
        ),
        (
            &completions,
            json!({"model": MODEL, "prompt": long}).to_string(),
            400,
            "maximum context length is 64",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": [{"role": "user", "content": "x".repeat(100)}]})
                .to_string(),
            400,
            "maximum context length",
        ),
        (
            &completions,
            json!({"model": MODEL, "prompt": [1, 2], "max_tokens": -5}).to_string(),
            400,
            "max_tokens must be at least 1, got -5",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": -1})
                .to_string(),
            400,
            "max_tokens must be at least 1",
        ),
        (
            &completions,
            json!({"model": MODEL, "prompt": [1, 999999]}).to_string(),
            400,
            "outside the vocabulary",
        ),
        (
            &completions,
            json!({"model": MODEL, "prompt": [1], "temperature": -1.0}).to_string(),
            400,
            "temperature",
        ),
        (
            &chat,
            json!({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}).to_string(),
            400,
            "messages[0].role",
        ),
        (
            &completions,
            json!({"model": MODEL, "prompt": [1], "n": 0, "stream": true}).to_string(),
            400,
            "n must be between 1 and 64, got 0",
        ),
    ];
    for (url, body, status, needle) in cases {
        let (got, value) = post(url, &body).await;
        assert_eq!(got, status, "{body} -> {value}");
        let message = value["error"]["message"].as_str().unwrap_or_default();
        assert!(
            message.contains(needle),
            "{body}: `{message}` lacks `{needle}`"
        );
    }
    // Still serving, and nothing reached the generator.
    assert_eq!(state.stats().generations, 0);
    let (status, value) = post(
        &completions,
        &json!({"model": MODEL, "prompt": "ab", "max_tokens": 5, "logprobs": 0}).to_string(),
    )
    .await;
    assert_eq!(status, 200, "{value}");
    assert!(value["choices"][0]["logprobs"]["token_logprobs"].is_array());
    let health = reqwest::get(format!("{base}/health")).await.unwrap();
    assert_eq!(health.status().as_u16(), 200);
    let missing = reqwest::get(format!("{base}/v2/nothing")).await.unwrap();
    assert_eq!(missing.status().as_u16(), 404);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn completions_return_token_ids_and_logprobs_in_vllm_fields() {
    let (server, _state) =
        start_server(Arc::new(ScriptedGenerator::new(Duration::ZERO)), 4096).await;
    let (status, value) = post(
        &format!("{}/v1/completions", server.base_url()),
        &json!({
            "model": MODEL, "prompt": [[104, 105], [111, 107, 33]], "max_tokens": 12, "seed": 9,
            "logprobs": 1, "return_token_ids": true, "return_tokens_as_token_ids": true
        })
        .to_string(),
    )
    .await;
    assert_eq!(status, 200, "{value}");
    let choices = value["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        let ids = c["token_ids"].as_array().unwrap();
        let lps = c["logprobs"]["token_logprobs"].as_array().unwrap();
        let toks = c["logprobs"]["tokens"].as_array().unwrap();
        assert_eq!(ids.len(), lps.len());
        assert_eq!(toks[0], format!("token_id:{}", ids[0]));
        assert!(c["prompt_token_ids"].is_array());
        assert_eq!(c["finish_reason"], "length");
    }
    assert_eq!(value["usage"]["prompt_tokens"], 5);
    server.shutdown().await.unwrap();
}

struct RecordingLoader(std::sync::Mutex<Vec<std::path::PathBuf>>);

#[async_trait::async_trait]
impl harness_openai::WeightLoader for RecordingLoader {
    async fn load(&self, dir: &std::path::Path) -> harness_core::Result<()> {
        if !dir.exists() {
            return Err(harness_core::Error::io(
                dir,
                std::io::Error::new(std::io::ErrorKind::NotFound, "no such checkpoint"),
            ));
        }
        self.0.lock().unwrap().push(dir.to_path_buf());
        Ok(())
    }
}

#[tokio::test]
async fn weight_sync_reaches_the_server_through_both_engine_protocols() {
    let dir = tempfile::tempdir().unwrap();
    let loader = Arc::new(RecordingLoader(Default::default()));
    let mut config = harness_openai::ServerConfig::new(MODEL, 4096);
    config.model_dir = Some(dir.path().to_path_buf());
    config.reload_root = Some(dir.path().to_path_buf());
    let state = Arc::new(
        harness_openai::ServerState::new(
            config,
            Arc::new(ByteEncoder),
            Arc::new(ScriptedGenerator::new(Duration::ZERO)),
        )
        .with_loader(loader.clone()),
    );
    let server = harness_openai::ServerHandle::spawn(common::loopback(), state)
        .await
        .unwrap();
    let sglang = remote(&server.base_url(), EngineKind::Sglang);
    let saved = std::sync::atomic::AtomicBool::new(false);
    sglang
        .sync_weights(dir.path(), |d| {
            assert_eq!(d, dir.path());
            saved.store(true, std::sync::atomic::Ordering::SeqCst);
            Ok(())
        })
        .await
        .unwrap();
    assert!(saved.load(std::sync::atomic::Ordering::SeqCst));
    let vllm = remote(&server.base_url(), EngineKind::Vllm);
    vllm.reload_weights(dir.path()).await.unwrap();
    assert_eq!(loader.0.lock().unwrap().len(), 2);
    // A checkpoint the engine cannot load is a clear error.
    let err = sglang
        .reload_weights(&dir.path().join("missing"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("missing"), "{err}");
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn sixty_four_concurrent_requests_all_complete_and_reach_the_generator_concurrently() {
    let generator = Arc::new(ScriptedGenerator::new(Duration::from_millis(50)));
    let (server, state) = start_server(generator.clone(), 4096).await;
    let mut config = RemotePolicyConfig::new(server.base_url(), MODEL, EngineKind::Vllm);
    config.endpoint = config
        .endpoint
        .with_max_concurrency(64)
        .with_timeout(Duration::from_secs(30));
    let policy = Arc::new(RemotePolicy::new(config, Arc::new(ByteEncoder)).unwrap());
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..64u64)
        .map(|i| {
            let policy = policy.clone();
            tokio::spawn(async move {
                policy
                    .generate(policy_request(i, SamplingParams::default(), 32))
                    .await
            })
        })
        .collect();
    let mut tokens = 0;
    for t in tasks {
        let turn = t.await.unwrap().unwrap();
        assert!(!turn.tokens.is_empty());
        tokens += turn.tokens.len();
    }
    let stats = state.stats();
    assert_eq!(stats.generations, 64);
    assert_eq!(stats.generated_tokens as usize, tokens);
    assert!(
        stats.peak_in_flight > 1,
        "the server serialised generation (peak {})",
        stats.peak_in_flight
    );
    eprintln!("64 requests in {:?}", started.elapsed());
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn the_chat_client_concurrency_limit_caps_requests_in_flight() {
    let (server, state) = start_server(
        Arc::new(ScriptedGenerator::new(Duration::from_millis(30))),
        4096,
    )
    .await;
    let mut config = ChatClientConfig::new(format!("{}/v1", server.base_url()), MODEL);
    config.endpoint = config
        .endpoint
        .with_max_concurrency(3)
        .with_timeout(Duration::from_secs(20));
    let client = Arc::new(ChatClient::new(config).unwrap());
    let tasks: Vec<_> = (0..12u64)
        .map(|i| {
            let client = client.clone();
            tokio::spawn(async move {
                let mut request =
                    ChatRequest::new("voter", vec![ChatMessage::user(format!("q{i}"))]);
                request.max_tokens = 16;
                request.seed = Some(i);
                client.complete(request).await
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    let stats = state.stats();
    assert_eq!(stats.generations, 12);
    assert!(stats.peak_in_flight <= 3, "peak {}", stats.peak_in_flight);
    assert_eq!(client.ledger().role("voter").requests, 12);
    server.shutdown().await.unwrap();
}
