//! Pre-tokenizers: the regex splits a byte-level BPE vocabulary runs before its merges, one set
//! per `tokenizer.ggml.pre` family, with llama.cpp's semantics (`src/unicode.cpp`).
//!
//! llama.cpp applies a list of regexes in turn; each splits every piece the previous ones left,
//! and the text between matches stays a piece of its own. The common regexes it runs through
//! hand-written matchers (GPT-2's, Llama 3's, Qwen 2's), the others through `std::regex` on a
//! "collapsed" text where each non-ASCII code point stands for its category. Both are written
//! here as plain scanners over code points, which keeps the exact behaviour (including the
//! places where the hand-written matchers differ from the regex they replace) and needs no regex
//! engine.

use super::unicode::Flags;

/// A pre-tokenizer regex set, named after the `tokenizer.ggml.pre` value that introduced it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PreTokenizer {
    /// `default` (and a missing key): `[\p{P}\$\+<=>\^~\|]+`, then GPT-2's, then `\p{N}+`, then
    /// `[0-9][0-9][0-9]`.
    Default,
    /// `gpt-2` and kin: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)`.
    Gpt2,
    /// `llama3`, `llama-bpe` and kin:
    /// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
    Llama3,
    /// `qwen2` and kin: Llama 3's with single digits (`\p{N}` for `\p{N}{1,3}`).
    Qwen2,
    /// `qwen35`: Qwen 2's with combining marks in letter runs and out of punctuation runs:
    /// `[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+` and ` ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*`.
    Qwen35,
    /// `smollm`, `starcoder` and kin: every `\p{N}` on its own, then GPT-2's.
    StarCoder,
    /// `falcon`: ``[\p{P}\$\+<=>\^~\|`]+``, then GPT-2's, then `[0-9][0-9][0-9]`.
    Falcon,
    /// `deepseek-coder`: `[\r\n]`, `\s?\p{L}+`, `\s?\p{P}+`, `[一-龥ࠀ-一가-퟿]+`, `\p{N}`.
    DeepSeekCoder,
    /// `gemma4` (Gemma 4's SentencePiece-style BPE, spaces already `▁`): `[^\n]+|[\n]+`, runs
    /// of newlines and of everything else.
    Gemma4,
    /// `tekken` (Mistral's Tekken), as llama.cpp runs it:
    /// `[^\r\n\p{L}\p{N}]?U*L+|[^\r\n\p{L}\p{N}]?U+L*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`,
    /// where U is a letter other than `a-z` and L one other than `A-Z` (its rewrite of the
    /// upper- and lower-case classes): words split before each capital of a CamelCase run.
    Tekken,
    /// `gpt-4o`, `llama4` and kin (GPT-4o's o200k): Tekken's with an optional contraction
    /// (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`, either case) after each word and
    /// `\p{N}{1,3}`.
    Gpt4o,
    /// `deepseek-llm`: `[\r\n]`, `\s?` and a run of letters of an explicit set (Latin, Greek,
    /// Cyrillic, Armenian, Georgian, Cherokee, ...), `\s?` and a run of ASCII or full-width
    /// punctuation, `\s+$`, `[一-龥ࠀ-一가-퟿]+`, `\p{N}+`.
    DeepSeekLlm,
}

/// What a `tokenizer.ggml.pre` value selects, with the flags llama.cpp sets alongside.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreConfig {
    pub kind: PreTokenizer,
    /// Detokenization tidies spaces before punctuation (`clean_up_tokenization_spaces`).
    pub clean_spaces: bool,
    /// A pre-token that is itself in the vocabulary is taken whole, without merges.
    pub ignore_merges: bool,
    /// The default for `tokenizer.ggml.add_bos_token` when the key is absent.
    pub add_bos: bool,
}

