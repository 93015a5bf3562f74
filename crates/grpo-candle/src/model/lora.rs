//! PEFT LoRA adapters merged into a snapshot of the initial weights.
//!
//! A remote learner that trains a LoRA adapter (a Tinker-protocol server such as SkyRL's
//! skyrl-tx) hands its sampler weights back as a PEFT adapter folder: `adapter_config.json`
//! (`r`, `lora_alpha`, `use_rslora`, ...) and `adapter_model.safetensors`, whose
//! `base_model.model.<module>.lora_A.weight` is `[r, in]` and `lora_B.weight` is `[out, r]` for
//! a Linear `<module>` of the HF model (`model.layers.0.self_attn.q_proj`). The sampling policy
//! takes `W' = W + s · B A` for every targeted module, with `s = lora_alpha / r`, or
//! `lora_alpha / sqrt(r)` under rsLoRA.
//!
//! `W` is always the initial checkpoint's weight, kept in a [`BaseWeights`] snapshot, never the
//! weights the policy holds now: each adapter version is the whole delta from the initial
//! weights, so merging version 2 after version 1 must not add version 1's delta twice.
//!
//! Anything this merge would get wrong is refused, naming the file and the key or field: DoRA,
//! `modules_to_save`, per-module rank or alpha patterns, LoRA on the embedding or the lm_head
//! (the learner never trains the unembedding, and a tied lm_head is the embedding), an A without
//! its B, shapes that disagree with `r` or with the model's weight.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{DType, Device, Tensor};
use serde_json::Value;

use crate::error::{Error, Result};

/// The adapter's configuration file in a PEFT folder.
pub const ADAPTER_CONFIG: &str = "adapter_config.json";
/// The adapter's weights file in a PEFT folder.
pub const ADAPTER_WEIGHTS: &str = "adapter_model.safetensors";

const KEY_PREFIX: &str = "base_model.model.";

/// One targeted module's matrices, f32 on the CPU.
#[derive(Debug, Clone)]
struct LoraPair {
    /// `[r, in]`.
    a: Tensor,
    /// `[out, r]`.
    b: Tensor,
    /// The key `a` was read under, for errors.
    a_key: String,
    /// The key `b` was read under, for errors.
    b_key: String,
}

/// A PEFT LoRA adapter read from a folder (see the [module docs](self)).
#[derive(Debug, Clone)]
pub struct PeftAdapter {
    weights_path: PathBuf,
    rank: usize,
    scaling: f64,
    /// Module name (`model.layers.0.self_attn.q_proj`) to its matrices.
    modules: BTreeMap<String, LoraPair>,
}

impl PeftAdapter {
    /// Read `adapter_config.json` and `adapter_model.safetensors` from `dir`, checking that
    /// every module has an A of shape `[r, in]` and a B of shape `[out, r]`. Matrices stored in
    /// bf16 or f16 are converted to f32.
    pub fn load(dir: impl AsRef<Path>) -> Result<PeftAdapter> {
        let dir = dir.as_ref();
        let config_path = dir.join(ADAPTER_CONFIG);
        let config = AdapterConfig::read(&config_path)?;
        let weights_path = dir.join(ADAPTER_WEIGHTS);
        if !weights_path.is_file() {
            return Err(Error::io(
                &weights_path,
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    "missing from the PEFT adapter folder",
                ),
            ));
        }
        let tensors = crate::model::loading::load_all_tensors(&weights_path, &Device::Cpu)?;
        let modules = pair_up(&weights_path, tensors, config.rank)?;
        Ok(PeftAdapter {
            weights_path,
            rank: config.rank,
            scaling: config.scaling(),
            modules,
        })
    }

    /// The LoRA rank `r`.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// The factor of `B A` in the merge: `lora_alpha / r`, or `lora_alpha / sqrt(r)` with rsLoRA.
    pub fn scaling(&self) -> f64 {
        self.scaling
    }

    /// The targeted modules' names (`model.layers.0.mlp.down_proj`), sorted.
    pub fn modules(&self) -> Vec<String> {
        self.modules.keys().cloned().collect()
    }

    /// The adapter's weights file (named in errors).
    pub fn weights_path(&self) -> &Path {
        &self.weights_path
    }
}

