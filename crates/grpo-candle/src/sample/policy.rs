//! [`CandlePolicy`]: harness-core's [`Policy`] on the candle model.
//!
//! `generate` renders the request through the chat template, tokenizes it, enforces
//! `max_context_tokens`, and hands the prompt to one worker thread that owns the decoding. The
//! worker batches continuously: between two decoding steps it admits every request waiting in
//! its queue (up to `max_batch` rows), and a row leaves as soon as it finishes, so concurrent
//! episodes share forward passes and no request waits for a whole batch. Tensor work never runs
//! on the async runtime's threads.
//!
//! A turn's prompt reuses the exact tokens of earlier turns: when an assistant message of the
//! history is the text of a turn this policy generated (after that turn's prompt), the prompt is
//! those context + generated tokens followed by the tokenized remainder, instead of a fresh
//! tokenization of the whole text (which may split the generated text differently). So a turn's
//! context extends the previous turn's context + tokens whenever the template renders history as
//! a prefix, and the trainer can pack the turns into one sequence.
//!
//! The weights are the model's [`candle_nn::VarMap`], shared with whoever trains them: take
//! [`CandlePolicy::update_guard`] while changing them. It stops admitting requests, waits until
//! the rows in flight finish, and holds decoding off until it is dropped, so every turn is
//! sampled from one version of the weights.
//!
//! The worker keeps a [`PrefixCache`] (setting: [`PolicyOptions::prefix_cache`], 1 GiB of keys
//! and values by default): the turns of an episode and the rollouts of a group prefill only what
//! their prompt adds to a cached one, with the same tokens and log-probs as without the cache.
//! Dropping the update guard marks the weights changed, and the cache does not serve entries
//! computed under other weights; [`PolicyStats`] counts hits and reused tokens.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, RwLock, RwLockWriteGuard};
use std::thread::JoinHandle;

use async_trait::async_trait;
use candle_nn::VarMap;
use harness_core::{FinishReason, OutputFormat, Policy, PolicyRequest, PolicyTurn};
use tokenizers::Tokenizer;

use crate::error::{Error, Result};
use crate::model::Qwen;
use crate::model::chat_template::ChatTemplate;
use crate::model::checkpoint::PolicyModel;
use crate::model::lora::{BaseWeights, PeftAdapter};
use crate::ops::logprob::LogProbConfig;
use crate::sample::prefix_cache::{PrefixCache, PrefixCacheConfig};
use crate::sample::sampler::{self, DecodeBatch, Sample, SampleRequest};

/// Options of a [`CandlePolicy`].
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyOptions {
    /// Name reported by [`Policy::name`].
    pub name: String,
    /// Most requests decoded together in one batch.
    pub max_batch: usize,
    /// How many recent turns are remembered for reusing their exact tokens in later prompts
    /// (0 disables the reuse: prompts are always tokenized afresh).
    pub remembered_turns: usize,
    /// The prefix cache's memory budget ([`PrefixCacheConfig::disabled`] turns it off).
    pub prefix_cache: PrefixCacheConfig,
}

impl Default for PolicyOptions {
    fn default() -> Self {
        PolicyOptions {
            name: "candle-qwen".into(),
            max_batch: 16,
            remembered_turns: 4096,
            prefix_cache: PrefixCacheConfig::default(),
        }
    }
}

/// Recent turns keyed by a hash of `prompt text + generated text`.
#[derive(Default)]
struct TurnMemory {
    capacity: usize,
    order: std::collections::VecDeque<u64>,
    entries: std::collections::HashMap<u64, Remembered>,
}

struct Remembered {
    text_len: usize,
    /// Context + generated tokens.
    tokens: Vec<u32>,
    /// Whether the last generated token is `<|im_end|>` (the template writes it after the text).
    ends_with_im_end: bool,
}

fn text_key(text: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    text.hash(&mut h);
    h.finish()
}

impl TurnMemory {
    fn insert(&mut self, text: &str, entry: Remembered) {
        if self.capacity == 0 {
            return;
        }
        let key = text_key(text);
        if self.entries.insert(key, entry).is_none() {
            self.order.push_back(key);
        }
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.entries.remove(&old);
            }
        }
    }

    fn get(&self, text: &str) -> Option<&Remembered> {
        self.entries
            .get(&text_key(text))
            .filter(|e| e.text_len == text.len())
    }
}

struct Job {
    request: SampleRequest,
    reply: tokio::sync::oneshot::Sender<Result<Sample>>,
}

