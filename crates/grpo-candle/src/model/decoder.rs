//! A stateless, trainable dense decoder of the Qwen2, Qwen3, Llama and Mistral families.
//!
//! The families share one code path: Llama and Mistral are this decoder without q/k/v biases
//! (Llama may have them) and without Qwen3's q/k norms; Llama 3's scaled rotary frequencies only
//! change the precomputed inverse frequencies ([`QwenConfig::rope_inv_freq`]).
//!
//! Every operation on the forward path has a backward pass: candle primitives (matmul, exp, sum,
//! narrow, cat, index_select, ...) or this crate's fused CPU ops with their own backward
//! ([`crate::ops::fused`]: RMSNorm, rotary embedding, SwiGLU, causal attention), which fall back
//! to primitives on other devices. candle-nn's fused `softmax_last_dim`, `rms_norm` and `rope`
//! kernels are forward-only and would silently cut the gradient, so they are not used. Parameters
//! live in a [`VarMap`] under the Hugging Face names (`model.layers.0.self_attn.q_proj.weight`, ...),
//! so the trainer updates them in place and checkpoints are plain HF safetensors.
//!
//! The model holds no sequence state. Training calls [`Qwen::forward_hidden`] on whole sequences;
//! sampling threads explicit [`KvCache`]s through [`Qwen::prefill_segments`] (the blocks of
//! several prompts in one pass, each after its own cache) and [`Qwen::forward_decode`] (one token
//! per row, with the decoding step's kernels of [`crate::ops::rowdot`]); [`Qwen::forward_cached`]
//! feeds any number of tokens after a batched cache.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use candle_core::{D, DType, Device, IndexOp, Tensor, Var};
use candle_nn::VarMap;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::{Error, Result};
use crate::model::config::QwenConfig;
use crate::model::lora::BaseWeights;
use crate::ops::fused::{self, softmax_last_dim};
use crate::ops::logprob::{LogProbConfig, token_logprobs};
use crate::ops::rowdot;

/// The additive mask value for positions a query must not see. Finite so that a row with every
/// key masked (a left-padding query) yields a uniform softmax instead of NaN.
const MASKED: f32 = -1.0e9;

/// How a parameter is initialised in a fresh model.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Init {
    Normal,
    Ones,
    Zeros,
}

/// One parameter: HF name, shape, initialisation.
#[derive(Debug, Clone)]
struct ParamSpec {
    name: String,
    shape: Vec<usize>,
    init: Init,
}

/// The error for a configuration that describes more than its checkpoint holds: against the
/// configuration file (at `field`) when it is known, else against the weights.
fn more_than_held(config: Option<&Path>, field: &str, weights: &Path, what: String) -> Error {
    match config {
        Some(c) => Error::config(
            c,
            field,
            format!(
                "describes {what} ({}); expected the shapes of the weights",
                weights.display()
            ),
        ),
        None => Error::Weights {
            path: weights.to_path_buf(),
            name: "(all)".into(),
            message: format!("the configuration describes {what}"),
        },
    }
}

/// The parameters of `cfg`, in a fixed order (embedding, layers in order, final norm, lm_head).
fn param_specs(cfg: &QwenConfig) -> Vec<ParamSpec> {
    let (h, i, v, hd) = (
        cfg.hidden_size,
        cfg.intermediate_size,
        cfg.vocab_size,
        cfg.head_dim,
    );
    let qd = cfg.num_attention_heads * hd;
    let kvd = cfg.num_key_value_heads * hd;
    let p = |name: String, shape: &[usize], init| ParamSpec {
        name,
        shape: shape.to_vec(),
        init,
    };
    let mut specs = vec![p("model.embed_tokens.weight".into(), &[v, h], Init::Normal)];
    for l in 0..cfg.num_hidden_layers {
        let pre = format!("model.layers.{l}");
        specs.push(p(format!("{pre}.input_layernorm.weight"), &[h], Init::Ones));
        for (proj, out) in [("q_proj", qd), ("k_proj", kvd), ("v_proj", kvd)] {
            specs.push(p(
                format!("{pre}.self_attn.{proj}.weight"),
                &[out, h],
                Init::Normal,
            ));
            if cfg.attention_bias {
                specs.push(p(
                    format!("{pre}.self_attn.{proj}.bias"),
                    &[out],
                    Init::Zeros,
                ));
            }
        }
        specs.push(p(
            format!("{pre}.self_attn.o_proj.weight"),
            &[h, qd],
            Init::Normal,
        ));
        if cfg.arch.has_output_bias(cfg.attention_bias) {
            specs.push(p(format!("{pre}.self_attn.o_proj.bias"), &[h], Init::Zeros));
        }
        if cfg.arch.has_qk_norm() {
            specs.push(p(
                format!("{pre}.self_attn.q_norm.weight"),
                &[hd],
                Init::Ones,
            ));
            specs.push(p(
                format!("{pre}.self_attn.k_norm.weight"),
                &[hd],
                Init::Ones,
            ));
        }
        specs.push(p(
            format!("{pre}.post_attention_layernorm.weight"),
            &[h],
            Init::Ones,
        ));
        specs.push(p(
            format!("{pre}.mlp.gate_proj.weight"),
            &[i, h],
            Init::Normal,
        ));
        specs.push(p(
            format!("{pre}.mlp.up_proj.weight"),
            &[i, h],
            Init::Normal,
        ));
        specs.push(p(
            format!("{pre}.mlp.down_proj.weight"),
            &[h, i],
            Init::Normal,
        ));
    }
    specs.push(p("model.norm.weight".into(), &[h], Init::Ones));
    if !cfg.tie_word_embeddings {
        specs.push(p("lm_head.weight".into(), &[v, h], Init::Normal));
    }
    specs
}

/// Standard normal samples from a seeded ChaCha stream (Box-Muller), identical on every platform.
fn normal_samples(rng: &mut ChaCha8Rng, n: usize, std: f64) -> Vec<f64> {
    let mut out = Vec::with_capacity(n + 1);
    while out.len() < n {
        let u1: f64 = 1.0 - rng.r#gen::<f64>(); // (0, 1]
        let u2: f64 = rng.r#gen::<f64>();
        let r = (-2.0 * u1.ln()).sqrt() * std;
        let t = 2.0 * std::f64::consts::PI * u2;
        out.push(r * t.cos());
        out.push(r * t.sin());
    }
    out.truncate(n);
    out
}

/// Per-layer weights (tensors sharing storage with the [`VarMap`]'s variables).
#[derive(Debug, Clone)]
struct Layer {
    input_norm: Tensor,
    q: Linear,
    k: Linear,
    v: Linear,
    o: Linear,
    q_norm: Option<Tensor>,
    k_norm: Option<Tensor>,
    post_norm: Tensor,
    gate: Linear,
    up: Linear,
    down: Linear,
}

#[derive(Debug, Clone)]
struct Linear {
    weight: Tensor,
    bias: Option<Tensor>,
}

/// How a forward pass multiplies by its weight matrices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Matmul {
    /// candle's matmul (the `gemm` crate on the CPU): training and prefill. gemm sums a single
    /// row, and some small products, in another order than larger calls, so on the CPU such
    /// calls are padded with zero rows ([`gemm_invariant_rows`]): a row's result then never
    /// depends on how many rows share the call. (On CUDA, cuBLAS picks kernels by shape: there
    /// the sampler feeds one prompt per prefill pass.)
    Gemm,
    /// [`rowdot::linear_rows`] for the few rows of a decoding step (gemm beyond
    /// [`ROWDOT_MAX_ROWS`] rows).
    RowDot,
}

/// Outputs (rows x columns) up to which gemm takes its small-product path.
const GEMM_SMALL_OUTPUTS: usize = 256;

/// Rows from which gemm sums every row of an `[rows, inputs] x [inputs, outputs]` product the
/// same way: two (one row is a matrix-vector product), more than [`GEMM_SMALL_OUTPUTS`]
/// outputs, and, for at most 64 outputs over more than 512 inputs, more than 64 rows (below,
/// gemm splits the inputs into other blocks).
fn gemm_invariant_rows(outputs: usize, inputs: usize) -> usize {
    let mut rows = 2.max(GEMM_SMALL_OUTPUTS / outputs.max(1) + 1);
    if outputs <= 64 && inputs > 512 {
        rows = rows.max(65);
    }
    rows
}

/// Rows up to which a decoding step's products run as dot products: beyond, gemm's blocking
/// wins (`examples/bench_rowdot.rs`).
const ROWDOT_MAX_ROWS: usize = 16;