/// What the merge needs from `adapter_config.json`.
struct AdapterConfig {
    rank: usize,
    alpha: f64,
    rslora: bool,
}

impl AdapterConfig {
    fn read(path: &Path) -> Result<AdapterConfig> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| Error::config(path, "(document)", format!("not valid JSON: {e}")))?;
        let obj = value
            .as_object()
            .ok_or_else(|| Error::config(path, "(document)", "expected a JSON object"))?;
        let field = |name: &str| obj.get(name).filter(|v| !v.is_null());
        let flag = |name: &str| -> Result<bool> {
            match field(name) {
                None => Ok(false),
                Some(v) => v
                    .as_bool()
                    .ok_or_else(|| Error::config(path, name, format!("{v}; expected a boolean"))),
            }
        };
        if let Some(kind) = field("peft_type")
            && kind.as_str() != Some("LORA")
        {
            return Err(Error::config(
                path,
                "peft_type",
                format!("{kind}; expected \"LORA\""),
            ));
        }
        let rank = match field("r") {
            None => {
                return Err(Error::config(
                    path,
                    "r",
                    "missing; expected a positive integer",
                ));
            }
            Some(v) => v.as_u64().filter(|&r| r > 0).ok_or_else(|| {
                Error::config(path, "r", format!("{v}; expected a positive integer"))
            })?,
        };
        let rank = usize::try_from(rank)
            .map_err(|_| Error::config(path, "r", format!("{rank}; too large")))?;
        let alpha = match field("lora_alpha") {
            None => {
                return Err(Error::config(
                    path,
                    "lora_alpha",
                    "missing; expected a finite number",
                ));
            }
            Some(v) => v.as_f64().filter(|a| a.is_finite()).ok_or_else(|| {
                Error::config(path, "lora_alpha", format!("{v}; expected a finite number"))
            })?,
        };
        let rslora = flag("use_rslora")?;
        if flag("use_dora")? {
            return Err(Error::config(
                path,
                "use_dora",
                "true; DoRA adapters cannot be merged as W + s·BA, expected false",
            ));
        }
        // Fields whose non-empty values change what the merge must do per module.
        for name in ["modules_to_save", "rank_pattern", "alpha_pattern"] {
            let empty = match field(name) {
                None => true,
                Some(Value::Array(items)) => items.is_empty(),
                Some(Value::Object(items)) => items.is_empty(),
                Some(_) => false,
            };
            if !empty {
                return Err(Error::config(
                    path,
                    name,
                    format!(
                        "{}; only plain LoRA deltas are merged, expected it empty or null",
                        field(name).expect("not empty")
                    ),
                ));
            }
        }
        Ok(AdapterConfig {
            rank,
            alpha,
            rslora,
        })
    }

    fn scaling(&self) -> f64 {
        if self.rslora {
            self.alpha / (self.rank as f64).sqrt()
        } else {
            self.alpha / self.rank as f64
        }
    }
}

/// Which matrix of a LoRA pair a key holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Half {
    A,
    B,
}

/// `base_model.model.<module>.lora_A[.<adapter>].weight` → (`<module>`, A).
fn parse_key(path: &Path, key: &str) -> Result<(String, Half)> {
    let bad = |message: String| Error::Weights {
        path: path.to_path_buf(),
        name: key.to_string(),
        message,
    };
    let expected = "expected `base_model.model.<module>.lora_A.weight` or `...lora_B.weight` \
                    (optionally with an adapter name before `.weight`)";
    if key.contains(".lora_embedding_A") || key.contains(".lora_embedding_B") {
        return Err(bad(format!(
            "a LoRA on an embedding; only Linear modules are merged, {expected}"
        )));
    }
    let rest = key
        .strip_prefix(KEY_PREFIX)
        .ok_or_else(|| bad(format!("not a LoRA matrix: {expected}")))?;
    let (module, half, tail) = if let Some((m, t)) = rest.rsplit_once(".lora_A.") {
        (m, Half::A, t)
    } else if let Some((m, t)) = rest.rsplit_once(".lora_B.") {
        (m, Half::B, t)
    } else {
        return Err(bad(format!("not a LoRA matrix: {expected}")));
    };
    let named_adapter = tail
        .strip_suffix(".weight")
        .is_some_and(|name| !name.is_empty() && !name.contains('.'));
    if module.is_empty() || !(tail == "weight" || named_adapter) {
        return Err(bad(format!("not a LoRA matrix: {expected}")));
    }
    let leaf = module.rsplit('.').next().unwrap_or(module);
    if leaf == "embed_tokens" || leaf == "lm_head" {
        return Err(bad(format!(
            "a LoRA on `{module}`; the embedding and the lm_head are never adapted (the learner \
             does not train the unembedding, and a tied lm_head is the embedding)"
        )));
    }
    Ok((module.to_string(), half))
}

