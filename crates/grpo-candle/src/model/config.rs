//! Model configuration read from (and written to) a Hugging Face `config.json`.
//!
//! One dense decoder covers four `model_type`s: `qwen2`, `qwen3`, `llama` and `mistral`. They
//! differ only in which optional parts they have (biases on q/k/v, RMSNorm on q and k heads, the
//! rotary frequencies), so one [`QwenConfig`] with an [`Arch`] describes them all: a Qwen2 decoder
//! is a Llama decoder with q/k/v biases, and a Mistral decoder is a Llama decoder.
//!
//! Real checkpoints on the hub write `rope_theta` at the top level and `torch_dtype`; recent
//! `transformers` releases write `rope_parameters: {"rope_theta", "rope_type"}` and `dtype`. Both
//! are accepted. Fields we do not model (sliding windows, MoE, MLP biases, rope scaling other than
//! the default and Llama 3's) are rejected with an error naming the field rather than silently
//! mis-modelled.

use std::path::Path;

use candle_core::DType;
use serde_json::{Map, Value, json};

use crate::error::{Error, Result};

/// Which decoder family a config describes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    /// Qwen2 / Qwen2.5: biases on q, k and v; no q/k norms.
    Qwen2,
    /// Qwen3 dense: RMSNorm on each head of q and k; optional attention biases.
    Qwen3,
    /// Llama (1, 2, 3.x; SmolLM, TinyLlama, ...): optional attention biases, no q/k norms,
    /// optionally Llama 3's rotary frequency scaling.
    Llama,
    /// Mistral without a sliding window: a Llama decoder under another name.
    Mistral,
}

impl Arch {
    /// Every family, in a fixed order.
    pub const ALL: [Arch; 4] = [Arch::Qwen2, Arch::Qwen3, Arch::Llama, Arch::Mistral];

    /// The `model_type` string of `config.json`.
    pub fn model_type(self) -> &'static str {
        match self {
            Arch::Qwen2 => "qwen2",
            Arch::Qwen3 => "qwen3",
            Arch::Llama => "llama",
            Arch::Mistral => "mistral",
        }
    }

    /// The `architectures` entry `transformers` uses for the causal LM.
    pub fn hf_architecture(self) -> &'static str {
        match self {
            Arch::Qwen2 => "Qwen2ForCausalLM",
            Arch::Qwen3 => "Qwen3ForCausalLM",
            Arch::Llama => "LlamaForCausalLM",
            Arch::Mistral => "MistralForCausalLM",
        }
    }

    /// The family of a `model_type`, if it is one of ours.
    pub fn from_model_type(model_type: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.model_type() == model_type)
    }

    /// Whether each head of q and k goes through its own RMSNorm (Qwen3).
    pub fn has_qk_norm(self) -> bool {
        self == Arch::Qwen3
    }

    /// Whether the output projection has a bias when the config's `attention_bias` is set:
    /// transformers' Qwen3 and Llama put one on o as well as on q/k/v; Qwen2 never does.
    pub fn has_output_bias(self, attention_bias: bool) -> bool {
        attention_bias && self != Arch::Qwen2
    }
}

/// Rotary frequency scaling other than none.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum RopeScaling {
    /// Llama 3.1's (`rope_type: "llama3"`): long wavelengths divided by `factor`, short ones kept,
    /// a smooth blend between (transformers' `_compute_llama3_parameters`).
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// Wavelengths above `original_max_position_embeddings / low_freq_factor` are scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original_max_position_embeddings / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length the model was pretrained with.
        original_max_position_embeddings: usize,
    },
}