struct Shared {
    model: PolicyModel,
    memory: Mutex<TurnMemory>,
    /// Held for reading while rows are in flight, for writing while weights change.
    weights: RwLock<()>,
    /// Updates waiting for the write lock: no new rows are admitted meanwhile.
    pending_updates: AtomicUsize,
    /// The version of the weights as the caller numbers them ([`NO_VERSION`]: none).
    version: AtomicU64,
    stats: Mutex<PolicyStats>,
}

/// [`Shared::version`] when no version is set.
const NO_VERSION: u64 = u64::MAX;

/// Counters of a [`CandlePolicy`]'s decoding worker.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PolicyStats {
    /// Requests decoded (context overflows excluded).
    pub requests: u64,
    /// Decoding steps (one token for every row in flight).
    pub steps: u64,
    /// Rows decoded, summed over steps (`row_steps / steps` is the mean batch size).
    pub row_steps: u64,
    /// Most rows in flight at once.
    pub largest_batch: usize,
    /// Prompt tokens prefilled (computed by the model).
    pub prefill_tokens_computed: u64,
    /// Prompt tokens whose keys and values came from the prefix cache
    /// (`prefill_tokens_computed + prefill_tokens_reused` is every prompt token decoded).
    pub prefill_tokens_reused: u64,
    /// Requests that reused a cached prefix.
    pub prefix_cache_hits: u64,
    /// Prefix cache entries evicted for the memory budget.
    pub prefix_cache_evictions: u64,
    /// Times the prefix cache was emptied because the weights changed.
    pub prefix_cache_invalidations: u64,
    /// Bytes of keys and values the prefix cache holds now.
    pub prefix_cache_bytes: usize,
}

/// Exclusive access to a [`CandlePolicy`]'s weights; see [`CandlePolicy::update_guard`].
pub struct UpdateGuard<'a> {
    _write: RwLockWriteGuard<'a, ()>,
    pending: &'a AtomicUsize,
    model: &'a Qwen,
}

impl Drop for UpdateGuard<'_> {
    fn drop(&mut self) {
        // Whoever held the guard may have changed the weights in any way (the guard's contract
        // is "hold this while changing them"), so what was computed before is stale. Marked
        // before the write lock is released, so no row is prefilled in between.
        self.model.mark_weights_changed();
        self.pending.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A trainable Qwen policy that implements [`Policy`]. `Send + Sync`; cheap to share in an `Arc`.
pub struct CandlePolicy {
    name: String,
    shared: Arc<Shared>,
    queue: Mutex<Option<mpsc::Sender<Job>>>,
    worker: Mutex<Option<JoinHandle<()>>>,
}

impl std::fmt::Debug for CandlePolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CandlePolicy")
            .field("name", &self.name)
            .field("model", &self.shared.model)
            .finish()
    }
}

impl CandlePolicy {
    /// Start the policy (spawns its decoding thread).
    pub fn new(model: PolicyModel, options: PolicyOptions) -> Self {
        let memory = Mutex::new(TurnMemory {
            capacity: options.remembered_turns,
            ..TurnMemory::default()
        });
        let shared = Arc::new(Shared {
            model,
            memory,
            weights: RwLock::new(()),
            pending_updates: AtomicUsize::new(0),
            version: AtomicU64::new(NO_VERSION),
            stats: Mutex::new(PolicyStats::default()),
        });
        let (tx, rx) = mpsc::channel::<Job>();
        let worker_shared = Arc::clone(&shared);
        let max_batch = options.max_batch.max(1);
        let prefix = PrefixCache::new(options.prefix_cache);
        let worker = std::thread::Builder::new()
            .name("candle-policy".into())
            .spawn(move || worker_loop(&worker_shared, &rx, max_batch, prefix))
            .expect("spawn the policy's decoding thread");
        CandlePolicy {
            name: options.name,
            shared,
            queue: Mutex::new(Some(tx)),
            worker: Mutex::new(Some(worker)),
        }
    }

    /// The model, tokenizer, template and stop tokens.
    pub fn policy_model(&self) -> &PolicyModel {
        &self.shared.model
    }

    /// The decoder (shares its variables with [`CandlePolicy::varmap`]).
    pub fn model(&self) -> &Qwen {
        &self.shared.model.model
    }

    /// The weights, shared: a trainer updating these variables updates the policy.
    pub fn varmap(&self) -> &VarMap {
        self.shared.model.model.varmap()
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.shared.model.tokenizer
    }

    /// The chat template.
    pub fn template(&self) -> &ChatTemplate {
        &self.shared.model.template
    }

