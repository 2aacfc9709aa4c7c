//! `synapse-dev synth` and `synapse bench` from the outside: synthesized files load and run, bench
//! prints llama-bench's fields, bad requests get clear errors.

use std::ffi::OsStr;
use std::path::Path;
use std::process::{Command, Output};

use synapse_engine::{Logits, Threads};
use synapse_gguf::{GgmlType, GgufFile};

fn synapse<S: AsRef<OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_synapse"))
        .args(args)
        .output()
        .expect("run synapse")
}

/// `synapse-dev` (synth) with `args`.
fn synapse_dev<S: AsRef<OsStr>>(args: &[S]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_synapse-dev"))
        .args(args)
        .output()
        .expect("run synapse-dev")
}

fn synth(dir: &Path, shape: &str, ty: &str) -> std::path::PathBuf {
    let out = dir.join(format!("{shape}-{ty}.gguf"));
    let r = synapse_dev(&[
        "synth".as_ref(),
        shape.as_ref(),
        "--type".as_ref(),
        ty.as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert!(
        r.status.success(),
        "synth {shape} {ty}: {}",
        String::from_utf8_lossy(&r.stderr)
    );
    out
}

/// Tensor names and shapes (ggml order: columns first) of a file.
fn shape_of(f: &GgufFile, name: &str) -> Vec<u64> {
    f.tensor(name)
        .unwrap_or_else(|_| panic!("{name} missing"))
        .info
        .shape
        .clone()
}

#[test]
fn synthesized_llama_and_gemma3_load_and_run_a_forward_pass() {
    let dir = tempfile::tempdir().unwrap();
    // (shape, type, its matrices' type, KV width: heads x head dim)
    for (shape, ty, gty, kv) in [
        ("tiny-llama", "F32", GgmlType::F32, 128),
        ("tiny-llama", "Q8_0", GgmlType::Q8_0, 128),
        // Quantized by synapse's own quantizer, no llama.cpp needed.
        ("tiny-llama", "Q4_0", GgmlType::Q4_0, 128),
        ("tiny-gemma3", "F16", GgmlType::F16, 64),
    ] {
        let path = synth(dir.path(), shape, ty);
        let f = GgufFile::open(&path).unwrap();
        assert_eq!(
            f.tensor("blk.1.ffn_down.weight").unwrap().info.ggml_type,
            gty
        );
        assert_eq!(shape_of(&f, "blk.0.attn_k.weight"), [256, kv]);
        assert_eq!(shape_of(&f, "blk.1.ffn_down.weight"), [512, 256]);
        assert_eq!(shape_of(&f, "token_embd.weight"), [256, 1024]);
        let model = synapse_engine::load(&f).unwrap();
        assert_eq!(model.info().n_vocab, 1024);
        assert_eq!(model.info().n_layer, 2);
        let mut st = model.new_state(32, 8).unwrap();
        let threads = Threads::new(2);
        let logits = model
            .prefill(&mut st, &[256, 72, 101, 108], 8, Logits::Last, &threads)
            .unwrap();
        assert_eq!(logits.len(), 1024);
        assert!(logits.iter().all(|x| x.is_finite()), "{shape} {ty}");
        // Random weights still give logits that depend on the input.
        let mut st2 = model.new_state(32, 8).unwrap();
        let other = model
            .prefill(&mut st2, &[256, 73, 101, 108], 8, Logits::Last, &threads)
            .unwrap();
        assert_ne!(logits, other, "{shape} {ty}");
        // The generated vocabulary tokenizes text to its bytes.
        let tok = synapse_engine::tokenizer::Tokenizer::from_metadata(f.metadata()).unwrap();
        assert_eq!(tok.encode("Hi", false, true), [b'H' as u32, b'i' as u32]);
    }
}

#[test]
fn synthesized_shapes_are_the_named_models() {
    let dir = tempfile::tempdir().unwrap();
    // Only two layers of the 1B shape, to keep the file small: the matrices are the real ones.
    let out = dir.path().join("l.gguf");
    let r = synapse_dev(&[
        "synth".as_ref(),
        "llama-3.2-1b".as_ref(),
        "--layers".as_ref(),
        "1".as_ref(),
        "--type".as_ref(),
        "Q8_0".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let f = GgufFile::open(&out).unwrap();
    assert_eq!(shape_of(&f, "token_embd.weight"), [2048, 128256]);
    assert_eq!(shape_of(&f, "blk.0.attn_q.weight"), [2048, 2048]);
    assert_eq!(shape_of(&f, "blk.0.attn_k.weight"), [2048, 512]);
    assert_eq!(shape_of(&f, "blk.0.ffn_up.weight"), [2048, 8192]);
    assert_eq!(shape_of(&f, "blk.0.ffn_down.weight"), [8192, 2048]);
    assert_eq!(shape_of(&f, "rope_freqs.weight"), [32]);
    assert!(f.tensor("output.weight").is_err(), "tied embeddings");
    assert_eq!(
        f.metadata().u64("llama.attention.head_count_kv").unwrap(),
        8
    );
    // Qwen-style files carry their architecture's extra tensors.
    let q2 = GgufFile::open(synth(dir.path(), "tiny-qwen2", "F32")).unwrap();
    assert_eq!(q2.metadata().str("general.architecture").unwrap(), "qwen2");
    assert_eq!(shape_of(&q2, "blk.0.attn_k.bias"), [128]);
    let q3 = GgufFile::open(synth(dir.path(), "tiny-qwen3", "F32")).unwrap();
    assert_eq!(shape_of(&q3, "blk.0.attn_q.weight"), [256, 512]);
    assert_eq!(shape_of(&q3, "blk.0.attn_k_norm.weight"), [128]);
    // gpt-oss in its mix (experts MXFP4, the rest Q8_0), quantized by synapse: it loads and runs.
    let path = synth(dir.path(), "tiny-gpt-oss", "MXFP4_MOE");
    let g = GgufFile::open(&path).unwrap();
    let ty = |name: &str| g.tensor(name).unwrap().info.ggml_type;
    assert_eq!(ty("blk.1.ffn_down_exps.weight"), GgmlType::MXFP4);
    assert_eq!(ty("blk.1.attn_q.weight"), GgmlType::Q8_0);
    assert_eq!(shape_of(&g, "blk.0.ffn_up_exps.bias"), [256, 8]);
    assert_eq!(shape_of(&g, "blk.0.attn_sinks.weight"), [8]);
    let model = synapse_engine::load(&g).unwrap();
    let mut st = model.new_state(32, 8).unwrap();
    let logits = model
        .prefill(
            &mut st,
            &[256, 72, 101, 108],
            8,
            Logits::Last,
            &Threads::new(2),
        )
        .unwrap();
    assert!(logits.iter().all(|x| x.is_finite()));
}

#[test]
fn synth_errors_are_clear() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("x.gguf");
    let r = synapse_dev(&[
        "synth".as_ref(),
        "gpt-5".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("unknown shape `gpt-5`"));
    let r = synapse_dev(&[
        "synth".as_ref(),
        "tiny-llama".as_ref(),
        "--type".as_ref(),
        "Q4_K_X".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("not a llama-quantize type"));
    assert!(!out.exists());
}

#[test]
fn bench_prints_llama_bench_fields_as_json_and_csv() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "tiny-llama", "Q8_0");
    let common = [
        "bench",
        "-m",
        model.to_str().unwrap(),
        "-p",
        "8",
        "-n",
        "4",
        "-r",
        "2",
        "--membw-mib",
        "8",
    ];
    let r = synapse(&[&common[..], &["-t", "1,2", "-o", "json"]].concat());
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 4, "pp8 and tg4 at 1 and 2 threads");
    for row in rows {
        for key in [
            "model_filename",
            "model_type",
            "model_size",
            "n_threads",
            "n_prompt",
            "n_gen",
            "n_batch",
            "avg_ns",
            "stddev_ns",
            "avg_ts",
            "stddev_ts",
            "kernel_isa",
            "peak_gbs",
        ] {
            assert!(row.get(key).is_some(), "{key} missing in {row}");
        }
        assert!(row["avg_ts"].as_f64().unwrap() > 0.0);
        assert_eq!(row["samples_ns"].as_array().unwrap().len(), 2);
        let tokens = row["n_prompt"].as_u64().unwrap() + row["n_gen"].as_u64().unwrap();
        // avg_ts is the mean of per-repetition rates, each tokens / time.
        let mean: f64 = row["samples_ns"]
            .as_array()
            .unwrap()
            .iter()
            .map(|ns| tokens as f64 * 1e9 / ns.as_f64().unwrap())
            .sum::<f64>()
            / 2.0;
        assert!((row["avg_ts"].as_f64().unwrap() - mean).abs() < 1e-6 * mean);
        if row["n_gen"].as_u64().unwrap() > 0 {
            assert!(row["weight_gbs"].as_f64().unwrap() > 0.0);
            assert!(row["peak_gbs"].as_f64().unwrap() > 0.0);
        }
    }
    // -t repeats as in llama-bench: `-t 1 -t 2` is `-t 1,2`.
    let r = synapse(&[&common[..], &["-o", "csv", "-t", "1", "-t", "2"]].concat());
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let text = String::from_utf8(r.stdout).unwrap();
    let header = text.lines().next().unwrap();
    assert!(header.contains("model_filename") && header.contains("avg_ts"));
    assert_eq!(text.lines().count(), 5, "{text}");
}

/// `-d` runs each test after an untimed prefill of that many tokens, as llama-bench's -d, and
/// says so in `n_depth` and in the table's test name.
#[test]
fn bench_runs_tests_at_a_depth() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "tiny-llama", "Q8_0");
    let m = model.to_str().unwrap();
    let args = [
        "bench", "-m", m, "-p", "8", "-n", "4", "-d", "0,24", "-r", "1", "-t", "1",
    ];
    let r = synapse(&[&args[..], &["--no-membw", "-o", "json"]].concat());
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let depths: Vec<(u64, u64, u64)> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let n = |k: &str| r[k].as_u64().unwrap();
            (n("n_prompt"), n("n_gen"), n("n_depth"))
        })
        .collect();
    assert_eq!(depths, [(8, 0, 0), (0, 4, 0), (8, 0, 24), (0, 4, 24)]);
    let r = synapse(&[&args[..], &["--no-membw"]].concat());
    let text = String::from_utf8(r.stdout).unwrap();
    assert!(
        text.contains("| pp8 @ d24 |") && text.contains("| tg4 @ d24 |"),
        "{text}"
    );
    let r = synapse(&["bench", "--no-membw", "-m", m, "-d", "1,,2"]);
    assert!(String::from_utf8_lossy(&r.stderr).contains("-d 1,,2: empty item"));
}

