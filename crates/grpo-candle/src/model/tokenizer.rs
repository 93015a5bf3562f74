//! Tokenizer helpers: loading `tokenizer.json`, special-token lookup, and a small byte-level BPE
//! tokenizer built in code for the embedded default policy (no files, no network).

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use tokenizers::models::bpe::BPE;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer};

use crate::error::{Error, Result};

/// ChatML turn start.
pub const IM_START: &str = "<|im_start|>";
/// ChatML turn end (the end-of-turn stop token).
pub const IM_END: &str = "<|im_end|>";
/// End of text (the pad/eos token of Qwen base models).
pub const END_OF_TEXT: &str = "<|endoftext|>";

/// Special tokens (removed when decoding the generated text).
pub const SPECIAL_TOKENS: [&str; 3] = [END_OF_TEXT, IM_START, IM_END];
/// Added, non-special tokens (kept in decoded text, as in Qwen's tokenizer).
pub const ADDED_TOKENS: [&str; 6] = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<think>",
    "</think>",
];

/// Read a `tokenizer.json`.
///
/// Its `padding` and `truncation` are dropped (with a warning): the policy encodes whole
/// conversations one at a time and counts their tokens itself, so a pad to a fixed length (the
/// file may ask for 2^40 tokens) or a silent cut would only corrupt prompts. A malformed file is
/// an error naming it, never a panic inside the tokenizers crate.
pub fn load_tokenizer(path: &Path) -> Result<Tokenizer> {
    let named = |e: &dyn std::fmt::Display| Error::Tokenizer(format!("{}: {e}", path.display()));
    let mut tok = crate::model::loading::guarded(path, "tokenizers", "the tokenizer", || {
        Tokenizer::from_file(path)
    })?
    .map_err(|e| named(&e))?;
    if tok.get_padding().is_some() || tok.get_truncation().is_some() {
        tracing::warn!(
            file = %path.display(),
            "the tokenizer's padding and truncation are ignored: prompts are encoded whole"
        );
        tok.with_padding(None);
        tok.with_truncation(None).map_err(|e| named(&e))?;
    }
    Ok(tok)
}

/// Check that every id `tokenizer` can produce indexes a model vocabulary of `vocab_size` rows
/// (`path` names the tokenizer in the error): an id past the embedding would fail, or worse,
/// deep inside a forward pass.
pub fn check_vocab_fits(tokenizer: &Tokenizer, vocab_size: usize, path: &Path) -> Result<()> {
    let vocab = tokenizer.get_vocab(true);
    let Some((token, &id)) = vocab.iter().max_by_key(|(_, id)| **id) else {
        return Ok(());
    };
    if (id as usize) < vocab_size {
        return Ok(());
    }
    let field = if tokenizer.get_added_tokens_decoder().contains_key(&id) {
        "added_tokens"
    } else {
        "model.vocab"
    };
    Err(Error::config(
        path,
        field,
        format!(
            "token {token:?} has id {id}; expected ids below the model's vocab_size, {vocab_size}"
        ),
    ))
}

/// Encode text without adding BOS/EOS (Qwen adds none); special-token strings in `text` become
/// their ids.
pub fn encode(tokenizer: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    let enc = tokenizer
        .encode(text, false)
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    Ok(enc.get_ids().to_vec())
}

/// Decode ids; `skip_special` drops special tokens such as `<|im_end|>`.
pub fn decode(tokenizer: &Tokenizer, ids: &[u32], skip_special: bool) -> Result<String> {
    tokenizer
        .decode(ids, skip_special)
        .map_err(|e| Error::Tokenizer(e.to_string()))
}

/// The id of a token the tokenizer must have.
pub fn token_id(tokenizer: &Tokenizer, token: &str) -> Result<u32> {
    tokenizer
        .token_to_id(token)
        .ok_or_else(|| Error::Tokenizer(format!("the tokenizer has no `{token}` token")))
}

/// GPT-2's reversible byte -> printable char map used by byte-level BPE: printable Latin-1 bytes
/// map to themselves, the rest to code points from U+0100 upwards.
pub fn byte_to_char() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next = 256u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        let c = if printable {
            b
        } else {
            let c = next;
            next += 1;
            c
        };
        table[b as usize] = char::from_u32(c).expect("valid code point");
    }
    table
}

/// Text the embedded tokenizer learns its merges from: the shapes an agent policy reads and writes
/// (ChatML prose, tool calls, JSON, SQL, shell).
const MERGE_CORPUS: &str = r#"You are a helpful assistant. Use the tools to solve the task, then give the final answer.
The user asks a question about the database. Call a tool when you need information.
<tool_call>
{"name": "execute_sql", "arguments": {"query": "SELECT name, count(*) FROM users WHERE id = 1"}}
</tool_call>
<tool_response>
{"result": [["alice", 3], ["bob", 5]], "status": "ok"}
</tool_response>
<tool_call>
{"name": "complete_task", "arguments": {"answer": "the total is 42"}}
</tool_call>
The answer is in the table. Let me check the page of results and the next page of the list.
def test_function(): return the value of the input and the result of the call
Error: the command failed. Please try again with the correct arguments and the right file.
{"name": "search", "arguments": {"text": "password reset for the account", "page": 2}}
I will read the file, edit the function, and run the tests to verify the fix.
"#;

