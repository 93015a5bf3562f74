//! `n > 1` and `stream: true` on the local server over real HTTP: n distinct choices with the
//! prompt counted once, server-sent chunks that add up to the non-streaming answer, and the
//! `[DONE]` terminator. (A client leaving mid-stream is tested against the candle generator in
//! `tests/candle.rs`.)

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{MODEL, PacedGenerator, ScriptedGenerator, sse_events, start_server};
use harness_openai::TokenGenerator;
use serde_json::{Value, json};

async fn post(url: &str, body: &Value) -> (u16, String) {
    let resp = harness_openai::http_client()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap();
    let status = resp.status().as_u16();
    (status, resp.text().await.unwrap())
}

async fn post_json(url: &str, body: &Value) -> Value {
    let (status, text) = post(url, body).await;
    assert_eq!(status, 200, "{text}");
    serde_json::from_str(&text).unwrap()
}

/// The parsed chunks of a stream, checking that it ends with `[DONE]` (once, last).
async fn post_stream(url: &str, body: &Value) -> Vec<Value> {
    let resp = harness_openai::http_client()
        .post(url)
        .json(body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let kind = resp.headers()["content-type"].to_str().unwrap().to_string();
    assert!(kind.starts_with("text/event-stream"), "{kind}");
    let events = sse_events(&resp.text().await.unwrap());
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert_eq!(events.iter().filter(|e| *e == "[DONE]").count(), 1);
    events[..events.len() - 1]
        .iter()
        .map(|e| serde_json::from_str(e).unwrap())
        .collect()
}

fn generators() -> Vec<(&'static str, Arc<dyn TokenGenerator>)> {
    vec![
        // The trait's default `generate_choices` (n independent calls, tokens replayed) ...
        ("scripted", Arc::new(ScriptedGenerator::new(Duration::ZERO))),
        // ... and an engine that streams as it decodes.
        ("paced", Arc::new(PacedGenerator::new(Duration::ZERO))),
    ]
}

#[tokio::test]
async fn n_choices_are_distinct_seeded_samples_with_the_prompt_counted_once() {
    for (name, generator) in generators() {
        let (server, state) = start_server(generator, 4096).await;
        let base = server.base_url();
        let url = format!("{base}/v1/completions");
        let prompt = "Write some words:";
        let body = |n: u32, seed: u64| {
            json!({"model": MODEL, "prompt": prompt, "max_tokens": 24, "n": n, "seed": seed,
                   "logprobs": 0, "return_token_ids": true})
        };
        let four = post_json(&url, &body(4, 7)).await;
        let choices = four["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 4, "{name}");
        let texts: Vec<&str> = choices
            .iter()
            .map(|c| c["text"].as_str().unwrap())
            .collect();
        for (i, c) in choices.iter().enumerate() {
            assert_eq!(c["index"], i, "{name}");
        }
        let distinct: std::collections::HashSet<&&str> = texts.iter().collect();
        assert_eq!(distinct.len(), 4, "{name}: {texts:?}");
        // The prompt once, every choice's tokens.
        let completion: u64 = choices
            .iter()
            .map(|c| c["token_ids"].as_array().unwrap().len() as u64)
            .sum();
        assert_eq!(four["usage"]["prompt_tokens"], prompt.len(), "{name}");
        assert_eq!(four["usage"]["completion_tokens"], completion, "{name}");
        // Reproducible under the seed, and choice 0 is the n = 1 answer.
        let again = post_json(&url, &body(4, 7)).await;
        assert_eq!(again["choices"], four["choices"], "{name}");
        let one = post_json(&url, &body(1, 7)).await;
        assert_eq!(one["choices"][0]["text"], choices[0]["text"], "{name}");
        let other = post_json(&url, &body(4, 8)).await;
        assert_ne!(other["choices"], four["choices"], "{name}");

        // A batch of two prompts with n = 3: indices prompt-major, each prompt counted once.
        let batch = post_json(
            &url,
            &json!({"model": MODEL, "prompt": ["ab", "cde"], "max_tokens": 8, "n": 3, "seed": 1}),
        )
        .await;
        let indices: Vec<u64> = batch["choices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["index"].as_u64().unwrap())
            .collect();
        assert_eq!(indices, [0, 1, 2, 3, 4, 5], "{name}");
        assert_eq!(batch["usage"]["prompt_tokens"], 5, "{name}");

        // Chat: n messages, the prompt counted once.
        let chat = post_json(
            &format!("{base}/v1/chat/completions"),
            &json!({"model": MODEL, "messages": [{"role": "user", "content": "hi"}],
                    "n": 3, "seed": 5, "max_tokens": 16, "logprobs": true}),
        )
        .await;
        let choices = chat["choices"].as_array().unwrap();
        assert_eq!(choices.len(), 3, "{name}");
        let contents: std::collections::HashSet<&str> = choices
            .iter()
            .map(|c| c["message"]["content"].as_str().unwrap())
            .collect();
        assert_eq!(contents.len(), 3, "{name}: {chat}");
        let prompt_tokens = "<|user|>hi\n<|assistant|>".len();
        assert_eq!(chat["usage"]["prompt_tokens"], prompt_tokens, "{name}");
        let counted: u64 = choices
            .iter()
            .map(|c| c["logprobs"]["content"].as_array().unwrap().len() as u64)
            .sum();
        assert_eq!(chat["usage"]["completion_tokens"], counted, "{name}");
        assert_eq!(state.stats().rejected, 0);

        // Out of range.
        for n in [0, 100_000] {
            let (status, text) = post(&url, &body(n, 1)).await;
            assert_eq!(status, 400, "{text}");
            assert!(text.contains("n must be between 1 and"), "{text}");
        }
        server.shutdown().await.unwrap();
    }
}

/// Per choice index: the concatenated text, token ids, log-probs and the finish reason.
#[derive(Debug, Default, PartialEq)]
struct Joined {
    text: String,
    token_ids: Vec<u64>,
    logprobs: Vec<f64>,
    tokens: Vec<String>,
    offsets: Vec<u64>,
    finish: Option<String>,
    prompt_token_ids: Option<Value>,
}

fn join_completion_chunks(chunks: &[Value]) -> Vec<Joined> {
    let mut out: Vec<Joined> = Vec::new();
    for chunk in chunks {
        assert_eq!(chunk["object"], "text_completion");
        for c in chunk["choices"].as_array().unwrap() {
            let i = c["index"].as_u64().unwrap() as usize;
            if out.len() <= i {
                out.resize_with(i + 1, Joined::default);
            }
            let j = &mut out[i];
            j.text.push_str(c["text"].as_str().unwrap());
            if let Some(ids) = c["token_ids"].as_array() {
                j.token_ids.extend(ids.iter().map(|t| t.as_u64().unwrap()));
            }
            if let Some(p) = c.get("prompt_token_ids") {
                assert!(j.prompt_token_ids.is_none(), "prompt ids sent once");
                j.prompt_token_ids = Some(p.clone());
            }
            if let Some(lp) = c["logprobs"].as_object() {
                for (k, v) in lp["token_logprobs"].as_array().unwrap().iter().enumerate() {
                    j.logprobs.push(v.as_f64().unwrap());
                    j.tokens.push(lp["tokens"][k].as_str().unwrap().to_string());
                    j.offsets.push(lp["text_offset"][k].as_u64().unwrap());
                }
            }
            if let Some(f) = c["finish_reason"].as_str() {
                assert!(j.finish.is_none(), "one finish reason per choice");
                j.finish = Some(f.to_string());
            }
        }
    }
    out
}

fn join_completion_answer(answer: &Value) -> Vec<Joined> {
    answer["choices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let lp = &c["logprobs"];
            Joined {
                text: c["text"].as_str().unwrap().to_string(),
                token_ids: c["token_ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t.as_u64().unwrap())
                    .collect(),
                logprobs: lp["token_logprobs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap())
                    .collect(),
                tokens: lp["tokens"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap().to_string())
                    .collect(),
                offsets: lp["text_offset"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_u64().unwrap())
                    .collect(),
                finish: c["finish_reason"].as_str().map(str::to_string),
                prompt_token_ids: Some(c["prompt_token_ids"].clone()),
            }
        })
        .collect()
}

#[tokio::test]
async fn streamed_chunks_add_up_to_the_non_streaming_answer() {
    for (name, generator) in generators() {
        let (server, _state) = start_server(generator, 4096).await;
        let base = server.base_url();
        // Completions: two prompts x two choices, log-probs and token ids, usage at the end.
        let url = format!("{base}/v1/completions");
        let mut body = json!({"model": MODEL, "prompt": ["Say:", "Then:"], "max_tokens": 30,
            "n": 2, "seed": 11, "logprobs": 1, "return_token_ids": true});
        let whole = join_completion_answer(&post_json(&url, &body).await);
        body["stream"] = json!(true);
        body["stream_options"] = json!({"include_usage": true});
        let chunks = post_stream(&url, &body).await;
        let (usage, chunks) = chunks.split_last().unwrap();
        assert_eq!(usage["choices"], json!([]), "{name}");
        let streamed = join_completion_chunks(chunks);
        assert_eq!(streamed.len(), 4, "{name}");
        assert!(whole.iter().all(|j| !j.token_ids.is_empty()));
        assert_eq!(streamed, whole, "{name}");
        let tokens: usize = whole.iter().map(|j| j.token_ids.len()).sum();
        assert_eq!(usage["usage"]["completion_tokens"], tokens, "{name}");
        assert_eq!(usage["usage"]["prompt_tokens"], 9, "{name}");
        // One chunk per token, plus a closing chunk per choice.
        assert_eq!(chunks.len(), tokens + 4, "{name}");

        // Chat: the role opens each choice, content deltas and log-probs add up.
        let url = format!("{base}/v1/chat/completions");
        let mut body = json!({"model": MODEL,
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Tell me."}],
            "n": 3, "seed": 3, "max_tokens": 40, "logprobs": true});
        let answer = post_json(&url, &body).await;
        body["stream"] = json!(true);
        let chunks = post_stream(&url, &body).await;
        assert!(
            chunks
                .iter()
                .all(|c| c["object"] == "chat.completion.chunk")
        );
        for (i, want) in answer["choices"].as_array().unwrap().iter().enumerate() {
            let mine: Vec<&Value> = chunks
                .iter()
                .flat_map(|c| c["choices"].as_array().unwrap())
                .filter(|c| c["index"] == i)
                .collect();
            assert_eq!(mine[0]["delta"]["role"], "assistant", "{name}");
            let content: String = mine
                .iter()
                .filter_map(|c| c["delta"]["content"].as_str())
                .collect();
            assert_eq!(
                content,
                want["message"]["content"].as_str().unwrap(),
                "{name}"
            );
            let logprobs: Vec<&Value> = mine
                .iter()
                .filter_map(|c| c["logprobs"]["content"].as_array())
                .flatten()
                .collect();
            let want_lp: Vec<&Value> = want["logprobs"]["content"]
                .as_array()
                .unwrap()
                .iter()
                .collect();
            assert_eq!(logprobs, want_lp, "{name}");
            let finishes: Vec<&Value> = mine
                .iter()
                .map(|c| &c["finish_reason"])
                .filter(|f| !f.is_null())
                .collect();
            assert_eq!(finishes, [&want["finish_reason"]], "{name}");
        }
        server.shutdown().await.unwrap();
    }
}

#[tokio::test]
async fn streamed_tool_calls_come_as_tool_call_deltas() {
    let (server, _state) =
        start_server(Arc::new(ScriptedGenerator::new(Duration::ZERO)), 4096).await;
    let url = format!("{}/v1/chat/completions", server.base_url());
    let mut body = json!({"model": MODEL,
        "messages": [{"role": "user", "content": "Look it up."}],
        "tools": [{"type": "function", "function": {"name": "lookup", "parameters": {}}}],
        "seed": 2});
    let answer = post_json(&url, &body).await;
    let want = &answer["choices"][0]["message"]["tool_calls"][0]["function"];
    assert_eq!(want["name"], "lookup");
    body["stream"] = json!(true);
    let chunks = post_stream(&url, &body).await;
    let choices: Vec<&Value> = chunks
        .iter()
        .flat_map(|c| c["choices"].as_array().unwrap())
        .collect();
    // No `<tool_call>` text leaks into content; the call comes whole at the end.
    assert!(choices.iter().all(|c| {
        c["delta"]["content"]
            .as_str()
            .is_none_or(|t| !t.contains('<'))
    }));
    let last = choices.last().unwrap();
    assert_eq!(last["finish_reason"], "tool_calls");
    let call = &last["delta"]["tool_calls"][0];
    assert_eq!(call["index"], 0);
    assert_eq!(call["type"], "function");
    assert_eq!(&call["function"], want);
    server.shutdown().await.unwrap();
}
