//! The recording proxy in front of a sampling policy (harness-openai's `EncodedPolicy` over a
//! byte-level chat template and a seeded random generator that logs what it sampled):
//! recorded tokens and log-probs are the sampled ones, a program that keeps its history intact
//! passes the prefix check, one that rewrites history is counted (and masked by setting),
//! streaming and tool calls work through it, and limits and keys hold.

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use harness_core::{
    ChatMessage, FinishReason, HarnessId, Limits, Outcome, Role, SamplingParams, Source,
    Termination, ToolSpec,
};
use harness_external::proxy::{
    EpisodeEnd, EpisodeSpec, PrefixPolicy, ProxyConfig, ProxyHandle, RecordingProxy,
};
use harness_openai::{EncodedPolicy, PromptEncoder, TokenGenerator, TokenOutput, TokenRequest};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};

const END: u32 = 256;

/// One token per byte; `<|role|>content\n` per message, a `<tools>` header, `<|assistant|>`.
struct ByteTemplate;

impl PromptEncoder for ByteTemplate {
    fn encode(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
    ) -> harness_core::Result<Vec<u32>> {
        let mut text = String::new();
        if !tools.is_empty() {
            let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
            text.push_str(&format!("<tools>{}</tools>\n", names.join(",")));
        }
        for m in messages {
            let role = format!("{:?}", m.role).to_lowercase();
            text.push_str(&format!("<|{role}|>{}\n", m.content));
        }
        text.push_str("<|assistant|>");
        Ok(text.bytes().map(u32::from).collect())
    }

    fn decode(&self, tokens: &[u32]) -> harness_core::Result<String> {
        let bytes: Vec<u8> = tokens
            .iter()
            .filter(|t| **t < 256)
            .map(|t| *t as u8)
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn encode_continuation(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        assistant: usize,
        prefix: &[u32],
    ) -> harness_core::Result<Option<Vec<u32>>> {
        let full = self.decode(&self.encode(messages, tools)?)?;
        let mut head = self.decode(&self.encode(&messages[..assistant], tools)?)?;
        head.push_str(&messages[assistant].content);
        Ok(full.strip_prefix(head.as_str()).map(|rest| {
            let mut tokens = prefix.to_vec();
            tokens.extend(rest.bytes().map(u32::from));
            tokens
        }))
    }
}

/// What the generator sampled for one call.
#[derive(Debug, Clone)]
struct Sampled {
    prompt: Vec<u32>,
    out: TokenOutput,
    request: TokenRequest,
}

/// A seeded random "model": some thinking words, then a `lookup` call while no tool result is
/// in the prompt, else an answer. Every output (an end token included) and random log-probs
/// are logged.
#[derive(Default)]
struct SpyGenerator {
    log: Mutex<Vec<Sampled>>,
}

#[async_trait]
impl TokenGenerator for SpyGenerator {
    fn vocab_size(&self) -> usize {
        258
    }

    async fn generate(&self, request: TokenRequest) -> harness_core::Result<TokenOutput> {
        let prompt: Vec<u8> = request
            .prompt
            .iter()
            .filter(|t| **t < 256)
            .map(|t| *t as u8)
            .collect();
        let prompt_text = String::from_utf8_lossy(&prompt).into_owned();
        let mut rng = ChaCha8Rng::seed_from_u64(request.seed);
        const WORDS: [&str; 6] = ["hmm", "table", "rows", "so", "check", "ok"];
        let thinking: Vec<&str> = (0..rng.gen_range(2..6))
            .map(|_| WORDS[rng.gen_range(0..WORDS.len())])
            .collect();
        let text = if prompt_text.contains("<|tool|>") {
            format!(
                "Thinking: {}. The answer is {}.",
                thinking.join(" "),
                rng.gen_range(0..1000)
            )
        } else {
            format!(
                "Thinking: {}.\n<tool_call>\n{{\"name\": \"lookup\", \"arguments\": {{\"key\": \"k{}\", \"page\": {}}}}}\n</tool_call>",
                thinking.join(" "),
                rng.gen_range(0..100),
                rng.gen_range(1..9)
            )
        };
        let mut tokens: Vec<u32> = text.bytes().map(u32::from).collect();
        tokens.push(END);
        let mut finish = FinishReason::Stop;
        if tokens.len() > request.max_new_tokens {
            tokens.truncate(request.max_new_tokens);
            finish = FinishReason::Length;
        }
        let logprobs = tokens
            .iter()
            .map(|_| -rng.r#gen::<f32>() * 4.0 - 1e-3)
            .collect();
        let out = TokenOutput {
            tokens,
            logprobs,
            finish,
        };
        self.log.lock().unwrap().push(Sampled {
            prompt: request.prompt.clone(),
            out: out.clone(),
            request,
        });
        Ok(out)
    }
}

struct Rig {
    handle: ProxyHandle,
    spy: Arc<SpyGenerator>,
    http: reqwest::Client,
}

async fn rig(config: ProxyConfig) -> Rig {
    let spy = Arc::new(SpyGenerator::default());
    let policy = EncodedPolicy::new("spy", Arc::new(ByteTemplate), spy.clone());
    let proxy = RecordingProxy::new(Arc::new(policy), config).unwrap();
    let handle = ProxyHandle::spawn("127.0.0.1:0".parse().unwrap(), proxy)
        .await
        .unwrap();
    Rig {
        handle,
        spy,
        http: harness_openai::http_client(),
    }
}

fn spec(seed: u64) -> EpisodeSpec {
    EpisodeSpec {
        task_id: "task-1".into(),
        seed,
        limits: Limits::default(),
        sampling: None,
    }
}

impl Rig {
    fn proxy(&self) -> &Arc<RecordingProxy> {
        self.handle.proxy()
    }

