//! Building a [`Tokenizer`] from GGUF metadata, step for step as llama.cpp's
//! `llama_vocab::impl::load` does, so that the ids with a role, the token attributes and the
//! end-of-generation set come out the same.

use synapse_gguf::{Array, Metadata, Value};

use super::bpe::{self, Bpe};
use super::fxhash::FxHashMap;
use super::pretokenize::{PreConfig, PreTokenizer};
use super::special::{Special, SpecialMatcher};
use super::spm::Spm;
use super::wpm::Wpm;
use super::{Model, SpecialIds, TokenAttr, Tokenizer, TokenizerError, VocabType};

const KEY_MODEL: &str = "tokenizer.ggml.model";
const KEY_PRE: &str = "tokenizer.ggml.pre";
const KEY_TOKENS: &str = "tokenizer.ggml.tokens";
const KEY_SCORES: &str = "tokenizer.ggml.scores";
const KEY_TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
const KEY_MERGES: &str = "tokenizer.ggml.merges";
const KEY_ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
const KEY_ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
const KEY_ADD_PREFIX: &str = "tokenizer.ggml.add_space_prefix";

const SUPPORTED_MODELS: &str =
    "llama (SentencePiece), gpt2 (byte-level BPE), gemma4 (UTF-8 BPE), bert (WordPiece)";
const KEY_LOWERCASE: &str = "tokenizer.ggml.normalizer.lowercase";

/// Texts llama.cpp takes for an end-of-turn token when the metadata names none.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// Texts llama.cpp treats as end of generation, whatever the metadata says.
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

impl Tokenizer {
    /// Build the tokenizer a GGUF file's metadata describes. See [`TokenizerError`] for what is
    /// refused; nothing here panics on a malformed vocabulary.
    pub fn from_metadata(md: &Metadata) -> Result<Tokenizer, TokenizerError> {
        load(md)
    }
}

