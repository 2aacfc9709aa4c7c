//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): GPT-2's byte-to-character map, the merge
//! ranks, and the merge loop.
//!
//! The vocabulary and merges are written in GPT-2's byte-level alphabet (each byte of the text
//! stands as one printable character: a space is `Ġ`). llama.cpp maps each pre-token into that
//! alphabet and merges there; the map is a bijection, so this module instead maps the vocabulary
//! and merges back to raw bytes once, at load, and merges on the text's own bytes. The results
//! are the same; the text is never re-encoded.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::fxhash::FxHashMap;
use super::pretokenize::PreTokenizer;

/// The byte a character of the byte-level alphabet stands for.
pub(crate) fn char_to_byte(c: char) -> Option<u8> {
    let cp = c as u32;
    if cp < 0x100 && is_printable_byte(cp as u8) {
        return Some(cp as u8);
    }
    // The other 68 bytes map, in order, onto U+0100..U+0143.
    let n = cp.checked_sub(0x100)? as usize;
    NON_PRINTABLE.get(n).copied()
}

/// Bytes that stand for themselves: `!`..`~`, `¡`..`¬`, `®`..`ÿ`.
const fn is_printable_byte(b: u8) -> bool {
    matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF)
}

const N_NON_PRINTABLE: usize = 256 - (0x7E - 0x21 + 1) - (0xAC - 0xA1 + 1) - (0xFF - 0xAE + 1);

static NON_PRINTABLE: [u8; N_NON_PRINTABLE] = {
    let mut t = [0u8; N_NON_PRINTABLE];
    let mut n = 0;
    let mut b = 0;
    while b < 256 {
        if !is_printable_byte(b as u8) {
            t[n] = b as u8;
            n += 1;
        }
        b += 1;
    }
    t
};

/// A byte-level token text back to raw bytes; `None` if it holds a character outside the
/// alphabet (such a token can never come out of the merges).
pub(crate) fn decode_byte_level(text: &str) -> Option<Vec<u8>> {
    text.chars().map(char_to_byte).collect()
}

/// The merge tables of a BPE vocabulary, in raw bytes: a byte-level one (GPT-2's alphabet,
/// mapped back to bytes), or one whose tokens are UTF-8 text (Gemma 4's, [`Bpe::new_utf8`]).
#[derive(Debug, Clone)]
pub(crate) struct Bpe {
    pub pre: PreTokenizer,
    /// The tokens are UTF-8 text: a pre-token starts as its characters, not its bytes, and a
    /// run of newlines that is a token is taken whole (llama.cpp's Gemma 4 rules).
    utf8: bool,
    /// A pre-token that is itself a token is taken whole (`ignore_merges`).
    pub ignore_merges: bool,
    /// Every byte string that is a token or a side of a merge, by raw bytes. Ids below
    /// `n_vocab` are the token ids; the others name merge sides that are not tokens.
    pieces: FxHashMap<Box<[u8]>, u32>,
    n_vocab: u32,
    /// (left piece, right piece) -> (rank, the piece they merge into); lower ranks merge first.
    ranks: FxHashMap<(u32, u32), (u32, u32)>,
    /// The piece of each single byte, where it is one.
    byte_pieces: [Option<u32>; 256],
    /// The token a lone byte falls back to when a merged symbol is not a token. llama.cpp looks
    /// the byte up as a one-byte string of the byte-level alphabet, which only printable ASCII
    /// can be (any other byte of such a symbol is dropped); a UTF-8 vocabulary's byte tokens
    /// are `<0xHH>`.
    byte_fallback: [Option<u32>; 256],
}

impl Bpe {
    /// `tokens[i]` is token `i`'s text; `merges` the `tokenizer.ggml.merges` strings, by rank.
    pub fn new(
        tokens: &[String],
        merges: &[String],
        pre: PreTokenizer,
        ignore_merges: bool,
    ) -> Bpe {
        Self::build(tokens, merges, pre, ignore_merges, false)
    }

    /// A vocabulary whose tokens and merges are UTF-8 text itself (Gemma 4's).
    pub fn new_utf8(tokens: &[String], merges: &[String], pre: PreTokenizer) -> Bpe {
        Self::build(tokens, merges, pre, false, true)
    }

