//! Tokenizers built from GGUF metadata, giving token for token the ids llama.cpp gives.
//!
//! Two vocabulary types are supported, the ones llama-family GGUF files carry:
//! - SentencePiece (`tokenizer.ggml.model = "llama"`): score-driven merges over characters, `▁`
//!   for spaces, `<0xHH>` byte fallback (Llama 2, Gemma, Mistral's older files).
//! - byte-level BPE (`tokenizer.ggml.model = "gpt2"`): a regex pre-tokenizer chosen by
//!   `tokenizer.ggml.pre`, then rank-ordered merges over bytes (GPT-2, Llama 3, Qwen 2,
//!   SmolLM, StarCoder). An unknown pre-tokenizer is refused, never guessed.
//!
//! Special tokens (control and user-defined, from `tokenizer.ggml.token_type`) are cut out of the
//! text first, as llama.cpp does: control tokens only when `parse_special` is set, user-defined
//! ones always. The special ids, the BOS/EOS defaults per vocabulary type, the end-of-generation
//! set and the detokenizer follow llama.cpp's `llama-vocab.cpp` (the reference for every choice
//! here; the golden tests under `tests/data/tokenizer/` hold its output).
//!
//! Not here: chat templates (a separate module), WordPiece/Unigram/RWKV vocabularies.

mod bpe;
mod error;
mod fxhash;
mod load;
mod pretokenize;
mod special;
mod spm;
mod stream;
mod unicode;
mod unicode_data;
mod wpm;

pub use error::TokenizerError;
pub use pretokenize::{PreConfig, PreTokenizer};
pub use stream::StreamDecoder;

use fxhash::FxHashMap;
use special::{Fragment, SpecialMatcher};

/// The vocabulary type, from `tokenizer.ggml.model`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VocabType {
    /// SentencePiece BPE (`llama`).
    Spm,
    /// Byte-level BPE (`gpt2`), or Gemma 4's UTF-8 BPE (`gemma4`).
    Bpe,
    /// WordPiece (`bert`).
    Wpm,
}

/// Token attributes, llama.cpp's `llama_token_attr` bits: the token type from
/// `tokenizer.ggml.token_type`, plus the adjustments llama.cpp makes at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct TokenAttr(u16);

impl TokenAttr {
    pub const UNDEFINED: TokenAttr = TokenAttr(0);
    pub const UNKNOWN: TokenAttr = TokenAttr(1 << 0);
    pub const UNUSED: TokenAttr = TokenAttr(1 << 1);
    pub const NORMAL: TokenAttr = TokenAttr(1 << 2);
    pub const CONTROL: TokenAttr = TokenAttr(1 << 3);
    pub const USER_DEFINED: TokenAttr = TokenAttr(1 << 4);
    pub const BYTE: TokenAttr = TokenAttr(1 << 5);
    pub const LSTRIP: TokenAttr = TokenAttr(1 << 7);
    pub const RSTRIP: TokenAttr = TokenAttr(1 << 8);

    /// The attribute of a `tokenizer.ggml.token_type` value.
    pub fn from_token_type(t: i32) -> TokenAttr {
        match t {
            1 => TokenAttr::NORMAL,
            2 => TokenAttr::UNKNOWN,
            3 => TokenAttr::CONTROL,
            4 => TokenAttr::USER_DEFINED,
            5 => TokenAttr::UNUSED,
            6 => TokenAttr::BYTE,
            _ => TokenAttr::UNDEFINED,
        }
    }

    /// Whether any bit of `other` is set.
    pub fn intersects(self, other: TokenAttr) -> bool {
        self.0 & other.0 != 0
    }

    pub fn bits(self) -> u16 {
        self.0
    }
}

impl std::ops::BitOr for TokenAttr {
    type Output = TokenAttr;
    fn bitor(self, rhs: TokenAttr) -> TokenAttr {
        TokenAttr(self.0 | rhs.0)
    }
}

impl std::ops::BitOrAssign for TokenAttr {
    fn bitor_assign(&mut self, rhs: TokenAttr) {
        self.0 |= rhs.0;
    }
}

