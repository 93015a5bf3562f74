//! Finding and reading checkpoint files: a local folder or the Hugging Face hub (through `hf-hub`,
//! honouring its cache and offline mode).

use std::collections::{BTreeSet, HashMap, HashSet};
use std::path::{Path, PathBuf};

use candle_core::safetensors::Load;
use candle_core::{Device, Tensor};
use serde_json::Value;

use crate::error::{Error, Result};

/// The files of a Hugging Face-format checkpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelFiles {
    /// `config.json`.
    pub config: PathBuf,
    /// `model.safetensors`, or the shards named by `model.safetensors.index.json` (sorted).
    pub weights: Vec<PathBuf>,
    /// `tokenizer.json`.
    pub tokenizer: PathBuf,
    /// `tokenizer_config.json`, when present (copied into saved checkpoints).
    pub tokenizer_config: Option<PathBuf>,
    /// `generation_config.json`, when present (its `eos_token_id` adds stop tokens).
    pub generation_config: Option<PathBuf>,
}

const INDEX: &str = "model.safetensors.index.json";
const SINGLE: &str = "model.safetensors";

impl ModelFiles {
    /// The files of a checkpoint folder.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let need = |name: &str| -> Result<PathBuf> {
            let p = dir.join(name);
            if p.is_file() {
                Ok(p)
            } else {
                Err(Error::io(
                    &p,
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        "missing from the checkpoint",
                    ),
                ))
            }
        };
        let optional = |name: &str| Some(dir.join(name)).filter(|p| p.is_file());
        let weights = if dir.join(SINGLE).is_file() {
            vec![dir.join(SINGLE)]
        } else if dir.join(INDEX).is_file() {
            shard_names(&dir.join(INDEX))?
                .into_iter()
                .map(|s| dir.join(s))
                .collect()
        } else {
            return Err(Error::io(
                dir.join(SINGLE),
                std::io::Error::new(
                    std::io::ErrorKind::NotFound,
                    format!("neither {SINGLE} nor {INDEX} is in the folder"),
                ),
            ));
        };
        for w in &weights {
            if !w.is_file() {
                return Err(Error::io(
                    w,
                    std::io::Error::new(
                        std::io::ErrorKind::NotFound,
                        format!("shard named by {INDEX}"),
                    ),
                ));
            }
        }
        Ok(ModelFiles {
            config: need("config.json")?,
            weights,
            tokenizer: need("tokenizer.json")?,
            tokenizer_config: optional("tokenizer_config.json"),
            generation_config: optional("generation_config.json"),
        })
    }

    /// The files of a hub repository (`owner/name`), downloaded into (or found in) the hf-hub
    /// cache (`HF_HUB_CACHE`, else `$HF_HOME/hub`, else `~/.cache/huggingface/hub`).
    ///
    /// With `offline` nothing touches the network: files are resolved from the cache only, and a
    /// missing file is an error. Binaries pass `offline_from_env(std::env::var("HF_HUB_OFFLINE"))`
    /// to honour the usual variable, which hf-hub itself ignores.
    #[cfg(feature = "hub")]
    #[cfg_attr(docsrs, doc(cfg(feature = "hub")))]
    pub async fn from_hub(repo_id: &str, revision: Option<&str>, offline: bool) -> Result<Self> {
        let client = hf_hub::HFClient::new().map_err(|e| Error::Hub(e.to_string()))?;
        Self::from_hub_with(&client, repo_id, revision, offline).await
    }

    /// [`ModelFiles::from_hub`] with an explicit client (cache folder, endpoint) and offline flag.
    #[cfg(feature = "hub")]
    #[cfg_attr(docsrs, doc(cfg(feature = "hub")))]
    pub async fn from_hub_with(
        client: &hf_hub::HFClient,
        repo_id: &str,
        revision: Option<&str>,
        offline: bool,
    ) -> Result<Self> {
        let (owner, name) = repo_id.split_once('/').ok_or_else(|| {
            Error::Hub(format!("repository id `{repo_id}`: expected `owner/name`"))
        })?;
        let repo = client.model(owner, name);
        let fetch = |file: &'static str| {
            let repo = repo.clone();
            let revision = revision.map(str::to_string);
            async move {
                let result = repo
                    .download_file()
                    .filename(file)
                    .maybe_revision(revision)
                    .local_files_only(offline)
                    .send()
                    .await;
                match result {
                    Ok(p) => Ok(Some(p)),
                    Err(hf_hub::HFError::EntryNotFound { .. })
                    | Err(hf_hub::HFError::LocalEntryNotFound { .. }) => Ok(None),
                    Err(e) => Err(Error::Hub(format!("{repo_id}: {file}: {e}"))),
                }
            }
        };
        let missing = |file: &str| {
            let mode = if offline {
                " (offline: looked in the local cache only)"
            } else {
                ""
            };
            Error::Hub(format!("{repo_id}: {file} not found{mode}"))
        };
        let config = fetch("config.json")
            .await?
            .ok_or_else(|| missing("config.json"))?;
        let tokenizer = fetch("tokenizer.json")
            .await?
            .ok_or_else(|| missing("tokenizer.json"))?;
        let weights = match fetch(SINGLE).await? {
            Some(p) => vec![p],
            None => {
                let index = fetch(INDEX).await?.ok_or_else(|| missing(SINGLE))?;
                let mut out = Vec::new();
                for shard in shard_names(&index)? {
                    let result = repo
                        .download_file()
                        .filename(shard.clone())
                        .maybe_revision(revision.map(str::to_string))
                        .local_files_only(offline)
                        .send()
                        .await
                        .map_err(|e| Error::Hub(format!("{repo_id}: {shard}: {e}")))?;
                    out.push(result);
                }
                out
            }
        };
        Ok(ModelFiles {
            config,
            weights,
            tokenizer,
            tokenizer_config: fetch("tokenizer_config.json").await?,
            generation_config: fetch("generation_config.json").await?,
        })
    }

    /// [`ModelFiles::from_hub`] for synchronous callers (runs a private current-thread runtime;
    /// do not call it from inside an async task).
    #[cfg(feature = "hub")]
    #[cfg_attr(docsrs, doc(cfg(feature = "hub")))]
    pub fn from_hub_blocking(repo_id: &str, revision: Option<&str>, offline: bool) -> Result<Self> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::Hub(format!("cannot start a runtime: {e}")))?;
        rt.block_on(Self::from_hub(repo_id, revision, offline))
    }
}

