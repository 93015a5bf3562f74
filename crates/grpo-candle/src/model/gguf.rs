//! Importing GGUF files (llama.cpp's format) as Hugging Face checkpoints.
//!
//! A GGUF file holds quantised weights under llama.cpp's tensor names, the hyper-parameters as
//! metadata (`llama.block_count`, ...) and the tokenizer as metadata too (`tokenizer.ggml.*`: the
//! tokens, their types, the BPE merges, the special ids and the pre-tokenizer's name). Importing
//! one:
//!
//! 1. reads it with candle's GGUF reader and dequantises every tensor to f32 (candle's
//!    dequantisation of each llama.cpp block format);
//! 2. renames the tensors to the Hugging Face names (`blk.0.attn_q.weight` ->
//!    `model.layers.0.self_attn.q_proj.weight`, ...);
//! 3. undoes the reordering of the query and key rows that llama.cpp's converter applies to Llama
//!    models (it interleaves the two rotary halves of each head for its own rotary kernel;
//!    Qwen2/Qwen3 files are written unpermuted);
//! 4. builds `tokenizer.json` from the tokenizer metadata: byte-level BPE (`tokenizer.ggml.model
//!    = "gpt2"`) with the pre-tokenizer that `tokenizer.ggml.pre` names, control tokens as special
//!    added tokens and user-defined ones as plain added tokens;
//! 5. writes a Hugging Face folder (`config.json`, `generation_config.json`, `model.safetensors`,
//!    `tokenizer.json`, `tokenizer_config.json` with the chat template when the file has one) that
//!    [`PolicyModel::load_dir`], transformers and vLLM load.
//!
//! Supported: architectures `llama`, `qwen2` and `qwen3` (dense); every tensor type candle's reader
//! knows (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q8_1, Q2_K..Q6_K, Q8_K). Anything else (another
//! architecture, an `IQ*` type, mixture-of-experts, rope scaling, a SentencePiece tokenizer, an
//! unknown pre-tokenizer) is an error naming the file and what it found.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value as Gv};
use candle_core::{DType, Device, Tensor};
use serde_json::{Value, json};
use tokenizers::Tokenizer;

use crate::error::{Error, Result};
use crate::model::Qwen;
use crate::model::checkpoint::PolicyModel;
use crate::model::config::{Arch, QwenConfig};
use crate::model::tokenizer::byte_to_char;

/// A GGUF file read into memory: everything needed to build a [`PolicyModel`] or write a
/// Hugging Face folder.
#[derive(Debug)]
pub struct GgufImport {
    /// The file it came from.
    pub source: PathBuf,
    /// The hyper-parameters, as a `config.json` would give them.
    pub config: QwenConfig,
    /// Every weight under its Hugging Face name, dequantised to f32 on the CPU, q/k rows in
    /// Hugging Face order.
    pub tensors: HashMap<String, Tensor>,
    /// The tokenizer built from the metadata.
    pub tokenizer: Tokenizer,
    /// `tokenizer_config.json` (special tokens, `add_bos_token`, the chat template).
    pub tokenizer_config: Value,
    /// `generation_config.json` (bos / eos / pad ids).
    pub generation_config: Value,
    /// How many tensors the file stored in each GGML type (`"Q4_1"`, `"F32"`, ...).
    pub tensor_types: BTreeMap<String, usize>,
}

/// What [`import_gguf`] wrote.
#[derive(Debug, Clone, PartialEq)]
pub struct ImportSummary {
    /// The family of the decoder.
    pub arch: Arch,
    /// Parameters (a tied embedding counted once).
    pub parameters: usize,
    /// Tokens of the tokenizer.
    pub vocab_size: usize,
    /// Tensors per GGML type in the source file.
    pub tensor_types: BTreeMap<String, usize>,
    /// Whether the file carried a chat template (written to `tokenizer_config.json`).
    pub chat_template: bool,
    /// The dtype the weights were written in.
    pub dtype: DType,
}

