//! The `synapse` binary from the outside: `info` and `dequantize` on the golden fixtures, and
//! clear errors on bad files.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use synapse_gguf::{GgmlType, GgufFile, GgufWriter, Value};

fn synapse(args: &[&std::ffi::OsStr]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_synapse"))
        .args(args)
        .output()
        .expect("run synapse")
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../quant/tests/data")
}

fn fixture_names() -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(fixtures())
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let stem = name.strip_suffix(".f32.gguf")?;
            Some(stem.to_string())
        })
        .collect();
    names.sort();
    names
}

#[test]
fn dequantize_gives_the_python_reference_floats_for_every_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let names = fixture_names();
    assert!(names.len() >= 18, "{names:?}");
    for name in names {
        let input = fixtures().join(format!("{name}.gguf"));
        let out = dir.path().join(format!("{name}.out.gguf"));
        let r = synapse(&["dequantize".as_ref(), input.as_os_str(), out.as_os_str()]);
        assert!(
            r.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&r.stderr)
        );
        let got = GgufFile::open(&out).unwrap();
        let src = GgufFile::open(&input).unwrap();
        let golden = GgufFile::open(fixtures().join(format!("{name}.f32.gguf"))).unwrap();
        // Metadata is kept.
        for (k, v) in src.metadata().iter() {
            assert_eq!(got.metadata().get(k), Some(v), "{name}: {k}");
        }
        assert_eq!(got.tensor_infos().len(), src.tensor_infos().len());
        for t in got.tensors() {
            assert_eq!(t.info.ggml_type, GgmlType::F32);
            let want = golden.tensor(&t.info.name).unwrap();
            assert_eq!(t.info.shape, src.tensor(&t.info.name).unwrap().info.shape);
            assert!(
                t.data == want.data,
                "{name}: {} differs from the reference",
                t.info.name
            );
        }
    }
}