/// Whether a value of `HF_HUB_OFFLINE` (as a binary read it) asks for offline mode: `1`,
/// `true`, `yes` or `on`, in any case.
pub fn offline_from_env<E>(value: std::result::Result<String, E>) -> bool {
    value.is_ok_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "on"
        )
    })
}

/// The distinct shard file names of a `model.safetensors.index.json`, sorted.
fn shard_names(index: &Path) -> Result<Vec<String>> {
    let text = std::fs::read_to_string(index).map_err(|e| Error::io(index, e))?;
    let value: Value = serde_json::from_str(&text)
        .map_err(|e| Error::config(index, "(document)", format!("not valid JSON: {e}")))?;
    let map = value
        .get("weight_map")
        .and_then(Value::as_object)
        .ok_or_else(|| Error::config(index, "weight_map", "missing; expected an object"))?;
    let mut names = BTreeSet::new();
    for (tensor, file) in map {
        let file = file.as_str().ok_or_else(|| {
            Error::config(
                index,
                format!("weight_map.{tensor}"),
                "expected a file name",
            )
        })?;
        if file.contains('/') || file.contains("..") {
            return Err(Error::config(
                index,
                format!("weight_map.{tensor}"),
                "expected a file name in the checkpoint folder",
            ));
        }
        names.insert(file.to_string());
    }
    Ok(names.into_iter().collect())
}

/// Load the named tensors from safetensors files, one file at a time (peak memory is the model
/// plus one shard). Names not found are absent from the result.
///
/// A malformed file is an error naming it, never a panic: the safetensors reader checks the
/// header's length against the file and every tensor's extent against the data before
/// anything is copied, and a panic inside the reader or candle's conversion (the reader's own
/// end-of-data sum overflows on offsets near `usize::MAX`) is caught and reported as such.
pub fn load_tensors(
    files: &[PathBuf],
    names: &HashSet<String>,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    load_matching(files, |name| names.contains(name), device)
}