/// `tokenizer.ggml.pre` values this crate implements, with llama.cpp's settings for each
/// (`llama_vocab::impl::load`). Several names share one regex set.
const PRE_TABLE: &[(&str, PreTokenizer, bool, bool, bool)] = {
    use PreTokenizer::*;
    // (name, regex set, clean_spaces, ignore_merges, add_bos)
    &[
        ("default", Default, true, false, false),
        ("llama3", Llama3, true, true, true),
        ("llama-v3", Llama3, true, true, true),
        ("llama-bpe", Llama3, true, true, true),
        ("falcon3", Llama3, true, true, true),
        ("falcon-h1", Llama3, true, true, true),
        ("pixtral", Llama3, true, true, true),
        ("midm-2.0", Llama3, true, true, true),
        ("lfm2", Llama3, true, true, true),
        ("jina-v5-nano", Llama3, true, true, true),
        ("dbrx", Llama3, true, false, false),
        ("smaug-bpe", Llama3, true, false, false),
        ("qwen2", Qwen2, false, false, false),
        ("qwen35", Qwen35, false, false, false),
        ("deepseek-r1-qwen", Qwen2, false, false, false),
        ("kormo", Qwen2, false, false, false),
        ("f2llmv2", Qwen2, false, false, false),
        ("hunyuan", Qwen2, false, false, false),
        ("solar-open", Qwen2, false, false, false),
        ("stablelm2", Qwen2, true, false, false),
        ("megrez", Qwen2, true, false, false),
        ("gpt-2", Gpt2, true, false, false),
        ("phi-2", Gpt2, true, false, false),
        ("jina-es", Gpt2, true, false, false),
        ("jina-de", Gpt2, true, false, false),
        ("gigachat", Gpt2, true, false, false),
        ("jina-v2-es", Gpt2, true, false, false),
        ("jina-v2-de", Gpt2, true, false, false),
        ("a.x-4.0", Gpt2, true, false, false),
        ("mellum", Gpt2, true, false, false),
        ("modern-bert", Gpt2, true, false, false),
        ("jina-v1-en", Gpt2, true, false, false),
        ("jina-v2-code", Gpt2, true, false, false),
        ("roberta-bpe", Gpt2, true, false, false),
        ("mpt", Gpt2, true, false, false),
        ("olmo", Gpt2, true, false, false),
        ("jais", Gpt2, true, false, false),
        ("exaone4", Gpt2, true, false, false),
        ("trillion", Gpt2, false, false, false),
        ("granite-docling", Gpt2, false, false, false),
        ("smollm", StarCoder, false, false, false),
        ("command-r", StarCoder, false, false, false),
        ("starcoder", StarCoder, true, false, false),
        ("refact", StarCoder, true, false, false),
        ("codeshell", StarCoder, true, false, false),
        ("exaone", StarCoder, true, false, false),
        ("minerva-7b", StarCoder, true, false, false),
        ("mellum2", StarCoder, true, false, false),
        ("falcon", Falcon, true, false, false),
        ("deepseek-coder", DeepSeekCoder, false, false, false),
        ("deepseek-llm", DeepSeekLlm, false, false, false),
        ("gemma4", Gemma4, true, false, true),
        ("tekken", Tekken, false, true, true),
        ("gpt-4o", Gpt4o, false, false, false),
        ("llama4", Gpt4o, false, false, false),
        ("kanana2", Gpt4o, false, false, false),
        ("talkie", Gpt4o, false, false, false),
        ("minimax-m2", Gpt4o, false, false, false),
    ]
};

impl PreConfig {
    /// The settings for a `tokenizer.ggml.pre` value, or `None` if it is not implemented here.
    pub fn from_name(name: &str) -> Option<PreConfig> {
        PRE_TABLE.iter().find(|e| e.0 == name).map(
            |&(_, kind, clean_spaces, ignore_merges, add_bos)| PreConfig {
                kind,
                clean_spaces,
                ignore_merges,
                add_bos,
            },
        )
    }

    /// Every `tokenizer.ggml.pre` value [`PreConfig::from_name`] accepts.
    pub fn supported_names() -> impl Iterator<Item = &'static str> {
        PRE_TABLE.iter().map(|e| e.0)
    }
}

/// One regex of a set; see [`PreTokenizer`].
#[derive(Clone, Copy)]
enum Stage {
    /// `[\p{P}\$\+<=>\^~\|]+`
    PunctuationRuns,
    /// The GPT-2 regex, llama.cpp's hand-written matcher.
    Gpt2,
    /// The Llama 3 (`max_digits` 3) or Qwen 2 (`max_digits` 1) regex, hand-written matcher;
    /// with `marks`, Qwen 3.5's (combining marks join letter runs).
    Llama3 { max_digits: usize, marks: bool },
    /// `\p{N}`
    EachNumber,
    /// `\p{N}+`
    NumberRuns,
    /// `[0-9][0-9][0-9]`
    AsciiDigitTriples,
    /// Runs of a class (`[...]+`).
    Runs(fn(u32) -> bool),
    /// Each code point of a class on its own (`[...]`).
    Each(fn(u32) -> bool),
    /// An optional whitespace, then a run of a class (`\s?[...]+`).
    SpaceThenRun(fn(u32) -> bool),
    /// The whitespace that ends a piece (`\s+$`).
    TrailingSpace,
    /// Tekken's regex (`max_digits` 1) or GPT-4o's (`max_digits` 3, with `contractions`).
    Cased {
        max_digits: usize,
        contractions: bool,
    },
}

