//! The binary against a hostile but fair user: closed pipes, special files as inputs and
//! outputs, outputs that must survive a refused command, out-of-range arguments, escape
//! sequences in a file's strings, bad chat input, and thread counts far above this machine's
//! cores. Each test here failed (a panic, a destroyed file, garbage) before its fix.

use std::io::{Read, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};

mod common;
use common::*;

/// Files in `dir` other than `keep`: a refused or failed command leaves no temporary file.
fn strays(dir: &Path, keep: &[&str]) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| !keep.contains(&n.as_str()))
        .collect()
}

fn mkfifo(path: &Path) {
    let st = Command::new("mkfifo").arg(path).status().expect("mkfifo");
    assert!(st.success());
}

fn is_fifo(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::symlink_metadata(path)
        .unwrap()
        .file_type()
        .is_fifo()
}

/// A command whose reader closes the pipe after a few bytes ends quietly (as `cat` does): no
/// panic, no error message, and the exit of a process a closed pipe ended (or success).
#[test]
fn closed_pipes_end_commands_quietly() {
    let m = s(smollm2());
    let long = "hello ".repeat(4000);
    let ids = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(ids.path(), "1 2 3 4 5 6 7 8").unwrap();
    let ids = ids.path().to_str().unwrap().to_string();
    let cases: Vec<Vec<&str>> = vec![
        vec!["tokenize", "-m", &m, "-p", &long],
        vec!["info", &m],
        vec!["info", "--json", "--json-array", &m],
        vec!["eval", "-m", &m, "--ids", &ids, "--logits", "-"],
        vec!["run", "-m", &m, "-p", "Once upon a time", "-n", "64"],
    ];
    for args in cases {
        let mut child = Command::new(env!("CARGO_BIN_EXE_synapse"))
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut first = [0u8; 1];
        child
            .stdout
            .as_mut()
            .unwrap()
            .read_exact(&mut first)
            .unwrap();
        drop(child.stdout.take());
        let out = child.wait_with_output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !err.contains("panicked") && !err.contains("error"),
            "{args:?}: {err}"
        );
        use std::os::unix::process::ExitStatusExt;
        assert!(
            out.status.success() || out.status.signal() == Some(SIGPIPE),
            "{args:?}: {:?} {err}",
            out.status
        );
    }
}

/// The signal a write to a closed pipe raises (13 on Linux and the BSDs).
const SIGPIPE: i32 = 13;

/// A directory, a character device or a FIFO as the model says what it is, with the path,
/// and does not wait on the FIFO for a writer.
#[test]
fn a_model_path_that_is_not_a_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("model.fifo");
    mkfifo(&fifo);
    let d = dir.path().to_str().unwrap();
    let f = fifo.to_str().unwrap();
    for (path, says) in [
        (d, "a directory, not a regular file"),
        ("/dev/null", "a character device, not a regular file"),
        (f, "a FIFO, not a regular file"),
    ] {
        for args in [
            vec!["info", path],
            vec!["run", "-m", path, "-p", "hi"],
            vec!["dequantize", path, "/dev/null"],
        ] {
            let err = error(&synapse(&args));
            assert!(err.contains(says) && err.contains(path), "{args:?}: {err}");
        }
    }
}

/// An output that is a FIFO (or a device) is written in place, never replaced by a regular
/// file, and gets the same bytes a regular file gets.
#[test]
fn special_outputs_are_written_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let input = root().join("crates/quant/tests/data/fmt_Q4_K.gguf");
    let input = input.to_str().unwrap();
    let regular = dir.path().join("out.gguf");
    ok(&synapse(&["dequantize", input, regular.to_str().unwrap()]));
    let want = std::fs::read(&regular).unwrap();

    let fifo = dir.path().join("out.fifo");
    mkfifo(&fifo);
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read(fifo).unwrap())
    };
    ok(&synapse(&["dequantize", input, fifo.to_str().unwrap()]));
    assert_eq!(reader.join().unwrap(), want, "bytes through the FIFO");
    assert!(is_fifo(&fifo), "the FIFO was replaced");
    assert_eq!(
        strays(dir.path(), &["out.gguf", "out.fifo"]),
        Vec::<String>::new()
    );

    // A device that fails every write is an error, with its reason; it stays a device.
    let err = error(&synapse(&["dequantize", input, "/dev/full"]));
    assert!(
        err.contains("/dev/full") && err.contains("No space left"),
        "{err}"
    );
    use std::os::unix::fs::FileTypeExt;
    assert!(std::fs::metadata("/dev/full")
        .unwrap()
        .file_type()
        .is_char_device());
    // An output in a directory that does not exist names it.
    let err = error(&synapse(&["dequantize", input, "/nonexistent/dir/x.gguf"]));
    assert!(
        err.contains("/nonexistent/dir is not a directory that exists") && !err.contains(".part"),
        "{err}"
    );
    // A directory as the output is refused by name.
    let err = error(&synapse(&[
        "dequantize",
        input,
        dir.path().to_str().unwrap(),
    ]));
    assert!(err.contains("is a directory"), "{err}");
}