/// The ids with a role, after llama.cpp's defaults, metadata and detection by text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SpecialIds {
    pub bos: Option<u32>,
    pub eos: Option<u32>,
    pub eot: Option<u32>,
    pub eom: Option<u32>,
    pub unk: Option<u32>,
    pub sep: Option<u32>,
    pub pad: Option<u32>,
    pub mask: Option<u32>,
    pub fim_pre: Option<u32>,
    pub fim_suf: Option<u32>,
    pub fim_mid: Option<u32>,
    pub fim_pad: Option<u32>,
    pub fim_rep: Option<u32>,
    pub fim_sep: Option<u32>,
}

#[derive(Debug, Clone)]
enum Model {
    Spm(Box<spm::Spm>),
    Bpe(Box<bpe::Bpe>),
    Wpm(Box<wpm::Wpm>),
}

/// A tokenizer for one GGUF vocabulary. Immutable once built; share it freely across threads.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    vocab_type: VocabType,
    /// Token texts as the file has them (an empty one becomes `[EMPTY_<id>]`, as in llama.cpp).
    tokens: Vec<String>,
    scores: Vec<f32>,
    attrs: Vec<TokenAttr>,
    token_to_id: FxHashMap<Box<[u8]>, u32>,
    model: Model,
    special: SpecialMatcher,
    ids: SpecialIds,
    /// End-of-generation ids, sorted.
    eog: Vec<u32>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    /// Every token's piece (special tokens rendered), concatenated; token `i`'s is
    /// `pieces[piece_ends[i - 1]..piece_ends[i]]`.
    pieces: Vec<u8>,
    piece_ends: Vec<u32>,
}

// `Tokenizer::from_metadata` is in `load.rs`, `Tokenizer::stream_decoder` in `stream.rs`.
impl Tokenizer {
    /// Tokenize `text`: BOS first if `add_bos` (and the vocabulary has one), and special-token
    /// texts such as `<|im_start|>` as their tokens if `parse_special` (user-defined tokens are
    /// always matched, as in llama.cpp). Use [`Tokenizer::add_bos_token`] for what the model
    /// expects.
    pub fn encode(&self, text: &str, add_bos: bool, parse_special: bool) -> Vec<u32> {
        self.encode_impl(text, add_bos, false, parse_special)
    }