impl PreTokenizer {
    fn stages(self) -> &'static [Stage] {
        match self {
            PreTokenizer::Default => &[
                Stage::PunctuationRuns,
                Stage::Gpt2,
                Stage::NumberRuns,
                Stage::AsciiDigitTriples,
            ],
            PreTokenizer::Gpt2 => &[Stage::Gpt2],
            PreTokenizer::Llama3 => &[Stage::Llama3 {
                max_digits: 3,
                marks: false,
            }],
            PreTokenizer::Qwen2 => &[Stage::Llama3 {
                max_digits: 1,
                marks: false,
            }],
            PreTokenizer::Qwen35 => &[Stage::Llama3 {
                max_digits: 1,
                marks: true,
            }],
            PreTokenizer::StarCoder => &[Stage::EachNumber, Stage::Gpt2],
            PreTokenizer::Falcon => &[
                Stage::Runs(is_falcon_punctuation),
                Stage::Gpt2,
                Stage::AsciiDigitTriples,
            ],
            PreTokenizer::DeepSeekCoder => &[
                Stage::Each(is_cr_lf),
                Stage::SpaceThenRun(is_letter),
                Stage::SpaceThenRun(is_punctuation),
                Stage::Runs(is_cjk),
                Stage::EachNumber,
            ],
            // Runs of newlines and of the rest: the text between the matches of `[\n]+` is
            // every `[^\n]+` run.
            PreTokenizer::Gemma4 => &[Stage::Runs(is_lf)],
            PreTokenizer::Tekken => &[Stage::Cased {
                max_digits: 1,
                contractions: false,
            }],
            PreTokenizer::Gpt4o => &[Stage::Cased {
                max_digits: 3,
                contractions: true,
            }],
            PreTokenizer::DeepSeekLlm => &[
                Stage::Each(is_cr_lf),
                Stage::SpaceThenRun(is_deepseek_letter),
                Stage::SpaceThenRun(is_deepseek_punctuation),
                Stage::TrailingSpace,
                Stage::Runs(is_cjk),
                Stage::NumberRuns,
            ],
        }
    }

    /// Split `text` into pre-tokens (never empty ones); their concatenation is `text`.
    pub fn split(self, text: &str) -> Vec<&str> {
        let mut cps = Vec::with_capacity(text.len());
        let mut offsets = Vec::with_capacity(text.len() + 1);
        for (i, c) in text.char_indices() {
            cps.push(c as u32);
            offsets.push(i);
        }
        offsets.push(text.len());
        if cps.is_empty() {
            return Vec::new();
        }
        let text_cps = Cps { cps: &cps };
        let mut pieces = vec![(0, cps.len())];
        let mut next = Vec::with_capacity(cps.len() / 2);
        for &stage in self.stages() {
            next.clear();
            for &(start, end) in &pieces {
                let mut out = Out {
                    pieces: &mut next,
                    prev_end: start,
                };
                match stage {
                    Stage::Gpt2 => text_cps.gpt2(start, end, &mut out),
                    Stage::Llama3 { max_digits, marks } => {
                        text_cps.llama3(start, end, max_digits, marks, &mut out)
                    }
                    Stage::PunctuationRuns => {
                        text_cps.isolate_runs(start, end, is_default_punctuation, &mut out)
                    }
                    Stage::NumberRuns => text_cps.isolate_runs(start, end, is_number, &mut out),
                    Stage::EachNumber => text_cps.isolate_each(start, end, is_number, &mut out),
                    Stage::AsciiDigitTriples => {
                        text_cps.isolate_digit_triples(start, end, &mut out)
                    }
                    Stage::Runs(class) => text_cps.isolate_runs(start, end, class, &mut out),
                    Stage::Each(class) => text_cps.isolate_each(start, end, class, &mut out),
                    Stage::SpaceThenRun(class) => {
                        text_cps.space_then_runs(start, end, class, &mut out)
                    }
                    Stage::TrailingSpace => text_cps.trailing_space(start, end, &mut out),
                    Stage::Cased {
                        max_digits,
                        contractions,
                    } => text_cps.cased(start, end, max_digits, contractions, &mut out),
                }
                out.emit(end);
            }
            std::mem::swap(&mut pieces, &mut next);
        }
        pieces
            .iter()
            .map(|&(s, e)| &text[offsets[s]..offsets[e]])
            .collect()
    }
}

