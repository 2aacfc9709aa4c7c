//! Splitting a text at special tokens before the model's own tokenizer sees it.
//!
//! llama.cpp (`tokenizer_st_partition`) takes the special tokens longest first and, for each,
//! cuts every leftmost non-overlapping occurrence out of the text fragments that are still raw;
//! a token may carry LSTRIP/RSTRIP, which drops the white space beside it. Done literally that is
//! one substring search per special token per fragment: Gemma 3 has 6414 special tokens.
//!
//! Here one pass of a byte trie finds, at each position, the longest special token starting
//! there; the shorter ones starting there are its terminal ancestors in the trie. The cuts are
//! then replayed one token length at a time, longest first, positions left to right, each cut
//! accepted only if it still lies inside one raw fragment. That gives llama.cpp's fragments: an
//! occurrence its search reaches is exactly one that lies in a raw fragment and overlaps no cut
//! made before it. (Between two equally long tokens llama.cpp's order is unspecified, its sort
//! being unstable; here the leftmost occurrence goes first. It matters only when two different
//! equally long special tokens overlap in a text.) Memory stays linear in the text: one cursor
//! per position where a special token starts.

use std::collections::BTreeMap;
use std::ops::Range;

use super::fxhash::FxHashMap;

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

#[derive(Debug, Clone, Copy)]
struct Node {
    /// The special token whose text ends here, as an index into `specials`.
    terminal: Option<u32>,
    /// The nearest proper ancestor that ends a special token.
    up: Option<u32>,
    /// Bytes from the root: the length of the text ending here.
    depth: u32,
}

/// The special tokens and a trie over their texts.
#[derive(Debug, Clone, Default)]
pub(crate) struct SpecialMatcher {
    specials: Vec<Special>,
    /// Trie edges: (node, byte) -> node. Node 0 is the root.
    edges: FxHashMap<(u32, u8), u32>,
    nodes: Vec<Node>,
    /// Whether some special token starts with this byte: most positions stop here.
    starts: Vec<bool>,
    /// Every special token length, longest first.
    lengths: Vec<u32>,
}

impl SpecialMatcher {
    /// `tokens`: the special tokens with their texts (unique, as the vocabulary's are).
    pub fn new(tokens: Vec<(Special, &[u8])>) -> SpecialMatcher {
        let root = Node {
            terminal: None,
            up: None,
            depth: 0,
        };
        let mut m = SpecialMatcher {
            specials: Vec::with_capacity(tokens.len()),
            edges: FxHashMap::default(),
            nodes: vec![root],
            starts: vec![false; 256],
            lengths: Vec::new(),
        };
        let mut parent = vec![0u32];
        for (special, text) in tokens {
            if text.is_empty() {
                continue;
            }
            m.specials.push(special);
            m.starts[text[0] as usize] = true;
            m.lengths.push(text.len() as u32);
            let mut node = 0u32;
            for &b in text {
                let next = m.nodes.len() as u32;
                let child = *m.edges.entry((node, b)).or_insert(next);
                if child == next {
                    m.nodes.push(Node {
                        terminal: None,
                        up: None,
                        depth: m.nodes[node as usize].depth + 1,
                    });
                    parent.push(node);
                }
                node = child;
            }
            m.nodes[node as usize]
                .terminal
                .get_or_insert(m.specials.len() as u32 - 1);
        }
        // A node is made after its parent, so one pass in id order sees every parent first.
        for (node, &p) in parent.iter().enumerate().skip(1) {
            let p = p as usize;
            m.nodes[node].up = if m.nodes[p].terminal.is_some() {
                Some(p as u32)
            } else {
                m.nodes[p].up
            };
        }
        m.lengths.sort_unstable_by(|a, b| b.cmp(a));
        m.lengths.dedup();
        m
    }

    /// Split `text` into raw fragments and special tokens, as llama.cpp does.
    pub fn partition(&self, text: &[u8], parse_special: bool) -> Vec<Fragment> {
        if text.is_empty() {
            return Vec::new();
        }
        let eligible = |node: u32| {
            self.nodes[node as usize]
                .terminal
                .is_some_and(|s| parse_special || !self.specials[s as usize].needs_parse_special)
        };
        // Climb from `node` to the nearest eligible terminal (itself included).
        let settle = |mut node: Option<u32>| {
            while let Some(n) = node {
                if eligible(n) {
                    break;
                }
                node = self.nodes[n as usize].up;
            }
            node
        };

        // At each position, the longest eligible special token starting there: (start, node).
        let mut cursors: Vec<(usize, u32)> = Vec::new();
        for start in 0..text.len() {
            if !self.starts[text[start] as usize] {
                continue;
            }
            let mut node = 0u32;
            let mut deepest = None;
            for &b in &text[start..] {
                match self.edges.get(&(node, b)) {
                    Some(&n) => node = n,
                    None => break,
                }
                if self.nodes[node as usize].terminal.is_some() {
                    deepest = Some(node);
                }
            }
            if let Some(node) = settle(deepest) {
                cursors.push((start, node));
            }
        }
        if cursors.is_empty() {
            return vec![Fragment::Text(0..text.len())];
        }

        // Raw fragments by start -> end, and the tokens cut out, by position.
        let mut raw: BTreeMap<usize, usize> = BTreeMap::from([(0, text.len())]);
        let mut tokens: BTreeMap<usize, u32> = BTreeMap::new();
        for &len in &self.lengths {
            if cursors.is_empty() {
                break;
            }
            for cursor in cursors.iter_mut() {
                let (start, node) = *cursor;
                let n = &self.nodes[node as usize];
                if n.depth != len {
                    continue; // a shorter token: its turn comes
                }
                // Next time, the next shorter eligible token starting here.
                cursor.1 = settle(n.up).unwrap_or(u32::MAX);
                let Some(index) = n.terminal else { continue };
                let end = start + len as usize;
                let Some((&f_start, &f_end)) = raw.range(..=start).next_back() else {
                    continue;
                };
                if end > f_end {
                    continue; // not inside one raw fragment: cut by an earlier token
                }
                let special = &self.specials[index as usize];
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
            cursors.retain(|&(_, node)| node != u32::MAX);
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
    fn nested_tokens_at_one_position() {
        let m = matcher(&[("\n", 1, false), ("\n\n", 2, false), ("\n\n\n", 3, false)]);
        let text = "\n".repeat(7);
        assert_eq!(
            show(&text, &m.partition(text.as_bytes(), false)),
            ["#3", "#3", "#1"]
        );
        let text = format!("a{}b", "\n".repeat(5));
        assert_eq!(
            show(&text, &m.partition(text.as_bytes(), true)),
            ["a", "#3", "#2", "b"]
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
