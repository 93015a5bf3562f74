//! Loading a checkpoint folder from hostile copies of its files (issue 25 item 5):
//! `model.safetensors` (cut, bit-flipped, its header's numbers, dtypes and length rewritten),
//! `config.json` (huge, zero and negative shapes, nesting bombs) and the tokenizer files
//! (`tokenizer.json`, `tokenizer_config.json`, `generation_config.json`). Every mutant loads or
//! is refused with an error naming the mutated file; none panics, and none makes the loader
//! allocate more than a small multiple of what is on disk.

use std::path::Path;

use candle_core::{DType, Device};
use grpo_candle::model::tokenizer;
use grpo_candle::ops::logprob::LogProbConfig;
use grpo_candle::train::trainer::{Trainer, TrainerConfig};
use grpo_candle::{PolicyModel, TinySpec};
use harness_testkit::mutate::{self, Mutant, MutantOutcome, TrackingAlloc};
use serde_json::{Value, json};

#[global_allocator]
static ALLOC: TrackingAlloc = TrackingAlloc;

/// Heap a load may take beyond a small multiple of the files' size (the tokenizer's tables,
/// the model's bookkeeping).
const BUDGET: usize = 24 << 20;

/// A checkpoint small enough that hundreds of loads take about a second in a debug build.
fn saved_checkpoint(dir: &Path) {
    tiny_policy().save_hf(dir).unwrap();
}

fn tiny_policy() -> PolicyModel {
    let spec = TinySpec {
        num_merges: 8,
        hidden_size: 16,
        num_layers: 1,
        num_heads: 2,
        num_kv_heads: 1,
        head_dim: 8,
        intermediate_size: 16,
        max_position_embeddings: 64,
        tie_word_embeddings: false,
        seed: 3,
    };
    PolicyModel::tiny(&spec, DType::F32, &Device::Cpu).unwrap()
}

/// Load the folder and use what was loaded: a loader that accepts a tokenizer which then
/// panics or pads every prompt to 2^40 tokens has not done its job.
fn load_and_use(dir: &Path) -> Result<(), String> {
    let pm = PolicyModel::load_dir(dir, DType::F32, &Device::Cpu).map_err(|e| e.to_string())?;
    let used = || -> grpo_candle::Result<()> {
        let text = "<|im_start|>user\nSELECT 1; Ünïcode ✓<|im_end|>\n<tool_call>";
        let ids = tokenizer::encode(&pm.tokenizer, text)?;
        tokenizer::decode(&pm.tokenizer, &ids, false)?;
        Ok(())
    };
    // Encoding errors come from the tokenizer library without a file; the mutated file is
    // named here so that `check` judges only panics and memory for them.
    used().map_err(|e| format!("{}: {e}", dir.join("tokenizer.json").display()))
}

/// Write each mutant over `file` in the checkpoint `dir`, load, and check; the valid content
/// is restored afterwards. Returns how many were refused.
fn run(dir: &Path, file: &Path, valid: &[u8], mutants: &[Mutant]) -> usize {
    let on_disk: usize = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().metadata().unwrap().len() as usize)
        .sum();
    let mut refused = 0;
    for Mutant { what, bytes } in mutants {
        assert!(bytes != valid, "{what}: not a mutant");
        std::fs::write(file, bytes).unwrap();
        let budget = BUDGET + 8 * (on_disk + bytes.len());
        if let MutantOutcome::Refused(_) = mutate::check(what, file, budget, || load_and_use(dir)) {
            refused += 1;
        }
    }
    std::fs::write(file, valid).unwrap();
    refused
}

/// The JSON header of a safetensors file and the bytes after it.
fn split_safetensors(bytes: &[u8]) -> (Value, &[u8]) {
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (
        serde_json::from_slice(&bytes[8..8 + n]).unwrap(),
        &bytes[8 + n..],
    )
}

