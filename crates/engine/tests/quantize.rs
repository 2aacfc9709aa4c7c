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
    GgmlType::from_name(name).unwrap_or_else(|| panic!("type {name}"))
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

/// What `synapse imatrix` computes for `model` over `text`, with llama-imatrix's defaults
/// but for `-c` (`n_ctx`) and `--chunks`, as the GGUF it writes.
fn imatrix_of(
    model: &GgufFile,
    text: &str,
    n_ctx: usize,
    chunks: Option<usize>,
    threads: usize,
) -> Vec<u8> {
    use synapse_engine::quantize::collect::{collect_over, Chunking, Collector};
    let tok = synapse_engine::tokenizer::Tokenizer::from_metadata(model.metadata()).unwrap();
    let m = synapse_engine::load(model).unwrap();
    let tokens = tok.tokenize(&std::fs::read_to_string(repo(text)).unwrap(), true, false);
    let chunking = Chunking {
        n_ctx,
        n_batch: 2048,
        n_ubatch: 512,
        max_chunks: chunks,
        bos: tok.bos().filter(|_| tok.add_bos_token()),
    };
    let threads = synapse_engine::Threads::new(threads);
    let (c, _) = collect_over(
        m.as_ref(),
        &tokens,
        &chunking,
        Collector::default(),
        &threads,
        &mut |_, _| {},
    )
    .unwrap();
    synapse_engine::quantize::imatrix::to_gguf(&c.stats, &[text.to_string()], n_ctx)
        .unwrap()
        .to_bytes()
        .unwrap()
}

fn f32s(t: &synapse_gguf::TensorView) -> Vec<f64> {
    t.data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64)
        .collect()
}

/// Our importance matrix against llama-imatrix's (the files beside the golden cases, made with
/// the same text and `-c`): the same metadata, entries, shapes and token counts; the inputs of
/// the first layer's Q, K and V (no attention before them) summed to the same bits; every other
/// sum within `tolerance` (relative, over the whole matrix). llama.cpp's batched passes give
/// activations a little off its own one-token-at-a-time ones, which synapse's passes equal
/// whatever the batch, so the later sums cannot be its bits. Mixtures route a few tokens to other
/// experts on near-ties: `same_counts` false checks only each matrix's total.
fn check_imatrix(ours: &[u8], golden: &str, tolerance: f64, same_counts: bool) {
    let ours = GgufFile::from_bytes(ours.to_vec()).unwrap();
    let theirs = GgufFile::open(repo(golden)).unwrap();
    let keys = |f: &GgufFile| -> Vec<(String, String)> {
        f.metadata()
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    };
    assert_eq!(keys(&ours), keys(&theirs), "{golden}: metadata");
    let names = |f: &GgufFile| -> Vec<(String, Vec<u64>)> {
        f.tensor_infos()
            .iter()
            .map(|t| (t.name.clone(), t.shape.clone()))
            .collect()
    };
    assert_eq!(names(&ours), names(&theirs), "{golden}: entries");
    for t in theirs.tensors() {
        let name = &t.info.name;
        let (a, b) = (f32s(&ours.tensor(name).unwrap()), f32s(&t));
        if name.ends_with(".counts") {
            if same_counts {
                assert_eq!(a, b, "{golden}: {name}");
            } else {
                assert_eq!(
                    a.iter().sum::<f64>(),
                    b.iter().sum::<f64>(),
                    "{golden}: {name}"
                );
            }
            continue;
        }
        if name.starts_with("blk.0.attn_") && !name.contains("output") {
            assert_eq!(a, b, "{golden}: {name} must be llama-imatrix's bits");
        }
        let diff: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| (x - y) * (x - y))
            .sum::<f64>()
            .sqrt();
        let norm: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
        assert!(
            diff <= tolerance * norm,
            "{golden}: {name} off by {:.2e} (relative)",
            diff / norm
        );
    }
}