    /// Hold this while changing the weights. Taking it stops the admission of new requests and
    /// waits for the rows in flight to finish; decoding resumes when it is dropped. Dropping it
    /// marks the weights changed ([`Qwen::mark_weights_changed`]), which invalidates the prefix
    /// cache.
    pub fn update_guard(&self) -> UpdateGuard<'_> {
        self.shared.pending_updates.fetch_add(1, Ordering::AcqRel);
        let write = self
            .shared
            .weights
            .write()
            .unwrap_or_else(|e| e.into_inner());
        UpdateGuard {
            _write: write,
            pending: &self.shared.pending_updates,
            model: &self.shared.model.model,
        }
    }

    /// Replace the weights with those of a checkpoint folder (same architecture), in place and
    /// under the update guard, e.g. to continue from a saved training step. The
    /// [`weights_version`](CandlePolicy::weights_version) is left as it was: callers that track
    /// versions set it ([`CandlePolicy::set_weights_version`]).
    pub fn load_weights(&self, dir: impl AsRef<std::path::Path>) -> Result<()> {
        let files = crate::model::loading::ModelFiles::from_dir(dir)?;
        let _guard = self.update_guard();
        self.model().load_weights_in_place(&files.weights)
    }

    /// A snapshot of the current weights (copies), to merge LoRA adapters into with
    /// [`CandlePolicy::load_merged`]. Taken while no update runs.
    pub fn base_weights(&self) -> Result<BaseWeights> {
        let _read = self
            .shared
            .weights
            .read()
            .unwrap_or_else(|e| e.into_inner());
        self.model().snapshot()
    }

    /// The largest absolute difference between the current weights and those of the checkpoint
    /// folder `dir` (same architecture), e.g. to check that weights restored from elsewhere are
    /// the ones a checkpoint saved. A weight missing from `dir` or of another shape is an error
    /// naming it.
    pub fn max_weight_diff(&self, dir: impl AsRef<std::path::Path>) -> Result<f32> {
        let files = crate::model::loading::ModelFiles::from_dir(dir)?;
        let shown = files.weights.first().cloned().unwrap_or_default();
        let _read = self
            .shared
            .weights
            .read()
            .unwrap_or_else(|e| e.into_inner());
        let vars = self.model().named_vars();
        let names = vars.iter().map(|(n, _)| n.clone()).collect();
        let saved =
            crate::model::loading::load_tensors(&files.weights, &names, self.model().device())?;
        let mut max = 0f32;
        for (name, var) in &vars {
            let t = saved
                .get(name)
                .ok_or_else(|| crate::error::Error::Weights {
                    path: shown.clone(),
                    name: name.clone(),
                    message: "missing from the checkpoint".into(),
                })?;
            if t.dims() != var.dims() {
                return Err(crate::error::Error::Weights {
                    path: shown.clone(),
                    name: name.clone(),
                    message: format!("shape {:?}, expected {:?}", t.dims(), var.dims()),
                });
            }
            let d = (var.as_tensor().to_dtype(candle_core::DType::F32)?
                - t.to_dtype(candle_core::DType::F32)?)?
            .abs()?
            .max_all()?
            .to_scalar::<f32>()?;
            max = max.max(d);
        }
        Ok(max)
    }

    /// Set the weights to `base` with `adapter` merged (`W + s · B A` where the adapter targets
    /// a module, `W` elsewhere), under the update guard, and record `version` as the
    /// [`weights_version`](CandlePolicy::weights_version). Every variable is set from `base`,
    /// never from the current weights, so successive versions do not compound.
    ///
    /// The adapter is checked against `base` and merged before the guard is taken: an adapter
    /// that does not fit is refused with decoding undisturbed and the weights and version
    /// unchanged. Should setting the variables fail after that, the version becomes `None`.
    pub fn load_merged(
        &self,
        base: &BaseWeights,
        adapter: &PeftAdapter,
        version: u64,
    ) -> Result<()> {
        let merged = base.merged(adapter)?;
        let _guard = self.update_guard();
        match self
            .model()
            .set_weights_in_place(merged, adapter.weights_path())
        {
            Ok(()) => {
                self.set_weights_version(Some(version));
                Ok(())
            }
            Err(e) => {
                self.set_weights_version(None);
                Err(e)
            }
        }
    }

    /// The version of the weights as the caller numbers them (e.g. the learner's step of the
    /// adapter last merged by [`CandlePolicy::load_merged`]); `None` until one is set. Not to be
    /// confused with [`Qwen::weights_version`], the model's own change counter.
    pub fn weights_version(&self) -> Option<u64> {
        match self.shared.version.load(Ordering::Acquire) {
            NO_VERSION => None,
            v => Some(v),
        }
    }

    /// Record the version of the current weights, e.g. `Some(0)` for the initial checkpoint.
    /// `Some(u64::MAX)` reads back as `None`.
    pub fn set_weights_version(&self, version: Option<u64>) {
        self.shared
            .version
            .store(version.unwrap_or(NO_VERSION), Ordering::Release);
    }

    /// Teacher-forced log-probs of a token sequence under the current weights, at temperature 1
    /// over the full vocabulary: `log p(ids[i] | ids[..i])` for `i` in `1..ids.len()` (one value
    /// fewer than `ids`; none for fewer than two ids). Runs on the calling thread, holding the
    /// weights' read lock so no update runs meanwhile.
    pub fn score_tokens(&self, ids: &[u32]) -> Result<Vec<f32>> {
        if ids.len() < 2 {
            return Ok(Vec::new());
        }
        let _read = self
            .shared
            .weights
            .read()
            .unwrap_or_else(|e| e.into_inner());
        crate::model::score_continuation(
            self.model(),
            &ids[..1],
            &ids[1..],
            &LogProbConfig::default(),
        )
    }

    /// The decoding worker's counters.
    pub fn stats(&self) -> PolicyStats {
        *self.shared.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Render and tokenize a request's prompt (what `generate` feeds the model), reusing the
    /// exact tokens of remembered earlier turns.
    pub fn prompt_tokens(&self, request: &PolicyRequest) -> Result<Vec<u32>> {
        let text = self.render(request);
        self.encode_prompt(request, &text)
    }

    fn render(&self, request: &PolicyRequest) -> String {
        self.shared
            .model
            .template
            .render(&request.messages, &request.tools, true)
    }

    fn encode_prompt(&self, request: &PolicyRequest, text: &str) -> Result<Vec<u32>> {
        let m = &self.shared.model;
        let messages = &request.messages;
        // The latest assistant message that continues a remembered turn wins.
        for j in (0..messages.len()).rev() {
            if messages[j].role != harness_core::Role::Assistant {
                continue;
            }
            let mut prefix = m.template.render(&messages[..j], &request.tools, true);
            prefix.push_str(&messages[j].content);
            if !text.starts_with(&prefix) {
                continue;
            }
            let memory = self.shared.memory.lock().unwrap_or_else(|e| e.into_inner());
            let Some(entry) = memory.get(&prefix) else {
                continue;
            };
            let mut rest = &text[prefix.len()..];
            if entry.ends_with_im_end {
                match rest.strip_prefix(crate::model::tokenizer::IM_END) {
                    Some(r) => rest = r,
                    None => continue,
                }
            }
            let mut tokens = entry.tokens.clone();
            drop(memory);
            tokens.extend(crate::model::tokenizer::encode(&m.tokenizer, rest)?);
            return Ok(tokens);
        }
        crate::model::tokenizer::encode(&m.tokenizer, text)
    }

    /// Remember a finished turn so later prompts can reuse its tokens.
    fn remember(&self, prompt_text: &str, turn: &PolicyTurn) {
        let Some(&last) = turn.tokens.last() else {
            return;
        };
        let m = &self.shared.model;
        let im_end = m.tokenizer.token_to_id(crate::model::tokenizer::IM_END);
        let ends_with_im_end = Some(last) == im_end;
        // A turn ended by another special token (e.g. <|endoftext|>) does not continue as the
        // template renders it; leave it to a fresh tokenization.
        if !ends_with_im_end && m.stop_token_ids.contains(&last) {
            return;
        }
        let key = format!("{prompt_text}{}", turn.text);
        let mut tokens = turn.context_tokens.clone();
        tokens.extend(&turn.tokens);
        let entry = Remembered {
            text_len: key.len(),
            tokens,
            ends_with_im_end,
        };
        self.shared
            .memory
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(&key, entry);
    }

    /// Save the current weights (with tokenizer and config) in HF format, consistently with
    /// respect to concurrent updates.
    pub fn save_hf(&self, dir: impl AsRef<std::path::Path>) -> Result<()> {
        let _read = self
            .shared
            .weights
            .read()
            .unwrap_or_else(|e| e.into_inner());
        self.shared.model.save_hf(dir)
    }

    /// `generate` for synchronous callers (blocks the thread; do not call it on an async runtime
    /// thread).
    pub fn generate_blocking(&self, request: PolicyRequest) -> Result<PolicyTurn> {
        let (turn, text, rx) = self.submit(request)?;
        match rx {
            None => Ok(turn),
            Some(rx) => self.finish(turn, &text, rx.blocking_recv()),
        }
    }

    /// Prepare a turn; returns it complete (context overflow) or with a receiver for the sample.
    #[allow(clippy::type_complexity)]
    fn submit(
        &self,
        request: PolicyRequest,
    ) -> Result<(
        PolicyTurn,
        String,
        Option<tokio::sync::oneshot::Receiver<Result<Sample>>>,
    )> {
        sampler::validate_params(&request.sampling)?;
        let text = self.render(&request);
        let context = self.encode_prompt(&request, &text)?;
        let mut turn = PolicyTurn {
            text: String::new(),
            context_tokens: context,
            tokens: Vec::new(),
            logprobs: Vec::new(),
            finish: FinishReason::ContextOverflow,
        };
        let limit = self.model().config().max_position_embeddings;
        if turn.context_tokens.len() > request.max_context_tokens
            || turn.context_tokens.len() >= limit
        {
            return Ok((turn, text, None));
        }
        turn.finish = FinishReason::Length;
        let job_request = SampleRequest {
            prompt: turn.context_tokens.clone(),
            max_new_tokens: request.max_new_tokens,
            params: request.sampling,
            stop_token_ids: self.shared.model.stop_token_ids.clone(),
            seed: request.seed,
            format: OutputFormat::Text,
        };
        let (reply, rx) = tokio::sync::oneshot::channel();
        let queue = self.queue.lock().unwrap_or_else(|e| e.into_inner());
        let sender = queue
            .as_ref()
            .ok_or_else(|| Error::Msg("the policy is shut down".into()))?;
        sender
            .send(Job {
                request: job_request,
                reply,
            })
            .map_err(|_| Error::Msg("the policy's decoding thread has stopped".into()))?;
        Ok((turn, text, Some(rx)))
    }

    fn finish(
        &self,
        mut turn: PolicyTurn,
        prompt_text: &str,
        received: std::result::Result<Result<Sample>, tokio::sync::oneshot::error::RecvError>,
    ) -> Result<PolicyTurn> {
        let sample = received.map_err(|_| {
            Error::Msg("decoding failed or the policy stopped (see the error log)".into())
        })??;
        turn.text =
            crate::model::tokenizer::decode(&self.shared.model.tokenizer, &sample.tokens, true)?;
        turn.tokens = sample.tokens;
        turn.logprobs = sample.logprobs;
        turn.finish = sample.finish;
        self.remember(prompt_text, &turn);
        Ok(turn)
    }
}

