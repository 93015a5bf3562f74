//! Batched, KV-cached sampling with per-token log-probs.
//!
//! [`generate`] runs several requests together: each prompt is prefilled on its own (without
//! padding, in chunks that end at fixed positions, so its keys and values do not depend on what
//! else is prefilled or cached: see [`crate::sample::prefix_cache`]), the rows are left-padded into
//! one batch, then decoded one token per step for every unfinished row; a finished row leaves the
//! batch (its cache rows are dropped). [`generate_cached`] starts each prompt from the longest
//! prefix a [`PrefixCache`] holds, with the same results. Each request has its own seed (ChaCha8),
//! so its tokens do not depend on what it was batched with, up to floating-point reassociation in
//! the matmuls.
//!
//! # Which log-probs
//! [`Sample::logprobs`] are log-probabilities under the **processed** distribution the token was
//! actually drawn from: logits / temperature, restricted to the top-k and then the top-p nucleus,
//! renormalised. This is `q` of the paper's Eq. 16. The trainer's `pi_old` is the model at
//! [`TrainerConfig::temperature`](crate::train::trainer::TrainerConfig::temperature) over the full
//! vocabulary, so its weight `clip(pi_old / q, 0, 2)` is an importance weight only for rollouts
//! sampled at that temperature without top-k or top-p: with truncation `q` is renormalised over
//! the kept tokens and the weight is biased on every token, and `Trainer::step` refuses such
//! rollouts (each trajectory records its turns' settings). Greedy decoding (temperature 0)
//! samples from a point mass: its processed log-prob is 0, whatever the model's probability.
//! [`Sample::raw_logprobs`] are the untouched model's log-probs (temperature 1, full vocabulary)
//! of the same tokens, for diagnostics and for trainers that want them.

use std::sync::Arc;

use candle_core::{DType, Tensor};
use harness_core::{FinishReason, OutputFormat, SamplingParams};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokenizers::Tokenizer;

use crate::error::{Error, Result};
use crate::model::{KvCache, Qwen};
use crate::sample::json::{JsonState, JsonVocab};
use crate::sample::prefix_cache::PrefixCache;

/// One generation request.
#[derive(Debug, Clone, PartialEq)]
pub struct SampleRequest {
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Upper bound on generated tokens.
    pub max_new_tokens: usize,
    /// Temperature, top-p, top-k, stop strings.
    pub params: SamplingParams,
    /// Token ids that end generation (kept as the last generated token), e.g. `<|im_end|>`.
    pub stop_token_ids: Vec<u32>,
    /// Seed of this request's ChaCha8 stream.
    pub seed: u64,
    /// Free text, or one JSON object: then each token is drawn from the processed distribution
    /// restricted to the tokens [`crate::sample::json`] accepts, its [`Sample::logprobs`] are
    /// under that restricted distribution, and generation stops with a stop token once the
    /// object closes.
    pub format: OutputFormat,
}

/// What one request produced.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// Generated ids (a stop token, when one ended generation, is the last).
    pub tokens: Vec<u32>,
    /// Log-prob of each token under the processed distribution it was drawn from (`q`).
    pub logprobs: Vec<f32>,
    /// Log-prob of each token under the raw model (temperature 1, full vocabulary).
    pub raw_logprobs: Vec<f32>,
    /// `Stop` (stop token or string) or `Length` (`max_new_tokens` or the model's context).
    pub finish: FinishReason,
}

/// Check sampling parameters.
pub fn validate_params(p: &SamplingParams) -> Result<()> {
    if !(p.temperature.is_finite() && p.temperature >= 0.0) {
        return Err(Error::Request(format!(
            "temperature {} must be >= 0",
            p.temperature
        )));
    }
    if !(p.top_p > 0.0 && p.top_p <= 1.0) {
        return Err(Error::Request(format!(
            "top_p {} must be in (0, 1]",
            p.top_p
        )));
    }
    if p.top_k == Some(0) {
        return Err(Error::Request("top_k must be at least 1 when given".into()));
    }
    Ok(())
}

/// Draw one token from `logits` (f32, one row) with `params`; returns (token, processed log-prob,
/// raw log-prob). Logits holding a NaN, or no finite value, give token 0 with NaN log-probs
/// (the batched sampler refuses them as diverged weights).
pub fn sample_token(
    logits: &[f32],
    params: &SamplingParams,
    rng: &mut ChaCha8Rng,
) -> (u32, f32, f32) {
    sample_token_into(logits, params, rng, &mut Scratch::default()).unwrap_or((
        0,
        f32::NAN,
        f32::NAN,
    ))
}

/// Buffers over the vocabulary that [`sample_token_into`] reuses from token to token.
#[derive(Debug, Default)]
struct Scratch {
    weights: Vec<f64>,
    order: Vec<usize>,
}

/// The first nucleus candidates taken by a partial sort; grown fourfold while their mass falls
/// short of `top_p` (a nucleus over a 32k vocabulary rarely holds more than a few hundred).
const NUCLEUS_FIRST: usize = 64;

/// [`sample_token`] with reused buffers; `None` for logits holding a NaN or no finite value.
///
/// Top-p without top-k orders only the candidates it needs: a partial sort
/// (`select_nth_unstable`) of the heaviest [`NUCLEUS_FIRST`] tokens, more only when they do not
/// reach `top_p`, instead of sorting the whole vocabulary every token. The nucleus is the same
/// smallest prefix of the same order (decreasing probability, ties by id), so the same token is
/// drawn with the same log-prob; only the normaliser the prefix's mass is compared against is
/// summed in vocabulary order rather than in sorted order.
fn sample_token_into(
    logits: &[f32],
    params: &SamplingParams,
    rng: &mut ChaCha8Rng,
    scratch: &mut Scratch,
) -> Option<(u32, f32, f32)> {
    let mut max = f32::NEG_INFINITY;
    let mut finite = false;
    for &l in logits {
        if l.is_nan() {
            return None;
        }
        finite |= l.is_finite();
        max = max.max(l);
    }
    if !finite {
        return None;
    }
    let max = max as f64;
    if params.temperature <= 0.0 {
        // Greedy: the first maximal logit.
        let mut best = 0usize;
        for (i, &l) in logits.iter().enumerate() {
            if l > logits[best] {
                best = i;
            }
        }
        let lse = log_sum_exp(logits, max);
        return Some((best as u32, 0.0, (logits[best] as f64 - lse) as f32));
    }
    let inv_t = 1.0 / params.temperature as f64;
    let scaled_max = max * inv_t;
    let weights = &mut scratch.weights;
    weights.clear();
    weights.extend(
        logits
            .iter()
            .map(|&l| (l as f64 * inv_t - scaled_max).exp()),
    );
    // At temperature 1 the weights are the raw softmax's terms (`x * 1.0 == x`): one pass of
    // `exp` over the vocabulary instead of two.
    let lse = if inv_t == 1.0 {
        max + weights.iter().sum::<f64>().ln()
    } else {
        log_sum_exp(logits, max)
    };
    let raw = |i: usize| (logits[i] as f64 - lse) as f32;
    let top_k = params.top_k.filter(|&k| k < logits.len());
    if top_k.is_none() && params.top_p >= 1.0 {
        let total: f64 = weights.iter().sum();
        let u = rng.r#gen::<f64>() * total;
        let mut acc = 0.0;
        let mut chosen = weights.len() - 1;
        for (i, w) in weights.iter().enumerate() {
            acc += w;
            if u < acc {
                chosen = i;
                break;
            }
        }
        while weights[chosen] == 0.0 && chosen > 0 {
            chosen -= 1;
        }
        let lp = (weights[chosen] / total).ln() as f32;
        return Some((chosen as u32, lp, raw(chosen)));
    }
    let weights = &scratch.weights;
    let order = &mut scratch.order;
    // Candidates by decreasing probability (ties by id): top-k, then the smallest prefix whose
    // mass reaches top_p (at least one token).
    let by_weight = |a: &usize, b: &usize| weights[*b].total_cmp(&weights[*a]).then(a.cmp(b));
    let kept = match top_k {
        Some(k) => {
            order.clear();
            order.extend(0..weights.len());
            order.select_nth_unstable_by(k - 1, by_weight);
            order.truncate(k);
            order.sort_by(by_weight);
            let total_k: f64 = order.iter().map(|&i| weights[i]).sum();
            nucleus(order, weights, total_k, params.top_p).unwrap_or(order.len())
        }
        None => {
            let total: f64 = weights.iter().sum();
            let mut m = NUCLEUS_FIRST.min(weights.len());
            loop {
                order.clear();
                order.extend(0..weights.len());
                if m < order.len() {
                    order.select_nth_unstable_by(m - 1, by_weight);
                    order.truncate(m);
                }
                order.sort_by(by_weight);
                match nucleus(order, weights, total, params.top_p) {
                    Some(n) => break n,
                    None if m == weights.len() => break m,
                    None => m = (m * 4).min(weights.len()),
                }
            }
        }
    };
    let order = &order[..kept];
    let total: f64 = order.iter().map(|&i| weights[i]).sum();
    let u = rng.r#gen::<f64>() * total;
    let mut acc = 0.0;
    let mut chosen = order[order.len() - 1];
    for &i in order {
        acc += weights[i];
        if u < acc {
            chosen = i;
            break;
        }
    }
    let lp = (weights[chosen] / total).ln() as f32;
    Some((chosen as u32, lp, raw(chosen)))
}