/// A safetensors file from header text and data, with a consistent length prefix.
fn join_safetensors(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

#[test]
fn mutated_safetensors_are_errors_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    saved_checkpoint(dir.path());
    load_and_use(dir.path()).expect("the valid checkpoint loads");
    let file = dir.path().join("model.safetensors");
    let valid = std::fs::read(&file).unwrap();
    let header_end = 8 + u64::from_le_bytes(valid[..8].try_into().unwrap()) as usize;
    let (header, data) = split_safetensors(&valid);
    let header_text = serde_json::to_vec(&header).unwrap();

    let mut mutants = mutate::truncations(&valid, header_end + 64, 11, 30);
    mutants.extend(mutate::bit_flips(&valid, 160, 25, header_end));
    // The header's numbers (shapes, offsets) rewritten, the length prefix kept consistent so
    // that each mutant reaches the checks past the parser.
    for m in mutate::number_swaps(&header_text, 12) {
        mutants.push(Mutant::new(
            format!("header {}", m.what),
            join_safetensors(&m.bytes, data),
        ));
    }
    for m in mutate::json_depth_bombs() {
        mutants.push(Mutant::new(
            format!("header {}", m.what),
            join_safetensors(&m.bytes, data),
        ));
    }
    // The length prefix: past the end of the file, huge, and short by one.
    for (what, n) in [
        ("the file's length", valid.len() as u64),
        ("2^40", 1 << 40),
        ("u64::MAX", u64::MAX),
        ("one short", header_end as u64 - 9),
    ] {
        let mut m = valid.clone();
        m[..8].copy_from_slice(&n.to_le_bytes());
        mutants.push(Mutant::new(format!("header length {what}"), m));
    }
    // Other dtypes: of another size (refused by the reader), of the same size (read, then
    // converted), and the 4- and 6-bit formats candle keeps as raw bytes.
    for dtype in [
        "I32", "U32", "F16", "BF16", "F64", "I64", "U8", "BOOL", "F8_E4M3", "F4", "F6_E2M3", "C64",
        "X9",
    ] {
        let mut h = header.clone();
        h["model.norm.weight"]["dtype"] = json!(dtype);
        mutants.push(Mutant::new(
            format!("model.norm.weight as {dtype}"),
            join_safetensors(&serde_json::to_vec(&h).unwrap(), data),
        ));
    }
    // A tensor claiming 2^40 elements with offsets to match, and one claiming a shape whose
    // element count overflows.
    let norm = header["model.norm.weight"]["data_offsets"].clone();
    for (what, shape, offsets) in [
        (
            "2^40 elements",
            json!([1u64 << 40]),
            json!([norm[0], (1u64 << 42)]),
        ),
        (
            "an overflowing shape",
            json!([u64::MAX, u64::MAX]),
            norm.clone(),
        ),
        ("a zero dimension", json!([0, 16]), norm.clone()),
    ] {
        let mut h = header.clone();
        h["model.norm.weight"]["shape"] = shape;
        h["model.norm.weight"]["data_offsets"] = offsets;
        mutants.push(Mutant::new(
            format!("model.norm.weight with {what}"),
            join_safetensors(&serde_json::to_vec(&h).unwrap(), data),
        ));
    }
    let refused = run(dir.path(), &file, &valid, &mutants);
    assert!(
        refused * 2 > mutants.len(),
        "{refused} of {}",
        mutants.len()
    );

    // Eight tensors of 2^61 - 1 bytes each end 8 bytes short of 2^64: every size is valid on
    // its own, and the reader's end-of-data sum (offsets + 8 + header length) overflows, a
    // panic in a debug build. It must be refused, naming the file.
    let big = (1u64 << 61) - 1;
    let mut h = serde_json::Map::new();
    for i in 0..8u64 {
        h.insert(
            format!("t{i}"),
            json!({"dtype": "U8", "shape": [big], "data_offsets": [i * big, (i + 1) * big]}),
        );
    }
    std::fs::write(
        &file,
        join_safetensors(&serde_json::to_vec(&h).unwrap(), data),
    )
    .unwrap();
    let what = "offsets summing to 2^64 - 8";
    match mutate::check(what, &file, BUDGET, || load_and_use(dir.path())) {
        MutantOutcome::Refused(e) => assert!(e.contains("model.safetensors"), "{e}"),
        MutantOutcome::Loaded => panic!("{what}: loaded"),
    }
    let refused = run(dir.path(), &file, &valid, &mutants);
    assert!(
        refused * 2 > mutants.len(),
        "{refused} of {}",
        mutants.len()
    );
}