    fn build(
        tokens: &[String],
        merges: &[String],
        pre: PreTokenizer,
        ignore_merges: bool,
        utf8: bool,
    ) -> Bpe {
        let raw = |text: &str| -> Option<Vec<u8>> {
            if utf8 {
                Some(text.as_bytes().to_vec())
            } else {
                decode_byte_level(text)
            }
        };
        let n_vocab = tokens.len() as u32;
        let mut pieces: FxHashMap<Box<[u8]>, u32> = FxHashMap::default();
        pieces.reserve(tokens.len());
        for (id, text) in tokens.iter().enumerate() {
            if let Some(raw) = raw(text) {
                pieces.insert(raw.into_boxed_slice(), id as u32);
            }
        }
        let mut ranks = FxHashMap::default();
        ranks.reserve(merges.len());
        let mut extra = n_vocab;
        let mut intern = |pieces: &mut FxHashMap<Box<[u8]>, u32>, raw: Vec<u8>| -> u32 {
            *pieces.entry(raw.into_boxed_slice()).or_insert_with(|| {
                extra += 1;
                extra - 1
            })
        };
        for (rank, merge) in merges.iter().enumerate() {
            // llama.cpp splits at the first space after the first byte.
            let Some(sp) = merge.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
                continue; // no two sides: never applies
            };
            let (Some(left), Some(right)) = (raw(&merge[..sp]), raw(&merge[sp + 1..])) else {
                continue; // a side outside the alphabet can never be formed
            };
            if left.is_empty() || right.is_empty() {
                continue;
            }
            let merged = [left.as_slice(), right.as_slice()].concat();
            let l = intern(&mut pieces, left);
            let r = intern(&mut pieces, right);
            let m = intern(&mut pieces, merged);
            // The first listing of a pair wins, as in llama.cpp.
            ranks.entry((l, r)).or_insert((rank as u32, m));
        }
        let mut byte_fallback = [None; 256];
        let mut byte_pieces = [None; 256];
        for b in 0..=255u8 {
            byte_pieces[b as usize] = pieces.get([b].as_slice()).copied();
            byte_fallback[b as usize] = if utf8 {
                // A UTF-8 vocabulary falls back to its byte tokens, `<0xHH>`.
                let text = format!("<0x{b:02X}>");
                pieces.get(text.as_bytes()).copied()
            } else if (0x21..=0x7E).contains(&b) {
                byte_pieces[b as usize]
            } else {
                None
            }
            .filter(|&id| id < n_vocab);
        }
        Bpe {
            pre,
            utf8,
            ignore_merges,
            pieces,
            n_vocab,
            ranks,
            byte_pieces,
            byte_fallback,
        }
    }

    fn token(&self, raw: &[u8]) -> Option<u32> {
        self.pieces
            .get(raw)
            .copied()
            .filter(|&id| id < self.n_vocab)
    }

    /// Tokenize one raw-text fragment: pre-tokenize, then merge each pre-token. A UTF-8
    /// vocabulary's text has its spaces spelled `▁` first, as its tokens do.
    pub fn encode(&self, text: &str, out: &mut Vec<u32>) {
        let mut scratch = Scratch::default();
        let escaped;
        let text = if self.utf8 {
            escaped = text.replace(' ', "\u{2581}");
            escaped.as_str()
        } else {
            text
        };
        for word in self.pre.split(text) {
            self.encode_word(word, out, &mut scratch);
        }
    }

    fn encode_word(&self, text: &str, out: &mut Vec<u32>, s: &mut Scratch) {
        let word = text.as_bytes();
        let whole = (self.ignore_merges || (self.utf8 && word.iter().all(|&b| b == b'\n')))
            .then(|| self.token(word))
            .flatten();
        if let Some(id) = whole {
            out.push(id);
            return;
        }
        s.symbols.clear();
        s.queue.clear();
        // The first symbols: the bytes (byte-level), or the characters (UTF-8 tokens).
        let mut push = |start: usize, len: usize, piece: Option<u32>| {
            let i = s.symbols.len() as i32;
            s.symbols.push(Symbol {
                start: start as u32,
                len: len as u32,
                prev: i - 1,
                next: if start + len == word.len() { -1 } else { i + 1 },
                piece,
            });
        };
        if self.utf8 {
            for (i, c) in text.char_indices() {
                let bytes = &word[i..i + c.len_utf8()];
                push(i, bytes.len(), self.pieces.get(bytes).copied());
            }
        } else {
            for (i, &b) in word.iter().enumerate() {
                push(i, 1, self.byte_pieces[b as usize]);
            }
        }
        for i in 1..s.symbols.len() {
            self.push_pair(s, i as i32 - 1, i as i32);
        }
        while let Some(Reverse(Candidate {
            left,
            right,
            size,
            merged,
            ..
        })) = s.queue.pop()
        {
            let (l, r) = (left as usize, right as usize);
            let (ln, rn) = (s.symbols[l].len, s.symbols[r].len);
            // A pair made stale by an earlier merge on either side: skip it.
            if ln == 0 || rn == 0 || ln + rn != size {
                continue;
            }
            let next = s.symbols[r].next;
            let sym = &mut s.symbols[l];
            sym.len += rn;
            sym.next = next;
            sym.piece = Some(merged);
            s.symbols[r].len = 0;
            if next >= 0 {
                s.symbols[next as usize].prev = left as i32;
            }
            let prev = s.symbols[l].prev;
            self.push_pair(s, prev, left as i32);
            self.push_pair(s, left as i32, next);
        }
        for sym in s.symbols.iter().filter(|s| s.len > 0) {
            let bytes = &word[sym.start as usize..(sym.start + sym.len) as usize];
            match sym.piece.filter(|&id| id < self.n_vocab) {
                Some(id) => out.push(id),
                None => out.extend(bytes.iter().filter_map(|&b| self.byte_fallback[b as usize])),
            }
        }
    }

    fn push_pair(&self, s: &mut Scratch, left: i32, right: i32) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (&s.symbols[left as usize], &s.symbols[right as usize]);
        let (Some(lp), Some(rp)) = (l.piece, r.piece) else {
            return;
        };
        if let Some(&(rank, merged)) = self.ranks.get(&(lp, rp)) {
            s.queue.push(Reverse(Candidate {
                rank,
                left: left as u32,
                right: right as u32,
                size: l.len + r.len,
                merged,
            }));
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: u32,
    /// 0 once merged into the symbol on its left.
    len: u32,
    prev: i32,
    next: i32,
    /// The symbol's bytes as a piece id, if they are a token or a merge side.
    piece: Option<u32>,
}