/// Learn `num_merges` BPE merges from `corpus`, deterministically (most frequent adjacent pair
/// first; ties broken by the pair's text), over byte-level symbols split like GPT-2.
fn learn_merges(corpus: &str, num_merges: usize) -> Result<Vec<(String, String)>> {
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};
    let mut pre = PreTokenizedString::from(corpus);
    ByteLevel::new(false, true, true)
        .pre_tokenize(&mut pre)
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    let mut words: BTreeMap<String, usize> = BTreeMap::new();
    for (piece, _, _) in pre.get_splits(OffsetReferential::Original, OffsetType::Byte) {
        *words.entry(piece.to_string()).or_default() += 1;
    }
    let mut split: Vec<(Vec<String>, usize)> = words
        .into_iter()
        .map(|(w, n)| (w.chars().map(String::from).collect(), n))
        .collect();
    let mut merges = Vec::with_capacity(num_merges);
    while merges.len() < num_merges {
        let mut counts: HashMap<(String, String), usize> = HashMap::new();
        for (syms, n) in &split {
            for pair in syms.windows(2) {
                *counts
                    .entry((pair[0].clone(), pair[1].clone()))
                    .or_default() += n;
            }
        }
        let best = counts
            .into_iter()
            .max_by(|(pa, na), (pb, nb)| na.cmp(nb).then_with(|| pb.cmp(pa)));
        let Some(((left, right), _)) = best else {
            break;
        };
        let joined = format!("{left}{right}");
        for (syms, _) in &mut split {
            let mut i = 0;
            let mut out = Vec::with_capacity(syms.len());
            while i < syms.len() {
                if i + 1 < syms.len() && syms[i] == left && syms[i + 1] == right {
                    out.push(joined.clone());
                    i += 2;
                } else {
                    out.push(syms[i].clone());
                    i += 1;
                }
            }
            *syms = out;
        }
        merges.push((left, right));
    }
    Ok(merges)
}

/// A small byte-level BPE tokenizer built in code: the 256 byte symbols (ids 0..256 in byte
/// order), up to `num_merges` merges learned from a built-in corpus, then the ChatML special tokens
/// (`<|endoftext|>`, `<|im_start|>`, `<|im_end|>`) and the tool/think markers as added tokens.
/// Every string (any UTF-8) round-trips. Deterministic: the same `num_merges` always gives the
/// same tokenizer.
pub fn tiny_tokenizer(num_merges: usize) -> Result<Tokenizer> {
    let table = byte_to_char();
    let mut vocab: HashMap<String, u32> = HashMap::new();
    for (b, c) in table.iter().enumerate() {
        vocab.insert(c.to_string(), b as u32);
    }
    let merges = learn_merges(MERGE_CORPUS, num_merges)?;
    for (l, r) in &merges {
        let next = vocab.len() as u32;
        vocab.entry(format!("{l}{r}")).or_insert(next);
    }
    let bpe = BPE::builder()
        .vocab_and_merges(
            vocab
                .into_iter()
                .collect::<tokenizers::models::bpe::Vocab>(),
            merges,
        )
        .build()
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    let mut tok = Tokenizer::new(bpe);
    tok.with_pre_tokenizer(Some(ByteLevel::new(false, true, true)));
    tok.with_decoder(Some(ByteLevel::new(false, true, true)));
    tok.add_special_tokens(SPECIAL_TOKENS.map(|t| AddedToken::from(t, true)))
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    tok.add_tokens(ADDED_TOKENS.map(|t| AddedToken::from(t, false)))
        .map_err(|e| Error::Tokenizer(e.to_string()))?;
    Ok(tok)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiny_tokenizer_round_trips_and_knows_chatml() {
        let tok = tiny_tokenizer(200).unwrap();
        assert_eq!(tok.get_vocab_size(true), 256 + 200 + 9);
        let text = "<|im_start|>user\nWhat is 2+2? Ünïcode ✓<|im_end|>\n<tool_call>\n{\"name\": \"x\"}\n</tool_call>";
        let ids = encode(&tok, text).unwrap();
        assert_eq!(decode(&tok, &ids, false).unwrap(), text);
        assert_eq!(ids[0], token_id(&tok, IM_START).unwrap());
        assert!(ids.contains(&token_id(&tok, "<tool_call>").unwrap()));
        // Special tokens vanish when skipped; tool markers stay.
        let shown = decode(&tok, &ids, true).unwrap();
        assert!(!shown.contains(IM_START) && shown.contains("<tool_call>"));
        // Merges compress ordinary text.
        assert!(encode(&tok, "the answer is the result").unwrap().len() < 15);
    }

    #[test]
    fn tiny_tokenizer_is_deterministic_and_survives_json() {
        let a = tiny_tokenizer(64).unwrap().to_string(false).unwrap();
        let b = tiny_tokenizer(64).unwrap().to_string(false).unwrap();
        assert_eq!(a, b);
        let back = Tokenizer::from_bytes(a.as_bytes()).unwrap();
        let text = "SELECT * FROM t; -- the end";
        assert_eq!(
            encode(&back, text).unwrap(),
            encode(&tiny_tokenizer(64).unwrap(), text).unwrap()
        );
    }
}
