//! PEFT LoRA adapters (as a remote Tinker-protocol learner writes them) merged into the sampling
//! policy: `W + s · B A` against a float64 reference and against a checkpoint edited by hand,
//! no compounding across versions, rsLoRA scaling, refusals that name the file and the key, and
//! `score_tokens` against the sampler's own log-probs.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use grpo_candle::model::lora::{ADAPTER_CONFIG, ADAPTER_WEIGHTS};
use grpo_candle::{BaseWeights, CandlePolicy, PeftAdapter, PolicyModel, PolicyOptions, TinySpec};
use harness_core::{ChatMessage, Policy, PolicyRequest, SamplingParams};
use serde_json::{Value, json};

const Q: &str = "model.layers.0.self_attn.q_proj";
const V: &str = "model.layers.1.self_attn.v_proj";
const DOWN: &str = "model.layers.0.mlp.down_proj";
const GATE: &str = "model.layers.1.mlp.gate_proj";

fn tiny() -> PolicyModel {
    let spec = TinySpec {
        num_merges: 64,
        seed: 11,
        ..TinySpec::default()
    };
    PolicyModel::tiny(&spec, DType::F32, &Device::Cpu).expect("tiny model")
}

fn policy() -> CandlePolicy {
    CandlePolicy::new(tiny(), PolicyOptions::default())
}

/// Deterministic values in [-scale, scale].
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut x = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// One module's LoRA matrices: A `[r, in]`, B `[out, r]`, row-major.
struct Pair {
    module: String,
    a: Vec<f32>,
    b: Vec<f32>,
    r: usize,
    inp: usize,
    out: usize,
}

fn pair(policy: &CandlePolicy, module: &str, r: usize, seed: u64) -> Pair {
    let (out, inp) = weight(policy, module).dims2().expect("matrix");
    Pair {
        module: module.into(),
        a: values(r * inp, seed, 0.3),
        b: values(out * r, seed + 1000, 0.3),
        r,
        inp,
        out,
    }
}

fn key(module: &str, half: &str) -> String {
    format!("base_model.model.{module}.{half}.weight")
}

fn pair_tensors(p: &Pair) -> Vec<(String, Tensor)> {
    vec![
        (
            key(&p.module, "lora_A"),
            Tensor::from_slice(&p.a, (p.r, p.inp), &Device::Cpu).unwrap(),
        ),
        (
            key(&p.module, "lora_B"),
            Tensor::from_slice(&p.b, (p.out, p.r), &Device::Cpu).unwrap(),
        ),
    ]
}

fn config(r: usize) -> Value {
    json!({
        "peft_type": "LORA",
        "r": r,
        "lora_alpha": 32,
        "use_rslora": false,
        "use_dora": false,
        "modules_to_save": null,
        "target_modules": ["q_proj", "v_proj", "down_proj", "gate_proj"],
        "base_model_name_or_path": "tiny",
        "lora_dropout": 0.0,
        "bias": "none",
    })
}

fn write_adapter(dir: &Path, config: &Value, tensors: Vec<(String, Tensor)>) {
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(
        dir.join(ADAPTER_CONFIG),
        serde_json::to_string_pretty(config).unwrap(),
    )
    .unwrap();
    let map: HashMap<String, Tensor> = tensors.into_iter().collect();
    candle_core::safetensors::save(&map, dir.join(ADAPTER_WEIGHTS)).unwrap();
}

fn weight(policy: &CandlePolicy, module: &str) -> Tensor {
    let name = format!("{module}.weight");
    policy
        .model()
        .named_vars()
        .into_iter()
        .find(|(n, _)| *n == name)
        .map(|(_, v)| v.as_tensor().copy().unwrap())
        .unwrap_or_else(|| panic!("no {name}"))
}

fn flat(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1().unwrap()
}