fn load(md: &Metadata) -> Result<Tokenizer, TokenizerError> {
    let model_name =
        opt_str(md, KEY_MODEL)?.ok_or(TokenizerError::MissingKey { key: KEY_MODEL })?;
    let mut pre_name = opt_str(md, KEY_PRE)?.unwrap_or("");
    // Gemma 4's BPE: tokens in UTF-8 with `▁` for spaces, its own pre-tokenizer whatever the
    // metadata says (as llama.cpp sets it).
    let utf8 = model_name == "gemma4";
    if utf8 {
        pre_name = "gemma4";
    }
    let vocab_type = match model_name {
        "llama" => VocabType::Spm,
        "gpt2" | "gemma4" => VocabType::Bpe,
        "bert" => VocabType::Wpm,
        other => {
            return Err(TokenizerError::UnsupportedModel {
                model: other.to_string(),
                supported: SUPPORTED_MODELS.to_string(),
            })
        }
    };

    // Defaults per vocabulary type, then the pre-tokenizer's (BPE only; SentencePiece ignores
    // `tokenizer.ggml.pre`), then the metadata.
    let mut ids = SpecialIds::default();
    let (mut add_bos, mut add_eos, mut add_space_prefix, clean_spaces);
    let mut pre = None;
    match vocab_type {
        VocabType::Spm => {
            ids.bos = Some(1);
            ids.eos = Some(2);
            ids.unk = Some(0);
            add_space_prefix = true;
            clean_spaces = false;
            add_bos = true;
            add_eos = false;
        }
        VocabType::Bpe => {
            // GPT-2's defaults; Gemma 4's come from the metadata alone.
            if !utf8 {
                ids.bos = Some(11);
                ids.eos = Some(11);
            }
            // A missing pre-tokenizer is llama.cpp's "default" (it warns); an unknown one is an
            // error there too.
            let name = if pre_name.is_empty() {
                "default"
            } else {
                pre_name
            };
            let config =
                PreConfig::from_name(name).ok_or_else(|| TokenizerError::UnknownPreTokenizer {
                    pre: name.to_string(),
                    supported: PreConfig::supported_names().collect::<Vec<_>>().join(", "),
                })?;
            pre = Some(config);
            add_space_prefix = false;
            clean_spaces = config.clean_spaces;
            add_bos = config.add_bos;
            add_eos = false;
        }
        VocabType::Wpm => {
            ids.bos = Some(101);
            ids.unk = Some(100);
            ids.sep = Some(102);
            ids.pad = Some(0);
            ids.mask = Some(103);
            add_space_prefix = false;
            clean_spaces = true;
            // With special tokens, WordPiece always wraps the text in [CLS] .. [SEP].
            add_bos = true;
            add_eos = true;
        }
    }
    if let Some(v) = opt_bool(md, KEY_ADD_PREFIX)? {
        add_space_prefix = v;
    }

    // The vocabulary.
    let tokens = match md.get(KEY_TOKENS) {
        None => return Err(TokenizerError::MissingKey { key: KEY_TOKENS }),
        Some(Value::Array(Array::String(v))) => v,
        Some(v) => return Err(wrong(KEY_TOKENS, "an array of strings", v)),
    };
    let n = tokens.len();
    if n == 0 {
        return Err(TokenizerError::EmptyVocabulary);
    }
    if u32::try_from(n).is_err() {
        return Err(TokenizerError::TooManyTokens { count: n });
    }
    let scores: Vec<f32> = match md.get(KEY_SCORES) {
        None => vec![0.0; n],
        Some(Value::Array(Array::F32(v))) => check_len(KEY_SCORES, v.len(), n, || v[..n].to_vec())?,
        Some(Value::Array(Array::I32(v))) => check_len(KEY_SCORES, v.len(), n, || {
            v[..n].iter().map(|&s| s as f32).collect()
        })?,
        Some(v) => return Err(wrong(KEY_SCORES, "an array of f32 or i32", v)),
    };
    let mut attrs: Vec<TokenAttr> = match md.get(KEY_TOKEN_TYPE) {
        None => vec![TokenAttr::NORMAL; n],
        // llama.cpp's token types are 0 to 6; any other value is refused (as an undefined
        // token it would have no piece and never be produced).
        Some(Value::Array(Array::I32(v))) => check_len(KEY_TOKEN_TYPE, v.len(), n, || {
            v[..n]
                .iter()
                .enumerate()
                .map(|(i, &t)| match t {
                    0..=6 => Ok(TokenAttr::from_token_type(t)),
                    _ => Err(TokenizerError::BadTokenType {
                        id: i as u32,
                        value: t,
                    }),
                })
                .collect::<Result<_, _>>()
        })??,
        Some(v) => return Err(wrong(KEY_TOKEN_TYPE, "an array of i32", v)),
    };

    let mut texts: Vec<String> = Vec::with_capacity(n);
    let mut token_to_id: FxHashMap<Box<[u8]>, u32> = FxHashMap::default();
    token_to_id.reserve(n);
    for (i, t) in tokens.iter().enumerate() {
        let text = if t.is_empty() {
            format!("[EMPTY_{i}]")
        } else {
            t.clone()
        };
        // llama.cpp asserts the texts are unique; a duplicate would make ids ambiguous.
        if let Some(&first) = token_to_id.get(text.as_bytes()) {
            return Err(TokenizerError::DuplicateToken {
                id: i as u32,
                first,
                text,
            });
        }
        token_to_id.insert(text.as_bytes().into(), i as u32);
        texts.push(text);
    }
    // Empty texts are tolerated (as llama.cpp does, renamed), but a vocabulary must have some
    // token that text can become: with none (every token empty, or control or unused), every
    // prompt would encode to nothing.
    let text_token =
        TokenAttr::NORMAL | TokenAttr::BYTE | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN;
    if !tokens
        .iter()
        .zip(&attrs)
        .any(|(t, a)| !t.is_empty() && a.intersects(text_token))
    {
        return Err(TokenizerError::NoTextTokens { count: n });
    }
    let id_of = |text: &str| token_to_id.get(text.as_bytes()).copied();

    let model = match vocab_type {
        VocabType::Bpe => {
            let merges = match md.get(KEY_MERGES) {
                None => return Err(TokenizerError::MissingKey { key: KEY_MERGES }),
                Some(Value::Array(Array::String(v))) => v,
                Some(v) => return Err(wrong(KEY_MERGES, "an array of strings", v)),
            };
            let config = pre.unwrap_or(PreConfig {
                kind: PreTokenizer::Default,
                clean_spaces: true,
                ignore_merges: false,
                add_bos: false,
            });
            Model::Bpe(Box::new(if utf8 {
                Bpe::new_utf8(&texts, merges, config.kind)
            } else {
                Bpe::new(&texts, merges, config.kind, config.ignore_merges)
            }))
        }
        VocabType::Wpm => Model::Wpm(Box::new(Wpm {
            // Where absent, llama.cpp lower-cases (and strips accents).
            lowercase: opt_bool(md, KEY_LOWERCASE)?.unwrap_or(true),
            max_token_len: texts.iter().map(String::len).max().unwrap_or(0),
        })),
        VocabType::Spm => {
            let mut byte_tokens = [None; 256];
            for (b, slot) in byte_tokens.iter_mut().enumerate() {
                // `<0xHH>`, else the byte as a one-byte text; llama.cpp throws where neither
                // exists, this falls back to the unknown token (resolved below).
                *slot = id_of(&format!("<0x{b:02X}>"))
                    .or_else(|| token_to_id.get([b as u8].as_slice()).copied());
            }
            Model::Spm(Box::new(Spm { byte_tokens }))
        }
    };

    // Ids with a role: a default that is out of range is dropped, a metadata value that is out
    // of range is ignored (both as llama.cpp, which warns).
    let n32 = n as u32;
    {
        let keys: [(&'static str, &mut Option<u32>); 14] = [
            ("tokenizer.ggml.bos_token_id", &mut ids.bos),
            ("tokenizer.ggml.eos_token_id", &mut ids.eos),
            ("tokenizer.ggml.eot_token_id", &mut ids.eot),
            ("tokenizer.ggml.eom_token_id", &mut ids.eom),
            ("tokenizer.ggml.unknown_token_id", &mut ids.unk),
            ("tokenizer.ggml.seperator_token_id", &mut ids.sep),
            ("tokenizer.ggml.padding_token_id", &mut ids.pad),
            ("tokenizer.ggml.mask_token_id", &mut ids.mask),
            ("tokenizer.ggml.fim_pre_token_id", &mut ids.fim_pre),
            ("tokenizer.ggml.fim_suf_token_id", &mut ids.fim_suf),
            ("tokenizer.ggml.fim_mid_token_id", &mut ids.fim_mid),
            ("tokenizer.ggml.fim_pad_token_id", &mut ids.fim_pad),
            ("tokenizer.ggml.fim_rep_token_id", &mut ids.fim_rep),
            ("tokenizer.ggml.fim_sep_token_id", &mut ids.fim_sep),
        ];
        for (key, slot) in keys {
            read_id(md, key, slot, n32)?;
        }
        // Deprecated spellings, read after (and so over) the current ones.
        read_id(md, "tokenizer.ggml.prefix_token_id", &mut ids.fim_pre, n32)?;
        read_id(md, "tokenizer.ggml.suffix_token_id", &mut ids.fim_suf, n32)?;
        read_id(md, "tokenizer.ggml.middle_token_id", &mut ids.fim_mid, n32)?;
    }
    // llama.cpp's WordPiece ignores both keys.
    if vocab_type != VocabType::Wpm {
        if let Some(v) = opt_bool(md, KEY_ADD_BOS)? {
            // llama.cpp overrides a `false` for Gemma 4.
            add_bos = v || utf8;
        }
        if let Some(v) = opt_bool(md, KEY_ADD_EOS)? {
            add_eos = v;
        }
    }

    // Ids the metadata does not name, found by text. llama.cpp walks a hash map, so which of
    // several candidates it takes is unspecified; this takes the lowest id (what llama.cpp
    // picks for SmolLM2's `<|endoftext|>` and `<|im_end|>`). The token taken becomes a control
    // token if it was not one.
    {
        let detect: [(&mut Option<u32>, &[&str]); 8] = [
            (&mut ids.eot, EOT_TEXTS),
            (&mut ids.eom, EOM_TEXTS),
            (&mut ids.fim_pre, FIM_PRE_TEXTS),
            (&mut ids.fim_suf, FIM_SUF_TEXTS),
            (&mut ids.fim_mid, FIM_MID_TEXTS),
            (&mut ids.fim_pad, FIM_PAD_TEXTS),
            (&mut ids.fim_rep, FIM_REP_TEXTS),
            (&mut ids.fim_sep, FIM_SEP_TEXTS),
        ];
        for (slot, candidates) in detect {
            if slot.is_some() {
                continue;
            }
            if let Some(id) = (0..n).find(|&i| candidates.contains(&texts[i].as_str())) {
                *slot = Some(id as u32);
                attrs[id] |= TokenAttr::CONTROL;
            }
        }
    }

    // Control tokens named "unused" are unused.
    for (text, attr) in texts.iter().zip(attrs.iter_mut()) {
        if attr.intersects(TokenAttr::CONTROL) && text.contains("unused") {
            *attr |= TokenAttr::UNUSED;
        }
    }

    // End of generation.
    let mut eog: Vec<u32> = [ids.fim_pad, ids.fim_rep, ids.fim_sep]
        .into_iter()
        .flatten()
        .collect();
    for (i, text) in texts.iter().enumerate() {
        if EOG_TEXTS.contains(&text.as_str()) {
            eog.push(i as u32);
            attrs[i] |= TokenAttr::CONTROL;
        }
    }
    // gpt-oss: these always render, as user-defined tokens.
    for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(id) = id_of(text) {
            attrs[id as usize] = TokenAttr::USER_DEFINED;
        }
    }
    eog.extend([ids.eos, ids.eot, ids.eom].into_iter().flatten());
    eog.sort_unstable();
    eog.dedup();
    // o200k_harmony and solar-open: `<|end|>` ends a message, not the generation.
    {
        let has = |t: &str| eog.iter().any(|&id| texts[id as usize] == t);
        let end = eog
            .iter()
            .copied()
            .find(|&id| texts[id as usize] == "<|end|>");
        let call = has("<|call|>") || has("<|calls|>");
        if let Some(end) = end {
            if call && (has("<|return|>") || has("<|flush|>")) {
                eog.retain(|&id| id != end);
                attrs[end as usize] = TokenAttr::USER_DEFINED;
            }
        }
    }
    // Gemma 4 and PLaMo have a normal `</s>`.
    {
        let has = |t: &str| eog.iter().any(|&id| texts[id as usize] == t);
        let s = eog.iter().copied().find(|&id| texts[id as usize] == "</s>");
        if let Some(s) = s {
            if has("<|tool_response>") || has("<|plamo:eos|>") {
                eog.retain(|&id| id != s);
                attrs[s as usize] = TokenAttr::NORMAL;
            }
        }
    }

    // The special tokens the partition cuts out, longest first.
    let mut special_ids: Vec<u32> = (0..n32)
        .filter(|&id| {
            attrs[id as usize]
                .intersects(TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN)
        })
        .collect();
    special_ids.sort_by(|&a, &b| {
        texts[b as usize]
            .len()
            .cmp(&texts[a as usize].len())
            .then(a.cmp(&b))
    });

    // Pieces, from the attributes as they stand now (llama.cpp fills its cache here, before the
    // strip flags below, which do not affect pieces).
    let mut pieces = Vec::new();
    let mut piece_ends = Vec::with_capacity(n);
    for (i, text) in texts.iter().enumerate() {
        // Gemma 4's and WordPiece's tokens spell spaces as SentencePiece's do.
        let style = match vocab_type {
            VocabType::Bpe if !utf8 => VocabType::Bpe,
            _ => VocabType::Spm,
        };
        append_piece(&mut pieces, style, text, attrs[i], i as u32)?;
        let end =
            u32::try_from(pieces.len()).map_err(|_| TokenizerError::TooManyTokens { count: n })?;
        piece_ends.push(end);
    }

    // LSTRIP/RSTRIP, which llama.cpp sets by model name.
    {
        let name = opt_str(md, "general.name")?
            .unwrap_or("")
            .to_ascii_lowercase();
        let arch = opt_str(md, "general.architecture")?.unwrap_or("");
        let contains_any = |s: &str, subs: &[&str]| subs.iter().any(|x| s.contains(x));
        let mut set = |text: &str, attr: TokenAttr, on: bool| {
            if let Some(id) = id_of(text) {
                let a = &mut attrs[id as usize];
                *a = if on {
                    *a | attr
                } else {
                    TokenAttr(a.0 & !attr.0)
                };
            }
        };
        if contains_any(pre_name, &["jina-v2-de", "jina-v2-es", "jina-v2-code"])
            || contains_any(arch, &["nomic-bert-moe", "jina-bert-v3"])
        {
            set("<mask>", TokenAttr::LSTRIP, true);
        } else if contains_any(&name, &["phi-3", "phi3"]) {
            for &id in &special_ids {
                attrs[id as usize] |= TokenAttr::RSTRIP;
            }
            let mut set = |text: &str, on: bool| {
                if let Some(id) = id_of(text) {
                    let a = &mut attrs[id as usize];
                    *a = if on {
                        *a | TokenAttr::RSTRIP
                    } else {
                        TokenAttr(a.0 & !TokenAttr::RSTRIP.0)
                    };
                }
            };
            set("</s>", true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(t, false);
            }
        } else if name.contains("modern-bert") {
            set("[MASK]", TokenAttr::LSTRIP, true);
        }
    }

    let special = SpecialMatcher::new(
        special_ids
            .iter()
            .map(|&id| {
                let a = attrs[id as usize];
                (
                    Special {
                        id,
                        needs_parse_special: a.intersects(TokenAttr::CONTROL | TokenAttr::UNKNOWN),
                        lstrip: a.intersects(TokenAttr::LSTRIP),
                        rstrip: a.intersects(TokenAttr::RSTRIP),
                    },
                    texts[id as usize].as_bytes(),
                )
            })
            .collect(),
    );

    // A byte with no token of its own falls back to the unknown token (SentencePiece).
    let model = match model {
        Model::Spm(mut spm) => {
            for slot in spm.byte_tokens.iter_mut() {
                if slot.is_none() {
                    *slot = ids.unk;
                }
            }
            Model::Spm(spm)
        }
        m => m,
    };

    Ok(Tokenizer {
        vocab_type,
        tokens: texts,
        scores,
        attrs,
        token_to_id,
        model,
        special,
        ids,
        eog,
        add_bos,
        add_eos,
        add_space_prefix,
        clean_spaces,
        pieces,
        piece_ends,
    })
}