/// `\p{N}` as llama.cpp's collapsed `std::regex` sees it: ASCII digits, and non-ASCII code
/// points whose category is a number.
fn is_number(cp: u32) -> bool {
    Flags::of(cp).category() == Flags::NUMBER
}

/// `[\p{P}\$\+<=>\^~\|]` on the collapsed text: every ASCII punctuation or symbol but the
/// backtick, and non-ASCII punctuation (non-ASCII symbols do not count).
fn is_default_punctuation(cp: u32) -> bool {
    if cp < 0x80 {
        return b"!\"#$%&'()*+,-./:;<=>?@[\\]^_{|}~".contains(&(cp as u8));
    }
    Flags::of(cp).category() == Flags::PUNCTUATION
}

/// ``[\p{P}\$\+<=>\^~\|`]``: [`is_default_punctuation`] and the backtick.
fn is_falcon_punctuation(cp: u32) -> bool {
    cp == '`' as u32 || is_default_punctuation(cp)
}

fn is_lf(cp: u32) -> bool {
    cp == '\n' as u32
}

fn is_cr_lf(cp: u32) -> bool {
    cp == '\r' as u32 || cp == '\n' as u32
}

/// `\s` as `std::regex` sees llama.cpp's texts: ASCII whitespace, and the non-ASCII whitespace
/// it rewrites to a vertical tab first.
fn is_space(cp: u32) -> bool {
    Flags::of(cp).is_whitespace()
}

/// `\p{L}` on the collapsed text: ASCII letters, and non-ASCII letters (whitespace is
/// collapsed to a vertical tab whatever its category).
fn is_letter(cp: u32) -> bool {
    let f = Flags::of(cp);
    f.category() == Flags::LETTER && !f.is_whitespace()
}

/// `\p{P}` on the collapsed text: the ASCII punctuation llama.cpp maps it to
/// (`!-#%-*,-/:-;?-@[-]_{}`, the symbols ``$+<=>^`|~`` left out) and non-ASCII punctuation.
fn is_punctuation(cp: u32) -> bool {
    let f = Flags::of(cp);
    f.category() == Flags::PUNCTUATION && !f.is_whitespace()
}

/// `[一-龥ࠀ-一가-퟿]` (as `std::wregex` ranges: U+4E00-U+9FA5, U+0800-U+4E00, U+AC00-U+D7FF),
/// after llama.cpp rewrites non-ASCII whitespace to a vertical tab.
fn is_cjk(cp: u32) -> bool {
    let ranges = [(0x4E00, 0x9FA5), (0x0800, 0x4E00), (0xAC00, 0xD7FF)];
    !is_space(cp) && ranges.iter().any(|&(a, b)| (a..=b).contains(&cp))
}

/// DeepSeek LLM's explicit letter set, as code point ranges (its regex's bracket, in order).
const DEEPSEEK_LETTERS: &[(u32, u32)] = &[
    (0x41, 0x5A),
    (0x61, 0x7A),
    (0xB5, 0xB5),
    (0xC0, 0xD6),
    (0xD8, 0xF6),
    (0xF8, 0x1BA),
    (0x1BC, 0x1BF),
    (0x1C4, 0x293),
    (0x295, 0x2AF),
    (0x370, 0x373),
    (0x376, 0x376),
    (0x377, 0x377),
    (0x37B, 0x37D),
    (0x37F, 0x37F),
    (0x386, 0x386),
    (0x388, 0x38A),
    (0x38C, 0x38C),
    (0x38E, 0x3A1),
    (0x3A3, 0x3F5),
    (0x3F7, 0x481),
    (0x48A, 0x52F),
    (0x531, 0x556),
    (0x10A0, 0x10C5),
    (0x13A0, 0x13F5),
    (0x13F8, 0x13FD),
    (0x1C90, 0x1CBA),
    (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B),
    (0x1D6B, 0x1D77),
    (0x1D79, 0x1D9A),
    (0x1E00, 0x1F15),
    (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45),
    (0x1F48, 0x1F4D),
    (0x1F50, 0x1F57),
    (0x1F59, 0x1F59),
    (0x1F5B, 0x1F5B),
    (0x1F5D, 0x1F5D),
    (0x1F5F, 0x1F7D),
    (0x1F80, 0x1FB4),
    (0x1FB6, 0x1FBC),
    (0x1FBE, 0x1FBE),
    (0x1FC2, 0x1FC4),
    (0x1FC6, 0x1FCC),
    (0x1FD0, 0x1FD3),
    (0x1FD6, 0x1FDB),
    (0x1FE0, 0x1FEC),
    (0x1FF2, 0x1FF4),
    (0x1FF6, 0x1FFC),
    (0x2102, 0x2102),
    (0x2107, 0x2107),
    (0x210A, 0x2113),
    (0x2115, 0x2115),
    (0x2119, 0x211D),
    (0x2124, 0x2124),
    (0x2126, 0x2126),
    (0x2128, 0x2128),
    (0x212A, 0x212D),
    (0x212F, 0x2134),
    (0x2139, 0x2139),
    (0x213C, 0x213F),
    (0x2145, 0x2149),
    (0x214E, 0x214E),
    (0x2183, 0x2183),
    (0x2184, 0x2184),
    (0x2C00, 0x2C7B),
    (0x2C7E, 0x2CE4),
    (0x2CEB, 0x2CEE),
    (0x2CF2, 0x2CF2),
    (0x2CF3, 0x2CF3),
    (0xA640, 0xA66D),
    (0xA680, 0xA69B),
    (0xA722, 0xA76F),
    (0xA771, 0xA787),
    (0xA78B, 0xA78E),
    (0xAB70, 0xABBF),
    (0xFB00, 0xFB06),
    (0xFB13, 0xFB17),
    (0xFF21, 0xFF3A),
    (0xFF41, 0xFF5A),
    (0x10400, 0x1044F),
    (0x104B0, 0x104D3),
    (0x104D8, 0x104FB),
    (0x10C80, 0x10CB2),
    (0x10CC0, 0x10CF2),
    (0x118A0, 0x118DF),
    (0x1E900, 0x1E943),
];

