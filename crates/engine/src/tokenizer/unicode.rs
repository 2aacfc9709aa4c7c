//! Code point classes for the pre-tokenizers: `\p{L}`, `\p{N}`, `\s` and friends, exactly as
//! llama.cpp classifies them (its table, not this machine's Unicode version: see
//! [`super::unicode_data`]).

use super::unicode_data::{CATEGORY_RANGES, WHITESPACE};

/// A code point's classes: one general-category bit plus [`Flags::WHITESPACE`]. Zero means "no
/// code point" (past the end of the text), which some pre-tokenizer rules test for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Flags(u16);

impl Flags {
    pub const UNDEFINED: u16 = 0x0001;
    pub const NUMBER: u16 = 0x0002; // \p{N}
    pub const LETTER: u16 = 0x0004; // \p{L}
    #[cfg_attr(not(test), allow(dead_code))]
    pub const SEPARATOR: u16 = 0x0008; // \p{Z}
    #[cfg_attr(not(test), allow(dead_code))]
    pub const MARK: u16 = 0x0010; // \p{M}
    pub const PUNCTUATION: u16 = 0x0020; // \p{P}
    #[cfg_attr(not(test), allow(dead_code))]
    pub const SYMBOL: u16 = 0x0040; // \p{S}
    #[cfg_attr(not(test), allow(dead_code))]
    pub const CONTROL: u16 = 0x0080; // \p{C}
    pub const CATEGORIES: u16 = 0x00FF;
    pub const WHITESPACE: u16 = 0x0100; // \s

    /// No code point: the flags of a position outside the text.
    pub const NONE: Flags = Flags(0);

    pub fn of(cp: u32) -> Flags {
        if cp < 0x80 {
            return Flags(ASCII[cp as usize]);
        }
        Flags(
            category(cp) as u16
                | if is_whitespace(cp) {
                    Self::WHITESPACE
                } else {
                    0
                },
        )
    }

    pub fn is_none(self) -> bool {
        self.0 == 0
    }
    pub fn is_letter(self) -> bool {
        self.0 & Self::LETTER != 0
    }
    pub fn is_number(self) -> bool {
        self.0 & Self::NUMBER != 0
    }
    pub fn is_mark(self) -> bool {
        self.0 & Self::MARK != 0
    }
    pub fn is_whitespace(self) -> bool {
        self.0 & Self::WHITESPACE != 0
    }
    #[cfg_attr(not(test), allow(dead_code))]
    pub fn is_punctuation(self) -> bool {
        self.0 & Self::PUNCTUATION != 0
    }
    /// The general category alone (one of the category bits).
    pub fn category(self) -> u16 {
        self.0 & Self::CATEGORIES
    }
}

/// The category bits of a code point; code points past U+10FFFF are undefined.
fn category(cp: u32) -> u8 {
    if cp > 0x10FFFF {
        return Flags::UNDEFINED as u8;
    }
    // The last range whose start is <= cp; the table starts at 0, so there always is one.
    let i = CATEGORY_RANGES.partition_point(|&(start, _)| start <= cp);
    CATEGORY_RANGES[i.saturating_sub(1)].1
}

fn is_whitespace(cp: u32) -> bool {
    WHITESPACE.binary_search(&cp).is_ok()
}

static ASCII: [u16; 128] = ascii_table();

const fn ascii_table() -> [u16; 128] {
    let mut t = [0u16; 128];
    let mut cp = 0;
    while cp < 128 {
        // Same table as above, resolved at compile time for the common case.
        let mut i = 0;
        while i + 1 < CATEGORY_RANGES.len() && CATEGORY_RANGES[i + 1].0 <= cp as u32 {
            i += 1;
        }
        let mut f = CATEGORY_RANGES[i].1 as u16;
        let mut w = 0;
        while w < WHITESPACE.len() {
            if WHITESPACE[w] == cp as u32 {
                f |= Flags::WHITESPACE;
            }
            w += 1;
        }
        t[cp] = f;
        cp += 1;
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classes_match_llama_cpp_table() {
        assert!(Flags::of('a' as u32).is_letter());
        assert!(Flags::of('Z' as u32).is_letter());
        assert!(Flags::of('7' as u32).is_number());
        assert!(Flags::of(' ' as u32).is_whitespace());
        assert!(Flags::of('\n' as u32).is_whitespace());
        assert!(Flags::of(0x0B).is_whitespace());
        assert!(!Flags::of(0x1C).is_whitespace()); // \s in llama.cpp's table excludes FS
        assert!(Flags::of(0x3000).is_whitespace());
        assert!(Flags::of(0x00A0).is_whitespace());
        assert!(!Flags::of(0x200B).is_whitespace()); // zero-width space is a format char
        assert!(Flags::of(0x4E2D).is_letter()); // 中
        assert!(Flags::of(0x0661).is_number()); // Arabic-Indic one
        assert!(Flags::of(0x00BD).is_number()); // ½
        assert!(Flags::of('!' as u32).is_punctuation());
        assert_eq!(Flags::of('$' as u32).category(), Flags::SYMBOL);
        assert_eq!(Flags::of(' ' as u32).category(), Flags::SEPARATOR);
        assert_eq!(Flags::of('\n' as u32).category(), Flags::CONTROL);
        assert_eq!(Flags::of(0x0301).category(), Flags::MARK);
        assert_eq!(Flags::of(0x1F600).category(), Flags::SYMBOL);
        assert_eq!(Flags::of(0x0378).category(), Flags::UNDEFINED);
        assert_eq!(Flags::of(0x10FFFF).category(), Flags::UNDEFINED);
        assert!(!Flags::of(0).is_none());
    }
}
