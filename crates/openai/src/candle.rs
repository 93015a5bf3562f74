//! grpo-candle behind this crate's token-level seams (feature `candle`): the checkpoint's chat
//! template and tokenizer as a [`PromptEncoder`] (so a vLLM or SGLang engine gets exactly the
//! prompt ids the trainer scores), its batched sampler as a [`TokenGenerator`], and weight
//! reloading as a [`WeightLoader`] (so the local server can stand in for an engine).

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use crate::engine::{StreamedToken, TokenSink, choice_seed};
use crate::{PromptEncoder, TokenGenerator, TokenOutput, TokenRequest, WeightLoader};
use async_trait::async_trait;
use candle_core::DType;
use grpo_candle::PolicyModel;
use grpo_candle::model::tokenizer;
use grpo_candle::sample::prefix_cache::{PrefixCache, PrefixCacheConfig, PrefixCacheStats};
use grpo_candle::sample::sampler::{self, DecodeBatch, Sample, SampleRequest};
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

/// One request of `n` choices, with where its answer and its streamed tokens go.
struct Job {
    requests: Vec<SampleRequest>,
    sink: Option<TokenSink>,
    reply: tokio::sync::oneshot::Sender<grpo_candle::Result<Vec<Sample>>>,
}

/// A job being decoded: its choices' results so far.
struct Running {
    sink: Option<TokenSink>,
    reply: tokio::sync::oneshot::Sender<grpo_candle::Result<Vec<Sample>>>,
    samples: Vec<Option<Sample>>,
    /// The client went away (its sink or reply channel closed): its rows are dropped.
    gone: bool,
}

/// What the decoding thread shares with the handle.
struct Shared {
    model: PolicyModel,
    weights: RwLock<()>,
    /// Reloads waiting for the batch to drain: no request is admitted meanwhile.
    pending_reloads: AtomicUsize,
    /// Tokens sampled (every choice, streamed or not).
    decoded: AtomicU64,
    /// Rows dropped because their client went away.
    cancelled: AtomicU64,
    prefix: Mutex<PrefixCacheStats>,
    /// Batches that panicked (their requests failed; the thread went on).
    panics: AtomicU64,
    /// Test-only faults: 1 panics inside the next batch, 2 ends the thread after it.
    #[cfg(test)]
    fault: std::sync::atomic::AtomicU8,
}

/// grpo-candle's sampler on one decoding thread with continuous batching, like `CandlePolicy`:
/// requests join the running batch between decoding steps (up to `max_batch` rows), so
/// concurrent HTTP requests share forward passes. The `n` choices of a request are rows of one
/// prompt and share its prefill, and a prefix cache keeps recent prompts (the turns of a
/// conversation prefill only their new tokens). Streamed tokens go out as they are drawn; the
/// rows of a client that went away leave the batch at their next token.
pub struct CandleGenerator {
    shared: Arc<Shared>,
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

/// Counters of a [`CandleGenerator`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GeneratorStats {
    /// Tokens sampled, over all choices.
    pub decoded_tokens: u64,
    /// Rows (choices) dropped because their client went away.
    pub cancelled_rows: u64,
    /// The prefix cache's counters (prefill tokens computed, reused, shared within a batch).
    pub prefix: PrefixCacheStats,
    /// Decoding batches that panicked: their requests failed, the thread went on.
    pub panicked_batches: u64,
}

impl CandleGenerator {
    /// Start the decoding thread with the default prefix cache.
    pub fn new(model: PolicyModel, max_batch: usize) -> Self {
        Self::with_prefix_cache(model, max_batch, PrefixCacheConfig::default())
    }

