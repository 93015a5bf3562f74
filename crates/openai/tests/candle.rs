//! The remote policy against the local server backed by grpo-candle's tiny random Qwen policy:
//! the same token ids and log-probs as in-process `CandlePolicy` sampling with the same seed.

#[path = "../examples/support/candle.rs"]
mod candle;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use candle_core::{DType, Device};
use grpo_candle::{CandlePolicy, PolicyModel, PolicyOptions, TinySpec};
use harness_core::{ChatMessage, Policy, PolicyRequest, SamplingParams, ToolSpec};
use harness_openai::{
    ChatClient, ChatClientConfig, EngineKind, RemotePolicy, RemotePolicyConfig, ServerConfig,
    ServerHandle, ServerState,
};

fn tiny() -> PolicyModel {
    tiny_seeded(11)
}

fn tiny_seeded(seed: u64) -> PolicyModel {
    let spec = TinySpec {
        num_merges: 64,
        hidden_size: 32,
        intermediate_size: 64,
        head_dim: 8,
        seed,
        ..TinySpec::default()
    };
    PolicyModel::tiny(&spec, DType::F32, &Device::Cpu).unwrap()
}

async fn serve(model: &PolicyModel) -> ServerHandle {
    let generator = Arc::new(candle::CandleGenerator::new(model.clone(), 16));
    let mut config = ServerConfig::new("tiny", model.model.config().max_position_embeddings);
    // The test's checkpoints are temporary folders.
    config.reload_root = Some(std::env::temp_dir());
    let state = ServerState::new(
        config,
        Arc::new(candle::CandleEncoder::new(model.clone())),
        generator.clone(),
    )
    .with_loader(Arc::new(candle::CandleLoader(generator)));
    ServerHandle::spawn(SocketAddr::from(([127, 0, 0, 1], 0)), Arc::new(state))
        .await
        .unwrap()
}

fn request(seed: u64, sampling: SamplingParams) -> PolicyRequest {
    PolicyRequest {
        messages: vec![
            ChatMessage::system("Answer with a tool call."),
            ChatMessage::user(format!("How many users are there? ({seed})")),
        ],
        tools: vec![ToolSpec::new(
            "execute_sql",
            "Run one SQL query.",
            serde_json::json!({"type": "object", "properties": {"query": {"type": "string"}}}),
        )],
        max_new_tokens: 24,
        max_context_tokens: 4096,
        sampling,
        seed,
    }
}