#[test]
fn mutated_config_json_is_an_error_never_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    saved_checkpoint(dir.path());
    let file = dir.path().join("config.json");
    let valid = std::fs::read(&file).unwrap();
    let config: Value = serde_json::from_slice(&valid).unwrap();

    let mut mutants = mutate::text_mutants(&valid, 25);
    mutants.extend(mutate::json_depth_bombs());
    let hostile: Vec<(&str, Value)> = vec![
        ("num_hidden_layers", json!(1u64 << 40)),
        ("num_hidden_layers", json!(100_000)),
        ("hidden_size", json!(1u64 << 40)),
        ("hidden_size", json!(u64::MAX)),
        ("vocab_size", json!(1u64 << 40)),
        ("intermediate_size", json!(u64::MAX)),
        ("num_attention_heads", json!(1u64 << 33)),
        ("head_dim", json!(1u64 << 33)),
        ("head_dim", json!(7)),
        ("num_key_value_heads", json!(3)),
        ("max_position_embeddings", json!(u64::MAX)),
        ("rope_theta", json!(-1.0)),
        ("rms_norm_eps", json!(-1e308)),
        ("eos_token_id", json!(1u64 << 32)),
        ("bos_token_id", json!(-1)),
        (
            "rope_scaling",
            json!({"rope_type": "llama3", "factor": 1e308, "low_freq_factor": 1e-308,
                   "high_freq_factor": 1e308, "original_max_position_embeddings": 1e308}),
        ),
        ("sliding_window", json!(u64::MAX)),
        ("torch_dtype", json!("float8")),
    ];
    for (key, value) in hostile {
        let mut c = config.clone();
        c[key] = value.clone();
        mutants.push(Mutant::new(
            format!("{key} = {value}"),
            serde_json::to_vec(&c).unwrap(),
        ));
    }
    let refused = run(dir.path(), &file, &valid, &mutants);
    assert!(
        refused * 2 > mutants.len(),
        "{refused} of {}",
        mutants.len()
    );

    // A configuration describing far more weights than the files hold is refused by its
    // parameter count, before the loader lists 2^40 layers' tensors.
    let mut c = config.clone();
    c["num_hidden_layers"] = json!(1u64 << 40);
    std::fs::write(&file, serde_json::to_vec(&c).unwrap()).unwrap();
    let e = load_and_use(dir.path()).unwrap_err();
    assert!(e.contains("config.json") && e.contains("parameters"), "{e}");
}

