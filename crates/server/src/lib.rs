//! `synapse serve`: an OpenAI-compatible HTTP server whose answers do not depend on who else
//! is asking.
//!
//! The HTTP side (axum on tokio) parses and checks requests, renders chat templates and
//! tokenizes; the engine side is one thread ([`scheduler`]) that owns the model's sequence
//! states and runs continuous batching over them. Channels join the two: a queue of jobs of
//! bounded depth in, a stream of events per sequence out.

use std::net::SocketAddr;
use std::sync::{Arc, OnceLock};

use anyhow::Context;
use synapse_engine::chat::ChatTemplate;
use synapse_engine::tokenizer::Tokenizer;
use synapse_engine::Threads;
use synapse_gguf::GgufFile;

pub mod api;
pub mod metrics;
mod routes;
pub mod scheduler;
mod state;

use metrics::Metrics;
use scheduler::{Queue, SchedulerConfig};
pub use state::Config;
use state::{App, Ready};

/// How long the HTTP server may take to close its connections after Ctrl-C.
const GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// Serve until interrupted (Ctrl-C) or the engine fails. `on_listen` is told the address
/// once the socket is bound, before the model is loaded (`/health` says 503 meanwhile).
pub fn run(cfg: Config, on_listen: impl FnOnce(SocketAddr)) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    rt.block_on(async move {
        let addr = format!("{}:{}", cfg.host, cfg.port);
        let listener = tokio::net::TcpListener::bind(&addr)
            .await
            .with_context(|| format!("cannot listen on {addr}"))?;
        on_listen(listener.local_addr()?);
        let app = Arc::new(App {
            cfg: cfg.clone(),
            ready: OnceLock::new(),
            failed: OnceLock::new(),
            metrics: Arc::new(Metrics::new()),
        });
        let (engine_done_tx, engine_done) = tokio::sync::oneshot::channel();
        let engine_app = app.clone();
        std::thread::Builder::new()
            .name("synapse-engine".into())
            .spawn(move || {
                let r = engine(&engine_app);
                if let Err(e) = &r {
                    let _ = engine_app.failed.set(format!("{e:#}"));
                }
                let _ = engine_done_tx.send(r);
            })?;
        let router = routes::router(app.clone());
        // Ctrl-C: stop taking connections and wait for the server to close the ones it has, a
        // few seconds at most (a stream may run for minutes); a second Ctrl-C ends at once.
        let (stop_tx, stop) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            let _ = tokio::signal::ctrl_c().await;
            eprintln!("synapse serve: stopping");
            let _ = stop_tx.send(true);
        });
        let mut draining = stop.clone();
        let server = axum::serve(listener, router).with_graceful_shutdown(async move {
            let _ = draining.wait_for(|&s| s).await;
        });
        let mut deadline = stop;
        tokio::select! {
            r = server => r.context("the HTTP server failed"),
            r = engine_done => match r {
                Ok(Err(e)) => Err(e),
                _ => Err(anyhow::anyhow!("the engine thread ended")),
            },
            _ = async move {
                let _ = deadline.wait_for(|&s| s).await;
                tokio::select! {
                    _ = tokio::time::sleep(GRACE) => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            } => Ok(()),
        }
    })
}

/// The engine thread: load the model, publish what the handlers need, then schedule until
/// the queue closes.
fn engine(app: &App) -> anyhow::Result<()> {
    let cfg = &app.cfg;
    let path = &cfg.model;
    // The file lives as long as the process: the model borrows its weights.
    // (The file's errors name its path.)
    let file: &'static GgufFile = Box::leak(Box::new(GgufFile::open_populated(path)?));
    let model = synapse_engine::load(file).with_context(|| path.display().to_string())?;
    let tok = Arc::new(
        Tokenizer::from_metadata(file.metadata())
            .with_context(|| format!("{}: the tokenizer", path.display()))?,
    );
    // A model without a usable template still serves completions; chat says why not.
    let template = ChatTemplate::for_model(file.metadata(), &tok).map_err(|e| e.to_string());
    let info = model.info();
    let n_ctx = cfg.n_ctx.unwrap_or(info.n_ctx_train.clamp(1, 4096));
    let sched = SchedulerConfig {
        slots: cfg.slots.max(1),
        n_ctx,
        step_tokens: cfg.step_tokens.max(1),
        lookup: cfg.lookup,
    };
    let (queue, jobs, waiting) = Queue::new(cfg.max_queue);
    let threads = Threads::new(cfg.threads);
    let model_id = path
        .file_name()
        .map_or("model".into(), |n| n.to_string_lossy().into_owned());
    let created = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let ready = Ready {
        tok: tok.clone(),
        template,
        queue,
        n_ctx,
        n_vocab: info.n_vocab,
        model_id,
        created,
    };
    if app.ready.set(ready).is_err() {
        anyhow::bail!("the engine started twice");
    }
    eprintln!(
        "synapse serve: {} loaded: {} slots of {n_ctx} tokens, {} threads",
        path.display(),
        sched.slots,
        cfg.threads
    );
    scheduler::run(
        model.as_ref(),
        &tok,
        &sched,
        &threads,
        jobs,
        waiting,
        &app.metrics,
    )
}