/// Group the file's tensors into A/B pairs per module, checking ranks and dtypes.
fn pair_up(
    path: &Path,
    tensors: HashMap<String, Tensor>,
    rank: usize,
) -> Result<BTreeMap<String, LoraPair>> {
    // Sorted, so that the first offending key is reported whatever the file's order.
    let tensors: BTreeMap<String, Tensor> = tensors.into_iter().collect();
    if tensors.is_empty() {
        return Err(Error::Weights {
            path: path.to_path_buf(),
            name: "(header)".into(),
            message: "holds no tensors; expected LoRA A and B matrices".into(),
        });
    }
    let mut halves: BTreeMap<String, [Option<(String, Tensor)>; 2]> = BTreeMap::new();
    for (key, t) in tensors {
        let (module, half) = parse_key(path, &key)?;
        let bad = |message: String| Error::Weights {
            path: path.to_path_buf(),
            name: key.clone(),
            message,
        };
        if !matches!(
            t.dtype(),
            DType::F32 | DType::BF16 | DType::F16 | DType::F64
        ) {
            return Err(bad(format!(
                "dtype {:?}; expected F32, BF16 or F16",
                t.dtype()
            )));
        }
        let t = t.to_dtype(DType::F32)?;
        let &[rows, cols] = t.dims() else {
            return Err(bad(format!("shape {:?}; expected a matrix", t.dims())));
        };
        let (r_dim, shape) = match half {
            Half::A => (rows, "[r, in]"),
            Half::B => (cols, "[out, r]"),
        };
        if r_dim != rank {
            return Err(bad(format!(
                "shape {:?}; expected {shape} with r = {rank}, the `r` of {ADAPTER_CONFIG}",
                t.dims()
            )));
        }
        let slot = &mut halves.entry(module.clone()).or_default()[half as usize];
        if let Some((other, _)) = slot {
            return Err(bad(format!(
                "a second {} matrix for `{module}` (the first is `{other}`); expected one adapter",
                if half == Half::A { "A" } else { "B" }
            )));
        }
        *slot = Some((key, t));
    }
    let mut modules = BTreeMap::new();
    for (module, [a, b]) in halves {
        let missing = |have: &str, lacks: &str| Error::Weights {
            path: path.to_path_buf(),
            name: have.to_string(),
            message: format!("`{module}` has no {lacks} matrix; expected lora_A and lora_B"),
        };
        let (a_key, a, b_key, b) = match (a, b) {
            (Some((ak, a)), Some((bk, b))) => (ak, a, bk, b),
            (Some((ak, _)), None) => return Err(missing(&ak, "lora_B")),
            (None, Some((bk, _))) => return Err(missing(&bk, "lora_A")),
            (None, None) => unreachable!("a module is recorded with one of its matrices"),
        };
        modules.insert(module, LoraPair { a, b, a_key, b_key });
    }
    Ok(modules)
}

/// A snapshot of a model's weights (the initial checkpoint) that adapters are merged into:
/// owned copies, by HF name, in the model's dtype and on its device.
///
/// Merging always starts from this snapshot, never from the current weights, so the deltas of
/// successive adapter versions never compound.
#[derive(Debug, Clone)]
pub struct BaseWeights {
    tensors: BTreeMap<String, Tensor>,
}

impl BaseWeights {
    /// Wrap named tensors. The caller owns them: copy a model's variables first
    /// ([`Qwen::snapshot`](crate::model::Qwen::snapshot) does), or later updates of the
    /// variables show through.
    pub fn from_tensors(tensors: impl IntoIterator<Item = (String, Tensor)>) -> Self {
        BaseWeights {
            tensors: tensors.into_iter().collect(),
        }
    }

