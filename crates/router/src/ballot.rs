//! Ballots: one voter's ranking of candidates, its validation and its reading from model text.
//!
//! The paper's voters each rank four distinct candidates ("Inference voting"). A ballot that is
//! not a list of distinct known candidate ids, has the wrong length, or names H0 when H0 is
//! excluded (rescue, Eq. 10) is malformed: the router retries the voter within a budget, then
//! drops the ballot, logs and counts it. Nothing here panics on any input.

use std::collections::BTreeSet;

use harness_core::HarnessId;
use serde::{Deserialize, Serialize};

/// The paper's ballot length: each voter ranks four distinct candidates.
pub const BALLOT_LEN: usize = 4;

/// The longest ballot id the router reads; longer strings are malformed without being copied
/// into logs in full.
const MAX_ID_CHARS: usize = 200;

/// The longest model answer the router reads (bytes); a longer one is malformed. Bounds the
/// work [`extract_json`] does on hostile input.
pub const MAX_ANSWER_BYTES: usize = 256 * 1024;

/// Why a ballot was rejected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(rename_all = "snake_case", tag = "reason")]
#[non_exhaustive]
pub enum BallotError {
    /// The voter's answer held no readable ballot (not JSON, wrong shape).
    #[error("not a ballot: {message}")]
    Unreadable {
        /// What was wrong.
        message: String,
    },
    /// The ballot lists the wrong number of candidates.
    #[error("the ballot lists {got} candidates; expected exactly {expected}")]
    WrongLength {
        /// Listed.
        got: usize,
        /// Required.
        expected: usize,
    },
    /// The ballot names an id that is not a candidate.
    #[error("the ballot names `{id}`, which is not a candidate")]
    Unknown {
        /// The id (cut to 200 characters).
        id: String,
    },
    /// The ballot lists a candidate twice.
    #[error("the ballot lists `{id}` twice; expected distinct candidates")]
    Duplicate {
        /// The repeated id.
        id: String,
    },
    /// The ballot names H0 in rescue mode, where H0 is excluded (Eq. 10).
    #[error("the ballot names the base harness `{id}`, which rescue excludes (Eq. 10)")]
    BaseInRescue {
        /// H0's id.
        id: String,
    },
    /// The voter failed as infrastructure (its endpoint was down after its own retries).
    #[error("the voter failed: {message}")]
    VoterFailed {
        /// The failure.
        message: String,
    },
}

fn cut(id: &str) -> String {
    id.chars().take(MAX_ID_CHARS).collect()
}

/// How the router checks a ballot.
#[derive(Debug, Clone, Copy)]
pub struct BallotRules<'a> {
    /// The ids a ballot may name.
    pub candidates: &'a [HarnessId],
    /// H0's id when it must not appear (rescue mode), else `None`.
    pub excluded_base: Option<&'a HarnessId>,
    /// Exactly how many ids a ballot lists.
    pub len: usize,
}

impl BallotRules<'_> {
    /// The required length for a candidate set: [`BALLOT_LEN`], or every candidate when there
    /// are fewer (a pool of three siblings cannot be ranked four deep).
    pub fn len_for(candidates: usize, ballot_len: usize) -> usize {
        ballot_len.min(candidates)
    }

    /// Check a ballot; the valid ballot as ids, best first.
    pub fn check(&self, ballot: &[String]) -> Result<Vec<HarnessId>, BallotError> {
        let mut seen = BTreeSet::new();
        let mut out = Vec::with_capacity(ballot.len());
        // Identity problems are reported before the length, so a log says which id was wrong.
        for id in ballot {
            if id.chars().count() > MAX_ID_CHARS {
                return Err(BallotError::Unknown { id: cut(id) });
            }
            let id = HarnessId(id.trim().to_string());
            if self.excluded_base == Some(&id) {
                return Err(BallotError::BaseInRescue { id: id.0 });
            }
            if !self.candidates.contains(&id) {
                return Err(BallotError::Unknown { id: id.0 });
            }
            if !seen.insert(id.clone()) {
                return Err(BallotError::Duplicate { id: id.0 });
            }
            out.push(id);
        }
        if out.len() != self.len {
            return Err(BallotError::WrongLength {
                got: out.len(),
                expected: self.len,
            });
        }
        Ok(out)
    }
}

