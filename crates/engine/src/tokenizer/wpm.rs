//! WordPiece (`tokenizer.ggml.model = "bert"`), as llama.cpp's `llm_tokenizer_wpm` runs it:
//! normalise (lower-case and strip accents, unless `tokenizer.ggml.normalizer.lowercase` is
//! false), split at white space and around punctuation, ASCII symbols and CJK ideographs, then
//! cut each word into the longest tokens from its start. The vocabulary spells a word's first
//! piece with a leading `▁` (llama.cpp's converter turns BERT's `##` continuations into plain
//! pieces and marks the word starts instead); a word with a piece no token covers is `[UNK]`.

use super::fxhash::FxHashMap;
use super::unicode::Flags;
use super::unicode_data::{LOWERCASE, NFD_RANGES};

#[derive(Debug, Clone)]
pub(crate) struct Wpm {
    /// Lower-case, and strip accents (llama.cpp ties the two together).
    pub lowercase: bool,
    /// The longest token text, in bytes.
    pub max_token_len: usize,
}

impl Wpm {
    /// Tokenize one raw-text fragment; a word no tokens cover is `unk`.
    pub fn encode(
        &self,
        token_to_id: &FxHashMap<Box<[u8]>, u32>,
        unk: Option<u32>,
        text: &str,
        out: &mut Vec<u32>,
    ) {
        for word in self.words(text) {
            // The phantom space that marks a word's first piece.
            let word = format!("\u{2581}{word}");
            let w = word.as_bytes();
            let n = w.len();
            let before = out.len();
            let mut i = 0;
            while i < n {
                // The longest byte range from `i` that is a token (llama.cpp compares bytes, so a
                // range may end inside a character: no token matches it).
                let found = (i + 1..=n.min(i + self.max_token_len + 1))
                    .rev()
                    .find_map(|j| token_to_id.get(&w[i..j]).map(|&id| (id, j)));
                match found {
                    Some((id, j)) => {
                        out.push(id);
                        i = j;
                    }
                    None => {
                        out.truncate(before);
                        break;
                    }
                }
            }
            if out.len() == before {
                out.extend(unk);
            }
        }
    }

    /// llama.cpp's `preprocess`: the normalised words of `text`.
    fn words(&self, text: &str) -> Vec<String> {
        let mut words = vec![String::new()];
        for c in text.chars() {
            let cp = if self.lowercase {
                nfd(c as u32)
            } else {
                c as u32
            };
            let f = Flags::of(cp);
            if f.is_whitespace() {
                if !words.last().is_some_and(String::is_empty) {
                    words.push(String::new());
                }
                continue;
            }
            let cat = f.category();
            if cp == 0 || cp == 0xFFFD || cat == Flags::CONTROL {
                continue;
            }
            if self.lowercase && cat == Flags::MARK {
                continue;
            }
            let cp = if self.lowercase { lower(cp) } else { cp };
            let Some(c) = char::from_u32(cp) else {
                continue;
            };
            let alone =
                cat == Flags::PUNCTUATION || (cp < 0x7F && cat == Flags::SYMBOL) || is_chinese(cp);
            let last = words.last_mut().expect("never empty");
            if alone {
                if !last.is_empty() {
                    words.push(String::new());
                }
                let last = words.last_mut().expect("never empty");
                last.push(c);
                words.push(String::new());
            } else {
                last.push(c);
            }
        }
        if words.last().is_some_and(String::is_empty) {
            words.pop();
        }
        words
    }
}

/// llama.cpp's one-code-point NFD: the code point a range maps to, or the code point itself.
fn nfd(cp: u32) -> u32 {
    let i = NFD_RANGES.partition_point(|&(first, _, _)| first <= cp);
    match i.checked_sub(1).map(|i| NFD_RANGES[i]) {
        Some((first, last, to)) if first <= cp && cp <= last => to,
        _ => cp,
    }
}

/// llama.cpp's `unicode_tolower`.
fn lower(cp: u32) -> u32 {
    match LOWERCASE.binary_search_by_key(&cp, |&(from, _)| from) {
        Ok(i) => LOWERCASE[i].1,
        Err(_) => cp,
    }
}

/// The CJK ideograph ranges BERT splits around (llama.cpp's, after Hugging Face's: extension F
/// starts at U+2B920 there, not U+2B820).
fn is_chinese(cp: u32) -> bool {
    [
        (0x4E00, 0x9FFF),
        (0x3400, 0x4DBF),
        (0x20000, 0x2A6DF),
        (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F),
        (0x2B920, 0x2CEAF),
        (0xF900, 0xFAFF),
        (0x2F800, 0x2FA1F),
    ]
    .iter()
    .any(|&(a, b)| (a..=b).contains(&cp))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_and_splits_as_llama_cpp() {
        let w = Wpm {
            lowercase: true,
            max_token_len: 8,
        };
        assert_eq!(
            w.words("Héllo, World!\t中文"),
            ["hello", ",", "world", "!", "中", "文"]
        );
        assert_eq!(w.words("a$b `c"), ["a", "$", "b", "`", "c"]);
        assert_eq!(nfd(0xC5), 'A' as u32);
        assert_eq!(lower('Ä' as u32), 'ä' as u32);
    }
}
