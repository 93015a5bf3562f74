//! External tokens per role (`profiler`, `voter`), counted from each [`ChatResponse::usage`]
//! so the router needs no HTTP client to report its cost (paper Table 10's API tokens).
//!
//! [`ChatResponse::usage`]: harness_core::ChatResponse::usage

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use harness_core::Usage;
use serde::{Deserialize, Serialize};

/// What one role spent.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleTokens {
    /// Chat requests answered.
    pub requests: u64,
    /// Answers without a usage block.
    pub requests_without_usage: u64,
    /// Prompt and completion tokens the provider reported.
    pub usage: Usage,
}

/// A shared, cloneable counter of tokens by role (clones share counts).
#[derive(Debug, Clone, Default)]
pub struct TokenCounter {
    inner: Arc<Mutex<BTreeMap<String, RoleTokens>>>,
}

impl TokenCounter {
    /// An empty counter.
    pub fn new() -> Self {
        Self::default()
    }

    /// Count one answered request of `role`.
    pub fn record(&self, role: &str, usage: Option<Usage>) {
        // A poisoned lock only means another thread panicked mid-update of plain counters.
        let mut map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map.entry(role.to_string()).or_default();
        entry.requests += 1;
        match usage {
            Some(u) => {
                entry.usage.prompt_tokens += u.prompt_tokens;
                entry.usage.completion_tokens += u.completion_tokens;
            }
            None => entry.requests_without_usage += 1,
        }
    }

    /// One role's totals.
    pub fn role(&self, role: &str) -> RoleTokens {
        let map = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        map.get(role).copied().unwrap_or_default()
    }

    /// Every role's totals.
    pub fn snapshot(&self) -> BTreeMap<String, RoleTokens> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

/// `a - b`, saturating (the tokens spent between two snapshots).
pub fn usage_delta(a: Usage, b: Usage) -> Usage {
    Usage {
        prompt_tokens: a.prompt_tokens.saturating_sub(b.prompt_tokens),
        completion_tokens: a.completion_tokens.saturating_sub(b.completion_tokens),
    }
}
