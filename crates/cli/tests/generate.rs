//! `run`, `eval`, `tokenize` and `chat` from the outside, against llama.cpp's golden data, and
//! their errors.

use std::io::Write;
use std::process::{Command, Stdio};

mod common;
use common::*;

#[test]
fn tokenize_prints_llama_cpp_ids() {
    let golden =
        root().join("crates/engine/tests/data/tokenizer/golden/smollm2/english.special.json");
    let g: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(golden).unwrap()).unwrap();
    let text = root()
        .join("crates/engine/tests/data/tokenizer")
        .join(g["text_file"].as_str().unwrap());
    let m = smollm2();
    let out = ok(&synapse(&[
        "tokenize",
        "-m",
        m.to_str().unwrap(),
        "-f",
        text.to_str().unwrap(),
    ]));
    let ids: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(ids, g["ids"]);
}

/// `eval` on a file where synapse reproduces llama.cpp exactly: the logits are llama.cpp's, to
/// the bit, and do not change with the batch size or the thread count.
#[test]
fn eval_writes_llama_cpp_logits_for_any_batch_and_threads() {
    let model = forward_data("tiny-Q4_1.gguf");
    let golden = synapse_gguf::GgufFile::open(forward_data("tiny-Q4_1.logits.gguf")).unwrap();
    let ids: Vec<i32> = golden
        .tensor("ids")
        .unwrap()
        .data
        .chunks(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    let want = golden.tensor("logits").unwrap().data.to_vec();
    let dir = tempfile::tempdir().unwrap();
    let id_file = dir.path().join("ids.txt");
    std::fs::write(
        &id_file,
        ids.iter()
            .map(|i| i.to_string())
            .collect::<Vec<_>>()
            .join(" "),
    )
    .unwrap();
    for (batch, threads) in [("1", "1"), ("7", "2"), ("64", "3"), ("93", "4")] {
        let out_file = dir.path().join(format!("logits-{batch}-{threads}.f32"));
        let stdout = ok(&synapse(&[
            "eval",
            "-m",
            model.to_str().unwrap(),
            "--ids",
            id_file.to_str().unwrap(),
            "-b",
            batch,
            "-t",
            threads,
            "--logits",
            out_file.to_str().unwrap(),
        ]));
        let j: serde_json::Value = serde_json::from_str(stdout.trim()).unwrap();
        assert_eq!(j["n_vocab"], 257);
        assert_eq!(j["tokens"].as_array().unwrap().len(), ids.len());
        let got = std::fs::read(&out_file).unwrap();
        assert!(
            got == want,
            "-b {batch} -t {threads}: logits differ from llama.cpp's"
        );
    }
}

#[test]
fn run_greedy_streams_llama_cpp_continuation() {
    let cases: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(forward_data("smollm2.greedy.json")).unwrap(),
    )
    .unwrap();
    let case = &cases[0];
    let prompt = case["prompt"].as_str().unwrap();
    let want: Vec<u32> = case["greedy"].as_array().unwrap()[..12]
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let m = smollm2();
    let out = synapse(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "-p",
        prompt,
        "-n",
        "12",
        "--temp",
        "0",
        "-t",
        "2",
    ]);
    let text = ok(&out);
    let file = synapse_gguf::GgufFile::open(&m).unwrap();
    let tok = synapse_engine::tokenizer::Tokenizer::from_metadata(file.metadata()).unwrap();
    assert_eq!(text.trim_end_matches('\n'), tok.decode(&want));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("prefill:") && stderr.contains("decode:"),
        "{stderr}"
    );
}