    /// The tensor named `name`.
    pub fn get(&self, name: &str) -> Option<&Tensor> {
        self.tensors.get(name)
    }

    /// The names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// How many tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Bytes the tensors hold.
    pub fn bytes(&self) -> usize {
        self.tensors
            .values()
            .map(|t| t.elem_count() * t.dtype().size_in_bytes())
            .sum()
    }

    /// Every weight with `adapter` merged: `W + s · B A` (computed in f32 on `W`'s device,
    /// returned in `W`'s dtype) for every targeted `<module>.weight`, the snapshot's tensor
    /// (shared, not copied) for the rest. Every module is checked against the snapshot before
    /// anything is computed.
    pub fn merged(&self, adapter: &PeftAdapter) -> Result<HashMap<String, Tensor>> {
        let path = &adapter.weights_path;
        let bad = |key: &str, message: String| Error::Weights {
            path: path.clone(),
            name: key.to_string(),
            message,
        };
        let mut targets = Vec::with_capacity(adapter.modules.len());
        for (module, pair) in &adapter.modules {
            let name = format!("{module}.weight");
            let w = self.tensors.get(&name).ok_or_else(|| {
                bad(
                    &pair.a_key,
                    format!("targets `{module}`, which is not a module of the model (no `{name}`)"),
                )
            })?;
            let &[out, inp] = w.dims() else {
                return Err(bad(
                    &pair.a_key,
                    format!(
                        "targets `{module}`, whose weight has shape {:?}; expected a Linear module",
                        w.dims()
                    ),
                ));
            };
            let (a_in, b_out) = (pair.a.dims()[1], pair.b.dims()[0]);
            if a_in != inp {
                return Err(bad(
                    &pair.a_key,
                    format!(
                        "shape {:?}; expected [r, in] = [{}, {inp}] for `{name}` of shape {:?}",
                        pair.a.dims(),
                        adapter.rank,
                        w.dims()
                    ),
                ));
            }
            if b_out != out {
                return Err(bad(
                    &pair.b_key,
                    format!(
                        "shape {:?}; expected [out, r] = [{out}, {}] for `{name}` of shape {:?}",
                        pair.b.dims(),
                        adapter.rank,
                        w.dims()
                    ),
                ));
            }
            targets.push((name, w, pair));
        }
        let mut out: HashMap<String, Tensor> = self
            .tensors
            .iter()
            .map(|(k, t)| (k.clone(), t.clone()))
            .collect();
        for (name, w, pair) in targets {
            let device = w.device();
            let delta = pair
                .b
                .to_device(device)?
                .matmul(&pair.a.to_device(device)?)?
                .affine(adapter.scaling, 0.0)?;
            let merged = (w.to_dtype(DType::F32)? + delta)?.to_dtype(w.dtype())?;
            out.insert(name, merged);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_with_and_without_an_adapter_name() {
        let p = Path::new("a.safetensors");
        let (m, h) = parse_key(
            p,
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight",
        )
        .unwrap();
        assert_eq!(m, "model.layers.0.self_attn.q_proj");
        assert_eq!(h, Half::A);
        let (m, h) = parse_key(
            p,
            "base_model.model.model.layers.1.mlp.down_proj.lora_B.default.weight",
        )
        .unwrap();
        assert_eq!(m, "model.layers.1.mlp.down_proj");
        assert_eq!(h, Half::B);
        for bad in [
            "model.layers.0.mlp.up_proj.lora_A.weight",
            "base_model.model.model.layers.0.mlp.up_proj.weight",
            "base_model.model.model.layers.0.mlp.up_proj.lora_A.bias",
            "base_model.model.model.layers.0.mlp.up_proj.lora_A.x.y.weight",
            "base_model.model.model.embed_tokens.lora_embedding_A",
            "base_model.model.lm_head.lora_A.weight",
        ] {
            let err = parse_key(p, bad).unwrap_err().to_string();
            assert!(err.contains(bad) && err.contains("a.safetensors"), "{err}");
        }
    }
}