    async fn post(&self, key: &str, body: Value) -> (u16, String) {
        let response = self
            .http
            .post(format!("{}/chat/completions", self.handle.base_url()))
            .bearer_auth(key)
            .json(&body)
            .send()
            .await
            .unwrap();
        (response.status().as_u16(), response.text().await.unwrap())
    }

    async fn chat(&self, key: &str, body: Value) -> Value {
        let (status, text) = self.post(key, body).await;
        assert_eq!(status, 200, "{text}");
        serde_json::from_str(&text).unwrap()
    }
}

fn tools() -> Value {
    json!([{
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a key up.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}, "page": {"type": "integer"}}, "required": ["key"]}
        }
    }])
}

fn opening() -> Vec<Value> {
    vec![
        json!({"role": "system", "content": "You look things up."}),
        json!({"role": "user", "content": "What is under k?"}),
    ]
}

/// How a client sends a tool-calling reply back.
#[derive(Clone, Copy)]
enum Client {
    /// As received, with the arguments re-serialised the way Python's json.dumps writes them.
    Faithful,
    /// Without the reasoning text before the call (what many chat templates and agent
    /// frameworks do to history).
    DropsReasoning,
}

/// A two-turn tool-using episode; returns the two answers.
async fn episode(rig: &Rig, key: &str, client: Client, stream_second: bool) -> (Value, Value) {
    let mut messages = opening();
    let first = rig
        .chat(
            key,
            json!({"model": "any", "messages": messages, "tools": tools(), "temperature": 0.7, "logprobs": true}),
        )
        .await;
    let message = &first["choices"][0]["message"];
    assert_eq!(
        first["choices"][0]["finish_reason"], "tool_calls",
        "{first}"
    );
    let call = &message["tool_calls"][0];
    assert_eq!(call["function"]["name"], "lookup");
    let args: Value =
        serde_json::from_str(call["function"]["arguments"].as_str().unwrap()).unwrap();
    // Python's json.dumps layout: spaces after separators, keys as the program keeps them.
    let python_args = format!(
        "{{\"page\": {}, \"key\": \"{}\"}}",
        args["page"],
        args["key"].as_str().unwrap()
    );
    let content = match client {
        Client::Faithful => message["content"].clone(),
        Client::DropsReasoning => Value::Null,
    };
    messages.push(json!({
        "role": "assistant",
        "content": content,
        "tool_calls": [{"id": call["id"], "type": "function", "function": {"name": "lookup", "arguments": python_args}}]
    }));
    messages.push(json!({"role": "tool", "tool_call_id": call["id"], "content": "value-42"}));
    let body = json!({
        "model": "any", "messages": messages, "tools": tools(), "temperature": 0.7,
        "logprobs": true, "stream": stream_second, "stream_options": {"include_usage": true}
    });
    let second = if stream_second {
        let (status, text) = rig.post(key, body).await;
        assert_eq!(status, 200, "{text}");
        collect_stream(&text)
    } else {
        rig.chat(key, body).await
    };
    (first, second)
}

