//! The tokenizers of the two real vocabularies (`models/`, as `crates/engine/tests/tokenizer.rs`
//! uses them): SmolLM2's byte-level BPE under several pre-tokenizers, and Gemma 3's
//! SentencePiece. For any text (the input as lossy UTF-8), encoding with and without special
//! parsing must not panic, and:
//!
//! - the pieces of the ids concatenate back to the text (special texts come back as their
//!   text). For byte-level BPE, less the bytes that have no token, which llama.cpp drops as this
//!   tokenizer does: SmolLM2 lacks 21, the controls 0x04, 0x06, 0x13, 0x14, 0x16 and 0x1D,
//!   0xF1 and 0xF2 (which lead only characters of the unassigned planes 4 to 11) and the 13
//!   bytes no UTF-8 text holds. Every merge of SmolLM2 gives a token, so nothing else falls
//!   back to bytes and nothing else is dropped (checked at init). For SentencePiece, with `▁`
//!   read as a space (the escape of spaces cannot be undone on a text that holds `▁` itself;
//!   every byte has a `<0xHH>` token, checked at init);
//! - `decode` gives those pieces (as lossy UTF-8) unless the vocabulary cleans up spaces
//!   (llama.cpp's `clean_up_tokenization_spaces`: the GPT-2 and Llama 3 pre-tokenizers). So
//!   `decode(encode(s)) == s` for SmolLM2's own vocabulary on every text without those 21
//!   bytes, and for Gemma's on every text without `▁`;
//! - a [`StreamDecoder`] fed the ids one at a time gives the same text as the lossy pieces,
//!   for the encoded ids and for arbitrary ids (out of range included) read from the input.

use std::sync::OnceLock;

use synapse_engine::tokenizer::{StreamDecoder, Tokenizer, VocabType};
use synapse_gguf::{Array, GgufFile, Value};

struct Vocab {
    name: &'static str,
    tok: Tokenizer,
    /// The bytes that have a token of their own (a piece of that one byte).
    byte_has_token: [bool; 256],
    /// `decode` is the lossy pieces (no space clean-up, no space prefix to remove).
    decode_is_pieces: bool,
}

const SMOLLM2: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";
const GEMMA3: &str = "gemma-3-270m-q4_k_m.gguf";

fn vocabs() -> &'static [Vocab] {
    static V: OnceLock<Vec<Vocab>> = OnceLock::new();
    V.get_or_init(|| {
        let md = |file: &str| {
            let path = super::repo_root().join("models").join(file);
            let f = GgufFile::open(&path).unwrap_or_else(|e| {
                panic!("{}: {e} (run scripts/fetch-models.sh)", path.display())
            });
            f.metadata().clone()
        };
        let smol = md(SMOLLM2);
        // The premise of the BPE round trip: each merge's result is a token.
        let tokens: std::collections::HashSet<&str> = match smol.get("tokenizer.ggml.tokens") {
            Some(Value::Array(Array::String(v))) => v.iter().map(String::as_str).collect(),
            _ => panic!("{SMOLLM2}: no token list"),
        };
        if let Some(Value::Array(Array::String(merges))) = smol.get("tokenizer.ggml.merges") {
            for m in merges {
                assert!(
                    tokens.contains(m.replacen(' ', "", 1).as_str()),
                    "{SMOLLM2}: merge {m:?} gives no token"
                );
            }
        }
        let mut out = Vec::new();
        // SmolLM2's own (`smollm`: StarCoder's regex, no clean-up), then the other regex sets
        // over the same vocabulary, as the golden sets use them.
        for pre in [
            "smollm",
            "qwen2",
            "llama-bpe",
            "gpt-2",
            "default",
            "tekken",
            "gpt-4o",
        ] {
            let mut m = smol.clone();
            m.insert("tokenizer.ggml.pre", Value::String(pre.into()));
            let tok = Tokenizer::from_metadata(&m).unwrap_or_else(|e| panic!("{pre}: {e}"));
            let clean = synapse_engine::tokenizer::PreConfig::from_name(pre)
                .unwrap()
                .clean_spaces;
            out.push(Vocab {
                name: pre,
                byte_has_token: byte_tokens(&tok),
                tok,
                decode_is_pieces: !clean,
            });
        }
        let tok = Tokenizer::from_metadata(&md(GEMMA3)).unwrap();
        assert!(!tok.add_space_prefix());
        let byte_has_token = byte_tokens(&tok);
        assert!(
            byte_has_token.iter().all(|&b| b),
            "{GEMMA3}: a byte without a token"
        );
        out.push(Vocab {
            name: "gemma3",
            byte_has_token,
            tok,
            decode_is_pieces: true,
        });
        out
    })
}