impl Drop for CandlePolicy {
    fn drop(&mut self) {
        // Closing the queue ends the worker once it has answered what it holds.
        self.queue.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(handle) = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = handle.join();
        }
    }
}

type Reply = tokio::sync::oneshot::Sender<Result<Sample>>;

fn worker_loop(
    shared: &Shared,
    rx: &mpsc::Receiver<Job>,
    max_batch: usize,
    mut prefix: PrefixCache,
) {
    let model = &shared.model.model;
    let tokenizer = &shared.model.tokenizer;
    // Wait for work, then decode until no row is left, admitting arrivals between steps.
    while let Ok(first) = rx.recv() {
        let _read = shared.weights.read().unwrap_or_else(|e| e.into_inner());
        let mut batch: DecodeBatch<'_, Reply> = DecodeBatch::new(model);
        let mut incoming = vec![first];
        loop {
            if shared.pending_updates.load(Ordering::Acquire) == 0 {
                while batch.len() + incoming.len() < max_batch {
                    match rx.try_recv() {
                        Ok(job) => incoming.push(job),
                        Err(_) => break,
                    }
                }
            }
            if !incoming.is_empty() {
                let mut admitted = Vec::with_capacity(incoming.len());
                for job in incoming.drain(..) {
                    match sampler::validate_request(model, &job.request) {
                        Ok(()) => admitted.push((job.reply, job.request)),
                        Err(e) => {
                            let _ = job.reply.send(Err(e));
                        }
                    }
                }
                let n = admitted.len() as u64;
                match batch.add_cached(admitted, &mut prefix) {
                    Ok(done) => {
                        for (reply, sample) in done {
                            let _ = reply.send(Ok(sample));
                        }
                    }
                    // The failed requests' reply channels close: their callers get an error.
                    Err(e) => tracing::error!("candle policy: prefill failed: {e}"),
                }
                let cached = prefix.stats();
                let mut stats = shared.stats.lock().unwrap_or_else(|e| e.into_inner());
                stats.requests += n;
                stats.prefill_tokens_computed = cached.computed_tokens;
                stats.prefill_tokens_reused = cached.reused_tokens;
                stats.prefix_cache_hits = cached.hits;
                stats.prefix_cache_evictions = cached.evicted;
                stats.prefix_cache_invalidations = cached.invalidations;
                stats.prefix_cache_bytes = cached.bytes;
            }
            if batch.is_empty() {
                break;
            }
            {
                let mut stats = shared.stats.lock().unwrap_or_else(|e| e.into_inner());
                stats.steps += 1;
                stats.row_steps += batch.len() as u64;
                stats.largest_batch = stats.largest_batch.max(batch.len());
            }
            match batch.step(tokenizer) {
                Ok(done) => {
                    for (reply, sample) in done {
                        let _ = reply.send(Ok(sample));
                    }
                }
                Err(e) => {
                    // Dropping the batch closes the rows' reply channels.
                    tracing::error!("candle policy: decoding step failed: {e}");
                    break;
                }
            }
        }
    }
}

