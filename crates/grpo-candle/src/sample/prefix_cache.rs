//! Automatic prefix caching for the sampler, in the manner of vLLM's automatic prefix caching
//! and SGLang's RadixAttention: the keys and values of recently prefilled prompts are kept,
//! keyed by their tokens; a new prompt starts from the longest cached prefix and prefills only
//! the rest. The turns of one episode (each prompt extends the previous turn's prompt) and the K
//! rollouts of one group (one prompt) then prefill only their new tokens.
//!
//! # Bit-identical to uncached sampling
//! The sampler prefills every prompt without padding in blocks of 64 tokens at fixed positions
//! (`[0, 64)`, `[64, 128)`, ..., the last ending at the prompt's end), and reuses cached
//! prefixes up to a block boundary only. One forward pass feeds the next block of every prompt
//! of a batch; the weight products give a row the same bits whatever else shares the call, and
//! each block attends only to its own prompt's columns. A cached prefill then computes the last
//! few of exactly the blocks an uncached one computes, from the same inputs, so it yields the
//! same bits, and so the same logits, tokens and log-probs (tested). (Reusing any prefix length
//! would not: a block's attention sums over its columns in an order set by the block's shape.)
//! With the cache enabled, prompts of one batch that start alike also share their common
//! blocks: a later prompt takes them from an earlier one once computed, as it would from the
//! cache. Only prompt keys and values are cached: those of generated tokens come from decoding
//! steps, one token at a time with their own kernels, whose sums differ from a prefill block's,
//! so a later turn recomputes its previous turn's generated tokens as part of its prompt.
//!
//! # Weights
//! Every entry belongs to one [`Qwen::weights_version`]; a lookup under another version empties
//! the cache first, and an entry computed while the version changed is not stored. Every path in
//! this crate that changes weights bumps the version (optimizer steps, checkpoint loads, the
//! policy's update guard).
//!
//! # Memory
//! Entries are evicted least recently used first once their keys and values exceed
//! [`PrefixCacheConfig::budget_bytes`]. A prompt costs `2 x layers x kv_heads x head_dim x
//! dtype bytes` per token (Qwen3-0.6B in f32: 224 KiB per token, so the default 1 GiB holds
//! about 4,700 tokens; the tiny default policy a few hundred thousand). An entry whose tokens
//! are a prefix of a newer one is dropped (the newer one serves every prefix it served), so an
//! episode keeps one entry, not one per turn; the K rollouts of a group keep one entry each
//! once they diverge, each holding a copy of the shared prompt.

use candle_core::Tensor;

use crate::error::Result;
use crate::model::{KvCache, Qwen};

/// Settings of a [`PrefixCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixCacheConfig {
    /// Most bytes of keys and values kept (0 disables the cache). Default 1 GiB.
    pub budget_bytes: usize,
}

impl Default for PrefixCacheConfig {
    fn default() -> Self {
        PrefixCacheConfig {
            budget_bytes: 1 << 30,
        }
    }
}

impl PrefixCacheConfig {
    /// No caching: every prompt is prefilled in full.
    pub fn disabled() -> Self {
        PrefixCacheConfig { budget_bytes: 0 }
    }
}

/// Counters of a [`PrefixCache`] (cumulative).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixCacheStats {
    /// Prompts looked up (one per prefilled request).
    pub lookups: u64,
    /// Lookups that reused at least one cached token (or one of an earlier prompt of the same
    /// batch).
    pub hits: u64,
    /// Prompt tokens whose keys and values came from the cache, or from an earlier prompt of
    /// the same batch that starts with the same tokens.
    pub reused_tokens: u64,
    /// Prompt tokens prefilled (`reused_tokens + computed_tokens` is every prompt token looked
    /// up).
    pub computed_tokens: u64,
    /// Lookups answered by a row of the same batch with the same prompt (the `n` choices of a
    /// request, the K rollouts of a group): prefilled once, their tokens counted as reused (not
    /// as cache hits: nothing came from the cache, and a disabled cache shares them too).
    pub shared: u64,
    /// Entries stored.
    pub inserted: u64,
    /// Entries evicted for the memory budget.
    pub evicted: u64,
    /// Times the cache was emptied because the weights changed.
    pub invalidations: u64,
    /// Entries held now.
    pub entries: usize,
    /// Bytes of keys and values held now.
    pub bytes: usize,
}

struct Entry {
    tokens: Vec<u32>,
    /// Per layer: keys and values `[1, kv_heads, tokens.len(), head_dim]`.
    kv: Vec<(Tensor, Tensor)>,
    bytes: usize,
    last_used: u64,
}

/// Keys and values of recent prompts, keyed by their tokens. Owned by one sampler (not shared
/// between threads): the policy's decoding worker holds one.
pub struct PrefixCache {
    config: PrefixCacheConfig,
    /// A lookup scans every entry: they number in the tens to hundreds (the budget is in
    /// tokens), and comparing a prompt costs far less than prefilling one of its tokens.
    entries: Vec<Entry>,
    bytes: usize,
    clock: u64,
    version: Option<u64>,
    stats: PrefixCacheStats,
}

impl std::fmt::Debug for PrefixCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixCache")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish()
    }
}

/// What a lookup found: a one-row cache holding the reused prefix, and its length.
pub(crate) struct Reuse {
    pub cache: KvCache,
    pub tokens: usize,
}

impl PrefixCache {
    /// An empty cache.
    pub fn new(config: PrefixCacheConfig) -> Self {
        PrefixCache {
            config,
            entries: Vec::new(),
            bytes: 0,
            clock: 0,
            version: None,
            stats: PrefixCacheStats::default(),
        }
    }