/// The hyper-parameters of a dense decoder of one of the [`Arch`] families.
#[derive(Debug, Clone, PartialEq)]
pub struct QwenConfig {
    /// Qwen2 or Qwen3.
    pub arch: Arch,
    /// Rows of the embedding and of the lm_head.
    pub vocab_size: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the SwiGLU MLP.
    pub intermediate_size: usize,
    /// Decoder layers.
    pub num_hidden_layers: usize,
    /// Query heads.
    pub num_attention_heads: usize,
    /// Key/value heads (grouped-query attention); divides `num_attention_heads`.
    pub num_key_value_heads: usize,
    /// Width of one head (Qwen3 sets it explicitly; Qwen2 uses hidden / heads).
    pub head_dim: usize,
    /// Longest sequence the model supports.
    pub max_position_embeddings: usize,
    /// Epsilon of every RMSNorm.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f64,
    /// Whether lm_head shares the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Biases on the q, k and v projections (always for Qwen2), and on o for Qwen3 and Llama
    /// ([`Arch::has_output_bias`]), as transformers reads `attention_bias`.
    pub attention_bias: bool,
    /// Rotary frequency scaling (`rope_scaling` / `rope_parameters` of type `llama3`), if any.
    pub rope_scaling: Option<RopeScaling>,
    /// Std of the normal initialisation of fresh weights.
    pub initializer_range: f64,
    /// Beginning-of-sequence id, when the config names one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence ids named by the config.
    pub eos_token_ids: Vec<u32>,
    /// The dtype the checkpoint was saved in (`torch_dtype` / `dtype`), when given.
    pub torch_dtype: Option<DType>,
    /// The original JSON, kept so that saving a loaded model preserves fields we do not model.
    pub raw: Option<Value>,
}

impl QwenConfig {
    /// A tiny Qwen3 configuration for tests and the embedded default.
    pub fn tiny_qwen3(vocab_size: usize) -> Self {
        QwenConfig {
            arch: Arch::Qwen3,
            vocab_size,
            hidden_size: 64,
            intermediate_size: 128,
            num_hidden_layers: 2,
            num_attention_heads: 4,
            num_key_value_heads: 2,
            head_dim: 16,
            max_position_embeddings: 4096,
            rms_norm_eps: 1e-6,
            rope_theta: 10_000.0,
            tie_word_embeddings: true,
            attention_bias: false,
            rope_scaling: None,
            initializer_range: 0.02,
            bos_token_id: None,
            eos_token_ids: Vec::new(),
            torch_dtype: Some(DType::F32),
            raw: None,
        }
    }

    /// Query heads per key/value head.
    pub fn kv_groups(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// Number of parameters (counting a tied embedding once); `usize::MAX` when the count
    /// overflows (which [`QwenConfig::validate`] refuses).
    pub fn num_parameters(&self) -> usize {
        self.checked_num_parameters().unwrap_or(usize::MAX)
    }

    /// Number of parameters (counting a tied embedding once), or `None` when it overflows.
    pub fn checked_num_parameters(&self) -> Option<usize> {
        let (h, i, v) = (self.hidden_size, self.intermediate_size, self.vocab_size);
        let qd = self.num_attention_heads.checked_mul(self.head_dim)?;
        let kvd = self.num_key_value_heads.checked_mul(self.head_dim)?;
        let sum = |terms: &[Option<usize>]| -> Option<usize> {
            terms
                .iter()
                .try_fold(0usize, |acc, t| acc.checked_add((*t)?))
        };
        let mut layer = sum(&[
            h.checked_mul(qd),
            h.checked_mul(kvd)?.checked_mul(2),
            qd.checked_mul(h),
            h.checked_mul(i)?.checked_mul(3),
            h.checked_mul(2),
        ])?;
        if self.attention_bias {
            layer = sum(&[Some(layer), Some(qd), kvd.checked_mul(2)])?;
        }
        if self.arch.has_output_bias(self.attention_bias) {
            layer = layer.checked_add(h)?;
        }
        if self.arch.has_qk_norm() {
            layer = sum(&[Some(layer), self.head_dim.checked_mul(2)])?;
        }
        let embed = v.checked_mul(h)?;
        let head = if self.tie_word_embeddings { 0 } else { embed };
        sum(&[
            Some(embed),
            self.num_hidden_layers.checked_mul(layer),
            Some(h),
            Some(head),
        ])
    }

    /// Check that the shapes fit together.
    pub fn validate(&self, source: &Path) -> Result<()> {
        let positive = [
            ("vocab_size", self.vocab_size),
            ("hidden_size", self.hidden_size),
            ("intermediate_size", self.intermediate_size),
            ("num_hidden_layers", self.num_hidden_layers),
            ("num_attention_heads", self.num_attention_heads),
            ("num_key_value_heads", self.num_key_value_heads),
            ("head_dim", self.head_dim),
            ("max_position_embeddings", self.max_position_embeddings),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(Error::config(source, field, "must be a positive integer"));
            }
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return Err(Error::config(
                source,
                "num_key_value_heads",
                format!(
                    "{} does not divide num_attention_heads = {}",
                    self.num_key_value_heads, self.num_attention_heads
                ),
            ));
        }
        if !self.head_dim.is_multiple_of(2) {
            return Err(Error::config(
                source,
                "head_dim",
                "must be even for rotary embeddings",
            ));
        }
        if self.checked_num_parameters().is_none() {
            return Err(Error::config(
                source,
                "(shapes)",
                "the parameter count of vocab_size, hidden_size, intermediate_size, \
                 num_hidden_layers, num_attention_heads, num_key_value_heads and head_dim \
                 overflows; expected the shapes of a model that fits in memory",
            ));
        }
        Ok(())
    }