#[async_trait]
impl Policy for CandlePolicy {
    fn name(&self) -> &str {
        &self.name
    }

    fn weights_version(&self) -> Option<u64> {
        CandlePolicy::weights_version(self)
    }

    /// The chat template's rendering of the request, tokenized as `generate` tokenizes its
    /// prompt (reusing the exact tokens of a remembered earlier turn whose text it extends).
    fn render_prompt(&self, request: &PolicyRequest) -> harness_core::Result<Vec<u32>> {
        self.prompt_tokens(request)
            .map_err(|e| harness_core::Error::Policy {
                policy: self.name.clone(),
                message: e.to_string(),
            })
    }

    async fn generate(&self, request: PolicyRequest) -> harness_core::Result<PolicyTurn> {
        let to_core = |e: Error| harness_core::Error::Policy {
            policy: self.name.clone(),
            message: e.to_string(),
        };
        let (turn, text, rx) = self.submit(request).map_err(to_core)?;
        match rx {
            None => Ok(turn),
            Some(rx) => self.finish(turn, &text, rx.await).map_err(to_core),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::checkpoint::TinySpec;
    use candle_core::{DType, Device};
    use harness_core::{ChatMessage, SamplingParams, ToolSpec};

    fn policy() -> CandlePolicy {
        let spec = TinySpec {
            num_merges: 64,
            hidden_size: 32,
            intermediate_size: 64,
            head_dim: 8,
            ..TinySpec::default()
        };
        CandlePolicy::new(
            PolicyModel::tiny(&spec, DType::F32, &Device::Cpu).unwrap(),
            PolicyOptions::default(),
        )
    }

    fn request(user: &str, seed: u64) -> PolicyRequest {
        PolicyRequest {
            messages: vec![ChatMessage::system("Be brief."), ChatMessage::user(user)],
            tools: vec![ToolSpec::new(
                "lookup",
                "Look a word up.",
                serde_json::json!({"type": "object"}),
            )],
            max_new_tokens: 12,
            max_context_tokens: 4096,
            sampling: SamplingParams::default(),
            seed,
        }
    }

    #[test]
    fn policy_is_send_sync_and_object_safe() {
        fn check<T: Send + Sync>() {}
        check::<CandlePolicy>();
        let _obj: Arc<dyn Policy> = Arc::new(policy());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_calls_are_batched_and_reproducible() {
        let p = Arc::new(policy());
        let mut handles = Vec::new();
        for i in 0..6u64 {
            let p = Arc::clone(&p);
            handles.push(tokio::spawn(async move {
                p.generate(request(&format!("question {i}"), i)).await
            }));
        }
        let mut turns = Vec::new();
        for h in handles {
            turns.push(h.await.unwrap().unwrap());
        }
        let stats = p.stats();
        assert_eq!(stats.requests, 6);
        assert!(stats.largest_batch > 1, "{stats:?}");
        for (i, turn) in turns.iter().enumerate() {
            assert_eq!(turn.tokens.len(), turn.logprobs.len());
            assert!(!turn.tokens.is_empty() && turn.tokens.len() <= 12);
            assert!(turn.logprobs.iter().all(|l| l.is_finite() && *l <= 0.0));
            let prompt = p
                .prompt_tokens(&request(&format!("question {i}"), i as u64))
                .unwrap();
            assert_eq!(turn.context_tokens, prompt);
            // The same request alone gives the same turn.
            let again = p
                .generate(request(&format!("question {i}"), i as u64))
                .await
                .unwrap();
            assert_eq!(again.tokens, turn.tokens);
            if turn.finish == FinishReason::Stop {
                assert!(
                    p.policy_model()
                        .stop_token_ids
                        .contains(turn.tokens.last().unwrap())
                );
            } else {
                assert_eq!(turn.finish, FinishReason::Length);
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn update_guard_holds_decoding_off() {
        let p = Arc::new(policy());
        let guard = p.update_guard();
        let p2 = Arc::clone(&p);
        let call = tokio::spawn(async move { p2.generate(request("wait", 1)).await });
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        assert!(!call.is_finished());
        drop(guard);
        assert!(!call.await.unwrap().unwrap().tokens.is_empty());
    }

    #[tokio::test]
    async fn weights_reload_from_a_checkpoint() {
        let p = policy();
        let mut r = request("same", 2);
        r.sampling = SamplingParams::greedy();
        let before = p.generate(r.clone()).await.unwrap();
        let dir = tempfile::tempdir().unwrap();
        p.save_hf(dir.path()).unwrap();
        {
            let _guard = p.update_guard();
            for (_, var) in p.model().named_vars() {
                var.set(&(var.as_tensor() * 0.5).unwrap()).unwrap();
            }
        }
        p.load_weights(dir.path()).unwrap();
        let after = p.generate(r).await.unwrap();
        assert_eq!(before.tokens, after.tokens);
        assert_eq!(before.logprobs, after.logprobs);
    }

    fn policy_with(model: &PolicyModel, prefix_cache: PrefixCacheConfig) -> CandlePolicy {
        CandlePolicy::new(
            model.clone(),
            PolicyOptions {
                prefix_cache,
                ..PolicyOptions::default()
            },
        )
    }

    /// A request whose rendered prompt spans a few prefill blocks.
    fn long_request(user: &str, seed: u64) -> PolicyRequest {
        let mut r = request(user, seed);
        r.messages[0] = ChatMessage::system(
            "Be brief. Answer with one word, look words up when unsure, and never guess.",
        );
        r.max_new_tokens = 10;
        r
    }

    fn same_turn(a: &PolicyTurn, b: &PolicyTurn) {
        assert_eq!(a.context_tokens, b.context_tokens);
        assert_eq!(a.tokens, b.tokens);
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&a.logprobs), bits(&b.logprobs));
        assert_eq!(a.finish, b.finish);
    }

    /// Turns of an episode and a group of rollouts through a cached and an uncached policy.
    async fn episode_and_group(p: &CandlePolicy) -> Vec<PolicyTurn> {
        let mut turns = Vec::new();
        let mut r = long_request("define the word harness", 3);
        for step in 0..3u64 {
            let turn = p.generate(r.clone()).await.unwrap();
            r.messages.push(ChatMessage::assistant(turn.text.clone()));
            r.messages.push(ChatMessage::tool(
                "lookup",
                format!("entry {step}: nothing found"),
            ));
            r.seed += 1;
            turns.push(turn);
        }
        for k in 0..4 {
            turns.push(p.generate(long_request("spell it", 20 + k)).await.unwrap());
        }
        turns
    }

    #[tokio::test]
    async fn prefix_cache_keeps_turns_identical_and_counts_reuse() {
        let cached = policy();
        let model = cached.policy_model().clone();
        let plain = policy_with(&model, PrefixCacheConfig::disabled());
        let a = episode_and_group(&cached).await;
        let b = episode_and_group(&plain).await;
        assert!(a[0].context_tokens.len() > 2 * 64, "prompts span blocks");
        for (x, y) in a.iter().zip(&b) {
            same_turn(x, y);
        }
        let total: u64 = a.iter().map(|t| t.context_tokens.len() as u64).sum();
        let (sc, sp) = (cached.stats(), plain.stats());
        assert_eq!(sc.prefill_tokens_computed + sc.prefill_tokens_reused, total);
        assert_eq!(
            (sp.prefill_tokens_computed, sp.prefill_tokens_reused),
            (total, 0)
        );
        // Every request after the first reuses a prefix: later turns their episode's, the group's
        // rollouts the system prompt and tools (shared with the episode) or the group's prompt.
        assert_eq!(sc.prefix_cache_hits, 6, "{sc:?}");
        assert!(
            sc.prefill_tokens_reused > sc.prefill_tokens_computed,
            "{sc:?}"
        );
        assert!(sc.prefix_cache_bytes > 0 && sp.prefix_cache_bytes == 0);
    }

    #[tokio::test]
    async fn an_update_invalidates_the_prefix_cache() {
        let cached = policy();
        let model = cached.policy_model().clone();
        let r = long_request("define the word harness", 3);
        cached.generate(r.clone()).await.unwrap();
        {
            let _guard = cached.update_guard();
            for (_, var) in cached.model().named_vars() {
                var.set(&(var.as_tensor() * 0.5).unwrap()).unwrap();
            }
        }
        let after = cached.generate(r.clone()).await.unwrap();
        let st = cached.stats();
        assert_eq!(
            (st.prefix_cache_hits, st.prefix_cache_invalidations),
            (0, 1),
            "{st:?}"
        );
        // The same turn as a policy that never cached anything, under the new weights.
        let plain = policy_with(&model, PrefixCacheConfig::disabled());
        same_turn(&after, &plain.generate(r.clone()).await.unwrap());
        // Reloading a checkpoint is an update too.
        let dir = tempfile::tempdir().unwrap();
        cached.save_hf(dir.path()).unwrap();
        cached.load_weights(dir.path()).unwrap();
        cached.generate(r).await.unwrap();
        let st = cached.stats();
        assert_eq!(
            (st.prefix_cache_hits, st.prefix_cache_invalidations),
            (0, 2),
            "{st:?}"
        );
    }

    #[tokio::test]
    async fn context_overflow_returns_no_tokens() {
        let p = policy();
        let mut r = request("a long question", 1);
        let n = p.prompt_tokens(&r).unwrap().len();
        r.max_context_tokens = n - 1;
        let turn = p.generate(r.clone()).await.unwrap();
        assert_eq!(turn.finish, FinishReason::ContextOverflow);
        assert!(turn.tokens.is_empty() && turn.logprobs.is_empty());
        assert_eq!(turn.context_tokens.len(), n);
        r.max_context_tokens = n;
        assert_ne!(
            p.generate(r).await.unwrap().finish,
            FinishReason::ContextOverflow
        );
    }

    #[tokio::test]
    async fn next_turn_context_extends_previous_turn() {
        let p = policy();
        let mut r = request("go", 3);
        r.max_new_tokens = 8;
        let first = p.generate(r.clone()).await.unwrap();
        let mut r2 = r.clone();
        r2.messages.push(ChatMessage::assistant(first.text.clone()));
        r2.messages.push(ChatMessage::tool("lookup", "nothing"));
        let second = p.generate(r2.clone()).await.unwrap();
        let mut prefix = first.context_tokens.clone();
        prefix.extend(&first.tokens);
        // Whether the turn ended with <|im_end|> or by length, the next context continues the
        // exact tokens (a random model's output is rarely the canonical tokenization of its text).
        let eot = p
            .tokenizer()
            .token_to_id(crate::model::tokenizer::END_OF_TEXT)
            .unwrap();
        if first.tokens.last() != Some(&eot) {
            assert!(second.context_tokens.starts_with(&prefix));
        }
        // Without the memory, the prompt is a fresh tokenization of the rendered text.
        let fresh = CandlePolicy::new(
            p.policy_model().clone(),
            PolicyOptions {
                remembered_turns: 0,
                ..PolicyOptions::default()
            },
        );
        let text = p.template().render(&r2.messages, &r2.tools, true);
        assert_eq!(
            fresh.prompt_tokens(&r2).unwrap(),
            crate::model::tokenizer::encode(p.tokenizer(), &text).unwrap()
        );
    }

    #[tokio::test]
    async fn weights_are_shared_with_the_varmap() {
        let p = policy();
        let mut r = request("x", 5);
        r.sampling = SamplingParams::greedy();
        let before = p.generate(r.clone()).await.unwrap();
        {
            let _guard = p.update_guard();
            let data = p.varmap().data().lock().unwrap();
            let w = &data["model.norm.weight"];
            w.set(&(w.as_tensor() * 0.0).unwrap()).unwrap();
        }
        let after = p.generate(r).await.unwrap();
        // A zero final norm makes every logit zero: greedy picks id 0 with log-prob 0 (point mass).
        assert!(
            after.tokens.iter().all(|&t| t == 0),
            "{:?} vs {:?}",
            after.tokens,
            before.tokens
        );
    }
}