/// Rows up to which [`Qwen::last_logits`] gives each row the same bits whatever the other rows.
pub(crate) const INVARIANT_LOGIT_ROWS: usize = ROWDOT_MAX_ROWS;

impl Linear {
    /// `x @ W^T + b` for `x` of shape `[.., in]`.
    fn forward(&self, x: &Tensor, how: Matmul) -> Result<Tensor> {
        let dims = x.dims().to_vec();
        let (last, lead) = dims
            .split_last()
            .expect("linear input has at least one dim");
        let n: usize = lead.iter().product();
        let out_dim = self.weight.dim(0)?;
        let flat = x.reshape((n, *last))?;
        let row_dot = how == Matmul::RowDot
            && n <= ROWDOT_MAX_ROWS
            && rowdot::has_kernel(&flat, &self.weight);
        let mut y = if row_dot {
            rowdot::linear_rows(&flat, &self.weight)?
        } else if flat.device().is_cpu() && n < gemm_invariant_rows(out_dim, *last) {
            let rows = gemm_invariant_rows(out_dim, *last);
            let pad = Tensor::zeros((rows - n, *last), flat.dtype(), flat.device())?;
            Tensor::cat(&[&flat, &pad], 0)?
                .matmul(&self.weight.t()?)?
                .narrow(0, 0, n)?
        } else {
            flat.matmul(&self.weight.t()?)?
        };
        if let Some(b) = &self.bias {
            y = y.broadcast_add(b)?;
        }
        let mut out_shape = lead.to_vec();
        out_shape.push(out_dim);
        Ok(y.reshape(out_shape)?)
    }
}

/// Key/value cache for incremental decoding, passed explicitly to [`Qwen::forward_cached`].
///
/// Rows may be left-padded: row `b` ignores its first `pads[b]` cache columns, and its positions
/// count from its first real token. Keys and values live in buffers with spare capacity (grown by
/// half when full) that new tokens are written into in place, so a decoding step copies only the
/// new columns, not the whole cache. Cloning a cache shares its buffers: clone only to read.
#[derive(Debug, Clone)]
pub struct KvCache {
    /// Per layer: key and value buffers `[B, kv_heads, capacity, head_dim]`; the first `len`
    /// columns are filled.
    layers: Vec<Option<(Tensor, Tensor)>>,
    pads: Vec<usize>,
    len: usize,
}

impl KvCache {
    /// An empty cache for `num_layers` layers and one row per entry of `pads` (each row's left
    /// padding in the first call).
    pub fn new(num_layers: usize, pads: Vec<usize>) -> Self {
        KvCache {
            layers: vec![None; num_layers],
            pads,
            len: 0,
        }
    }

    /// An empty cache for a model, with no padding.
    pub fn for_model(model: &Qwen, batch: usize) -> Self {
        Self::new(model.config().num_hidden_layers, vec![0; batch])
    }

    /// Columns held (padding included).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been fed yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Rows.
    pub fn batch(&self) -> usize {
        self.pads.len()
    }

    /// Left padding of each row.
    pub fn pads(&self) -> &[usize] {
        &self.pads
    }

    /// Keep only the given rows (in the given order), e.g. to drop finished sequences.
    pub fn select_rows(&self, rows: &[usize]) -> Result<KvCache> {
        let pads: Vec<usize> = rows.iter().map(|&r| self.pads[r]).collect();
        let layers = if self.is_empty() || rows.is_empty() {
            vec![None; self.layers.len()]
        } else {
            let device = self.layers[0].as_ref().map(|(k, _)| k.device().clone());
            let idx = Tensor::new(
                rows.iter().map(|&r| r as u32).collect::<Vec<_>>(),
                device.as_ref().unwrap_or(&Device::Cpu),
            )?;
            self.layers
                .iter()
                .map(|kv| {
                    kv.as_ref()
                        .map(|(k, v)| Ok((k.index_select(&idx, 0)?, v.index_select(&idx, 0)?)))
                        .transpose()
                })
                .collect::<Result<Vec<_>>>()?
        };
        let mut out = KvCache {
            layers,
            pads,
            len: if rows.is_empty() { 0 } else { self.len },
        };
        // Drop columns that are padding for every remaining row.
        let common = out.pads.iter().copied().min().unwrap_or(0);
        if common > 0 && !out.is_empty() {
            for (k, v) in out.layers.iter_mut().flatten() {
                let cap = k.dim(2)?;
                *k = k.narrow(2, common, cap - common)?.contiguous()?;
                *v = v.narrow(2, common, cap - common)?.contiguous()?;
            }
            out.len -= common;
            for p in &mut out.pads {
                *p -= common;
            }
        }
        Ok(out)
    }
}

impl KvCache {
    /// The rows of `a` followed by the rows of `b`. The shorter cache is shifted right (its rows
    /// get more left padding) so that both end at the same column.
    pub fn concat(a: &KvCache, b: &KvCache) -> Result<KvCache> {
        Self::stack(&[a, b])
    }

    /// The rows of every part, in order, shifted right so that all end at the same column (as
    /// [`KvCache::concat`], without copying the early parts once per later part).
    pub fn stack(parts: &[&KvCache]) -> Result<KvCache> {
        let Some(first) = parts.first() else {
            return Err(Error::Msg("no caches to stack".into()));
        };
        if parts.iter().any(|p| p.layers.len() != first.layers.len()) {
            return Err(Error::Msg("caches of different models".into()));
        }
        let filled: Vec<&KvCache> = parts
            .iter()
            .copied()
            .filter(|p| p.batch() > 0 && !p.is_empty())
            .collect();
        match filled.len() {
            0 => return Ok((*first).clone()),
            1 => return Ok(filled[0].clone()),
            _ => {}
        }
        let len = filled.iter().map(|p| p.len).max().unwrap_or(0);
        let cap = len + (len / 2).max(64);
        let mut layers = Vec::with_capacity(first.layers.len());
        for li in 0..first.layers.len() {
            let mut ks = Vec::with_capacity(filled.len());
            let mut vs = Vec::with_capacity(filled.len());
            for p in &filled {
                let Some((k, v)) = &p.layers[li] else {
                    return Err(Error::Msg("cache layers not filled".into()));
                };
                let shift = |buf: &Tensor| -> Result<Tensor> {
                    let (n, h, _, d) = buf.dims4()?;
                    let out = Tensor::zeros((n, h, cap, d), buf.dtype(), buf.device())?;
                    out.slice_set(&buf.narrow(2, 0, p.len)?.contiguous()?, 2, len - p.len)?;
                    Ok(out)
                };
                ks.push(shift(k)?);
                vs.push(shift(v)?);
            }
            layers.push(Some((Tensor::cat(&ks, 0)?, Tensor::cat(&vs, 0)?)));
        }
        let pads = filled
            .iter()
            .flat_map(|p| p.pads.iter().map(move |pad| pad + len - p.len))
            .collect();
        Ok(KvCache { layers, pads, len })
    }

    /// Copies of the first `len` columns of every layer's keys and values, `[B, kv_heads, len,
    /// head_dim]` each: what a prefix cache keeps of a prefilled row.
    pub fn columns(&self, len: usize) -> Result<Vec<(Tensor, Tensor)>> {
        if len > self.len {
            return Err(Error::Msg(format!(
                "{len} columns asked of a cache holding {}",
                self.len
            )));
        }
        self.layers
            .iter()
            .map(|kv| {
                let (k, v) = kv
                    .as_ref()
                    .ok_or_else(|| Error::Msg("cache layers not filled".into()))?;
                Ok((
                    k.narrow(2, 0, len)?.contiguous()?,
                    v.narrow(2, 0, len)?.contiguous()?,
                ))
            })
            .collect()
    }

    /// A one-row, unpadded cache holding this one-row, unpadded cache's first `len` columns,
    /// sharing its buffers without copying them: the views are exactly `len` columns wide, so
    /// the next forward pass on the result reallocates before writing, and this cache writes only
    /// columns past `len`.
    pub fn first_columns(&self, len: usize) -> Result<KvCache> {
        if self.batch() != 1 || self.pads[0] != 0 || len > self.len {
            return Err(Error::Msg(format!(
                "first {len} columns asked of a cache of {} rows holding {}",
                self.batch(),
                self.len
            )));
        }
        let layers = self
            .layers
            .iter()
            .map(|kv| {
                let (k, v) = kv
                    .as_ref()
                    .ok_or_else(|| Error::Msg("cache layers not filled".into()))?;
                Ok(Some((k.narrow(2, 0, len)?, v.narrow(2, 0, len)?)))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache {
            layers,
            pads: vec![0],
            len,
        })
    }

    /// A one-row cache, without padding, holding the first `len` columns of `kv` (per layer
    /// `[1, kv_heads, >= len, head_dim]`, as [`KvCache::columns`] returns). The buffers are views
    /// of `kv` exactly `len` columns wide, so the next forward pass, which always adds a column,
    /// reallocates them before writing: `kv` itself is never written.
    pub fn from_columns(kv: &[(Tensor, Tensor)], len: usize) -> Result<KvCache> {
        let layers = kv
            .iter()
            .map(|(k, v)| Ok(Some((k.narrow(2, 0, len)?, v.narrow(2, 0, len)?))))
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache {
            layers,
            pads: vec![0],
            len,
        })
    }
}

