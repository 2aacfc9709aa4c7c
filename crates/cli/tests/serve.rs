//! `synapse serve` against real clients over the loopback: the `openai` package (every
//! endpoint, streamed and not, errors), the determinism suite on servers of different slots,
//! threads and step sizes, whose results must be the same bits (tests/server/*.py), and a
//! bounded load test (bench/serve_load.py).

mod common;
use common::server::{run_python, Server};
use common::*;

#[test]
fn the_openai_client_gets_every_endpoint_and_error_right() {
    let s = Server::start(&[
        "-np",
        "4",
        "-c",
        "512",
        "--api-key",
        "sekrit",
        "--max-body",
        "65536",
    ]);
    run_python(
        "test_openai.py",
        &["--base-url", &s.base, "--api-key", "sekrit"],
    );
}

#[test]
fn a_full_queue_is_a_503_with_retry_after() {
    let s = Server::start(&["-np", "1", "--max-queue", "1", "-c", "256"]);
    run_python("test_openai.py", &["--base-url", &s.base, "--queue-full"]);
}

#[test]
fn a_served_greedy_completion_is_the_text_of_synapse_run() {
    let prompt = "Write a list of five fruits, one per line:\n";
    let model = smollm2();
    let out = ok(&synapse(&[
        "run",
        "-m",
        model.to_str().unwrap(),
        "-p",
        prompt,
        "-n",
        "24",
        "--temp",
        "0",
    ]));
    // `run` ends its output with a newline of its own.
    let text = out.strip_suffix('\n').unwrap();
    let dir = tempfile::tempdir().unwrap();
    let want = dir.path().join("want.json");
    let json = serde_json::json!({"prompt": prompt, "max_tokens": 24, "text": text});
    std::fs::write(&want, json.to_string()).unwrap();
    let s = Server::start(&["-np", "2"]);
    run_python(
        "test_openai.py",
        &[
            "--base-url",
            &s.base,
            "--greedy-equals",
            want.to_str().unwrap(),
        ],
    );
}

/// The suite on each server configuration, then every configuration's results compared: one
/// slot on one thread, eight slots on two guessing up to 4 tokens a pass by prompt lookup,
/// two slots on five threads with steps of 7 tokens (prompts read over many steps beside the
/// decoding sequences, guesses squeezed into what the step leaves).
#[test]
fn results_do_not_depend_on_load_cache_slots_threads_step_size_or_lookup() {
    let dir = tempfile::tempdir().unwrap();
    let configs: [&[&str]; 3] = [
        &["-np", "1", "-t", "1"],
        &["-np", "8", "-t", "2", "--lookup", "4"],
        &["-np", "2", "-t", "5", "-b", "7", "--lookup", "8"],
    ];
    let mut all = Vec::new();
    for (i, args) in configs.iter().enumerate() {
        let out = dir.path().join(format!("{i}.json"));
        let s = Server::start(args);
        let mut py = vec!["--base-url", &s.base, "--out", out.to_str().unwrap()];
        if args.contains(&"--lookup") {
            py.push("--expect-guesses");
        }
        run_python("test_determinism.py", &py);
        let v: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
        all.push((args.join(" "), v));
    }
    for (args, v) in &all[1..] {
        for (key, want) in all[0].1.as_object().unwrap() {
            assert!(
                &v[key] == want,
                "{key}: `serve {args}` differs from `serve {}`",
                all[0].0
            );
        }
    }
}

