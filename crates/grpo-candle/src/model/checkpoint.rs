//! A model with its tokenizer and chat template: loaded from a local folder or the hub, created
//! fresh (tiny, seeded) for the embedded default, and saved in Hugging Face format.

use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde_json::{Value, json};
use tokenizers::Tokenizer;

use crate::error::{Error, Result};
use crate::model::Qwen;
use crate::model::chat_template::{CHATML_JINJA, ChatTemplate};
use crate::model::config::QwenConfig;
use crate::model::loading::{ModelFiles, write_atomic};
use crate::model::tokenizer::{self, END_OF_TEXT, IM_END};

/// A policy's model, tokenizer, chat template and stop tokens.
#[derive(Clone)]
pub struct PolicyModel {
    /// The decoder (its weights live in a shared `VarMap`).
    pub model: Qwen,
    /// The tokenizer from `tokenizer.json` (or built in code).
    pub tokenizer: Tokenizer,
    /// How conversations are rendered.
    pub template: ChatTemplate,
    /// Ids that end a turn: `<|im_end|>`, `<|endoftext|>` and the config's eos ids.
    pub stop_token_ids: Vec<u32>,
    /// `tokenizer_config.json` as loaded (written back on save).
    pub tokenizer_config: Option<Value>,
    /// `generation_config.json` as loaded (written back on save).
    pub generation_config: Option<Value>,
}

impl std::fmt::Debug for PolicyModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyModel")
            .field("model", &self.model)
            .field("vocab", &self.tokenizer.get_vocab_size(true))
            .field("template", &self.template)
            .field("stop_token_ids", &self.stop_token_ids)
            .finish()
    }
}

/// The shape of a fresh tiny policy.
#[derive(Debug, Clone, PartialEq)]
pub struct TinySpec {
    /// Seed of the weights.
    pub seed: u64,
    /// BPE merges of the built-in tokenizer.
    pub num_merges: usize,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Decoder layers.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads.
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Width of the MLP.
    pub intermediate_size: usize,
    /// Longest sequence.
    pub max_position_embeddings: usize,
    /// Whether lm_head shares the embedding.
    pub tie_word_embeddings: bool,
}

impl Default for TinySpec {
    fn default() -> Self {
        TinySpec {
            seed: 0,
            num_merges: 256,
            hidden_size: 64,
            num_layers: 2,
            num_heads: 4,
            num_kv_heads: 2,
            head_dim: 16,
            intermediate_size: 128,
            max_position_embeddings: 8192,
            tie_word_embeddings: true,
        }
    }
}

fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text)
        .map_err(|e| Error::config(path, "(document)", format!("not valid JSON: {e}")))
}

/// The stop ids of a `generation_config.json`'s `eos_token_id` (an id or a list of ids);
/// values that are not token ids are skipped ([`check_eos_ids`] refuses them in files).
fn eos_ids(value: Option<&Value>) -> Vec<u32> {
    let id = |v: &Value| v.as_u64().and_then(|v| u32::try_from(v).ok());
    match value {
        Some(Value::Number(_)) => value.and_then(id).into_iter().collect(),
        Some(Value::Array(items)) => items.iter().filter_map(id).collect(),
        _ => Vec::new(),
    }
}

/// `eos_token_id` of a `generation_config.json` at `path` must be null, a token id or a list
/// of token ids.
fn check_eos_ids(generation_config: &Value, path: &Path) -> Result<()> {
    let is_id = |v: &Value| v.as_u64().is_some_and(|v| u32::try_from(v).is_ok());
    let fine = match generation_config.get("eos_token_id") {
        None | Some(Value::Null) => true,
        Some(Value::Array(items)) => items.iter().all(is_id),
        Some(v) => is_id(v),
    };
    if fine {
        Ok(())
    } else {
        Err(Error::config(
            path,
            "eos_token_id",
            "expected a token id (0 to 4294967295) or a list of them",
        ))
    }
}

impl PolicyModel {
    /// Load a checkpoint folder (`config.json`, `model.safetensors` or a sharded index,
    /// `tokenizer.json`).
    pub fn load_dir(dir: impl AsRef<Path>, dtype: DType, device: &Device) -> Result<Self> {
        Self::load(&ModelFiles::from_dir(dir)?, dtype, device)
    }