/// Write `k`, `v` `[B, kv_heads, t, head_dim]` after the `past` filled columns of a layer's
/// buffers (growing them when full) and return views of the filled columns.
fn append_kv(
    slot: &mut Option<(Tensor, Tensor)>,
    past: usize,
    k: &Tensor,
    v: &Tensor,
) -> Result<(Tensor, Tensor)> {
    let (b, h, t, d) = k.dims4()?;
    let need = past + t;
    let capacity = match slot {
        Some((kb, _)) => kb.dim(2)?,
        None => 0,
    };
    if need > capacity {
        let cap = need + (need / 2).max(64);
        let nk = Tensor::zeros((b, h, cap, d), k.dtype(), k.device())?;
        let nv = Tensor::zeros((b, h, cap, d), v.dtype(), v.device())?;
        if let Some((kb, vb)) = slot.take()
            && past > 0
        {
            nk.slice_set(&kb.narrow(2, 0, past)?.contiguous()?, 2, 0)?;
            nv.slice_set(&vb.narrow(2, 0, past)?.contiguous()?, 2, 0)?;
        }
        *slot = Some((nk, nv));
    }
    let (kb, vb) = slot.as_ref().expect("allocated above");
    kb.slice_set(&k.contiguous()?, 2, past)?;
    vb.slice_set(&v.contiguous()?, 2, past)?;
    Ok((kb.narrow(2, 0, need)?, vb.narrow(2, 0, need)?))
}

/// A dense decoder (Qwen2, Qwen3, Llama or Mistral) whose parameters live in a shared [`VarMap`].
#[derive(Clone)]
pub struct Qwen {
    cfg: QwenConfig,
    device: Device,
    dtype: DType,
    varmap: VarMap,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    lm_head: Option<Tensor>,
    inv_freq: Tensor,
    /// Bumped whenever the weights change (see [`Qwen::mark_weights_changed`]); shared by clones,
    /// which share the variables too.
    weights_version: Arc<AtomicU64>,
}

impl std::fmt::Debug for Qwen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Qwen")
            .field("arch", &self.cfg.arch)
            .field("parameters", &self.cfg.num_parameters())
            .field("dtype", &self.dtype)
            .field("device", &self.device)
            .finish()
    }
}

impl Qwen {
    /// A freshly initialised model (normal(0, `initializer_range`) matrices, unit norms, zero
    /// biases), reproducible from `seed` on every platform.
    pub fn new_random(cfg: &QwenConfig, seed: u64, dtype: DType, device: &Device) -> Result<Self> {
        cfg.validate(Path::new("(config)"))?;
        let varmap = VarMap::new();
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        {
            let mut data = varmap.data().lock().expect("varmap lock");
            for spec in param_specs(cfg) {
                let n: usize = spec.shape.iter().product();
                let values = match spec.init {
                    Init::Normal => normal_samples(&mut rng, n, cfg.initializer_range),
                    Init::Ones => vec![1.0; n],
                    Init::Zeros => vec![0.0; n],
                };
                let t = Tensor::from_vec(values, spec.shape.as_slice(), device)?.to_dtype(dtype)?;
                data.insert(spec.name, Var::from_tensor(&t)?);
            }
        }
        Self::from_varmap(cfg, varmap, dtype, device)
    }

    /// Load weights from safetensors files (one file or the shards of a sharded checkpoint),
    /// converting them to `dtype` on `device`.
    pub fn load_safetensors(
        cfg: &QwenConfig,
        files: &[PathBuf],
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        Self::load_safetensors_for(cfg, None, files, dtype, device)
    }

    /// [`Qwen::load_safetensors`], with `config` (the file `cfg` was read from) named in errors
    /// about shapes, since the shapes the weights must have come from it.
    pub(crate) fn load_safetensors_for(
        cfg: &QwenConfig,
        config: Option<&Path>,
        files: &[PathBuf],
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let shown = files.first().cloned().unwrap_or_default();
        // The files must be able to hold the parameters the configuration describes before
        // their names are listed: `num_hidden_layers = 2^40` would otherwise list 2^40 layers.
        let mut bytes = 0u64;
        for file in files {
            let len = std::fs::metadata(file)
                .map_err(|e| Error::io(file, e))?
                .len();
            bytes = bytes.saturating_add(len);
        }
        // Half a byte per parameter is the least any weight format takes (4-bit).
        let needed = cfg.checked_num_parameters().unwrap_or(usize::MAX);
        if needed as u128 > bytes as u128 * 2 {
            return Err(more_than_held(
                config,
                "(shapes)",
                &shown,
                format!(
                    "{needed} parameters, more than the {bytes} bytes of the weights files can hold"
                ),
            ));
        }
        let names = param_specs(cfg).into_iter().map(|s| s.name).collect();
        let tensors = crate::model::loading::load_tensors(files, &names, device)?;
        Self::from_tensors_for(cfg, config, tensors, &shown, dtype, device)
    }

    /// Build the model from named tensors (Hugging Face names; every parameter of `cfg` must be
    /// present with its shape, and nothing else), converted to `dtype` on `device`. `source`
    /// names the checkpoint in errors.
    pub fn from_tensors(
        cfg: &QwenConfig,
        tensors: std::collections::HashMap<String, Tensor>,
        source: &Path,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        Self::from_tensors_for(cfg, None, tensors, source, dtype, device)
    }

    /// [`Qwen::from_tensors`], with `config` (the file `cfg` was read from) named in errors
    /// about shapes.
    pub(crate) fn from_tensors_for(
        cfg: &QwenConfig,
        config: Option<&Path>,
        mut tensors: std::collections::HashMap<String, Tensor>,
        source: &Path,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        // Every layer's tensors must be among these, so a configuration with more layers than
        // there are tensors is refused before its parameters are listed (2^40 layers would be
        // listed for ever).
        if cfg.num_hidden_layers > tensors.len() {
            return Err(more_than_held(
                config,
                "num_hidden_layers",
                source,
                format!(
                    "{} layers, but the checkpoint holds {} tensors",
                    cfg.num_hidden_layers,
                    tensors.len()
                ),
            ));
        }
        let by = |what: &str| match config {
            Some(c) => format!("{what} by {}", c.display()),
            None => what.to_string(),
        };
        let specs = param_specs(cfg);
        let varmap = VarMap::new();
        {
            let mut data = varmap.data().lock().expect("varmap lock");
            for spec in specs {
                let t = tensors.remove(&spec.name).ok_or_else(|| Error::Weights {
                    path: source.to_path_buf(),
                    name: spec.name.clone(),
                    message: format!("missing from the checkpoint ({})", by("expected")),
                })?;
                if t.dims() != spec.shape.as_slice() {
                    return Err(Error::Weights {
                        path: source.to_path_buf(),
                        name: spec.name,
                        message: format!(
                            "shape {:?}, {} {:?}",
                            t.dims(),
                            by("expected"),
                            spec.shape
                        ),
                    });
                }
                let converted = t.to_device(device).and_then(|t| {
                    let t = if t.dtype() == dtype {
                        t
                    } else {
                        t.to_dtype(dtype)?
                    };
                    Var::from_tensor(&t)
                });
                let var = converted.map_err(|e| Error::Weights {
                    path: source.to_path_buf(),
                    name: spec.name.clone(),
                    message: format!("cannot convert {:?} to {dtype:?}: {e}", t.dtype()),
                })?;
                data.insert(spec.name, var);
            }
        }
        if let Some(name) = tensors.into_keys().min() {
            return Err(Error::Weights {
                path: source.to_path_buf(),
                name,
                message: format!(
                    "not a parameter of this {} configuration{}",
                    cfg.arch.hf_architecture(),
                    config.map_or(String::new(), |c| format!(" ({})", c.display()))
                ),
            });
        }
        Self::from_varmap(cfg, varmap, dtype, device)
    }