#[test]
fn info_lists_tensors_as_text_and_json() {
    let input = fixtures().join("real_gemma3.gguf");
    let r = synapse(&["info".as_ref(), input.as_os_str()]);
    assert!(r.status.success());
    let text = String::from_utf8(r.stdout).unwrap();
    let f = GgufFile::open(&input).unwrap();
    for t in f.tensor_infos() {
        let line = text
            .lines()
            .find(|l| l.trim_start().starts_with(&t.name))
            .unwrap();
        assert!(
            line.contains(t.ggml_type.name()) && line.contains(&t.size.to_string()),
            "{line}"
        );
    }

    let r = synapse(&["info".as_ref(), "--json".as_ref(), input.as_os_str()]);
    assert!(r.status.success());
    let j: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let tensors = j["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), f.tensor_infos().len());
    for (jt, t) in tensors.iter().zip(f.tensor_infos()) {
        assert_eq!(jt["name"], t.name.as_str());
        assert_eq!(jt["type"], t.ggml_type.name());
        assert_eq!(jt["bytes"], t.size);
        assert_eq!(jt["offset"], f.header().data_start + t.offset);
        assert_eq!(jt["shape"], serde_json::json!(t.shape));
    }
    assert_eq!(j["metadata"]["fixture.source"], "gemma-3-270m-q4_k_m.gguf");
}

/// `info --kernels` names the kernels of every weight matrix, within the tier cap it runs
/// under (`SYNAPSE_ISA`) and with packing off (`SYNAPSE_PACK=0`).
#[test]
fn info_names_every_matrix_kernel_under_each_tier_cap() {
    let input = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../models/gemma-3-270m-q4_k_m.gguf");
    assert!(
        input.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        input.display()
    );
    let f = GgufFile::open(&input).unwrap();
    let matrices: Vec<_> = f
        .tensor_infos()
        .iter()
        .filter(|t| t.shape.len() >= 2 && synapse_quant::vec_dot_type(t.ggml_type).is_ok())
        .collect();
    assert!(matrices.len() > 100);
    for (isa, pack) in [
        (None, None),
        (Some("reference"), None),
        (Some("avx2"), None),
        (Some("avxvnni"), None),
        (Some("avx512vnni"), Some("0")),
    ] {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_synapse"));
        cmd.args(["info".as_ref(), "--kernels".as_ref(), input.as_os_str()]);
        cmd.env_remove("SYNAPSE_ISA").env_remove("SYNAPSE_PACK");
        if let Some(isa) = isa {
            cmd.env("SYNAPSE_ISA", isa);
        }
        if let Some(p) = pack {
            cmd.env("SYNAPSE_PACK", p);
        }
        let r = cmd.output().unwrap();
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        let text = String::from_utf8(r.stdout).unwrap();
        let header = text.lines().next().unwrap();
        assert!(header.starts_with("kernels on this CPU: "), "{header}");
        assert!(header.contains(&format!("tier cap: {}", isa.unwrap_or("none"))));
        let kernels: Vec<&str> = text
            .lines()
            .filter_map(|l| {
                l.trim_start()
                    .strip_prefix("one token: ")
                    .or(l.trim_start().strip_prefix("batch:     "))
            })
            .collect();
        for t in &matrices {
            let at = text.lines().position(|l| l.starts_with(&t.name)).unwrap();
            let line = text.lines().nth(at).unwrap();
            assert!(line.contains(t.ggml_type.name()), "{line}");
            let next = text.lines().nth(at + 1).unwrap_or_default();
            let lookups = line.ends_with("(row lookups only)");
            assert!(lookups || next.contains("one token: "), "{line}\n{next}");
        }
        assert!(!kernels.is_empty());
        // Each line lists its kernels as `name (N rows): why; name: why`.
        let names: Vec<&str> = kernels
            .iter()
            .flat_map(|l| l.split("; "))
            .map(|k| k[..k.find([':', ' ']).unwrap()].trim())
            .collect();
        for name in names {
            let tier = name.rsplit('.').next().unwrap();
            if cfg!(target_arch = "x86_64") {
                match isa {
                    Some("reference") => assert_eq!(tier, "reference", "{name}"),
                    Some("avx2") => assert!(["reference", "avx2"].contains(&tier), "{name}"),
                    Some("avxvnni") => assert!(!tier.starts_with("avx512"), "{name}"),
                    _ => {}
                }
            }
            if pack == Some("0") {
                assert!(!name.contains(".packed."), "{name}");
            }
        }
    }
}

#[test]
fn bad_files_get_clear_errors_not_panics() {
    let dir = tempfile::tempdir().unwrap();
    let text = dir.path().join("not.gguf");
    std::fs::write(&text, "hello, world").unwrap();
    let truncated = dir.path().join("truncated.gguf");
    let whole = std::fs::read(fixtures().join("fmt_Q4_K.gguf")).unwrap();
    std::fs::write(&truncated, &whole[..whole.len() - 700]).unwrap();
    let missing = dir.path().join("missing.gguf");
    for (path, says) in [
        (&text, "not a GGUF file"),
        (&truncated, "lies outside"),
        (&missing, "No such file"),
    ] {
        for cmd in ["info", "dequantize"] {
            let out = dir.path().join("out.gguf");
            let r = synapse(
                &[cmd.as_ref(), path.as_os_str(), out.as_os_str()]
                    [..if cmd == "info" { 2 } else { 3 }],
            );
            let err = String::from_utf8_lossy(&r.stderr);
            assert_eq!(r.status.code(), Some(1), "{cmd} {}: {err}", path.display());
            // The path and the reason, each once (an error chain that repeats its parts reads
            // as noise).
            assert_eq!(err.matches(says).count(), 1, "{cmd}: {err}");
            assert_eq!(
                err.matches(&*path.to_string_lossy()).count(),
                1,
                "{cmd}: {err}"
            );
            assert!(!err.contains("panicked"), "{err}");
        }
    }
}

#[test]
fn dequantize_names_a_tensor_it_cannot_decode() {
    let dir = tempfile::tempdir().unwrap();
    let input = dir.path().join("iq2.gguf");
    let mut w = GgufWriter::new();
    w.set("general.architecture", Value::String("llama".into()));
    w.add_tensor(
        "blk.0.attn_q.weight",
        GgmlType::IQ2_XXS,
        &[256],
        vec![0u8; 66],
    )
    .unwrap();
    w.write_file(&input).unwrap();
    let out = dir.path().join("out.gguf");
    let r = synapse(&["dequantize".as_ref(), input.as_os_str(), out.as_os_str()]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(1));
    assert!(
        err.contains("blk.0.attn_q.weight") && err.contains("IQ2_XXS"),
        "{err}"
    );
    assert!(!out.exists(), "a partial output was left behind");
}

/// `synapse quantize` as a user runs it: the tiny llama to Q4_K_M with an importance matrix
/// gives llama-quantize's file (its hash in the engine's golden cases), and bad arguments
/// are named errors with a failing exit status and no output file.
#[test]
fn quantize_writes_llama_quantizes_file_and_names_bad_arguments() {
    let engine = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/data");
    let golden: serde_json::Value =
        serde_json::from_slice(&std::fs::read(engine.join("quantize/golden.json")).unwrap())
            .unwrap();
    let case = golden
        .as_array()
        .unwrap()
        .iter()
        .find(|c| {
            c["input"] == "crates/engine/tests/data/forward/tiny-F16.gguf"
                && c["mix"] == "Q4_K_M"
                && c.get("imatrix").is_some()
        })
        .expect("the tiny Q4_K_M case with an importance matrix");
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q.gguf");
    // The imatrix path is recorded in the file as given: run from the repository's root.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let o = Command::new(env!("CARGO_BIN_EXE_synapse"))
        .current_dir(&root)
        .args(["quantize", "--imatrix", case["imatrix"].as_str().unwrap()])
        .arg(root.join(case["input"].as_str().unwrap()))
        .arg(&out)
        .args(["q4_k_m", "-t", "5", "-v"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{stderr}");
    assert!(
        stderr.contains("blk.1.ffn_down.weight") && stderr.contains("Q4_K_M"),
        "{stderr}"
    );
    let bytes = std::fs::read(&out).unwrap();
    let hash: String = sha256_hex(&bytes);
    assert_eq!(hash, case["file"].as_str().unwrap());

    let tiny = engine.join("forward/tiny-F16.gguf");
    let q4k = engine.join("forward/tiny-qwen3-Q4_K.gguf");
    let bad: [(&[&std::ffi::OsStr], &str); 4] = [
        (
            &[tiny.as_os_str(), out.as_os_str(), "Q4_K_X".as_ref()],
            "not a llama-quantize type",
        ),
        (
            &[tiny.as_os_str(), out.as_os_str(), "IQ2_XXS".as_ref()],
            "not one synapse writes",
        ),
        (
            &[q4k.as_os_str(), out.as_os_str(), "Q8_0".as_ref()],
            "--allow-requantize",
        ),
        (
            &[
                tiny.as_os_str(),
                out.as_os_str(),
                "Q4_0".as_ref(),
                "--output-tensor-type".as_ref(),
                "q9".as_ref(),
            ],
            "not a ggml type",
        ),
    ];
    for (args, want) in bad {
        std::fs::remove_file(&out).ok();
        let mut all: Vec<&std::ffi::OsStr> = vec!["quantize".as_ref()];
        all.extend_from_slice(args);
        let o = synapse(&all);
        let stderr = String::from_utf8_lossy(&o.stderr);
        assert!(
            !o.status.success() && stderr.contains(want),
            "{args:?}: {stderr}"
        );
        assert!(!out.exists(), "{args:?} left an output");
    }
}

fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// `synapse imatrix` then `synapse quantize --imatrix` with its file, as a user chains them;
/// a text shorter than two chunks is a named error and writes nothing.
#[test]
fn imatrix_feeds_quantize() {
    let engine = Path::new(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/data/forward");
    let dir = tempfile::tempdir().unwrap();
    let im = dir.path().join("tiny.imatrix.gguf");
    let tiny = engine.join("tiny-F16.gguf");
    let text = engine.join("eval.txt");
    let run = |args: &[&std::ffi::OsStr]| {
        let o = synapse(args);
        (
            o.status.success(),
            String::from_utf8_lossy(&o.stderr).into_owned(),
        )
    };
    let (ok, err) = run(&[
        "imatrix".as_ref(),
        "-m".as_ref(),
        tiny.as_os_str(),
        "-f".as_ref(),
        text.as_os_str(),
        "-c".as_ref(),
        "128".as_ref(),
        "-o".as_ref(),
        im.as_os_str(),
    ]);
    assert!(ok && err.contains("16 chunks"), "{err}");
    let out = dir.path().join("q.gguf");
    let (ok, err) = run(&[
        "quantize".as_ref(),
        "--imatrix".as_ref(),
        im.as_os_str(),
        tiny.as_os_str(),
        out.as_os_str(),
        "Q2_K_S".as_ref(),
    ]);
    assert!(ok, "{err}");
    let q = GgufFile::open(&out).unwrap();
    let entries = q.metadata().get("quantize.imatrix.entries_count").unwrap();
    assert_eq!(entries.as_u64(), Some(14));

    let short = dir.path().join("short.imatrix.gguf");
    let (ok, err) = run(&[
        "imatrix".as_ref(),
        "-m".as_ref(),
        tiny.as_os_str(),
        "-f".as_ref(),
        text.as_os_str(),
        "-c".as_ref(),
        "2000".as_ref(),
        "-o".as_ref(),
        short.as_os_str(),
    ]);
    assert!(!ok && err.contains("two chunks of 2000"), "{err}");
    assert!(!short.exists());
}

#[test]
fn the_gpu_device_runs_benches_and_refuses_by_name() {
    // On whatever Vulkan adapter the loader finds: lavapipe where there is no GPU
    // (scripts/test-deps.sh installs it).
    let smollm2 = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../models/SmolLM2-135M-Instruct.Q4_1.gguf");
    assert!(
        smollm2.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        smollm2.display()
    );
    let m = smollm2.as_os_str();
    let run = |extra: &[&str]| {
        let mut args: Vec<&std::ffi::OsStr> = vec!["run".as_ref(), "-m".as_ref(), m];
        args.extend(extra.iter().map(|a| std::ffi::OsStr::new(*a)));
        synapse(&args)
    };
    let o = run(&[
        "--device",
        "gpu",
        "-p",
        "The capital of France is",
        "-n",
        "6",
        "--temp",
        "0",
    ]);
    let (out, err) = (
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr),
    );
    assert!(o.status.success(), "{err}");
    assert!(err.contains("synapse: GPU: "), "{err}");
    assert!(!out.trim().is_empty(), "no text: {err}");

    let o = synapse(&[
        "bench".as_ref(),
        "--gpu".as_ref(),
        "-m".as_ref(),
        m,
        "-p".as_ref(),
        "4".as_ref(),
        "-n".as_ref(),
        "2".as_ref(),
        "-t".as_ref(),
        "1".as_ref(),
        "-r".as_ref(),
        "1".as_ref(),
        "-q".as_ref(),
        "-o".as_ref(),
        "csv".as_ref(),
    ]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(
        out.lines().filter(|l| l.contains("\"wgsl\"")).count(),
        2,
        "{out}"
    );

    let o = run(&[
        "--gpu-adapter",
        "no such adapter",
        "--device",
        "gpu",
        "-p",
        "Hi",
        "-n",
        "1",
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success() && err.contains("no GPU adapter named like"),
        "{err}"
    );

    let moe = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../engine/tests/data/forward/tiny-qwen3moe-Q4_K.gguf");
    let o = synapse(&[
        "run".as_ref(),
        "--device".as_ref(),
        "gpu".as_ref(),
        "-m".as_ref(),
        moe.as_os_str(),
        "-p".as_ref(),
        "Hi".as_ref(),
        "-n".as_ref(),
        "1".as_ref(),
    ]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("`qwen3moe`"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
