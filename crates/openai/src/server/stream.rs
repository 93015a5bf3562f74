//! `stream: true`: answers as server-sent events in the OpenAI chunk format.
//!
//! Each sampled token becomes one chunk (`text_completion` chunks for `/v1/completions`,
//! `chat.completion.chunk` for chat) whose choice carries its `index` (with `n` choices per
//! prompt, vLLM's and OpenAI's order: the choices of prompt 0, then of prompt 1, ...), the new
//! text, and when asked the token's log-prob and id. A chat choice opens with a
//! `{"role": "assistant"}` delta; every choice closes with a chunk holding its finish reason
//! (and any text held back until then); `stream_options.include_usage` adds a usage chunk with
//! no choices; `data: [DONE]` ends the stream.
//!
//! The text of a choice grows by decoding a window of its recent tokens at every step (not the
//! whole answer again) and the new part is sent, holding back a trailing partial UTF-8
//! character, so the chunks concatenate to the text of the
//! non-streaming answer. With tools offered, text from a `<tool_call>` on is held back and sent
//! as `tool_calls` deltas at the end (content before the call is streamed as generated, while
//! the non-streaming message trims it).
//!
//! A client that goes away closes the response body: the next chunk cannot be sent, the driver
//! returns and drops the token channel, and the generator stops decoding the request's
//! sequences (see [`crate::TokenSink`]).

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::body::{Body, Bytes};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::channel::mpsc;
use futures::{SinkExt, StreamExt};
use serde_json::{Value, json};
use tokio::sync::OwnedSemaphorePermit;

use super::{ApiError, ServerState, decode, finish_str, now};
use crate::engine::{StreamedToken, TokenOutput, TokenRequest};
use crate::protocol::{CALL_OPEN, WireToolCall, WireUsage, split_tool_calls};

/// Which API's chunks to write, with what the request asked to include.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Shape {
    /// `/v1/completions`: `logprobs` (the number of alternatives asked for), tokens as
    /// `token_id:<id>`, vLLM's `token_ids` / `prompt_token_ids`.
    Completion {
        logprobs: Option<u32>,
        as_ids: bool,
        with_ids: bool,
    },
    /// `/v1/chat/completions`: `logprobs`, and whether `<tool_call>` blocks become `tool_calls`.
    Chat { logprobs: bool, tools: bool },
}

/// The most tokens decoded together for one step of a stream: the tokens not yet turned into
/// text plus the few before them. Past it the window's text is taken as it is, so that output
/// that never forms whole characters cannot make every step decode the whole answer again.
const MAX_WINDOW: usize = 16;

/// What has been sent of one choice.
#[derive(Default)]
struct Choice {
    tokens: Vec<u32>,
    /// The text of `tokens[..read_offset]`, built a window at a time.
    text: String,
    /// Where the window starts: the tokens before `read_offset` that are decoded again as
    /// context, for tokenizers whose pieces read differently at the start of a text (a leading
    /// space, a byte of a character), as vLLM's incremental detokenizer does.
    prefix_offset: usize,
    /// The tokens up to here are in `text`.
    read_offset: usize,
    /// The text sent so far.
    sent: String,
    /// Characters of the per-token pieces so far (`text_offset` of completion log-probs).
    offset: usize,
}

/// The text of `full` that may be sent now: without a trailing partial character (decoded as
/// U+FFFD) and, when tool calls are parsed, without anything from a `<tool_call>` (or the start
/// of one) on.
fn sendable(full: &str, tools: bool) -> &str {
    let mut text = full.trim_end_matches('\u{FFFD}');
    if tools {
        if let Some(at) = text.find(CALL_OPEN) {
            text = &text[..at];
        }
        // A tail that may grow into `<tool_call>`.
        if let Some(at) = text.rfind('<')
            && CALL_OPEN.starts_with(&text[at..])
        {
            text = &text[..at];
        }
    }
    text
}

/// Start generating `requests` (each with `n` choices) and answer with their event stream.
pub(crate) fn respond(
    state: Arc<ServerState>,
    requests: Vec<TokenRequest>,
    n: usize,
    shape: Shape,
    include_usage: bool,
    permit: OwnedSemaphorePermit,
) -> Response {
    let (body, events) = mpsc::channel::<Bytes>(64);
    tokio::spawn(async move {
        // The stream holds its place in the request queue until its last chunk.
        let _permit = permit;
        drive(state, requests, n, shape, include_usage, body).await;
    });
    let stream = events.map(Ok::<_, Infallible>);
    (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        Body::from_stream(stream),
    )
        .into_response()
}

/// An f32 as the non-streaming answers write it (shortest decimal of the f32, not of its f64
/// widening), so streamed and whole log-probs parse to the same numbers.
fn f32_value(x: f32) -> Value {
    if x.is_finite() {
        x.to_string()
            .parse::<f64>()
            .map_or(Value::Null, |v| json!(v))
    } else {
        Value::Null
    }
}

fn event(value: &Value) -> Bytes {
    Bytes::from(format!("data: {value}\n\n"))
}