/// `eval --logits OUT` leaves an existing OUT untouched when it refuses its inputs (a prompt
/// longer than the context, a token id out of range), and leaves no temporary file.
#[test]
fn a_refused_eval_keeps_the_existing_output() {
    let m = s(smollm2());
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("logits.f32");
    std::fs::write(&out, b"precious").unwrap();
    let ids = dir.path().join("ids.txt");
    std::fs::write(&ids, "1 2 999999").unwrap();
    let o = out.to_str().unwrap();
    let long = "word ".repeat(50);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["eval", "-m", &m, "-c", "16", "-p", &long, "--logits", o],
            "the prompt is 51 tokens, more than the context of 16",
        ),
        (
            vec![
                "eval",
                "-m",
                &m,
                "--ids",
                ids.to_str().unwrap(),
                "--logits",
                o,
            ],
            "token id 999999 is out of range (vocabulary of 49152)",
        ),
    ];
    for (args, says) in cases {
        let err = error(&synapse(&args));
        assert!(err.contains(says), "{err}");
        assert_eq!(std::fs::read(&out).unwrap(), b"precious");
        assert_eq!(
            strays(dir.path(), &["logits.f32", "ids.txt"]),
            Vec::<String>::new()
        );
    }
    // And a successful one replaces it whole, keeping its permissions' usual form.
    ok(&synapse(&["eval", "-m", &m, "-p", "Hello", "--logits", o]));
    assert_eq!(std::fs::metadata(&out).unwrap().len(), 4 * 49152);
}

/// Numbers llama.cpp users type (`-n -1`, `--seed -1`, `--repeat-last-n -1`) are taken; a NaN,
/// a negative count or an absurd size is refused by name before any work, or bounded.
#[test]
fn arguments_are_checked_in_one_place() {
    let m = s(smollm2());
    let base = ["run", "-m", m.as_str(), "-p", "The capital of France is"];
    let with = |extra: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend_from_slice(extra);
        synapse(&a)
    };
    // -n -1: until the end of the text or a full context (here, 24 tokens).
    let out = with(&["-n", "-1", "-c", "24", "--temp", "0"]);
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("stop: context full") || err.contains("stop: end of generation"),
        "{err}"
    );
    ok(&with(&[
        "-n",
        "2",
        "--seed",
        "-1",
        "--top-k",
        "-1",
        "--repeat-last-n",
        "-1",
    ]));
    // Far beyond the context: bounded by it, not allocated.
    ok(&with(&[
        "-n",
        "2",
        "--repeat-last-n",
        "1000000000000",
        "--repeat-penalty",
        "1.1",
    ]));
    for (extra, says) in [
        (vec!["--repeat-penalty", "nan"], "--repeat-penalty NaN"),
        (vec!["--repeat-penalty", "0"], "--repeat-penalty 0"),
        (vec!["--temp", "inf"], "--temp inf"),
        (vec!["--top-p", "nan"], "--top-p NaN"),
        (vec!["-n", "-5"], "-n -5"),
        (vec!["--repeat-last-n", "-3"], "--repeat-last-n -3"),
        (vec!["--seed", "-2"], "--seed -2"),
        (vec!["-c", "100000000000"], "-c 100000000000"),
    ] {
        let err = error(&with(&extra));
        assert!(err.contains(says), "{extra:?}: {err}");
    }
    // A prompt file that never ends is refused at a bound, not read until memory runs out.
    let err = error(&synapse(&["tokenize", "-m", &m, "-f", "/dev/zero"]));
    assert!(err.contains("/dev/zero: longer than 256 MiB"), "{err}");
    // A batch far above the prompt reserves scratch for the prompt only (this reserved
    // 12.9 GB for two tokens).
    ok(&synapse(&[
        "eval",
        "-m",
        &m,
        "-p",
        "Hi",
        "-b",
        "65536",
        "--logits",
        "/dev/null",
    ]));
}