    /// Load from the hub (or only its cache when `offline`; see [`ModelFiles::from_hub`]).
    #[cfg(feature = "hub")]
    #[cfg_attr(docsrs, doc(cfg(feature = "hub")))]
    pub async fn load_hub(
        repo_id: &str,
        revision: Option<&str>,
        offline: bool,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let files = ModelFiles::from_hub(repo_id, revision, offline).await?;
        Self::load(&files, dtype, device)
    }

    /// Load from located files.
    pub fn load(files: &ModelFiles, dtype: DType, device: &Device) -> Result<Self> {
        let cfg = QwenConfig::from_file(&files.config)?;
        let model =
            Qwen::load_safetensors_for(&cfg, Some(&files.config), &files.weights, dtype, device)?;
        let tokenizer = tokenizer::load_tokenizer(&files.tokenizer)?;
        tokenizer::check_vocab_fits(&tokenizer, cfg.vocab_size, &files.tokenizer)?;
        let tokenizer_config = files
            .tokenizer_config
            .as_deref()
            .map(read_json)
            .transpose()?;
        let generation_config = match files.generation_config.as_deref() {
            Some(path) => {
                let value = read_json(path)?;
                check_eos_ids(&value, path)?;
                Some(value)
            }
            None => None,
        };
        Self::assemble(
            model,
            tokenizer,
            tokenizer_config,
            generation_config,
            &files.config,
        )
    }

    /// Put a loaded model and tokenizer together: the chat template from `tokenizer_config`'s
    /// `chat_template` (else from the model type), and the stop tokens (`<|im_end|>`,
    /// `<|endoftext|>` when the vocabulary has them, the config's and `generation_config`'s eos
    /// ids). `source` names the checkpoint in errors.
    pub fn assemble(
        model: Qwen,
        tokenizer: Tokenizer,
        tokenizer_config: Option<Value>,
        generation_config: Option<Value>,
        source: &Path,
    ) -> Result<Self> {
        let cfg = model.config();
        let tok_vocab = tokenizer.get_vocab_size(true);
        if tok_vocab > cfg.vocab_size {
            return Err(Error::config(
                source,
                "vocab_size",
                format!(
                    "{} is smaller than the tokenizer's {tok_vocab} tokens",
                    cfg.vocab_size
                ),
            ));
        }
        let chat = tokenizer_config
            .as_ref()
            .and_then(|c| c.get("chat_template"))
            .and_then(Value::as_str);
        let template = ChatTemplate::detect(chat, cfg.arch.model_type());
        if let Some(text) = chat
            && !ChatTemplate::is_chatml(text)
        {
            tracing::warn!(
                source = %source.display(),
                "the checkpoint's chat template is not ChatML; prompts are rendered as {template:?}, \
                 which the model may not have been trained on"
            );
        }
        let mut stop = Vec::new();
        for t in [IM_END, END_OF_TEXT] {
            stop.extend(tokenizer.token_to_id(t));
        }
        stop.extend(cfg.eos_token_ids.iter().copied());
        stop.extend(eos_ids(
            generation_config
                .as_ref()
                .and_then(|g| g.get("eos_token_id")),
        ));
        stop.sort_unstable();
        stop.dedup();
        Ok(PolicyModel {
            model,
            tokenizer,
            template,
            stop_token_ids: stop,
            tokenizer_config,
            generation_config,
        })
    }

    /// A fresh, randomly initialised tiny Qwen3 policy with the built-in byte-level BPE tokenizer
    /// and the plain ChatML template: everything from `spec`, nothing from disk or network.
    pub fn tiny(spec: &TinySpec, dtype: DType, device: &Device) -> Result<Self> {
        let tokenizer = tokenizer::tiny_tokenizer(spec.num_merges)?;
        Self::tiny_with_tokenizer(spec, tokenizer, dtype, device)
    }

