//! Print a few warm-start demonstrations as the student sees them (its own tokens, decoded),
//! with token counts: a way to check what the warm start plants and how long contexts are.
//!
//! ```sh
//! cargo run -p harness-warmstart --release --example show_demos -- 6
//! ```

use anyhow::Result;
use harness_warmstart::{WarmStartSettings, demonstrations};

fn main() -> Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(4);
    let settings = WarmStartSettings {
        demo_tasks: 400,
        ..WarmStartSettings::default()
    };
    let (model, demos) = futures::executor::block_on(demonstrations(&settings, &mut |_| {}))?;
    for d in demos.iter().take(n) {
        let t = &d.trajectory;
        let last = t.turns.last().expect("a turn");
        let mut ids = last.context_tokens.clone();
        ids.extend(&last.tokens);
        let text = model
            .tokenizer
            .decode(&ids, false)
            .map_err(anyhow::Error::msg)?;
        let first = &t.turns[0].context_tokens;
        println!(
            "==== {} under {} ({}; reward {}; {} tokens, first context {}, policy tokens {:?})\n{text}\n",
            t.task_id,
            d.harness,
            d.family,
            t.outcome.reward,
            ids.len(),
            first.len(),
            t.turns.iter().map(|x| x.tokens.len()).collect::<Vec<_>>()
        );
    }
    Ok(())
}