/// `W + s · B A` in float64, rounded to f32.
fn reference_merge(w: &[f32], p: &Pair, s: f64) -> Vec<f32> {
    let mut out = Vec::with_capacity(w.len());
    for o in 0..p.out {
        for i in 0..p.inp {
            let ba: f64 = (0..p.r)
                .map(|k| p.b[o * p.r + k] as f64 * p.a[k * p.inp + i] as f64)
                .sum();
            out.push((w[o * p.inp + i] as f64 + s * ba) as f32);
        }
    }
    out
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

fn all_weights(policy: &CandlePolicy) -> Vec<(String, Vec<f32>)> {
    policy
        .model()
        .named_vars()
        .into_iter()
        .map(|(n, v)| (n, flat(v.as_tensor())))
        .collect()
}

fn text_ids(policy: &CandlePolicy) -> Vec<u32> {
    grpo_candle::model::tokenizer::encode(policy.tokenizer(), "Hello world, merge the adapter now.")
        .unwrap()
}

#[test]
fn merged_weights_match_a_float64_reference() {
    let policy = policy();
    let before = all_weights(&policy);
    let base = policy.base_weights().unwrap();
    let r = 4;
    let pairs: Vec<Pair> = [Q, V, DOWN, GATE]
        .iter()
        .enumerate()
        .map(|(i, m)| pair(&policy, m, r, i as u64))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    write_adapter(
        dir.path(),
        &config(r),
        pairs.iter().flat_map(pair_tensors).collect(),
    );
    let adapter = PeftAdapter::load(dir.path()).unwrap();
    assert_eq!(adapter.rank(), r);
    assert_eq!(adapter.scaling(), 8.0);
    assert_eq!(adapter.modules(), vec![DOWN, Q, GATE, V]);
    assert_eq!(policy.weights_version(), None);
    assert_eq!(Policy::weights_version(&policy), None);

    policy.load_merged(&base, &adapter, 1).unwrap();
    assert_eq!(policy.weights_version(), Some(1));
    assert_eq!(Policy::weights_version(&policy), Some(1));
    let targeted: HashMap<String, &Pair> = pairs
        .iter()
        .map(|p| (format!("{}.weight", p.module), p))
        .collect();
    for (name, w) in before {
        let now = flat(&weight(&policy, name.trim_end_matches(".weight")));
        match targeted.get(&name) {
            Some(p) => {
                let d = max_diff(&now, &reference_merge(&w, p, 8.0));
                assert!(d < 1e-5, "{name}: max diff {d}");
                assert!(max_diff(&now, &w) > 1e-2, "{name} did not change");
            }
            None => assert_eq!(now, w, "{name} is not targeted but changed"),
        }
    }
}

#[test]
fn merged_policy_scores_like_a_checkpoint_edited_by_hand() {
    let policy = policy();
    let base = policy.base_weights().unwrap();
    let ids = text_ids(&policy);
    assert!(ids.len() > 5);
    let base_scores = policy.score_tokens(&ids).unwrap();
    assert_eq!(base_scores.len(), ids.len() - 1);

    let r = 2;
    let pairs: Vec<Pair> = [Q, DOWN, GATE]
        .iter()
        .enumerate()
        .map(|(i, m)| pair(&policy, m, r, 10 + i as u64))
        .collect();
    let s = 32.0 / r as f64;

    // The checkpoint: the tiny model saved, its targeted weights replaced by W + s·BA.
    let ckpt = tempfile::tempdir().unwrap();
    policy.save_hf(ckpt.path()).unwrap();
    let file = ckpt.path().join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&file, &Device::Cpu).unwrap();
    for p in &pairs {
        let name = format!("{}.weight", p.module);
        let w = flat(&tensors[&name]);
        let edited = Tensor::from_vec(reference_merge(&w, p, s), (p.out, p.inp), &Device::Cpu);
        tensors.insert(name, edited.unwrap());
    }
    candle_core::safetensors::save(&tensors, &file).unwrap();
    let edited = CandlePolicy::new(
        PolicyModel::load_dir(ckpt.path(), DType::F32, &Device::Cpu).unwrap(),
        PolicyOptions::default(),
    );
    let expected = edited.score_tokens(&ids).unwrap();

    let dir = tempfile::tempdir().unwrap();
    write_adapter(
        dir.path(),
        &config(r),
        pairs.iter().flat_map(pair_tensors).collect(),
    );
    let adapter = PeftAdapter::load(dir.path()).unwrap();
    policy.load_merged(&base, &adapter, 3).unwrap();
    let merged = policy.score_tokens(&ids).unwrap();
    let d = max_diff(&merged, &expected);
    assert!(d < 1e-5, "merged vs hand-edited: max diff {d}");
    assert!(
        max_diff(&merged, &base_scores) > 1e-3,
        "the adapter did not change the scores"
    );
}

