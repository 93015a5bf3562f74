//! External-model usage per role (`analyst`, `editor`), counted from
//! [`harness_core::ChatResponse::usage`].

use std::collections::BTreeMap;
use std::ops::{Add, Sub};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};

/// What one role spent and how its answers fared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RoleUsage {
    /// Model calls made.
    pub calls: u64,
    /// Prompt tokens the provider reported.
    pub prompt_tokens: u64,
    /// Completion tokens the provider reported.
    pub completion_tokens: u64,
    /// Calls whose response carried no usage (their tokens are unknown, not zero).
    pub calls_without_usage: u64,
    /// Answers rejected as malformed (each one was retried while the budget lasted).
    pub malformed: u64,
    /// Items given up on after the retry budget (or a failed call): skipped, the round went on.
    pub skipped: u64,
    /// Calls the model failed as infrastructure (counted, then skipped like malformed ones).
    pub errors: u64,
}

impl RoleUsage {
    /// Prompt plus completion tokens.
    pub fn total_tokens(&self) -> u64 {
        self.prompt_tokens + self.completion_tokens
    }
}

impl Add for RoleUsage {
    type Output = RoleUsage;
    fn add(self, o: RoleUsage) -> RoleUsage {
        RoleUsage {
            calls: self.calls + o.calls,
            prompt_tokens: self.prompt_tokens + o.prompt_tokens,
            completion_tokens: self.completion_tokens + o.completion_tokens,
            calls_without_usage: self.calls_without_usage + o.calls_without_usage,
            malformed: self.malformed + o.malformed,
            skipped: self.skipped + o.skipped,
            errors: self.errors + o.errors,
        }
    }
}

impl Sub for RoleUsage {
    type Output = RoleUsage;
    fn sub(self, o: RoleUsage) -> RoleUsage {
        RoleUsage {
            calls: self.calls.saturating_sub(o.calls),
            prompt_tokens: self.prompt_tokens.saturating_sub(o.prompt_tokens),
            completion_tokens: self.completion_tokens.saturating_sub(o.completion_tokens),
            calls_without_usage: self
                .calls_without_usage
                .saturating_sub(o.calls_without_usage),
            malformed: self.malformed.saturating_sub(o.malformed),
            skipped: self.skipped.saturating_sub(o.skipped),
            errors: self.errors.saturating_sub(o.errors),
        }
    }
}

/// Usage keyed by role, as the reports print it.
pub type UsageByRole = BTreeMap<String, RoleUsage>;

/// A counter one LLM component updates from concurrent calls.
#[derive(Debug, Default)]
pub struct UsageCell(Mutex<RoleUsage>);

impl UsageCell {
    /// The totals so far.
    pub fn get(&self) -> RoleUsage {
        *self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Change the totals.
    pub fn update(&self, f: impl FnOnce(&mut RoleUsage)) {
        f(&mut self.0.lock().unwrap_or_else(|e| e.into_inner()));
    }
}