/// Read `gguf` and write it as a Hugging Face checkpoint folder `out` (created if needed), the
/// weights in `dtype` (f32, bf16 or f16).
pub fn import_gguf(gguf: &Path, out: &Path, dtype: DType) -> Result<ImportSummary> {
    let import = GgufImport::read(gguf)?;
    let summary = ImportSummary {
        arch: import.config.arch,
        parameters: import.config.num_parameters(),
        vocab_size: import.tokenizer.get_vocab_size(true),
        tensor_types: import.tensor_types.clone(),
        chat_template: import.tokenizer_config.get("chat_template").is_some(),
        dtype,
    };
    // Built in f32 whatever the output dtype: `save_hf_as` converts while writing.
    let policy = import.into_policy(DType::F32, &Device::Cpu)?;
    policy.save_hf_as(out, dtype)?;
    Ok(summary)
}

impl PolicyModel {
    /// Load a GGUF file directly (dequantised to `dtype` on `device`); see [`crate::model::gguf`].
    pub fn load_gguf(path: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<Self> {
        GgufImport::read(path.as_ref())?.into_policy(dtype, device)
    }
}

/// llama.cpp's names of its tensor types, by number (`ggml.h`'s `ggml_type`), for errors about
/// types candle cannot read.
fn ggml_type_name(id: u32) -> &'static str {
    const NAMES: [&str; 40] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
    ];
    NAMES.get(id as usize).copied().unwrap_or("unknown")
}

const SUPPORTED_ARCHS: &str = "\"llama\", \"qwen2\" or \"qwen3\"";

/// The metadata of one file, with accessors whose errors name the file and the key.
struct Meta<'a> {
    source: &'a Path,
    map: &'a HashMap<String, Gv>,
}

impl Meta<'_> {
    fn err(&self, key: &str, message: impl Into<String>) -> Error {
        Error::config(self.source, key, message)
    }

    fn get(&self, key: &str) -> Option<&Gv> {
        self.map.get(key)
    }

    fn uint(&self, key: &str) -> Result<Option<u64>> {
        let Some(v) = self.get(key) else {
            return Ok(None);
        };
        let n = match v {
            Gv::U8(x) => Some(*x as u64),
            Gv::U16(x) => Some(*x as u64),
            Gv::U32(x) => Some(*x as u64),
            Gv::U64(x) => Some(*x),
            Gv::I8(x) => u64::try_from(*x).ok(),
            Gv::I16(x) => u64::try_from(*x).ok(),
            Gv::I32(x) => u64::try_from(*x).ok(),
            Gv::I64(x) => u64::try_from(*x).ok(),
            Gv::Array(_) => {
                return Err(self.err(
                    key,
                    "a value per layer is not supported; expected one non-negative integer",
                ));
            }
            _ => None,
        };
        n.map(Some)
            .ok_or_else(|| self.err(key, format!("expected a non-negative integer, found {v:?}")))
    }

    fn need_uint(&self, key: &str) -> Result<usize> {
        self.uint(key)?
            .map(|n| n as usize)
            .ok_or_else(|| self.err(key, "missing; expected a non-negative integer"))
    }

    /// A float as the file wrote it; f32 values are read back in their shortest decimal form
    /// (`1e-5`, not `9.99999974e-6`), which is what the model's own config said.
    fn float(&self, key: &str) -> Result<Option<f64>> {
        match self.get(key) {
            None => Ok(None),
            Some(Gv::F32(x)) => Ok(Some(format!("{x}").parse().unwrap_or(*x as f64))),
            Some(Gv::F64(x)) => Ok(Some(*x)),
            Some(v) => Err(self.err(key, format!("expected a float, found {v:?}"))),
        }
    }

    fn string(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(Gv::String(s)) => Ok(Some(s)),
            Some(v) => Err(self.err(key, format!("expected a string, found {v:?}"))),
        }
    }

    fn bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Gv::Bool(b)) => Ok(Some(*b)),
            Some(v) => Err(self.err(key, format!("expected true or false, found {v:?}"))),
        }
    }

    fn strings(&self, key: &str) -> Result<Option<Vec<&str>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Gv::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Gv::String(s) => Ok(s.as_str()),
                    other => Err(self.err(
                        &format!("{key}[{i}]"),
                        format!("expected a string, found {other:?}"),
                    )),
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => Err(self.err(key, format!("expected an array of strings, found {v:?}"))),
        }
    }

    fn ints(&self, key: &str) -> Result<Option<Vec<i64>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Gv::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Gv::I32(x) => Ok(*x as i64),
                    Gv::U32(x) => Ok(*x as i64),
                    Gv::I8(x) => Ok(*x as i64),
                    Gv::U8(x) => Ok(*x as i64),
                    Gv::I16(x) => Ok(*x as i64),
                    Gv::U16(x) => Ok(*x as i64),
                    Gv::I64(x) => Ok(*x),
                    other => Err(self.err(
                        &format!("{key}[{i}]"),
                        format!("expected an integer, found {other:?}"),
                    )),
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(v) => Err(self.err(key, format!("expected an array of integers, found {v:?}"))),
        }
    }
}

