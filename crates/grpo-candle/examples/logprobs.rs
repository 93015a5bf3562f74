//! Per-token log-probs of a text under a model.
//!
//! ```text
//! cargo run -p grpo-candle --example logprobs -- <model_dir | owner/name> <text>
//! ```
//!
//! Tokenizes `text` with the model's tokenizer (no special tokens added) and prints a JSON array
//! with one object `{"token_id", "token", "logprob"}` for every token after the first: its
//! log-probability given the tokens before it. A folder is loaded as an HF checkpoint; anything
//! else that looks like `owner/name` is fetched through the hub cache (`HF_HUB_OFFLINE=1` keeps
//! it offline; needs `--features hub`).

use anyhow::bail;
use candle_core::{DType, Device, Tensor};
use grpo_candle::PolicyModel;
use grpo_candle::model::token_logprobs;

/// One output row (fields in this order).
#[derive(serde::Serialize)]
struct Row {
    token_id: u32,
    token: String,
    logprob: f32,
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [model, text] = args.as_slice() else {
        bail!("usage: logprobs <model_dir | owner/name> <text>");
    };
    let device = Device::Cpu;
    let pm = if std::path::Path::new(model).is_dir() {
        PolicyModel::load_dir(model, DType::F32, &device)?
    } else {
        load_hub(model, &device)?
    };
    let ids = grpo_candle::model::tokenizer::encode(&pm.tokenizer, text)?;
    if ids.len() < 2 {
        println!("[]");
        return Ok(());
    }
    let input = Tensor::new(ids.as_slice(), &device)?.unsqueeze(0)?;
    let logits = pm.model.forward_logits(&input)?.squeeze(0)?;
    let targets = Tensor::new(&ids[1..], &device)?;
    let lp: Vec<f32> = token_logprobs(&logits.narrow(0, 0, ids.len() - 1)?, &targets)?.to_vec1()?;
    let rows: Vec<Row> = ids[1..]
        .iter()
        .zip(&lp)
        .map(|(&token_id, &logprob)| Row {
            token_id,
            token: pm.tokenizer.id_to_token(token_id).unwrap_or_default(),
            logprob,
        })
        .collect();
    println!("{}", serde_json::to_string(&rows)?);
    Ok(())
}

/// `model` as a hub repository (downloaded, or from the cache under `HF_HUB_OFFLINE=1`).
#[cfg(feature = "hub")]
fn load_hub(model: &str, device: &Device) -> anyhow::Result<PolicyModel> {
    use anyhow::Context;
    let offline = grpo_candle::model::loading::offline_from_env(std::env::var("HF_HUB_OFFLINE"));
    let files = grpo_candle::ModelFiles::from_hub_blocking(model, None, offline)
        .with_context(|| format!("`{model}` is not a folder; tried it as a hub repository"))?;
    Ok(PolicyModel::load(&files, DType::F32, device)?)
}

/// Without the `hub` feature a model must be a folder.
#[cfg(not(feature = "hub"))]
fn load_hub(model: &str, _device: &Device) -> anyhow::Result<PolicyModel> {
    bail!("`{model}` is not a folder; hub ids need `--features hub`")
}
