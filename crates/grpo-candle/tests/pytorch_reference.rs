//! The tiny Qwen3 and Qwen2 checkpoints written by `scripts/make_reference.py` with PyTorch and
//! transformers load through the normal loading path and give PyTorch's per-token log-probs,
//! loss and gradient norm.

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use grpo_candle::model::token_logprobs;
use grpo_candle::{Arch, PolicyModel};
use serde_json::Value;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn check(name: &str, arch: Arch) {
    let dir = fixture(name);
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let pm = PolicyModel::load_dir(&dir, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(pm.model.config().arch, arch);

    // Same tokenization as transformers.
    let text = reference["text"].as_str().unwrap();
    let ids = grpo_candle::model::tokenizer::encode(&pm.tokenizer, text).unwrap();
    let want_ids: Vec<u32> = reference["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(ids, want_ids, "{name}: token ids");

    // Per-token log-probs.
    let n = ids.len();
    let input = Tensor::new(ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let logits = pm.model.forward_logits(&input).unwrap().squeeze(0).unwrap();
    let targets = Tensor::new(&ids[1..], &Device::Cpu).unwrap();
    let lp = token_logprobs(&logits.narrow(0, 0, n - 1).unwrap(), &targets).unwrap();
    let got: Vec<f32> = lp.to_vec1().unwrap();
    let want: Vec<f64> = reference["logprobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(got.len(), want.len());
    let worst = got
        .iter()
        .zip(&want)
        .map(|(g, w)| (*g as f64 - w).abs())
        .fold(0.0, f64::max);
    eprintln!(
        "{name}: {} tokens, worst log-prob difference {worst:.2e}",
        got.len()
    );
    assert!(worst < 1e-4, "{name}: log-probs differ by {worst}");

    // Loss (mean NLL) and global gradient norm of one backward pass.
    let loss = lp.mean_all().unwrap().neg().unwrap();
    let loss_value = loss.to_scalar::<f32>().unwrap() as f64;
    let want_loss = reference["loss"].as_f64().unwrap();
    assert!(
        ((loss_value - want_loss) / want_loss).abs() < 1e-4,
        "{name}: loss {loss_value} vs {want_loss}"
    );
    let grads = loss.backward().unwrap();
    let mut sq = 0.0f64;
    for (var_name, var) in pm.model.named_vars() {
        let g = grads
            .get(var.as_tensor())
            .unwrap_or_else(|| panic!("{name}: no gradient for {var_name}"));
        sq += g
            .to_dtype(DType::F64)
            .unwrap()
            .sqr()
            .unwrap()
            .sum_all()
            .unwrap()
            .to_scalar::<f64>()
            .unwrap();
    }
    let norm = sq.sqrt();
    let want_norm = reference["grad_norm"].as_f64().unwrap();
    eprintln!(
        "{name}: loss {loss_value:.6} (torch {want_loss:.6}), grad norm {norm:.6} (torch {want_norm:.6})"
    );
    assert!(
        ((norm - want_norm) / want_norm).abs() < 1e-4,
        "{name}: grad norm {norm} vs {want_norm}"
    );
}

#[test]
fn qwen3_tied_matches_pytorch() {
    check("tiny-qwen3", Arch::Qwen3);
}

#[test]
fn qwen2_sharded_hub_style_matches_pytorch() {
    check("tiny-qwen2", Arch::Qwen2);
}