    /// Exactly llama.cpp's `llama_tokenize`: with `add_special`, BOS and EOS as the vocabulary's
    /// `add_bos_token` / `add_eos_token` say.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<u32> {
        self.encode_impl(
            text,
            add_special && self.add_bos,
            add_special && self.add_eos,
            parse_special,
        )
    }

    fn encode_impl(&self, text: &str, bos: bool, eos: bool, parse_special: bool) -> Vec<u32> {
        let fragments = self.special.partition(text.as_bytes(), parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if bos {
            out.extend(self.ids.bos);
        }
        // Fragment bounds are char boundaries: special tokens are whole UTF-8 strings, and
        // stripping removes ASCII white space only.
        let slice = |r: &std::ops::Range<usize>| text.get(r.clone()).unwrap_or_default();
        match &self.model {
            Model::Spm(spm) => {
                let vocab = spm::SpmVocab {
                    token_to_id: &self.token_to_id,
                    scores: &self.scores,
                };
                let mut buf = String::new();
                // A text fragment at the start or after a special token gets the space prefix.
                let mut after_special = true;
                for fragment in &fragments {
                    match fragment {
                        Fragment::Text(r) => {
                            buf.clear();
                            if self.add_space_prefix && after_special {
                                buf.push(' ');
                            }
                            buf.push_str(slice(r));
                            let escaped = buf.replace(' ', "\u{2581}");
                            spm.encode(&vocab, escaped.as_bytes(), &mut out);
                            after_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(*id);
                            after_special = true;
                        }
                    }
                }
            }
            Model::Bpe(bpe) => {
                for fragment in &fragments {
                    match fragment {
                        Fragment::Text(r) => bpe.encode(slice(r), &mut out),
                        Fragment::Token(id) => out.push(*id),
                    }
                }
            }
            Model::Wpm(wpm) => {
                for fragment in &fragments {
                    match fragment {
                        Fragment::Text(r) => {
                            wpm.encode(&self.token_to_id, self.ids.unk, slice(r), &mut out)
                        }
                        Fragment::Token(id) => out.push(*id),
                    }
                }
            }
        }
        if eos {
            // WordPiece ends with [SEP].
            out.extend(match self.model {
                Model::Wpm(_) => self.ids.sep,
                _ => self.ids.eos,
            });
        }
        out
    }

    /// What the vocabulary says about prepending BOS (`tokenizer.ggml.add_bos_token`, or
    /// llama.cpp's default for the vocabulary type and pre-tokenizer when the key is absent).
    pub fn add_bos_token(&self) -> bool {
        self.add_bos
    }

    /// Likewise for appending EOS (`tokenizer.ggml.add_eos_token`).
    pub fn add_eos_token(&self) -> bool {
        self.add_eos
    }

    /// Whether SentencePiece text gets a leading space (`tokenizer.ggml.add_space_prefix`).
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }

    pub fn n_vocab(&self) -> usize {
        self.tokens.len()
    }

    pub fn vocab_type(&self) -> VocabType {
        self.vocab_type
    }

    /// The BPE pre-tokenizer; `None` for SentencePiece.
    pub fn pre_tokenizer(&self) -> Option<PreTokenizer> {
        match &self.model {
            Model::Bpe(b) => Some(b.pre),
            Model::Spm(_) | Model::Wpm(_) => None,
        }
    }

    pub fn bos(&self) -> Option<u32> {
        self.ids.bos
    }

    pub fn eos(&self) -> Option<u32> {
        self.ids.eos
    }

    pub fn eot(&self) -> Option<u32> {
        self.ids.eot
    }

    pub fn pad(&self) -> Option<u32> {
        self.ids.pad
    }

    pub fn unk(&self) -> Option<u32> {
        self.ids.unk
    }

    /// Every id with a role.
    pub fn special_ids(&self) -> &SpecialIds {
        &self.ids
    }

    /// Whether generation stops at `id`: EOS, EOT, EOM, the FIM pad/repo/separator tokens, and
    /// the tokens llama.cpp recognises by text (`<|im_end|>`, `<end_of_turn>`, ...).
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog.binary_search(&id).is_ok()
    }

    /// The end-of-generation ids, sorted.
    pub fn eog_ids(&self) -> &[u32] {
        &self.eog
    }

    /// How this vocabulary differs from `other`'s, the first difference named; `None` where
    /// the two give every text the same tokens and end generation at the same ones (a draft
    /// model's tokens must be its target's).
    pub fn vocabulary_difference(&self, other: &Tokenizer) -> Option<String> {
        if self.vocab_type != other.vocab_type {
            return Some(format!(
                "{:?} tokenizer and {:?} tokenizer",
                self.vocab_type, other.vocab_type
            ));
        }
        if self.tokens.len() != other.tokens.len() {
            return Some(format!(
                "{} tokens and {} tokens",
                self.tokens.len(),
                other.tokens.len()
            ));
        }
        if let Some(i) = (0..self.tokens.len()).find(|&i| {
            self.tokens[i] != other.tokens[i] || self.attrs[i].bits() != other.attrs[i].bits()
        }) {
            return Some(format!(
                "token {i} is {:?} in one and {:?} in the other",
                self.tokens[i], other.tokens[i]
            ));
        }
        if self.pre_tokenizer() != other.pre_tokenizer() || self.eog != other.eog {
            return Some("the same tokens, split or ended differently".into());
        }
        None
    }

    /// A token's text as the vocabulary stores it (byte-level or `▁` form); `None` out of range.
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// The id of a token text, exactly as the vocabulary stores it.
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.token_to_id.get(text.as_bytes()).copied()
    }

    /// A token's attributes; `UNDEFINED` out of range.
    pub fn token_attr(&self, id: u32) -> TokenAttr {
        self.attrs.get(id as usize).copied().unwrap_or_default()
    }

    /// Whether `id` is a control token (BOS, EOS, `<|im_start|>`, ...).
    pub fn is_control(&self, id: u32) -> bool {
        self.token_attr(id).intersects(TokenAttr::CONTROL)
    }

    /// The bytes a token stands for, as llama.cpp's `token_to_piece` with special tokens
    /// rendered: byte-level BPE text mapped back to bytes, `▁` as a space, `<0xHH>` as its byte,
    /// control and user-defined tokens as their text. Empty for an id out of range. A piece need
    /// not be valid UTF-8 on its own: see [`StreamDecoder`].
    pub fn token_to_piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        if i >= self.piece_ends.len() {
            return &[];
        }
        let start = if i == 0 { 0 } else { self.piece_ends[i - 1] };
        &self.pieces[start as usize..self.piece_ends[i] as usize]
    }

    /// [`Tokenizer::token_to_piece`] as text, a byte that is not UTF-8 on its own as U+FFFD:
    /// for showing one token (logprobs, a template's BOS).
    pub fn piece_text(&self, id: u32) -> String {
        String::from_utf8_lossy(self.token_to_piece(id)).into_owned()
    }

    /// llama.cpp's `llama_detokenize`: the pieces of `ids` concatenated, with control tokens
    /// left out unless `unparse_special`, a leading BOS (and trailing EOS) dropped when
    /// `remove_special` and the vocabulary adds them, the space prefix taken off the first
    /// token, and the vocabulary's space clean-up applied. Ids out of range add nothing.
    pub fn detokenize(&self, ids: &[u32], remove_special: bool, unparse_special: bool) -> Vec<u8> {
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if remove_special && self.add_bos {
            if let (Some(&first), Some(bos)) = (ids.first(), self.ids.bos) {
                if first == bos {
                    remove_space = false;
                    ids = &ids[1..];
                }
            }
        }
        if remove_special && self.add_eos {
            if let (Some(&last), Some(eos)) = (ids.last(), self.ids.eos) {
                if last == eos {
                    ids = &ids[..ids.len() - 1];
                }
            }
        }
        let mut text = Vec::new();
        for &id in ids {
            let mut piece = self.token_to_piece(id);
            if !unparse_special
                && self
                    .token_attr(id)
                    .intersects(TokenAttr::UNKNOWN | TokenAttr::CONTROL)
            {
                piece = &[];
            }
            if remove_space {
                piece = piece.strip_prefix(b" ").unwrap_or(piece);
            }
            remove_space = false;
            text.extend_from_slice(piece);
        }
        if self.clean_spaces {
            clean_up_spaces(&mut text);
        }
        text
    }

    /// Text for `ids`, as llama.cpp's `common_detokenize(.., special = true)`: special tokens
    /// rendered, nothing removed. Bytes that are not UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> String {
        String::from_utf8_lossy(&self.detokenize(ids, false, true)).into_owned()
    }
}

