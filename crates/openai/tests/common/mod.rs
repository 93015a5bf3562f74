//! Test support: a byte-level prompt encoder, a deterministic scripted token generator, a local
//! server on 127.0.0.1 and a raw TCP server that misbehaves on purpose.

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use harness_core::{ChatMessage, FinishReason, Result, Role, ToolSpec};
use harness_openai::server::ServerHandle;
use harness_openai::{
    PromptEncoder, ServerConfig, ServerState, TokenGenerator, TokenOutput, TokenRequest,
};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// End of turn.
pub const END: u32 = 256;
/// Vocabulary: 256 bytes, END and one unused id.
pub const VOCAB: usize = 258;
/// The served model's name.
pub const MODEL: &str = "fake-model";

/// One token per byte; messages rendered as `<|role|>content\n`, tools as a `<tools>` header,
/// and the generation prompt `<|assistant|>`.
pub struct ByteEncoder;

impl PromptEncoder for ByteEncoder {
    fn encode(&self, messages: &[ChatMessage], tools: &[ToolSpec]) -> Result<Vec<u32>> {
        let mut text = String::new();
        if !tools.is_empty() {
            let names: Vec<&str> = tools.iter().map(|t| t.name.as_str()).collect();
            text.push_str(&format!("<tools>{}</tools>\n", names.join(",")));
        }
        for m in messages {
            let role = match m.role {
                Role::System => "system",
                Role::User => "user",
                Role::Assistant => "assistant",
                Role::Tool => "tool",
            };
            text.push_str(&format!("<|{role}|>{}\n", m.content));
        }
        text.push_str("<|assistant|>");
        Ok(text.bytes().map(u32::from).collect())
    }

