//! Loading checkpoints through the normal paths: a folder, and (with the `hub` feature:
//! `cargo test -p grpo-candle --features hub --test loading`) the hub's local cache in offline
//! mode (a fake cache laid out as hf-hub writes it; nothing touches the network).

#[cfg(feature = "hub")]
use std::path::Path;

use candle_core::{DType, Device, Tensor};
#[cfg(feature = "hub")]
use grpo_candle::ModelFiles;
use grpo_candle::{PolicyModel, TinySpec};

fn tiny() -> PolicyModel {
    let spec = TinySpec {
        num_merges: 24,
        hidden_size: 32,
        intermediate_size: 48,
        head_dim: 8,
        tie_word_embeddings: false,
        ..TinySpec::default()
    };
    PolicyModel::tiny(&spec, DType::F32, &Device::Cpu).unwrap()
}

fn same_logits(a: &PolicyModel, b: &PolicyModel) {
    let ids = Tensor::new(&[[5u32, 6, 7, 250]], &Device::Cpu).unwrap();
    let x = a.model.forward_logits(&ids).unwrap();
    let y = b.model.forward_logits(&ids).unwrap();
    let d: f32 = (x - y)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    assert_eq!(d, 0.0);
}

/// `cache/models--{owner}--{name}/refs/main` -> commit, files under `snapshots/{commit}/`.
#[cfg(feature = "hub")]
fn fake_hub_cache(cache: &Path, owner: &str, name: &str, checkpoint: &Path) -> String {
    let commit = "0123456789abcdef0123456789abcdef01234567";
    let repo = cache.join(format!("models--{owner}--{name}"));
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();
    let snap = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(&snap).unwrap();
    for entry in std::fs::read_dir(checkpoint).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), snap.join(entry.file_name())).unwrap();
    }
    commit.to_string()
}

#[test]
fn folder_round_trip_untied() {
    let pm = tiny();
    let dir = tempfile::tempdir().unwrap();
    pm.save_hf(dir.path()).unwrap();
    let back = PolicyModel::load_dir(dir.path(), DType::F32, &Device::Cpu).unwrap();
    same_logits(&pm, &back);
}

#[test]
fn missing_weight_is_named() {
    let pm = tiny();
    let dir = tempfile::tempdir().unwrap();
    pm.save_hf(dir.path()).unwrap();
    // Claim an attention bias the checkpoint does not have.
    let cfg_path = dir.path().join("config.json");
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
    cfg["attention_bias"] = serde_json::json!(true);
    std::fs::write(&cfg_path, cfg.to_string()).unwrap();
    let err = PolicyModel::load_dir(dir.path(), DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.layers.0.self_attn.q_proj.bias") && err.contains("missing"),
        "{err}"
    );
}

#[cfg(feature = "hub")]
#[tokio::test]
async fn hub_cache_offline() {
    let pm = tiny();
    let saved = tempfile::tempdir().unwrap();
    pm.save_hf(saved.path()).unwrap();
    let cache = tempfile::tempdir().unwrap();
    let commit = fake_hub_cache(cache.path(), "test-org", "tiny", saved.path());
    // An endpoint nothing listens on: offline mode must not need it.
    let client = hf_hub::HFClient::builder()
        .cache_dir(cache.path())
        .endpoint("http://127.0.0.1:9")
        .build()
        .unwrap();
    let files = ModelFiles::from_hub_with(&client, "test-org/tiny", None, true)
        .await
        .unwrap();
    assert!(files.config.starts_with(cache.path()));
    assert!(files.tokenizer_config.is_some() && files.generation_config.is_some());
    let back = PolicyModel::load(&files, DType::F32, &Device::Cpu).unwrap();
    same_logits(&pm, &back);
    // A pinned commit resolves too.
    let pinned = ModelFiles::from_hub_with(&client, "test-org/tiny", Some(&commit), true)
        .await
        .unwrap();
    assert_eq!(pinned.weights, files.weights);
    // A repository that is not cached is an error that says so, without any network request.
    let err = ModelFiles::from_hub_with(&client, "test-org/absent", None, true)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("offline"), "{err}");
    // Sharded checkpoints resolve their shards from the cache as well.
    let sharded = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/tiny-qwen2");
    fake_hub_cache(cache.path(), "test-org", "sharded", &sharded);
    let files = ModelFiles::from_hub_with(&client, "test-org/sharded", None, true)
        .await
        .unwrap();
    assert_eq!(files.weights.len(), 4);
    PolicyModel::load(&files, DType::F32, &Device::Cpu).unwrap();
}

/// `ModelFiles::from_hub` reads `HF_HUB_CACHE` and honours `HF_HUB_OFFLINE` from the environment.
/// The environment is set for a child process (this test binary re-run on
/// `hub_env_child`), since a test cannot safely change its own.
#[cfg(feature = "hub")]
#[test]
fn hub_offline_from_environment() {
    let pm = tiny();
    let saved = tempfile::tempdir().unwrap();
    pm.save_hf(saved.path()).unwrap();
    let cache = tempfile::tempdir().unwrap();
    fake_hub_cache(cache.path(), "env-org", "tiny", saved.path());
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "hub_env_child",
            "--nocapture",
            "--include-ignored",
        ])
        .env("GRPO_CANDLE_HUB_CHILD", "1")
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_CACHE", cache.path())
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .status()
        .unwrap();
    assert!(status.success());
}

/// Child half of `hub_offline_from_environment` (does nothing when run on its own).
#[cfg(feature = "hub")]
#[test]
#[ignore = "run by hub_offline_from_environment in a child process"]
fn hub_env_child() {
    if std::env::var("GRPO_CANDLE_HUB_CHILD").is_err() {
        return;
    }
    let offline = grpo_candle::model::loading::offline_from_env(std::env::var("HF_HUB_OFFLINE"));
    assert!(offline);
    let files = ModelFiles::from_hub_blocking("env-org/tiny", None, offline).unwrap();
    PolicyModel::load(&files, DType::F32, &Device::Cpu).unwrap();
    let err = ModelFiles::from_hub_blocking("env-org/missing", None, offline)
        .unwrap_err()
        .to_string();
    assert!(err.contains("offline"), "{err}");
}