    /// Start the decoding thread with a prefix cache of `prefix` (disabled: every prompt is
    /// prefilled whole, the choices of a request still share theirs).
    pub fn with_prefix_cache(
        model: PolicyModel,
        max_batch: usize,
        prefix: PrefixCacheConfig,
    ) -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let shared = Arc::new(Shared {
            model,
            weights: RwLock::new(()),
            pending_reloads: AtomicUsize::new(0),
            decoded: AtomicU64::new(0),
            cancelled: AtomicU64::new(0),
            prefix: Mutex::new(PrefixCacheStats::default()),
            panics: AtomicU64::new(0),
            #[cfg(test)]
            fault: std::sync::atomic::AtomicU8::new(0),
        });
        let worker_shared = shared.clone();
        let worker = std::thread::Builder::new()
            .name("candle-generator".into())
            .spawn(move || worker_loop(&worker_shared, &rx, max_batch.max(1), prefix))
            .unwrap_or_else(|e| panic!("cannot spawn the decoding thread: {e}"));
        CandleGenerator {
            shared,
            queue: Mutex::new(Some(tx)),
            worker: Mutex::new(Some(worker)),
        }
    }

    /// The counters so far.
    pub fn stats(&self) -> GeneratorStats {
        GeneratorStats {
            decoded_tokens: self.shared.decoded.load(Ordering::SeqCst),
            cancelled_rows: self.shared.cancelled.load(Ordering::SeqCst),
            prefix: *self.shared.prefix.lock().unwrap_or_else(|e| e.into_inner()),
            panicked_batches: self.shared.panics.load(Ordering::SeqCst),
        }
    }

    /// Replace the served weights by those of the checkpoint in `dir` (sampling pauses: the
    /// running batch finishes first, and requests arriving meanwhile wait).
    ///
    /// The checkpoint is loaded and checked whole first (every served tensor present, with its
    /// shape, converted to its dtype) before any served tensor is written, so a checkpoint that
    /// fails half-way leaves the old weights served, never a mix.
    pub fn reload(&self, dir: &Path) -> harness_core::Result<()> {
        let model = &self.shared.model;
        let fresh = PolicyModel::load_dir(dir, DType::F32, model.model.device()).map_err(core)?;
        let refuse = |message: String| harness_core::Error::Policy {
            policy: "candle".into(),
            message: format!("{}: {message}", dir.display()),
        };
        let staged = {
            let new = fresh
                .model
                .varmap()
                .data()
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let old = model
                .model
                .varmap()
                .data()
                .lock()
                .unwrap_or_else(|e| e.into_inner());
            let mut staged = Vec::with_capacity(old.len());
            for (name, var) in old.iter() {
                let Some(src) = new.get(name) else {
                    return Err(refuse(format!("the checkpoint has no tensor `{name}`")));
                };
                if src.shape() != var.shape() {
                    return Err(refuse(format!(
                        "tensor `{name}` has shape {:?}, the served model's has {:?}",
                        src.shape().dims(),
                        var.shape().dims()
                    )));
                }
                let tensor = src
                    .as_tensor()
                    .to_dtype(var.dtype())
                    .map_err(|e| core(e.into()))?;
                staged.push((var.clone(), tensor));
            }
            staged
        };
        self.shared.pending_reloads.fetch_add(1, Ordering::AcqRel);
        let result = (|| {
            let _write = self
                .shared
                .weights
                .write()
                .unwrap_or_else(|e| e.into_inner());
            model.model.mark_weights_changed();
            // Names, shapes, dtypes and the device were checked above: `set` has nothing left
            // to refuse.
            for (var, tensor) in &staged {
                var.set(tensor).map_err(|e| core(e.into()))?;
            }
            Ok(())
        })();
        self.shared.pending_reloads.fetch_sub(1, Ordering::AcqRel);
        result
    }

    fn submit(&self, job: Job) -> harness_core::Result<()> {
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let sender = queue
            .as_ref()
            .ok_or_else(|| core(grpo_candle::Error::Msg("the generator is shut down".into())))?;
        sender.send(job).map_err(|_| {
            core(grpo_candle::Error::Msg(
                "the decoding thread stopped".into(),
            ))
        })
    }
}

