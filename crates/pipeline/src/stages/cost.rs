//! What each stage spent (Table 10): rollouts, wall seconds and external-model tokens per
//! role, written beside the stage's other files as [`STAGE_COST_FILE`] and read back by the
//! report.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{Error, Result, StageExt};

pub use harness_report::layout::{STAGE_COST_FILE, StageCost, Tokens};

/// Write `cost` into `dir` (created when missing) as [`STAGE_COST_FILE`].
pub(crate) fn write(cost: &StageCost, dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::input("cost", dir, e.to_string()))?;
    let text = serde_json::to_string_pretty(cost).unwrap_or_else(|_| unreachable!("plain data"));
    harness_core::fsutil::write_atomic(&dir.join(STAGE_COST_FILE), text.as_bytes()).at("cost")
}

/// The tokens of a router's [`harness_router::TokenCounter`], by role.
pub(crate) fn counted_tokens(counter: &harness_router::TokenCounter) -> BTreeMap<String, Tokens> {
    counter
        .snapshot()
        .into_iter()
        .map(|(role, t)| {
            (
                role,
                Tokens {
                    calls: t.requests,
                    prompt_tokens: t.usage.prompt_tokens,
                    completion_tokens: t.usage.completion_tokens,
                },
            )
        })
        .collect()
}