    /// The settings.
    pub fn config(&self) -> PrefixCacheConfig {
        self.config
    }

    /// The counters, with the current occupancy.
    pub fn stats(&self) -> PrefixCacheStats {
        PrefixCacheStats {
            entries: self.entries.len(),
            bytes: self.bytes,
            ..self.stats
        }
    }

    /// Drop every entry (counters stay).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.bytes = 0;
    }

    /// Empty the cache if `model`'s weights are not those its entries were computed with.
    fn check_version(&mut self, model: &Qwen) {
        let now = model.weights_version();
        if self.version != Some(now) {
            if !self.entries.is_empty() {
                self.stats.invalidations += 1;
            }
            self.clear();
            self.version = Some(now);
        }
    }

    /// The longest cached prefix of `prompt`, at most `prompt.len() - 1` tokens (the last
    /// prompt token is always computed: its hidden state gives the first logits), shortened by
    /// `usable` (the sampler's rule for where a prefill may start). Counts the prompt's reused
    /// and computed tokens.
    pub(crate) fn lookup(
        &mut self,
        model: &Qwen,
        prompt: &[u32],
        usable: impl Fn(usize) -> usize,
    ) -> Result<Option<Reuse>> {
        self.check_version(model);
        self.stats.lookups += 1;
        let cap = prompt.len().saturating_sub(1);
        let mut best: Option<(usize, usize)> = None;
        for (i, e) in self.entries.iter().enumerate() {
            let common = e
                .tokens
                .iter()
                .zip(prompt)
                .take(cap)
                .take_while(|(a, b)| a == b)
                .count();
            if common > 0 && best.is_none_or(|(_, n)| common > n) {
                best = Some((i, common));
            }
        }
        let best = best
            .map(|(i, n)| (i, usable(n).min(n)))
            .filter(|&(_, n)| n > 0);
        let Some((i, n)) = best else {
            self.stats.computed_tokens += prompt.len() as u64;
            return Ok(None);
        };
        self.clock += 1;
        let e = &mut self.entries[i];
        e.last_used = self.clock;
        let cache = KvCache::from_columns(&e.kv, n)?;
        self.stats.hits += 1;
        self.stats.reused_tokens += n as u64;
        self.stats.computed_tokens += (prompt.len() - n) as u64;
        Ok(Some(Reuse { cache, tokens: n }))
    }

    /// Move `tokens` of a looked-up prompt from computed to reused: a prefix it shares with an
    /// earlier prompt of the same batch, whose keys and values it takes once computed (as it
    /// would take them from the cache had that prompt been prefilled in an earlier batch). A
    /// lookup that found nothing in the cache (`hit` false) becomes a hit.
    pub(crate) fn record_batch_prefix(&mut self, hit: bool, tokens: usize) {
        if !hit {
            self.stats.hits += 1;
        }
        self.stats.reused_tokens += tokens as u64;
        self.stats.computed_tokens -= tokens as u64;
    }

    /// Count a prompt of `tokens` tokens that shares the prefill of an identical prompt in the
    /// same batch: all its tokens are reused.
    pub(crate) fn record_shared(&mut self, tokens: usize) {
        self.stats.lookups += 1;
        self.stats.shared += 1;
        self.stats.reused_tokens += tokens as u64;
    }

    /// Store the keys and values of a prefilled prompt (`cache`: one row, no padding, holding
    /// exactly `prompt`), computed under weights version `version`, then evict down to the
    /// budget.
    pub(crate) fn insert(
        &mut self,
        model: &Qwen,
        version: u64,
        prompt: &[u32],
        cache: &KvCache,
    ) -> Result<()> {
        if self.config.budget_bytes == 0 || prompt.is_empty() {
            return Ok(());
        }
        self.check_version(model);
        // Weights changed while this prompt was prefilled: its values belong to neither version.
        if self.version != Some(version) {
            return Ok(());
        }
        self.clock += 1;
        if let Some(e) = self
            .entries
            .iter_mut()
            .find(|e| e.tokens.starts_with(prompt))
        {
            e.last_used = self.clock;
            return Ok(());
        }
        let bytes = kv_bytes(model, prompt.len());
        if bytes > self.config.budget_bytes {
            return Ok(());
        }
        // Entries this prompt extends serve nothing it does not.
        let mut freed = 0;
        self.entries.retain(|e| {
            let dominated = prompt.starts_with(&e.tokens);
            if dominated {
                freed += e.bytes;
            }
            !dominated
        });
        self.bytes -= freed;
        let kv = cache.columns(prompt.len())?;
        self.entries.push(Entry {
            tokens: prompt.to_vec(),
            kv,
            bytes,
            last_used: self.clock,
        });
        self.bytes += bytes;
        self.stats.inserted += 1;
        while self.bytes > self.config.budget_bytes {
            let (oldest, _) = self
                .entries
                .iter()
                .enumerate()
                .min_by_key(|(_, e)| e.last_used)
                .expect("bytes > 0 means an entry");
            let e = self.entries.swap_remove(oldest);
            self.bytes -= e.bytes;
            self.stats.evicted += 1;
        }
        Ok(())
    }
}

/// Bytes of keys and values for `tokens` prompt tokens of `model`.
pub fn kv_bytes(model: &Qwen, tokens: usize) -> usize {
    let c = model.config();
    2 * c.num_hidden_layers
        * c.num_key_value_heads
        * c.head_dim
        * model.dtype().size_in_bytes()
        * tokens
}