#[test]
fn imatrix_is_llama_imatrixs_within_its_batching_and_free_of_threads() {
    let eval = "crates/engine/tests/data/forward/eval.txt";
    let tiny = GgufFile::open(repo("crates/engine/tests/data/forward/tiny-F16.gguf")).unwrap();
    let one = imatrix_of(&tiny, eval, 128, None, 1);
    assert_eq!(
        one,
        imatrix_of(&tiny, eval, 128, None, 7),
        "threads changed the sums"
    );
    check_imatrix(
        &one,
        "crates/engine/tests/data/quantize/tiny.imatrix.gguf",
        1e-3,
        true,
    );

    let moe = GgufFile::open(repo(
        "crates/engine/tests/data/forward/tiny-qwen3moe-Q4_K.gguf",
    ))
    .unwrap();
    let ours = imatrix_of(&moe, eval, 128, None, 3);
    check_imatrix(
        &ours,
        "crates/engine/tests/data/quantize/qwen3moe.imatrix.gguf",
        2e-2,
        false,
    );

    // SmolLM2, through its F16 copy (llama-imatrix ran on the F16 file llama-quantize made).
    let dir = tempfile::tempdir().unwrap();
    let f16 = dir.path().join("smollm2-f16.gguf");
    let q41 = GgufFile::open(repo("models/SmolLM2-135M-Instruct.Q4_1.gguf")).unwrap();
    let req = Request {
        mix: Mix::parse("F16").unwrap(),
        options: Options {
            allow_requantize: true,
            ..Options::default()
        },
        imatrix: None,
        threads: 2,
    };
    quantize_file(&q41, &f16, &req, &mut |_| {}).unwrap();
    let smol = GgufFile::open(&f16).unwrap();
    let ours = imatrix_of(
        &smol,
        "crates/cli/tests/data/perplexity.txt",
        128,
        Some(4),
        2,
    );
    check_imatrix(
        &ours,
        "crates/engine/tests/data/quantize/smollm2.imatrix.gguf",
        5e-3,
        true,
    );
}

#[test]
fn imatrix_refuses_a_text_shorter_than_two_chunks() {
    use synapse_engine::quantize::collect::{collect_over, Chunking, Collector};
    let tiny = GgufFile::open(repo("crates/engine/tests/data/forward/tiny-F16.gguf")).unwrap();
    let m = synapse_engine::load(&tiny).unwrap();
    let chunking = Chunking {
        n_ctx: 128,
        n_batch: 2048,
        n_ubatch: 512,
        max_chunks: None,
        bos: None,
    };
    let threads = synapse_engine::Threads::new(1);
    let e = collect_over(
        m.as_ref(),
        &[5; 200],
        &chunking,
        Collector::default(),
        &threads,
        &mut |_, _| {},
    )
    .unwrap_err();
    assert!(e.to_string().contains("two chunks of 128"), "{e}");
}

/// Odd shapes: a matrix of no rows or no columns, rows of 32 values under a 256-value mix (the
/// fallback type), and three rows: a file that quantizes and reads back.
#[test]
fn empty_and_short_rows_quantize() {
    use synapse_gguf::{GgufWriter, Value};
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    w.set("llama.block_count", Value::U32(1));
    let floats = |n: usize| -> Vec<u8> {
        (0..n)
            .flat_map(|i| (i as f32 * 0.01).sin().to_le_bytes())
            .collect()
    };
    w.add_tensor("blk.0.attn_q.weight", GgmlType::F32, &[0, 4], Vec::new())
        .unwrap();
    w.add_tensor("blk.0.attn_k.weight", GgmlType::F32, &[32, 0], Vec::new())
        .unwrap();
    w.add_tensor("blk.0.ffn_down.weight", GgmlType::F32, &[32, 3], floats(96))
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("in.gguf");
    w.write_file(&input).unwrap();
    let out = dir.path().join("out.gguf");
    let file = GgufFile::open(&input).unwrap();
    let summary = quantize_file(
        &file,
        &out,
        &request("Q4_K_M", Options::default()),
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(summary.fallbacks, 2, "{summary:?}"); // both 32-value rows
    let q = GgufFile::open(&out).unwrap();
    let down = q.tensor("blk.0.ffn_down.weight").unwrap();
    assert_eq!(down.info.shape, [32, 3]);
    assert!(
        down.info.ggml_type.block_len() == 32,
        "{}",
        down.info.ggml_type
    );
    assert_eq!(q.tensor("blk.0.attn_q.weight").unwrap().data.len(), 0);
    // A zero is a dimension ggml counts, unlike a trailing 1.
    assert_eq!(q.tensor("blk.0.attn_k.weight").unwrap().info.shape, [32, 0]);
}