/// llama.cpp's `token_to_piece` with special tokens rendered, appended to `out`.
fn append_piece(
    out: &mut Vec<u8>,
    vocab_type: VocabType,
    text: &str,
    attr: TokenAttr,
    id: u32,
) -> Result<(), TokenizerError> {
    if attr.intersects(TokenAttr::UNKNOWN | TokenAttr::CONTROL | TokenAttr::USER_DEFINED) {
        out.extend_from_slice(text.as_bytes());
    } else if attr.intersects(TokenAttr::NORMAL) {
        match vocab_type {
            VocabType::Spm | VocabType::Wpm => {
                out.extend_from_slice(text.replace('\u{2581}', " ").as_bytes())
            }
            VocabType::Bpe => {
                for c in text.chars() {
                    match bpe::char_to_byte(c) {
                        Some(b) => out.push(b),
                        None => {
                            // llama.cpp's marker for a character outside the alphabet.
                            out.extend_from_slice(b"[UNK_BYTE_0x");
                            let mut buf = [0u8; 4];
                            for b in c.encode_utf8(&mut buf).bytes() {
                                out.extend_from_slice(format!("{b:02x}").as_bytes());
                            }
                            out.extend_from_slice(text.as_bytes());
                            out.push(b']');
                        }
                    }
                }
            }
        }
    } else if attr.intersects(TokenAttr::BYTE) {
        out.push(
            parse_byte_token(text).ok_or_else(|| TokenizerError::BadByteToken {
                id,
                text: text.to_string(),
            })?,
        );
    }
    // Unused and undefined tokens have no piece.
    Ok(())
}

