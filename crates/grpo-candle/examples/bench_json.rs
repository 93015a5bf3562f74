//! What JSON-constrained decoding costs a decoding batch: building the token-byte table
//! ([`JsonVocab::new`], once per generator since the server keeps it) and masking one row's
//! logits ([`JsonVocab::mask`], once per JSON row and step), inside a string of an object.
//!
//! ```text
//! cargo run --release -p grpo-candle --example bench_json -- [--tokenizer tokenizer.json]
//! ```
//! Without `--tokenizer` the built-in byte-level BPE is used. Prints one JSON line with the
//! medians of 5 runs in milliseconds.

use std::time::Instant;

use grpo_candle::sample::json::{JsonState, JsonVocab};

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let tokenizer = match args.iter().position(|a| a == "--tokenizer") {
        Some(i) => {
            let path = args
                .get(i + 1)
                .ok_or_else(|| anyhow::anyhow!("--tokenizer needs a tokenizer.json path"))?;
            grpo_candle::model::tokenizer::load_tokenizer(std::path::Path::new(path))?
        }
        None => grpo_candle::model::tokenizer::tiny_tokenizer(400)?,
    };
    let vocab_size = tokenizer.get_vocab_size(true);
    let mut state = JsonState::new();
    anyhow::ensure!(state.feed(br#"{"prefer": [{"when": "the task"#));
    let (mut build, mut mask) = (Vec::new(), Vec::new());
    let mut allowed = 0;
    for _ in 0..5 {
        let t = Instant::now();
        let vocab = JsonVocab::new(&tokenizer, vocab_size);
        build.push(t.elapsed().as_secs_f64() * 1e3);
        let mut logits = vec![0.0f32; vocab_size];
        let t = Instant::now();
        allowed = vocab.mask(&state, &[], &mut logits);
        mask.push(t.elapsed().as_secs_f64() * 1e3);
    }
    println!(
        "{}",
        serde_json::json!({
            "vocab": vocab_size, "allowed_in_string": allowed,
            "build_ms": median(build), "mask_ms": median(mask),
        })
    );
    Ok(())
}