#[test]
fn versions_do_not_compound() {
    let policy = policy();
    policy.set_weights_version(Some(0));
    assert_eq!(policy.weights_version(), Some(0));
    let base = policy.base_weights().unwrap();
    let r = 4;
    let v1 = tempfile::tempdir().unwrap();
    let v2 = tempfile::tempdir().unwrap();
    let one: Vec<Pair> = [Q, DOWN].iter().map(|m| pair(&policy, m, r, 100)).collect();
    // Version 2 targets one module of version 1 and one new one; DOWN must return to W.
    let two: Vec<Pair> = [Q, V].iter().map(|m| pair(&policy, m, r, 200)).collect();
    write_adapter(
        v1.path(),
        &config(r),
        one.iter().flat_map(pair_tensors).collect(),
    );
    write_adapter(
        v2.path(),
        &config(r),
        two.iter().flat_map(pair_tensors).collect(),
    );
    let (v1, v2) = (
        PeftAdapter::load(v1.path()).unwrap(),
        PeftAdapter::load(v2.path()).unwrap(),
    );

    policy.load_merged(&base, &v1, 1).unwrap();
    assert_eq!(policy.weights_version(), Some(1));
    policy.load_merged(&base, &v2, 2).unwrap();
    assert_eq!(policy.weights_version(), Some(2));

    let fresh = self::policy();
    let fresh_base = fresh.base_weights().unwrap();
    fresh.load_merged(&fresh_base, &v2, 2).unwrap();
    assert_eq!(all_weights(&policy), all_weights(&fresh));
    assert_eq!(
        flat(&weight(&policy, DOWN)),
        flat(base.get(&format!("{DOWN}.weight")).unwrap())
    );
}

#[test]
fn rslora_scales_by_the_square_root_of_the_rank() {
    let policy = policy();
    let base = policy.base_weights().unwrap();
    let r = 4;
    let p = pair(&policy, DOWN, r, 7);
    let mut cfg = config(r);
    cfg["use_rslora"] = json!(true);
    cfg["lora_alpha"] = json!(32.0);
    let dir = tempfile::tempdir().unwrap();
    // Named-adapter keys (`lora_A.default.weight`) in bf16 are read too.
    let tensors = pair_tensors(&p)
        .into_iter()
        .map(|(k, t)| {
            let k = k.replace(".weight", ".default.weight");
            (k, t)
        })
        .collect();
    write_adapter(dir.path(), &cfg, tensors);
    let adapter = PeftAdapter::load(dir.path()).unwrap();
    assert_eq!(adapter.scaling(), 16.0);
    assert_eq!(adapter.modules(), vec![DOWN]);
    let merged = base.merged(&adapter).unwrap();
    let w = flat(base.get(&format!("{DOWN}.weight")).unwrap());
    let d = max_diff(
        &flat(&merged[&format!("{DOWN}.weight")]),
        &reference_merge(&w, &p, 16.0),
    );
    assert!(d < 1e-5, "max diff {d}");
}

#[test]
fn half_precision_adapters_are_converted() {
    let policy = policy();
    let base = policy.base_weights().unwrap();
    let r = 2;
    let mut p = pair(&policy, Q, r, 9);
    // Values exactly representable in bf16, so the f64 reference sees what the file holds.
    let round = |v: &mut Vec<f32>| {
        let t = Tensor::from_slice(v.as_slice(), v.len(), &Device::Cpu).unwrap();
        *v = t
            .to_dtype(DType::BF16)
            .and_then(|t| t.to_dtype(DType::F32))
            .and_then(|t| t.to_vec1())
            .unwrap();
    };
    round(&mut p.a);
    round(&mut p.b);
    let tensors = pair_tensors(&p)
        .into_iter()
        .map(|(k, t)| (k, t.to_dtype(DType::BF16).unwrap()))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    write_adapter(dir.path(), &config(r), tensors);
    let adapter = PeftAdapter::load(dir.path()).unwrap();
    let merged = base.merged(&adapter).unwrap();
    let w = flat(base.get(&format!("{Q}.weight")).unwrap());
    let d = max_diff(
        &flat(&merged[&format!("{Q}.weight")]),
        &reference_merge(&w, &p, 16.0),
    );
    assert!(d < 1e-5, "max diff {d}");
}

/// The error of loading (and, if that succeeds, merging) an adapter, as text.
fn refusal(policy: &CandlePolicy, base: &BaseWeights, dir: &Path) -> String {
    let err = match PeftAdapter::load(dir) {
        Err(e) => e,
        Ok(adapter) => policy
            .load_merged(base, &adapter, 9)
            .expect_err("the adapter is refused"),
    };
    err.to_string()
}

