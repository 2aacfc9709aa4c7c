//! A `synapse serve` for a test, and the Python clients that talk to it (the `openai`
//! package, selenium) from the virtual environment `scripts/test-deps.sh` makes.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::root;

/// A running server on a free port of the loopback, killed when dropped.
pub struct Server {
    child: Child,
    pub base: String,
}

impl Server {
    /// `synapse serve --port 0 ARGS`, once its `/health` says the model is loaded.
    pub fn start(args: &[&str]) -> Server {
        let mut child = Command::new(env!("CARGO_BIN_EXE_synapse"))
            .arg("serve")
            .args(["--host", "127.0.0.1", "--port", "0"])
            .args(args)
            .current_dir(root())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start synapse serve");
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        let base = loop {
            let line = lines
                .next()
                .expect("synapse serve ended before listening")
                .unwrap();
            if let Some(url) = line.strip_prefix("synapse serve: listening on ") {
                break url.to_string();
            }
        };
        // Keep reading its log, so that it never blocks on a full pipe.
        std::thread::spawn(move || {
            lines.for_each(|l| eprintln!("[serve] {}", l.unwrap_or_default()))
        });
        let server = Server { child, base };
        server.wait_ready(Duration::from_secs(120));
        server
    }

    fn wait_ready(&self, limit: Duration) {
        let t0 = Instant::now();
        loop {
            let out = Command::new(python())
                .args(["-c", &format!(
                    "import urllib.request,sys\ntry:\n  urllib.request.urlopen('{}/health', timeout=5)\nexcept Exception as e:\n  sys.exit(1)",
                    self.base
                )])
                .output()
                .expect("run python");
            if out.status.success() {
                return;
            }
            assert!(
                t0.elapsed() < limit,
                "{}: not ready in {limit:?}",
                self.base
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The process id (for its memory).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Send SIGINT (Ctrl-C) and wait for the process to end, at most `limit`: its status, or
    /// `None` if it was still running.
    pub fn interrupt(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        // SAFETY: a signal to our own child, whose pid is live until it is waited for.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGINT) };
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if let Some(status) = self.child.try_wait().expect("wait for synapse serve") {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The virtual environment's Python: a missing one fails the test with the command to run.
pub fn python() -> std::path::PathBuf {
    let p = root().join(".venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run scripts/test-deps.sh (the openai client, selenium, Chromium)",
        p.display()
    );
    p
}

/// Run `tests/server/SCRIPT ARGS` with the virtual environment's Python; its output is the
/// test's, and its failure fails the test.
pub fn run_python(script: &str, args: &[&str]) {
    let path = root().join("tests/server").join(script);
    let out = Command::new(python())
        .arg(&path)
        .args(args)
        .current_dir(root())
        .output()
        .expect("run python");
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{script} failed ({})", out.status);
}
