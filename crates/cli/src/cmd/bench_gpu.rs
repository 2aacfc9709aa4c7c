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
}

pub fn run(args: &BenchGpuArgs) -> Result<()> {
    let gpu = Gpu::new(&GpuOptions {
        adapter: args.gpu_adapter.clone(),
    })?;
    println!("GPU: {}", gpu.info());
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