    /// A freshly initialised Qwen3 of `spec`'s shape over `tokenizer` (which must have the
    /// ChatML specials; `spec.num_merges` is ignored): the vocabulary is the tokenizer's,
    /// rounded up to a multiple of 64, and `<|im_end|>` / `<|endoftext|>` stop generation.
    pub fn tiny_with_tokenizer(
        spec: &TinySpec,
        tokenizer: Tokenizer,
        dtype: DType,
        device: &Device,
    ) -> Result<Self> {
        let n = tokenizer.get_vocab_size(true);
        let im_end = tokenizer::token_id(&tokenizer, IM_END)?;
        let eot = tokenizer::token_id(&tokenizer, END_OF_TEXT)?;
        let mut cfg = QwenConfig::tiny_qwen3(n.div_ceil(64) * 64);
        cfg.hidden_size = spec.hidden_size;
        cfg.num_hidden_layers = spec.num_layers;
        cfg.num_attention_heads = spec.num_heads;
        cfg.num_key_value_heads = spec.num_kv_heads;
        cfg.head_dim = spec.head_dim;
        cfg.intermediate_size = spec.intermediate_size;
        cfg.max_position_embeddings = spec.max_position_embeddings;
        cfg.tie_word_embeddings = spec.tie_word_embeddings;
        let mut stop = vec![im_end, eot];
        stop.sort_unstable();
        cfg.eos_token_ids = stop.clone();
        let model = Qwen::new_random(&cfg, spec.seed, dtype, device)?;
        Ok(PolicyModel {
            model,
            tokenizer,
            template: ChatTemplate::ChatMl,
            stop_token_ids: stop,
            tokenizer_config: None,
            generation_config: None,
        })
    }

    /// Save in Hugging Face format in the model's dtype; see [`PolicyModel::save_hf_as`].
    pub fn save_hf(&self, dir: impl AsRef<Path>) -> Result<()> {
        self.save_hf_as(dir, self.model.dtype())
    }

    /// Save `model.safetensors`, `config.json`, `tokenizer.json`, `tokenizer_config.json` and
    /// `generation_config.json` into `dir` (created if needed), weights converted to `dtype`.
    /// Each file is written atomically (temporary file + rename); `transformers`
    /// (`AutoModelForCausalLM.from_pretrained`, `AutoTokenizer`) and vLLM load the folder as is.
    pub fn save_hf_as(&self, dir: impl AsRef<Path>, dtype: DType) -> Result<()> {
        let dir = dir.as_ref();
        std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
        save_weights(&self.model, &dir.join("model.safetensors"), dtype)?;
        let tok = self
            .tokenizer
            .to_string(false)
            .map_err(|e| Error::Tokenizer(format!("cannot serialise: {e}")))?;
        write_atomic(&dir.join("tokenizer.json"), tok.as_bytes())?;
        let tok_cfg = self
            .tokenizer_config
            .clone()
            .unwrap_or_else(|| self.default_tokenizer_config());
        write_json(&dir.join("tokenizer_config.json"), &tok_cfg)?;
        let gen_cfg = self.generation_config.clone().unwrap_or_else(|| {
            let mut g = json!({"eos_token_id": self.stop_token_ids});
            if let Some(pad) = self.tokenizer.token_to_id(END_OF_TEXT) {
                g["pad_token_id"] = json!(pad);
            }
            g
        });
        write_json(&dir.join("generation_config.json"), &gen_cfg)?;
        let cfg = self.model.config().to_json(dtype);
        write_json(&dir.join("config.json"), &cfg)
    }

    fn default_tokenizer_config(&self) -> Value {
        let mut added = serde_json::Map::new();
        let mut decoder: Vec<_> = self
            .tokenizer
            .get_added_tokens_decoder()
            .into_iter()
            .collect();
        decoder.sort_by_key(|(id, _)| *id);
        for (id, t) in decoder {
            added.insert(
                id.to_string(),
                json!({"content": t.content, "lstrip": t.lstrip, "normalized": t.normalized,
                       "rstrip": t.rstrip, "single_word": t.single_word, "special": t.special}),
            );
        }
        json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "added_tokens_decoder": added,
            "bos_token": null,
            "eos_token": IM_END,
            "pad_token": END_OF_TEXT,
            "add_bos_token": false,
            "add_prefix_space": false,
            "clean_up_tokenization_spaces": false,
            "split_special_tokens": false,
            "model_max_length": self.model.config().max_position_embeddings,
            "chat_template": match self.template {
                ChatTemplate::ChatMl => Value::String(CHATML_JINJA.to_string()),
                _ => Value::Null,
            },
        })
    }
}