    /// Read `config.json` from a file.
    pub fn from_file(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| Error::config(path, "(document)", format!("not valid JSON: {e}")))?;
        Self::from_json(&value, path)
    }

    /// Parse a `config.json` document; `source` names it in errors.
    pub fn from_json(value: &Value, source: &Path) -> Result<Self> {
        let obj = value
            .as_object()
            .ok_or_else(|| Error::config(source, "(document)", "expected a JSON object"))?;
        let expected = "expected \"qwen2\", \"qwen3\", \"llama\" or \"mistral\"";
        let model_type = str_field(obj, "model_type", source)?
            .ok_or_else(|| Error::config(source, "model_type", format!("missing; {expected}")))?;
        let arch = Arch::from_model_type(model_type).ok_or_else(|| {
            Error::config(
                source,
                "model_type",
                format!("`{model_type}` is not supported; {expected}"),
            )
        })?;
        let req = |field: &str| -> Result<usize> {
            usize_field(obj, field, source)?
                .ok_or_else(|| Error::config(source, field, "missing; expected a positive integer"))
        };
        let hidden_size = req("hidden_size")?;
        let num_attention_heads = req("num_attention_heads")?;
        let num_key_value_heads =
            usize_field(obj, "num_key_value_heads", source)?.unwrap_or(num_attention_heads);
        let head_dim = match usize_field(obj, "head_dim", source)? {
            Some(d) => d,
            None if num_attention_heads > 0 => hidden_size / num_attention_heads,
            None => 0,
        };

        // RoPE: `rope_theta` at the top level (hub checkpoints) or inside `rope_parameters`
        // (recent transformers); of the scalings only Llama 3's is modelled.
        let mut rope_theta = f64_field(obj, "rope_theta", source)?;
        let mut rope_scaling = None;
        for key in ["rope_parameters", "rope_scaling"] {
            match obj.get(key) {
                None | Some(Value::Null) => {}
                Some(Value::Object(params)) => {
                    let kind = params
                        .get("rope_type")
                        .or_else(|| params.get("type"))
                        .and_then(Value::as_str)
                        .unwrap_or("default");
                    match kind {
                        "default" => {}
                        "llama3" => rope_scaling = Some(llama3_scaling(params, key, source)?),
                        _ => {
                            return Err(Error::config(
                                source,
                                format!("{key}.rope_type"),
                                format!(
                                    "`{kind}` is not supported; only \"default\" and \"llama3\" \
                                     rotary embeddings are"
                                ),
                            ));
                        }
                    }
                    if let Some(theta) = params.get("rope_theta") {
                        rope_theta = Some(theta.as_f64().ok_or_else(|| {
                            Error::config(source, format!("{key}.rope_theta"), "expected a number")
                        })?);
                    }
                }
                Some(_) => {
                    return Err(Error::config(source, key, "expected an object or null"));
                }
            }
        }
        // Mistral names a window on every layer; attention within a window as long as the
        // longest sequence is full attention, so only a shorter one is refused.
        if let Some(window) = usize_field(obj, "sliding_window", source)?
            && arch == Arch::Mistral
            && window < usize_field(obj, "max_position_embeddings", source)?.unwrap_or(32_768)
        {
            return Err(Error::config(
                source,
                "sliding_window",
                format!(
                    "a window of {window} tokens is shorter than max_position_embeddings; \
                     sliding-window attention is not supported (expected null)"
                ),
            ));
        }
        if bool_field(obj, "mlp_bias", source)?.unwrap_or(false) {
            return Err(Error::config(
                source,
                "mlp_bias",
                "biases on the MLP projections are not supported; expected false",
            ));
        }
        if let Some(partial) = f64_field(obj, "partial_rotary_factor", source)?
            && partial != 1.0
        {
            return Err(Error::config(
                source,
                "partial_rotary_factor",
                format!("{partial} is not supported; expected 1 (rotary embedding on whole heads)"),
            ));
        }
        if let Some(tp) = usize_field(obj, "pretraining_tp", source)?
            && tp != 1
        {
            // transformers slices the projections when it is > 1 (same result up to rounding);
            // nothing here does, and a silent difference from the reference is worse.
            return Err(Error::config(
                source,
                "pretraining_tp",
                format!("{tp} is not supported; expected 1"),
            ));
        }
        if bool_field(obj, "use_sliding_window", source)?.unwrap_or(false) {
            return Err(Error::config(
                source,
                "use_sliding_window",
                "sliding-window attention is not supported; expected false",
            ));
        }
        for field in ["num_experts", "num_local_experts"] {
            if usize_field(obj, field, source)?.unwrap_or(0) > 0 {
                return Err(Error::config(
                    source,
                    field,
                    "mixture-of-experts models are not supported; only dense decoders",
                ));
            }
        }
        let act = str_field(obj, "hidden_act", source)?.unwrap_or("silu");
        if act != "silu" {
            return Err(Error::config(
                source,
                "hidden_act",
                format!("`{act}` is not supported; expected \"silu\""),
            ));
        }
        let dtype_name = match str_field(obj, "torch_dtype", source)? {
            Some(d) => Some(d),
            None => str_field(obj, "dtype", source)?,
        };
        let torch_dtype = match dtype_name {
            None => None,
            Some("float32") => Some(DType::F32),
            Some("bfloat16") => Some(DType::BF16),
            Some("float16") => Some(DType::F16),
            Some("float64") => Some(DType::F64),
            Some(other) => {
                return Err(Error::config(
                    source,
                    "torch_dtype",
                    format!("`{other}` is not supported; expected float32, bfloat16 or float16"),
                ));
            }
        };
        let eos_token_ids = match obj.get("eos_token_id") {
            None | Some(Value::Null) => Vec::new(),
            Some(Value::Number(n)) => vec![token_id(n.as_u64(), "eos_token_id", source)?],
            Some(Value::Array(items)) => items
                .iter()
                .map(|v| token_id(v.as_u64(), "eos_token_id", source))
                .collect::<Result<Vec<_>>>()?,
            Some(_) => {
                return Err(Error::config(
                    source,
                    "eos_token_id",
                    "expected an id or a list of ids",
                ));
            }
        };
        let bos_token_id = match obj.get("bos_token_id") {
            None | Some(Value::Null) => None,
            Some(v) => Some(token_id(v.as_u64(), "bos_token_id", source)?),
        };
        let cfg = QwenConfig {
            arch,
            vocab_size: req("vocab_size")?,
            hidden_size,
            intermediate_size: req("intermediate_size")?,
            num_hidden_layers: req("num_hidden_layers")?,
            num_attention_heads,
            num_key_value_heads,
            head_dim,
            max_position_embeddings: usize_field(obj, "max_position_embeddings", source)?
                .unwrap_or(32_768),
            rms_norm_eps: f64_field(obj, "rms_norm_eps", source)?.unwrap_or(1e-6),
            rope_theta: rope_theta.unwrap_or(10_000.0),
            tie_word_embeddings: bool_field(obj, "tie_word_embeddings", source)?.unwrap_or(false),
            attention_bias: match arch {
                Arch::Qwen2 => true,
                Arch::Qwen3 | Arch::Llama => {
                    bool_field(obj, "attention_bias", source)?.unwrap_or(false)
                }
                Arch::Mistral => false,
            },
            rope_scaling,
            initializer_range: f64_field(obj, "initializer_range", source)?.unwrap_or(0.02),
            bos_token_id,
            eos_token_ids,
            torch_dtype,
            raw: Some(value.clone()),
        };
        cfg.validate(source)?;
        Ok(cfg)
    }

    /// The `config.json` document to save with a checkpoint saved in `dtype`.
    ///
    /// A loaded config keeps every field it had (with the modelled ones refreshed); a fresh one
    /// is written the way hub checkpoints are (`rope_theta` and `torch_dtype` at the top level),
    /// which both older and recent `transformers` and vLLM read.
    pub fn to_json(&self, dtype: DType) -> Value {
        let mut obj = match &self.raw {
            Some(Value::Object(map)) => map.clone(),
            _ => Map::new(),
        };
        let dtype_name = match dtype {
            DType::BF16 => "bfloat16",
            DType::F16 => "float16",
            DType::F64 => "float64",
            _ => "float32",
        };
        let set = |obj: &mut Map<String, Value>, k: &str, v: Value| {
            obj.insert(k.to_string(), v);
        };
        set(
            &mut obj,
            "architectures",
            json!([self.arch.hf_architecture()]),
        );
        set(&mut obj, "model_type", json!(self.arch.model_type()));
        set(&mut obj, "vocab_size", json!(self.vocab_size));
        set(&mut obj, "hidden_size", json!(self.hidden_size));
        set(&mut obj, "intermediate_size", json!(self.intermediate_size));
        set(&mut obj, "num_hidden_layers", json!(self.num_hidden_layers));
        set(
            &mut obj,
            "num_attention_heads",
            json!(self.num_attention_heads),
        );
        set(
            &mut obj,
            "num_key_value_heads",
            json!(self.num_key_value_heads),
        );
        if self.arch != Arch::Qwen2 || obj.contains_key("head_dim") {
            set(&mut obj, "head_dim", json!(self.head_dim));
        }
        set(
            &mut obj,
            "max_position_embeddings",
            json!(self.max_position_embeddings),
        );
        set(&mut obj, "rms_norm_eps", json!(self.rms_norm_eps));
        set(
            &mut obj,
            "tie_word_embeddings",
            json!(self.tie_word_embeddings),
        );
        set(&mut obj, "hidden_act", json!("silu"));
        set(&mut obj, "initializer_range", json!(self.initializer_range));
        match self.arch {
            Arch::Qwen2 => {}
            Arch::Qwen3 | Arch::Llama => {
                set(&mut obj, "attention_bias", json!(self.attention_bias));
            }
            Arch::Mistral => {
                obj.entry("sliding_window").or_insert(Value::Null);
            }
        }
        if matches!(self.arch, Arch::Llama | Arch::Mistral) {
            obj.entry("mlp_bias").or_insert(json!(false));
        }
        // Keep the config's own way of writing rope_theta when it has one.
        let scaling = self.rope_scaling.map(|s| s.to_json());
        match obj.get_mut("rope_parameters") {
            Some(Value::Object(params)) => {
                for key in RopeScaling::KEYS {
                    params.remove(key);
                }
                params.insert("rope_theta".into(), json!(self.rope_theta));
                params.insert("rope_type".into(), json!("default"));
                if let Some(Value::Object(scaling)) = scaling {
                    params.extend(scaling);
                }
            }
            _ => {
                set(&mut obj, "rope_theta", json!(self.rope_theta));
                set(&mut obj, "rope_scaling", scaling.unwrap_or(Value::Null));
            }
        }
        if obj.contains_key("dtype") && !obj.contains_key("torch_dtype") {
            set(&mut obj, "dtype", json!(dtype_name));
        } else {
            set(&mut obj, "torch_dtype", json!(dtype_name));
        }
        obj.entry("use_cache").or_insert(json!(true));
        if matches!(self.arch, Arch::Qwen2 | Arch::Qwen3) {
            obj.entry("use_sliding_window").or_insert(json!(false));
        }
        obj.entry("attention_dropout").or_insert(json!(0.0));
        if let Some(bos) = self.bos_token_id {
            set(&mut obj, "bos_token_id", json!(bos));
        }
        match self.eos_token_ids.as_slice() {
            [] => {}
            [one] => set(&mut obj, "eos_token_id", json!(one)),
            many => set(&mut obj, "eos_token_id", json!(many)),
        }
        Value::Object(obj)
    }
}