/// Decode until no row is left, admitting arrivals between steps; then wait for work.
fn worker_loop(
    shared: &Shared,
    rx: &mpsc::Receiver<Job>,
    max_batch: usize,
    prefix_config: PrefixCacheConfig,
) {
    let mut prefix = PrefixCache::new(prefix_config);
    let model = &shared.model.model;
    let tokenizer = &shared.model.tokenizer;
    let mut next_id = 0u64;
    // The token bytes of JSON-mode rows, built by the first batch that has one and kept.
    let mut json_vocab = None;
    while let Ok(first) = rx.recv() {
        // One batch's panic (a bug in the sampler, a tensor op that asserts) must not take the
        // decoding thread down with it: the batch's jobs are dropped (their callers get an
        // error), the prefix cache is rebuilt (it may hold a half-written entry), and the
        // thread serves the next job.
        let outcome = std::panic::catch_unwind(AssertUnwindSafe(|| {
            // Held while rows decode: a reload waits for the batch to drain.
            let _read = shared.weights.read().unwrap_or_else(|e| e.into_inner());
            let mut batch: DecodeBatch<'_, (u64, usize)> =
                DecodeBatch::new(model).with_json_vocab(json_vocab.clone());
            let mut jobs: HashMap<u64, Running> = HashMap::new();
            let mut incoming = vec![first];
            loop {
                if shared.pending_reloads.load(Ordering::Acquire) == 0 {
                    let rows = |v: &[Job]| v.iter().map(|j| j.requests.len()).sum::<usize>();
                    while batch.len() + rows(&incoming) < max_batch {
                        match rx.try_recv() {
                            Ok(job) => incoming.push(job),
                            Err(_) => break,
                        }
                    }
                }
                let mut admitted = Vec::new();
                for job in incoming.drain(..) {
                    #[cfg(test)]
                    if shared
                        .fault
                        .compare_exchange(1, 0, Ordering::SeqCst, Ordering::SeqCst)
                        .is_ok()
                    {
                        panic!("an injected panic inside a batch");
                    }
                    if let Some(e) = job
                        .requests
                        .iter()
                        .find_map(|r| sampler::validate_request(model, r).err())
                    {
                        let _ = job.reply.send(Err(e));
                        continue;
                    }
                    let id = next_id;
                    next_id += 1;
                    let n = job.requests.len();
                    admitted.extend(
                        job.requests
                            .into_iter()
                            .enumerate()
                            .map(|(i, r)| ((id, i), r)),
                    );
                    jobs.insert(
                        id,
                        Running {
                            sink: job.sink,
                            reply: job.reply,
                            samples: vec![None; n],
                            gone: false,
                        },
                    );
                }
                if !admitted.is_empty() {
                    let ids: Vec<u64> = admitted.iter().map(|((id, _), _)| *id).collect();
                    match batch.add_cached(admitted, &mut prefix) {
                        Ok(done) => finish(shared, &mut jobs, done),
                        Err(e) => {
                            // The batch is unchanged; the new jobs fail.
                            for id in ids {
                                if let Some(job) = jobs.remove(&id) {
                                    let _ =
                                        job.reply.send(Err(grpo_candle::Error::Msg(e.to_string())));
                                }
                            }
                        }
                    }
                    *shared.prefix.lock().unwrap_or_else(|e| e.into_inner()) = prefix.stats();
                }
                if batch.is_empty() {
                    break;
                }
                let step = batch.step_observed(tokenizer, |&(id, choice), sample| {
                    shared.decoded.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get_mut(&id) else {
                        return false;
                    };
                    if job.reply.is_closed() {
                        job.gone = true;
                    }
                    if let Some(sink) = &job.sink {
                        let (token, logprob) = (
                            *sample.tokens.last().expect("a new token"),
                            *sample.logprobs.last().expect("a new log-prob"),
                        );
                        if sink
                            .send(StreamedToken {
                                choice,
                                token,
                                logprob,
                            })
                            .is_err()
                        {
                            job.gone = true;
                        }
                    }
                    !job.gone
                });
                match step {
                    Ok(done) => finish(shared, &mut jobs, done),
                    Err(e) => {
                        for (_, job) in jobs.drain() {
                            let _ = job.reply.send(Err(grpo_candle::Error::Msg(e.to_string())));
                        }
                        break;
                    }
                }
            }
            json_vocab = batch.json_vocab().cloned();
        }));
        if let Err(panic) = outcome {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            tracing::error!(panic = %what, "a decoding batch panicked; its requests fail");
            shared.panics.fetch_add(1, Ordering::SeqCst);
            prefix = PrefixCache::new(prefix_config);
        }
        #[cfg(test)]
        if shared
            .fault
            .compare_exchange(2, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            panic!("an injected panic that ends the decoding thread");
        }
    }
}