fn is_deepseek_letter(cp: u32) -> bool {
    DEEPSEEK_LETTERS.iter().any(|&(a, b)| (a..=b).contains(&cp))
}

/// `[!-/:-~！-／：-～‘-‟　-。]`, after llama.cpp rewrites non-ASCII whitespace (U+3000 among
/// them) to a vertical tab.
fn is_deepseek_punctuation(cp: u32) -> bool {
    let ranges = [
        (0x21, 0x2F),
        (0x3A, 0x7E),
        (0xFF01, 0xFF0F),
        (0xFF1A, 0xFF5E),
        (0x2018, 0x201F),
        (0x3000, 0x3002),
    ];
    !is_space(cp) && ranges.iter().any(|&(a, b)| (a..=b).contains(&cp))
}

/// Collects pieces: each `emit(end)` closes the piece that runs from the previous end.
struct Out<'a> {
    pieces: &'a mut Vec<(usize, usize)>,
    prev_end: usize,
}

impl Out<'_> {
    /// Close the current piece at `end` (nothing if it would be empty); returns its length.
    fn emit(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.pieces.push((self.prev_end, end));
        }
        self.prev_end = end;
        len
    }
}

struct Cps<'a> {
    cps: &'a [u32],
}

/// A code point that can never be in the text: what the matchers read past a piece's end.
const OUT_OF_RANGE: u32 = u32::MAX;