impl GgufImport {
    /// Read and dequantise a GGUF file.
    pub fn read(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| Error::io(path, e))?;
        let file_len = file.metadata().map_err(|e| Error::io(path, e))?.len();
        let mut reader = BufReader::new(file);
        // candle's reader divides by the header's alignment unchecked (alignment 0 panics):
        // a panic inside it is a malformed file, not a crash.
        let content = guarded(path, "the header", || Content::read(&mut reader))?
            .map_err(|e| read_error(path, e))?;
        check_extents(path, &content, file_len)?;
        let meta = Meta {
            source: path,
            map: &content.metadata,
        };
        let arch_name = meta.string("general.architecture")?.ok_or_else(|| {
            meta.err(
                "general.architecture",
                format!("missing; expected {SUPPORTED_ARCHS}"),
            )
        })?;
        let arch = match arch_name {
            "llama" => Arch::Llama,
            "qwen2" => Arch::Qwen2,
            "qwen3" => Arch::Qwen3,
            other => {
                return Err(meta.err(
                    "general.architecture",
                    format!("architecture `{other}` is not supported; expected {SUPPORTED_ARCHS}"),
                ));
            }
        };
        let tensor_types = content
            .tensor_infos
            .values()
            .fold(BTreeMap::new(), |mut acc, info| {
                *acc.entry(format!("{:?}", info.ggml_dtype)).or_insert(0) += 1;
                acc
            });
        let config = read_config(&meta, arch_name, arch, &content)?;
        let mut tensors = HashMap::new();
        let mut names: Vec<&String> = content.tensor_infos.keys().collect();
        names.sort();
        for gguf_name in names {
            let hf_name = hf_tensor_name(gguf_name, config.num_hidden_layers).ok_or_else(|| {
                Error::Weights {
                    path: path.to_path_buf(),
                    name: gguf_name.clone(),
                    message: format!(
                        "a tensor this importer does not know (of a `{arch_name}` model); \
                         expected llama.cpp's names of a dense decoder"
                    ),
                }
            })?;
            let weights_error = |message: String| Error::Weights {
                path: path.to_path_buf(),
                name: gguf_name.clone(),
                message,
            };
            let q = guarded(path, gguf_name, || {
                content.tensor(&mut reader, gguf_name, &Device::Cpu)
            })?
            .map_err(|e| weights_error(format!("cannot read: {e}")))?;
            let mut t = guarded(path, gguf_name, || q.dequantize(&Device::Cpu))?
                .map_err(|e| weights_error(format!("cannot dequantise {:?}: {e}", q.dtype())))?;
            if arch == Arch::Llama {
                let heads = if hf_name.contains(".q_proj.") {
                    Some(config.num_attention_heads)
                } else if hf_name.contains(".k_proj.") {
                    Some(config.num_key_value_heads)
                } else {
                    None
                };
                if let Some(heads) = heads {
                    t = unpermute_rotary_rows(&t, heads)
                        .map_err(|e| weights_error(e.to_string()))?;
                }
            }
            tensors.insert(hf_name, t);
        }
        let (tokenizer, tokenizer_config, generation_config) = build_tokenizer(&meta, &config)?;
        let mut config = config;
        config.bos_token_id = generation_config
            .get("bos_token_id")
            .and_then(Value::as_u64)
            .map(|v| v as u32);
        config.eos_token_ids = generation_config
            .get("eos_token_id")
            .and_then(Value::as_u64)
            .map(|v| v as u32)
            .into_iter()
            .collect();
        Ok(GgufImport {
            source: path.to_path_buf(),
            config,
            tensors,
            tokenizer,
            tokenizer_config,
            generation_config,
            tensor_types,
        })
    }

    /// The model, converted to `dtype` on `device`, with its tokenizer, chat template and stop
    /// tokens.
    pub fn into_policy(self, dtype: DType, device: &Device) -> Result<PolicyModel> {
        let tensors = self
            .tensors
            .into_iter()
            .map(|(k, v)| Ok((k, v.to_device(device)?)))
            .collect::<Result<HashMap<_, _>>>()?;
        let model = Qwen::from_tensors(&self.config, tensors, &self.source, dtype, device)?;
        PolicyModel::assemble(
            model,
            self.tokenizer,
            Some(self.tokenizer_config),
            Some(self.generation_config),
            &self.source,
        )
    }
}