/// The envelope of one chunk.
struct Envelope {
    id: String,
    created: u64,
    model: String,
    object: &'static str,
}

impl Envelope {
    fn chunk(&self, choices: Vec<Value>) -> Value {
        json!({
            "id": self.id,
            "object": self.object,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        })
    }
}

/// The chunk choice of one new token of choice `index`.
fn token_choice(
    state: &ServerState,
    shape: Shape,
    index: usize,
    choice: &mut Choice,
    prompt: &[u32],
    token: StreamedToken,
) -> Result<Value, ApiError> {
    let first = choice.tokens.is_empty();
    choice.tokens.push(token.token);
    advance_text(state, choice)?;
    let tools = matches!(shape, Shape::Chat { tools: true, .. });
    let now = sendable(&choice.text, tools);
    let delta = match now.strip_prefix(choice.sent.as_str()) {
        Some(rest) => rest.to_string(),
        // An earlier piece decodes differently now: wait for the end.
        None => String::new(),
    };
    choice.sent.push_str(&delta);
    let piece = decode(state, &[token.token])?;
    Ok(match shape {
        Shape::Completion {
            logprobs,
            as_ids,
            with_ids,
        } => {
            let mut c = json!({
                "index": index,
                "text": delta,
                "logprobs": Value::Null,
                "finish_reason": Value::Null,
            });
            if let Some(top) = logprobs {
                let shown = if as_ids {
                    format!("token_id:{}", token.token)
                } else {
                    piece.clone()
                };
                c["logprobs"] = json!({
                    "tokens": [shown],
                    "token_logprobs": [f32_value(token.logprob)],
                    "top_logprobs": if top > 0 {
                        let mut only = serde_json::Map::new();
                        only.insert(shown.clone(), f32_value(token.logprob));
                        json!([only])
                    } else {
                        Value::Null
                    },
                    "text_offset": [choice.offset],
                });
            }
            choice.offset += piece.chars().count();
            if with_ids {
                c["token_ids"] = json!([token.token]);
                if first {
                    c["prompt_token_ids"] = json!(prompt);
                }
            }
            c
        }
        Shape::Chat { logprobs, .. } => {
            let mut c = json!({
                "index": index,
                "delta": if delta.is_empty() { json!({}) } else { json!({"content": delta}) },
                "logprobs": Value::Null,
                "finish_reason": Value::Null,
            });
            if logprobs {
                c["logprobs"] = json!({"content": [{
                    "token": piece,
                    "logprob": f32_value(token.logprob),
                    "bytes": piece.as_bytes(),
                    "top_logprobs": [],
                }]});
            }
            c
        }
    })
}

/// Extend `choice.text` with its new tokens, decoding only a window of recent ones: the text of
/// `tokens[prefix_offset..]` minus that of `tokens[prefix_offset..read_offset]` is what the new
/// tokens add. It waits while the new tokens end inside a character (U+FFFD), up to
/// [`MAX_WINDOW`] tokens.
fn advance_text(state: &ServerState, choice: &mut Choice) -> Result<(), ApiError> {
    let tokens = &choice.tokens;
    let before = match choice.prefix_offset == choice.read_offset {
        true => String::new(),
        false => decode(state, &tokens[choice.prefix_offset..choice.read_offset])?,
    };
    let window = decode(state, &tokens[choice.prefix_offset..])?;
    let full_window = tokens.len() - choice.prefix_offset >= MAX_WINDOW;
    let added = match window.strip_prefix(before.as_str()) {
        Some(added) if !added.ends_with('\u{FFFD}') || full_window => added,
        // A character still open, or context that reads differently with the new tokens after
        // it: wait for the next token.
        _ if !full_window => return Ok(()),
        _ => window.get(before.len()..).unwrap_or_default(),
    };
    choice.text.push_str(added);
    choice.prefix_offset = choice.read_offset;
    choice.read_offset = tokens.len();
    Ok(())
}

/// The closing chunk choice of choice `index`: what was held back, tool calls, finish reason.
fn final_choice(
    state: &ServerState,
    shape: Shape,
    index: usize,
    choice: &Choice,
    out: &TokenOutput,
) -> Result<Value, ApiError> {
    let full = decode(state, &out.tokens)?;
    let rest = |text: &str| {
        text.strip_prefix(choice.sent.as_str())
            .unwrap_or_default()
            .to_string()
    };
    Ok(match shape {
        Shape::Completion { .. } => json!({
            "index": index,
            "text": rest(&full),
            "logprobs": Value::Null,
            "finish_reason": finish_str(out.finish),
        }),
        Shape::Chat { tools, .. } => {
            let parsed = tools.then(|| split_tool_calls(&full)).flatten();
            let (mut delta, finish) = match parsed {
                Some((head, calls)) => {
                    let turn = state.next_id.fetch_add(1, Ordering::SeqCst);
                    let calls: Vec<Value> = calls
                        .iter()
                        .enumerate()
                        .map(|(k, c)| {
                            let wire = WireToolCall::from_call(format!("call_{turn}_{k}"), c);
                            let mut v = serde_json::to_value(wire).unwrap_or(Value::Null);
                            v["index"] = json!(k);
                            v
                        })
                        .collect();
                    let mut d = json!({"tool_calls": calls});
                    let head = rest(&head);
                    if !head.is_empty() {
                        d["content"] = json!(head);
                    }
                    (d, "tool_calls")
                }
                None => {
                    let text = rest(&full);
                    let d = if text.is_empty() {
                        json!({})
                    } else {
                        json!({ "content": text })
                    };
                    (d, finish_str(out.finish))
                }
            };
            if delta.as_object().is_some_and(|d| d.is_empty()) {
                delta = json!({});
            }
            json!({
                "index": index,
                "delta": delta,
                "logprobs": Value::Null,
                "finish_reason": finish,
            })
        }
    })
}