/// Buffers reused across the pre-tokens of one fragment.
#[derive(Default)]
struct Scratch {
    symbols: Vec<Symbol>,
    /// Lowest rank first, then leftmost.
    queue: BinaryHeap<Reverse<Candidate>>,
}

/// A pair of adjacent symbols that a merge applies to. Ordered by rank, then left position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate {
    rank: u32,
    left: u32,
    right: u32,
    /// Bytes in the pair when queued: a later merge on either side changes it.
    size: u32,
    /// The piece the two merge into.
    merged: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn byte_to_char(b: u8) -> char {
        (0..=0x143u32)
            .filter_map(char::from_u32)
            .find(|&c| char_to_byte(c) == Some(b))
            .unwrap()
    }

    #[test]
    fn byte_level_alphabet_is_a_bijection() {
        assert_eq!(byte_to_char(b' '), 'Ġ');
        assert_eq!(byte_to_char(b'\n'), 'Ċ');
        assert_eq!(byte_to_char(b'a'), 'a');
        assert_eq!(byte_to_char(0xAD), 'Ń');
        let mut seen = std::collections::HashSet::new();
        for b in 0..=255u8 {
            let c = byte_to_char(b);
            assert!(seen.insert(c));
            assert_eq!(char_to_byte(c), Some(b));
        }
        assert_eq!(char_to_byte('Ŕ'), None); // U+0154, past the 68 remapped bytes
        assert_eq!(char_to_byte(' '), None);
    }

    #[test]
    fn merges_lowest_rank_first() {
        let tokens: Vec<String> = ["a", "b", "c", "ab", "bc", "abc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let merges: Vec<String> = ["b c", "a b", "a bc"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let bpe = Bpe::new(&tokens, &merges, PreTokenizer::Gpt2, false);
        let mut out = Vec::new();
        bpe.encode("abc", &mut out);
        assert_eq!(out, [5]); // b+c first (rank 0), then a+bc
        out.clear();
        bpe.encode("ab", &mut out);
        assert_eq!(out, [3]);
    }
}