/// `max + ln(sum(exp(l - max)))` in f64.
fn log_sum_exp(logits: &[f32], max: f64) -> f64 {
    max + logits
        .iter()
        .map(|&l| (l as f64 - max).exp())
        .sum::<f64>()
        .ln()
}

/// How many of the sorted candidates `order` the top-p nucleus keeps: the smallest prefix whose
/// mass (over `total`) reaches `top_p`, or `None` if all of `order` falls short.
fn nucleus(order: &[usize], weights: &[f64], total: f64, top_p: f32) -> Option<usize> {
    if top_p >= 1.0 {
        return None;
    }
    let mut acc = 0.0;
    for (n, &i) in order.iter().enumerate() {
        acc += weights[i] / total;
        if acc >= top_p as f64 {
            return Some(n + 1);
        }
    }
    None
}

/// Prompt tokens per prefill block, and the granularity of prefix reuse (vLLM's block size).
/// Every prompt is prefilled block by block, `[0, 64)`, `[64, 128)`, ..., the last block ending
/// at the prompt's end, and a cached prefix is reused up to a block boundary only. A cached and
/// an uncached prefill of a prompt then compute the same blocks from the same inputs, so they
/// agree bit for bit. Both conditions are needed: a block's attention sums over the columns
/// before it in an order set by its own shape, so starting a prefill mid-block, or feeding two
/// blocks of a prompt as one, would change the last bits. 64 rows per prompt and pass keep the
/// attention scores of a block at `[64 x prompt]`.
const PREFILL_BLOCK: usize = 64;

/// Most prompt tokens in one prefill forward pass: the blocks of up to 32 prompts at a time.
const PREFILL_PASS_TOKENS: usize = 32 * PREFILL_BLOCK;

/// A prompt being prefilled.
struct Prefill {
    cache: KvCache,
    /// Prompt tokens whose keys and values the cache holds.
    done: usize,
    /// An earlier prompt of the batch to copy the first tokens from, once it has computed them.
    wait: Option<(usize, usize)>,
    /// The final hidden state of the last prompt token, once computed.
    last: Option<Tensor>,
}

/// Length of the common prefix of two prompts.
fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// Prefill distinct prompts, each starting from the longest prefix `prefix` holds or, when the
/// cache is enabled, from a longer prefix it shares with an earlier prompt of the same call
/// (taken from that prompt's keys and values once they are computed); store them in `prefix`.
/// Returns one one-row cache and next-token logits `[1, vocab]` per prompt.
///
/// Each forward pass feeds the next block of every prompt that has one (up to
/// [`PREFILL_PASS_TOKENS`]; one prompt per pass off the CPU), so the weight products run once
/// for all of them ([`Qwen::prefill_segments`]). A prompt's bits depend only on its own blocks, not on which
/// prompts share a pass, so cached and uncached prefills stay identical.
fn prefill_prompts(
    model: &Qwen,
    prompts: &[&[u32]],
    mut prefix: Option<&mut PrefixCache>,
) -> Result<Vec<(KvCache, Tensor)>> {
    let version = model.weights_version();
    let block_floor = |n: usize| n / PREFILL_BLOCK * PREFILL_BLOCK;
    let share = prefix.as_ref().is_some_and(|c| c.config().budget_bytes > 0);
    let mut rows: Vec<Prefill> = Vec::with_capacity(prompts.len());
    for (i, prompt) in prompts.iter().enumerate() {
        let reuse = match prefix.as_deref_mut() {
            Some(c) => c.lookup(model, prompt, block_floor)?,
            None => None,
        };
        let hit = reuse.is_some();
        let (cache, done) = match reuse {
            Some(r) => (r.cache, r.tokens),
            None => (KvCache::for_model(model, 1), 0),
        };
        let mut wait = None;
        if share {
            // The last prompt token is always computed: its hidden state gives the logits.
            let cap = prompt.len() - 1;
            let mut best: Option<(usize, usize)> = None;
            for (j, earlier) in prompts[..i].iter().enumerate() {
                let n = block_floor(common_prefix(earlier, prompt).min(cap));
                if n > done && best.is_none_or(|(_, m)| n > m) {
                    best = Some((j, n));
                }
            }
            if let (Some((j, n)), Some(c)) = (best, prefix.as_deref_mut()) {
                c.record_batch_prefix(hit, n - done);
                wait = Some((j, n));
            }
        }
        rows.push(Prefill {
            cache,
            done,
            wait,
            last: None,
        });
    }
    loop {
        for i in 0..rows.len() {
            if let Some((j, n)) = rows[i].wait
                && rows[j].done >= n
            {
                rows[i].cache = rows[j].cache.first_columns(n)?;
                rows[i].done = n;
                rows[i].wait = None;
            }
        }
        let mut budget = PREFILL_PASS_TOKENS;
        let mut fed = Vec::new();
        let mut segments = Vec::new();
        for (i, row) in rows.iter_mut().enumerate() {
            let prompt = prompts[i];
            if row.wait.is_some() || row.done >= prompt.len() || budget == 0 {
                continue;
            }
            // On CUDA a row's bits may depend on the shape of the call: one prompt per pass
            // keeps cached and uncached prefills identical there.
            if !model.device().is_cpu() && !segments.is_empty() {
                break;
            }
            let end = (row.done + PREFILL_BLOCK).min(prompt.len());
            budget = budget.saturating_sub(PREFILL_BLOCK);
            fed.push((i, end));
            segments.push((&prompt[row.done..end], &mut row.cache));
        }
        if segments.is_empty() {
            break;
        }
        let hidden = model.prefill_segments(&mut segments)?;
        for (slot, &(i, end)) in fed.iter().enumerate() {
            rows[i].done = end;
            if end == prompts[i].len() {
                rows[i].last = Some(hidden.narrow(0, slot, 1)?);
            }
        }
    }
    // A row's logits do not depend on the other rows of a call of at most this many.
    let mut logits = Vec::with_capacity(rows.len());
    for chunk in rows.chunks(crate::model::decoder::INVARIANT_LOGIT_ROWS) {
        let last = chunk
            .iter()
            .map(|r| {
                r.last
                    .clone()
                    .expect("every prompt is prefilled to its end")
            })
            .collect::<Vec<_>>();
        let l = model.last_logits(&Tensor::cat(&last, 0)?)?;
        for r in 0..chunk.len() {
            logits.push(l.narrow(0, r, 1)?);
        }
    }
    if let Some(c) = prefix {
        for (prompt, row) in prompts.iter().zip(&rows) {
            c.insert(model, version, prompt, &row.cache)?;
        }
    }
    Ok(rows.into_iter().map(|r| r.cache).zip(logits).collect())
}