fn write_json(path: &Path, value: &Value) -> Result<()> {
    let mut text = serde_json::to_string_pretty(value).map_err(|e| Error::Msg(e.to_string()))?;
    text.push('\n');
    write_atomic(path, text.as_bytes())
}

/// Write the model's weights (HF names; a tied lm_head is not stored, as transformers does) to one
/// safetensors file, atomically, with `{"format": "pt"}` metadata.
pub fn save_weights(model: &Qwen, path: &Path, dtype: DType) -> Result<()> {
    let mut tensors: Vec<(String, Tensor)> = Vec::new();
    for (name, var) in model.named_vars() {
        let t = var.as_tensor().to_device(&Device::Cpu)?;
        let t = if t.dtype() == dtype {
            t.copy()?
        } else {
            t.to_dtype(dtype)?
        };
        tensors.push((name, t));
    }
    let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    let bytes =
        safetensors::tensor::serialize(tensors.iter().map(|(n, t)| (n.as_str(), t)), Some(meta))
            .map_err(|e| Error::Weights {
                path: PathBuf::from(path),
                name: "(file)".into(),
                message: e.to_string(),
            })?;
    write_atomic(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_policy_saves_and_loads_identically() {
        let spec = TinySpec {
            num_merges: 32,
            hidden_size: 32,
            intermediate_size: 48,
            head_dim: 8,
            ..TinySpec::default()
        };
        let pm = PolicyModel::tiny(&spec, DType::F32, &Device::Cpu).unwrap();
        let dir = tempfile::tempdir().unwrap();
        pm.save_hf(dir.path()).unwrap();
        for f in [
            "model.safetensors",
            "config.json",
            "tokenizer.json",
            "tokenizer_config.json",
            "generation_config.json",
        ] {
            assert!(dir.path().join(f).is_file(), "{f}");
        }
        let back = PolicyModel::load_dir(dir.path(), DType::F32, &Device::Cpu).unwrap();
        assert_eq!(back.template, ChatTemplate::ChatMl);
        assert_eq!(back.stop_token_ids, pm.stop_token_ids);
        assert_eq!(back.model.config().vocab_size, pm.model.config().vocab_size);
        let ids = Tensor::new(&[[1u32, 2, 3, 300]], &Device::Cpu).unwrap();
        let a = pm.model.forward_logits(&ids).unwrap();
        let b = back.model.forward_logits(&ids).unwrap();
        let diff: f32 = (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .max_all()
            .unwrap()
            .to_scalar()
            .unwrap();
        assert_eq!(diff, 0.0);
        // Tied: no lm_head.weight in the file.
        let bytes = std::fs::read(dir.path().join("model.safetensors")).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        assert!(st.names().iter().all(|n| *n != "lm_head.weight"));
        // Saving again over the folder works (atomic replace), and bf16 halves the file.
        pm.save_hf_as(dir.path(), DType::BF16).unwrap();
        let half = std::fs::metadata(dir.path().join("model.safetensors"))
            .unwrap()
            .len();
        assert!((half as usize) < bytes.len() * 6 / 10);
        let cfg: Value = read_json(&dir.path().join("config.json")).unwrap();
        assert_eq!(cfg["torch_dtype"], json!("bfloat16"));
        assert_eq!(cfg["architectures"], json!(["Qwen3ForCausalLM"]));
    }

    #[test]
    fn tiny_policy_is_seeded() {
        let spec = TinySpec {
            num_merges: 8,
            hidden_size: 16,
            intermediate_size: 16,
            head_dim: 4,
            ..TinySpec::default()
        };
        let a = PolicyModel::tiny(&spec, DType::F32, &Device::Cpu).unwrap();
        let b = PolicyModel::tiny(&spec, DType::F32, &Device::Cpu).unwrap();
        let c = PolicyModel::tiny(&TinySpec { seed: 1, ..spec }, DType::F32, &Device::Cpu).unwrap();
        let w = |p: &PolicyModel| -> Vec<f32> {
            p.model
                .embedding_weight()
                .flatten_all()
                .unwrap()
                .to_vec1()
                .unwrap()
        };
        assert_eq!(w(&a), w(&b));
        assert_ne!(w(&a), w(&c));
    }
}
