//! Aggregate ballots as the router does (paper Eq. 9: weights 1, 3/4, 1/2, 1/4; ties by
//! validation success, then id) and print the Top-K.
//!
//! ```text
//! echo '{"candidates": ["a","b","c","d","e"], "validation_success": {"e": 0.9},
//!        "ballots": [["a","b","c","d"], ["b","a","d","c"], ["a","a","b","c"]], "k": 3}' \
//!   | cargo run -p harness-router --example aggregate_ballots
//! {"ranking":[{"id":"a","score":1.75},{"id":"b","score":1.75},{"id":"c","score":0.75}],"dropped_ballots":1,"filled":[]}
//! ```
//!
//! A ballot is malformed (dropped and counted) unless it lists exactly four distinct
//! candidates (every candidate when there are fewer than four).

use std::collections::BTreeMap;
use std::io::Read;

use anyhow::{Context, bail};
use harness_core::HarnessId;
use harness_router::{BALLOT_LEN, BallotRules, RankWeights, aggregate, top_k};
use serde_json::{Value, json};

fn main() -> anyhow::Result<()> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("reading stdin")?;
    let input: Value = serde_json::from_str(&text).context("stdin is not JSON")?;
    let candidates: Vec<HarnessId> = serde_json::from_value(input["candidates"].clone())
        .context("`candidates`: expected an array of ids")?;
    let validation_success: BTreeMap<HarnessId, f64> = serde_json::from_value(
        input
            .get("validation_success")
            .cloned()
            .unwrap_or(json!({})),
    )
    .context("`validation_success`: expected an object of id -> rate")?;
    let Some(k) = input["k"].as_u64() else {
        bail!("`k`: expected a positive integer");
    };
    let Some(raw_ballots) = input["ballots"].as_array() else {
        bail!("`ballots`: expected an array of ballots");
    };
    let rules = BallotRules {
        candidates: &candidates,
        excluded_base: None,
        len: BallotRules::len_for(candidates.len(), BALLOT_LEN),
    };
    let mut ballots = Vec::new();
    let mut dropped = 0;
    for (i, raw) in raw_ballots.iter().enumerate() {
        let checked = serde_json::from_value::<Vec<String>>(raw.clone())
            .map_err(|_| "not an array of ids".to_string())
            .and_then(|b| rules.check(&b).map_err(|e| e.to_string()));
        match checked {
            Ok(b) => ballots.push(b),
            Err(e) => {
                dropped += 1;
                eprintln!("ballot {i} dropped: {e}");
            }
        }
    }
    let ranking = aggregate(
        &candidates,
        &validation_success,
        &ballots,
        &RankWeights::default(),
    );
    let selection = top_k(ranking, k as usize, None)?;
    let scores: BTreeMap<&HarnessId, f64> =
        selection.ranking.iter().map(|s| (&s.id, s.score)).collect();
    let out = json!({
        "ranking": selection.ids.iter().map(|id| json!({"id": id, "score": scores[id]})).collect::<Vec<_>>(),
        "dropped_ballots": dropped,
        "filled": selection.filled,
    });
    println!("{out}");
    Ok(())
}
