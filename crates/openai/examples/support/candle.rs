//! Shared by the `serve` and `load` examples and the candle-backed tests: the library's
//! candle adapters (feature `candle`) and a loader for `tiny[:seed]` or a checkpoint folder.

#![allow(dead_code, unused_imports)]

use candle_core::{DType, Device};
use grpo_candle::PolicyModel;
pub use harness_openai::candle::{CandleEncoder, CandleGenerator, CandleLoader};

/// Load `dir`, or create the tiny seeded policy when `dir` is `tiny` or `tiny:<seed>`.
pub fn load_model(dir: &str) -> anyhow::Result<PolicyModel> {
    if let Some(rest) = dir.strip_prefix("tiny") {
        let seed = rest.strip_prefix(':').map_or(Ok(0), str::parse)?;
        let spec = grpo_candle::TinySpec {
            seed,
            ..grpo_candle::TinySpec::default()
        };
        return Ok(PolicyModel::tiny(&spec, DType::F32, &Device::Cpu)?);
    }
    Ok(PolicyModel::load_dir(dir, DType::F32, &Device::Cpu)?)
}
