//! Import a GGUF file (llama.cpp's format: Llama, Qwen2 or Qwen3 dense decoders, any
//! quantisation candle reads) as a Hugging Face checkpoint folder that `PolicyModel::load_dir`,
//! transformers and vLLM load.
//!
//! ```text
//! cargo run --release -p grpo-candle --example import_gguf -- <file.gguf> <out_dir> [f32|bf16|f16]
//! ```
//!
//! The weights are dequantised (default: bf16 in the folder); the tokenizer is rebuilt from the
//! file's metadata and the chat template copied into `tokenizer_config.json`.

use std::path::PathBuf;

use anyhow::{Context, bail};
use candle_core::DType;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (gguf, out, dtype) = match args.as_slice() {
        [g, o] => (PathBuf::from(g), PathBuf::from(o), DType::BF16),
        [g, o, d] => {
            let dtype = match d.as_str() {
                "f32" => DType::F32,
                "bf16" => DType::BF16,
                "f16" => DType::F16,
                other => bail!("dtype `{other}`: expected f32, bf16 or f16"),
            };
            (PathBuf::from(g), PathBuf::from(o), dtype)
        }
        _ => bail!("usage: import_gguf <file.gguf> <out_dir> [f32|bf16|f16]"),
    };
    let summary = grpo_candle::import_gguf(&gguf, &out, dtype)
        .with_context(|| format!("importing {}", gguf.display()))?;
    let types: Vec<String> = summary
        .tensor_types
        .iter()
        .map(|(t, n)| format!("{n} {t}"))
        .collect();
    println!(
        "{}: {} decoder, {} parameters, {} tokens, tensors {}{}; written to {} in {:?}",
        gguf.display(),
        summary.arch.hf_architecture(),
        summary.parameters,
        summary.vocab_size,
        types.join(", "),
        if summary.chat_template {
            ", with its chat template"
        } else {
            ""
        },
        out.display(),
        summary.dtype,
    );
    Ok(())
}