/// Record finished rows; answer the jobs whose choices are all done.
fn finish(shared: &Shared, jobs: &mut HashMap<u64, Running>, done: Vec<((u64, usize), Sample)>) {
    for ((id, choice), sample) in done {
        let Some(job) = jobs.get_mut(&id) else {
            continue;
        };
        if job.gone {
            shared.cancelled.fetch_add(1, Ordering::Relaxed);
        }
        job.samples[choice] = Some(sample);
        if job.samples.iter().all(Option::is_some) {
            let job = jobs.remove(&id).expect("present");
            // The sink closes with the job, after its last token.
            let samples = job.samples.into_iter().map(|s| s.expect("done")).collect();
            let _ = job.reply.send(Ok(samples));
        }
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
        self.shared.model.model.config().vocab_size
    }

    fn health(&self) -> std::result::Result<(), String> {
        match self
            .worker
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            Some(worker) if !worker.is_finished() => Ok(()),
            Some(_) => Err("the decoding thread has stopped".into()),
            None => Err("the generator is shut down".into()),
        }
    }

    async fn generate(&self, request: TokenRequest) -> harness_core::Result<TokenOutput> {
        let mut out = self.generate_choices(request, 1, None).await?;
        Ok(out.remove(0))
    }

    async fn generate_choices(
        &self,
        request: TokenRequest,
        n: usize,
        sink: Option<TokenSink>,
    ) -> harness_core::Result<Vec<TokenOutput>> {
        if n == 0 {
            return Ok(Vec::new());
        }
        let stop = &self.shared.model.stop_token_ids;
        let requests = (0..n)
            .map(|i| SampleRequest {
                prompt: request.prompt.clone(),
                max_new_tokens: request.max_new_tokens,
                params: request.sampling.clone(),
                stop_token_ids: stop.clone(),
                seed: choice_seed(request.seed, i),
                format: request.format,
            })
            .collect();
        let (reply, rx) = tokio::sync::oneshot::channel();
        self.submit(Job {
            requests,
            sink,
            reply,
        })?;
        let samples = rx
            .await
            .map_err(|_| {
                core(grpo_candle::Error::Msg(
                    "the decoding batch failed (it panicked, or the decoding thread stopped)"
                        .into(),
                ))
            })?
            .map_err(core)?;
        Ok(samples
            .into_iter()
            .map(|s| TokenOutput {
                tokens: s.tokens,
                logprobs: s.logprobs,
                finish: s.finish,
            })
            .collect())
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

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::Device;
    use grpo_candle::TinySpec;
    use harness_core::{OutputFormat, SamplingParams};

    fn generator() -> CandleGenerator {
        let spec = TinySpec {
            num_merges: 64,
            hidden_size: 32,
            intermediate_size: 64,
            head_dim: 8,
            ..TinySpec::default()
        };
        CandleGenerator::new(
            PolicyModel::tiny(&spec, DType::F32, &Device::Cpu).unwrap(),
            4,
        )
    }

    fn request() -> TokenRequest {
        TokenRequest {
            prompt: vec![5, 6, 7],
            max_new_tokens: 4,
            sampling: SamplingParams::default(),
            seed: 1,
            format: OutputFormat::Text,
        }
    }

    async fn wait_until(mut done: impl FnMut() -> bool) {
        for _ in 0..200 {
            if done() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
    }

    #[tokio::test]
    async fn a_panicking_batch_fails_its_requests_and_the_thread_serves_the_next() {
        let generator = generator();
        let want = generator.generate(request()).await.unwrap();
        generator.shared.fault.store(1, Ordering::SeqCst);
        let err = generator.generate(request()).await.unwrap_err().to_string();
        assert!(err.contains("panicked"), "{err}");
        wait_until(|| generator.stats().panicked_batches == 1).await;
        assert_eq!(generator.stats().panicked_batches, 1);
        assert_eq!(generator.health(), Ok(()));
        let got = generator.generate(request()).await.unwrap();
        assert_eq!(got.tokens, want.tokens);
    }

    #[tokio::test]
    async fn a_dead_decoding_thread_is_reported_unhealthy() {
        let generator = generator();
        assert_eq!(generator.health(), Ok(()));
        generator.shared.fault.store(2, Ordering::SeqCst);
        // The fault fires after this request's batch.
        generator.generate(request()).await.unwrap();
        wait_until(|| generator.health().is_err()).await;
        let reason = generator.health().unwrap_err();
        assert!(reason.contains("decoding thread has stopped"), "{reason}");
        assert!(generator.generate(request()).await.is_err());
    }
}
