//! Create the embedded default's tiny Qwen3 policy from a seed, save it in Hugging Face format and
//! sample one turn from it.
//!
//! ```text
//! cargo run -p grpo-candle --example tiny_policy -- <out_dir> [seed]
//! ```

use anyhow::bail;
use candle_core::{DType, Device};
use grpo_candle::{CandlePolicy, PolicyModel, PolicyOptions, TinySpec};
use harness_core::{ChatMessage, PolicyRequest, SamplingParams, ToolSpec};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (out, seed) = match args.as_slice() {
        [out] => (out.clone(), 0),
        [out, seed] => (out.clone(), seed.parse()?),
        _ => bail!("usage: tiny_policy <out_dir> [seed]"),
    };
    let spec = TinySpec {
        seed,
        ..TinySpec::default()
    };
    let model = PolicyModel::tiny(&spec, DType::F32, &Device::Cpu)?;
    model.save_hf(&out)?;
    println!(
        "saved a {}-parameter tiny Qwen3 policy to {out}",
        model.model.config().num_parameters()
    );
    let policy = CandlePolicy::new(model, PolicyOptions::default());
    let turn = policy.generate_blocking(PolicyRequest {
        messages: vec![
            ChatMessage::system("Answer with a tool call."),
            ChatMessage::user("How many users?"),
        ],
        tools: vec![ToolSpec::new(
            "execute_sql",
            "Run one SQL query.",
            serde_json::json!({"type": "object", "properties": {"query": {"type": "string"}}}),
        )],
        max_new_tokens: 24,
        max_context_tokens: 4096,
        sampling: SamplingParams::default(),
        seed,
    })?;
    println!(
        "prompt {} tokens; generated {} tokens ({:?}), mean log-prob {:.3}: {:?}",
        turn.context_tokens.len(),
        turn.tokens.len(),
        turn.finish,
        turn.logprobs.iter().sum::<f32>() / turn.logprobs.len().max(1) as f32,
        turn.text
    );
    Ok(())
}
