//! SentencePiece BPE (`tokenizer.ggml.model = "llama"`), as llama.cpp runs it: start from the
//! text's characters and repeatedly merge the adjacent pair whose concatenation is the
//! highest-scoring token; characters left that are not tokens fall back to byte tokens.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::fxhash::FxHashMap;

#[derive(Debug, Clone)]
pub(crate) struct Spm {
    /// The token for each byte: `<0xHH>`, else the one-byte text, else the unknown token.
    pub byte_tokens: [Option<u32>; 256],
}

/// The vocabulary a merge loop reads.
pub(crate) struct SpmVocab<'a> {
    pub token_to_id: &'a FxHashMap<Box<[u8]>, u32>,
    pub scores: &'a [f32],
}

impl Spm {
    /// Tokenize `text` (spaces already replaced by `▁`).
    pub fn encode(&self, vocab: &SpmVocab, text: &[u8], out: &mut Vec<u32>) {
        let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
        let mut offs = 0;
        while offs < text.len() {
            let len = utf8_len(text[offs]).min(text.len() - offs);
            let i = symbols.len() as i32;
            symbols.push(Symbol {
                start: offs as u32,
                len: len as u32,
                prev: i - 1,
                next: if offs + len == text.len() { -1 } else { i + 1 },
            });
            offs += len;
        }
        let mut queue = BinaryHeap::new();
        let try_pair =
            |symbols: &[Symbol], queue: &mut BinaryHeap<Bigram>, left: i32, right: i32| {
                if left < 0 || right < 0 {
                    return;
                }
                let (l, r) = (&symbols[left as usize], &symbols[right as usize]);
                let start = l.start as usize;
                let size = l.len + r.len;
                let Some(&id) = vocab.token_to_id.get(&text[start..start + size as usize]) else {
                    return;
                };
                queue.push(Bigram {
                    score: vocab.scores.get(id as usize).copied().unwrap_or(0.0),
                    left: left as u32,
                    right: right as u32,
                    size,
                });
            };
        for i in 1..symbols.len() as i32 {
            try_pair(&symbols, &mut queue, i - 1, i);
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (b.left as usize, b.right as usize);
            let (ln, rn) = (symbols[l].len, symbols[r].len);
            // Skip a pair one of whose symbols has merged since it was queued.
            if ln == 0 || rn == 0 || ln + rn != b.size {
                continue;
            }
            let next = symbols[r].next;
            symbols[l].len += rn;
            symbols[l].next = next;
            symbols[r].len = 0;
            if next >= 0 {
                symbols[next as usize].prev = b.left as i32;
            }
            try_pair(&symbols, &mut queue, symbols[l].prev, b.left as i32);
            try_pair(&symbols, &mut queue, b.left as i32, next);
        }
        // Every merged symbol is a token; a single character may not be, and goes out as bytes.
        // (llama.cpp's re-segmentation through the merge history never applies to valid UTF-8.)
        let mut i = if symbols.is_empty() { -1 } else { 0 };
        while i >= 0 {
            let sym = &symbols[i as usize];
            let bytes = &text[sym.start as usize..(sym.start + sym.len) as usize];
            match vocab.token_to_id.get(bytes) {
                Some(&id) => out.push(id),
                None => out.extend(bytes.iter().filter_map(|&b| self.byte_tokens[b as usize])),
            }
            i = sym.next;
        }
    }
}

/// Bytes in a UTF-8 sequence, from its first byte (1 for a stray continuation byte).
fn utf8_len(b: u8) -> usize {
    match b >> 4 {
        0xC | 0xD => 2,
        0xE => 3,
        0xF => 4,
        _ => 1,
    }
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: u32,
    /// 0 once merged into the symbol on its left.
    len: u32,
    prev: i32,
    next: i32,
}

/// A candidate merge: highest score first, then leftmost.
#[derive(Debug, Clone, Copy)]
struct Bigram {
    score: f32,
    left: u32,
    right: u32,
    size: u32,
}

impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // llama.cpp compares scores with `<`: -0.0 equals 0.0, and NaN ties with everything.
        let by_score = if self.score < other.score {
            Ordering::Less
        } else if self.score > other.score {
            Ordering::Greater
        } else {
            Ordering::Equal
        };
        by_score.then_with(|| other.left.cmp(&self.left))
    }
}

impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Bigram {}
