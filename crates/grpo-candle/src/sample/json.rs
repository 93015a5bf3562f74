//! JSON-constrained decoding ([`OutputFormat::JsonObject`](harness_core::OutputFormat)): at
//! every step only the tokens that keep the generated text a prefix of one JSON object may be
//! drawn, and once the object closes only a stop token may follow.
//!
//! [`JsonState`] is a pushdown recogniser of JSON (RFC 8259) fed byte by byte; it is `Copy`
//! (the container stack is a bit set), so testing a token is a copy and a few byte steps.
//! [`JsonVocab`] holds every token's bytes, from the byte-level BPE alphabet when the token is
//! spelled in it and from the tokenizer's decoder otherwise; special and added tokens (ChatML
//! markers, `<tool_call>`) never occur inside the object. Strings accept any byte of 0x20 and
//! above (UTF-8 sequences are not checked: the text is decoded leniently afterwards).

use tokenizers::Tokenizer;

use crate::model::tokenizer::byte_to_char;

/// Deepest nesting the recogniser follows (containers beyond it are refused).
pub const MAX_DEPTH: u32 = 64;

/// Whitespace bytes allowed in a row, so that a model cannot pad forever between tokens.
pub const MAX_WHITESPACE_RUN: u8 = 24;

/// Where the recogniser is inside the grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Before the top-level `{`.
    Start,
    /// A value must follow (after `:` or an array's `,`).
    Value,
    /// After `[`: a value or `]`.
    ValueOrClose,
    /// After `{`: a key or `}`.
    KeyOrClose,
    /// After an object's `,`: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a value: `,` or the container's closing bracket.
    AfterValue,
    /// Inside a string (a key when `key`).
    Str { key: bool, escape: Escape },
    /// Inside a number.
    Num(Num),
    /// Inside `true`, `false` or `null`: the literal and how many bytes were read.
    Lit { word: Literal, at: u8 },
    /// The top-level object closed.
    Done,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Escape {
    None,
    /// After `\`.
    Backslash,
    /// Hex digits still expected after `\u`.
    Hex(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    /// After `-`.
    Minus,
    /// A leading `0`.
    Zero,
    /// Integer digits.
    Int,
    /// After `.`.
    Dot,
    /// Fraction digits.
    Frac,
    /// After `e` or `E`.
    Exp,
    /// After the exponent's sign.
    ExpSign,
    /// Exponent digits.
    ExpDigits,
}

impl Num {
    /// Whether the number may end here.
    fn complete(self) -> bool {
        matches!(self, Num::Zero | Num::Int | Num::Frac | Num::ExpDigits)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Literal {
    True,
    False,
    Null,
}

impl Literal {
    fn bytes(self) -> &'static [u8] {
        match self {
            Literal::True => b"true",
            Literal::False => b"false",
            Literal::Null => b"null",
        }
    }
}

/// The state of a JSON-object prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JsonState {
    mode: Mode,
    /// Open containers, innermost at bit `depth - 1`: 1 for an object, 0 for an array.
    stack: u64,
    depth: u32,
    whitespace: u8,
}

impl Default for JsonState {
    fn default() -> Self {
        JsonState {
            mode: Mode::Start,
            stack: 0,
            depth: 0,
            whitespace: 0,
        }
    }
}

impl JsonState {
    /// Nothing generated yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Whether the top-level object has closed (only a stop token may follow).
    pub fn is_done(&self) -> bool {
        self.mode == Mode::Done
    }

    /// Feed `bytes`; `false` (and an unspecified state) when they leave the grammar.
    pub fn feed(&mut self, bytes: &[u8]) -> bool {
        bytes.iter().all(|&b| self.step(b))
    }

    /// Whether `bytes` would keep the text inside the grammar.
    pub fn accepts(&self, bytes: &[u8]) -> bool {
        let mut next = *self;
        next.feed(bytes)
    }

    fn innermost_is_object(&self) -> bool {
        self.depth > 0 && (self.stack >> (self.depth - 1)) & 1 == 1
    }

    fn open(&mut self, object: bool) -> bool {
        if self.depth >= MAX_DEPTH {
            return false;
        }
        if object {
            self.stack |= 1 << self.depth;
        } else {
            self.stack &= !(1 << self.depth);
        }
        self.depth += 1;
        self.mode = if object {
            Mode::KeyOrClose
        } else {
            Mode::ValueOrClose
        };
        true
    }

    fn close(&mut self, object: bool) -> bool {
        if self.depth == 0 || self.innermost_is_object() != object {
            return false;
        }
        self.depth -= 1;
        self.mode = if self.depth == 0 {
            Mode::Done
        } else {
            Mode::AfterValue
        };
        true
    }

    /// A value starting with `b`.
    fn start_value(&mut self, b: u8) -> bool {
        self.mode = match b {
            b'{' => return self.open(true),
            b'[' => return self.open(false),
            b'"' => Mode::Str {
                key: false,
                escape: Escape::None,
            },
            b'-' => Mode::Num(Num::Minus),
            b'0' => Mode::Num(Num::Zero),
            b'1'..=b'9' => Mode::Num(Num::Int),
            b't' => Mode::Lit {
                word: Literal::True,
                at: 1,
            },
            b'f' => Mode::Lit {
                word: Literal::False,
                at: 1,
            },
            b'n' => Mode::Lit {
                word: Literal::Null,
                at: 1,
            },
            _ => return false,
        };
        true
    }

    fn step(&mut self, b: u8) -> bool {
        let whitespace = matches!(b, b' ' | b'\n' | b'\r' | b'\t');
        let between = matches!(
            self.mode,
            Mode::Start
                | Mode::Value
                | Mode::ValueOrClose
                | Mode::KeyOrClose
                | Mode::Key
                | Mode::Colon
                | Mode::AfterValue
        );
        if whitespace && between {
            self.whitespace += 1;
            return self.whitespace <= MAX_WHITESPACE_RUN;
        }
        if !matches!(self.mode, Mode::Num(_)) {
            self.whitespace = 0;
        }
        match self.mode {
            Mode::Done => false,
            Mode::Start => b == b'{' && self.open(true),
            Mode::Value => self.start_value(b),
            Mode::ValueOrClose => b == b']' && self.close(false) || self.start_value(b),
            Mode::KeyOrClose | Mode::Key => {
                if b == b'"' {
                    self.mode = Mode::Str {
                        key: true,
                        escape: Escape::None,
                    };
                    true
                } else {
                    self.mode == Mode::KeyOrClose && b == b'}' && self.close(true)
                }
            }
            Mode::Colon => {
                self.mode = Mode::Value;
                b == b':'
            }
            Mode::AfterValue => match b {
                b',' => {
                    self.mode = if self.innermost_is_object() {
                        Mode::Key
                    } else {
                        Mode::Value
                    };
                    true
                }
                b'}' => self.close(true),
                b']' => self.close(false),
                _ => false,
            },
            Mode::Str { key, escape } => {
                let escape = match escape {
                    Escape::None => match b {
                        b'"' => {
                            self.mode = if key { Mode::Colon } else { Mode::AfterValue };
                            return true;
                        }
                        b'\\' => Escape::Backslash,
                        0x00..=0x1f => return false,
                        _ => Escape::None,
                    },
                    Escape::Backslash => match b {
                        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Escape::None,
                        b'u' => Escape::Hex(4),
                        _ => return false,
                    },
                    Escape::Hex(left) => {
                        if !b.is_ascii_hexdigit() {
                            return false;
                        }
                        if left == 1 {
                            Escape::None
                        } else {
                            Escape::Hex(left - 1)
                        }
                    }
                };
                self.mode = Mode::Str { key, escape };
                true
            }
            Mode::Num(n) => {
                let next = match (n, b) {
                    (Num::Minus, b'0') => Some(Num::Zero),
                    (Num::Minus, b'1'..=b'9') => Some(Num::Int),
                    (Num::Int, b'0'..=b'9') => Some(Num::Int),
                    (Num::Zero | Num::Int, b'.') => Some(Num::Dot),
                    (Num::Dot | Num::Frac, b'0'..=b'9') => Some(Num::Frac),
                    (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Some(Num::Exp),
                    (Num::Exp, b'+' | b'-') => Some(Num::ExpSign),
                    (Num::Exp | Num::ExpSign | Num::ExpDigits, b'0'..=b'9') => Some(Num::ExpDigits),
                    _ => None,
                };
                match next {
                    Some(next) => {
                        self.mode = Mode::Num(next);
                        true
                    }
                    // The number ends at the first byte that cannot continue it.
                    None if n.complete() => {
                        self.mode = Mode::AfterValue;
                        self.whitespace = 0;
                        self.step(b)
                    }
                    None => false,
                }
            }
            Mode::Lit { word, at } => {
                let bytes = word.bytes();
                if bytes[at as usize] != b {
                    return false;
                }
                self.mode = if at as usize + 1 == bytes.len() {
                    Mode::AfterValue
                } else {
                    Mode::Lit { word, at: at + 1 }
                };
                true
            }
        }
    }
}

/// Every token's bytes, for testing tokens against a [`JsonState`].
#[derive(Debug, Clone)]
pub struct JsonVocab {
    /// `None` for tokens that never occur inside JSON text (special and added tokens, tokens
    /// spelling nothing).
    bytes: Vec<Option<Box<[u8]>>>,
}

impl JsonVocab {
    /// The bytes of ids `0..vocab_size` under `tokenizer`.
    pub fn new(tokenizer: &Tokenizer, vocab_size: usize) -> Self {
        let mut from_char = std::collections::HashMap::new();
        for (b, c) in byte_to_char().iter().enumerate() {
            from_char.insert(*c, b as u8);
        }
        let added: std::collections::HashSet<u32> = tokenizer
            .get_added_tokens_decoder()
            .keys()
            .copied()
            .collect();
        let bytes = (0..vocab_size as u32)
            .map(|id| {
                if added.contains(&id) {
                    return None;
                }
                let piece = tokenizer.id_to_token(id)?;
                let spelled: Option<Vec<u8>> =
                    piece.chars().map(|c| from_char.get(&c).copied()).collect();
                let bytes = match spelled {
                    Some(bytes) => bytes,
                    // Not byte-level BPE: the decoder's text of the token alone.
                    None => tokenizer.decode(&[id], false).ok()?.into_bytes(),
                };
                (!bytes.is_empty()).then(|| bytes.into_boxed_slice())
            })
            .collect();
        JsonVocab { bytes }
    }

    /// Ids of the vocabulary.
    pub fn len(&self) -> usize {
        self.bytes.len()
    }

    /// Whether the vocabulary is empty.
    pub fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    /// The bytes of token `id` (`None` for tokens that never occur inside JSON).
    pub fn bytes(&self, id: u32) -> Option<&[u8]> {
        self.bytes.get(id as usize).and_then(|b| b.as_deref())
    }

    /// Set the logits of tokens that `state` does not accept to `-inf`: inside the object every
    /// token that keeps the text a JSON-object prefix, once it closed only `stop` tokens.
    /// Returns how many tokens stay allowed.
    pub fn mask(&self, state: &JsonState, stop: &[u32], logits: &mut [f32]) -> usize {
        let mut allowed = 0;
        let done = state.is_done();
        for (id, logit) in logits.iter_mut().enumerate() {
            let ok = if done {
                stop.contains(&(id as u32))
            } else {
                self.bytes(id as u32).is_some_and(|b| state.accepts(b))
            };
            if ok {
                allowed += 1;
            } else {
                *logit = f32::NEG_INFINITY;
            }
        }
        allowed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn accepts_whole(text: &str) -> bool {
        let mut s = JsonState::new();
        s.feed(text.as_bytes()) && s.is_done()
    }

    fn accepts_prefix(text: &str) -> bool {
        JsonState::new().accepts(text.as_bytes())
    }

    #[test]
    fn whole_objects_are_recognised() {
        for text in [
            r#"{}"#,
            r#"{"a": 1}"#,
            r#" { "groups" : [ {"cause": "bad-sql", "tasks": ["t1", "t2"]} ], "unresolved": [] }"#,
            r#"{"n": -0.5e+10, "m": 0, "k": 12.25E3, "z": [1,2 , 3]}"#,
            r#"{"t": true, "f": false, "x": null, "nested": {"deep": [[{}], []]}}"#,
            r#"{"esc": "a\"b\\c\/d\n\u00e9\uD83D\uDE00", "utf8": "héllo ✓"}"#,
        ] {
            assert!(accepts_whole(text), "{text}");
            assert!(
                serde_json::from_str::<serde_json::Value>(text).is_ok(),
                "{text}"
            );
        }
    }

    #[test]
    fn what_json_forbids_is_refused() {
        for text in [
            r#"["top-level array"]"#,
            r#"text {"a": 1}"#,
            r#"{"a" 1}"#,
            r#"{"a": 01}"#,
            r#"{"a": 1.}"#,
            r#"{"a": .5}"#,
            r#"{"a": +1}"#,
            r#"{"a": 1,}"#,
            r#"{"a": [1,]}"#,
            r#"{"a": tru}"#,
            r#"{"a": True}"#,
            r#"{a: 1}"#,
            r#"{'a': 1}"#,
            r#"{"a": "\x"}"#,
            r#"{"a": "\u12G4"}"#,
            "{\"a\": \"line\nbreak\"}",
            r#"{"a": [1}"#,
            r#"{"a": {"b": 1]}"#,
            r#"{} {}"#,
            r#"{}  "#,
        ] {
            assert!(!accepts_whole(text), "{text}");
        }
        // Prefixes are accepted while they can still become an object.
        for text in [
            r#"{"gro"#,
            r#"{"a": -"#,
            r#"{"a": 1.5e"#,
            r#"{"a": [tr"#,
            "  \n{",
        ] {
            assert!(accepts_prefix(text), "{text}");
        }
    }

    #[test]
    fn whitespace_runs_and_depth_are_bounded() {
        let long = format!("{{{}", " ".repeat(MAX_WHITESPACE_RUN as usize + 1));
        assert!(!accepts_prefix(&long));
        let ok = format!("{{{}\"a\": 1}}", " ".repeat(MAX_WHITESPACE_RUN as usize));
        assert!(accepts_whole(&ok));
        let deep = format!("{{\"a\": {}", "[".repeat(MAX_DEPTH as usize));
        assert!(!accepts_prefix(&deep));
        let fits = format!("{{\"a\": {}", "[".repeat(MAX_DEPTH as usize - 1));
        assert!(accepts_prefix(&fits));
    }

    #[test]
    fn the_mask_keeps_exactly_the_accepted_tokens() {
        let tokenizer = crate::model::tokenizer::tiny_tokenizer(0).unwrap();
        let size = tokenizer.get_vocab_size(true);
        let vocab = JsonVocab::new(&tokenizer, size);
        let im_end = crate::model::tokenizer::token_id(&tokenizer, "<|im_end|>").unwrap();
        assert!(
            vocab.bytes(im_end).is_none(),
            "special tokens never occur in JSON"
        );
        let mut state = JsonState::new();
        assert!(state.feed(br#"{"a": [1"#));
        let mut logits = vec![0.0f32; size];
        let allowed = vocab.mask(&state, &[im_end], &mut logits);
        assert!(allowed > 0 && allowed < size);
        for (id, l) in logits.iter().enumerate() {
            let ok = vocab.bytes(id as u32).is_some_and(|b| state.accepts(b));
            assert_eq!(l.is_finite(), ok, "token {id}");
        }
        // Once the object closed, only the stop token.
        assert!(state.feed(b"]}"));
        let mut logits = vec![0.0f32; size];
        assert_eq!(vocab.mask(&state, &[im_end], &mut logits), 1);
        assert!(logits[im_end as usize].is_finite());
    }
}
