//! The commands of the two binaries: `synapse` (run, inspect, convert and serve models) and
//! `synapse-dev` (the developers' tools: `synth`, `bench-kernels`), and the start-up and exit
//! both share. Only these binaries read flags and environment variables; the libraries take
//! what they say as values.

pub mod cmd;

/// What a binary does before parsing its arguments: a closed pipe ends it quietly.
pub fn start() {
    quiet_on_closed_pipe();
}

/// What a binary does once its arguments are parsed, before anything is loaded: the
/// environment's settings go to the libraries. `gpu`: the command runs its model on the GPU,
/// where the engine's model is read only for its description, so its weights are left
/// unpacked (a packed copy, made only to be dropped, would double the memory a load takes).
pub fn configure(gpu: bool) {
    configure_from_env(gpu);
}

/// The process's exit status for a command's result, its error printed (a closed pipe is the
/// reader saying it has enough: success).
pub fn exit_code(r: anyhow::Result<()>) -> std::process::ExitCode {
    match r {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) if is_broken_pipe(&e) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Errors quote the file's strings (keys, names): no terminal escapes from them.
            eprintln!("error: {}", cmd::common::printable(&format!("{e:#}")));
            std::process::ExitCode::FAILURE
        }
    }
}

/// The environment variables synapse reads (README, "Environment"), handed to the libraries
/// as values before anything is loaded: the kernel tier cap and the kernels' forms
/// (`SYNAPSE_ISA`, `SYNAPSE_PACK`, `SYNAPSE_PAIRED`, `SYNAPSE_PREFETCH`), how the bandwidth
/// probe reads (`SYNAPSE_MEMBW_STREAMS`, `SYNAPSE_MEMBW_NO_HUGEPAGES`), and where models dump
/// their intermediates (`SYNAPSE_DUMP_DIR`). None changes a bit of any output.
fn configure_from_env(gpu: bool) {
    let var = |k: &str| std::env::var(k).ok();
    let (mut kernels, notes) = synapse_quant::KernelConfig::from_vars(var);
    kernels.no_pack |= gpu;
    for n in notes {
        eprintln!("synapse: {n}");
    }
    // Nothing has chosen a kernel yet: this cannot be refused.
    let _ = synapse_quant::configure(kernels);
    let one_stream = match var("SYNAPSE_MEMBW_STREAMS") {
        None => false,
        Some(v) if v.trim() == "1" => true,
        Some(v) if v.trim() == "4" => false,
        Some(v) => {
            eprintln!("synapse: SYNAPSE_MEMBW_STREAMS={v:?} is not 1 or 4; four streams");
            false
        }
    };
    let probe = synapse_engine::membw::ProbeOptions {
        one_stream,
        huge_pages: var("SYNAPSE_MEMBW_NO_HUGEPAGES").is_none(),
    };
    let _ = synapse_engine::membw::configure(probe);
    if let Some(dir) = std::env::var_os("SYNAPSE_DUMP_DIR") {
        synapse_engine::set_dump_dir(dir.into());
    }
}

/// A write to a pipe whose reader has gone (`synapse tokenize ... | head`) ends the process
/// quietly, as it ends `cat`: Rust ignores SIGPIPE, so every `print!` would panic instead, and
/// every other write would have to recognise the error. Outputs are renamed into place only
/// once complete, so dying here loses nothing.
fn quiet_on_closed_pipe() {
    #[cfg(unix)]
    // SAFETY: restoring a signal's default disposition at start-up, before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

fn is_broken_pipe(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}