fn byte_tokens(tok: &Tokenizer) -> [bool; 256] {
    let mut has = [false; 256];
    for id in 0..tok.n_vocab() as u32 {
        if let [b] = tok.token_to_piece(id) {
            if !tok.is_control(id) {
                has[*b as usize] = true;
            }
        }
    }
    has
}

/// Build the tokenizers now (the first check would otherwise spend seconds on it).
pub fn init() {
    vocabs();
}

fn pieces(tok: &Tokenizer, ids: &[u32]) -> Vec<u8> {
    ids.iter()
        .flat_map(|&id| tok.token_to_piece(id).iter().copied())
        .collect()
}

fn streamed(tok: &Tokenizer, ids: &[u32]) -> String {
    let mut d = StreamDecoder::new(tok);
    let mut s = String::new();
    for &id in ids {
        s += &d.push(id);
    }
    s += &d.finish();
    s
}

/// What the pieces and stream of `ids` must give; `text` is `Some` for encoded ids.
fn check_ids(v: &Vocab, ids: &[u32], text: Option<&str>, label: &str) {
    let tok = &v.tok;
    let p = pieces(tok, ids);
    let lossy = String::from_utf8_lossy(&p);
    if let Some(text) = text {
        let want: Vec<u8> = match tok.vocab_type() {
            VocabType::Bpe => text
                .bytes()
                .filter(|&b| v.byte_has_token[b as usize])
                .collect(),
            VocabType::Spm => text.replace('\u{2581}', " ").into_bytes(),
            VocabType::Wpm => unreachable!("no WordPiece vocabulary is fuzzed here"),
        };
        assert!(
            p == want,
            "{}, {label}: pieces {:?} != text {:?} (ids {ids:?})",
            v.name,
            lossy,
            String::from_utf8_lossy(&want)
        );
    }
    assert_eq!(streamed(tok, ids), lossy, "{}, {label}: stream", v.name);
    let d = tok.decode(ids);
    if v.decode_is_pieces {
        assert_eq!(d, lossy, "{}, {label}: decode", v.name);
    }
    let _ = tok.detokenize(ids, true, false);
}

pub fn check(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    // Arbitrary ids: 3 bytes each, taken modulo a little more than the vocabulary.
    let raw: Vec<u32> = data
        .chunks(3)
        .map(|c| c.iter().fold(0u32, |a, &b| a << 8 | b as u32))
        .collect();
    for v in vocabs() {
        for parse_special in [false, true] {
            let ids = v.tok.encode(&text, false, parse_special);
            let label = if parse_special { "special" } else { "plain" };
            check_ids(v, &ids, Some(&text), label);
            let with_bos = v.tok.tokenize(&text, true, parse_special);
            if v.tok.add_bos_token() && v.tok.bos().is_some() {
                assert_eq!(with_bos.first().copied(), v.tok.bos(), "{}: BOS", v.name);
            }
        }
        let n = v.tok.n_vocab() as u32 + 256;
        let ids: Vec<u32> = raw.iter().map(|&r| r % n).collect();
        check_ids(v, &ids, None, "raw ids");
    }
}
