//! A small byte-level BPE tokenizer fitted to the environment's text, so that tool-call syntax,
//! SQL keywords, table and column names and common values are a few tokens each.

use grpo_candle::model::tokenizer::{ADDED_TOKENS, SPECIAL_TOKENS};
use tokenizers::models::TrainerWrapper;
use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use crate::error::{Error, Result};

/// Fit a byte-level BPE tokenizer of about `vocab_size` tokens (the 256 byte symbols, learned
/// merges, then the ChatML special tokens and the tool/think markers, as grpo-candle's built-in
/// tokenizer has) on `texts`, in their order. Every string round-trips; the fit is
/// deterministic in `texts`.
///
/// `constant_blocks` are long texts that every prompt holds verbatim (the tool list the chat
/// template renders): each becomes one added token, so that a few hundred tokens of text the
/// policy never needs to read cost one position. Text that differs from a block by one
/// character is tokenized by the merges as usual.
pub fn fit_tokenizer(
    texts: &[String],
    vocab_size: usize,
    constant_blocks: &[String],
) -> Result<Tokenizer> {
    let mut markers: Vec<&str> = constant_blocks.iter().map(String::as_str).collect();
    markers.extend(SPECIAL_TOKENS.iter().chain(&ADDED_TOKENS).copied());
    // Special and added tokens are matched before the model runs; keep them out of the merges.
    let cleaned: Vec<String> = texts
        .iter()
        .map(|t| {
            let mut t = t.clone();
            for m in &markers {
                t = t.replace(m, "\n");
            }
            t
        })
        .collect();
    let trainable = vocab_size.saturating_sub(markers.len()).max(257);
    let trainer = BpeTrainerBuilder::new()
        .vocab_size(trainable)
        .min_frequency(2)
        .show_progress(false)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut trainer = TrainerWrapper::BpeTrainer(trainer);
    let mut tok = Tokenizer::new(BPE::default());
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::new(false, true, true)));
    tok.train(&mut trainer, cleaned.iter())
        .map_err(|e| Error::Tokenizer(format!("fitting the BPE merges: {e}")))?;
    tok.add_special_tokens(SPECIAL_TOKENS.map(|t| AddedToken::from(t, true)))
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    tok.add_tokens(ADDED_TOKENS.map(|t| AddedToken::from(t, false)))
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    let blocks: Vec<AddedToken> = constant_blocks
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| AddedToken::from(b.clone(), false))
        .collect();
    tok.add_tokens(blocks)
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    Ok(tok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fitted_tokenizer_round_trips_and_is_deterministic() {
        let texts: Vec<String> = (0..50)
            .map(|i| format!("<|im_start|>assistant\n<tool_call>\n{{\"name\":\"execute_sql\",\"arguments\":{{\"query\":\"SELECT `Goals for` FROM `League Table` WHERE x = {i}\"}}}}\n</tool_call><|im_end|>"))
            .collect();
        let block = "# Tools\nA long block\n<tool_call>x</tool_call>".to_string();
        let a = fit_tokenizer(&texts, 400, std::slice::from_ref(&block)).unwrap();
        let b = fit_tokenizer(&texts, 400, std::slice::from_ref(&block)).unwrap();
        let with_block = format!("system {block} rest");
        let ids = a.encode(with_block.as_str(), false).unwrap();
        assert!(ids.get_ids().contains(&a.token_to_id(&block).unwrap()));
        assert_eq!(a.decode(ids.get_ids(), false).unwrap(), with_block);
        assert_eq!(a.to_string(false).unwrap(), b.to_string(false).unwrap());
        let text = &texts[7];
        let ids = a.encode(text.as_str(), false).unwrap();
        assert_eq!(a.decode(ids.get_ids(), false).unwrap(), *text);
        assert!(
            ids.get_ids().len() < text.len() / 3,
            "{}",
            ids.get_ids().len()
        );
        assert!(a.token_to_id("<|im_end|>").is_some());
        assert!(a.token_to_id("<tool_call>").is_some());
    }
}
