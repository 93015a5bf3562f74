//! Aggregate ballots as the router does (paper Eq. 9: weights 1, 3/4, 1/2, 1/4; unlisted
//! candidates 0; ties by validation success, then id) and print the Top-K as JSON.
//!
//! ```text
//! echo '{"candidates": ["a","b","c","d","e"], "validation_success": {"b": 0.5, "e": 0.9},
//!        "ballots": [["a","b","c","d"], ["b","a","d","c"], ["a","a","b","c"]], "k": 3}' \
//!   | cargo run -p harness-router --example aggregate_ballots
//! {"dropped_ballots":1,"filled":[],"ranking":[{"id":"b","score":1.75},{"id":"a","score":1.75},{"id":"c","score":0.75}]}
//! ```
//!
//! A ballot is malformed (dropped and counted) unless it lists exactly four distinct known
//! candidates (every candidate when there are fewer than four). When fewer than `k`
//! candidates got a vote, the rest are filled by validation success, then id, and listed
//! under `filled`.

use std::io::Read;

use anyhow::Context;

fn main() -> anyhow::Result<()> {
    let mut text = String::new();
    std::io::stdin()
        .read_to_string(&mut text)
        .context("reading stdin")?;
    let input: serde_json::Value = serde_json::from_str(&text).context("stdin is not JSON")?;
    let output = harness_router::aggregate::aggregate_json(&input)?;
    println!("{output}");
    Ok(())
}