impl RopeScaling {
    /// The keys a scaling adds to `rope_scaling` / `rope_parameters` besides `rope_type`.
    const KEYS: [&'static str; 4] = [
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
    ];

    /// The `rope_scaling` object transformers reads.
    pub fn to_json(self) -> Value {
        match self {
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => json!({
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low_freq_factor,
                "high_freq_factor": high_freq_factor,
                "original_max_position_embeddings": original_max_position_embeddings,
            }),
        }
    }
}

impl QwenConfig {
    /// The rotary inverse frequencies `[head_dim / 2]`, as transformers computes them in f32:
    /// `base^(-2i/d)`, then Llama 3's scaling when the config has it.
    pub fn rope_inv_freq(&self) -> Vec<f32> {
        let hd = self.head_dim;
        let base: Vec<f32> = (0..hd / 2)
            .map(|i| 1.0 / (self.rope_theta as f32).powf((2 * i) as f32 / hd as f32))
            .collect();
        let Some(RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        }) = self.rope_scaling
        else {
            return base;
        };
        let (factor, low, high) = (
            factor as f32,
            low_freq_factor as f32,
            high_freq_factor as f32,
        );
        let old_len = original_max_position_embeddings as f32;
        let (low_wavelen, high_wavelen) = (old_len / low, old_len / high);
        base.into_iter()
            .map(|f| {
                let wavelen = 2.0 * std::f32::consts::PI / f;
                if wavelen < high_wavelen {
                    f
                } else if wavelen > low_wavelen {
                    f / factor
                } else {
                    let smooth = (old_len / wavelen - low) / (high - low);
                    (1.0 - smooth) * f / factor + smooth * f
                }
            })
            .collect()
    }
}