/// The byte of a `<0xHH>` token. llama.cpp reads the two characters after `<0x` with `strtol`;
/// this also requires the brackets.
fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

fn check_len<T>(
    key: &'static str,
    found: usize,
    expected: usize,
    take: impl FnOnce() -> T,
) -> Result<T, TokenizerError> {
    if found < expected {
        return Err(TokenizerError::LengthMismatch {
            key,
            found,
            expected,
        });
    }
    Ok(take())
}

fn describe(v: &Value) -> String {
    match v {
        Value::Array(a) => format!("an array of {} ({} entries)", a.elem_type(), a.len()),
        v => format!("a {}", v.value_type()),
    }
}

fn wrong(key: &'static str, expected: &'static str, v: &Value) -> TokenizerError {
    TokenizerError::WrongType {
        key,
        expected,
        found: describe(v),
    }
}

fn opt_str<'a>(md: &'a Metadata, key: &'static str) -> Result<Option<&'a str>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s)),
        Some(v) => Err(wrong(key, "a string", v)),
    }
}

fn opt_bool(md: &Metadata, key: &'static str) -> Result<Option<bool>, TokenizerError> {
    match md.get(key) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(wrong(key, "a bool", v)),
    }
}

/// Read a token id into `slot`, after dropping a default that is out of range.
fn read_id(
    md: &Metadata,
    key: &'static str,
    slot: &mut Option<u32>,
    n_vocab: u32,
) -> Result<(), TokenizerError> {
    if slot.is_some_and(|id| id >= n_vocab) {
        *slot = None;
    }
    match md.get(key) {
        None => Ok(()),
        Some(v) => match (v.as_u64(), v.as_i64()) {
            (Some(id), _) => {
                if id < u64::from(n_vocab) {
                    *slot = Some(id as u32);
                }
                Ok(())
            }
            (None, Some(_)) => Ok(()), // negative: out of range
            (None, None) => Err(wrong(key, "an integer", v)),
        },
    }
}