#[test]
fn bench_ab_reports_each_variants_median_and_their_ratio() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "tiny-llama", "Q8_0");
    let m = model.to_str().unwrap();
    let r = synapse(&[
        "bench",
        "-m",
        m,
        "-p",
        "8",
        "-n",
        "5",
        "-r",
        "1",
        "-t",
        "1",
        "--no-membw",
        "--ab",
        "0,1",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let text = String::from_utf8(r.stdout).unwrap();
    let rows: Vec<Vec<&str>> = text
        .lines()
        .skip(2)
        .map(|l| l.split('|').map(str::trim).collect())
        .collect();
    assert_eq!(rows.len(), 2, "{text}");
    for (row, test) in rows.iter().zip(["pp8", "tg5"]) {
        assert_eq!(row[2], test, "{text}");
        let ms = |i: usize| row[i].parse::<f64>().unwrap();
        assert!(ms(4) > 0.0 && ms(5) > 0.0, "{text}");
        // The ratio is of the two medians printed, to their rounding (0.0005 ms each, 0.0005
        // the ratio).
        let (a, b, h) = (ms(4), ms(5), 0.0005);
        let (lo, hi) = ((b - h) / (a + h) - h, (b + h) / (a - h).max(1e-9) + h);
        assert!(lo <= ms(6) && ms(6) <= hi, "{text}");
    }
    let r = synapse(&["bench", "--no-membw", "-m", m, "--ab", "1"]);
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(err.contains("is not two variant numbers"), "{err}");
}

#[test]
fn bench_profile_accounts_for_every_product_of_a_token() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "tiny-llama", "Q8_0");
    let m = model.to_str().unwrap();
    let r = synapse(&[
        "bench",
        "-m",
        m,
        "-p",
        "8",
        "-n",
        "3",
        "-r",
        "2",
        "-t",
        "2",
        "--no-membw",
        "--profile",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let text = String::from_utf8(r.stdout).unwrap();
    // One profile a test, after the usual table.
    let profiles: Vec<&str> = text.split("Profile of ").skip(1).collect();
    assert_eq!(profiles.len(), 2, "{text}");
    assert!(profiles[0].contains(" pp8 t=2: ") && profiles[1].contains(" tg3 t=2: "));
    let n_layer = 2.0; // tiny-llama
    for (profile, tokens) in profiles.iter().zip([8.0, 1.0]) {
        let parts: std::collections::HashMap<&str, Vec<&str>> = profile
            .lines()
            .filter(|l| l.starts_with("| ") && !l.starts_with("| part"))
            .map(|l| {
                let cells: Vec<&str> = l.split('|').map(str::trim).collect();
                (cells[1], cells[2..].to_vec())
            })
            .collect();
        let calls = |name: &str| parts[name][0].parse::<f64>().unwrap();
        // Per token of the test: a pass per batch of the prompt, a pass per decoded token.
        let per_pass = |k: f64| k / tokens;
        // A prompt's last layer projects the keys and values of every token but the queries of
        // the last alone: two products there.
        let qkv = if tokens > 1.0 { n_layer + 1.0 } else { n_layer };
        for (name, k) in [
            ("attn_qkv", qkv),
            ("attn_output", n_layer),
            ("ffn_gate_up", n_layer),
            ("ffn_down", n_layer),
            ("output", 1.0),
            ("norm", 2.0 * n_layer + 1.0),
        ] {
            let want = per_pass(k);
            assert!((calls(name) - want).abs() < 0.01, "{name}: {profile}");
        }
        // Products have a weight bandwidth, other parts none; the shares add up to 100%.
        assert!(!parts["ffn_down"][3].is_empty() && parts["norm"][3].is_empty());
        assert!(!parts["ffn_down"][4].is_empty() && parts["norm"][4].is_empty());
        let share: f64 = parts
            .values()
            .map(|c| c[2].trim_end_matches('%').parse::<f64>().unwrap())
            .sum();
        assert!(
            (share - 100.0).abs() < 0.1 * parts.len() as f64,
            "{profile}"
        );
    }
}

#[test]
fn probe_each_token_pairs_decode_with_passes_over_a_buffer_or_the_weights() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "tiny-llama", "Q8_0");
    let m = model.to_str().unwrap();
    for (extra, over) in [
        (None, "the probe's 16 MiB buffer"),
        (Some("--probe-weights"), "the model's weights"),
    ] {
        let mut args = vec![
            "bench",
            "-m",
            m,
            "-p",
            "0",
            "-n",
            "3",
            "-r",
            "2",
            "-t",
            "1,2",
            "--membw-mib",
            "16",
            "--probe-each-token",
        ];
        args.extend(extra);
        let r = synapse(&args);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        let text = String::from_utf8(r.stdout).unwrap();
        let head = text.lines().next().unwrap_or("");
        assert!(
            head.starts_with("Probe passes (") && head.contains(&format!(") over {over}")),
            "{text}"
        );
        let rows: Vec<Vec<&str>> = text
            .lines()
            .filter(|l| l.contains("| tg3 |"))
            .map(|l| l.split('|').map(str::trim).collect())
            .collect();
        assert_eq!(rows.len(), 2, "{text}");
        for (row, t) in rows.iter().zip(["1", "2"]) {
            // Three tokens a repetition, two repetitions; positive rates and fraction.
            assert_eq!((row[3], row[4]), (t, "6"), "{text}");
            for cell in [row[5], row[6], row[7].trim_end_matches('%')] {
                let v: f64 = cell.parse().unwrap();
                assert!(v.is_finite() && v > 0.0, "{text}");
            }
        }
    }
    let r = synapse(&["bench", "-m", m, "--probe-weights"]);
    assert!(!r.status.success());
    assert!(String::from_utf8_lossy(&r.stderr).contains("--probe-each-token"));
}