/// A request being decoded.
struct Row<K> {
    key: K,
    request: SampleRequest,
    rng: ChaCha8Rng,
    sample: Sample,
    /// The JSON recogniser of a [`OutputFormat::JsonObject`] request.
    json: Option<JsonState>,
}

/// The raw model's log-prob of `token` (temperature 1, full vocabulary).
fn raw_logprob(logits: &[f32], token: u32) -> f32 {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &l| m.max(l)) as f64;
    (logits[token as usize] as f64 - log_sum_exp(logits, max)) as f32
}

/// Longest stop string in bytes (the decode window for stop-string checks is derived from it).
fn stop_window(params: &SamplingParams) -> usize {
    params.stop.iter().map(String::len).max().unwrap_or(0)
}

/// Whether the text of the last generated tokens contains a stop string that ends in the newest
/// token.
fn hits_stop_string(
    tokenizer: &Tokenizer,
    tokens: &[u32],
    params: &SamplingParams,
) -> Result<bool> {
    let window = stop_window(params);
    if window == 0 {
        return Ok(false);
    }
    // Every token decodes to at least one byte (special tokens aside), so `window + 4` tokens
    // cover the longest stop string plus a split UTF-8 character at the start of the window.
    let start = tokens.len().saturating_sub(window + 4);
    let now = crate::model::tokenizer::decode(tokenizer, &tokens[start..], true)?;
    // Generation stops at the first occurrence, so any occurrence ends in the newest token.
    Ok(params
        .stop
        .iter()
        .any(|s| !s.is_empty() && now.contains(s.as_str())))
}

/// Check a request against the model.
pub fn validate_request(model: &Qwen, r: &SampleRequest) -> Result<()> {
    validate_params(&r.params)?;
    if r.prompt.is_empty() {
        return Err(Error::Request("empty prompt".into()));
    }
    if let Some(&bad) = r
        .prompt
        .iter()
        .find(|&&t| t as usize >= model.config().vocab_size)
    {
        return Err(Error::Request(format!(
            "token id {bad} outside the vocabulary"
        )));
    }
    Ok(())
}

/// Continuous batching: rows decode together one token per [`DecodeBatch::step`], and new
/// requests can join between steps ([`DecodeBatch::add`]) without waiting for the others to
/// finish. Each row keeps its own seed stream, so what it generates does not depend on when it
/// joined or with whom (up to floating-point reassociation in the batched matmuls).
pub struct DecodeBatch<'m, K> {
    model: &'m Qwen,
    rows: Vec<Row<K>>,
    cache: KvCache,
    /// Next-token logits `[rows, vocab]` (f32), aligned with `rows`.
    logits: Option<Tensor>,
    /// The sampler's per-token buffer over the vocabulary, reused across rows and steps.
    scratch: Scratch,
    /// Token bytes for JSON-constrained rows: handed over by [`DecodeBatch::with_json_vocab`],
    /// or built from the tokenizer at the first such row.
    json_vocab: Option<Arc<JsonVocab>>,
    /// A constrained row's masked logits.
    masked: Vec<f32>,
}

impl<'m, K> DecodeBatch<'m, K> {
    /// An empty batch.
    pub fn new(model: &'m Qwen) -> Self {
        DecodeBatch {
            model,
            rows: Vec::new(),
            cache: KvCache::new(model.config().num_hidden_layers, Vec::new()),
            logits: None,
            scratch: Scratch::default(),
            json_vocab: None,
            masked: Vec::new(),
        }
    }

    /// Check JSON rows against `vocab` (the tokenizer's, as [`JsonVocab::new`] builds it)
    /// instead of building it again: a server keeps one across its batches.
    pub fn with_json_vocab(mut self, vocab: Option<Arc<JsonVocab>>) -> Self {
        self.json_vocab = vocab;
        self
    }

    /// The token bytes JSON rows were checked against, once a JSON row was decoded or one was
    /// handed over.
    pub fn json_vocab(&self) -> Option<&Arc<JsonVocab>> {
        self.json_vocab.as_ref()
    }

    /// Rows being decoded.
    pub fn len(&self) -> usize {
        self.rows.len()
    }

    /// Whether no row is being decoded.
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// Prefill `requests` and add them to the batch. Requests that need no decoding
    /// (`max_new_tokens == 0`, or a prompt filling the model's context) come back at once as
    /// finished.
    pub fn add(&mut self, requests: Vec<(K, SampleRequest)>) -> Result<Vec<(K, Sample)>> {
        self.add_impl(requests, None)
    }

    /// [`DecodeBatch::add`], starting each prompt from the longest prefix `prefix` holds and
    /// storing the prompts there. The results are bit-identical to [`DecodeBatch::add`]'s.
    pub fn add_cached(
        &mut self,
        requests: Vec<(K, SampleRequest)>,
        prefix: &mut PrefixCache,
    ) -> Result<Vec<(K, Sample)>> {
        self.add_impl(requests, Some(prefix))
    }

    fn add_impl(
        &mut self,
        requests: Vec<(K, SampleRequest)>,
        mut prefix: Option<&mut PrefixCache>,
    ) -> Result<Vec<(K, Sample)>> {
        for (_, r) in &requests {
            validate_request(self.model, r)?;
        }
        let max_pos = self.model.config().max_position_embeddings;
        let mut done = Vec::new();
        let mut fresh = Vec::new();
        for (key, request) in requests {
            let sample = Sample {
                tokens: Vec::new(),
                logprobs: Vec::new(),
                raw_logprobs: Vec::new(),
                finish: FinishReason::Length,
            };
            if request.max_new_tokens == 0 || request.prompt.len() >= max_pos {
                done.push((key, sample));
            } else {
                let rng = ChaCha8Rng::seed_from_u64(request.seed);
                let json = (request.format == OutputFormat::JsonObject).then(JsonState::new);
                fresh.push(Row {
                    key,
                    request,
                    rng,
                    sample,
                    json,
                });
            }
        }
        if fresh.is_empty() {
            return Ok(done);
        }
        // The rows of one prompt (the `n` choices of a request, the K rollouts of a group)
        // share one prefill: the same prompt prefilled again would give the same bits.
        let mut first_of: std::collections::HashMap<&[u32], usize> =
            std::collections::HashMap::new();
        let mut distinct: Vec<&[u32]> = Vec::new();
        let mut which = Vec::with_capacity(fresh.len());
        for row in &fresh {
            let prompt = row.request.prompt.as_slice();
            if let Some(&j) = first_of.get(prompt) {
                if let Some(c) = prefix.as_deref_mut() {
                    c.record_shared(prompt.len());
                }
                which.push(j);
                continue;
            }
            first_of.insert(prompt, distinct.len());
            which.push(distinct.len());
            distinct.push(prompt);
        }
        let prefilled = prefill_prompts(self.model, &distinct, prefix)?;
        let mut caches = Vec::with_capacity(fresh.len() + 1);
        let mut logits = Vec::with_capacity(fresh.len() + 1);
        let running = (!self.rows.is_empty()).then(|| {
            let cache = std::mem::replace(
                &mut self.cache,
                KvCache::new(self.model.config().num_hidden_layers, Vec::new()),
            );
            (cache, self.logits.take().expect("rows have logits"))
        });
        if let Some((cache, l)) = &running {
            caches.push(cache);
            logits.push(l.clone());
        }
        for &j in &which {
            caches.push(&prefilled[j].0);
            logits.push(prefilled[j].1.clone());
        }
        self.cache = KvCache::stack(&caches)?;
        self.logits = Some(Tensor::cat(&logits, 0)?);
        self.rows.extend(fresh);
        Ok(done)
    }
    /// Sample one token for every row; return the rows that finished (stop token or string,
    /// `max_new_tokens`, or the model's context) and feed the others' tokens.
    pub fn step(&mut self, tokenizer: &Tokenizer) -> Result<Vec<(K, Sample)>> {
        self.step_observed(tokenizer, |_, _| true)
    }