fn assert_names(err: &str, parts: &[&str]) {
    for part in parts {
        assert!(err.contains(part), "`{part}` is not named in: {err}");
    }
}

#[test]
fn bad_adapters_are_refused_naming_the_file_and_the_key() {
    let policy = policy();
    policy.set_weights_version(Some(5));
    let before = all_weights(&policy);
    let base = policy.base_weights().unwrap();
    let r = 4;
    let good = pair(&policy, Q, r, 1);
    let a_key = key(Q, "lora_A");
    let b_key = key(Q, "lora_B");
    let root = tempfile::tempdir().unwrap();
    let case = |name: &str, cfg: &Value, tensors: Vec<(String, Tensor)>| -> String {
        let dir = root.path().join(name);
        write_adapter(&dir, cfg, tensors);
        refusal(&policy, &base, &dir)
    };
    let cpu = &Device::Cpu;

    // A with the wrong `in`.
    let mut t = pair_tensors(&good);
    t[0].1 = Tensor::zeros((r, good.inp + 1), DType::F32, cpu).unwrap();
    let err = case("a-shape", &config(r), t);
    assert_names(&err, &[ADAPTER_WEIGHTS, &a_key, "shape"]);

    // B with the wrong `out`.
    let mut t = pair_tensors(&good);
    t[1].1 = Tensor::zeros((good.out + 3, r), DType::F32, cpu).unwrap();
    let err = case("b-shape", &config(r), t);
    assert_names(&err, &[ADAPTER_WEIGHTS, &b_key, "shape"]);

    // B missing.
    let t = pair_tensors(&good).into_iter().take(1).collect();
    let err = case("b-missing", &config(r), t);
    assert_names(&err, &[ADAPTER_WEIGHTS, &a_key, "lora_B"]);

    // A missing.
    let t = pair_tensors(&good).into_iter().skip(1).collect();
    let err = case("a-missing", &config(r), t);
    assert_names(&err, &[ADAPTER_WEIGHTS, &b_key, "lora_A"]);

    // A module the model does not have.
    let unknown = "model.layers.0.self_attn.x_proj";
    let mut t = pair_tensors(&good);
    t[0].0 = key(unknown, "lora_A");
    t[1].0 = key(unknown, "lora_B");
    let err = case("unknown", &config(r), t);
    assert_names(
        &err,
        &[ADAPTER_WEIGHTS, &key(unknown, "lora_A"), "not a module"],
    );

    // A layer the model does not have.
    let deep = "model.layers.7.self_attn.q_proj";
    let mut t = pair_tensors(&good);
    t[0].0 = key(deep, "lora_A");
    t[1].0 = key(deep, "lora_B");
    let err = case("deep", &config(r), t);
    assert_names(&err, &[ADAPTER_WEIGHTS, &key(deep, "lora_A")]);

    // LoRA on the embedding and on the lm_head.
    for module in ["model.embed_tokens", "lm_head"] {
        let mut t = pair_tensors(&good);
        t[0].0 = key(module, "lora_A");
        t[1].0 = key(module, "lora_B");
        let err = case(module, &config(r), t);
        assert_names(&err, &[ADAPTER_WEIGHTS, module, "never adapted"]);
    }
    let t = vec![(
        "base_model.model.model.embed_tokens.lora_embedding_A".to_string(),
        Tensor::zeros((r, 8), DType::F32, cpu).unwrap(),
    )];
    let err = case("embedding", &config(r), t);
    assert_names(&err, &[ADAPTER_WEIGHTS, "lora_embedding_A", "embedding"]);

    // r disagreeing with A's rows (and B's columns).
    let err = case("rank", &config(r + 4), pair_tensors(&good));
    assert_names(&err, &[ADAPTER_WEIGHTS, &a_key, "r = 8", ADAPTER_CONFIG]);

    // DoRA, modules_to_save, rank patterns, another PEFT type.
    for (field, value) in [
        ("use_dora", json!(true)),
        ("modules_to_save", json!(["lm_head"])),
        ("rank_pattern", json!({"q_proj": 8})),
        ("peft_type", json!("IA3")),
        ("r", json!(0)),
        ("r", json!("four")),
        ("lora_alpha", json!(null)),
        ("use_rslora", json!("yes")),
    ] {
        let mut cfg = config(r);
        cfg[field] = value;
        let err = case(&format!("cfg-{field}"), &cfg, pair_tensors(&good));
        assert_names(&err, &[ADAPTER_CONFIG, &format!("`{field}`")]);
    }

    // adapter_config.json missing, or not JSON.
    let dir = root.path().join("no-config");
    write_adapter(&dir, &config(r), pair_tensors(&good));
    std::fs::remove_file(dir.join(ADAPTER_CONFIG)).unwrap();
    assert_names(&refusal(&policy, &base, &dir), &[ADAPTER_CONFIG]);
    std::fs::write(dir.join(ADAPTER_CONFIG), "{ r: 4").unwrap();
    assert_names(
        &refusal(&policy, &base, &dir),
        &[ADAPTER_CONFIG, "not valid JSON"],
    );

    // adapter_model.safetensors missing, or not safetensors.
    let dir = root.path().join("no-weights");
    write_adapter(&dir, &config(r), pair_tensors(&good));
    std::fs::remove_file(dir.join(ADAPTER_WEIGHTS)).unwrap();
    assert_names(&refusal(&policy, &base, &dir), &[ADAPTER_WEIGHTS]);
    std::fs::write(
        dir.join(ADAPTER_WEIGHTS),
        b"\xff\xff\xff\xff\xff\xff\xff\x7fjunk",
    )
    .unwrap();
    assert_names(&refusal(&policy, &base, &dir), &[ADAPTER_WEIGHTS]);

    // Nothing was changed by any of them.
    assert_eq!(all_weights(&policy), before);
    assert_eq!(policy.weights_version(), Some(5));
}

