//! Turning generated tokens into text as they come.
//!
//! A token's piece may end inside a UTF-8 character (byte-fallback tokens hold one byte each;
//! byte-level BPE tokens split characters freely), so the decoder holds back the incomplete tail
//! and emits only whole characters. Bytes that can never become a character are emitted as
//! U+FFFD right away rather than held.

use super::Tokenizer;

impl Tokenizer {
    /// A [`StreamDecoder`] over this vocabulary.
    pub fn stream_decoder(&self) -> StreamDecoder<'_> {
        StreamDecoder::new(self)
    }
}

/// Decodes a stream of token ids into text, one token at a time.
///
/// The text is the concatenation of [`Tokenizer::token_to_piece`] over the tokens (special
/// tokens rendered as their text), as llama.cpp's examples stream it: concatenating every
/// [`StreamDecoder::push`] and the final [`StreamDecoder::finish`] gives
/// `String::from_utf8_lossy` of all the pieces.
#[derive(Debug, Clone)]
pub struct StreamDecoder<'a> {
    tokenizer: &'a Tokenizer,
    /// Bytes of an incomplete character at the end of what was pushed (at most 3).
    pending: Vec<u8>,
}

impl<'a> StreamDecoder<'a> {
    pub fn new(tokenizer: &'a Tokenizer) -> StreamDecoder<'a> {
        StreamDecoder {
            tokenizer,
            pending: Vec::new(),
        }
    }

    /// Add one token; returns the text it completes (possibly empty). An id outside the
    /// vocabulary adds nothing.
    pub fn push(&mut self, id: u32) -> String {
        let piece = self.tokenizer.token_to_piece(id);
        self.push_bytes(piece)
    }

    /// Add raw bytes; returns the complete characters they finish.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (good, bad) = rest.split_at(e.valid_up_to());
                    // `good` is valid UTF-8 up to `valid_up_to`, so this never falls back.
                    out.push_str(std::str::from_utf8(good).unwrap_or_default());
                    match e.error_len() {
                        // Invalid whatever follows: replace it and go on.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &bad[n..];
                        }
                        // A character that the next bytes may complete: hold it back.
                        None => {
                            rest = bad;
                            break;
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let len = self.pending.len();
        self.pending.drain(..len - keep);
        out
    }

    /// Whether bytes of an unfinished character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }

    /// End of stream: whatever is held back, as U+FFFD.
    pub fn finish(&mut self) -> String {
        let out = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        out
    }
}
