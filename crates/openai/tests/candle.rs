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
    let state = ServerState::new(
        ServerConfig::new("tiny", model.model.config().max_position_embeddings),
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
        .token_to_id(grpo_candle::tokenizer::END_OF_TEXT)
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
