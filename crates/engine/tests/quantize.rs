//! `quantize_file` against llama-quantize: for every case of `tests/data/quantize/golden.json`
//! (every mix of the tiny llama with and without an importance matrix, the options, every
//! architecture's random-weight file requantized, a mixture of experts with per-expert
//! importance, SmolLM2 to F16 and then to Q4_K_M), the output's header and every tensor hash
//! as llama-quantize's. The cases and how the golden data were made:
//! `scripts/golden/quantize.py`.

mod common;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value as Json;
use sha2::{Digest, Sha256};
use synapse_engine::quantize::file::{quantize_file, QuantizeError, Request};
use synapse_engine::quantize::imatrix::Imatrix;
use synapse_engine::quantize::rules::{Mix, Options, TensorTypeOverride};
use synapse_gguf::{GgmlType, GgufFile};

fn repo(rel: &str) -> PathBuf {
    if let Some(model) = rel.strip_prefix("models/") {
        return common::model_path(model);
    }
    common::kernels_from_env();
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(rel)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn ggml_type(name: &str) -> GgmlType {
    GgmlType::ALL
        .iter()
        .copied()
        .find(|t| t.name().eq_ignore_ascii_case(name))
        .unwrap_or_else(|| panic!("type {name}"))
}

fn options(case: &Json) -> Options {
    let flag = |k: &str| case.get(k).and_then(Json::as_bool).unwrap_or(false);
    let ty = |k: &str| case.get(k).and_then(Json::as_str).map(ggml_type);
    Options {
        pure: flag("pure"),
        allow_requantize: flag("allow_requantize"),
        leave_output_tensor: flag("leave_output_tensor"),
        output_tensor_type: ty("output_tensor_type"),
        token_embedding_type: ty("token_embedding_type"),
        tensor_types: case
            .get("tensor_types")
            .and_then(Json::as_array)
            .into_iter()
            .flatten()
            .map(|o| {
                let (name, t) = o.as_str().unwrap().split_once('=').unwrap();
                TensorTypeOverride {
                    pattern: name.into(),
                    ty: ggml_type(t),
                }
            })
            .collect(),
        ..Options::default()
    }
}

/// Panics naming the first part of `path` that differs from the golden digest of `case`.
fn check_digest(what: &str, path: &Path, case: &Json) {
    let bytes = std::fs::read(path).unwrap();
    let file = GgufFile::open(path).unwrap();
    let start = file.header().data_start as usize;
    if hex(&Sha256::digest(&bytes[..start])) != case["header"].as_str().unwrap() {
        let keys: Vec<&str> = file.metadata().iter().map(|(k, _)| k).collect();
        panic!("{what}: the header (metadata or tensor infos) differs from llama-quantize's; our keys: {keys:?}");
    }
    let golden = case["tensors"].as_array().unwrap();
    assert_eq!(
        file.tensor_infos().len(),
        golden.len(),
        "{what}: tensor count"
    );
    for (t, g) in file.tensors().zip(golden) {
        let (name, ty, hash) = (
            g[0].as_str().unwrap(),
            g[1].as_str().unwrap(),
            g[2].as_str().unwrap(),
        );
        assert_eq!(t.info.name, name, "{what}: tensor order");
        assert_eq!(t.info.ggml_type.name(), ty, "{what}: type of `{name}`");
        let ours = hex(&Sha256::digest(t.data));
        assert_eq!(hash.len(), 16, "{what}: golden hash of `{name}`");
        assert!(
            ours.starts_with(hash),
            "{what}: tensor `{name}` ({ty}) differs from llama-quantize's; \
             scripts/golden/quantize.py makes its file for a byte comparison"
        );
    }
    assert_eq!(
        bytes.len() as u64,
        case["bytes"].as_u64().unwrap(),
        "{what}: file size"
    );
    assert_eq!(
        hex(&Sha256::digest(&bytes)),
        case["file"].as_str().unwrap(),
        "{what}: file"
    );
}

#[test]
fn every_case_is_llama_quantizes_file_byte_for_byte() {
    let golden: Json = serde_json::from_slice(
        &std::fs::read(repo("crates/engine/tests/data/quantize/golden.json")).unwrap(),
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut made: HashMap<String, PathBuf> = HashMap::new();
    let mut imatrices: HashMap<String, Imatrix> = HashMap::new();
    let cases = golden.as_array().unwrap();
    assert!(cases.len() >= 70, "{} cases", cases.len());
    for (i, case) in cases.iter().enumerate() {
        let input = case["input"].as_str().unwrap();
        let mix = case["mix"].as_str().unwrap();
        let what = format!(
            "case {i} ({input} to {mix}{})",
            if case.get("imatrix").is_some() {
                ", imatrix"
            } else {
                ""
            }
        );
        let in_path = made.get(input).cloned().unwrap_or_else(|| repo(input));
        let file = GgufFile::open(&in_path).unwrap();
        let imatrix = case.get("imatrix").and_then(Json::as_str).map(|p| {
            // Recorded in the metadata as given: the golden run gave it from the repository's
            // root.
            let m = imatrices
                .entry(p.to_string())
                .or_insert_with(|| Imatrix::load(&repo(p)).unwrap());
            (&*m, p.to_string())
        });
        let request = Request {
            mix: Mix::parse(mix).unwrap(),
            options: options(case),
            imatrix,
            // Thread counts above this machine's: the bytes must not depend on them.
            threads: [1, 3, 16][i % 3],
        };
        let out = dir.path().join(format!("case{i}.gguf"));
        quantize_file(&file, &out, &request, &mut |_| {}).unwrap_or_else(|e| panic!("{what}: {e}"));
        check_digest(&what, &out, case);
        if let Some(name) = case.get("makes").and_then(Json::as_str) {
            made.insert(name.into(), out);
        } else {
            std::fs::remove_file(&out).unwrap();
        }
    }
}

fn request(mix: &str, options: Options) -> Request<'static> {
    Request {
        mix: Mix::parse(mix).unwrap(),
        options,
        imatrix: None,
        threads: 2,
    }
}

/// Bad requests fail before a byte is written, with the reason named, and leave nothing at the
/// output path (an existing file there is kept as it was).
#[test]
fn bad_requests_are_named_errors_and_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("out.gguf");
    std::fs::write(&out, b"precious").unwrap();
    let tiny = GgufFile::open(repo("crates/engine/tests/data/forward/tiny-F16.gguf")).unwrap();
    let q4k = GgufFile::open(repo(
        "crates/engine/tests/data/forward/tiny-qwen3-Q4_K.gguf",
    ))
    .unwrap();
    let smollm2_imatrix = Imatrix::load(&repo(
        "crates/engine/tests/data/quantize/smollm2.imatrix.gguf",
    ))
    .unwrap();

    let err = |file: &GgufFile, req: &Request| -> String {
        let e = quantize_file(file, &out, req, &mut |_| {}).expect_err("must fail");
        assert_eq!(std::fs::read(&out).unwrap(), b"precious", "{e}");
        e.to_string()
    };
    // Already quantized, without --allow-requantize.
    let e = err(&q4k, &request("Q8_0", Options::default()));
    assert!(
        e.contains("already Q4_K") && e.contains("--allow-requantize"),
        "{e}"
    );
    // Unknown mix names are refused when parsed.
    assert!(Mix::parse("Q4_K_X").is_err());
    assert!(Mix::parse("IQ2_XXS")
        .unwrap_err()
        .to_string()
        .contains("not one synapse writes"));
    // A mix that needs an importance matrix, without one.
    let e = err(&tiny, &request("Q2_K_S", Options::default()));
    assert!(e.contains("importance matrix"), "{e}");
    // An importance matrix made for another model: SmolLM2's (576 columns) on the tiny llama
    // (256).
    let mut req = request("Q4_K_M", Options::default());
    req.imatrix = Some((&smollm2_imatrix, "smollm2.imatrix.gguf".into()));
    let e = err(&tiny, &req);
    assert!(matches!(
        quantize_file(&tiny, &out, &req, &mut |_| {}),
        Err(QuantizeError::Imatrix(_))
    ));
    assert!(e.contains("another model"), "{e}");
    assert!(!dir.path().read_dir().unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".part")));
}

/// An importance-matrix file that is not one: a clear error naming the file.
#[test]
fn bad_imatrix_files_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, &[u8], &str); 4] = [
        ("empty", b"", "entry count"),
        ("short", &[2, 0, 0, 0, 5, 0, 0, 0, b'a'], "ends inside"),
        ("negative", &[1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff], "bytes"),
        ("model", &[], "metadata"),
    ];
    for (name, bytes, want) in cases {
        let p = dir.path().join(name);
        if name == "model" {
            std::fs::copy(repo("crates/engine/tests/data/forward/tiny-F16.gguf"), &p).unwrap();
        } else {
            std::fs::write(&p, bytes).unwrap();
        }
        let e = Imatrix::load(&p).expect_err(name).to_string();
        assert!(e.contains(want) && e.contains(name), "{name}: {e}");
    }
}