/// Fold a chat-completion event stream into the shape of a whole answer.
fn collect_stream(body: &str) -> Value {
    let events: Vec<&str> = body
        .split("\n\n")
        .filter_map(|e| e.strip_prefix("data: "))
        .collect();
    assert_eq!(events.last(), Some(&"[DONE]"), "{body}");
    let mut content = String::new();
    let mut calls: Vec<Value> = Vec::new();
    let mut logprobs: Vec<Value> = Vec::new();
    let mut finish = Value::Null;
    let mut usage = Value::Null;
    let mut role = Value::Null;
    for event in &events[..events.len() - 1] {
        let chunk: Value = serde_json::from_str(event).unwrap();
        assert_eq!(chunk["object"], "chat.completion.chunk");
        if !chunk["usage"].is_null() {
            usage = chunk["usage"].clone();
        }
        for choice in chunk["choices"].as_array().unwrap() {
            let delta = &choice["delta"];
            if !delta["role"].is_null() {
                role = delta["role"].clone();
            }
            content.push_str(delta["content"].as_str().unwrap_or(""));
            calls.extend(delta["tool_calls"].as_array().cloned().unwrap_or_default());
            if let Some(lp) = choice["logprobs"]["content"].as_array() {
                logprobs.extend(lp.iter().cloned());
            }
            if !choice["finish_reason"].is_null() {
                finish = choice["finish_reason"].clone();
            }
        }
    }
    json!({
        "choices": [{"message": {"role": role, "content": content, "tool_calls": calls},
                     "finish_reason": finish, "logprobs": {"content": logprobs}}],
        "usage": usage
    })
}

fn answered_logprobs(answer: &Value) -> Vec<(u32, f32)> {
    answer["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let id = e["token"]
                .as_str()
                .unwrap()
                .strip_prefix("token_id:")
                .unwrap();
            (id.parse().unwrap(), e["logprob"].as_f64().unwrap() as f32)
        })
        .collect()
}

fn end() -> EpisodeEnd {
    EpisodeEnd {
        env: "lookup-world".into(),
        harness_id: HarnessId("external-0000000".into()),
        harness_name: "my-agent".into(),
        policy: "spy".into(),
        outcome: Outcome::success(json!({"checked": true})),
        termination: Termination::EnvDone,
        final_answer: None,
        env_actions: 1,
        tool_errors: 0,
    }
}

#[tokio::test]
async fn recorded_tokens_and_logprobs_are_what_the_policy_sampled() {
    let rig = rig(ProxyConfig::new("policy")).await;
    let key = rig.proxy().open_episode(spec(9)).unwrap();
    let (first, second) = episode(&rig, &key, Client::Faithful, false).await;
    let record = rig.proxy().close_episode(&key).unwrap();
    let sampled = rig.spy.log.lock().unwrap().clone();
    assert_eq!(sampled.len(), 2);
    assert_eq!(record.turns.len(), 2);
    for (turn, s) in record.turns.iter().zip(&sampled) {
        assert_eq!(turn.context_tokens, s.prompt);
        assert_eq!(turn.tokens, s.out.tokens);
        assert_eq!(turn.logprobs, s.out.logprobs);
        let sampling = turn.sampling.unwrap();
        assert_eq!(sampling.temperature, 0.7);
        assert_eq!(sampling.top_p, 1.0);
        assert!(!sampling.greedy);
        assert_eq!(s.request.sampling.temperature, 0.7);
    }
    // The call seeds derive from the episode seed, not from the client.
    assert_eq!(sampled[0].request.seed, harness_core::call_seed(9, 0));
    assert_eq!(sampled[1].request.seed, harness_core::call_seed(9, 1));
    // What the client was told is what was sampled.
    for (answer, s) in [(&first, &sampled[0]), (&second, &sampled[1])] {
        let pairs: Vec<(u32, f32)> = s
            .out
            .tokens
            .iter()
            .copied()
            .zip(s.out.logprobs.iter().copied())
            .collect();
        assert_eq!(answered_logprobs(answer), pairs);
        assert_eq!(answer["usage"]["completion_tokens"], s.out.tokens.len());
        assert_eq!(answer["usage"]["prompt_tokens"], s.prompt.len());
    }
    assert_eq!(
        second["choices"][0]["message"]["content"].as_str().unwrap(),
        ByteTemplate.decode(&sampled[1].out.tokens).unwrap()
    );
    // The second prompt is the first one's context + completion (its end token included),
    // then the tool result: the Python-style JSON of the arguments did not break it.
    assert_eq!(record.prefix_breaks, 0, "{:?}", record.extends_previous);
    let mut prefix = sampled[0].prompt.clone();
    prefix.extend(&sampled[0].out.tokens);
    assert!(sampled[1].prompt.starts_with(&prefix));

    // The trajectory: the recorded turns, the messages with their sources.
    let trajectory = record.into_trajectory(end());
    let roles: Vec<(Role, Source)> = trajectory
        .messages
        .iter()
        .map(|m| (m.role, m.source))
        .collect();
    assert_eq!(
        roles,
        vec![
            (Role::System, Source::Harness),
            (Role::User, Source::Task),
            (Role::Assistant, Source::Policy),
            (Role::Tool, Source::Environment),
            (Role::Assistant, Source::Policy),
        ]
    );
    assert_eq!(trajectory.turns[0].message_index, Some(2));
    assert_eq!(trajectory.turns[1].message_index, Some(4));
    assert_eq!(trajectory.turns[1].tokens, sampled[1].out.tokens);
    assert_eq!(trajectory.counts.model_calls, 2);
    assert_eq!(trajectory.seed, 9);
    assert!(trajectory.is_success());
    let stats = rig.proxy().stats();
    assert_eq!(
        (stats.turns, stats.prefix_breaks, stats.episodes_with_breaks),
        (2, 0, 0)
    );
}

