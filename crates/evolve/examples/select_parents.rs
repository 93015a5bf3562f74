//! Parent selection (paper Eq. 3) from the command line.
//!
//! Reads `{"b": n, "solved": {id: [task ids]}}` on stdin and prints
//! `{"parents": [ids], "covered": n}`: at most `b` candidates whose union of solved tasks is
//! largest (exact for small inputs, greedy with the (1 - 1/e) bound for large ones; the bound
//! goes to stderr).
//!
//! ```text
//! echo '{"b": 2, "solved": {"A": ["1","2","3"], "B": ["1","2"], "C": ["4"]}}' \
//!   | cargo run -p harness-evolve --example select_parents
//! {"parents":["A","C"],"covered":4}
//! ```

use std::io::Read;

use anyhow::Context;
use harness_evolve::{CoverInstance, CoverMethod};

fn main() -> anyhow::Result<()> {
    let mut input = String::new();
    std::io::stdin()
        .read_to_string(&mut input)
        .context("reading the instance from stdin")?;
    let instance = CoverInstance::from_json(&input).context("stdin")?;
    let cover = instance.solve();
    if cover.method == CoverMethod::Greedy {
        eprintln!(
            "greedy selection (instance too large for the exact search): covered {} >= (1 - 1/e) x optimum, so the optimum is at most {}",
            cover.covered,
            cover.optimum_at_most.unwrap_or(cover.covered)
        );
    }
    // Written by hand so the keys keep the documented order.
    println!(
        "{{\"parents\":{},\"covered\":{}}}",
        serde_json::to_string(&cover.parents)?,
        cover.covered
    );
    Ok(())
}
