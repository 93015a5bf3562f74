//! GGUF import on small files written here with candle's GGUF writer the way llama.cpp's
//! converter writes them (its tensor names, its q/k row order, its tokenizer metadata), and the
//! errors for files it cannot import.

use std::collections::HashMap;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value as Gv};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{DType, Device, Tensor};
use grpo_candle::model::gguf::permute_rotary_rows;
use grpo_candle::model::tokenizer;
use grpo_candle::{Arch, ChatTemplate, PolicyModel, Qwen, QwenConfig, import_gguf};
use serde_json::Value;

fn tiny_config(arch: Arch) -> QwenConfig {
    let mut cfg = QwenConfig::tiny_qwen3(320);
    cfg.arch = arch;
    cfg.hidden_size = 32;
    cfg.intermediate_size = 64;
    cfg.num_attention_heads = 4;
    cfg.num_key_value_heads = 2;
    cfg.head_dim = 8;
    cfg.tie_word_embeddings = arch == Arch::Llama;
    cfg.attention_bias = arch == Arch::Qwen2;
    cfg.initializer_range = 0.3;
    cfg.rope_theta = 100_000.0;
    cfg.rms_norm_eps = 1e-5;
    cfg
}

/// The llama.cpp name of a Hugging Face tensor name.
fn gguf_name(hf: &str) -> String {
    let fixed = [
        ("model.embed_tokens.weight", "token_embd.weight"),
        ("model.norm.weight", "output_norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, g)) = fixed.iter().find(|(h, _)| *h == hf) {
        return g.to_string();
    }
    let rest = hf.strip_prefix("model.layers.").unwrap();
    let (layer, tail) = rest.split_once('.').unwrap();
    let (part, kind) = tail.rsplit_once('.').unwrap();
    let g = match part {
        "input_layernorm" => "attn_norm",
        "post_attention_layernorm" => "ffn_norm",
        "self_attn.q_proj" => "attn_q",
        "self_attn.k_proj" => "attn_k",
        "self_attn.v_proj" => "attn_v",
        "self_attn.o_proj" => "attn_output",
        "self_attn.q_norm" => "attn_q_norm",
        "self_attn.k_norm" => "attn_k_norm",
        "mlp.gate_proj" => "ffn_gate",
        "mlp.up_proj" => "ffn_up",
        "mlp.down_proj" => "ffn_down",
        other => panic!("{other}"),
    };
    format!("blk.{layer}.{g}.{kind}")
}

/// Write `model` and the crate's tiny tokenizer as llama.cpp would, matrices in `dtype`.
/// `tweak` edits the metadata before writing.
fn write_gguf(
    path: &Path,
    model: &Qwen,
    tok: &tokenizers::Tokenizer,
    dtype: GgmlDType,
    tweak: impl FnOnce(&mut Vec<(String, Gv)>),
) {
    let cfg = model.config();
    let arch = match cfg.arch {
        Arch::Llama => "llama",
        Arch::Qwen2 => "qwen2",
        Arch::Qwen3 => "qwen3",
        Arch::Mistral => unreachable!(),
    };
    let doc: Value = serde_json::from_str(&tok.to_string(false).unwrap()).unwrap();
    let vocab = doc["model"]["vocab"].as_object().unwrap();
    let mut tokens = vec![String::new(); tok.get_vocab_size(true)];
    for (t, id) in vocab {
        tokens[id.as_u64().unwrap() as usize] = t.clone();
    }
    let mut types = vec![1i32; tokens.len()];
    for added in doc["added_tokens"].as_array().unwrap() {
        let id = added["id"].as_u64().unwrap() as usize;
        tokens[id] = added["content"].as_str().unwrap().to_string();
        types[id] = if added["special"].as_bool().unwrap() {
            3
        } else {
            4
        };
    }
    let merges: Vec<Gv> = doc["model"]["merges"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| match m {
            Value::Array(p) => Gv::String(format!(
                "{} {}",
                p[0].as_str().unwrap(),
                p[1].as_str().unwrap()
            )),
            Value::String(s) => Gv::String(s.clone()),
            _ => panic!(),
        })
        .collect();
    let u = |v: usize| Gv::U32(v as u32);
    let mut meta: Vec<(String, Gv)> = vec![
        ("general.architecture".into(), Gv::String(arch.into())),
        (format!("{arch}.block_count"), u(cfg.num_hidden_layers)),
        (
            format!("{arch}.context_length"),
            u(cfg.max_position_embeddings),
        ),
        (format!("{arch}.embedding_length"), u(cfg.hidden_size)),
        (
            format!("{arch}.feed_forward_length"),
            u(cfg.intermediate_size),
        ),
        (
            format!("{arch}.attention.head_count"),
            u(cfg.num_attention_heads),
        ),
        (
            format!("{arch}.attention.head_count_kv"),
            u(cfg.num_key_value_heads),
        ),
        (format!("{arch}.attention.key_length"), u(cfg.head_dim)),
        (format!("{arch}.rope.dimension_count"), u(cfg.head_dim)),
        (
            format!("{arch}.rope.freq_base"),
            Gv::F32(cfg.rope_theta as f32),
        ),
        (
            format!("{arch}.attention.layer_norm_rms_epsilon"),
            Gv::F32(cfg.rms_norm_eps as f32),
        ),
        ("tokenizer.ggml.model".into(), Gv::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Gv::String("gpt2".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Gv::Array(tokens.iter().map(|t| Gv::String(t.clone())).collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Gv::Array(types.into_iter().map(Gv::I32).collect()),
        ),
        ("tokenizer.ggml.merges".into(), Gv::Array(merges)),
        (
            "tokenizer.ggml.eos_token_id".into(),
            u(tok.token_to_id(tokenizer::IM_END).unwrap() as usize),
        ),
        ("tokenizer.ggml.add_bos_token".into(), Gv::Bool(false)),
        (
            "tokenizer.chat_template".into(),
            Gv::String(grpo_candle::model::chat_template::CHATML_JINJA.into()),
        ),
    ];
    tweak(&mut meta);
    let mut tensors: Vec<(String, QTensor)> = Vec::new();
    for (name, var) in model.named_vars() {
        let mut t = var.as_tensor().clone();
        if cfg.arch == Arch::Llama && name.contains(".q_proj.") {
            t = permute_rotary_rows(&t, cfg.num_attention_heads).unwrap();
        } else if cfg.arch == Arch::Llama && name.contains(".k_proj.") {
            t = permute_rotary_rows(&t, cfg.num_key_value_heads).unwrap();
        }
        let ty = if t.rank() == 2 { dtype } else { GgmlDType::F32 };
        tensors.push((gguf_name(&name), QTensor::quantize(&t, ty).unwrap()));
    }
    let meta_refs: Vec<(&str, &Gv)> = meta.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> = tensors.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut f = std::fs::File::create(path).unwrap();
    gguf_file::write(&mut f, &meta_refs, &tensor_refs).unwrap();
}

fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
    (a - b)
        .unwrap()
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar()
        .unwrap()
}

#[test]
fn llama_qwen2_and_qwen3_files_import_to_the_same_model() {
    let tok = tokenizer::tiny_tokenizer(48).unwrap();
    let text = "<|im_start|>user\nSELECT 42 FROM t; -- ünïcode ✓<|im_end|>\n<tool_call>";
    for arch in [Arch::Llama, Arch::Qwen2, Arch::Qwen3] {
        let model = Qwen::new_random(&tiny_config(arch), 3, DType::F32, &Device::Cpu).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("tiny.gguf");
        write_gguf(&file, &model, &tok, GgmlDType::F32, |_| {});
        let pm = PolicyModel::load_gguf(&file, DType::F32, &Device::Cpu).unwrap();
        assert_eq!(pm.model.config().arch, arch);
        assert_eq!(pm.model.config().tie_word_embeddings, arch == Arch::Llama);
        assert_eq!(pm.template, ChatTemplate::ChatMl);
        let want = tokenizer::encode(&tok, text).unwrap();
        assert_eq!(
            tokenizer::encode(&pm.tokenizer, text).unwrap(),
            want,
            "{arch:?}"
        );
        let input = Tensor::new(want.as_slice(), &Device::Cpu)
            .unwrap()
            .unsqueeze(0)
            .unwrap();
        let d = max_diff(
            &model.forward_logits(&input).unwrap(),
            &pm.model.forward_logits(&input).unwrap(),
        );
        // F32 storage: the same weights; without undoing the q/k permutation (Llama) the
        // logits would differ at O(1).
        assert!(d < 1e-5, "{arch:?}: {d}");

        // The folder written from it loads through the normal path to the same model.
        let out = dir.path().join("hf");
        let summary = import_gguf(&file, &out, DType::F32).unwrap();
        assert_eq!(summary.arch, arch);
        assert!(summary.chat_template);
        let back = PolicyModel::load_dir(&out, DType::F32, &Device::Cpu).unwrap();
        let d = max_diff(
            &pm.model.forward_logits(&input).unwrap(),
            &back.model.forward_logits(&input).unwrap(),
        );
        assert_eq!(d, 0.0);
        let cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap())
                .unwrap();
        assert_eq!(cfg["architectures"][0], arch.hf_architecture());
    }
}

#[test]
fn quantised_matrices_dequantise_close_to_the_originals() {
    let tok = tokenizer::tiny_tokenizer(16).unwrap();
    let model = Qwen::new_random(&tiny_config(Arch::Llama), 5, DType::F32, &Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("q8.gguf");
    write_gguf(&file, &model, &tok, GgmlDType::Q8_0, |_| {});
    let pm = PolicyModel::load_gguf(&file, DType::F32, &Device::Cpu).unwrap();
    let theirs: HashMap<String, Tensor> = pm
        .model
        .named_vars()
        .into_iter()
        .map(|(n, v)| (n, v.as_tensor().clone()))
        .collect();
    for (name, var) in model.named_vars() {
        let a = var.as_tensor();
        let scale: f32 = a.abs().unwrap().max_all().unwrap().to_scalar().unwrap();
        // Q8_0: 8 bits per block of 32 around its largest magnitude.
        let d = max_diff(a, &theirs[&name]);
        assert!(d <= scale / 127.0 + 1e-6, "{name}: {d} (scale {scale})");
    }
}

fn error_of(file: &Path) -> String {
    PolicyModel::load_gguf(file, DType::F32, &Device::Cpu)
        .unwrap_err()
        .to_string()
}

#[test]
fn unsupported_architectures_and_tokenizers_are_errors_naming_file_and_type() {
    let tok = tokenizer::tiny_tokenizer(16).unwrap();
    let model = Qwen::new_random(&tiny_config(Arch::Llama), 5, DType::F32, &Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &str, Gv, &str); 3] = [
        (
            "falcon.gguf",
            "general.architecture",
            Gv::String("falcon".into()),
            "falcon",
        ),
        (
            "spm.gguf",
            "tokenizer.ggml.model",
            Gv::String("llama".into()),
            "llama",
        ),
        (
            "pre.gguf",
            "tokenizer.ggml.pre",
            Gv::String("deepseek-coder".into()),
            "deepseek-coder",
        ),
    ];
    for (file_name, key, value, shown) in cases {
        let file = dir.path().join(file_name);
        write_gguf(&file, &model, &tok, GgmlDType::F32, |meta| {
            let entry = meta.iter_mut().find(|(k, _)| k == key).unwrap();
            entry.1 = value;
        });
        let err = error_of(&file);
        assert!(
            err.contains(file_name) && err.contains(key) && err.contains(&format!("`{shown}`")),
            "{err}"
        );
    }
    // A mixture of experts.
    let file = dir.path().join("moe.gguf");
    write_gguf(&file, &model, &tok, GgmlDType::F32, |meta| {
        meta.push(("llama.expert_count".into(), Gv::U32(8)));
    });
    let err = error_of(&file);
    assert!(
        err.contains("moe.gguf") && err.contains("llama.expert_count"),
        "{err}"
    );
}

/// A GGUF v3 file with one tensor of a type candle's reader does not know (IQ4_NL, type 20).
#[test]
fn an_unsupported_tensor_type_is_an_error_naming_file_and_type() {
    let mut b: Vec<u8> = Vec::new();
    let string = |b: &mut Vec<u8>, s: &str| {
        b.extend((s.len() as u64).to_le_bytes());
        b.extend(s.as_bytes());
    };
    b.extend(0x46554747u32.to_le_bytes()); // "GGUF"
    b.extend(3u32.to_le_bytes());
    b.extend(1u64.to_le_bytes()); // tensors
    b.extend(1u64.to_le_bytes()); // metadata entries
    string(&mut b, "general.architecture");
    b.extend(8u32.to_le_bytes()); // string
    string(&mut b, "llama");
    string(&mut b, "token_embd.weight");
    b.extend(2u32.to_le_bytes());
    b.extend(32u64.to_le_bytes());
    b.extend(4u64.to_le_bytes());
    b.extend(20u32.to_le_bytes()); // IQ4_NL
    b.extend(0u64.to_le_bytes());
    b.resize(b.len().div_ceil(32) * 32 + 4 * 18, 0);
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("iq4.gguf");
    std::fs::write(&file, &b).unwrap();
    let err = error_of(&file);
    assert!(err.contains("iq4.gguf") && err.contains("IQ4_NL"), "{err}");
    // Not a GGUF file at all.
    let junk = dir.path().join("junk.gguf");
    std::fs::write(&junk, b"not gguf").unwrap();
    let err = error_of(&junk);
    assert!(err.contains("junk.gguf"), "{err}");
}

/// Mutations of a valid file: cut at many lengths, single bit flips at many offsets, and
/// header fields set to hostile values (alignment 0, a zero or huge dimension, a huge tensor
/// offset). Loading each must return (an error naming the file, or a model), never panic.
#[test]
fn mutated_files_are_errors_never_panics() {
    let tok = tokenizer::tiny_tokenizer(16).unwrap();
    let model = Qwen::new_random(&tiny_config(Arch::Qwen3), 7, DType::F32, &Device::Cpu).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.gguf");
    write_gguf(&good, &model, &tok, GgmlDType::F32, |_| {});
    let bytes = std::fs::read(&good).unwrap();
    let file = dir.path().join("mutated.gguf");
    let load = |mutated: &[u8], what: &str| {
        std::fs::write(&file, mutated).unwrap();
        let outcome = std::panic::catch_unwind(|| {
            PolicyModel::load_gguf(&file, DType::F32, &Device::Cpu).map(|_| ())
        });
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) => assert!(
                e.to_string().contains("mutated.gguf"),
                "{what}: the error does not name the file: {e}"
            ),
            Err(_) => panic!("{what}: loading panicked"),
        }
    };
    // Truncations: every length in the header region, then a spread over the data.
    let header_end = 4096.min(bytes.len());
    for len in (0..header_end)
        .step_by(7)
        .chain((header_end..bytes.len()).step_by(997))
    {
        load(&bytes[..len], &format!("cut at {len}"));
    }
    // Bit flips, deterministic offsets over the whole file (denser in the header).
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    for i in 0..400 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let span = if i % 2 == 0 { header_end } else { bytes.len() };
        let at = (state >> 33) as usize % span;
        let bit = (state >> 20) as u8 % 8;
        let mut m = bytes.clone();
        m[at] ^= 1 << bit;
        load(&m, &format!("bit {bit} flipped at {at}"));
    }
    // A tensor whose first dimension claims 2^40 elements: refused before any read, by the
    // extents check.
    let name = b"token_embd.weight";
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("the embedding's tensor info")
        + name.len();
    let mut huge = bytes.clone();
    // After the name: u32 dimension count, then u64 dimensions.
    huge[at + 4..at + 12].copy_from_slice(&(1u64 << 40).to_le_bytes());
    std::fs::write(&file, &huge).unwrap();
    let err = error_of(&file);
    assert!(err.contains("does not fit in the file"), "{err}");
    assert!(err.contains("token_embd.weight"), "{err}");

    // Hostile header values written by the same writer.
    let hostile: Vec<(&str, Gv)> = vec![
        ("general.alignment", Gv::U32(0)),
        ("general.alignment", Gv::U32(3)),
        ("qwen3.embedding_length", Gv::U32(0)),
        ("qwen3.block_count", Gv::U32(0)),
        ("qwen3.attention.head_count", Gv::U32(0)),
        ("qwen3.embedding_length", Gv::U32(u32::MAX)),
        ("qwen3.context_length", Gv::U32(0)),
    ];
    for (key, value) in hostile {
        let path = dir.path().join("mutated.gguf");
        write_gguf(&path, &model, &tok, GgmlDType::F32, |meta| {
            meta.retain(|(k, _)| k != key);
            meta.push((key.to_string(), value.clone()));
        });
        let m = std::fs::read(&path).unwrap();
        load(&m, &format!("{key} = {value:?}"));
    }
}