/// A file's strings reach the terminal with their control characters escaped.
#[test]
fn info_escapes_control_characters() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("esc.gguf");
    let mut w = synapse_gguf::GgufWriter::new();
    let evil = "\x1b]0;owned\x07\x1b[2J";
    w.set(
        "general.architecture",
        synapse_gguf::Value::String(evil.into()),
    );
    w.set("general.name", synapse_gguf::Value::String(evil.into()));
    w.set(format!("key{evil}"), synapse_gguf::Value::U32(1));
    w.add_tensor(
        format!("t{evil}"),
        synapse_gguf::GgmlType::F32,
        &[1],
        vec![0; 4],
    )
    .unwrap();
    w.write_file(&p).unwrap();
    let text = ok(&synapse(&["info", p.to_str().unwrap()]));
    assert!(!text.contains('\x1b') && !text.contains('\x07'), "{text:?}");
    assert!(text.contains("\\u{1b}]0;owned"), "{text}");
    // Errors that quote the file's strings too.
    let err = error(&synapse(&["run", "-m", p.to_str().unwrap(), "-p", "hi"]));
    assert!(!err.contains('\x1b') && err.contains("\\u{1b}"), "{err:?}");
}

fn chat(args: &[&str], input: &[u8]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_synapse"))
        .arg("chat")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(input).unwrap();
    child.wait_with_output().unwrap()
}

/// A line that is not UTF-8 is skipped with a word, and the session goes on; a context that
/// fills cuts the reply with a notice, and the next turns drop the oldest ones to fit.
#[test]
fn chat_survives_bad_lines_and_a_full_context() {
    let m = s(smollm2());
    let out = chat(
        &["-m", &m, "--temp", "0", "-n", "4"],
        b"\xff\xfe bad\nWhat is the capital of France?\n",
    );
    let text = ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not UTF-8"), "{err}");
    // Two prompts (the skipped line's and the question's), a reply, the closing prompt.
    assert_eq!(text.matches("> ").count(), 3, "{text}");
    assert!(text.trim_end().len() > "> > ".len() + 2, "{text}");

    let turns = "Tell me a long story about a dragon.\n".repeat(4);
    let out = chat(
        &["-m", &m, "--temp", "0", "-n", "-1", "-c", "96"],
        turns.as_bytes(),
    );
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("is full"), "{err}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).matches("> ").count(),
        5
    );

    // A message that alone does not fit is refused, and the next one is answered.
    let long = format!("{}\nHi\n", "word ".repeat(200));
    let out = chat(
        &["-m", &m, "--temp", "0", "-n", "2", "-c", "64"],
        long.as_bytes(),
    );
    ok(&out);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("the context holds 64") && err.contains("not sent"),
        "{err}"
    );
}

/// D1 through the binary: every architecture's logits are the same bits at thread counts far
/// above this machine's cores and the model's heads, and at the default count.
#[test]
fn eval_gives_the_same_bits_at_any_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let ids = dir.path().join("ids.txt");
    // Ids below the random-weight files' 257-token vocabulary.
    std::fs::write(&ids, "1 40 200 31 7 90 12 5 77 255 46 15 16 17").unwrap();
    let ids = ids.to_str().unwrap();
    for model in [
        s(smollm2()),
        s(forward_data("tiny-Q4_K.gguf")),
        s(forward_data("tiny-qwen2-Q8_0.gguf")),
        s(forward_data("tiny-qwen3-Q4_K.gguf")),
        s(forward_data("tiny-qwen35-Q4_K.gguf")),
        root()
            .join("models/gemma-3-270m-q4_k_m.gguf")
            .to_str()
            .unwrap()
            .to_string(),
    ] {
        let logits = |threads: Option<&str>| {
            let out = dir.path().join("l.f32");
            let mut args = vec!["eval", "-m", &model, "--ids", ids, "-b", "5"];
            args.extend(["--logits", out.to_str().unwrap()]);
            if let Some(t) = threads {
                args.extend(["-t", t]);
            }
            ok(&synapse(&args));
            std::fs::read(out).unwrap()
        };
        let one = logits(Some("1"));
        assert!(!one.is_empty());
        assert!(logits(None) == one, "{model}: default threads");
        for t in ["3", "10", "13", "64"] {
            assert!(logits(Some(t)) == one, "{model}: {t} threads");
        }
    }
}