/// Run one step of candle's GGUF reader on `path`, turning a panic inside it (a division by a
/// zero alignment, say) into an error naming the file and what was being read.
fn guarded<T>(path: &Path, what: &str, step: impl FnOnce() -> T) -> Result<T> {
    crate::model::loading::guarded(path, "GGUF", what, step)
}

/// Every tensor's shape and data must fit the file before anything is read: no zero
/// dimension, an element count without overflow, whole quantisation blocks, and bytes that end
/// inside the file (so a hostile header cannot make the reader allocate more than the file
/// holds).
fn check_extents(path: &Path, content: &Content, file_len: u64) -> Result<()> {
    let bad = |name: &str, message: String| Error::Weights {
        path: path.to_path_buf(),
        name: name.to_string(),
        message,
    };
    for (name, info) in &content.tensor_infos {
        let dims = info.shape.dims();
        if dims.contains(&0) {
            return Err(bad(name, format!("shape {dims:?} has a zero dimension")));
        }
        let elements = dims
            .iter()
            .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
            .ok_or_else(|| bad(name, format!("shape {dims:?}: the element count overflows")))?;
        let block = info.ggml_dtype.block_size() as u64;
        if elements % block != 0 {
            return Err(bad(
                name,
                format!(
                    "shape {dims:?}: {elements} elements are not whole {:?} blocks of {block}",
                    info.ggml_dtype
                ),
            ));
        }
        let end = (elements / block)
            .checked_mul(info.ggml_dtype.type_size() as u64)
            .and_then(|bytes| bytes.checked_add(info.offset))
            .and_then(|end| end.checked_add(content.tensor_data_offset));
        match end {
            Some(end) if end <= file_len => {}
            _ => {
                return Err(bad(
                    name,
                    format!(
                        "shape {dims:?} at offset {} does not fit in the file ({file_len} bytes)",
                        info.offset
                    ),
                ));
            }
        }
    }
    Ok(())
}

/// Name the file in reader errors, and llama.cpp's name of a tensor type candle cannot read.
fn read_error(path: &Path, e: candle_core::Error) -> Error {
    let text = e.to_string();
    // candle appends a backtrace to the message when RUST_BACKTRACE is set: read the first word.
    if let Some(id) = text
        .strip_prefix("unknown dtype for tensor ")
        .and_then(|n| n.split_whitespace().next())
        .and_then(|n| n.parse::<u32>().ok())
    {
        return Error::config(
            path,
            "(tensor type)",
            format!(
                "tensor type {id} ({}) is not supported; supported: F32, F16, BF16, Q4_0, Q4_1, \
                 Q5_0, Q5_1, Q8_0, Q8_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q8_K",
                ggml_type_name(id)
            ),
        );
    }
    Error::config(path, "(file)", format!("not a readable GGUF file: {text}"))
}