#[tokio::test]
async fn a_client_that_rewrites_history_is_counted() {
    let rig = rig(ProxyConfig::new("policy")).await;
    let key = rig.proxy().open_episode(spec(3)).unwrap();
    episode(&rig, &key, Client::DropsReasoning, false).await;
    let record = rig.proxy().close_episode(&key).unwrap();
    assert_eq!(record.extends_previous, vec![true, false]);
    assert_eq!(record.prefix_breaks, 1);
    assert!(!record.masked());
    // The turn keeps its own context: exactly the prompt the policy sampled from.
    let sampled = rig.spy.log.lock().unwrap().clone();
    assert_eq!(record.turns[1].context_tokens, sampled[1].prompt);
    assert_eq!(record.turns[1].tokens, sampled[1].out.tokens);
    // The transcript says the program rewrote the conversation; the program's text in the
    // assistant's place is never a policy message.
    assert!(
        record
            .messages
            .iter()
            .any(|m| m.content.contains("rewrote the conversation"))
    );
    let program_reply = record
        .messages
        .iter()
        .filter(|m| m.role == Role::Assistant)
        .find(|m| !m.content.starts_with("Thinking"))
        .expect("the rewritten reply is recorded");
    assert_eq!(program_reply.source, Source::Harness);
    let trajectory = record.into_trajectory(end());
    assert_eq!(
        trajectory.turns[1].tokens, sampled[1].out.tokens,
        "kept in its own context"
    );
    let stats = rig.proxy().stats();
    assert_eq!(
        (
            stats.prefix_breaks,
            stats.episodes_with_breaks,
            stats.masked_episodes
        ),
        (1, 1, 0)
    );

    // By setting, such an episode is masked out of the loss but keeps its reward.
    let rig = rig_masked().await;
    let key = rig.proxy().open_episode(spec(3)).unwrap();
    episode(&rig, &key, Client::DropsReasoning, false).await;
    let record = rig.proxy().close_episode(&key).unwrap();
    assert!(record.masked());
    let trajectory = record.into_trajectory(end());
    assert!(
        trajectory
            .turns
            .iter()
            .all(|t| t.tokens.is_empty() && t.logprobs.is_empty())
    );
    assert_eq!(trajectory.reward(), 1.0);
    assert_eq!(rig.proxy().stats().masked_episodes, 1);
    // A faithful client under the same setting is not masked.
    let key = rig.proxy().open_episode(spec(3)).unwrap();
    episode(&rig, &key, Client::Faithful, false).await;
    assert!(!rig.proxy().close_episode(&key).unwrap().masked());
}

async fn rig_masked() -> Rig {
    rig(ProxyConfig {
        prefix_policy: PrefixPolicy::MaskEpisode,
        ..ProxyConfig::new("policy")
    })
    .await
}

