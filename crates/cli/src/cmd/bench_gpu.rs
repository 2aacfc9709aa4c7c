//! `synapse-dev bench-gpu`: the GPU's read bandwidth and every format's matrix-vector product
//! with cold weights, as GB/s and as a fraction of that bandwidth (bench/gpu.sh runs it, then
//! `synapse bench --device gpu` on the model files).

use anyhow::Result;
use clap::Args;
use synapse_gpu::{bench, Gpu, GpuOptions};

#[derive(Args, Debug)]
pub struct BenchGpuArgs {
    /// The GPU adapter to open, by a part of its name [default: a discrete GPU, else any].
    #[arg(long, value_name = "NAME")]
    pub gpu_adapter: Option<String>,
    /// MiB read by the bandwidth probe, and of weights each product's copies add up to: far
    /// more than the GPU's last-level cache (an H100's is 50 MB).
    #[arg(long, default_value_t = 1024)]
    pub cold_mib: usize,
    /// The matrix's rows and columns (the default: Llama 3.1 8B's FFN up projection).
    #[arg(long, default_value_t = 14336)]
    pub rows: usize,
    #[arg(long, default_value_t = 4096)]
    pub cols: usize,
    /// Instead: the host's time to record and submit one decode step of this model (the
    /// median of 16 steps), the GPU's time apart.
    #[arg(short = 'm', long = "model")]
    pub model: Option<std::path::PathBuf>,
}

pub fn run(args: &BenchGpuArgs) -> Result<()> {
    let gpu = Gpu::new(&GpuOptions {
        adapter: args.gpu_adapter.clone(),
    })?;
    println!("GPU: {}", gpu.info());
    if let Some(path) = &args.model {
        return encode_time(gpu, path);
    }
    let bytes = (args.cold_mib << 20).min(gpu.info().max_binding_bytes as usize - 16);
    let peak = bench::read_bandwidth(&gpu, bytes, 4)?;
    println!(
        "read bandwidth: {peak:.1} GB/s ({} MiB buffer)",
        bytes >> 20
    );
    println!();
    println!(
        "| format | {} x {} GB/s | of read bandwidth |",
        args.rows, args.cols
    );
    println!("|---|--:|--:|");
    for ty in synapse_gpu::supported_types() {
        let gbs =
            bench::matvec_bandwidth(&gpu, ty, (args.rows, args.cols), args.cold_mib << 20, 16)?;
        println!("| {ty} | {gbs:.1} | {:.0}% |", 100.0 * gbs / peak);
    }
    Ok(())
}

fn encode_time(gpu: Gpu, path: &std::path::Path) -> Result<()> {
    use synapse_engine::{Logits, Model, Threads};
    let file = super::common::open_model(path)?;
    let described = synapse_engine::load(&file)?;
    let model = synapse_gpu::GpuDecoder::load(std::sync::Arc::new(gpu), &file, described.as_ref())?;
    drop(described);
    let threads = Threads::new(1);
    let mut st = model.new_state(64, 1)?;
    let mut logits = vec![0.0; model.info().n_vocab];
    let mut times = Vec::new();
    for i in 0..17 {
        model.forward(&mut st, &[i % 7], Logits::Last, &mut logits, &threads)?;
        times.push(model.last_encode_time());
    }
    times.remove(0);
    times.sort();
    println!(
        "{}: recording and submitting one decode step takes {:.0} us of the host (median of 16)",
        path.display(),
        times[times.len() / 2].as_secs_f64() * 1e6
    );
    Ok(())
}