    /// Copy weights from safetensors files (e.g. a checkpoint this model saved) into its
    /// variables, in place: everything sharing the [`VarMap`] sees the new values. Every variable
    /// must be present with its shape; values are converted to the model's dtype.
    pub fn load_weights_in_place(&self, files: &[PathBuf]) -> Result<()> {
        let shown = files.first().cloned().unwrap_or_default();
        let names = self.named_vars().into_iter().map(|(n, _)| n).collect();
        let tensors = crate::model::loading::load_tensors(files, &names, &self.device)?;
        self.set_weights_in_place(tensors, &shown)
    }

    /// Set every variable to the tensor of its name, in place: everything sharing the
    /// [`VarMap`] sees the new values. Every variable must be present with its shape, and
    /// nothing else; everything is checked before anything changes. Values are converted to the
    /// model's dtype and device. `shown` names the source in errors.
    pub fn set_weights_in_place(
        &self,
        mut tensors: std::collections::HashMap<String, Tensor>,
        shown: &Path,
    ) -> Result<()> {
        let vars = self.named_vars();
        // Check everything before changing anything.
        for (name, var) in &vars {
            let t = tensors.get(name).ok_or_else(|| Error::Weights {
                path: shown.to_path_buf(),
                name: name.clone(),
                message: "missing from the checkpoint".into(),
            })?;
            if t.dims() != var.dims() {
                return Err(Error::Weights {
                    path: shown.to_path_buf(),
                    name: name.clone(),
                    message: format!("shape {:?}, expected {:?}", t.dims(), var.dims()),
                });
            }
        }
        if tensors.len() > vars.len() {
            let known: std::collections::HashSet<&str> =
                vars.iter().map(|(n, _)| n.as_str()).collect();
            let extra = tensors
                .keys()
                .filter(|k| !known.contains(k.as_str()))
                .min()
                .cloned()
                .unwrap_or_default();
            return Err(Error::Weights {
                path: shown.to_path_buf(),
                name: extra,
                message: "not a parameter of this model".into(),
            });
        }
        // Mark before and after: a prefix cache reading the version while the copy runs (which
        // the policy's update guard rules out) still sees it change.
        self.mark_weights_changed();
        for (name, var) in vars {
            let t = tensors.remove(&name).expect("checked above");
            var.set(&t.to_device(&self.device)?.to_dtype(self.dtype)?)?;
        }
        self.mark_weights_changed();
        Ok(())
    }

    /// Copies of every variable (not shared with the model: later updates do not show through),
    /// e.g. the initial checkpoint that LoRA adapters are merged into.
    pub fn snapshot(&self) -> Result<BaseWeights> {
        let mut tensors = Vec::new();
        for (name, var) in self.named_vars() {
            tensors.push((name, var.as_tensor().detach().copy()?));
        }
        Ok(BaseWeights::from_tensors(tensors))
    }

    /// Build the model around existing variables (every name of the config must be present with
    /// the right shape). The model shares the variables: updating them updates the model.
    pub fn from_varmap(
        cfg: &QwenConfig,
        varmap: VarMap,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        cfg.validate(Path::new("(config)"))?;
        let get = |name: &str| -> Result<Tensor> {
            let data = varmap.data().lock().expect("varmap lock");
            let var = data.get(name).ok_or_else(|| Error::Weights {
                path: PathBuf::from("(varmap)"),
                name: name.into(),
                message: "missing".into(),
            })?;
            Ok(var.as_tensor().clone())
        };
        for spec in param_specs(cfg) {
            let t = get(&spec.name)?;
            if t.dims() != spec.shape.as_slice() {
                return Err(Error::Weights {
                    path: PathBuf::from("(varmap)"),
                    name: spec.name,
                    message: format!("shape {:?}, expected {:?}", t.dims(), spec.shape),
                });
            }
        }
        let lin = |pre: &str, bias: bool| -> Result<Linear> {
            Ok(Linear {
                weight: get(&format!("{pre}.weight"))?,
                bias: if bias {
                    Some(get(&format!("{pre}.bias"))?)
                } else {
                    None
                },
            })
        };
        let mut layers = Vec::with_capacity(cfg.num_hidden_layers);
        for l in 0..cfg.num_hidden_layers {
            let pre = format!("model.layers.{l}");
            let qwen3 = cfg.arch.has_qk_norm();
            layers.push(Layer {
                input_norm: get(&format!("{pre}.input_layernorm.weight"))?,
                q: lin(&format!("{pre}.self_attn.q_proj"), cfg.attention_bias)?,
                k: lin(&format!("{pre}.self_attn.k_proj"), cfg.attention_bias)?,
                v: lin(&format!("{pre}.self_attn.v_proj"), cfg.attention_bias)?,
                o: lin(
                    &format!("{pre}.self_attn.o_proj"),
                    cfg.arch.has_output_bias(cfg.attention_bias),
                )?,
                q_norm: qwen3
                    .then(|| get(&format!("{pre}.self_attn.q_norm.weight")))
                    .transpose()?,
                k_norm: qwen3
                    .then(|| get(&format!("{pre}.self_attn.k_norm.weight")))
                    .transpose()?,
                post_norm: get(&format!("{pre}.post_attention_layernorm.weight"))?,
                gate: lin(&format!("{pre}.mlp.gate_proj"), false)?,
                up: lin(&format!("{pre}.mlp.up_proj"), false)?,
                down: lin(&format!("{pre}.mlp.down_proj"), false)?,
            });
        }
        // Rotary frequencies as transformers computes them (in f32).
        let hd = cfg.head_dim;
        let inv = cfg.rope_inv_freq();
        Ok(Qwen {
            embed: get("model.embed_tokens.weight")?,
            norm: get("model.norm.weight")?,
            lm_head: if cfg.tie_word_embeddings {
                None
            } else {
                Some(get("lm_head.weight")?)
            },
            inv_freq: Tensor::from_vec(inv, (1, 1, hd / 2), device)?,
            layers,
            cfg: cfg.clone(),
            device: device.clone(),
            dtype,
            varmap,
            weights_version: Arc::new(AtomicU64::new(0)),
        })
    }

    /// The weights' version: it changes whenever the weights change through this crate (the
    /// trainers' optimizer steps, [`Qwen::load_weights_in_place`], the end of a
    /// [`CandlePolicy::update_guard`](crate::sample::policy::CandlePolicy::update_guard)). Values
    /// derived from the weights, like the prefix cache's keys and values, are valid only for the
    /// version they were computed under. Clones share it; a `Qwen` built anew with
    /// [`Qwen::from_varmap`] around the same variables has its own.
    pub fn weights_version(&self) -> u64 {
        self.weights_version.load(Ordering::Acquire)
    }

    /// Record that the weights changed. Code that writes the variables itself (`Var::set` on the
    /// shared [`VarMap`]) outside the policy's update guard must call this afterwards, or caches
    /// keep serving values computed with the old weights.
    pub fn mark_weights_changed(&self) {
        self.weights_version.fetch_add(1, Ordering::AcqRel);
    }

    /// The configuration.
    pub fn config(&self) -> &QwenConfig {
        &self.cfg
    }

    /// The device the weights live on.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// The weights' dtype.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The shared variables (HF names). Cloning a `VarMap` shares it.
    pub fn varmap(&self) -> &VarMap {
        &self.varmap
    }

    /// Every trainable variable with its HF name, sorted by name.
    pub fn named_vars(&self) -> Vec<(String, Var)> {
        let data = self.varmap.data().lock().expect("varmap lock");
        let mut vars: Vec<(String, Var)> =
            data.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        vars.sort_by(|a, b| a.0.cmp(&b.0));
        vars
    }

    /// The lm_head matrix `[vocab, hidden]` (the embedding itself when they are tied).
    pub fn lm_head_weight(&self) -> Tensor {
        self.lm_head.as_ref().unwrap_or(&self.embed).clone()
    }

    /// The embedding matrix `[vocab, hidden]`.
    pub fn embedding_weight(&self) -> Tensor {
        self.embed.clone()
    }

