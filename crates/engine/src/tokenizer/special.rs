//! Splitting a text at special tokens before the model's own tokenizer sees it.
//!
//! llama.cpp (`tokenizer_st_partition`) takes the special tokens longest first and, for each,
//! cuts every leftmost non-overlapping occurrence out of the text fragments that are still raw;
//! a token may carry LSTRIP/RSTRIP, which drops the white space beside it. Done literally that is
//! one substring search per special token per fragment: Gemma 3 has 6414 special tokens. Here
//! one pass of a byte trie finds every occurrence of every special token, and the cuts are then
//! replayed in llama.cpp's order, each accepted only if it still lies inside one raw fragment.
//! That gives the same fragments: an occurrence llama.cpp's search reaches is exactly one that
//! lies in a raw fragment and overlaps no cut made before it.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;

/// A piece of the input: raw text for the model's tokenizer, or a special token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Fragment {
    Text(Range<usize>),
    Token(u32),
}

/// One special token as the partition needs it.
#[derive(Debug, Clone)]
pub(crate) struct Special {
    pub id: u32,
    /// Skipped unless special tokens are parsed (control and unknown tokens).
    pub needs_parse_special: bool,
    pub lstrip: bool,
    pub rstrip: bool,
}

/// The special tokens, in llama.cpp's order (longest text first), and a trie over their texts.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecialMatcher {
    /// Sorted by text length, longest first; ties by id (llama.cpp's sort is unstable there,
    /// which matters only for two equally long tokens that overlap in a text).
    specials: Vec<Special>,
    /// Trie edges: (node, byte) -> node. Node 0 is the root.
    edges: HashMap<(u32, u8), u32>,
    /// Index into `specials` of the token that ends at each node, if any.
    terminal: Vec<Option<u32>>,
    /// Whether some special token starts with this byte: most positions stop here.
    starts: Vec<bool>,
}

impl SpecialMatcher {
    /// `tokens`: (special, text) in llama.cpp's order (see [`SpecialMatcher::specials`]).
    pub fn new(tokens: Vec<(Special, &[u8])>) -> SpecialMatcher {
        let mut m = SpecialMatcher {
            specials: Vec::with_capacity(tokens.len()),
            edges: HashMap::new(),
            terminal: vec![None],
            starts: vec![false; 256],
        };
        for (rank, (special, text)) in tokens.into_iter().enumerate() {
            m.specials.push(special);
            if let Some(&b) = text.first() {
                m.starts[b as usize] = true;
            }
            let mut node = 0u32;
            for &b in text {
                let next = m.terminal.len() as u32;
                node = *m.edges.entry((node, b)).or_insert_with(|| next);
                if node == next {
                    m.terminal.push(None);
                }
            }
            // Texts are unique, so no node is claimed twice; the first (longest-first order)
            // would win anyway.
            m.terminal[node as usize].get_or_insert(rank as u32);
        }
        m
    }

    /// Split `text` into raw fragments and special tokens, as llama.cpp does.
    pub fn partition(&self, text: &[u8], parse_special: bool) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        // Every occurrence of every eligible special token: (rank, start, length).
        let mut found: Vec<(u32, usize, usize)> = Vec::new();
        if !self.specials.is_empty() {
            for start in 0..text.len() {
                if !self.starts[text[start] as usize] {
                    continue;
                }
                let mut node = 0u32;
                for (k, &b) in text[start..].iter().enumerate() {
                    match self.edges.get(&(node, b)) {
                        Some(&n) => node = n,
                        None => break,
                    }
                    if let Some(rank) = self.terminal[node as usize] {
                        if parse_special || !self.specials[rank as usize].needs_parse_special {
                            found.push((rank, start, k + 1));
                        }
                    }
                }
            }
        }
        if found.is_empty() {
            return vec![Fragment::Text(0..text.len())];
        }
        found.sort_unstable();