/// llama.cpp's `clean_up_tokenization_spaces` (in `llama_vocab::impl::detokenize`), three
/// in-place passes kept index for index: their reads of already-rewritten bytes are part of
/// the behaviour.
fn clean_up_spaces(text: &mut Vec<u8>) {
    // 1: " ?", " !", " .", " ," lose the space.
    let n = text.len();
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // 2: " ' " becomes "'".
    let n = total;
    let mut total = usize::from(n > 0);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // 3: " 's", " 'm", " 're", " 've" lose the space.
    let n = total;
    let mut total = usize::from(n > 0);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            if x1 == b's' || x1 == b'm' {
                total -= 1;
            } else if x1 != b't' && x1 != b'd' && i + 2 < n {
                let x2 = text[i + 2];
                if (x1 == b'r' || x1 == b'v') && x2 == b'e' {
                    total -= 1;
                }
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn clean(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_up_spaces(&mut v);
        String::from_utf8(v).unwrap()
    }

    #[test]
    fn clean_up_spaces_like_llama_cpp() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("rock ' n ' roll"), "rock'n'roll");
        assert_eq!(
            clean("it 's I 'm we 're they 've don 't I 'd"),
            "it's I'm we're they've don 't I 'd"
        );
        assert_eq!(clean(""), "");
        assert_eq!(clean(" ."), ".");
    }
}