#[test]
fn score_tokens_matches_the_samplers_logprobs_before_and_after_a_merge() {
    let policy = policy();
    let base = policy.base_weights().unwrap();
    let request = PolicyRequest {
        messages: vec![ChatMessage::user("Say something.")],
        tools: vec![],
        max_new_tokens: 8,
        max_context_tokens: 1024,
        sampling: SamplingParams::default(),
        seed: 3,
    };
    let check = |what: &str| {
        let turn = policy.generate_blocking(request.clone()).unwrap();
        assert!(!turn.tokens.is_empty());
        let mut ids = turn.context_tokens.clone();
        ids.extend(&turn.tokens);
        let scores = policy.score_tokens(&ids).unwrap();
        assert_eq!(scores.len(), ids.len() - 1);
        let tail = &scores[scores.len() - turn.tokens.len()..];
        let d = max_diff(tail, &turn.logprobs);
        assert!(
            d < 1e-4,
            "{what}: max diff {d}: {tail:?} vs {:?}",
            turn.logprobs
        );
        turn
    };
    let before = check("base");

    let r = 4;
    let pairs: Vec<Pair> = [Q, V, DOWN, GATE]
        .iter()
        .enumerate()
        .map(|(i, m)| pair(&policy, m, r, 50 + i as u64))
        .collect();
    let dir = tempfile::tempdir().unwrap();
    write_adapter(
        dir.path(),
        &config(r),
        pairs.iter().flat_map(pair_tensors).collect(),
    );
    let adapter = PeftAdapter::load(dir.path()).unwrap();
    policy.load_merged(&base, &adapter, 1).unwrap();
    // The same prompt again: the prefix cache must not serve the base weights' keys and values.
    let after = check("merged");
    assert_ne!(before.logprobs, after.logprobs);
    assert!(policy.score_tokens(&[]).unwrap().is_empty());
    assert!(policy.score_tokens(&[1]).unwrap().is_empty());
}

#[test]
fn max_weight_diff_compares_the_weights_with_a_checkpoint_folder() {
    let policy = policy();
    let base = policy.base_weights().unwrap();
    let initial = tempfile::tempdir().unwrap();
    policy.save_hf(initial.path()).unwrap();
    assert_eq!(policy.max_weight_diff(initial.path()).unwrap(), 0.0);
    let r = 4;
    let adapter_dir = tempfile::tempdir().unwrap();
    let p = pair(&policy, Q, r, 7);
    write_adapter(adapter_dir.path(), &config(r), pair_tensors(&p));
    let adapter = PeftAdapter::load(adapter_dir.path()).unwrap();
    policy.load_merged(&base, &adapter, 1).unwrap();
    let moved = policy.max_weight_diff(initial.path()).unwrap();
    assert!(moved > 1e-4, "the merge moved no weight: {moved}");
    let merged = tempfile::tempdir().unwrap();
    policy.save_hf(merged.path()).unwrap();
    assert_eq!(policy.max_weight_diff(merged.path()).unwrap(), 0.0);
    assert!(base.bytes() > 0);
}