    /// [`DecodeBatch::step`], showing each row's new token to `observe` (its key and the
    /// sample so far, the new token last) as soon as it is drawn: streaming. A row for which
    /// `observe` returns `false` (its client went away) leaves the batch at once, before the
    /// next forward pass, and comes back among the finished rows with what it generated.
    pub fn step_observed(
        &mut self,
        tokenizer: &Tokenizer,
        mut observe: impl FnMut(&K, &Sample) -> bool,
    ) -> Result<Vec<(K, Sample)>> {
        let Some(logits) = self.logits.take() else {
            return Ok(Vec::new());
        };
        let max_pos = self.model.config().max_position_embeddings;
        // One host copy of the whole `[rows, vocab]` table, read row by row.
        let table: Vec<f32> = logits.to_dtype(DType::F32)?.flatten_all()?.to_vec1()?;
        let vocab = table.len() / self.rows.len().max(1);
        let mut next_tokens = Vec::with_capacity(self.rows.len());
        let mut keep = Vec::with_capacity(self.rows.len());
        let mut finished = vec![false; self.rows.len()];
        for (slot, row) in self.rows.iter_mut().enumerate() {
            let req = &row.request;
            let logits = &table[slot * vocab..(slot + 1) * vocab];
            let diverged =
                || Error::Msg("the model produced non-finite logits (diverged weights?)".into());
            let (tok, lp, raw) = match row.json.as_mut() {
                None => sample_token_into(logits, &req.params, &mut row.rng, &mut self.scratch)
                    .ok_or_else(diverged)?,
                Some(state) => {
                    if logits.iter().any(|l| l.is_nan()) {
                        return Err(diverged());
                    }
                    let json = self
                        .json_vocab
                        .get_or_insert_with(|| Arc::new(JsonVocab::new(tokenizer, vocab)));
                    self.masked.clear();
                    self.masked.extend_from_slice(logits);
                    if json.mask(state, &req.stop_token_ids, &mut self.masked) == 0 {
                        // Nothing may follow (an object closed with no stop token to end on).
                        row.sample.finish = if state.is_done() {
                            FinishReason::Stop
                        } else {
                            FinishReason::Length
                        };
                        finished[slot] = true;
                        continue;
                    }
                    let (tok, lp, _) = sample_token_into(
                        &self.masked,
                        &req.params,
                        &mut row.rng,
                        &mut self.scratch,
                    )
                    .ok_or_else(diverged)?;
                    if let Some(bytes) = json.bytes(tok) {
                        state.feed(bytes);
                    }
                    (tok, lp, raw_logprob(logits, tok))
                }
            };
            row.sample.tokens.push(tok);
            row.sample.logprobs.push(lp);
            row.sample.raw_logprobs.push(raw);
            let produced = row.sample.tokens.len();
            let wanted = observe(&row.key, &row.sample);
            if req.stop_token_ids.contains(&tok)
                || hits_stop_string(tokenizer, &row.sample.tokens, &req.params)?
            {
                row.sample.finish = FinishReason::Stop;
                finished[slot] = true;
            } else if !wanted
                || produced >= req.max_new_tokens
                || req.prompt.len() + produced >= max_pos
            {
                row.sample.finish = FinishReason::Length;
                finished[slot] = true;
            } else {
                keep.push(slot);
                next_tokens.push(tok);
            }
        }
        let mut done = Vec::new();
        if keep.len() < self.rows.len() {
            self.cache = self.cache.select_rows(&keep)?;
            let rows = std::mem::take(&mut self.rows);
            for (slot, row) in rows.into_iter().enumerate() {
                if finished[slot] {
                    done.push((row.key, row.sample));
                } else {
                    self.rows.push(row);
                }
            }
        }
        if !self.rows.is_empty() {
            let input = Tensor::from_vec(next_tokens, (self.rows.len(), 1), self.model.device())?;
            let hidden = self.model.forward_decode(&input, &mut self.cache)?;
            self.logits = Some(self.model.last_logits(&hidden)?);
        }
        Ok(done)
    }
}

/// Generate for every request in one batch (results in request order). `tokenizer` is needed
/// only for stop strings.
pub fn generate(
    model: &Qwen,
    tokenizer: &Tokenizer,
    requests: &[SampleRequest],
) -> Result<Vec<Sample>> {
    generate_impl(model, tokenizer, requests, None)
}

/// [`generate`], starting each prompt from the longest prefix `prefix` holds and storing the
/// prompts there: bit-identical results, fewer prefilled tokens.
pub fn generate_cached(
    model: &Qwen,
    tokenizer: &Tokenizer,
    requests: &[SampleRequest],
    prefix: &mut PrefixCache,
) -> Result<Vec<Sample>> {
    generate_impl(model, tokenizer, requests, Some(prefix))
}