impl Cps<'_> {
    fn isolate_each(&self, start: usize, end: usize, class: fn(u32) -> bool, out: &mut Out) {
        for pos in start..end {
            if class(self.cps[pos]) {
                out.emit(pos);
                out.emit(pos + 1);
            }
        }
    }

    fn isolate_runs(&self, start: usize, end: usize, class: fn(u32) -> bool, out: &mut Out) {
        let mut pos = start;
        while pos < end {
            if class(self.cps[pos]) {
                out.emit(pos);
                while pos < end && class(self.cps[pos]) {
                    pos += 1;
                }
                out.emit(pos);
            } else {
                pos += 1;
            }
        }
    }

    /// `\s?X+` as `std::regex` searches it: the leftmost position where a run of `class`
    /// starts, or a whitespace followed by one; the match takes the whole run.
    fn space_then_runs(&self, start: usize, end: usize, class: fn(u32) -> bool, out: &mut Out) {
        let is = |p: usize, f: fn(u32) -> bool| p < end && f(self.cps[p]);
        let mut pos = start;
        while pos < end {
            let first = if is(pos, class) {
                pos
            } else if is(pos, is_space) && is(pos + 1, class) {
                pos + 1
            } else {
                pos += 1;
                continue;
            };
            out.emit(pos);
            pos = first;
            while is(pos, class) {
                pos += 1;
            }
            out.emit(pos);
        }
    }

    /// `\s+$`: the whitespace that ends the piece, if any.
    fn trailing_space(&self, start: usize, end: usize, out: &mut Out) {
        let mut pos = end;
        while pos > start && is_space(self.cps[pos - 1]) {
            pos -= 1;
        }
        if pos < end {
            out.emit(pos);
            out.emit(end);
        }
    }

    fn isolate_digit_triples(&self, start: usize, end: usize, out: &mut Out) {
        let digit = |p: usize| p < end && (b'0' as u32..=b'9' as u32).contains(&self.cps[p]);
        let mut pos = start;
        while pos < end {
            if digit(pos) && digit(pos + 1) && digit(pos + 2) {
                out.emit(pos);
                out.emit(pos + 3);
                pos += 3;
            } else {
                pos += 1;
            }
        }
    }

    /// The GPT-2 regex over `[start, end)`, as llama.cpp's `unicode_regex_split_custom_gpt2`
    /// scans it.
    fn gpt2(&self, start: usize, end: usize, out: &mut Out) {
        let cp = |p: usize| {
            if p < end {
                self.cps[p]
            } else {
                OUT_OF_RANGE
            }
        };
        let flags = |p: usize| {
            if p < end {
                Flags::of(self.cps[p])
            } else {
                Flags::NONE
            }
        };
        let mut pos = start;
        while pos < end {
            let c = cp(pos);
            let f = flags(pos);

            // 's|'t|'re|'ve|'m|'ll|'d
            let len = self.contraction(pos, end, false);
            if len > 0 {
                pos += out.emit(pos + len);
                continue;
            }

            let space = c == ' ' as u32;
            let mut f2 = if space { flags(pos + 1) } else { f };
            // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+'
            let classes: [fn(Flags) -> bool; 3] = [
                |f| f.is_letter(),
                |f| f.is_number(),
                |f| !(f.is_whitespace() || f.is_letter() || f.is_number() || f.is_none()),
            ];
            if let Some(class) = classes.into_iter().find(|class| class(f2)) {
                pos += usize::from(space);
                while class(f2) {
                    pos += 1;
                    f2 = flags(pos);
                }
                out.emit(pos);
                continue;
            }

            let mut n_ws = 0;
            while flags(pos + n_ws).is_whitespace() {
                n_ws += 1;
            }
            // \s+(?!\S): leave the last white space to prefix what follows
            if n_ws > 1 && cp(pos + n_ws) != OUT_OF_RANGE {
                pos += n_ws - 1;
                out.emit(pos);
                continue;
            }
            // \s+
            if n_ws > 0 {
                pos += n_ws;
                out.emit(pos);
                continue;
            }
            pos += 1;
            out.emit(pos);
        }
    }

    /// The Llama 3 regex (or Qwen 2's with `max_digits` 1, Qwen 3.5's with `marks` as well)
    /// over `[start, end)`, as llama.cpp's `unicode_regex_split_custom_llama3` / `_qwen2` /
    /// `_qwen35` scan it.
    fn llama3(&self, start: usize, end: usize, max_digits: usize, marks: bool, out: &mut Out) {
        let cp = |p: usize| {
            if p < end {
                self.cps[p]
            } else {
                OUT_OF_RANGE
            }
        };
        let flags = |p: usize| {
            if p < end {
                Flags::of(self.cps[p])
            } else {
                Flags::NONE
            }
        };
        let is_rn = |c: u32| c == '\r' as u32 || c == '\n' as u32;
        let mut pos = start;
        while pos < end {
            let c = cp(pos);
            let f = flags(pos);

            // (?i:'s|'t|'re|'ve|'m|'ll|'d)
            let len = self.contraction(pos, end, true);
            if len > 0 {
                pos += out.emit(pos + len);
                continue;
            }

            // [^\r\n\p{L}\p{N}]?\p{L}+ (Qwen 3.5: [\p{L}\p{M}]+)
            let in_run = |f: Flags| f.is_letter() || (marks && f.is_mark());
            if !(is_rn(c) || f.is_number()) && (in_run(f) || in_run(flags(pos + 1))) {
                pos += 1;
                while in_run(flags(pos)) {
                    pos += 1;
                }
                out.emit(pos);
                continue;
            }

            // \p{N}{1,3} (Llama 3) or \p{N} (Qwen 2)
            if f.is_number() {
                let mut run_start = pos;
                while flags(pos).is_number() {
                    pos += 1;
                    if pos - run_start >= max_digits {
                        out.emit(pos);
                        run_start = pos;
                    }
                }
                out.emit(pos);
                continue;
            }

            // ' ?[^\s\p{L}\p{N}]+[\r\n]*' (Qwen 3.5: not \p{M} either; the matcher tests the first code point's flags for
            // "is a code point", not the second's: a lone trailing space lands here)
            let space = c == ' ' as u32;
            let other = |f: Flags| {
                !(f.is_whitespace() || f.is_letter() || f.is_number() || (marks && f.is_mark()))
            };
            let mut f2 = if space { flags(pos + 1) } else { f };
            if other(f2) && !f.is_none() {
                pos += usize::from(space);
                while other(f2) && !f2.is_none() {
                    pos += 1;
                    f2 = flags(pos);
                }
                while is_rn(cp(pos)) {
                    pos += 1;
                }
                out.emit(pos);
                continue;
            }

            pos = self.whitespace(pos, end);
            out.emit(pos);
        }
    }

    /// `'s|'t|'re|'ve|'m|'ll|'d` at `p` (either case of the letters with `fold`): the length
    /// of the contraction there, 0 if none. Only ASCII letters lower-case onto the letters it
    /// tests (checked when the Unicode table is generated), so ASCII folding is exact.
    fn contraction(&self, p: usize, end: usize, fold: bool) -> usize {
        let at = |q: usize| {
            let c = if q < end { self.cps[q] } else { OUT_OF_RANGE };
            if fold && (b'A' as u32..=b'Z' as u32).contains(&c) {
                c + 32
            } else {
                c
            }
        };
        if p >= end || self.cps[p] != '\'' as u32 {
            return 0;
        }
        let (n, nn) = (at(p + 1), at(p + 2));
        if [b's', b't', b'm', b'd'].iter().any(|&x| n == x as u32) {
            2
        } else if [(b'r', b'e'), (b'v', b'e'), (b'l', b'l')]
            .iter()
            .any(|&(a, b)| n == a as u32 && nn == b as u32)
        {
            3
        } else {
            0
        }
    }

    /// Where the whitespace alternatives that end Llama 3's and its kin's regexes stop, from
    /// `pos`: `\s*[\r\n]+` (through the last line end of the run), else `\s+(?!\S)` (all but
    /// the last of a run before other text), else `\s+`; one code point where `pos` holds no
    /// whitespace (what the hand-written matchers take there).
    fn whitespace(&self, pos: usize, end: usize) -> usize {
        let is_rn = |c: u32| c == '\r' as u32 || c == '\n' as u32;
        let mut n_ws = 0;
        let mut last_rn_end = None;
        while pos + n_ws < end && is_space(self.cps[pos + n_ws]) {
            if is_rn(self.cps[pos + n_ws]) {
                last_rn_end = Some(pos + n_ws + 1);
            }
            n_ws += 1;
        }
        match last_rn_end {
            Some(e) => e,
            None if n_ws > 1 && pos + n_ws < end => pos + n_ws - 1,
            None => pos + n_ws.max(1),
        }
    }
}