#[test]
fn chat_answers_through_the_template() {
    let m = smollm2();
    let mut child = Command::new(env!("CARGO_BIN_EXE_synapse"))
        .args(["chat", "-m", m.to_str().unwrap(), "--temp", "0", "-n", "16"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"What is the capital of France?\n")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let text = ok(&out);

    // The same conversation done by hand: render the template, tokenize with special tokens,
    // 16 greedy tokens.
    use synapse_engine::chat::{ChatTemplate, Message};
    use synapse_engine::{Logits, Threads};
    let file = synapse_gguf::GgufFile::open(&m).unwrap();
    let tok = synapse_engine::tokenizer::Tokenizer::from_metadata(file.metadata()).unwrap();
    let piece = |id: Option<u32>| {
        id.map(|i| String::from_utf8_lossy(tok.token_to_piece(i)).into_owned())
            .unwrap_or_default()
    };
    let t =
        ChatTemplate::from_metadata(file.metadata(), &piece(tok.bos()), &piece(tok.eos())).unwrap();
    let prompt = t
        .render(
            &[Message::new("user", "What is the capital of France?")],
            true,
        )
        .unwrap();
    assert!(
        prompt.contains("<|im_start|>user\nWhat is the capital of France?<|im_end|>"),
        "{prompt}"
    );
    let ids = tok.encode(&prompt, false, true);
    let model = synapse_engine::load(&file).unwrap();
    let threads_1 = Threads::new(1);
    let mut st = model.new_state(ids.len() + 17, 64).unwrap();
    let mut logits = model
        .prefill(&mut st, &ids, 64, Logits::Last, &threads_1)
        .unwrap();
    let mut reply = Vec::new();
    for _ in 0..16 {
        let next =
            (0..logits.len()).fold(0, |b, i| if logits[i] > logits[b] { i } else { b }) as u32;
        if tok.is_eog(next) {
            break;
        }
        reply.push(next);
        model
            .forward(&mut st, &[next], Logits::Last, &mut logits, &threads_1)
            .unwrap();
    }
    let want = tok.decode(&reply);
    assert!(!want.is_empty());
    assert_eq!(text, format!("> {want}\n> \n"), "chat output");
}

#[test]
fn bad_requests_get_clear_errors() {
    let m = smollm2();
    let m = m.to_str().unwrap();
    let long = "word ".repeat(50);
    let err = error(&synapse(&[
        "run", "-m", m, "-c", "16", "-p", &long, "-n", "4",
    ]));
    // Refused before any work, with both numbers.
    assert!(
        err.contains("the prompt is 51 tokens, more than the context of 16"),
        "{err}"
    );
    let err = error(&synapse(&["run", "-m", m, "-t", "0", "-p", "hi"]));
    assert!(err.contains("thread count"), "{err}");
    let err = error(&synapse(&[
        "run",
        "-m",
        "/nonexistent/model.gguf",
        "-p",
        "hi",
    ]));
    assert!(err.contains("/nonexistent/model.gguf"), "{err}");
    let err = error(&synapse(&["run", "-m", m]));
    assert!(err.contains("no prompt"), "{err}");
    // A file that is a GGUF but of an architecture synapse does not run.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("x.gguf");
    let mut w = synapse_gguf::GgufWriter::new();
    w.set(
        "general.architecture",
        synapse_gguf::Value::String("rwkv9".into()),
    );
    w.write_file(&p).unwrap();
    let err = error(&synapse(&["run", "-m", p.to_str().unwrap(), "-p", "hi"]));
    assert!(err.contains("rwkv9") && err.contains("llama"), "{err}");
}

/// `run --lookup` and `run --draft` print plain decoding's text, greedy and seeded, with what
/// speculation did on stderr; bad combinations are refused with the flag named.
#[test]
fn run_speculates_without_changing_the_text() {
    let m = smollm2();
    let m = m.to_str().unwrap();
    let prompt =
        std::fs::read_to_string(root().join("bench/speculate/smollm2-code-edit.txt")).unwrap();
    let gemma = root().join("models/gemma-3-270m-q4_k_m.gguf");
    let gemma = gemma.to_str().unwrap();
    for sampling in [&["--temp", "0"][..], &["--temp", "0.7", "-s", "9"]] {
        let run = |extra: &[&str]| {
            let mut args = vec!["run", "-m", m, "-p", &prompt, "-n", "48", "-t", "2"];
            args.extend_from_slice(sampling);
            args.extend_from_slice(extra);
            let out = synapse(&args);
            (ok(&out), String::from_utf8_lossy(&out.stderr).into_owned())
        };
        let (plain, err) = run(&[]);
        assert!(!err.contains("speculation"), "{err}");
        for extra in [&["--lookup", "5"][..], &["--draft", m, "--draft-max", "3"]] {
            let (text, err) = run(extra);
            assert_eq!(text, plain, "{extra:?} {sampling:?}");
            assert!(
                err.contains("speculation:") && err.contains("accepted"),
                "{err}"
            );
        }
    }
    let err = error(&synapse(&[
        "run", "-m", m, "-p", "hi", "--lookup", "2", "--draft", m,
    ]));
    assert!(err.contains("--lookup and --draft"), "{err}");
    let err = error(&synapse(&["run", "-m", m, "-p", "hi", "--lookup", "1000"]));
    assert!(err.contains("--lookup 1000"), "{err}");
    let err = error(&synapse(&["run", "-m", m, "-p", "hi", "--draft", gemma]));
    assert!(
        err.contains("--draft") && err.contains("vocabulary is not the target's"),
        "{err}"
    );
}
