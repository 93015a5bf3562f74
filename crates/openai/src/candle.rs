//! grpo-candle behind this crate's token-level seams (feature `candle`): the checkpoint's chat
//! template and tokenizer as a [`PromptEncoder`] (so a vLLM or SGLang engine gets exactly the
//! prompt ids the trainer scores), its batched sampler as a [`TokenGenerator`], and weight
//! reloading as a [`WeightLoader`] (so the local server can stand in for an engine).

use std::path::Path;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use crate::{PromptEncoder, TokenGenerator, TokenOutput, TokenRequest, WeightLoader};
use async_trait::async_trait;
use candle_core::DType;
use grpo_candle::sampler::{self, Sample, SampleRequest};
use grpo_candle::{PolicyModel, tokenizer};
use harness_core::{ChatMessage, ToolSpec};

fn core(e: grpo_candle::Error) -> harness_core::Error {
    harness_core::Error::Policy {
        policy: "candle".into(),
        message: e.to_string(),
    }
}

/// The checkpoint's chat template and tokenizer.
pub struct CandleEncoder {
    model: PolicyModel,
}

impl CandleEncoder {
    /// The encoder of `model`.
    pub fn new(model: PolicyModel) -> Self {
        CandleEncoder { model }
    }
}

impl PromptEncoder for CandleEncoder {
    fn encode(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
    ) -> harness_core::Result<Vec<u32>> {
        let text = self.model.template.render(messages, tools, true);
        tokenizer::encode(&self.model.tokenizer, &text).map_err(core)
    }

    fn decode(&self, tokens: &[u32]) -> harness_core::Result<String> {
        tokenizer::decode(&self.model.tokenizer, tokens, true).map_err(core)
    }

    fn encode_text(&self, text: &str) -> harness_core::Result<Vec<u32>> {
        tokenizer::encode(&self.model.tokenizer, text).map_err(core)
    }

    // As `CandlePolicy` does: the remembered turn's exact tokens, then the tokenized rest of the
    // rendered conversation (the template writes `<|im_end|>` after the assistant content, which
    // the generated tokens already end with).
    fn encode_continuation(
        &self,
        messages: &[ChatMessage],
        tools: &[ToolSpec],
        assistant: usize,
        prefix: &[u32],
    ) -> harness_core::Result<Option<Vec<u32>>> {
        let template = &self.model.template;
        let text = template.render(messages, tools, true);
        let mut head = template.render(&messages[..assistant], tools, true);
        head.push_str(&messages[assistant].content);
        let Some(mut rest) = text.strip_prefix(head.as_str()) else {
            return Ok(None);
        };
        let im_end = self.model.tokenizer.token_to_id(tokenizer::IM_END);
        match prefix.last() {
            Some(&last) if Some(last) == im_end => match rest.strip_prefix(tokenizer::IM_END) {
                Some(r) => rest = r,
                None => return Ok(None),
            },
            Some(last) if self.model.stop_token_ids.contains(last) => return Ok(None),
            _ => {}
        }
        let mut tokens = prefix.to_vec();
        tokens.extend(tokenizer::encode(&self.model.tokenizer, rest).map_err(core)?);
        Ok(Some(tokens))
    }
}

struct Job {
    request: SampleRequest,
    reply: tokio::sync::oneshot::Sender<grpo_candle::Result<Sample>>,
}