#[test]
fn membw_probe_prints_one_rate_per_thread_count() {
    let r = synapse(&[
        "bench",
        "--membw",
        "-t",
        "1,2",
        "--membw-mib",
        "16",
        "-o",
        "json",
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let v: serde_json::Value = serde_json::from_slice(&r.stdout).unwrap();
    let rows = v.as_array().unwrap();
    assert_eq!(rows.len(), 2);
    assert!(rows.iter().all(|r| r["gbs"].as_f64().unwrap() > 0.0));
}

/// `SYNAPSE_MEMBW_STREAMS=1` makes the x86-64 probe read one stream a thread, and says so;
/// another value is reported and the probe reads its four.
#[test]
#[cfg(target_arch = "x86_64")]
fn membw_probe_reads_one_stream_when_asked() {
    let probe = |streams: &str, format: &str| {
        Command::new(env!("CARGO_BIN_EXE_synapse"))
            .args([
                "bench",
                "--membw",
                "-t",
                "1",
                "--membw-mib",
                "16",
                "-o",
                format,
            ])
            .env("SYNAPSE_MEMBW_STREAMS", streams)
            .output()
            .expect("run synapse")
    };
    let r = probe("1", "md");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let out = String::from_utf8_lossy(&r.stdout);
    assert!(out.contains(" one-stream, 16 MiB buffer"), "{out}");
    // The loop's name is one CSV field.
    let r = probe("1", "csv");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let out = String::from_utf8_lossy(&r.stdout);
    let rows: Vec<&str> = out.lines().filter(|l| !l.is_empty()).collect();
    assert_eq!(rows.len(), 2, "{out}");
    assert!(rows.iter().all(|l| l.split(',').count() == 3), "{out}");
    assert!(rows[1].ends_with(" one-stream"), "{out}");
    let r = probe("3", "md");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let (out, err) = (
        String::from_utf8_lossy(&r.stdout),
        String::from_utf8_lossy(&r.stderr),
    );
    assert!(
        !out.contains("one-stream") && out.contains("16 MiB buffer"),
        "{out}"
    );
    assert!(
        err.contains("SYNAPSE_MEMBW_STREAMS=\"3\" is not 1 or 4"),
        "{err}"
    );
}

#[test]
fn bench_rejects_bad_requests_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let model = synth(dir.path(), "tiny-llama", "F32");
    let m = model.to_str().unwrap();
    for (args, want) in [
        (vec!["-m", "/no/such/model.gguf"], "no such model file"),
        (
            vec!["-m", m, "-t", "0"],
            "-t 0: thread counts must be between 1 and",
        ),
        (vec!["-m", m, "-t", "100000"], "-t 100000: thread counts"),
        (
            vec!["-m", m, "-p", "0", "-n", "0"],
            "-p 0 -n 0: nothing to measure",
        ),
        (vec!["-m", m, "-t", "1,,2"], "-t 1,,2: empty item"),
        (
            vec!["-m", m, "-t", "two"],
            "`two` is not a non-negative integer",
        ),
        (vec!["-m", m, "-p", "8-4"], "runs backwards"),
        (vec!["-m", m, "-b", "0"], "-b 0: batch sizes"),
        (vec!["-m", m, "-r", "0"], "-r 0: repetitions"),
        (vec![], "no model"),
    ] {
        let mut all = vec!["bench", "--no-membw"];
        all.extend(&args);
        let r = synapse(&all);
        assert!(!r.status.success(), "{args:?} succeeded");
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(err.contains(want), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

/// A GGUF holding only the first `n` tokens of a synthesized file's tokenizer.
fn vocab_file(dir: &Path, src: &Path, n: usize) -> std::path::PathBuf {
    use synapse_gguf::{Array, GgufWriter, Value};
    let f = GgufFile::open(src).unwrap();
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata().iter() {
        if !k.starts_with("tokenizer.") {
            continue;
        }
        let v = match v {
            Value::Array(Array::String(t)) => {
                Value::Array(Array::String(t[..n.min(t.len())].to_vec()))
            }
            Value::Array(Array::I32(t)) => Value::Array(Array::I32(t[..n].to_vec())),
            v => v.clone(),
        };
        w.set(k, v);
    }
    let out = dir.join(format!("vocab-{n}.gguf"));
    w.write_file(&out).unwrap();
    out
}

#[test]
fn a_borrowed_vocabulary_is_padded_to_the_shape_and_still_tokenizes() {
    let dir = tempfile::tempdir().unwrap();
    let src = synth(dir.path(), "tiny-llama", "F32");
    let small = vocab_file(dir.path(), &src, 600);
    let out = dir.path().join("borrowed.gguf");
    let r = synapse_dev(&[
        "synth".as_ref(),
        "tiny-gemma3".as_ref(),
        "--type".as_ref(),
        "F32".as_ref(),
        "--vocab-from".as_ref(),
        small.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let f = GgufFile::open(&out).unwrap();
    let tokens = f.metadata().array("tokenizer.ggml.tokens").unwrap();
    assert_eq!(tokens.len(), 1024);
    assert_eq!(
        tokens.get(600),
        Some(synapse_gguf::Value::String("<synth_pad_600>".into()))
    );
    let tok = synapse_engine::tokenizer::Tokenizer::from_metadata(f.metadata()).unwrap();
    assert_eq!(tok.encode("ok", false, true), [b'o' as u32, b'k' as u32]);
    synapse_engine::load(&f).unwrap();

    // A vocabulary larger than the shape's cannot be borrowed.
    let big = synth(dir.path(), "tiny-llama", "Q8_0");
    let r = synapse_dev(&[
        "synth".as_ref(),
        "tiny-qwen2".as_ref(),
        "--vocab-from".as_ref(),
        vocab_file(dir.path(), &big, 1024).as_os_str(),
        "--layers".as_ref(),
        "1".as_ref(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert!(r.status.success(), "same size is fine");
    let larger = dir.path().join("larger.gguf");
    let r = synapse_dev(&[
        "synth".as_ref(),
        "smollm2-135m".as_ref(),
        "--layers".as_ref(),
        "1".as_ref(),
        "--type".as_ref(),
        "Q8_0".as_ref(),
        "-o".as_ref(),
        larger.as_os_str(),
    ]);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let r = synapse_dev(&[
        "synth".as_ref(),
        "tiny-llama".as_ref(),
        "--vocab-from".as_ref(),
        larger.as_os_str(),
        "-o".as_ref(),
        out.as_os_str(),
    ]);
    assert!(!r.status.success());
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        err.contains("has 49152 tokens, more than the 1024 of this shape"),
        "{err}"
    );
}

/// `synth --inert-from 1` computes what its first layer computes: the one-layer file of the
/// same seed gives its logits bit for bit (the pair made to agree of bench/speculate.sh).
#[test]
fn an_inert_tail_gives_the_logits_of_the_layers_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = |extra: &[&str], name: &str| {
        let out = dir.path().join(name);
        let mut args = vec!["synth", "tiny-llama", "--type", "Q8_0", "-o"];
        args.push(out.to_str().unwrap());
        args.extend_from_slice(extra);
        let r = synapse_dev(&args);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        GgufFile::open(&out).unwrap()
    };
    let logits = |f: &GgufFile| {
        let model = synapse_engine::load(f).unwrap();
        let mut st = model.new_state(32, 8).unwrap();
        let ids = [256, 72, 101, 108, 108, 111];
        model
            .prefill(&mut st, &ids, 8, Logits::All, &Threads::new(2))
            .unwrap()
    };
    let inert = file(&["--inert-from", "1"], "inert.gguf");
    let shallow = file(&["--layers", "1"], "shallow.gguf");
    let whole = file(&[], "whole.gguf");
    assert_eq!(synapse_engine::load(&inert).unwrap().info().n_layer, 2);
    let want = logits(&shallow);
    assert!(logits(&inert) == want, "the inert layer changed the logits");
    assert!(
        logits(&whole) != want,
        "the second layer of the plain file does nothing"
    );
    let r = synapse_dev(&[
        "synth",
        "tiny-llama",
        "--inert-from",
        "2",
        "-o",
        "/dev/null",
    ]);
    let err = String::from_utf8_lossy(&r.stderr);
    assert!(
        !r.status.success() && err.contains("--inert-from 2"),
        "{err}"
    );
}