/// Gemma 3 (sliding-window layers, its own joint pass): the same suite (its
/// file has no chat template: completions only), with fewer requests at once, guessing by
/// prompt lookup (its speculative passes run one sequence after another).
#[test]
fn gemma3_served_results_do_not_depend_on_load_or_cache() {
    let model = root().join("models/gemma-3-270m-q4_k_m.gguf");
    assert!(
        model.exists(),
        "{} is missing: run scripts/fetch-models.sh",
        model.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("gemma.json");
    let s = Server::start(&[
        "-m",
        model.to_str().unwrap(),
        "-np",
        "4",
        "-c",
        "1024",
        "--lookup",
        "3",
    ]);
    run_python(
        "test_determinism.py",
        &[
            "--base-url",
            &s.base,
            "--out",
            out.to_str().unwrap(),
            "--no-chat",
            "--crowd",
            "4",
            "--expect-guesses",
        ],
    );
}

/// The bounded load test (bench/serve_load.py): 64 streaming clients for 40 s on 8 slots, every
/// answer equal to its prompt's answer alone, no error, and the server's memory flat after
/// warm-up (within 16 MiB).
#[test]
fn sixty_four_streaming_clients_get_their_own_answers_in_flat_memory() {
    let s = Server::start(&["-np", "8"]);
    let pid = s.pid().to_string();
    let script = root().join("bench/serve_load.py");
    let out = std::process::Command::new(common::server::python())
        .arg(&script)
        .args(["--base-url", &s.base, "--clients", "64", "--seconds", "40"])
        .args([
            "--max-tokens",
            "48",
            "--pid",
            &pid,
            "--max-rss-growth-mib",
            "16",
        ])
        .output()
        .expect("run serve_load.py");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "serve_load.py failed");
}

/// Ctrl-C ends the server, with success, within seconds even with a stream running (before,
/// the signal was taken and the process went on).
#[test]
fn ctrl_c_stops_the_server_even_with_a_stream_under_way() {
    let mut s = Server::start(&["-np", "1"]);
    let base = s.base.clone();
    // A long streamed answer, read in the background.
    let reader = std::thread::spawn(move || {
        let code = format!(
            "import httpx\ntry:\n  with httpx.stream('POST', '{base}/v1/completions', json={{'prompt': 'Once', \
             'max_tokens': 3000, 'stream': True}}, timeout=30) as r:\n    [l for l in r.iter_lines()]\nexcept Exception:\n  pass"
        );
        std::process::Command::new(common::server::python())
            .args(["-c", &code])
            .status()
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let status = s.interrupt(std::time::Duration::from_secs(15));
    assert!(status.is_some_and(|st| st.success()), "{status:?}");
    reader.join().unwrap().unwrap();
}

/// A model that cannot be loaded ends the server with the file's error (not a server that
/// answers 500 forever).
#[test]
fn a_model_that_cannot_be_loaded_ends_serve_with_its_error() {
    let readme = root().join("README.md");
    let err = error(&synapse(&[
        "serve",
        "--port",
        "0",
        "-m",
        readme.to_str().unwrap(),
    ]));
    assert!(err.contains("not a GGUF file"), "{err}");
}

/// Qwen 3.5's recurrent state cannot rewind: a rejected guess sends it back to its checkpoint
/// before the pass, and the kept tokens are taken again. The suite on the random-weight file,
/// with and without prompt lookup: the same bits (guesses held and failed, on the suite's
/// target biased towards its prompt's tokens).
#[test]
fn qwen35_served_with_lookup_gives_the_plain_results() {
    let model = forward_data("tiny-qwen35-Q4_K.gguf");
    let dir = tempfile::tempdir().unwrap();
    let mut all = Vec::new();
    for lookup in ["0", "4"] {
        let out = dir.path().join(format!("{lookup}.json"));
        let s = Server::start(&[
            "-m",
            model.to_str().unwrap(),
            "-np",
            "2",
            "-c",
            "512",
            "--lookup",
            lookup,
        ]);
        let mut py = vec!["--base-url", &s.base, "--out", out.to_str().unwrap()];
        py.extend(["--no-chat", "--crowd", "2"]);
        if lookup != "0" {
            py.push("--expect-guesses");
        }
        run_python("test_determinism.py", &py);
        all.push(std::fs::read_to_string(&out).unwrap());
    }
    assert!(all[0] == all[1], "--lookup 4 changed the served results");
}