/// The Hugging Face name of a llama.cpp tensor of a dense decoder with `layers` layers.
fn hf_tensor_name(name: &str, layers: usize) -> Option<String> {
    let fixed = match name {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = name.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    if layer >= layers {
        return None;
    }
    let (part, kind) = tail.rsplit_once('.')?;
    if kind != "weight" && kind != "bias" {
        return None;
    }
    let hf = match (part, kind) {
        ("attn_norm", "weight") => "input_layernorm",
        ("ffn_norm", "weight") => "post_attention_layernorm",
        ("attn_q", _) => "self_attn.q_proj",
        ("attn_k", _) => "self_attn.k_proj",
        ("attn_v", _) => "self_attn.v_proj",
        ("attn_output", _) => "self_attn.o_proj",
        ("attn_q_norm", "weight") => "self_attn.q_norm",
        ("attn_k_norm", "weight") => "self_attn.k_norm",
        ("ffn_gate", "weight") => "mlp.gate_proj",
        ("ffn_up", "weight") => "mlp.up_proj",
        ("ffn_down", "weight") => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

/// Undo llama.cpp's reordering of the rows of a Llama query or key projection (weight
/// `[heads * d, in]` or bias `[heads * d]`).
///
/// Hugging Face Llama rotates the two halves of each head (`rotate_half`); llama.cpp's converter
/// interleaves them (row `2i` of a head is HF row `i`, row `2i + 1` is HF row `i + d/2`) so that
/// its kernel rotates adjacent pairs. Per head: view the rows as `[d/2, 2]` and transpose.
pub fn unpermute_rotary_rows(t: &Tensor, heads: usize) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let rows = dims[0];
    let rest: usize = dims[1..].iter().product();
    if heads == 0 || !rows.is_multiple_of(2 * heads) {
        return Err(Error::Msg(format!(
            "{rows} rows do not split into {heads} heads of an even width"
        )));
    }
    let half = rows / heads / 2;
    Ok(t.reshape((heads, half, 2, rest))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)?)
}

/// The inverse of [`unpermute_rotary_rows`]: llama.cpp's converter's permutation (for writing test
/// files the way llama.cpp does).
pub fn permute_rotary_rows(t: &Tensor, heads: usize) -> Result<Tensor> {
    let dims = t.dims().to_vec();
    let rows = dims[0];
    let rest: usize = dims[1..].iter().product();
    if heads == 0 || !rows.is_multiple_of(2 * heads) {
        return Err(Error::Msg(format!(
            "{rows} rows do not split into {heads} heads of an even width"
        )));
    }
    let half = rows / heads / 2;
    Ok(t.reshape((heads, 2, half, rest))?
        .transpose(1, 2)?
        .contiguous()?
        .reshape(dims)?)
}

fn read_config(meta: &Meta<'_>, prefix: &str, arch: Arch, content: &Content) -> Result<QwenConfig> {
    let key = |k: &str| format!("{prefix}.{k}");
    for k in ["expert_count", "expert_used_count"] {
        if meta.uint(&key(k))?.unwrap_or(0) > 0 {
            return Err(meta.err(
                &key(k),
                "mixture-of-experts models are not supported; only dense decoders",
            ));
        }
    }
    if let Some(kind) = meta.string(&key("rope.scaling.type"))?
        && kind != "none"
    {
        return Err(meta.err(
            &key("rope.scaling.type"),
            format!("rope scaling `{kind}` is not supported; expected none"),
        ));
    }
    if content.tensor_infos.contains_key("rope_freqs.weight") {
        return Err(Error::Weights {
            path: meta.source.to_path_buf(),
            name: "rope_freqs.weight".into(),
            message: "per-frequency rotary factors (Llama 3.1 scaling) are not imported: the \
                      file does not say which scaling parameters produced them"
                .into(),
        });
    }
    let hidden = meta.need_uint(&key("embedding_length"))?;
    let heads = meta.need_uint(&key("attention.head_count"))?;
    let kv_heads = meta
        .uint(&key("attention.head_count_kv"))?
        .map_or(heads, |n| n as usize);
    let head_dim = match meta.uint(&key("attention.key_length"))? {
        Some(d) => d as usize,
        None if heads > 0 => hidden / heads,
        None => 0,
    };
    if let Some(v) = meta.uint(&key("attention.value_length"))?
        && v as usize != head_dim
    {
        return Err(meta.err(
            &key("attention.value_length"),
            format!("{v} differs from the key width {head_dim}; expected them equal"),
        ));
    }
    if let Some(rot) = meta.uint(&key("rope.dimension_count"))?
        && rot as usize != head_dim
    {
        return Err(meta.err(
            &key("rope.dimension_count"),
            format!("rotary embedding on {rot} of {head_dim} dimensions is not supported; expected the whole head"),
        ));
    }
    let embed = content
        .tensor_infos
        .get("token_embd.weight")
        .ok_or_else(|| Error::Weights {
            path: meta.source.to_path_buf(),
            name: "token_embd.weight".into(),
            message: "missing from the file".into(),
        })?;
    let vocab_size = embed.shape.dims()[0];
    let has_bias = content.tensor_infos.contains_key("blk.0.attn_q.bias");
    let mut cfg = QwenConfig::tiny_qwen3(vocab_size);
    cfg.arch = arch;
    cfg.hidden_size = hidden;
    cfg.intermediate_size = meta.need_uint(&key("feed_forward_length"))?;
    cfg.num_hidden_layers = meta.need_uint(&key("block_count"))?;
    cfg.num_attention_heads = heads;
    cfg.num_key_value_heads = kv_heads;
    cfg.head_dim = head_dim;
    cfg.max_position_embeddings = meta
        .uint(&key("context_length"))?
        .map_or(cfg.max_position_embeddings, |n| n as usize);
    cfg.rms_norm_eps = meta
        .float(&key("attention.layer_norm_rms_epsilon"))?
        .unwrap_or(1e-6);
    cfg.rope_theta = meta.float(&key("rope.freq_base"))?.unwrap_or(10_000.0);
    cfg.tie_word_embeddings = !content.tensor_infos.contains_key("output.weight");
    cfg.attention_bias = match arch {
        Arch::Qwen2 => true,
        _ => has_bias,
    };
    cfg.torch_dtype = None;
    cfg.validate(meta.source)?;
    if arch == Arch::Qwen2 && !has_bias {
        return Err(Error::Weights {
            path: meta.source.to_path_buf(),
            name: "blk.0.attn_q.bias".into(),
            message: "missing: a qwen2 decoder has q/k/v biases".into(),
        });
    }
    Ok(cfg)
}

/// llama.cpp's token types (`llama_token_type`).
const TOKEN_CONTROL: i64 = 3;
const TOKEN_USER_DEFINED: i64 = 4;

/// The regexes of Hugging Face's tokenizers for the pre-tokenizers llama.cpp names: the split
/// before byte-level BPE, as in the models' own `tokenizer.json`.
const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The `pre_tokenizer` of `tokenizer.json` for llama.cpp's pre-tokenizer name, or `None` for one
/// this importer does not know.
fn pre_tokenizer(pre: &str) -> Option<Value> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |regex: &str| {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": false},
            byte_level(false),
        ]})
    };
    Some(match pre {
        // GPT-2's split (the ByteLevel pre-tokenizer's own regex).
        "default" | "gpt2" | "gpt-2" | "mpt" | "olmo" => byte_level(true),
        // Each digit apart, then GPT-2's split (llama.cpp: `\p{N}` before the GPT-2 regex).
        "smollm" | "starcoder" | "refact" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true},
            byte_level(true),
        ]}),
        "llama3" | "llama-v3" | "llama-bpe" => split(LLAMA3_SPLIT),
        "qwen2" => split(QWEN2_SPLIT),
        _ => return None,
    })
}

