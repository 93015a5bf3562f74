//! The tiny Llama and Mistral checkpoints written by `scripts/make_llama_reference.py` with
//! transformers load through the normal loading path and give transformers' per-token log-probs,
//! loss and gradient norm: the Llama one with q/k/v biases, tied embeddings and Llama 3.1's
//! scaled rotary frequencies, the Mistral one untied, without biases and with a head width apart
//! from `hidden / heads`.

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

fn numbers(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn check(name: &str, arch: Arch) {
    let dir = fixture(name);
    let reference: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let pm = PolicyModel::load_dir(&dir, DType::F32, &Device::Cpu).unwrap();
    assert_eq!(pm.model.config().arch, arch);

    let text = reference["text"].as_str().unwrap();
    let ids = grpo_candle::model::tokenizer::encode(&pm.tokenizer, text).unwrap();
    let want_ids: Vec<u32> = numbers(&reference["token_ids"])
        .into_iter()
        .map(|v| v as u32)
        .collect();
    assert_eq!(ids, want_ids, "{name}: token ids");

    let n = ids.len();
    let input = Tensor::new(ids.as_slice(), &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let logits = pm.model.forward_logits(&input).unwrap().squeeze(0).unwrap();
    let targets = Tensor::new(&ids[1..], &Device::Cpu).unwrap();
    let lp = token_logprobs(&logits.narrow(0, 0, n - 1).unwrap(), &targets).unwrap();
    let got: Vec<f32> = lp.to_vec1().unwrap();
    let want = numbers(&reference["logprobs"]);
    assert_eq!(got.len(), want.len());
    let worst = got
        .iter()
        .zip(&want)
        .map(|(g, w)| (*g as f64 - w).abs())
        .fold(0.0, f64::max);
    eprintln!("{name}: {n} tokens, worst log-prob difference {worst:.2e}");
    assert!(worst < 1e-4, "{name}: log-probs differ by {worst}");

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
fn llama_tied_with_biases_and_llama3_rope_matches_transformers() {
    check("tiny-llama", Arch::Llama);
}

#[test]
fn mistral_untied_with_wide_heads_matches_transformers() {
    check("tiny-mistral", Arch::Mistral);
}

/// Saving a loaded Llama writes a config transformers reads as the same model (family, scaling,
/// biases), and loading it back gives the same logits.
#[test]
fn llama_save_round_trips() {
    let pm = PolicyModel::load_dir(fixture("tiny-llama"), DType::F32, &Device::Cpu).unwrap();
    let out = tempfile::tempdir().unwrap();
    pm.save_hf(out.path()).unwrap();
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(out.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(cfg["architectures"][0], "LlamaForCausalLM");
    assert_eq!(cfg["rope_parameters"]["rope_type"], "llama3");
    assert_eq!(cfg["attention_bias"], true);
    let back = PolicyModel::load_dir(out.path(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(
        back.model.config().rope_scaling,
        pm.model.config().rope_scaling
    );
    let ids = Tensor::new(&[[1u32, 50, 7, 300]], &Device::Cpu).unwrap();
    let a = pm.model.forward_logits(&ids).unwrap();
    let b = back.model.forward_logits(&ids).unwrap();
    let d: f32 = (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap();
    assert_eq!(d, 0.0);
}
