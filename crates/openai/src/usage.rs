//! Token accounting per pipeline role, for the paper's external-cost table.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use harness_core::Usage;
use serde::{Deserialize, Serialize};

/// What one role (`ChatRequest::purpose`) consumed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestUsage {
    /// Requests that succeeded.
    pub requests: u64,
    /// Requests that failed for good (after retries).
    pub failed_requests: u64,
    /// HTTP attempts, retries included.
    pub attempts: u64,
    /// Prompt tokens the provider reported.
    pub prompt_tokens: u64,
    /// Completion tokens the provider reported.
    pub completion_tokens: u64,
    /// Successful requests whose answer carried no usage block.
    pub requests_without_usage: u64,
}

impl RequestUsage {
    /// Prompt plus completion tokens.
    pub fn total_tokens(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }

    fn add(&mut self, other: &RequestUsage) {
        self.requests += other.requests;
        self.failed_requests += other.failed_requests;
        self.attempts += other.attempts;
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.requests_without_usage += other.requests_without_usage;
    }
}

/// A shared, cloneable ledger of token usage keyed by role. Clones share the same counts, so a
/// run can hand one ledger to several clients and read the totals at the end.
#[derive(Debug, Clone, Default)]
pub struct UsageLedger {
    inner: Arc<Mutex<BTreeMap<String, RequestUsage>>>,
}

impl UsageLedger {
    /// An empty ledger.
    pub fn new() -> Self {
        Self::default()
    }

    fn with<R>(&self, f: impl FnOnce(&mut BTreeMap<String, RequestUsage>) -> R) -> R {
        // A poisoned lock only means another thread panicked mid-update of plain counters.
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut guard)
    }

    /// Record a successful request of `role` that took `attempts` HTTP attempts.
    pub fn record_success(&self, role: &str, usage: Option<Usage>, attempts: u32) {
        self.with(|m| {
            let e = m.entry(role.to_string()).or_default();
            e.requests += 1;
            e.attempts += u64::from(attempts);
            match usage {
                Some(u) => {
                    e.prompt_tokens += u.prompt_tokens;
                    e.completion_tokens += u.completion_tokens;
                }
                None => e.requests_without_usage += 1,
            }
        })
    }

    /// Record a request of `role` that failed after `attempts` attempts.
    pub fn record_failure(&self, role: &str, attempts: u32) {
        self.with(|m| {
            let e = m.entry(role.to_string()).or_default();
            e.failed_requests += 1;
            e.attempts += u64::from(attempts);
        })
    }

    /// The usage of one role (zero when it never asked).
    pub fn role(&self, role: &str) -> RequestUsage {
        self.with(|m| m.get(role).copied().unwrap_or_default())
    }

    /// A copy of every role's usage, sorted by role.
    pub fn snapshot(&self) -> BTreeMap<String, RequestUsage> {
        self.with(|m| m.clone())
    }

    /// The sum over all roles.
    pub fn total(&self) -> RequestUsage {
        self.with(|m| {
            let mut t = RequestUsage::default();
            for u in m.values() {
                t.add(u);
            }
            t
        })
    }

    /// Forget everything (e.g. between phases of a run).
    pub fn reset(&self) {
        self.with(|m| m.clear())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clones_share_counts_and_totals_add_up() {
        let ledger = UsageLedger::new();
        let other = ledger.clone();
        ledger.record_success(
            "editor",
            Some(Usage {
                prompt_tokens: 10,
                completion_tokens: 5,
            }),
            1,
        );
        other.record_success("voter", None, 2);
        other.record_failure("voter", 4);
        assert_eq!(ledger.role("editor").total_tokens(), 15);
        let voter = ledger.role("voter");
        assert_eq!(
            (voter.requests, voter.failed_requests, voter.attempts),
            (1, 1, 6)
        );
        assert_eq!(voter.requests_without_usage, 1);
        assert_eq!(ledger.total().attempts, 7);
        assert_eq!(
            ledger.snapshot().keys().collect::<Vec<_>>(),
            ["editor", "voter"]
        );
    }
}