/// `tokenizer.json`, `tokenizer_config.json` and `generation_config.json` from the tokenizer
/// metadata.
fn build_tokenizer(meta: &Meta<'_>, cfg: &QwenConfig) -> Result<(Tokenizer, Value, Value)> {
    let model = meta.string("tokenizer.ggml.model")?.ok_or_else(|| {
        meta.err(
            "tokenizer.ggml.model",
            "missing; expected \"gpt2\" (byte-level BPE)",
        )
    })?;
    if model != "gpt2" {
        return Err(meta.err(
            "tokenizer.ggml.model",
            format!(
                "tokenizer `{model}` is not supported; expected \"gpt2\" (byte-level BPE; \
                 SentencePiece vocabularies are not imported)"
            ),
        ));
    }
    let pre_name = meta.string("tokenizer.ggml.pre")?.unwrap_or("default");
    let pre = pre_tokenizer(pre_name).ok_or_else(|| {
        meta.err(
            "tokenizer.ggml.pre",
            format!(
                "pre-tokenizer `{pre_name}` is not supported; expected default, gpt2, smollm, \
                 starcoder, refact, llama3, llama-bpe or qwen2"
            ),
        )
    })?;
    let tokens = meta
        .strings("tokenizer.ggml.tokens")?
        .ok_or_else(|| meta.err("tokenizer.ggml.tokens", "missing; expected the vocabulary"))?;
    let types = meta
        .ints("tokenizer.ggml.token_type")?
        .unwrap_or_else(|| vec![1; tokens.len()]);
    if types.len() != tokens.len() {
        return Err(meta.err(
            "tokenizer.ggml.token_type",
            format!("{} entries for {} tokens", types.len(), tokens.len()),
        ));
    }
    if tokens.len() > cfg.vocab_size {
        return Err(meta.err(
            "tokenizer.ggml.tokens",
            format!(
                "{} tokens, more than the embedding's {} rows",
                tokens.len(),
                cfg.vocab_size
            ),
        ));
    }
    let merges = meta
        .strings("tokenizer.ggml.merges")?
        .ok_or_else(|| meta.err("tokenizer.ggml.merges", "missing; expected the BPE merges"))?;

    // Ordinary tokens are spelled in GPT-2's byte alphabet; one that is not (a mislabelled
    // added token) is respelled from its UTF-8 bytes, as transformers does.
    let alphabet = byte_to_char();
    let in_alphabet = |s: &str| s.chars().all(|c| alphabet.contains(&c));
    let mut vocab = serde_json::Map::new();
    let mut added = Vec::new();
    for (id, (token, kind)) in tokens.iter().zip(&types).enumerate() {
        let special = *kind == TOKEN_CONTROL;
        let user = *kind == TOKEN_USER_DEFINED;
        let spelled = if special || user || in_alphabet(token) {
            token.to_string()
        } else {
            token.bytes().map(|b| alphabet[b as usize]).collect()
        };
        if let Some(previous) = vocab.insert(spelled.clone(), json!(id)) {
            return Err(meta.err(
                "tokenizer.ggml.tokens",
                format!("token `{spelled}` appears twice (ids {previous} and {id})"),
            ));
        }
        if special || user {
            added.push(
                json!({"id": id, "content": token, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special}),
            );
        }
    }
    let merges = merges
        .iter()
        .enumerate()
        .map(|(i, m)| {
            m.split_once(' ')
                .map(|(a, b)| json!([a, b]))
                .ok_or_else(|| {
                    meta.err(
                        &format!("tokenizer.ggml.merges[{i}]"),
                        format!("`{m}`: expected two tokens separated by a space"),
                    )
                })
        })
        .collect::<Result<Vec<_>>>()?;
    let id_of = |key: &str| -> Result<Option<u32>> {
        match meta.uint(key)? {
            None => Ok(None),
            Some(id) if (id as usize) < tokens.len() => Ok(Some(id as u32)),
            Some(id) => Err(meta.err(
                key,
                format!(
                    "{id} is not a token id (the vocabulary has {})",
                    tokens.len()
                ),
            )),
        }
    };
    let bos = id_of("tokenizer.ggml.bos_token_id")?;
    let eos = id_of("tokenizer.ggml.eos_token_id")?;
    let unk = id_of("tokenizer.ggml.unknown_token_id")?;
    let pad = id_of("tokenizer.ggml.padding_token_id")?;
    let add_bos = meta.bool("tokenizer.ggml.add_bos_token")?.unwrap_or(false);
    let add_eos = meta.bool("tokenizer.ggml.add_eos_token")?.unwrap_or(false);
    let name = |id: Option<u32>| id.map(|i| tokens[i as usize].to_string());

    // BOS/EOS added by the post-processor when the file asks for it (llama.cpp's add_bos_token).
    for (flag, id, key) in [
        (add_bos, bos, "tokenizer.ggml.add_bos_token"),
        (add_eos, eos, "tokenizer.ggml.add_eos_token"),
    ] {
        if flag && id.is_none() {
            return Err(meta.err(key, "true, but the file names no such token id"));
        }
    }
    let post_processor = if add_bos || add_eos {
        let mut single = Vec::new();
        let mut pair = Vec::new();
        let mut specials = serde_json::Map::new();
        for (flag, id) in [(add_bos, bos), (add_eos, eos)] {
            if let (true, Some(id)) = (flag, id) {
                let t = tokens[id as usize];
                specials.insert(t.into(), json!({"id": t, "ids": [id], "tokens": [t]}));
            }
        }
        if let (true, Some(id)) = (add_bos, bos) {
            let t = tokens[id as usize];
            single.push(json!({"SpecialToken": {"id": t, "type_id": 0}}));
            pair.push(json!({"SpecialToken": {"id": t, "type_id": 0}}));
        }
        single.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
        pair.push(json!({"Sequence": {"id": "A", "type_id": 0}}));
        pair.push(json!({"Sequence": {"id": "B", "type_id": 1}}));
        if let (true, Some(id)) = (add_eos, eos) {
            let t = tokens[id as usize];
            single.push(json!({"SpecialToken": {"id": t, "type_id": 0}}));
            pair.push(json!({"SpecialToken": {"id": t, "type_id": 1}}));
        }
        json!({"type": "TemplateProcessing", "single": single, "pair": pair, "special_tokens": specials})
    } else {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": true})
    };
    let doc = json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre,
        "post_processor": post_processor,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": name(unk), "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    });
    let tokenizer = Tokenizer::from_bytes(doc.to_string().as_bytes()).map_err(|e| {
        meta.err(
            "tokenizer.ggml.tokens",
            format!("cannot build a tokenizer: {e}"),
        )
    })?;

    let mut decoder = serde_json::Map::new();
    for a in &added {
        decoder.insert(
            a["id"].to_string(),
            json!({"content": a["content"], "lstrip": false, "normalized": false, "rstrip": false,
                   "single_word": false, "special": a["special"]}),
        );
    }
    let mut tok_cfg = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "added_tokens_decoder": decoder,
        "bos_token": name(bos),
        "eos_token": name(eos),
        "unk_token": name(unk),
        "pad_token": name(pad),
        "add_bos_token": add_bos,
        "add_eos_token": add_eos,
        "add_prefix_space": false,
        "clean_up_tokenization_spaces": false,
        "model_max_length": cfg.max_position_embeddings,
    });
    if let Some(template) = meta.string("tokenizer.chat_template")? {
        tok_cfg["chat_template"] = json!(template);
    }
    let mut gen_cfg = serde_json::Map::new();
    for (k, id) in [
        ("bos_token_id", bos),
        ("eos_token_id", eos),
        ("pad_token_id", pad),
    ] {
        if let Some(id) = id {
            gen_cfg.insert(k.into(), json!(id));
        }
    }
    Ok((tokenizer, tok_cfg, Value::Object(gen_cfg)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotary_row_permutation_round_trips_and_interleaves() {
        // Two heads of width 4: HF rows [h0: 0 1 2 3 | h1: 4 5 6 7]; llama.cpp interleaves the
        // halves of each head: [0 2 1 3 | 4 6 5 7].
        let hf = Tensor::arange(0f32, 8.0, &Device::Cpu)
            .unwrap()
            .reshape((8, 1))
            .unwrap();
        let gguf = permute_rotary_rows(&hf, 2).unwrap();
        let rows: Vec<f32> = gguf.flatten_all().unwrap().to_vec1().unwrap();
        assert_eq!(rows, [0.0, 2.0, 1.0, 3.0, 4.0, 6.0, 5.0, 7.0]);
        let back = unpermute_rotary_rows(&gguf, 2).unwrap();
        assert_eq!(
            back.flatten_all().unwrap().to_vec1::<f32>().unwrap(),
            hf.flatten_all().unwrap().to_vec1::<f32>().unwrap()
        );
        // Biases (1-D) too.
        let bias = Tensor::arange(0f32, 8.0, &Device::Cpu).unwrap();
        assert_eq!(
            unpermute_rotary_rows(&permute_rotary_rows(&bias, 2).unwrap(), 2)
                .unwrap()
                .dims(),
            &[8]
        );
        assert!(unpermute_rotary_rows(&hf, 3).is_err());
    }

    #[test]
    fn tensor_names_map_to_hugging_face() {
        assert_eq!(
            hf_tensor_name("blk.3.attn_q.weight", 4).unwrap(),
            "model.layers.3.self_attn.q_proj.weight"
        );
        assert_eq!(
            hf_tensor_name("blk.0.attn_k.bias", 4).unwrap(),
            "model.layers.0.self_attn.k_proj.bias"
        );
        assert_eq!(
            hf_tensor_name("blk.1.ffn_norm.weight", 4).unwrap(),
            "model.layers.1.post_attention_layernorm.weight"
        );
        assert_eq!(
            hf_tensor_name("output.weight", 4).unwrap(),
            "lm_head.weight"
        );
        assert_eq!(hf_tensor_name("blk.4.attn_q.weight", 4), None);
        assert_eq!(hf_tensor_name("blk.0.ffn_gate_exps.weight", 4), None);
        assert_eq!(hf_tensor_name("rope_freqs.weight", 4), None);
    }

    #[test]
    fn known_pre_tokenizers_build() {
        for pre in ["default", "smollm", "llama-bpe", "qwen2"] {
            let doc = pre_tokenizer(pre).unwrap();
            let p: tokenizers::PreTokenizerWrapper = serde_json::from_value(doc).unwrap();
            let _ = p;
        }
        assert!(pre_tokenizer("deepseek-coder").is_none());
        assert_eq!(ggml_type_name(20), "IQ4_NL");
        assert_eq!(ggml_type_name(3), "Q4_1");
    }
}