/// grpo-candle's sampler on one decoding thread that drains every waiting request into one
/// batch (up to `max_batch`), like `CandlePolicy`: concurrent HTTP requests share forward passes.
pub struct CandleGenerator {
    model: PolicyModel,
    weights: Arc<RwLock<()>>,
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl CandleGenerator {
    /// Start the decoding thread.
    pub fn new(model: PolicyModel, max_batch: usize) -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let weights = Arc::new(RwLock::new(()));
        let (m, w) = (model.clone(), weights.clone());
        let worker = std::thread::Builder::new()
            .name("candle-generator".into())
            .spawn(move || {
                while let Ok(first) = rx.recv() {
                    let mut jobs = vec![first];
                    while jobs.len() < max_batch.max(1) {
                        match rx.try_recv() {
                            Ok(job) => jobs.push(job),
                            Err(_) => break,
                        }
                    }
                    let requests: Vec<SampleRequest> =
                        jobs.iter().map(|j| j.request.clone()).collect();
                    let result = {
                        let _read = w.read().unwrap_or_else(|e| e.into_inner());
                        sampler::generate(&m.model, &m.tokenizer, &requests)
                    };
                    match result {
                        Ok(samples) => {
                            for (job, sample) in jobs.into_iter().zip(samples) {
                                let _ = job.reply.send(Ok(sample));
                            }
                        }
                        Err(e) => {
                            for job in jobs {
                                let _ = job.reply.send(Err(grpo_candle::Error::Msg(e.to_string())));
                            }
                        }
                    }
                }
            })
            .unwrap_or_else(|e| panic!("cannot spawn the decoding thread: {e}"));
        CandleGenerator {
            model,
            weights,
            queue: Mutex::new(Some(tx)),
            worker: Mutex::new(Some(worker)),
        }
    }

    /// Copy the weights of the checkpoint in `dir` into the served model (sampling pauses).
    pub fn reload(&self, dir: &Path) -> harness_core::Result<()> {
        let fresh =
            PolicyModel::load_dir(dir, DType::F32, self.model.model.device()).map_err(core)?;
        let _write = self.weights.write().unwrap_or_else(|e| e.into_inner());
        let new = fresh
            .model
            .varmap()
            .data()
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let old = self
            .model
            .model
            .varmap()
            .data()
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for (name, var) in old.iter() {
            let Some(src) = new.get(name) else {
                return Err(harness_core::Error::Policy {
                    policy: "candle".into(),
                    message: format!("{}: the checkpoint has no tensor `{name}`", dir.display()),
                });
            };
            var.set(
                &src.as_tensor()
                    .to_dtype(var.dtype())
                    .map_err(|e| core(e.into()))?,
            )
            .map_err(|e| core(e.into()))?;
        }
        Ok(())
    }
}

impl Drop for CandleGenerator {
    fn drop(&mut self) {
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = h.join();
        }
    }
}

#[async_trait]
impl TokenGenerator for CandleGenerator {
    fn vocab_size(&self) -> usize {
        self.model.model.config().vocab_size
    }

    async fn generate(&self, request: TokenRequest) -> harness_core::Result<TokenOutput> {
        let (reply, rx) = tokio::sync::oneshot::channel();
        let job = Job {
            request: SampleRequest {
                prompt: request.prompt,
                max_new_tokens: request.max_new_tokens,
                params: request.sampling,
                stop_token_ids: self.model.stop_token_ids.clone(),
                seed: request.seed,
            },
            reply,
        };
        {
            let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
            let sender = queue.as_ref().ok_or_else(|| {
                core(grpo_candle::Error::Msg("the generator is shut down".into()))
            })?;
            sender.send(job).map_err(|_| {
                core(grpo_candle::Error::Msg(
                    "the decoding thread stopped".into(),
                ))
            })?;
        }
        let sample = rx
            .await
            .map_err(|_| {
                core(grpo_candle::Error::Msg(
                    "the decoding thread stopped".into(),
                ))
            })?
            .map_err(core)?;
        Ok(TokenOutput {
            tokens: sample.tokens,
            logprobs: sample.logprobs,
            finish: sample.finish,
        })
    }
}

/// Reloads through a shared [`CandleGenerator`].
pub struct CandleLoader(pub Arc<CandleGenerator>);

#[async_trait]
impl WeightLoader for CandleLoader {
    async fn load(&self, dir: &Path) -> harness_core::Result<()> {
        let generator = self.0.clone();
        let dir = dir.to_path_buf();
        tokio::task::spawn_blocking(move || generator.reload(&dir))
            .await
            .map_err(|e| harness_core::Error::Policy {
                policy: "candle".into(),
                message: format!("reload task failed: {e}"),
            })?
    }
}