#[test]
fn mutated_tokenizer_files_are_errors_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    saved_checkpoint(dir.path());
    let mut refused = 0;
    let mut total = 0;
    for (name, seed) in [
        ("tokenizer.json", 31),
        ("tokenizer_config.json", 32),
        ("generation_config.json", 33),
    ] {
        let file = dir.path().join(name);
        let valid = std::fs::read(&file).unwrap();
        let mut mutants = mutate::truncations(&valid, 512, 9, 24);
        mutants.extend(mutate::bit_flips(&valid, 80, seed, 512));
        mutants.extend(mutate::number_swaps(&valid, 6));
        mutants.extend(mutate::json_depth_bombs());
        if name == "tokenizer.json" {
            let doc: Value = serde_json::from_slice(&valid).unwrap();
            // (what, the JSON pointer of the replaced value, the value)
            let edits: Vec<(&str, &str, Value)> = vec![
                (
                    "padding to 2^40 tokens",
                    "/padding",
                    json!({"strategy": {"Fixed": 1u64 << 40}, "direction": "Right",
                           "pad_to_multiple_of": null, "pad_id": 0, "pad_type_id": 0,
                           "pad_token": "<|endoftext|>"}),
                ),
                (
                    "padding to a multiple of 2^40",
                    "/padding",
                    json!({"strategy": "BatchLongest", "direction": "Left",
                           "pad_to_multiple_of": 1u64 << 40, "pad_id": 0, "pad_type_id": 0,
                           "pad_token": "<|endoftext|>"}),
                ),
                (
                    "truncation with a stride past the length",
                    "/truncation",
                    json!({"direction": "Right", "max_length": 4, "strategy": "LongestFirst",
                           "stride": 1u64 << 40}),
                ),
                (
                    "an added token with id u32::MAX",
                    "/added_tokens/0/id",
                    json!(u32::MAX),
                ),
                (
                    "a vocabulary id past the model's vocabulary",
                    "/model/vocab/a",
                    json!(1u64 << 31),
                ),
                (
                    "a merge of unknown tokens",
                    "/model/merges/0",
                    json!("zzz qqq"),
                ),
                (
                    "a WordPiece decoder",
                    "/decoder",
                    json!({"type": "WordPiece", "prefix": "##", "cleanup": true}),
                ),
                (
                    "an empty unigram model",
                    "/model",
                    json!({"type": "Unigram", "unk_id": 5, "vocab": [], "byte_fallback": true}),
                ),
                (
                    "a wordpiece model with a huge word limit",
                    "/model",
                    json!({"type": "WordPiece", "unk_token": "[UNK]",
                           "continuing_subword_prefix": "##",
                           "max_input_chars_per_word": u64::MAX, "vocab": {"a": 0}}),
                ),
            ];
            for (what, pointer, value) in edits {
                let mut d = doc.clone();
                *d.pointer_mut(pointer)
                    .unwrap_or_else(|| panic!("{pointer}")) = value;
                mutants.push(Mutant::new(what, serde_json::to_vec(&d).unwrap()));
            }
        }
        total += mutants.len();
        refused += run(dir.path(), &file, &valid, &mutants);
    }
    assert!(refused * 2 > total, "{refused} of {total}");
}

#[test]
fn mutated_trainer_state_is_an_error_never_a_panic() {
    // A training checkpoint: the optimizer's moments and the trainer's state beside the model.
    let pm = tiny_policy();
    let dir = tempfile::tempdir().unwrap();
    let ckpt = dir.path().join("step-1");
    Trainer::new(&pm.model, TrainerConfig::default())
        .unwrap()
        .save_checkpoint(&ckpt, |_| Ok(()))
        .unwrap();
    let resume = || Trainer::resume(&pm.model, &ckpt, LogProbConfig::default());
    resume().expect("the valid trainer state loads");
    let mut refused = 0;
    let mut total = 0;
    for name in ["optimizer.safetensors", "trainer_state.json"] {
        let file = ckpt.join(name);
        let valid = std::fs::read(&file).unwrap();
        let mut mutants = mutate::truncations(&valid, 1024, 13, 24);
        mutants.extend(mutate::bit_flips(&valid, 80, 41, 1024));
        mutants.extend(
            mutate::number_swaps(&valid[..valid.len().min(1024)], 6)
                .into_iter()
                .map(|m| {
                    let mut bytes = m.bytes;
                    bytes.extend_from_slice(&valid[valid.len().min(1024)..]);
                    Mutant::new(m.what, bytes)
                }),
        );
        for Mutant { what, bytes } in &mutants {
            assert!(bytes != &valid, "{what}: not a mutant");
            std::fs::write(&file, bytes).unwrap();
            total += 1;
            let budget = BUDGET + 8 * (valid.len() + bytes.len());
            if let MutantOutcome::Refused(_) = mutate::check(what, &file, budget, resume) {
                refused += 1;
            }
        }
        std::fs::write(&file, &valid).unwrap();
    }
    assert!(refused * 2 > total, "{refused} of {total}");
}