    /// Final hidden states `[B, T, hidden]` (after the last RMSNorm) of full sequences, with
    /// positions `0..T` and a causal mask. Sequences of different lengths are right-padded: a
    /// position never sees anything after it, so padding does not change real positions.
    pub fn forward_hidden(&self, ids: &Tensor) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let positions: Vec<f32> = (0..b).flat_map(|_| (0..t).map(|p| p as f32)).collect();
        let positions = Tensor::from_vec(positions, (b, t, 1), &self.device)?;
        self.run(ids, &positions, &mut Context::Causal, Matmul::Gemm)
    }

    /// Logits `[B, T, vocab]` of final hidden states (full vocabulary: for small cases only; the
    /// trainer uses the chunked log-prob op instead).
    pub fn logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let lm = Linear {
            weight: self.lm_head_weight(),
            bias: None,
        };
        lm.forward(hidden, Matmul::Gemm)
    }

    /// `logits(forward_hidden(ids))`.
    pub fn forward_logits(&self, ids: &Tensor) -> Result<Tensor> {
        self.logits(&self.forward_hidden(ids)?)
    }

    /// Feed `ids` `[B, T]` after what `cache` holds and return their final hidden states
    /// `[B, T, hidden]`. On the first call rows are left-padded by `cache.pads()`. For sampling:
    /// with `T` = 1 on the CPU in f32 the attention runs [`rowdot::decode_attention`], outside
    /// the autograd graph (training uses [`Qwen::forward_hidden`]).
    pub fn forward_cached(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        self.forward_cached_with(ids, cache, Matmul::Gemm)
    }

    /// [`Qwen::forward_cached`] for a decoding step (`T` = 1, one row per sequence): on the CPU
    /// in f32, for up to 16 rows, the weight products are dot products of rows
    /// ([`rowdot::linear_rows`]), which read every weight once instead of packing it first, and
    /// the attention reads each row's own cached columns ([`rowdot::decode_attention`]), so a
    /// row gets the same bits whatever the other rows of the batch. For sampling: those kernels
    /// build their results outside the autograd graph.
    pub fn forward_decode(&self, ids: &Tensor, cache: &mut KvCache) -> Result<Tensor> {
        self.forward_cached_with(ids, cache, Matmul::RowDot)
    }

    fn forward_cached_with(
        &self,
        ids: &Tensor,
        cache: &mut KvCache,
        how: Matmul,
    ) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        if b != cache.batch() {
            return Err(Error::Msg(format!(
                "cache has {} rows, input {b}",
                cache.batch()
            )));
        }
        if cache.layers.len() != self.layers.len() {
            return Err(Error::Msg("cache was made for another model".into()));
        }
        let past = cache.len;
        let total = past + t;
        let mut positions = Vec::with_capacity(b * t);
        for &pad in &cache.pads {
            for i in 0..t {
                // Padding positions get position 0; their outputs are never used.
                positions.push((past + i).saturating_sub(pad) as f32);
            }
        }
        let positions = Tensor::from_vec(positions, (b, t, 1), &self.device)?;
        let need_mask = t > 1 || cache.pads.iter().any(|&p| p > 0);
        let mask = if need_mask {
            let mut m = Vec::with_capacity(b * t * total);
            for &pad in &cache.pads {
                for i in 0..t {
                    let q = past + i;
                    for j in 0..total {
                        let visible = j <= q && (j >= pad || q < pad);
                        m.push(if visible { 0.0 } else { MASKED });
                    }
                }
            }
            Some(Tensor::from_vec(m, (b, 1, 1, t, total), &self.device)?)
        } else {
            None
        };
        let out = self.run(ids, &positions, &mut Context::Cache { cache, mask }, how)?;
        Ok(out)
    }

    /// Prefill several sequences in one forward pass: segment `i` feeds `tokens` after what its
    /// one-row, unpadded `cache` holds. Returns the final hidden state of each segment's last
    /// token, `[segments, 1, hidden]`.
    ///
    /// The tokens of all segments go through the weight products as the rows of one matmul, and
    /// each segment attends only to its own cache. Neither depends on the other segments (the
    /// products give a row the same bits in any call of two or more rows, and single-row calls
    /// run as two), so a segment's keys, values and hidden states are bit-identical to feeding
    /// it alone through [`Qwen::forward_cached`].
    pub fn prefill_segments(&self, segments: &mut [(&[u32], &mut KvCache)]) -> Result<Tensor> {
        let mut ids = Vec::new();
        let mut positions = Vec::new();
        let mut parts = Vec::with_capacity(segments.len());
        let mut last = Vec::with_capacity(segments.len());
        for (i, (tokens, cache)) in segments.iter_mut().enumerate() {
            if tokens.is_empty() {
                return Err(Error::Msg(format!("prefill segment {i} has no tokens")));
            }
            if cache.batch() != 1 || cache.pads[0] != 0 {
                return Err(Error::Msg(format!(
                    "prefill segment {i}: expected a one-row cache without padding, got {} rows",
                    cache.batch()
                )));
            }
            if cache.layers.len() != self.layers.len() {
                return Err(Error::Msg("cache was made for another model".into()));
            }
            let (past, t) = (cache.len, tokens.len());
            let mask = (t > 1)
                .then(|| {
                    let m: Vec<f32> = (0..t)
                        .flat_map(|q| {
                            (0..past + t).map(move |j| if j <= past + q { 0.0 } else { MASKED })
                        })
                        .collect();
                    Tensor::from_vec(m, (1, 1, 1, t, past + t), &self.device)
                })
                .transpose()?;
            parts.push(Segment {
                start: ids.len(),
                len: t,
                cache,
                mask,
            });
            ids.extend_from_slice(tokens);
            positions.extend((past..past + t).map(|p| p as f32));
            last.push((ids.len() - 1) as u32);
        }
        if parts.is_empty() {
            return Err(Error::Msg("no prefill segments".into()));
        }
        let n = ids.len();
        let ids = Tensor::from_vec(ids, (1, n), &self.device)?;
        let positions = Tensor::from_vec(positions, (1, n, 1), &self.device)?;
        let hidden = self.run(
            ids.as_ref(),
            &positions,
            &mut Context::Segments(parts),
            Matmul::Gemm,
        )?;
        let last = Tensor::new(last.as_slice(), &self.device)?;
        Ok(hidden.squeeze(0)?.index_select(&last, 0)?.unsqueeze(1)?)
    }

    /// The decoder stack. `positions` is `[B, T, 1]` f32; `context` says what the queries see
    /// and receives the new keys and values.
    fn run(
        &self,
        ids: &Tensor,
        positions: &Tensor,
        context: &mut Context<'_>,
        how: Matmul,
    ) -> Result<Tensor> {
        let (b, t) = ids.dims2()?;
        let h = self.cfg.hidden_size;
        let mut x = self
            .embed
            .index_select(&ids.flatten_all()?, 0)?
            .reshape((b, t, h))?;
        // cos/sin [B, 1, T, head_dim] in the model dtype, as transformers casts them.
        let freqs = positions.broadcast_mul(&self.inv_freq)?;
        let emb = Tensor::cat(&[&freqs, &freqs], D::Minus1)?.unsqueeze(1)?;
        let cos = emb.cos()?.to_dtype(self.dtype)?;
        let sin = emb.sin()?.to_dtype(self.dtype)?;
        let dtype = self.softmax_dtype();
        match context {
            Context::Causal => {}
            Context::Cache { mask, .. } => {
                *mask = mask.take().map(|m| m.to_dtype(dtype)).transpose()?;
            }
            Context::Segments(parts) => {
                for p in parts.iter_mut() {
                    p.mask = p.mask.take().map(|m| m.to_dtype(dtype)).transpose()?;
                }
            }
        }
        for (li, layer) in self.layers.iter().enumerate() {
            let normed = rms_norm(&x, &layer.input_norm, self.cfg.rms_norm_eps)?;
            let attn = self.attention(layer, li, &normed, &cos, &sin, context, how)?;
            x = (x + attn)?;
            let normed = rms_norm(&x, &layer.post_norm, self.cfg.rms_norm_eps)?;
            let act = fused::swiglu(
                &layer.gate.forward(&normed, how)?,
                &layer.up.forward(&normed, how)?,
            )?;
            x = (x + layer.down.forward(&act, how)?)?;
        }
        match context {
            Context::Causal => {}
            Context::Cache { cache, .. } => cache.len += t,
            Context::Segments(parts) => {
                for p in parts.iter_mut() {
                    p.cache.len += p.len;
                }
            }
        }
        rms_norm(&x, &self.norm, self.cfg.rms_norm_eps)
    }

    fn softmax_dtype(&self) -> DType {
        if self.dtype == DType::F64 {
            DType::F64
        } else {
            DType::F32
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn attention(
        &self,
        layer: &Layer,
        li: usize,
        x: &Tensor,
        cos: &Tensor,
        sin: &Tensor,
        context: &mut Context<'_>,
        how: Matmul,
    ) -> Result<Tensor> {
        let (b, t, _) = x.dims3()?;
        let (nh, kvh, hd) = (
            self.cfg.num_attention_heads,
            self.cfg.num_key_value_heads,
            self.cfg.head_dim,
        );
        let eps = self.cfg.rms_norm_eps;
        let scale = 1.0 / (hd as f64).sqrt();
        let mut q = layer.q.forward(x, how)?.reshape((b, t, nh, hd))?;
        let mut k = layer.k.forward(x, how)?.reshape((b, t, kvh, hd))?;
        let v = layer.v.forward(x, how)?.reshape((b, t, kvh, hd))?;
        if let (Some(qn), Some(kn)) = (&layer.q_norm, &layer.k_norm) {
            q = rms_norm(&q, qn, eps)?;
            k = rms_norm(&k, kn, eps)?;
        }
        // [B, heads, T, head_dim], rotated.
        let q = fused::rope_to_heads(&q, cos, sin)?;
        let k = fused::rope_to_heads(&k, cos, sin)?;
        let v = v.transpose(1, 2)?.contiguous()?;
        let out = match context {
            // Whole sequences from position 0: causal attention without a materialised mask.
            Context::Causal => fused::causal_attention(&q, &k, &v, scale)?,
            Context::Cache { cache, mask } => {
                let past = cache.len;
                let pads = &cache.pads;
                self.attend(&q, &k, &v, &mut cache.layers[li], past, pads, mask.as_ref())?
            }
            Context::Segments(parts) => {
                let outs = parts
                    .iter_mut()
                    .map(|p| {
                        let past = p.cache.len;
                        self.attend(
                            &q.narrow(2, p.start, p.len)?,
                            &k.narrow(2, p.start, p.len)?,
                            &v.narrow(2, p.start, p.len)?,
                            &mut p.cache.layers[li],
                            past,
                            &[0],
                            p.mask.as_ref(),
                        )
                    })
                    .collect::<Result<Vec<_>>>()?;
                Tensor::cat(&outs, 1)?
            }
        };
        layer.o.forward(&out, how)
    }

    /// Attention of rotated queries `q` `[B, heads, T, head_dim]` to the `past` cached columns
    /// of one layer and the new keys and values `k`, `v` (written into the cache), under the
    /// additive `mask` (broadcastable to `[B, kv_heads, groups, T, S]`; row `b` is left-padded
    /// by `pads[b]` columns). Returns `[B, T, heads * head_dim]`.
    #[allow(clippy::too_many_arguments)]
    fn attend(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        slot: &mut Option<(Tensor, Tensor)>,
        past: usize,
        pads: &[usize],
        mask: Option<&Tensor>,
    ) -> Result<Tensor> {
        let (b, nh, t, hd) = q.dims4()?;
        let kvh = self.cfg.num_key_value_heads;
        let groups = nh / kvh;
        let scale = 1.0 / (hd as f64).sqrt();
        let (k, v) = append_kv(slot, past, k, v)?;
        let s = k.dim(2)?;
        // One query per row (a decoding step): a row sees its columns after its padding.
        if t == 1
            && let Some(out) = rowdot::decode_attention(q, &k, &v, s, pads, scale)?
        {
            return Ok(out);
        }
        // Grouped-query attention without copying keys: the `groups` query heads that share a
        // key/value head are stacked along the time axis of one matmul.
        let q = (q * scale)?.reshape((b, kvh, groups * t, hd))?;
        let scores = q.matmul(&k.t()?)?.to_dtype(self.softmax_dtype())?;
        let mut scores = scores.reshape((b, kvh, groups, t, s))?;
        if let Some(m) = mask {
            scores = scores.broadcast_add(m)?;
        }
        let probs = softmax_last_dim(&scores)?.to_dtype(self.dtype)?;
        let out = probs.reshape((b, kvh, groups * t, s))?.matmul(&v)?;
        Ok(out
            .reshape((b, nh, t, hd))?
            .transpose(1, 2)?
            .reshape((b, t, nh * hd))?)
    }

    /// Logits at the last position of each row: `[B, vocab]` in f32, for sampling (up to 16 rows
    /// on the CPU the product is built outside the autograd graph). On the CPU in f32, for up
    /// to `INVARIANT_LOGIT_ROWS` rows, a row's logits do not depend on the other rows (the
    /// product runs as dot products of rows; beyond, on gemm).
    pub fn last_logits(&self, hidden: &Tensor) -> Result<Tensor> {
        let (_, t, _) = hidden.dims3()?;
        let last = hidden.i((.., t - 1, ..))?.contiguous()?;
        let lm = Linear {
            weight: self.lm_head_weight(),
            bias: None,
        };
        Ok(lm.forward(&last, Matmul::RowDot)?.to_dtype(DType::F32)?)
    }
}

/// What the queries of a forward pass attend to.
enum Context<'c> {
    /// Whole sequences from position 0.
    Causal,
    /// The columns of `cache` (rows possibly left-padded) and the new tokens, `mask` saying
    /// which a query sees.
    Cache {
        cache: &'c mut KvCache,
        mask: Option<Tensor>,
    },
    /// One row made of consecutive segments, each after its own one-row cache.
    Segments(Vec<Segment<'c>>),
}

/// Tokens `start..start + len` of a [`Context::Segments`] row, fed after `cache`.
struct Segment<'c> {
    start: usize,
    len: usize,
    cache: &'c mut KvCache,
    mask: Option<Tensor>,
}