fn llama3_scaling(params: &Map<String, Value>, key: &str, source: &Path) -> Result<RopeScaling> {
    let num = |field: &str| -> Result<f64> {
        params.get(field).and_then(Value::as_f64).ok_or_else(|| {
            Error::config(
                source,
                format!("{key}.{field}"),
                "missing; expected a number for llama3 rotary scaling",
            )
        })
    };
    let scaling = RopeScaling::Llama3 {
        factor: num("factor")?,
        low_freq_factor: num("low_freq_factor")?,
        high_freq_factor: num("high_freq_factor")?,
        original_max_position_embeddings: num("original_max_position_embeddings")? as usize,
    };
    let RopeScaling::Llama3 {
        factor,
        low_freq_factor,
        high_freq_factor,
        original_max_position_embeddings,
    } = scaling;
    if factor <= 0.0
        || low_freq_factor <= 0.0
        || high_freq_factor <= low_freq_factor
        || original_max_position_embeddings == 0
    {
        return Err(Error::config(
            source,
            key,
            "llama3 rotary scaling needs factor > 0, 0 < low_freq_factor < high_freq_factor \
             and original_max_position_embeddings > 0",
        ));
    }
    Ok(scaling)
}

fn token_id(v: Option<u64>, field: &str, source: &Path) -> Result<u32> {
    v.and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| Error::config(source, field, "expected a non-negative token id"))
}

