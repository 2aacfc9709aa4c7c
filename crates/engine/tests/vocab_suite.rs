//! llama.cpp's own tokenizer suite (`models/ggml-vocab-*.gguf` with their `.inp` inputs and
//! `.out` ids, fetched by `scripts/fetch-models.sh vocabs`), run as its `test-tokenizer-0`
//! runs it: no BOS, special tokens not parsed. Every case of every vocabulary synapse
//! supports must give llama.cpp's ids; the vocabularies it does not support yet must be refused
//! by name (not tokenized wrongly), and each is listed here, so that a new one is noticed.

use std::path::PathBuf;

use synapse_engine::tokenizer::Tokenizer;
use synapse_gguf::GgufFile;

/// Vocabularies whose every case is checked.
const SUPPORTED: &[&str] = &[
    "bert-bge",
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
];

/// Vocabularies refused today (pre-tokenizers or tokenizer models not written yet).
const REFUSED: &[&str] = &[];

fn vocab_dir() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models/vocab");
    assert!(
        dir.join("ggml-vocab-qwen35.gguf.out").exists(),
        "{} is missing: run scripts/fetch-models.sh vocabs",
        dir.display()
    );
    dir
}

/// The cases of a vocabulary: its inputs and llama.cpp's ids for each.
fn cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let dir = vocab_dir();
    let read = |ext: &str| {
        let p = dir.join(format!("ggml-vocab-{name}.gguf.{ext}"));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let inp = read("inp");
    let mut inputs: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    // Most files end with a separator, which leaves an empty last piece; gemma-4's does not.
    if inputs.last() == Some(&"") {
        inputs.pop();
    }
    let out = read("out");
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect())
        .collect();
    assert_eq!(
        inputs.len(),
        ids.len(),
        "{name}: inputs and outputs pair up"
    );
    inputs.into_iter().map(String::from).zip(ids).collect()
}

fn tokenizer(name: &str) -> Result<Tokenizer, String> {
    let path = vocab_dir().join(format!("ggml-vocab-{name}.gguf"));
    let file = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_metadata(file.metadata()).map_err(|e| e.to_string())
}

#[test]
fn every_case_of_every_supported_vocabulary_is_llama_cpps() {
    let mut failures = Vec::new();
    let mut n = 0;
    for name in SUPPORTED {
        let tok = tokenizer(name).unwrap_or_else(|e| panic!("{name}: {e}"));
        for (text, want) in cases(name) {
            n += 1;
            let got = tok.tokenize(&text, false, false);
            if got != want {
                failures.push(format!("{name}: {text:?}: want {want:?}, got {got:?}"));
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {n} cases differ:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_other_vocabularies_are_refused_by_name_and_all_are_listed() {
    for name in REFUSED {
        match tokenizer(name) {
            Ok(_) => panic!("{name} loads now: move it to SUPPORTED, where its cases are run"),
            Err(e) => assert!(!e.is_empty(), "{name}"),
        }
    }
    let listed: Vec<&str> = SUPPORTED.iter().chain(REFUSED).copied().collect();
    for entry in std::fs::read_dir(vocab_dir()).unwrap() {
        let file = entry.unwrap().file_name().into_string().unwrap();
        let Some(name) = file
            .strip_prefix("ggml-vocab-")
            .and_then(|f| f.strip_suffix(".gguf.inp"))
        else {
            continue;
        };
        assert!(
            listed.contains(&name),
            "{name}: a vocabulary with cases, in neither list"
        );
    }
}

/// Gemma 4's UTF-8 BPE gives its texts back: `▁` pieces decode to spaces, byte tokens
/// (`<0xHH>`, what an emoji outside the vocabulary falls back to) to their bytes.
#[test]
fn gemma4_ids_decode_to_their_text() {
    let tok = tokenizer("gemma-4").unwrap();
    for text in [
        "Hello world",
        "a  b\n\n\tc",
        "this is 🦙.cpp",
        "нещо на Български",
    ] {
        let ids = tok.tokenize(text, false, false);
        assert_eq!(
            tok.detokenize(&ids, false, false),
            text.as_bytes(),
            "{text:?}"
        );
    }
    assert!(tok.add_bos_token(), "llama.cpp always adds Gemma 4's BOS");
}
