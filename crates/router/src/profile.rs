//! Harness Behavior Profiles (paper Eq. 8): for one sibling and one calibration, `prefer` and
//! `avoid` lists of entries `{when, behavior}`, each with the validation tasks supporting it.
//!
//! "Repeated observations are consolidated by task condition and behavior, while useful
//! observations from individual tasks are retained" (Appendix, Table 7): [`consolidate`] merges
//! entries whose condition and behaviour agree (ignoring case and spacing) and unions their
//! support.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// One profile entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    /// The task condition, e.g. "aggregating information across inbox, spam, and archive".
    pub when: String,
    /// The behaviour relative to H0 under that condition.
    pub behavior: String,
    /// The validation task ids supporting it (sorted, distinct).
    pub support: Vec<String>,
}

impl Entry {
    /// An entry; `support` is sorted and deduplicated.
    pub fn new(when: impl Into<String>, behavior: impl Into<String>, support: Vec<String>) -> Self {
        let mut support = support;
        support.sort();
        support.dedup();
        Entry {
            when: when.into(),
            behavior: behavior.into(),
            support,
        }
    }
}

/// A sibling's profile at one calibration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Profile {
    /// Conditions under which the sibling helps the current policy relative to H0.
    pub prefer: Vec<Entry>,
    /// Conditions under which it hinders.
    pub avoid: Vec<Entry>,
}

impl Profile {
    /// No entries.
    pub fn is_empty(&self) -> bool {
        self.prefer.is_empty() && self.avoid.is_empty()
    }

    /// Both lists consolidated.
    pub fn consolidated(self) -> Profile {
        Profile {
            prefer: consolidate(self.prefer),
            avoid: consolidate(self.avoid),
        }
    }

    /// Check the entries: non-empty text, non-empty support, and (when `known_tasks` is given)
    /// support only from those tasks. `field` prefixes the reported path.
    pub fn validate(&self, field: &str, known_tasks: Option<&BTreeSet<String>>) -> Result<()> {
        for (list, entries) in [("prefer", &self.prefer), ("avoid", &self.avoid)] {
            for (i, e) in entries.iter().enumerate() {
                let at = format!("{field}.{list}[{i}]");
                if e.when.trim().is_empty() {
                    return Err(Error::calibration(
                        format!("{at}.when"),
                        "expected a non-empty task condition",
                    ));
                }
                if e.behavior.trim().is_empty() {
                    return Err(Error::calibration(
                        format!("{at}.behavior"),
                        "expected a non-empty behaviour",
                    ));
                }
                if e.support.is_empty() {
                    return Err(Error::calibration(
                        format!("{at}.support"),
                        "expected at least one supporting task id",
                    ));
                }
                if let Some(known) = known_tasks
                    && let Some(bad) = e.support.iter().find(|t| !known.contains(*t))
                {
                    return Err(Error::calibration(
                        format!("{at}.support"),
                        format!("task `{bad}` is not among the calibration's validation tasks"),
                    ));
                }
            }
        }
        Ok(())
    }
}

fn normal(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase()
}

/// Merge entries with the same condition and behaviour (case and spacing ignored; the first
/// spelling is kept), union their support, and order them by support (largest first), then
/// condition, then behaviour.
pub fn consolidate(entries: Vec<Entry>) -> Vec<Entry> {
    let mut merged: BTreeMap<(String, String), Entry> = BTreeMap::new();
    for e in entries {
        let key = (normal(&e.when), normal(&e.behavior));
        match merged.get_mut(&key) {
            Some(existing) => {
                existing.support.extend(e.support);
                existing.support.sort();
                existing.support.dedup();
            }
            None => {
                merged.insert(key, Entry::new(e.when, e.behavior, e.support));
            }
        }
    }
    let mut out: Vec<Entry> = merged.into_values().collect();
    out.sort_by(|a, b| {
        b.support
            .len()
            .cmp(&a.support.len())
            .then_with(|| a.when.cmp(&b.when))
            .then_with(|| a.behavior.cmp(&b.behavior))
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consolidation_merges_by_condition_and_behaviour() {
        let e = |w: &str, b: &str, s: &[&str]| {
            Entry::new(w, b, s.iter().map(|x| x.to_string()).collect())
        };
        let out = consolidate(vec![
            e("mail tasks", "paginates", &["t2"]),
            e("Mail  tasks", "paginates", &["t1", "t2"]),
            e("mail tasks", "submits", &["t3"]),
        ]);
        assert_eq!(out.len(), 2);
        assert_eq!(out[0].support, vec!["t1", "t2"]);
        assert_eq!(out[0].when, "mail tasks");
        assert_eq!(out[1].behavior, "submits");
        let profile = Profile {
            prefer: out,
            avoid: vec![],
        };
        let known: BTreeSet<String> = ["t1", "t2"].iter().map(|s| s.to_string()).collect();
        let err = profile
            .validate("profiles.x", Some(&known))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("profiles.x.prefer[1].support") && err.contains("t3"),
            "{err}"
        );
    }
}