#[tokio::test]
async fn remote_policy_on_the_candle_server_matches_in_process_candle_sampling() {
    let model = tiny();
    let server = serve(&model).await;
    let local = CandlePolicy::new(model.clone(), PolicyOptions::default());
    let sampling_cases = [
        SamplingParams::default(),
        SamplingParams {
            temperature: 0.7,
            top_p: 0.9,
            top_k: Some(40),
            stop: Vec::new(),
        },
        SamplingParams::greedy(),
    ];
    for engine in [EngineKind::Vllm, EngineKind::Sglang] {
        let mut config = RemotePolicyConfig::new(server.base_url(), "tiny", engine);
        config.fold_seed_to_i63 = false;
        config.endpoint.timeout = Duration::from_secs(60);
        let remote =
            RemotePolicy::new(config, Arc::new(candle::CandleEncoder::new(model.clone()))).unwrap();
        for (i, sampling) in sampling_cases.iter().enumerate() {
            let seed = 1000 + i as u64 * 7919 + u64::from(engine == EngineKind::Sglang);
            let want = local
                .generate(request(seed, sampling.clone()))
                .await
                .unwrap();
            let got = remote
                .generate(request(seed, sampling.clone()))
                .await
                .unwrap();
            assert_eq!(
                got.context_tokens, want.context_tokens,
                "{engine:?} case {i}"
            );
            assert_eq!(got.tokens, want.tokens, "{engine:?} case {i}");
            assert_eq!(got.text, want.text);
            assert_eq!(got.finish, want.finish);
            assert!(!got.tokens.is_empty());
            for (a, b) in got.logprobs.iter().zip(&want.logprobs) {
                assert!((a - b).abs() <= 1e-5, "{engine:?} case {i}: {a} vs {b}");
            }
        }
    }
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn multi_turn_contexts_reuse_generated_tokens_like_the_candle_policy() {
    let model = tiny();
    let server = serve(&model).await;
    let local = CandlePolicy::new(model.clone(), PolicyOptions::default());
    let mut config = RemotePolicyConfig::new(server.base_url(), "tiny", EngineKind::Vllm);
    config.endpoint.timeout = Duration::from_secs(60);
    let remote =
        RemotePolicy::new(config, Arc::new(candle::CandleEncoder::new(model.clone()))).unwrap();
    let mut req = request(77, SamplingParams::default());
    let mut turns = 0;
    let eot = model
        .tokenizer
        .token_to_id(grpo_candle::model::tokenizer::END_OF_TEXT)
        .unwrap();
    let mut previous: Option<Vec<u32>> = None;
    for step in 0..3 {
        let want = local.generate(req.clone()).await.unwrap();
        let got = remote.generate(req.clone()).await.unwrap();
        // The context extends the previous turn's context + generated tokens (exact reuse).
        if let Some(prefix) = previous.take()
            && prefix.last() != Some(&eot)
        {
            assert!(got.context_tokens.starts_with(&prefix), "turn {step}");
        }
        previous = Some([got.context_tokens.clone(), got.tokens.clone()].concat());
        assert_eq!(got.context_tokens, want.context_tokens, "turn {step}");
        assert_eq!(got.tokens, want.tokens, "turn {step}");
        for (a, b) in got.logprobs.iter().zip(&want.logprobs) {
            assert!((a - b).abs() <= 1e-5, "turn {step}: {a} vs {b}");
        }
        if step > 0 {
            turns += 1;
        }
        req.messages.push(ChatMessage::assistant(got.text.clone()));
        req.messages
            .push(ChatMessage::tool("execute_sql", format!("{step} rows")));
        req.seed += 1;
    }
    assert_eq!(turns, 2);
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn chat_and_weight_reload_work_against_the_candle_server() {
    let model = tiny();
    let server = serve(&model).await;
    let mut config = ChatClientConfig::new(format!("{}/v1", server.base_url()), "tiny");
    config.endpoint.timeout = Duration::from_secs(60);
    let client = ChatClient::new(config).unwrap();
    let mut req = harness_core::ChatRequest::new("voter", vec![ChatMessage::user("Rank these.")]);
    req.max_tokens = 8;
    req.seed = Some(1);
    let answer = harness_core::ChatModel::complete(&client, req)
        .await
        .unwrap();
    let usage = answer.usage.unwrap();
    assert!(usage.completion_tokens >= 1 && usage.completion_tokens <= 8);
    assert_eq!(client.ledger().role("voter").requests, 1);

    // A training step's new weights (here: another seed's), saved in HF format, reach the server
    // through SGLang's reload endpoint: afterwards it samples exactly like the new model.
    let dir = tempfile::tempdir().unwrap();
    let trained = tiny_seeded(12);
    let mut config = RemotePolicyConfig::new(server.base_url(), "tiny", EngineKind::Sglang);
    config.endpoint.timeout = Duration::from_secs(60);
    let remote =
        RemotePolicy::new(config, Arc::new(candle::CandleEncoder::new(model.clone()))).unwrap();
    let before = remote
        .generate(request(5, SamplingParams::default()))
        .await
        .unwrap();
    remote
        .sync_weights(dir.path(), |d| {
            trained.save_hf(d).map_err(|e| harness_core::Error::Policy {
                policy: "candle".into(),
                message: e.to_string(),
            })
        })
        .await
        .unwrap();
    let after = remote
        .generate(request(5, SamplingParams::default()))
        .await
        .unwrap();
    let want = CandlePolicy::new(trained, PolicyOptions::default())
        .generate(request(5, SamplingParams::default()))
        .await
        .unwrap();
    assert_eq!(after.tokens, want.tokens);
    assert_ne!(
        after.logprobs, before.logprobs,
        "the reload changed nothing"
    );
    for (a, b) in after.logprobs.iter().zip(&want.logprobs) {
        assert!((a - b).abs() <= 1e-5, "{a} vs {b}");
    }
    server.shutdown().await.unwrap();
}

async fn serve_with(model: &PolicyModel) -> (ServerHandle, Arc<candle::CandleGenerator>) {
    let generator = Arc::new(candle::CandleGenerator::new(model.clone(), 16));
    let state = ServerState::new(
        ServerConfig::new("tiny", model.model.config().max_position_embeddings),
        Arc::new(candle::CandleEncoder::new(model.clone())),
        generator.clone(),
    );
    let server = ServerHandle::spawn(SocketAddr::from(([127, 0, 0, 1], 0)), Arc::new(state))
        .await
        .unwrap();
    (server, generator)
}

#[tokio::test]
async fn n_choices_share_one_prefill_and_match_separate_calls() {
    use harness_openai::{TokenGenerator, TokenRequest, choice_seed};
    let model = tiny();
    let generator = candle::CandleGenerator::new(model.clone(), 16);
    let prompt: Vec<u32> = (0..150u32).map(|i| (i * 7 + 3) % 200).collect();
    let request = TokenRequest {
        prompt: prompt.clone(),
        max_new_tokens: 12,
        sampling: SamplingParams::default(),
        seed: 42,
        format: harness_core::OutputFormat::Text,
    };
    let choices = generator
        .generate_choices(request.clone(), 4, None)
        .await
        .unwrap();
    let st = generator.stats();
    // One prefill for the four rows.
    assert_eq!(st.prefix.computed_tokens, prompt.len() as u64, "{st:?}");
    assert_eq!(st.prefix.shared, 3, "{st:?}");
    assert_eq!(st.prefix.entries, 1, "{st:?}");
    let distinct: std::collections::HashSet<&Vec<u32>> =
        choices.iter().map(|c| &c.tokens).collect();
    assert_eq!(distinct.len(), 4);
    // Each choice is what a call with its seed samples.
    let fresh = candle::CandleGenerator::new(model.clone(), 16);
    for (i, got) in choices.iter().enumerate() {
        let want = fresh
            .generate(TokenRequest {
                seed: choice_seed(42, i),
                ..request.clone()
            })
            .await
            .unwrap();
        assert_eq!(got.tokens, want.tokens, "choice {i}");
        // Four decoding rows against one: equal up to the batched matmuls' rounding.
        for (a, b) in got.logprobs.iter().zip(&want.logprobs) {
            assert!((a - b).abs() <= 1e-5, "choice {i}: {a} vs {b}");
        }
    }
}

fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: ").map(str::to_string))
        .collect()
}

#[tokio::test]
async fn streams_from_the_candle_server_match_and_stop_when_the_client_leaves() {
    let model = tiny();
    let (server, generator) = serve_with(&model).await;
    let url = format!("{}/v1/completions", server.base_url());
    let client = harness_openai::http_client();
    let mut body = serde_json::json!({"model": "tiny", "prompt": "count the users", "n": 2,
        "max_tokens": 16, "seed": 9, "logprobs": 0, "return_token_ids": true});
    let whole: serde_json::Value = client
        .post(&url)
        .json(&body)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    body["stream"] = serde_json::json!(true);
    let text = client
        .post(&url)
        .json(&body)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events = sse_events(&text);
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    for i in 0..2 {
        let (mut text, mut ids) = (String::new(), Vec::new());
        for e in &events[..events.len() - 1] {
            let chunk: serde_json::Value = serde_json::from_str(e).unwrap();
            for c in chunk["choices"].as_array().unwrap() {
                if c["index"] == i {
                    text.push_str(c["text"].as_str().unwrap());
                    if let Some(t) = c["token_ids"].as_array() {
                        ids.extend(t.iter().cloned());
                    }
                }
            }
        }
        let want = &whole["choices"][i];
        assert_eq!(text, want["text"].as_str().unwrap(), "choice {i}");
        assert_eq!(
            &serde_json::Value::Array(ids),
            &want["token_ids"],
            "choice {i}"
        );
    }

    // A long stream whose client reads a few chunks and leaves. Greedy, so that it lasts all
    // 3000 tokens whatever the build's speed (this model and prompt never choose the end token
    // greedily; a sampled stream could end on it before the client leaves).
    let body = serde_json::json!({"model": "tiny", "prompt": "go on", "max_tokens": 3000,
        "temperature": 0.0, "stream": true});
    let mut resp = client.post(&url).json(&body).send().await.unwrap();
    let mut seen = String::new();
    while sse_events(&seen).len() < 4 {
        let chunk = resp.chunk().await.unwrap().expect("the stream is running");
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(resp);
    let mut waited = 0;
    while generator.stats().cancelled_rows == 0 {
        assert!(
            waited < 1000,
            "still decoding after 10 s: {:?}",
            generator.stats()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
        waited += 1;
    }
    let stopped = generator.stats().decoded_tokens;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        generator.stats().decoded_tokens,
        stopped,
        "no row is decoding"
    );
    server.shutdown().await.unwrap();
}

/// POST `body` as JSON and read the JSON answer.
async fn post_json(
    client: &reqwest::Client,
    url: &str,
    body: &serde_json::Value,
) -> serde_json::Value {
    let answer = client.post(url).json(body).send().await.unwrap();
    answer.json().await.unwrap()
}

#[tokio::test]
async fn json_object_answers_are_constrained_and_schemas_are_refused() {
    let model = tiny();
    let server = serve(&model).await;
    let http = harness_openai::http_client();
    let url = format!("{}/v1/chat/completions", server.base_url());
    let body = |format: serde_json::Value, seed: u64| {
        serde_json::json!({
            "model": "tiny",
            "messages": [{"role": "user", "content": "Answer in JSON."}],
            "max_tokens": 48,
            "seed": seed,
            "logprobs": true,
            "response_format": format,
        })
    };
    let mut closed = 0;
    for seed in 0..6 {
        let answer = post_json(
            &http,
            &url,
            &body(serde_json::json!({"type": "json_object"}), seed),
        )
        .await;
        let choice = &answer["choices"][0];
        let text = choice["message"]["content"].as_str().unwrap();
        // A random model's text is still a prefix of one JSON object, whatever it drew.
        let mut state = grpo_candle::sample::json::JsonState::new();
        assert!(state.feed(text.as_bytes()), "seed {seed}: {text:?}");
        if choice["finish_reason"] == "stop" {
            assert!(
                state.is_done(),
                "seed {seed}: stopped inside the object: {text:?}"
            );
            serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text).unwrap();
            closed += 1;
        }
        for lp in choice["logprobs"]["content"].as_array().unwrap() {
            let lp = lp["logprob"].as_f64().unwrap();
            assert!(lp.is_finite() && lp <= 0.0);
        }
    }
    // Free text from the same model and seeds is not JSON: the constraint did the work.
    let free = post_json(&http, &url, &body(serde_json::json!({"type": "text"}), 0)).await;
    let free = free["choices"][0]["message"]["content"].as_str().unwrap();
    assert!(!grpo_candle::sample::json::JsonState::new().accepts(free.as_bytes()));
    eprintln!("{closed} of 6 constrained answers closed their object");

    let refused = http
        .post(&url)
        .json(&body(
            serde_json::json!({"type": "json_schema", "json_schema": {"name": "x"}}),
            0,
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 400);
    let error: serde_json::Value = refused.json().await.unwrap();
    assert_eq!(error["error"]["param"], "response_format");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("json_object"),
        "{error}"
    );
    server.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_checkpoint_that_does_not_fit_leaves_the_served_weights_whole() {
    use harness_openai::{TokenGenerator, TokenRequest};
    let model = tiny();
    let generator = candle::CandleGenerator::new(model.clone(), 4);
    let request = TokenRequest {
        prompt: (0..20u32).map(|i| (i * 5 + 1) % 200).collect(),
        max_new_tokens: 8,
        sampling: SamplingParams::default(),
        seed: 3,
        format: harness_core::OutputFormat::Text,
    };
    let before = generator.generate(request.clone()).await.unwrap();
    // Another seed and a narrower MLP: the attention, norm and embedding tensors fit, the MLP's
    // do not. A tensor-by-tensor copy wrote some before failing on the first MLP tensor.
    let misfit = PolicyModel::tiny(
        &TinySpec {
            num_merges: 64,
            hidden_size: 32,
            intermediate_size: 48,
            head_dim: 8,
            seed: 12,
            ..TinySpec::default()
        },
        DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    misfit.save_hf(dir.path()).unwrap();
    let err = generator.reload(dir.path()).unwrap_err().to_string();
    assert!(err.contains("shape"), "{err}");
    let after = generator.generate(request).await.unwrap();
    assert_eq!(after.tokens, before.tokens);
    assert_eq!(
        after.logprobs, before.logprobs,
        "the failed reload changed weights"
    );
}