fn generate_impl(
    model: &Qwen,
    tokenizer: &Tokenizer,
    requests: &[SampleRequest],
    prefix: Option<&mut PrefixCache>,
) -> Result<Vec<Sample>> {
    for (i, r) in requests.iter().enumerate() {
        validate_request(model, r).map_err(|e| Error::Request(format!("request {i}: {e}")))?;
    }
    let mut out: Vec<Option<Sample>> = vec![None; requests.len()];
    let mut batch = DecodeBatch::new(model);
    let keyed = requests.iter().cloned().enumerate().collect();
    for (i, s) in batch.add_impl(keyed, prefix)? {
        out[i] = Some(s);
    }
    while !batch.is_empty() {
        for (i, s) in batch.step(tokenizer)? {
            out[i] = Some(s);
        }
    }
    Ok(out
        .into_iter()
        .map(|s| s.expect("every request finishes"))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::prefix_cache::PrefixCacheConfig;
    use candle_core::Device;

    fn params(t: f32, p: f32, k: Option<usize>) -> SamplingParams {
        SamplingParams {
            temperature: t,
            top_p: p,
            top_k: k,
            stop: vec![],
        }
    }

    #[test]
    fn processed_logprobs_follow_temperature_and_truncation() {
        let logits = [2.0f32, 1.0, 0.5, -1.0, 0.0];
        let mut rng = ChaCha8Rng::seed_from_u64(0);
        // Greedy.
        let (t, lp, raw) = sample_token(&logits, &params(0.0, 1.0, None), &mut rng);
        assert_eq!((t, lp), (0, 0.0));
        let lse = logits.iter().map(|&l| (l as f64).exp()).sum::<f64>().ln();
        assert!((raw as f64 - (2.0 - lse)).abs() < 1e-6);
        // top_k = 1 is greedy with log-prob 0.
        let (t, lp, _) = sample_token(&logits, &params(1.0, 1.0, Some(1)), &mut rng);
        assert_eq!((t, lp), (0, 0.0));
        // top_k = 2 at temperature 0.5: probabilities over {0, 1} of exp(4) : exp(2).
        for _ in 0..20 {
            let (t, lp, raw) = sample_token(&logits, &params(0.5, 1.0, Some(2)), &mut rng);
            assert!(t < 2);
            let z = (4.0f64).exp() + (2.0f64).exp();
            let want = (2.0 * logits[t as usize] as f64).exp() / z;
            assert!((lp as f64 - want.ln()).abs() < 1e-6);
            assert!((raw as f64 - (logits[t as usize] as f64 - lse)).abs() < 1e-6);
        }
        // top_p smaller than the top token's mass keeps only it.
        let (t, lp, _) = sample_token(&logits, &params(1.0, 0.3, None), &mut rng);
        assert_eq!((t, lp), (0, 0.0));
    }

    #[test]
    fn sampling_frequencies_match_the_distribution() {
        let logits = [0.0f32, (2.0f32).ln(), (3.0f32).ln(), f32::NEG_INFINITY];
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut counts = [0usize; 4];
        let n = 60_000;
        for _ in 0..n {
            let (t, lp, raw) = sample_token(&logits, &params(1.0, 1.0, None), &mut rng);
            counts[t as usize] += 1;
            assert!((lp - raw).abs() < 1e-6);
        }
        assert_eq!(counts[3], 0);
        for (i, want) in [1.0 / 6.0, 2.0 / 6.0, 3.0 / 6.0].iter().enumerate() {
            let got = counts[i] as f64 / n as f64;
            assert!((got - want).abs() < 0.01, "token {i}: {got} vs {want}");
        }
    }

    /// The sampler before the partial sort: every truncated draw sorts the whole vocabulary.
    fn full_sort_sample_token(
        logits: &[f32],
        params: &SamplingParams,
        rng: &mut ChaCha8Rng,
    ) -> (u32, f32, f32) {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = log_sum_exp(logits, max);
        let raw = |i: usize| (logits[i] as f64 - lse) as f32;
        let inv_t = 1.0 / params.temperature as f64;
        let weights: Vec<f64> = logits
            .iter()
            .map(|&l| (l as f64 * inv_t - max * inv_t).exp())
            .collect();
        let mut order: Vec<usize> = (0..weights.len()).collect();
        let k = params.top_k.unwrap_or(weights.len()).min(weights.len());
        let by_weight = |a: &usize, b: &usize| weights[*b].total_cmp(&weights[*a]).then(a.cmp(b));
        order.sort_by(by_weight);
        order.truncate(k);
        let total_k: f64 = order.iter().map(|&i| weights[i]).sum();
        let mut kept = order.len();
        let mut acc = 0.0;
        for (n, &i) in order.iter().enumerate() {
            acc += weights[i] / total_k;
            if acc >= params.top_p as f64 {
                kept = n + 1;
                break;
            }
        }
        let order = &order[..kept];
        let total: f64 = order.iter().map(|&i| weights[i]).sum();
        let u = rng.r#gen::<f64>() * total;
        let mut acc = 0.0;
        let mut chosen = order[order.len() - 1];
        for &i in order {
            acc += weights[i];
            if u < acc {
                chosen = i;
                break;
            }
        }
        (
            chosen as u32,
            (weights[chosen] / total).ln() as f32,
            raw(chosen),
        )
    }

    #[test]
    fn partial_sort_nucleus_draws_what_the_full_sort_draws() {
        let mut gen_rng = ChaCha8Rng::seed_from_u64(2024);
        let mut grown = 0;
        for case in 0..400 {
            // Vocabularies from tiny to Qwen-sized slices, peaked to flat logits, with ties.
            let vocab = [5usize, 70, 1000, 4096][case % 4];
            let scale = [0.5f32, 2.0, 6.0, 12.0][(case / 4) % 4];
            let mut logits: Vec<f32> = (0..vocab)
                .map(|_| (gen_rng.r#gen::<f32>() * 2.0 - 1.0) * scale)
                .collect();
            if case % 5 == 0 {
                let copy = logits[1];
                logits[vocab - 1] = copy; // a tie
            }
            let top_p = [0.1f32, 0.5, 0.9, 0.95, 0.999][case % 5];
            let temperature = [0.6f32, 1.0, 1.3][case % 3];
            let top_k = [None, Some(3), Some(vocab / 2 + 1), Some(vocab + 5)][(case / 3) % 4];
            let p = params(temperature, top_p, top_k);
            let mut a = ChaCha8Rng::seed_from_u64(case as u64);
            let mut b = a.clone();
            let mut scratch = Scratch::default();
            for draw in 0..8 {
                let got = sample_token_into(&logits, &p, &mut a, &mut scratch).unwrap();
                let want = full_sort_sample_token(&logits, &p, &mut b);
                assert_eq!(got.0, want.0, "case {case} draw {draw}: {p:?}");
                assert_eq!(got.1.to_bits(), want.1.to_bits(), "case {case} draw {draw}");
                assert_eq!(got.2.to_bits(), want.2.to_bits(), "case {case} draw {draw}");
            }
            if top_k.is_none() && scratch.order.len() > NUCLEUS_FIRST {
                grown += 1;
            }
        }
        // Flat distributions needed more than the first partial sort.
        assert!(grown > 0);
    }

    #[test]
    fn non_finite_logits_are_refused() {
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let mut s = Scratch::default();
        let p = params(1.0, 0.9, None);
        assert!(sample_token_into(&[0.0, f32::NAN], &p, &mut rng, &mut s).is_none());
        assert!(sample_token_into(&[f32::NEG_INFINITY; 3], &p, &mut rng, &mut s).is_none());
        assert!(sample_token_into(&[f32::NEG_INFINITY, 1.0], &p, &mut rng, &mut s).is_some());
    }

    #[test]
    fn a_group_in_one_batch_prefills_its_prompt_once() {
        let (model, tok) = tiny_model();
        let prompt: Vec<u32> = (0..150).map(|i| (i * 11 + 3) % 200).collect();
        let group: Vec<SampleRequest> = (0..8)
            .map(|k| req(&prompt, 100 + k, params(1.0, 0.95, None), 5))
            .collect();
        let alone: Vec<Sample> = group
            .iter()
            .map(|r| {
                generate(&model, &tok, std::slice::from_ref(r))
                    .unwrap()
                    .remove(0)
            })
            .collect();
        let mut cache = PrefixCache::new(PrefixCacheConfig::default());
        let together = generate_cached(&model, &tok, &group, &mut cache).unwrap();
        // Bit for bit as the uncached batch; as each rollout alone up to the batched matmuls'
        // rounding.
        assert_same(&generate(&model, &tok, &group).unwrap(), &together);
        for (a, b) in alone.iter().zip(&together) {
            assert_eq!(a.tokens, b.tokens);
            for (x, y) in a.raw_logprobs.iter().zip(&b.raw_logprobs) {
                assert!((x - y).abs() < 1e-4);
            }
        }
        assert!(
            together.windows(2).any(|w| w[0].tokens != w[1].tokens),
            "distinct seeds give distinct samples"
        );
        let st = cache.stats();
        // One prefill, one stored entry; the other seven rows shared it.
        assert_eq!(st.computed_tokens, prompt.len() as u64, "{st:?}");
        assert_eq!(st.reused_tokens, 7 * prompt.len() as u64, "{st:?}");
        assert_eq!((st.shared, st.entries, st.inserted), (7, 1, 1), "{st:?}");
        // The same group again, one rollout at a time: each reuses the stored prompt (up to
        // its last block) and the cache still holds one entry.
        for r in &group {
            let again = generate_cached(&model, &tok, std::slice::from_ref(r), &mut cache).unwrap();
            assert_same(&again, &alone[(r.seed - 100) as usize..][..1]);
        }
        let st = cache.stats();
        assert_eq!((st.entries, st.inserted), (1, 1), "{st:?}");
        assert_eq!((st.hits, st.shared), (8, 7), "{st:?}");
    }

    #[test]
    fn an_observer_sees_every_token_and_can_drop_a_row() {
        let (model, tok) = tiny_model();
        let a = req(&[5, 6, 7], 1, params(1.0, 1.0, None), 12);
        let b = req(&[8, 9], 2, params(1.0, 1.0, None), 12);
        let want = generate(&model, &tok, &[a.clone(), b.clone()]).unwrap();
        let mut batch = DecodeBatch::new(&model);
        batch.add(vec![("a", a), ("b", b)]).unwrap();
        let mut seen: std::collections::HashMap<&str, Vec<u32>> = Default::default();
        let mut done = std::collections::HashMap::new();
        let mut steps = 0;
        while !batch.is_empty() {
            steps += 1;
            let out = batch
                .step_observed(&tok, |k, s| {
                    seen.entry(*k).or_default().push(*s.tokens.last().unwrap());
                    // `b`'s client leaves after its third token.
                    !(*k == "b" && s.tokens.len() == 3)
                })
                .unwrap();
            done.extend(out);
        }
        assert_eq!(steps, 12);
        assert_eq!(seen["a"], want[0].tokens);
        assert_eq!(done["a"].tokens, want[0].tokens);
        assert_eq!(seen["b"], want[1].tokens[..3].to_vec());
        assert_eq!(done["b"].tokens, want[1].tokens[..3].to_vec());
    }

    #[test]
    fn json_rows_draw_only_tokens_that_keep_one_json_object() {
        let (model, tok) = tiny_model();
        let stop =
            crate::model::tokenizer::token_id(&tok, crate::model::tokenizer::IM_END).unwrap();
        let vocab = JsonVocab::new(&tok, model.config().vocab_size);
        let json = |seed: u64, p: SamplingParams| SampleRequest {
            stop_token_ids: vec![stop],
            format: OutputFormat::JsonObject,
            ..req(&[1, 2, 3, 4], seed, p, 120)
        };
        let mut requests: Vec<SampleRequest> =
            (0..6).map(|s| json(s, params(1.0, 1.0, None))).collect();
        requests.push(json(9, params(0.0, 1.0, None)));
        requests.push(json(10, params(0.8, 0.9, Some(20))));
        // A free-text row in the same batch is untouched by its neighbours' constraint.
        requests.push(req(&[1, 2, 3, 4], 3, params(1.0, 1.0, None), 120));
        let out = generate(&model, &tok, &requests).unwrap();
        let alone = generate(&model, &tok, &requests[8..]).unwrap();
        assert_eq!(out[8].tokens, alone[0].tokens);
        let mut closed = 0;
        for (i, s) in out[..8].iter().enumerate() {
            let mut state = JsonState::new();
            for (k, &t) in s.tokens.iter().enumerate() {
                if state.is_done() {
                    // Only the stop token follows the closed object, and it ends the row.
                    assert_eq!((t, k + 1), (stop, s.tokens.len()), "row {i}");
                    assert_eq!(s.finish, FinishReason::Stop);
                    closed += 1;
                    break;
                }
                let bytes = vocab
                    .bytes(t)
                    .unwrap_or_else(|| panic!("row {i}: token {t}"));
                assert!(state.feed(bytes), "row {i}: token {k} leaves the grammar");
            }
            for (lp, raw) in s.logprobs.iter().zip(&s.raw_logprobs) {
                assert!(lp.is_finite() && *lp <= 0.0 && raw.is_finite() && *raw <= 0.0);
            }
        }
        // Constrained, the row draws from the allowed tokens only: its log-probs are at least
        // the raw model's (the allowed tokens' mass is renormalised to 1 at temperature 1).
        for (lp, raw) in out[0].logprobs.iter().zip(&out[0].raw_logprobs) {
            assert!(lp + 1e-5 >= *raw, "{lp} < {raw}");
        }
        eprintln!("{closed} of 8 constrained rows closed their object");
        // The same seeds give the same constrained tokens.
        assert_eq!(generate(&model, &tok, &requests).unwrap(), out);
    }

    #[test]
    fn a_batch_builds_the_json_vocabulary_once_and_takes_one_handed_over() {
        let (model, tok) = tiny_model();
        let json = SampleRequest {
            format: OutputFormat::JsonObject,
            ..req(&[1, 2, 3], 4, params(1.0, 1.0, None), 6)
        };
        let drain = |mut batch: DecodeBatch<'_, usize>| {
            batch.add(vec![(0, json.clone())]).unwrap();
            while !batch.is_empty() {
                batch.step(&tok).unwrap();
            }
            batch.json_vocab().cloned()
        };
        let plain: DecodeBatch<'_, usize> = DecodeBatch::new(&model);
        assert!(plain.json_vocab().is_none(), "built before any JSON row");
        let built = drain(DecodeBatch::new(&model)).expect("built at the first JSON row");
        assert_eq!(built.len(), model.config().vocab_size);
        // A batch given the vocabulary decodes with it instead of building another.
        let kept = drain(DecodeBatch::new(&model).with_json_vocab(Some(built.clone()))).unwrap();
        assert!(Arc::ptr_eq(&kept, &built));
    }

    fn tiny_model() -> (Qwen, Tokenizer) {
        let tok = crate::model::tokenizer::tiny_tokenizer(40).unwrap();
        let mut cfg = crate::model::config::QwenConfig::tiny_qwen3(tok.get_vocab_size(true));
        cfg.hidden_size = 32;
        cfg.intermediate_size = 64;
        cfg.head_dim = 8;
        cfg.initializer_range = 0.5;
        (
            Qwen::new_random(&cfg, 11, DType::F32, &Device::Cpu).unwrap(),
            tok,
        )
    }

    fn req(prompt: &[u32], seed: u64, p: SamplingParams, max: usize) -> SampleRequest {
        SampleRequest {
            prompt: prompt.to_vec(),
            max_new_tokens: max,
            params: p,
            stop_token_ids: vec![],
            seed,
            format: OutputFormat::Text,
        }
    }

    #[test]
    fn batching_and_seeds_are_reproducible() {
        let (model, tok) = tiny_model();
        let a = req(&[5, 6, 7, 8, 9], 1, params(1.0, 0.9, Some(50)), 12);
        let b = req(&[10, 11], 2, params(0.7, 1.0, None), 7);
        let c = req(&[12, 13, 14], 3, params(0.0, 1.0, None), 9);
        let together = generate(&model, &tok, &[a.clone(), b.clone(), c.clone()]).unwrap();
        for (r, got) in [a, b, c].iter().zip(&together) {
            let alone = generate(&model, &tok, std::slice::from_ref(r))
                .unwrap()
                .remove(0);
            assert_eq!(alone.tokens, got.tokens);
            assert_eq!(alone.tokens.len(), r.max_new_tokens);
            assert_eq!(alone.finish, FinishReason::Length);
            for (x, y) in alone.raw_logprobs.iter().zip(&got.raw_logprobs) {
                assert!((x - y).abs() < 1e-4);
            }
        }
        // Different seeds give different samples.
        let d = generate(
            &model,
            &tok,
            &[req(&[5, 6, 7, 8, 9], 99, params(1.0, 0.9, Some(50)), 12)],
        )
        .unwrap();
        assert_ne!(d[0].tokens, together[0].tokens);
    }

    #[test]
    fn requests_joining_mid_flight_match_running_alone() {
        let (model, tok) = tiny_model();
        let a = req(&[5, 6, 7, 8, 9, 10, 11], 1, params(1.0, 1.0, None), 20);
        let b = req(&[12, 13], 2, params(0.8, 0.95, Some(30)), 6);
        let c = req(
            &[14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25],
            3,
            params(1.0, 1.0, None),
            9,
        );
        let mut batch = DecodeBatch::new(&model);
        let mut got = std::collections::HashMap::new();
        batch.add(vec![("a", a.clone())]).unwrap();
        for step in 0..40 {
            if step == 3 {
                // A shorter and a longer prompt join a running row.
                batch.add(vec![("b", b.clone()), ("c", c.clone())]).unwrap();
            }
            for (k, s) in batch.step(&tok).unwrap() {
                got.insert(k, s);
            }
            if batch.is_empty() {
                break;
            }
        }
        for (k, r) in [("a", a), ("b", b), ("c", c)] {
            let alone = generate(&model, &tok, &[r]).unwrap().remove(0);
            assert_eq!(got[k].tokens, alone.tokens, "{k}");
            for (x, y) in got[k].raw_logprobs.iter().zip(&alone.raw_logprobs) {
                assert!((x - y).abs() < 1e-4, "{k}");
            }
        }
    }

    /// Prompts of an episode (each extends the previous turn's) and of a group (one prompt,
    /// several seeds), one of them past a prefill chunk boundary.
    fn shared_prefix_requests() -> Vec<SampleRequest> {
        let system: Vec<u32> = (0..100).map(|i| (i * 13 + 5) % 200).collect();
        let turn1: Vec<u32> = system.iter().copied().chain([40, 41, 42]).collect();
        let turn2: Vec<u32> = turn1
            .iter()
            .copied()
            .chain((0..40).map(|i| i + 60))
            .collect();
        let turn3: Vec<u32> = turn2.iter().copied().chain([7, 8, 9, 10]).collect();
        let long: Vec<u32> = (0..(PREFILL_BLOCK as u32 * 3 + 20))
            .map(|i| i * 7 % 200)
            .collect();
        let longer: Vec<u32> = long.iter().copied().chain([1, 2, 3]).collect();
        let mut out = vec![
            req(&turn1, 1, params(1.0, 1.0, None), 6),
            req(&turn2, 2, params(0.8, 0.9, Some(20)), 6),
            req(&turn3, 3, params(0.0, 1.0, None), 5),
            req(&longer, 4, params(1.0, 1.0, None), 3),
            req(&long, 5, params(1.0, 1.0, None), 3),
        ];
        // A group: one prompt, four seeds.
        out.extend((0..4).map(|k| req(&turn2, 10 + k, params(1.0, 1.0, None), 6)));
        out
    }

    fn assert_same(a: &[Sample], b: &[Sample]) {
        assert_eq!(a.len(), b.len());
        for (i, (x, y)) in a.iter().zip(b).enumerate() {
            assert_eq!(x.tokens, y.tokens, "request {i}");
            // Bit for bit, not within a tolerance.
            let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&x.logprobs), bits(&y.logprobs), "request {i}");
            assert_eq!(bits(&x.raw_logprobs), bits(&y.raw_logprobs), "request {i}");
            assert_eq!(x.finish, y.finish, "request {i}");
        }
    }

    #[test]
    fn prefix_cached_sampling_is_bit_identical_to_uncached() {
        let (model, tok) = tiny_model();
        let requests = shared_prefix_requests();
        let total: u64 = requests.iter().map(|r| r.prompt.len() as u64).sum();
        // One request at a time (each turn finds its predecessors cached) ...
        let mut cache = PrefixCache::new(PrefixCacheConfig::default());
        for r in &requests {
            let plain = generate(&model, &tok, std::slice::from_ref(r)).unwrap();
            let cached =
                generate_cached(&model, &tok, std::slice::from_ref(r), &mut cache).unwrap();
            assert_same(&plain, &cached);
        }
        let st = cache.stats();
        assert_eq!(st.lookups, requests.len() as u64);
        assert_eq!(st.reused_tokens + st.computed_tokens, total);
        assert!(st.hits >= 6, "{st:?}");
        assert!(st.reused_tokens > st.computed_tokens, "{st:?}");
        // The episode keeps one entry, not one per turn.
        assert!(st.entries < requests.len(), "{st:?}");
        // ... and all in one batch, from a warm cache and from a cold one.
        let plain = generate(&model, &tok, &requests).unwrap();
        assert_same(
            &plain,
            &generate_cached(&model, &tok, &requests, &mut cache).unwrap(),
        );
        let mut cold = PrefixCache::new(PrefixCacheConfig::default());
        assert_same(
            &plain,
            &generate_cached(&model, &tok, &requests, &mut cold).unwrap(),
        );
        assert!(cold.stats().hits > 0);
    }

    #[test]
    fn prompts_of_one_batch_share_their_common_prefix() {
        let (model, tok) = tiny_model();
        // Three tasks after one 150-token system prompt: the first computes it, the other two
        // take its first two blocks once computed.
        let system: Vec<u32> = (0..150).map(|i| (i * 11 + 3) % 200).collect();
        let requests: Vec<SampleRequest> = (0..3u32)
            .map(|t| {
                let task = (0..10 + t).map(|i| (i * 5 + t * 17) % 200);
                let prompt: Vec<u32> = system.iter().copied().chain(task).collect();
                req(&prompt, t as u64, params(1.0, 1.0, None), 4)
            })
            .collect();
        let total: u64 = requests.iter().map(|r| r.prompt.len() as u64).sum();
        let mut cold = PrefixCache::new(PrefixCacheConfig::default());
        let cached = generate_cached(&model, &tok, &requests, &mut cold).unwrap();
        assert_same(&generate(&model, &tok, &requests).unwrap(), &cached);
        let st = cold.stats();
        let shared = 2 * 2 * PREFILL_BLOCK as u64;
        assert_eq!(
            (st.lookups, st.hits, st.reused_tokens),
            (3, 2, shared),
            "{st:?}"
        );
        assert_eq!(st.computed_tokens, total - shared, "{st:?}");
        // Each request alone gives the same sample, bit for bit: its prefill does not depend on
        // the other prompts, nor its decoding steps (up to 16 rows) on the other rows.
        for (r, want) in requests.iter().zip(&cached) {
            let mut fresh = PrefixCache::new(PrefixCacheConfig::default());
            let alone = generate_cached(&model, &tok, std::slice::from_ref(r), &mut fresh).unwrap();
            assert_same(std::slice::from_ref(want), &alone);
        }
        // A disabled cache shares nothing but identical prompts.
        let mut off = PrefixCache::new(PrefixCacheConfig::disabled());
        generate_cached(&model, &tok, &requests, &mut off).unwrap();
        assert_eq!(
            (off.stats().reused_tokens, off.stats().computed_tokens),
            (0, total)
        );
    }

    #[test]
    fn eviction_keeps_the_budget_and_the_results() {
        let (model, tok) = tiny_model();
        let requests = shared_prefix_requests();
        let budget = crate::sample::prefix_cache::kv_bytes(&model, 250);
        let mut cache = PrefixCache::new(PrefixCacheConfig {
            budget_bytes: budget,
        });
        for r in &requests {
            let plain = generate(&model, &tok, std::slice::from_ref(r)).unwrap();
            let cached =
                generate_cached(&model, &tok, std::slice::from_ref(r), &mut cache).unwrap();
            assert_same(&plain, &cached);
            assert!(cache.stats().bytes <= budget, "{:?}", cache.stats());
        }
        let st = cache.stats();
        assert!(st.evicted > 0 && st.hits > 0, "{st:?}");
        // A disabled cache stores nothing and reuses nothing.
        let mut off = PrefixCache::new(PrefixCacheConfig::disabled());
        let out = generate_cached(&model, &tok, &requests, &mut off).unwrap();
        assert_same(&generate(&model, &tok, &requests).unwrap(), &out);
        assert_eq!((off.stats().hits, off.stats().entries), (0, 0));
    }

    #[test]
    fn changed_weights_invalidate_the_prefix_cache() {
        let (model, tok) = tiny_model();
        let requests = shared_prefix_requests();
        let mut cache = PrefixCache::new(PrefixCacheConfig::default());
        generate_cached(&model, &tok, &requests[..3], &mut cache).unwrap();
        assert!(cache.stats().entries > 0);
        // Change the weights the way every path of this crate does: write, then mark.
        for (_, var) in model.named_vars() {
            var.set(&(var.as_tensor() * 0.9).unwrap()).unwrap();
        }
        model.mark_weights_changed();
        let before = cache.stats();
        let plain = generate(&model, &tok, &requests[1..2]).unwrap();
        let cached = generate_cached(&model, &tok, &requests[1..2], &mut cache).unwrap();
        assert_same(&plain, &cached);
        let after = cache.stats();
        assert_eq!(after.invalidations, before.invalidations + 1);
        assert_eq!(
            after.hits, before.hits,
            "nothing computed under the old weights is reused"
        );
        // A clone shares the version: it sees the change too.
        let clone = model.clone();
        clone.mark_weights_changed();
        assert_eq!(clone.weights_version(), model.weights_version());
    }

    #[test]
    fn chunked_prefill_of_long_prompts() {
        let (model, tok) = tiny_model();
        let long: Vec<u32> = (0..(PREFILL_BLOCK as u32 * 2 + 37))
            .map(|i| i * 7 % 200)
            .collect();
        let short = [9u32, 8, 7];
        let out = generate(
            &model,
            &tok,
            &[
                req(&long, 1, params(1.0, 1.0, None), 2),
                req(&short, 2, params(1.0, 1.0, None), 2),
            ],
        )
        .unwrap();
        for (prompt, sample) in [(&long[..], &out[0]), (&short[..], &out[1])] {
            let seq: Vec<u32> = prompt.iter().chain(&sample.tokens).copied().collect();
            let ids = Tensor::new(seq.as_slice(), &Device::Cpu)
                .unwrap()
                .unsqueeze(0)
                .unwrap();
            let logits = model.forward_logits(&ids).unwrap().squeeze(0).unwrap();
            let n = prompt.len();
            let pred = logits.narrow(0, n - 1, 2).unwrap();
            let targets = Tensor::new(&seq[n..], &Device::Cpu).unwrap();
            let lp: Vec<f32> = crate::ops::reference::token_logprobs(&pred, &targets)
                .unwrap()
                .to_vec1()
                .unwrap();
            for (a, b) in lp.iter().zip(&sample.raw_logprobs) {
                assert!((a - b).abs() < 1e-4, "{a} vs {b}");
            }
        }
    }

    #[test]
    fn raw_logprobs_match_a_full_forward() {
        let (model, tok) = tiny_model();
        let prompt = [3u32, 1, 4, 1, 5];
        let out = generate(&model, &tok, &[req(&prompt, 5, params(1.0, 1.0, None), 6)]).unwrap();
        let seq: Vec<u32> = prompt
            .iter()
            .copied()
            .chain(out[0].tokens.iter().copied())
            .collect();
        let ids = Tensor::new(seq.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let logits = model.forward_logits(&ids).unwrap().squeeze(0).unwrap();
        let n = seq.len();
        let pred = logits
            .narrow(0, prompt.len() - 1, n - prompt.len())
            .unwrap();
        let targets = Tensor::new(&seq[prompt.len()..], &Device::Cpu).unwrap();
        let lp: Vec<f32> = crate::ops::reference::token_logprobs(&pred, &targets)
            .unwrap()
            .to_vec1()
            .unwrap();
        for (a, b) in lp.iter().zip(&out[0].raw_logprobs) {
            assert!((a - b).abs() < 1e-4, "{a} vs {b}");
        }
        // At temperature 1 without truncation the processed distribution is the raw one.
        for (a, b) in out[0].logprobs.iter().zip(&out[0].raw_logprobs) {
            assert!((a - b).abs() < 1e-5);
        }
    }

    #[test]
    fn stop_tokens_and_strings_end_generation() {
        let (model, tok) = tiny_model();
        let free = generate(
            &model,
            &tok,
            &[req(&[7, 7, 7], 4, params(0.0, 1.0, None), 10)],
        )
        .unwrap();
        let greedy = &free[0].tokens;
        // Stop token: the third greedy token.
        let mut r = req(&[7, 7, 7], 4, params(0.0, 1.0, None), 10);
        r.stop_token_ids = vec![greedy[2]];
        let first_hit = greedy.iter().position(|&t| t == greedy[2]).unwrap();
        let out = generate(&model, &tok, &[r]).unwrap();
        assert_eq!(out[0].tokens, greedy[..=first_hit].to_vec());
        assert_eq!(out[0].finish, FinishReason::Stop);
        // Stop string: the text of the second and third greedy tokens.
        let text = crate::model::tokenizer::decode(&tok, &greedy[1..3], true).unwrap();
        if !text.is_empty() {
            let mut p = params(0.0, 1.0, None);
            p.stop = vec![text.clone()];
            let out = generate(&model, &tok, &[req(&[7, 7, 7], 4, p, 10)]).unwrap();
            let shown = crate::model::tokenizer::decode(&tok, &out[0].tokens, true).unwrap();
            assert!(shown.contains(&text) && out[0].tokens.len() <= 3);
            assert_eq!(out[0].finish, FinishReason::Stop);
        }
    }

    #[test]
    fn diverged_weights_are_an_error() {
        let (model, tok) = tiny_model();
        let data = model.varmap().data().lock().unwrap();
        let w = &data["model.norm.weight"];
        w.set(&(w.as_tensor() * f64::NAN).unwrap()).unwrap();
        drop(data);
        let err =
            generate(&model, &tok, &[req(&[1, 2], 0, params(1.0, 1.0, None), 3)]).unwrap_err();
        assert!(err.to_string().contains("non-finite"), "{err}");
    }

    #[test]
    fn bad_requests_are_errors() {
        let (model, tok) = tiny_model();
        assert!(generate(&model, &tok, &[req(&[], 0, params(1.0, 1.0, None), 3)]).is_err());
        assert!(generate(&model, &tok, &[req(&[1], 0, params(1.0, 0.0, None), 3)]).is_err());
        assert!(generate(&model, &tok, &[req(&[1], 0, params(-1.0, 1.0, None), 3)]).is_err());
        assert!(
            generate(
                &model,
                &tok,
                &[req(&[100_000], 0, params(1.0, 1.0, None), 3)]
            )
            .is_err()
        );
        let zero = generate(&model, &tok, &[req(&[1], 0, params(1.0, 1.0, None), 0)]).unwrap();
        assert!(zero[0].tokens.is_empty());
    }
}