/// Log-probs of `tokens` following `context` under `model` (temperature 1, full vocabulary), one
/// per token, from one forward pass over `context + tokens` with the chunked log-prob op.
///
/// `context` must not be empty when `tokens` is not (the first token needs something to be
/// predicted from).
pub fn score_continuation(
    model: &Qwen,
    context: &[u32],
    tokens: &[u32],
    cfg: &LogProbConfig,
) -> Result<Vec<f32>> {
    if tokens.is_empty() {
        return Ok(Vec::new());
    }
    if context.is_empty() {
        return Err(Error::Request(
            "score_continuation: empty context; the first token cannot be scored".into(),
        ));
    }
    let vocab = model.config().vocab_size;
    if let Some(&bad) = context.iter().chain(tokens).find(|&&t| t as usize >= vocab) {
        return Err(Error::Request(format!(
            "score_continuation: token id {bad} outside the vocabulary of {vocab}"
        )));
    }
    let dev = model.device();
    // The model sees every token but the last; the hidden state at p - 1 predicts the token at p.
    let mut ids = context.to_vec();
    ids.extend_from_slice(&tokens[..tokens.len() - 1]);
    let len = ids.len();
    let input = Tensor::from_vec(ids, (1, len), dev)?;
    let hidden = model.forward_hidden(&input)?.squeeze(0)?;
    let hidden = hidden.narrow(0, context.len() - 1, tokens.len())?;
    let targets = Tensor::from_slice(tokens, tokens.len(), dev)?;
    let out = token_logprobs(&hidden, &model.lm_head_weight(), &targets, cfg)?;
    Ok(out
        .logp
        .detach()
        .to_dtype(candle_core::DType::F32)?
        .to_vec1()?)
}