    fn decode(&self, tokens: &[u32]) -> Result<String> {
        let bytes: Vec<u8> = tokens
            .iter()
            .filter(|t| **t < 256)
            .map(|t| *t as u8)
            .collect();
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn encode_text(&self, text: &str) -> Result<Vec<u32>> {
        Ok(text.bytes().map(u32::from).collect())
    }

    // The remembered tokens (which may end with END, a token the template does not write),
    // then the bytes of the rest of the rendering.
    fn encode_continuation(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        assistant: usize,
        prefix: &[u32],
    ) -> Result<Option<Vec<u32>>> {
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

/// A deterministic generator whose text follows the prompt like a tool-using assistant:
/// after a tool result it answers, when tools are offered it calls the first one, otherwise it
/// writes seeded random words. Log-probs are seeded too, so a different seed gives a different
/// output. Each call sleeps `delay` so that concurrency is visible.
pub struct ScriptedGenerator {
    pub delay: Duration,
    pub calls: AtomicUsize,
}

impl ScriptedGenerator {
    pub fn new(delay: Duration) -> Self {
        ScriptedGenerator {
            delay,
            calls: AtomicUsize::new(0),
        }
    }

    fn text_for(prompt: &str, rng: &mut ChaCha8Rng) -> String {
        let last_user = prompt.rfind("<|user|>");
        let last_tool = prompt.rfind("<|tool|>");
        if let Some(at) = last_tool.filter(|_| last_tool > last_user) {
            let tool_text = &prompt[at + "<|tool|>".len()..];
            let result = tool_text.lines().next().unwrap_or("");
            return format!("The answer is {result}.");
        }
        if let (Some(a), Some(b)) = (prompt.find("<tools>"), prompt.find("</tools>")) {
            let first = prompt[a + "<tools>".len()..b]
                .split(',')
                .next()
                .unwrap_or("");
            return format!(
                "<tool_call>\n{{\"name\": \"{first}\", \"arguments\": {{\"key\": \"k{}\"}}}}\n</tool_call>",
                rng.gen_range(0..100)
            );
        }
        const WORDS: [&str; 8] = [
            "alpha", "beta", "gamma", "delta", "page", "tool", "answer", "list",
        ];
        let n = rng.gen_range(3..40);
        (0..n)
            .map(|_| WORDS[rng.gen_range(0..WORDS.len())])
            .collect::<Vec<_>>()
            .join(" ")
    }
}

#[async_trait]
impl TokenGenerator for ScriptedGenerator {
    fn vocab_size(&self) -> usize {
        VOCAB
    }

    async fn generate(&self, request: TokenRequest) -> Result<TokenOutput> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        if !self.delay.is_zero() {
            tokio::time::sleep(self.delay).await;
        }
        let prompt: Vec<u8> = request
            .prompt
            .iter()
            .filter(|t| **t < 256)
            .map(|t| *t as u8)
            .collect();
        let prompt = String::from_utf8_lossy(&prompt).into_owned();
        let mut rng = ChaCha8Rng::seed_from_u64(request.seed ^ (prompt.len() as u64) << 32);
        let text = Self::text_for(&prompt, &mut rng);
        let mut tokens: Vec<u32> = text.bytes().map(u32::from).collect();
        let mut finish = FinishReason::Stop;
        // Stop strings end generation after the string (kept in the output).
        if let Some(end) = request
            .sampling
            .stop
            .iter()
            .filter_map(|s| text.find(s.as_str()).map(|i| i + s.len()))
            .min()
        {
            tokens.truncate(end);
        } else {
            tokens.push(END);
        }
        if tokens.len() > request.max_new_tokens {
            tokens.truncate(request.max_new_tokens);
            finish = FinishReason::Length;
        }
        let t = request.sampling.temperature.max(0.05);
        let logprobs = tokens
            .iter()
            .map(|_| -(rng.r#gen::<f32>() * 3.0 / t) - 1e-3)
            .collect();
        Ok(TokenOutput {
            tokens,
            logprobs,
            finish,
        })
    }
}

/// An engine-like generator that decodes one token per `token_delay` for all the choices of a
/// request together (seeded lowercase words up to `max_new_tokens`, then END), streams each
/// token as it is drawn and stops as soon as its sink is closed. It counts the tokens it
/// decoded and whether it saw a closed sink.
pub struct PacedGenerator {
    pub token_delay: Duration,
    pub decoded: AtomicUsize,
    pub cancelled: std::sync::atomic::AtomicBool,
}

impl PacedGenerator {
    pub fn new(token_delay: Duration) -> Self {
        PacedGenerator {
            token_delay,
            decoded: AtomicUsize::new(0),
            cancelled: Default::default(),
        }
    }

    /// The whole output of one choice: `words` seeded words, then END, cut at the limit.
    fn script(request: &TokenRequest, words: usize) -> TokenOutput {
        let mut rng = ChaCha8Rng::seed_from_u64(request.seed);
        let mut tokens = Vec::new();
        for w in 0..words {
            if w > 0 {
                tokens.push(u32::from(b' '));
            }
            let len = rng.gen_range(1..7);
            tokens.extend((0..len).map(|_| u32::from(b'a') + rng.gen_range(0..26)));
        }
        tokens.push(END);
        let finish = if tokens.len() > request.max_new_tokens {
            tokens.truncate(request.max_new_tokens);
            FinishReason::Length
        } else {
            FinishReason::Stop
        };
        let logprobs = tokens.iter().map(|_| -rng.r#gen::<f32>() * 4.0).collect();
        TokenOutput {
            tokens,
            logprobs,
            finish,
        }
    }
}

#[async_trait]
impl TokenGenerator for PacedGenerator {
    fn vocab_size(&self) -> usize {
        VOCAB
    }

    async fn generate(&self, request: TokenRequest) -> Result<TokenOutput> {
        Ok(self.generate_choices(request, 1, None).await?.remove(0))
    }

    async fn generate_choices(
        &self,
        request: TokenRequest,
        n: usize,
        sink: Option<harness_openai::TokenSink>,
    ) -> Result<Vec<TokenOutput>> {
        // Long enough that a stream is still running when a test's client leaves.
        let words = request.max_new_tokens;
        let full: Vec<TokenOutput> = (0..n)
            .map(|i| {
                let seed = harness_openai::choice_seed(request.seed, i);
                Self::script(
                    &TokenRequest {
                        seed,
                        ..request.clone()
                    },
                    words,
                )
            })
            .collect();
        let mut outs: Vec<TokenOutput> = full
            .iter()
            .map(|f| TokenOutput {
                tokens: Vec::new(),
                logprobs: Vec::new(),
                finish: f.finish,
            })
            .collect();
        let longest = full.iter().map(|f| f.tokens.len()).max().unwrap_or(0);
        for step in 0..longest {
            if !self.token_delay.is_zero() {
                tokio::time::sleep(self.token_delay).await;
            }
            for (choice, f) in full.iter().enumerate() {
                let Some(&token) = f.tokens.get(step) else {
                    continue;
                };
                let logprob = f.logprobs[step];
                self.decoded.fetch_add(1, Ordering::SeqCst);
                outs[choice].tokens.push(token);
                outs[choice].logprobs.push(logprob);
                if let Some(sink) = &sink {
                    let sent = sink.send(harness_openai::StreamedToken {
                        choice,
                        token,
                        logprob,
                    });
                    if sent.is_err() {
                        self.cancelled.store(true, Ordering::SeqCst);
                        for o in &mut outs {
                            o.finish = FinishReason::Length;
                        }
                        return Ok(outs);
                    }
                }
            }
        }
        Ok(outs)
    }
}

/// The `data:` payloads of a server-sent event stream, in order.
pub fn sse_events(body: &str) -> Vec<String> {
    body.split("\n\n")
        .filter_map(|e| e.trim().strip_prefix("data: ").map(str::to_string))
        .collect()
}

/// A server for `generator` on 127.0.0.1 with a free port.
pub async fn start_server(
    generator: Arc<dyn TokenGenerator>,
    max_model_len: usize,
) -> (ServerHandle, Arc<ServerState>) {
    let state = Arc::new(ServerState::new(
        ServerConfig::new(MODEL, max_model_len),
        Arc::new(ByteEncoder),
        generator,
    ));
    let handle = ServerHandle::spawn(loopback(), state.clone())
        .await
        .expect("bind 127.0.0.1");
    (handle, state)
}

pub fn loopback() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 0))
}

/// What the fault server does with the n-th request.
#[derive(Debug, Clone)]
pub enum Fault {
    /// Answer with this status, extra headers and body.
    Reply(u16, Vec<(String, String)>, String),
    /// Announce a long body, send a piece of it and close the connection.
    CloseMidBody,
    /// Close the connection without answering.
    CloseBeforeAnswer,
    /// Hold the connection without answering for this long.
    Stall(Duration),
}

/// A raw HTTP/1.1 server on 127.0.0.1 that plays `script` (the last entry repeats) and counts
/// requests and their bodies. It stops when dropped.
pub struct FaultServer {
    pub addr: SocketAddr,
    pub requests: Arc<std::sync::Mutex<Vec<String>>>,
    /// The lower-cased request heads, in order.
    pub heads: Arc<std::sync::Mutex<Vec<String>>>,
    task: JoinHandle<()>,
}

impl FaultServer {
    pub async fn start(script: Vec<Fault>) -> Self {
        let listener = TcpListener::bind(loopback()).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen = requests.clone();
        let heads = Arc::new(std::sync::Mutex::new(Vec::new()));
        let seen_heads = heads.clone();
        let task = tokio::spawn(async move {
            // Bounded: a test never sends more than a few dozen requests.
            for _ in 0..64 {
                let Ok((mut sock, _)) = listener.accept().await else {
                    return;
                };
                let seen = seen.clone();
                let seen_heads = seen_heads.clone();
                let script = script.clone();
                tokio::spawn(async move {
                    // Keep-alive: serve several requests on one connection.
                    loop {
                        let Some((head, body)) = read_request(&mut sock).await else {
                            return;
                        };
                        seen_heads.lock().unwrap().push(head);
                        let n = {
                            let mut s = seen.lock().unwrap();
                            s.push(body);
                            s.len() - 1
                        };
                        let fault = script[n.min(script.len() - 1)].clone();
                        match fault {
                            Fault::Reply(status, headers, body) => {
                                let mut head = format!(
                                    "HTTP/1.1 {status} X\r\ncontent-type: application/json\r\ncontent-length: {}\r\n",
                                    body.len()
                                );
                                for (k, v) in headers {
                                    head.push_str(&format!("{k}: {v}\r\n"));
                                }
                                head.push_str("\r\n");
                                if sock.write_all(head.as_bytes()).await.is_err()
                                    || sock.write_all(body.as_bytes()).await.is_err()
                                {
                                    return;
                                }
                            }
                            Fault::CloseMidBody => {
                                let _ = sock
                                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 4000\r\n\r\n{\"choices\": [{\"mess")
                                    .await;
                                return;
                            }
                            Fault::CloseBeforeAnswer => return,
                            Fault::Stall(d) => {
                                tokio::time::sleep(d).await;
                                return;
                            }
                        }
                    }
                });
            }
        });
        FaultServer {
            addr,
            requests,
            heads,
            task,
        }
    }

    pub fn base_url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
}

impl Drop for FaultServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Read one request (head and content-length body); `None` when the peer closed.
async fn read_request(sock: &mut tokio::net::TcpStream) -> Option<(String, String)> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let header_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..header_end]).to_lowercase();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    while buf.len() < header_end + len {
        let n = sock.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&buf[header_end..header_end + len]).into_owned();
    Some((head, body))
}