        // Raw fragments by start -> end, and the tokens cut out, by position.
        let mut raw: BTreeMap<usize, usize> = BTreeMap::from([(0, text.len())]);
        let mut tokens: BTreeMap<usize, u32> = BTreeMap::new();
        for (rank, start, len) in found {
            let end = start + len;
            let Some((&f_start, &f_end)) = raw.range(..=start).next_back() else {
                continue;
            };
            if end > f_end {
                continue; // not inside one raw fragment: cut by an earlier token
            }
            let special = &self.specials[rank as usize];
            raw.remove(&f_start);
            let mut left_end = start;
            if special.lstrip {
                while left_end > f_start && is_c_space(text[left_end - 1]) {
                    left_end -= 1;
                }
            }
            if left_end > f_start {
                raw.insert(f_start, left_end);
            }
            let mut right_start = end;
            if special.rstrip {
                while right_start < f_end && is_c_space(text[right_start]) {
                    right_start += 1;
                }
            }
            if right_start < f_end {
                raw.insert(right_start, f_end);
            }
            tokens.insert(start, special.id);
        }

        let mut out = Vec::with_capacity(raw.len() + tokens.len());
        let mut raw = raw.into_iter().peekable();
        let mut tokens = tokens.into_iter().peekable();
        loop {
            match (raw.peek(), tokens.peek()) {
                (Some(&(rs, re)), Some(&(tp, _))) if rs < tp => {
                    out.push(Fragment::Text(rs..re));
                    raw.next();
                }
                (_, Some(&(_, id))) => {
                    out.push(Fragment::Token(id));
                    tokens.next();
                }
                (Some(&(rs, re)), None) => {
                    out.push(Fragment::Text(rs..re));
                    raw.next();
                }
                (None, None) => break,
            }
        }
        out
    }
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(tokens: &[(&str, u32, bool)]) -> SpecialMatcher {
        let mut v: Vec<(Special, &[u8])> = tokens
            .iter()
            .map(|&(t, id, ctl)| {
                (
                    Special {
                        id,
                        needs_parse_special: ctl,
                        lstrip: false,
                        rstrip: false,
                    },
                    t.as_bytes(),
                )
            })
            .collect();
        v.sort_by(|a, b| b.1.len().cmp(&a.1.len()).then(a.0.id.cmp(&b.0.id)));
        SpecialMatcher::new(v)
    }

    fn show(text: &str, frags: &[Fragment]) -> Vec<String> {
        frags
            .iter()
            .map(|f| match f {
                Fragment::Text(r) => text[r.clone()].to_string(),
                Fragment::Token(id) => format!("#{id}"),
            })
            .collect()
    }

    #[test]
    fn longest_first_and_non_overlapping() {
        let m = matcher(&[("<a>", 1, true), ("<a><a>", 2, true), ("a>", 3, false)]);
        let text = "x<a><a><a>y";
        assert_eq!(
            show(text, &m.partition(text.as_bytes(), true)),
            ["x", "#2", "#1", "y"]
        );
        // Without special parsing only the non-control token is cut.
        assert_eq!(
            show(text, &m.partition(text.as_bytes(), false)),
            ["x<", "#3", "<", "#3", "<", "#3", "y"]
        );
    }

    #[test]
    fn longer_token_cut_first_wins_over_leftmost() {
        // "bc" is cut before "ab" is looked for, so "ab" no longer fits.
        let m = matcher(&[("ab", 1, true), ("bcd", 2, true)]);
        let text = "abcd";
        assert_eq!(show(text, &m.partition(text.as_bytes(), true)), ["a", "#2"]);
    }

    #[test]
    fn strip_flags_drop_white_space() {
        let mut v = vec![(
            Special {
                id: 7,
                needs_parse_special: true,
                lstrip: true,
                rstrip: true,
            },
            b"<m>".as_slice(),
        )];
        v.truncate(1);
        let m = SpecialMatcher::new(v);
        let text = "a  <m>\t b";
        assert_eq!(
            show(text, &m.partition(text.as_bytes(), true)),
            ["a", "#7", "b"]
        );
        let text = " <m> ";
        assert_eq!(show(text, &m.partition(text.as_bytes(), true)), ["#7"]);
    }
}