#[tokio::test]
async fn streaming_and_tool_calls_work_through_the_proxy() {
    // The same episode seed, once whole and once with the second turn streamed: the same
    // tokens are sampled, and the stream carries the same content, calls and log-probs.
    let rig = rig(ProxyConfig::new("policy")).await;
    let key = rig.proxy().open_episode(spec(5)).unwrap();
    let (_, whole) = episode(&rig, &key, Client::Faithful, false).await;
    let whole_record = rig.proxy().close_episode(&key).unwrap();
    let key = rig.proxy().open_episode(spec(5)).unwrap();
    let (_, streamed) = episode(&rig, &key, Client::Faithful, true).await;
    let streamed_record = rig.proxy().close_episode(&key).unwrap();
    assert_eq!(whole_record.turns, streamed_record.turns);
    assert_eq!(streamed["choices"][0]["message"]["role"], "assistant");
    assert_eq!(
        streamed["choices"][0]["message"]["content"],
        whole["choices"][0]["message"]["content"]
    );
    assert_eq!(
        streamed["choices"][0]["finish_reason"],
        whole["choices"][0]["finish_reason"]
    );
    assert_eq!(answered_logprobs(&streamed), answered_logprobs(&whole));
    assert_eq!(streamed["usage"], whole["usage"]);

    // A streamed tool call arrives as a `tool_calls` delta.
    let key = rig.proxy().open_episode(spec(6)).unwrap();
    let (status, text) = rig
        .post(
            &key,
            json!({"model": "m", "messages": opening(), "tools": tools(), "stream": true}),
        )
        .await;
    assert_eq!(status, 200);
    let folded = collect_stream(&text);
    let calls = folded["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap()
        .clone();
    assert_eq!(calls.len(), 1, "{text}");
    assert_eq!(calls[0]["function"]["name"], "lookup");
    assert_eq!(calls[0]["index"], 0);
    assert_eq!(folded["choices"][0]["finish_reason"], "tool_calls");
    let record = rig.proxy().close_episode(&key).unwrap();
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert!(
        record
            .messages
            .last()
            .unwrap()
            .content
            .contains(args["key"].as_str().unwrap())
    );

    // With tool_choice "none" the call stays text.
    let key = rig.proxy().open_episode(spec(6)).unwrap();
    let answer = rig
        .chat(
            &key,
            json!({"model": "m", "messages": opening(), "tools": tools(), "tool_choice": "none"}),
        )
        .await;
    assert!(
        answer["choices"][0]["message"]["tool_calls"]
            .as_array()
            .is_none_or(|c| c.is_empty())
    );
    assert!(
        answer["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .contains("<tool_call>")
    );
}

#[tokio::test]
async fn keys_limits_and_bad_requests() {
    let rig = rig(ProxyConfig::new("policy")).await;
    let limits = Limits {
        max_model_calls: 2,
        max_output_tokens: 12,
        max_context_tokens: 400,
        ..Limits::default()
    };
    let key = rig
        .proxy()
        .open_episode(EpisodeSpec {
            task_id: "t".into(),
            seed: 1,
            limits,
            sampling: None,
        })
        .unwrap();
    let other = rig.proxy().open_episode(spec(1)).unwrap();
    let body = json!({"model": "m", "messages": opening(), "max_tokens": 500});

    let (status, text) = rig.post("hs-episode-not-a-key", body.clone()).await;
    assert_eq!(status, 401, "{text}");
    assert!(text.contains("HARNESS_PROXY_KEY"), "{text}");

    // Output is capped by the episode's limit.
    let answer = rig.chat(&key, body.clone()).await;
    assert_eq!(answer["choices"][0]["finish_reason"], "length");
    assert_eq!(rig.spy.log.lock().unwrap()[0].request.max_new_tokens, 12);

    // A prompt over the context limit: 400, recorded without tokens.
    let long = json!({"model": "m", "messages": [{"role": "user", "content": "x".repeat(500)}]});
    let (status, text) = rig.post(&key, long).await;
    assert_eq!(status, 400, "{text}");
    assert!(text.contains("context_length_exceeded"), "{text}");

    // The third call is over the model-call limit.
    let (status, text) = rig.post(&key, body.clone()).await;
    assert_eq!(status, 429, "{text}");
    assert!(text.contains("limit of 2 model calls"), "{text}");

    // Malformed requests name the field.
    for (bad, needle) in [
        (
            json!({"model": "m", "messages": opening(), "temperature": "hot"}),
            "temperature",
        ),
        (json!({"model": "m", "messages": opening(), "n": 2}), "`n`"),
        (json!({"model": "m", "messages": []}), "`messages`"),
        (
            json!({"model": "m", "messages": [{"role": "robot", "content": "hi"}]}),
            "messages[0].role",
        ),
        (
            json!({"model": "m", "messages": opening(), "top_p": 0}),
            "`top_p`",
        ),
    ] {
        let (status, text) = rig.post(&other, bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {text}");
        assert!(text.contains(needle), "{bad}: {text}");
    }

    let record = rig.proxy().close_episode(&key).unwrap();
    assert_eq!(record.turns.len(), 2);
    assert_eq!(record.turns[1].message_index, None);
    assert_eq!(record.turns[1].finish, FinishReason::ContextOverflow);
    assert!(record.turns[1].tokens.is_empty());
    assert_eq!(record.refused_calls, 1);
    let other_record = rig.proxy().close_episode(&other).unwrap();
    assert!(
        other_record.turns.is_empty(),
        "refused calls record no turn"
    );
    assert_eq!(other_record.refused_calls, 5);
    // A closed key is refused.
    let (status, _) = rig.post(&key, body).await;
    assert_eq!(status, 401);
    assert!(rig.proxy().close_episode(&key).is_err());
}

#[tokio::test]
async fn concurrent_episodes_record_apart_and_pinned_sampling_wins() {
    let rig = rig(ProxyConfig {
        sampling: Some(SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        }),
        ..ProxyConfig::new("policy")
    })
    .await;
    let keys: Vec<String> = (0..6)
        .map(|i| rig.proxy().open_episode(spec(100 + i)).unwrap())
        .collect();
    let answers = futures::future::join_all(
        keys.iter()
            .map(|k| episode(&rig, k, Client::Faithful, false)),
    )
    .await;
    assert_eq!(answers.len(), 6);
    let sampled = rig.spy.log.lock().unwrap().clone();
    for (i, key) in keys.iter().enumerate() {
        let record = rig.proxy().close_episode(key).unwrap();
        assert_eq!(record.turns.len(), 2);
        assert_eq!(record.prefix_breaks, 0);
        for (k, turn) in record.turns.iter().enumerate() {
            let seed = harness_core::call_seed(100 + i as u64, k as u32);
            let s = sampled
                .iter()
                .find(|s| s.request.seed == seed)
                .expect("sampled");
            assert_eq!(turn.tokens, s.out.tokens);
            assert_eq!(turn.context_tokens, s.prompt);
            // The client asked for 0.7; the proxy pinned 1.0 and recorded it.
            assert_eq!(turn.sampling.unwrap().temperature, 1.0);
            assert_eq!(s.request.sampling.temperature, 1.0);
        }
    }
    assert_eq!(rig.proxy().open_episodes(), 0);
}

#[test]
fn bad_configurations_name_the_field() {
    let policy: Arc<dyn harness_core::Policy> = Arc::new(EncodedPolicy::new(
        "spy",
        Arc::new(ByteTemplate),
        Arc::new(SpyGenerator::default()),
    ));
    for (config, field) in [
        (ProxyConfig::new(" "), "model"),
        (
            ProxyConfig {
                max_episodes: 0,
                ..ProxyConfig::new("m")
            },
            "max_episodes",
        ),
        (
            ProxyConfig {
                max_requests_per_episode: 0,
                ..ProxyConfig::new("m")
            },
            "max_requests_per_episode",
        ),
        (
            ProxyConfig {
                request_timeout: std::time::Duration::ZERO,
                ..ProxyConfig::new("m")
            },
            "request_timeout",
        ),
        (
            ProxyConfig {
                sampling: Some(SamplingParams {
                    top_p: 1.5,
                    ..SamplingParams::default()
                }),
                ..ProxyConfig::new("m")
            },
            "sampling.top_p",
        ),
    ] {
        let err = RecordingProxy::new(policy.clone(), config)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains(field), "{err}");
    }
    let proxy = RecordingProxy::new(policy, ProxyConfig::new("m")).unwrap();
    let err = proxy
        .open_episode(EpisodeSpec {
            task_id: "t".into(),
            seed: 0,
            limits: Limits {
                max_model_calls: 0,
                ..Limits::default()
            },
            sampling: None,
        })
        .unwrap_err()
        .to_string();
    assert!(err.contains("limits.max_model_calls"), "{err}");
}