/// Every tensor of one safetensors file (e.g. a LoRA adapter, whose names are not known
/// beforehand), with the guards of [`load_tensors`].
pub fn load_all_tensors(file: &Path, device: &Device) -> Result<HashMap<String, Tensor>> {
    load_matching(&[file.to_path_buf()], |_| true, device)
}

fn load_matching(
    files: &[PathBuf],
    wanted: impl Fn(&str) -> bool,
    device: &Device,
) -> Result<HashMap<String, Tensor>> {
    let mut out = HashMap::new();
    for file in files {
        let bytes = std::fs::read(file).map_err(|e| Error::io(file, e))?;
        let st = guarded(file, "safetensors", "the header", || {
            safetensors::SafeTensors::deserialize(&bytes)
        })?
        .map_err(|e| Error::Weights {
            path: file.clone(),
            name: "(header)".into(),
            message: format!("not a safetensors file: {e}"),
        })?;
        for (name, view) in st.tensors() {
            if wanted(&name) {
                let t =
                    guarded(file, "safetensors", &name, || view.load(device))?.map_err(|e| {
                        Error::Weights {
                            path: file.clone(),
                            name: name.clone(),
                            message: e.to_string(),
                        }
                    })?;
                out.insert(name, t);
            }
        }
    }
    Ok(out)
}

/// Run one step of a third-party `reader` (candle's GGUF reader, the safetensors crate, the
/// tokenizers crate) on `path`, turning a panic inside it into an error naming the file and
/// what was being read: a malformed file is an error, not a crash.
pub(crate) fn guarded<T>(
    path: &Path,
    reader: &str,
    what: &str,
    step: impl FnOnce() -> T,
) -> Result<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(step)).map_err(|panic| {
        let why = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        Error::config(
            path,
            reader,
            format!("malformed file: reading {what} failed inside the {reader} reader ({why})"),
        )
    })
}

/// Write `bytes` to `path` atomically: a temporary file in the same folder, synced, then renamed
/// over the target, so a reader sees the old file or the new one, never half of one.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    harness_core::fsutil::write_atomic(path, bytes).map_err(|e| match e {
        harness_core::Error::Io { path, source } => Error::io(path, source),
        other => Error::Msg(other.to_string()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offline_flag_values() {
        for v in ["1", "true", "YES", " on "] {
            assert!(offline_from_env::<()>(Ok(v.to_string())), "{v:?}");
        }
        for v in ["0", "false", "", "offline"] {
            assert!(!offline_from_env::<()>(Ok(v.to_string())), "{v:?}");
        }
        assert!(!offline_from_env(Err(std::env::VarError::NotPresent)));
    }

    #[test]
    fn missing_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let err = ModelFiles::from_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("model.safetensors"), "{err}");
        std::fs::write(dir.path().join(SINGLE), b"").unwrap();
        let err = ModelFiles::from_dir(dir.path()).unwrap_err().to_string();
        assert!(err.contains("config.json"), "{err}");
    }

    #[test]
    fn shard_index_is_read() {
        let dir = tempfile::tempdir().unwrap();
        let index = dir.path().join(INDEX);
        std::fs::write(
            &index,
            r#"{"metadata":{},"weight_map":{"a":"model-00002-of-00002.safetensors",
               "b":"model-00001-of-00002.safetensors","c":"model-00001-of-00002.safetensors"}}"#,
        )
        .unwrap();
        assert_eq!(
            shard_names(&index).unwrap(),
            vec![
                "model-00001-of-00002.safetensors",
                "model-00002-of-00002.safetensors"
            ]
        );
        std::fs::write(&index, r#"{"weight_map":{"a":"../x.safetensors"}}"#).unwrap();
        assert!(
            shard_names(&index)
                .unwrap_err()
                .to_string()
                .contains("weight_map.a")
        );
    }

    #[test]
    fn atomic_write_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