/// Run the generations and write their chunks to `body` until done or the client is gone.
async fn drive(
    state: Arc<ServerState>,
    requests: Vec<TokenRequest>,
    n: usize,
    shape: Shape,
    include_usage: bool,
    mut body: mpsc::Sender<Bytes>,
) {
    let (prefix, object) = match shape {
        Shape::Completion { .. } => ("cmpl", "text_completion"),
        Shape::Chat { .. } => ("chatcmpl", "chat.completion.chunk"),
    };
    let envelope = Envelope {
        id: state.id(prefix),
        created: now(),
        model: state.config.model.clone(),
        object,
    };
    let mut choices: Vec<Choice> = (0..requests.len() * n).map(|_| Choice::default()).collect();
    if let Shape::Chat { .. } = shape {
        let opening = (0..choices.len())
            .map(|i| {
                json!({
                    "index": i,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": Value::Null,
                    "finish_reason": Value::Null,
                })
            })
            .collect();
        if body.send(event(&envelope.chunk(opening))).await.is_err() {
            return;
        }
    }
    let prompts: Vec<Vec<u32>> = requests.iter().map(|r| r.prompt.clone()).collect();
    let mut receivers = Vec::with_capacity(requests.len());
    let mut runs = Vec::with_capacity(requests.len());
    for (p, request) in requests.into_iter().enumerate() {
        let (sink, rx) = tokio::sync::mpsc::unbounded_channel::<StreamedToken>();
        receivers.push(
            futures::stream::unfold(rx, move |mut rx| async move {
                rx.recv().await.map(|t| ((p, t), rx))
            })
            .boxed(),
        );
        let state = &state;
        runs.push(async move { state.run_choices(request, n, Some(sink)).await });
    }
    let mut tokens = futures::stream::select_all(receivers);
    let all = futures::future::join_all(runs);
    tokio::pin!(all);
    let mut results = None;
    loop {
        tokio::select! {
            item = tokens.next() => match item {
                Some((p, t)) => {
                    let index = p * n + t.choice;
                    let Some(choice) = choices.get_mut(index) else { continue };
                    let chunk = match token_choice(&state, shape, index, choice, &prompts[p], t) {
                        Ok(c) => envelope.chunk(vec![c]),
                        Err(e) => return fail(&mut body, e).await,
                    };
                    if body.send(event(&chunk)).await.is_err() {
                        // The client is gone: returning drops the token channels, which stops
                        // the generator.
                        tracing::debug!(id = %envelope.id, "client left a stream");
                        return;
                    }
                }
                None => break,
            },
            r = &mut all, if results.is_none() => results = Some(r),
        }
    }
    let results = match results {
        Some(r) => r,
        None => all.await,
    };
    let mut closing = Vec::with_capacity(choices.len());
    let (mut prompt_total, mut completion_total) = (0, 0);
    for (p, outs) in results.into_iter().enumerate() {
        let outs = match outs {
            Ok(o) => o,
            Err(e) => return fail(&mut body, e).await,
        };
        prompt_total += prompts[p].len();
        for (i, out) in outs.iter().enumerate() {
            completion_total += out.tokens.len();
            let index = p * n + i;
            match final_choice(&state, shape, index, &choices[index], out) {
                Ok(c) => closing.push(c),
                Err(e) => return fail(&mut body, e).await,
            }
        }
    }
    for c in closing {
        if body.send(event(&envelope.chunk(vec![c]))).await.is_err() {
            return;
        }
    }
    if include_usage {
        let mut chunk = envelope.chunk(Vec::new());
        chunk["usage"] = json!(WireUsage::new(prompt_total, completion_total));
        if body.send(event(&chunk)).await.is_err() {
            return;
        }
    }
    let _ = body.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
}

/// An error after the stream started: an OpenAI-style error event, then `[DONE]`.
async fn fail(body: &mut mpsc::Sender<Bytes>, e: ApiError) {
    tracing::warn!(message = %e.message, "stream failed");
    let value = json!({"error": {
        "message": e.message,
        "type": e.kind,
        "param": e.param,
        "code": e.status.as_u16(),
    }});
    let _ = body.send(event(&value)).await;
    let _ = body.send(Bytes::from_static(b"data: [DONE]\n\n")).await;
}