impl Cps<'_> {
    /// Tekken's or GPT-4o's regex over `[start, end)` ([`PreTokenizer::Tekken`]), as
    /// `std::regex` matches it on llama.cpp's collapsed text: at each position the first
    /// alternative that matches, each quantifier greedy and backtracking.
    fn cased(
        &self,
        start: usize,
        end: usize,
        max_digits: usize,
        contractions: bool,
        out: &mut Out,
    ) {
        let at = |p: usize| if p < end { self.cps[p] } else { OUT_OF_RANGE };
        let letter = |p: usize| p < end && is_letter(self.cps[p]);
        let ascii = |p: usize, lo: u8, hi: u8| (lo as u32..=hi as u32).contains(&at(p));
        // `(?=[\p{L}])([^a-z])` and `(?=[\p{L}])([^A-Z])`.
        let upper = |p: usize| letter(p) && !ascii(p, b'a', b'z');
        let lower = |p: usize| letter(p) && !ascii(p, b'A', b'Z');
        let other = |p: usize| {
            p < end && !(is_space(self.cps[p]) || is_letter(self.cps[p]) || is_number(self.cps[p]))
        };
        let is_rn = |c: u32| c == '\r' as u32 || c == '\n' as u32;
        let mut pos = start;
        while pos < end {
            let c = self.cps[pos];
            // The words: an optional `[^\r\n\p{L}\p{N}]`, then the letters.
            let first = if letter(pos) {
                Some(pos)
            } else if !(is_rn(c) || is_number(c)) && letter(pos + 1) {
                Some(pos + 1)
            } else {
                None
            };
            if let Some(s) = first {
                let mut u = s;
                while upper(u) {
                    u += 1;
                }
                let word_end = if lower(u) {
                    // `U*L+`: the upper run, then the lower one.
                    let mut l = u;
                    while lower(l) {
                        l += 1;
                    }
                    l
                } else if let Some(k) = (s..u).rev().find(|&k| lower(k)) {
                    // `U*` gives back letters until `L+` can take one: the last letter of
                    // the run that is not `A-Z`; the capitals after it are left.
                    k + 1
                } else {
                    // `U+L*`: a run of capitals alone.
                    u
                };
                // `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?` (GPT-4o)
                pos = word_end
                    + if contractions {
                        self.contraction(word_end, end, true)
                    } else {
                        0
                    };
                out.emit(pos);
                continue;
            }
            // `\p{N}` (Tekken) or `\p{N}{1,3}` (GPT-4o).
            if is_number(c) {
                let run_start = pos;
                while pos < end && is_number(self.cps[pos]) && pos - run_start < max_digits {
                    pos += 1;
                }
                out.emit(pos);
                continue;
            }
            // ` ?[^\s\p{L}\p{N}]+[\r\n/]*`
            if other(pos) || (c == ' ' as u32 && other(pos + 1)) {
                pos += 1;
                while other(pos) {
                    pos += 1;
                }
                while is_rn(at(pos)) || at(pos) == '/' as u32 {
                    pos += 1;
                }
                out.emit(pos);
                continue;
            }
            // What is left is whitespace: `\s*[\r\n]+`, `\s+(?!\S)`, `\s+`.
            pos = self.whitespace(pos, end);
            out.emit(pos);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::PreTokenizer::*;

    /// Splits the vocabulary suite's cases do not tell apart (their merges give the same ids
    /// either way), checked against the regexes by hand.
    #[test]
    fn regex_stages_split_as_llama_cpps_regexes() {
        // Falcon's first regex takes the backtick into punctuation runs.
        assert_eq!(Falcon.split("'''```"), ["'''```"]);
        // `\s?\p{L}+` takes one space before a letter run; the rest stays between matches.
        assert_eq!(DeepSeekCoder.split("a  bc"), ["a", " ", " bc"]);
        // `[\r\n]` alone; CJK runs (U+0800-U+4E00 counts as CJK there: the arrow, not the
        // currency sign); digits one by one.
        assert_eq!(
            DeepSeekCoder.split("x\r\n→¤12"),
            ["x", "\r", "\n", "→", "¤", "1", "2"]
        );
        // A combining mark is no `\p{L}`: it ends a letter run.
        assert_eq!(DeepSeekCoder.split("क्ष"), ["क", "\u{94d}", "ष"]);
        // `\s+$`: the whitespace ending a piece, after a full-width punctuation run.
        assert_eq!(DeepSeekLlm.split("ab！？ \t"), ["ab", "！？", " \t"]);
        // U+3000 is whitespace: it leads the run after it, it is not punctuation.
        assert_eq!(DeepSeekLlm.split("。\u{3000}Ab"), ["。", "\u{3000}Ab"]);
    }

    /// Tekken's and GPT-4o's words, derived by hand from their regexes' backtracking.
    #[test]
    fn cased_words_split_before_capitals_as_the_regex_backtracks() {
        // A lower-case run may follow an upper-case one; a capital after it starts a word.
        assert_eq!(Tekken.split("HTTPServer"), ["HTTPServer"]);
        assert_eq!(Tekken.split("helloWorld"), ["hello", "World"]);
        // A run of capitals alone is a word of its own.
        assert_eq!(Tekken.split("NASA rocks"), ["NASA", " rocks"]);
        // A non-ASCII letter is both upper and lower: the capitals after the last one are
        // given back to the next word.
        assert_eq!(Tekken.split("ÉAB."), ["É", "AB", "."]);
        assert_eq!(Tekken.split("Überall naïve"), ["Überall", " naïve"]);
        // Tekken's digits one by one, GPT-4o's by three; punctuation keeps its line ends and
        // slashes after them.
        assert_eq!(Tekken.split("x12"), ["x", "1", "2"]);
        assert_eq!(Gpt4o.split("12345"), ["123", "45"]);
        assert_eq!(Tekken.split(" ((\n/a"), [" ((\n/", "a"]);
        // GPT-4o's contractions, either case, end the word; Tekken's are punctuation.
        assert_eq!(Gpt4o.split("WE'LL don't"), ["WE'LL", " don't"]);
        assert_eq!(Tekken.split("don't"), ["don", "'t"]);
        // Whitespace as Llama 3's: a line end run, then spaces that leave one to the word.
        assert_eq!(Tekken.split("a \n\n  b"), ["a", " \n\n", " ", " b"]);
    }
}