/// RMSNorm over the last dim, computed in f32 (f64 for f64 models) and cast back before the
/// weight, as transformers does. Differentiable: a fused op with its own backward on the CPU in
/// f32/f64 ([`crate::ops::fused::rms_norm`]),
/// [`rms_norm_primitive`](crate::ops::reference::rms_norm_primitive) elsewhere.
pub fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> Result<Tensor> {
    Ok(fused::rms_norm(x, weight, eps)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::config::{Arch, RopeScaling};
    use crate::ops::reference::{softmax_last_dim_primitive, token_logprobs};

    fn tiny(arch: Arch, tied: bool) -> QwenConfig {
        let mut cfg = QwenConfig::tiny_qwen3(50);
        cfg.arch = arch;
        cfg.hidden_size = 32;
        cfg.intermediate_size = 48;
        cfg.num_attention_heads = 4;
        cfg.num_key_value_heads = 2;
        cfg.head_dim = 8;
        cfg.tie_word_embeddings = tied;
        cfg.attention_bias = arch == Arch::Qwen2;
        cfg.initializer_range = 0.2;
        cfg
    }

    fn ids(rows: &[&[u32]]) -> Tensor {
        let t = rows[0].len();
        let flat: Vec<u32> = rows.iter().flat_map(|r| r.iter().copied()).collect();
        Tensor::from_vec(flat, (rows.len(), t), &Device::Cpu).unwrap()
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap()
    }

    #[test]
    fn every_parameter_gets_a_gradient() {
        for (arch, tied, bias) in [
            (Arch::Qwen3, true, true), // exercise biases on Qwen3 too
            (Arch::Qwen3, false, true),
            (Arch::Qwen2, false, true),
            (Arch::Llama, true, false),
            (Arch::Mistral, false, false),
        ] {
            let mut cfg = tiny(arch, tied);
            cfg.attention_bias = bias;
            let model = Qwen::new_random(&cfg, 1, DType::F32, &Device::Cpu).unwrap();
            let input = ids(&[&[1, 5, 9, 2, 7], &[3, 3, 4, 8, 0]]);
            let logits = model.forward_logits(&input).unwrap();
            let targets = Tensor::new(&[5u32, 9, 2, 7, 1, 3, 4, 8, 0, 2], &Device::Cpu).unwrap();
            let lp = token_logprobs(&logits.reshape((10, 50)).unwrap(), &targets).unwrap();
            let loss = lp.mean_all().unwrap().neg().unwrap();
            let grads = loss.backward().unwrap();
            let vars = model.named_vars();
            assert_eq!(vars.len(), param_specs(&cfg).len());
            for (name, var) in vars {
                let g = grads
                    .get(var.as_tensor())
                    .unwrap_or_else(|| panic!("{arch:?}: no gradient for {name}"));
                let norm: f32 = g.sqr().unwrap().sum_all().unwrap().to_scalar().unwrap();
                assert!(
                    norm > 0.0 && norm.is_finite(),
                    "{arch:?}: zero gradient for {name}"
                );
            }
        }
    }

    #[test]
    fn cached_decoding_matches_full_forward() {
        for arch in Arch::ALL {
            let mut cfg = tiny(arch, true);
            if arch == Arch::Llama {
                cfg.rope_scaling = Some(RopeScaling::Llama3 {
                    factor: 8.0,
                    low_freq_factor: 1.0,
                    high_freq_factor: 4.0,
                    original_max_position_embeddings: 16,
                });
            }
            let model = Qwen::new_random(&cfg, 2, DType::F32, &Device::Cpu).unwrap();
            let seq: [u32; 7] = [4, 8, 15, 16, 23, 42, 7];
            let full = model.forward_hidden(&ids(&[&seq])).unwrap();
            let mut cache = KvCache::for_model(&model, 1);
            let a = model
                .forward_cached(&ids(&[&seq[..4]]), &mut cache)
                .unwrap();
            let mut parts = vec![a];
            for &tok in &seq[4..] {
                parts.push(model.forward_cached(&ids(&[&[tok]]), &mut cache).unwrap());
            }
            let inc = Tensor::cat(&parts, 1).unwrap();
            assert!(max_abs_diff(&full, &inc) < 1e-5, "{arch:?}");
            assert_eq!(cache.len(), 7);
        }
    }

    #[test]
    fn prefill_segments_are_bit_identical_to_feeding_each_alone() {
        for arch in [Arch::Qwen3, Arch::Qwen2] {
            let model = Qwen::new_random(&tiny(arch, false), 3, DType::F32, &Device::Cpu).unwrap();
            let bits = |t: &Tensor| -> Vec<u32> {
                let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
                v.into_iter().map(f32::to_bits).collect()
            };
            // Segment 0 starts a sequence, segment 1 continues one fed 5 tokens before, segment 2
            // is a single token (a lone row that gemm would sum in another order).
            let past: [u32; 5] = [9, 9, 1, 2, 3];
            let tokens: [&[u32]; 3] = [&[4, 8, 15, 16], &[23, 42, 7], &[11]];
            let start = |i: usize| {
                let mut c = KvCache::for_model(&model, 1);
                if i == 1 {
                    model.forward_cached(&ids(&[&past]), &mut c).unwrap();
                }
                c
            };
            let mut alone = Vec::new();
            for (i, t) in tokens.iter().enumerate() {
                let mut c = start(i);
                let h = model.forward_cached(&ids(&[t]), &mut c).unwrap();
                alone.push((h.i((.., t.len() - 1.., ..)).unwrap(), c));
            }
            let mut caches: Vec<KvCache> = (0..3).map(start).collect();
            let mut segments: Vec<(&[u32], &mut KvCache)> =
                tokens.iter().copied().zip(caches.iter_mut()).collect();
            let last = model.prefill_segments(&mut segments).unwrap();
            assert_eq!(last.dims(), &[3, 1, 32]);
            for (i, (h, c)) in alone.iter().enumerate() {
                assert_eq!(
                    bits(&last.narrow(0, i, 1).unwrap()),
                    bits(h),
                    "{arch:?} {i}"
                );
                assert_eq!(caches[i].len(), c.len());
                let (a, b) = (
                    &caches[i].columns(c.len()).unwrap(),
                    &c.columns(c.len()).unwrap(),
                );
                for ((ka, va), (kb, vb)) in a.iter().zip(b) {
                    assert_eq!((bits(ka), bits(va)), (bits(kb), bits(vb)), "{arch:?} {i}");
                }
            }
            // A padded or multi-row cache is refused.
            let mut two = KvCache::for_model(&model, 2);
            let err = model
                .prefill_segments(&mut [(&[1u32][..], &mut two)])
                .unwrap_err();
            assert!(err.to_string().contains("one-row cache"), "{err}");
        }
    }

    #[test]
    fn gemm_products_give_a_row_its_bits_in_any_call() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        let mut tensor = |rows: usize, cols: usize| {
            let v: Vec<f32> = normal_samples(&mut rng, rows * cols, 1.0)
                .into_iter()
                .map(|x| x as f32)
                .collect();
            Tensor::from_vec(v, (rows, cols), &Device::Cpu).unwrap()
        };
        // (inputs, outputs): products gemm runs on its small path for few rows, and a narrow
        // one over more than 512 inputs, whose inputs it splits differently below 65 rows.
        for (k, n) in [(32, 8), (32, 48), (64, 200), (600, 64), (512, 512)] {
            let lin = Linear {
                weight: tensor(n, k),
                bias: None,
            };
            let x = tensor(80, k);
            let all: Vec<Vec<f32>> = lin.forward(&x, Matmul::Gemm).unwrap().to_vec2().unwrap();
            for m in [1, 2, 3, 5, 8, 17, 33, 64, 65, 79] {
                let part: Vec<Vec<f32>> = lin
                    .forward(&x.narrow(0, 0, m).unwrap(), Matmul::Gemm)
                    .unwrap()
                    .to_vec2()
                    .unwrap();
                for (r, row) in part.iter().enumerate() {
                    assert_eq!(row, &all[r], "{k} -> {n}, {m} rows: row {r}");
                }
            }
        }
    }

    #[test]
    fn decoding_rows_get_their_bits_whatever_the_batch() {
        let model =
            Qwen::new_random(&tiny(Arch::Qwen3, false), 4, DType::F32, &Device::Cpu).unwrap();
        let hidden = model
            .forward_hidden(&ids(&[&[1, 2, 3], &[4, 5, 6], &[7, 8, 9]]))
            .unwrap();
        let all: Vec<Vec<f32>> = model.last_logits(&hidden).unwrap().to_vec2().unwrap();
        for (r, want) in all.iter().enumerate() {
            let one: Vec<Vec<f32>> = model
                .last_logits(&hidden.narrow(0, r, 1).unwrap())
                .unwrap()
                .to_vec2()
                .unwrap();
            assert_eq!(&one[0], want, "row {r}");
        }
    }

    #[test]
    fn bf16_forward_and_backward_track_f32() {
        let cfg = tiny(Arch::Qwen2, false);
        let f32m = Qwen::new_random(&cfg, 8, DType::F32, &Device::Cpu).unwrap();
        let bf16 = Qwen::new_random(&cfg, 8, DType::BF16, &Device::Cpu).unwrap();
        let input = ids(&[&[1, 2, 3, 4, 5, 6]]);
        let a = f32m.forward_logits(&input).unwrap();
        let b = bf16
            .forward_logits(&input)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap();
        let scale: f32 = a.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
        assert!(max_abs_diff(&a, &b) < 0.05 * scale.max(1.0));
        // The bf16 graph is differentiable too.
        let loss = bf16
            .forward_logits(&input)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .sqr()
            .unwrap();
        let grads = loss.sum_all().unwrap().backward().unwrap();
        assert!(
            bf16.named_vars()
                .iter()
                .all(|(_, v)| grads.get(v.as_tensor()).is_some())
        );
    }

    #[test]
    fn fused_softmax_matches_primitives_in_value_and_gradient() {
        for dtype in [DType::F32, DType::F64] {
            // Wide enough to take the multi-threaded path.
            // Seeded inputs: the comparison must not depend on the run.
            let mut rng = ChaCha8Rng::seed_from_u64(17);
            let x = Tensor::from_vec(
                normal_samples(&mut rng, 3 * 70 * 400, 3.0),
                (3, 70, 400),
                &Device::Cpu,
            )
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
            let masked = x.broadcast_add(
                &Tensor::from_vec(
                    (0..400)
                        .map(|j| if j % 7 == 0 { MASKED } else { 0.0 })
                        .collect::<Vec<f32>>(),
                    400,
                    &Device::Cpu,
                )
                .unwrap()
                .to_dtype(dtype)
                .unwrap(),
            );
            let x = Var::from_tensor(&masked.unwrap()).unwrap();
            let w = Tensor::from_vec(
                normal_samples(&mut rng, 3 * 70 * 400, 1.0),
                (3, 70, 400),
                &Device::Cpu,
            )
            .unwrap()
            .to_dtype(dtype)
            .unwrap();
            let a = softmax_last_dim(x.as_tensor()).unwrap();
            let b = softmax_last_dim_primitive(x.as_tensor()).unwrap();
            // Softmax values are at most 1; f32 sums in another order differ by a few ulps.
            let tol = if dtype == DType::F32 { 1e-5 } else { 1e-12 };
            let diff = |p: &Tensor, q: &Tensor| -> f64 {
                (p - q)
                    .unwrap()
                    .abs()
                    .unwrap()
                    .max_all()
                    .unwrap()
                    .to_dtype(DType::F64)
                    .unwrap()
                    .to_scalar()
                    .unwrap()
            };
            assert!(diff(&a, &b) < tol);
            let ga = (a * &w).unwrap().sum_all().unwrap().backward().unwrap();
            let gb = (b * &w).unwrap().sum_all().unwrap().backward().unwrap();
            let (ga, gb) = (
                ga.get(x.as_tensor()).unwrap(),
                gb.get(x.as_tensor()).unwrap(),
            );
            assert!(diff(ga, gb) < tol * 10.0, "{dtype:?}: {}", diff(ga, gb));
        }
    }

    #[test]
    fn cache_growth_keeps_results() {
        let model =
            Qwen::new_random(&tiny(Arch::Qwen3, true), 6, DType::F32, &Device::Cpu).unwrap();
        let seq: Vec<u32> = (0..150u32).map(|i| (i * 17 + 3) % 50).collect();
        let rows: Vec<&[u32]> = vec![&seq, &seq];
        let full = model.forward_hidden(&ids(&rows)).unwrap();
        // Two rows, one of which is dropped halfway; the buffers grow twice (5 -> 69 -> 104 ...).
        let mut cache = KvCache::for_model(&model, 2);
        let mut parts = vec![
            model
                .forward_cached(&ids(&[&seq[..5], &seq[..5]]), &mut cache)
                .unwrap(),
        ];
        for i in 5..seq.len() {
            if i == 80 {
                cache = cache.select_rows(&[1]).unwrap();
                parts = parts.iter().map(|p| p.i((1..2, .., ..)).unwrap()).collect();
            }
            let input: Vec<&[u32]> = if i < 80 {
                vec![&seq[i..=i], &seq[i..=i]]
            } else {
                vec![&seq[i..=i]]
            };
            parts.push(model.forward_cached(&ids(&input), &mut cache).unwrap());
        }
        let inc = Tensor::cat(&parts, 1).unwrap();
        assert!(max_abs_diff(&full.i((1..2, .., ..)).unwrap(), &inc) < 1e-4);
        assert_eq!(cache.len(), 150);
    }

    #[test]
    fn left_padded_rows_match_unpadded() {
        let model =
            Qwen::new_random(&tiny(Arch::Qwen3, false), 3, DType::F32, &Device::Cpu).unwrap();
        let long: [u32; 5] = [1, 2, 3, 4, 5];
        let short: [u32; 3] = [9, 8, 7];
        let mut cache = KvCache::new(2, vec![0, 2]);
        let h = model
            .forward_cached(&ids(&[&long, &[0, 0, 9, 8, 7]]), &mut cache)
            .unwrap();
        let h2 = model
            .forward_cached(&ids(&[&[6], &[6]]), &mut cache)
            .unwrap();
        let alone = model.forward_hidden(&ids(&[&[9, 8, 7, 6]])).unwrap();
        let got = Tensor::cat(
            &[
                h.i((1..2, 2..5, ..)).unwrap(),
                h2.i((1..2, .., ..)).unwrap(),
            ],
            1,
        )
        .unwrap();
        assert!(max_abs_diff(&alone, &got) < 1e-5);
        let alone_long = model.forward_hidden(&ids(&[&[1, 2, 3, 4, 5, 6]])).unwrap();
        let got_long = Tensor::cat(
            &[h.i((0..1, .., ..)).unwrap(), h2.i((0..1, .., ..)).unwrap()],
            1,
        )
        .unwrap();
        assert!(max_abs_diff(&alone_long, &got_long) < 1e-5);
        // Dropping the long row removes the shared padding columns.
        let mut only_short = cache.select_rows(&[1]).unwrap();
        assert_eq!((only_short.len(), only_short.pads()), (4, &[0usize][..]));
        let h3 = model
            .forward_cached(&ids(&[&[5]]), &mut only_short)
            .unwrap();
        let alone = model.forward_hidden(&ids(&[&[9, 8, 7, 6, 5]])).unwrap();
        assert!(max_abs_diff(&alone.i((.., 4..5, ..)).unwrap(), &h3) < 1e-5);
        let _ = short;
    }

    /// Finite differences in f64 on a tiny model: d(loss)/d(w) for a few entries of several
    /// weights, against autograd.
    #[test]
    fn finite_difference_gradient_f64() {
        let mut cfg = tiny(Arch::Qwen3, false);
        cfg.attention_bias = true;
        cfg.num_hidden_layers = 1;
        let model = Qwen::new_random(&cfg, 4, DType::F64, &Device::Cpu).unwrap();
        let input = ids(&[&[1, 5, 9, 2], &[3, 4, 8, 6]]);
        let targets = Tensor::new(&[5u32, 9, 2, 7, 4, 8, 6, 1], &Device::Cpu).unwrap();
        let loss_fn = |m: &Qwen| -> Tensor {
            let logits = m.forward_logits(&input).unwrap().reshape((8, 50)).unwrap();
            let logits = logits.to_dtype(DType::F64).unwrap();
            let max = logits.max_keepdim(1).unwrap().detach();
            let sh = logits.broadcast_sub(&max).unwrap();
            let lse = sh.exp().unwrap().sum_keepdim(1).unwrap().log().unwrap();
            let lp = sh
                .broadcast_sub(&lse)
                .unwrap()
                .gather(&targets.unsqueeze(1).unwrap(), 1);
            lp.unwrap().mean_all().unwrap().neg().unwrap()
        };
        let grads = loss_fn(&model).backward().unwrap();
        let vars: std::collections::HashMap<String, Var> = model.named_vars().into_iter().collect();
        let names = [
            "model.embed_tokens.weight",
            "model.layers.0.input_layernorm.weight",
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.k_proj.bias",
            "model.layers.0.self_attn.q_norm.weight",
            "model.layers.0.self_attn.k_norm.weight",
            "model.layers.0.self_attn.v_proj.weight",
            "model.layers.0.self_attn.o_proj.weight",
            "model.layers.0.mlp.gate_proj.weight",
            "model.layers.0.mlp.down_proj.weight",
            "model.norm.weight",
            "lm_head.weight",
        ];
        let eps = 1e-5;
        let mut worst: f64 = 0.0;
        for name in names {
            let var = &vars[name];
            let g = grads.get(var.as_tensor()).unwrap().flatten_all().unwrap();
            let g: Vec<f64> = g.to_vec1().unwrap();
            let base: Vec<f64> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            let shape = var.as_tensor().shape().clone();
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            for _ in 0..3 {
                let idx = rng.gen_range(0..base.len());
                let eval = |delta: f64| -> f64 {
                    let mut w = base.clone();
                    w[idx] += delta;
                    var.set(&Tensor::from_vec(w, &shape, &Device::Cpu).unwrap())
                        .unwrap();
                    loss_fn(&model).to_scalar::<f64>().unwrap()
                };
                let fd = (eval(eps) - eval(-eps)) / (2.0 * eps);
                var.set(&Tensor::from_vec(base.clone(), &shape, &Device::Cpu).unwrap())
                    .unwrap();
                // Central differences carry ~1e-10 of absolute round-off at this step size.
                let err = (fd - g[idx]).abs() / (fd.abs().max(g[idx].abs()).max(1e-4));
                worst = worst.max(err);
                assert!(err < 1e-5, "{name}[{idx}]: fd {fd} vs autograd {}", g[idx]);
            }
        }
        eprintln!("finite-difference worst relative error: {worst:.2e}");
    }
}