fn usize_field(obj: &Map<String, Value>, field: &str, source: &Path) -> Result<Option<usize>> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(|n| Some(n as usize))
            .ok_or_else(|| Error::config(source, field, format!("expected an integer, found {v}"))),
    }
}

fn f64_field(obj: &Map<String, Value>, field: &str, source: &Path) -> Result<Option<f64>> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| Error::config(source, field, format!("expected a number, found {v}"))),
    }
}

fn bool_field(obj: &Map<String, Value>, field: &str, source: &Path) -> Result<Option<bool>> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_bool().map(Some).ok_or_else(|| {
            Error::config(source, field, format!("expected true or false, found {v}"))
        }),
    }
}

fn str_field<'a>(
    obj: &'a Map<String, Value>,
    field: &str,
    source: &Path,
) -> Result<Option<&'a str>> {
    match obj.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_str()
            .map(Some)
            .ok_or_else(|| Error::config(source, field, format!("expected a string, found {v}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<QwenConfig> {
        QwenConfig::from_json(&v, Path::new("config.json"))
    }

    #[test]
    fn hub_style_qwen3_config() {
        let cfg = parse(json!({
            "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "vocab_size": 151936,
            "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
            "max_position_embeddings": 40960, "rms_norm_eps": 1e-6, "rope_theta": 1000000,
            "rope_scaling": null, "tie_word_embeddings": true, "torch_dtype": "bfloat16",
            "attention_bias": false, "use_sliding_window": false, "eos_token_id": 151645,
            "bos_token_id": 151643, "hidden_act": "silu"
        }))
        .unwrap();
        assert_eq!(cfg.arch, Arch::Qwen3);
        assert_eq!(cfg.head_dim, 128);
        assert_eq!(cfg.kv_groups(), 4);
        assert_eq!(cfg.rope_theta, 1e6);
        assert_eq!(cfg.torch_dtype, Some(DType::BF16));
        assert_eq!(cfg.eos_token_ids, vec![151645]);
        assert!(cfg.tie_word_embeddings && !cfg.attention_bias);
        // Qwen3-4B has about 4.0e9 parameters.
        let n = cfg.num_parameters() as f64;
        assert!((3.9e9..4.1e9).contains(&n), "{n}");
    }

    #[test]
    fn recent_transformers_style_config() {
        let cfg = parse(json!({
            "model_type": "qwen2", "vocab_size": 100, "hidden_size": 32,
            "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
            "num_key_value_heads": 2, "dtype": "float32",
            "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"},
            "eos_token_id": [1, 2]
        }))
        .unwrap();
        assert_eq!(cfg.arch, Arch::Qwen2);
        assert_eq!(cfg.head_dim, 8);
        assert_eq!(cfg.rope_theta, 5e5);
        assert!(cfg.attention_bias);
        assert_eq!(cfg.eos_token_ids, vec![1, 2]);
        let out = cfg.to_json(DType::BF16);
        assert_eq!(out["rope_parameters"]["rope_theta"], json!(5e5));
        assert_eq!(out["dtype"], json!("bfloat16"));
        assert_eq!(parse(out).unwrap().rope_theta, 5e5);
    }

    #[test]
    fn errors_name_the_field() {
        let base = json!({"model_type": "qwen3", "vocab_size": 10, "hidden_size": 8,
            "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
            "num_key_value_heads": 2, "head_dim": 4});
        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            parse(b).unwrap_err().to_string()
        };
        assert!(with("model_type", json!("gpt2")).contains("model_type"));
        assert!(with("num_key_value_heads", json!(3)).contains("num_key_value_heads"));
        assert!(with("hidden_size", json!("8")).contains("hidden_size"));
        assert!(
            with("rope_scaling", json!({"rope_type": "yarn", "factor": 4.0}))
                .contains("rope_scaling.rope_type")
        );
        assert!(with("use_sliding_window", json!(true)).contains("use_sliding_window"));
        let mut missing = base.clone();
        missing.as_object_mut().unwrap().remove("vocab_size");
        assert!(
            parse(missing)
                .unwrap_err()
                .to_string()
                .contains("vocab_size")
        );
    }

    #[test]
    fn llama_and_mistral_configs() {
        // SmolLM2-135M-Instruct's config.json (hub style).
        let smol = parse(json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152,
            "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
            "num_attention_heads": 9, "num_key_value_heads": 3, "max_position_embeddings": 8192,
            "rms_norm_eps": 1e-5, "rope_theta": 100000, "rope_scaling": null,
            "tie_word_embeddings": true, "attention_bias": false, "mlp_bias": false,
            "pretraining_tp": 1, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2,
            "torch_dtype": "bfloat16"
        }))
        .unwrap();
        assert_eq!(
            (smol.arch, smol.head_dim, smol.kv_groups()),
            (Arch::Llama, 64, 3)
        );
        assert!(!smol.attention_bias && smol.rope_scaling.is_none());
        let n = smol.num_parameters() as f64;
        assert!((1.3e8..1.4e8).contains(&n), "{n}");
        let back = parse(smol.to_json(DType::BF16)).unwrap();
        assert_eq!(
            QwenConfig { raw: None, ..back },
            QwenConfig {
                raw: None,
                ..smol.clone()
            }
        );

        // Llama 3.2's scaled rotary frequencies.
        let base = json!({"model_type": "llama", "vocab_size": 10, "hidden_size": 16,
            "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
            "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}});
        let l3 = parse(base.clone()).unwrap();
        assert!(matches!(
            l3.rope_scaling,
            Some(RopeScaling::Llama3 { factor: 32.0, .. })
        ));
        let inv = l3.rope_inv_freq();
        // The highest frequency is kept, the lowest divided by the factor.
        let plain = QwenConfig {
            rope_scaling: None,
            ..l3.clone()
        }
        .rope_inv_freq();
        assert_eq!(inv[0], plain[0]);
        assert!((inv[3] * 32.0 - plain[3]).abs() < 1e-9);
        assert_eq!(
            parse(l3.to_json(DType::F32)).unwrap().rope_scaling,
            l3.rope_scaling
        );

        let with = |k: &str, v: Value| {
            let mut b = base.clone();
            b[k] = v;
            parse(b).unwrap_err().to_string()
        };
        assert!(with("mlp_bias", json!(true)).contains("mlp_bias"));
        assert!(with("pretraining_tp", json!(2)).contains("pretraining_tp"));
        assert!(with("partial_rotary_factor", json!(0.5)).contains("partial_rotary_factor"));
        assert!(
            with(
                "rope_scaling",
                json!({"rope_type": "llama3", "factor": 8.0})
            )
            .contains("rope_scaling.low_freq_factor")
        );

        // Mistral: a window shorter than the context is refused, a null one is full attention.
        let mistral = json!({"model_type": "mistral", "vocab_size": 10, "hidden_size": 16,
            "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 2,
            "max_position_embeddings": 32768, "sliding_window": 4096});
        assert!(
            parse(mistral.clone())
                .unwrap_err()
                .to_string()
                .contains("sliding_window")
        );
        let mut ok = mistral;
        ok["sliding_window"] = Value::Null;
        let m = parse(ok).unwrap();
        assert_eq!(m.arch, Arch::Mistral);
        assert_eq!(
            m.to_json(DType::F32)["architectures"][0],
            "MistralForCausalLM"
        );
    }

    #[test]
    fn fresh_config_round_trips() {
        let cfg = QwenConfig::tiny_qwen3(300);
        let back = parse(cfg.to_json(DType::F32)).unwrap();
        assert_eq!(QwenConfig { raw: None, ..back }, cfg);
    }
}