/// Read a ballot from a model's answer: a JSON object `{"ranking": [ids...]}` or a bare JSON
/// array of ids, possibly inside a fenced code block or surrounded by prose.
pub fn parse_ballot_text(text: &str) -> Result<Vec<String>, BallotError> {
    let unreadable = |message: String| BallotError::Unreadable { message };
    let value = extract_json(text).ok_or_else(|| {
        unreadable(format!(
            "no JSON object or array in the answer ({} characters); expected {{\"ranking\": [ids]}}",
            text.chars().count()
        ))
    })?;
    let list = match &value {
        serde_json::Value::Array(list) => list,
        serde_json::Value::Object(map) => match map.get("ranking") {
            Some(serde_json::Value::Array(list)) => list,
            _ => {
                return Err(unreadable(
                    "the JSON object has no `ranking` array; expected {\"ranking\": [ids]}".into(),
                ));
            }
        },
        _ => unreachable!("extract_json returns objects and arrays"),
    };
    list.iter()
        .enumerate()
        .map(|(i, v)| {
            v.as_str().map(str::to_string).ok_or_else(|| {
                unreadable(format!(
                    "ranking[{i}] is not a string; expected harness ids"
                ))
            })
        })
        .collect()
}

/// The first JSON object or array in `text` that parses (fenced blocks and prose around it are
/// skipped).
pub fn extract_json(text: &str) -> Option<serde_json::Value> {
    if text.len() > MAX_ANSWER_BYTES {
        return None;
    }
    let trimmed = text.trim();
    if let Ok(v @ (serde_json::Value::Object(_) | serde_json::Value::Array(_))) =
        serde_json::from_str::<serde_json::Value>(trimmed)
    {
        return Some(v);
    }
    // Try opening brackets in order; a streaming deserializer stops at the end of the first
    // value and ignores what follows. A run of brackets is tried at its start only, and at
    // most `MAX_STARTS` starts are tried, so hostile input costs O(MAX_STARTS * len).
    const MAX_STARTS: usize = 32;
    let mut previous = ' ';
    let mut starts = 0;
    for (at, c) in text.char_indices() {
        let is_open = c == '{' || c == '[';
        let run = previous == '{' || previous == '[';
        previous = c;
        if !is_open || run {
            continue;
        }
        starts += 1;
        if starts > MAX_STARTS {
            return None;
        }
        let mut stream =
            serde_json::Deserializer::from_str(&text[at..]).into_iter::<serde_json::Value>();
        if let Some(Ok(v @ (serde_json::Value::Object(_) | serde_json::Value::Array(_)))) =
            stream.next()
        {
            return Some(v);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(names: &[&str]) -> Vec<HarnessId> {
        names.iter().map(|n| HarnessId(n.to_string())).collect()
    }

    fn strings(names: &[&str]) -> Vec<String> {
        names.iter().map(|n| n.to_string()).collect()
    }

    #[test]
    fn checks_length_identity_duplicates_and_base() {
        let candidates = ids(&["h0", "a", "b", "c", "d"]);
        let base = HarnessId("h0".into());
        let rescue = BallotRules {
            candidates: &candidates,
            excluded_base: Some(&base),
            len: 4,
        };
        assert_eq!(
            rescue.check(&strings(&["a", "b", "c", "d"])).unwrap(),
            ids(&["a", "b", "c", "d"])
        );
        assert_eq!(
            rescue.check(&strings(&["a", "b", "c"])),
            Err(BallotError::WrongLength {
                got: 3,
                expected: 4
            })
        );
        assert!(matches!(
            rescue.check(&strings(&["a", "b", "c", "d", "h0"])),
            Err(BallotError::BaseInRescue { .. })
        ));
        assert!(matches!(
            rescue.check(&strings(&["a", "a", "c", "d"])),
            Err(BallotError::Duplicate { .. })
        ));
        assert!(matches!(
            rescue.check(&strings(&["a", "zz", "c", "d"])),
            Err(BallotError::Unknown { .. })
        ));
        let inference = BallotRules {
            excluded_base: None,
            ..rescue
        };
        assert!(inference.check(&strings(&["h0", "a", "b", "c"])).is_ok());
        assert_eq!(BallotRules::len_for(3, BALLOT_LEN), 3);
    }

    #[test]
    fn reads_ballots_from_prose_fences_and_bare_arrays() {
        assert_eq!(
            parse_ballot_text("Sure!\n```json\n{\"ranking\": [\"a\", \"b\"]}\n```").unwrap(),
            strings(&["a", "b"])
        );
        assert_eq!(parse_ballot_text("[\"x\"]").unwrap(), strings(&["x"]));
        assert!(parse_ballot_text("no json here").is_err());
        assert!(parse_ballot_text("{\"ranking\": [1, 2]}").is_err());
        assert!(parse_ballot_text("{\"order\": []}").is_err());
    }
}
