//! `synapse bench-kernels`: the matrix-vector kernels alone, per format, against this machine's
//! measured read bandwidth.
//!
//! gemv-bench: a 4096 x 4096 matrix of random blocks times one token, fused (the kernel synapse
//! runs) against dequantize-to-f32 then an f32 dot (what a naive engine would do). Each timing is
//! the best of several runs over a matrix larger than the caches' share, so it measures streaming
//! weights from memory, as decode does.

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args;
use synapse_gguf::GgmlType;

#[derive(Args, Debug)]
pub struct BenchKernelsArgs {
    /// Rows and columns of the matrix.
    #[arg(long, default_value_t = 4096)]
    pub size: usize,
    /// Repetitions; the best is reported.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub reps: usize,
}

const FORMATS: &[GgmlType] = &[
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::F16,
];

/// Deterministic pseudo-random bytes (xorshift), with each block's leading f16 scale(s) made
/// small and finite so that the arithmetic is realistic.
fn random_matrix(ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let bytes = ty.bytes_for((rows * cols) as u64).expect("block multiple") as usize;
    let mut state = 0x9E37_79B9_7F4A_7C15u64 ^ ty.id() as u64;
    let mut v: Vec<u8> = (0..bytes)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    // Random bits make some f16 scales huge or NaN; give every scale field the exponent of
    // 2^-8 (top byte 0b?00111??), keeping its sign and top mantissa bits.
    let block = ty.block_bytes();
    if ty != GgmlType::F16 {
        for b in v.chunks_exact_mut(block) {
            let at = match ty {
                GgmlType::Q2_K => block - 4, // d, dmin at the end
                GgmlType::Q3_K | GgmlType::Q6_K => block - 2,
                _ => 0,
            };
            for k in (at..(at + 4).min(block)).skip(1).step_by(2) {
                b[k] = (b[k] & 0x83) | 0x1C;
            }
        }
    } else {
        for k in (1..v.len()).step_by(2) {
            v[k] = (v[k] & 0x83) | 0x38;
        }
    }
    v
}

fn best_of(reps: usize, mut f: impl FnMut()) -> Duration {
    (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .min()
        .unwrap_or_default()
}

/// Read bandwidth of one thread streaming a buffer much larger than the caches.
pub fn read_bandwidth_gbs(reps: usize) -> f64 {
    let buf = vec![1u64; 64 << 20]; // 512 MiB
    let t = best_of(reps, || {
        let mut acc = [0u64; 8];
        for c in buf.chunks_exact(8) {
            for (a, &x) in acc.iter_mut().zip(c) {
                *a = a.wrapping_add(x);
            }
        }
        black_box(acc);
    });
    (buf.len() * 8) as f64 / t.as_secs_f64() / 1e9
}

pub fn run(args: &BenchKernelsArgs) -> Result<()> {
    let n = args.size;
    let peak = read_bandwidth_gbs(args.reps);
    println!(
        "read bandwidth, one thread: {peak:.1} GB/s (512 MiB sum, best of {})",
        args.reps
    );
    println!(
        "gemv {n} x {n}, one token, one thread; best of {}",
        args.reps
    );
    println!(
        "| format | weights MiB | fused ms | fused GB/s | of peak | dequant+dot ms | fused speed-up |"
    );
    println!("|---|---|---|---|---|---|---|");
    let x: Vec<f32> = (0..n)
        .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
        .collect();
    for &ty in FORMATS {
        let w = random_matrix(ty, n, n);
        // The kernel a model's matrix of this shape gets (llama.cpp's repacked order where it repacks).
        let kernel = synapse_quant::matrix_kernel(ty, synapse_quant::llama_cpp_repacks(ty, n))?;
        let act_bytes = kernel.act.bytes_for(n as u64).expect("block multiple") as usize;
        let mut a = vec![0u8; act_bytes];
        synapse_quant::quantize_act_row(kernel.act, &x, &mut a)?;
        let row_bytes = w.len() / n;
        let mut out = vec![0f32; n];
        let fused = best_of(args.reps, || {
            (kernel.gemv)(&w, row_bytes, &a, &mut out).expect("sizes agree");
            black_box(&out);
        });
        let mut row = vec![0f32; n];
        let naive = best_of(args.reps, || {
            for (r, o) in out.iter_mut().enumerate() {
                synapse_quant::dequantize_row(ty, &w[r * row_bytes..(r + 1) * row_bytes], &mut row)
                    .expect("sizes agree");
                *o = row.iter().zip(&x).map(|(p, q)| p * q).sum();
            }
            black_box(&out);
        });
        let gbs = w.len() as f64 / fused.as_secs_f64() / 1e9;
        println!(
            "| {} | {:.1} | {:.3} | {:.1} | {:.0}% | {:.3} | {:.2}x |",
            ty.name(),
            w.len() as f64 / (1 << 20) as f64,
            fused.as_secs_f64() * 1e3,
            gbs,
            100.0 * gbs / peak,
            naive.as_secs_f64() * 1e3,
            naive.as_secs_f64() / fused.as_secs_f64(),
        );
    }
    Ok(())
}
