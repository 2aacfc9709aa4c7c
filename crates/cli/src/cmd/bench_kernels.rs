//! `synapse-dev bench-kernels`: the matrix kernels alone, per format, against this machine's
//! measured read bandwidth (`synapse_engine::membw`'s probe at the same thread count).
//!
//! - gemv-bench: a 4096 x 4096 matrix of random blocks times one token on one thread, fused (the
//!   row kernel) against dequantize-to-f32 then an f32 dot (what a naive engine would do), and,
//!   for the formats this CPU has packed kernels for, the same matrices packed (what the engine
//!   runs for them: `synapse_quant::pack_matrix`).
//! - kbench: the matrices of Llama-3.2-1B (2048x2048 Q/O, 512x2048 K/V, 8192x2048 gate/up,
//!   2048x8192 down, 128256x2048 output; rows x columns) times n = 1, 64 and 93 tokens, through
//!   the engine's own `matmul` on its thread pool, as a model runs them (packed where the CPU
//!   has kernels for it).
//!
//! Each timing is the best of several runs; GB/s counts the weight bytes once per product (the
//! weights are read once per row tile whatever the number of tokens).

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use synapse_engine::matmul::{matmul, Acts, Matrix};
use synapse_engine::{membw, Threads};
use synapse_gguf::{GgmlType, TensorInfo, TensorView};

#[derive(Args, Debug)]
pub struct BenchKernelsArgs {
    /// Which benchmark: gemv (gemv-bench), kbench, or all.
    #[arg(value_enum, default_value_t = Which::All)]
    pub which: Which,
    /// Rows and columns of the gemv-bench matrix.
    #[arg(long, default_value_t = 4096)]
    pub size: usize,
    /// Repetitions; the best is reported.
    #[arg(short = 'r', long, default_value_t = 5)]
    pub reps: usize,
    /// kbench: weight formats (comma list of ggml type names, or `all`).
    #[arg(long, default_value = "Q4_K,Q6_K,Q8_0")]
    pub formats: String,
    /// kbench: token counts.
    #[arg(long, default_value = "1,64,93")]
    pub tokens: String,
    /// kbench: thread counts.
    #[arg(short = 't', long, default_value = "1")]
    pub threads: String,
    /// Buffer of the read-bandwidth probe, MiB.
    #[arg(long, default_value_t = synapse_engine::membw::DEFAULT_BYTES >> 20)]
    pub membw_mib: usize,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Which {
    Gemv,
    Kbench,
    All,
}

/// Llama-3.2-1B's matrices, (rows, columns) and what they are.
const KBENCH_SHAPES: &[(usize, usize, &str)] = &[
    (2048, 2048, "attn_q/attn_output"),
    (512, 2048, "attn_k/attn_v"),
    (8192, 2048, "ffn_gate/ffn_up"),
    (2048, 8192, "ffn_down"),
    (128256, 2048, "output"),
];

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
    GgmlType::MXFP4,
    GgmlType::F16,
    GgmlType::BF16,
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
    if ty == GgmlType::BF16 {
        // Sign kept, exponent 126 or 127: values of magnitude 0.5..2.
        for k in (1..v.len()).step_by(2) {
            v[k] = (v[k] & 0x80) | 0x3F;
        }
    } else if ty == GgmlType::MXFP4 {
        // An E8M0 exponent of 2^-8.
        for b in v.chunks_exact_mut(block) {
            b[0] = 120;
        }
    } else if ty != GgmlType::F16 {
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

pub fn run(args: &BenchKernelsArgs) -> Result<()> {
    if args.reps == 0 || args.membw_mib == 0 {
        bail!("-r and --membw-mib must be at least 1");
    }
    let threads = super::bench::parse_list("-t", &args.threads)?;
    if threads.iter().any(|&t| t == 0 || t > 1024) {
        bail!(
            "-t {}: thread counts must be between 1 and 1024",
            args.threads
        );
    }
    let mut counts = threads.clone();
    if !counts.contains(&1) {
        counts.insert(0, 1);
    }
    let peaks = membw::probe(&counts, args.membw_mib << 20, args.reps);
    let list: Vec<String> = peaks
        .iter()
        .map(|b| format!("{} thread(s) {:.1} GB/s", b.threads, b.gbs))
        .collect();
    println!(
        "read bandwidth ({} loads, {} MiB, best of {}): {}",
        membw::isa(),
        args.membw_mib,
        args.reps,
        list.join(", ")
    );
    println!("kernel path: {}\n", super::bench::kernel_isa());
    let peak_at = |t: usize| peaks.iter().find(|b| b.threads == t).map_or(0.0, |b| b.gbs);
    if args.which != Which::Kbench {
        gemv_bench(args, peak_at(1))?;
    }
    if args.which != Which::Gemv {
        kbench(args, &threads, &peak_at)?;
    }
    Ok(())
}

fn parse_formats(s: &str) -> Result<Vec<GgmlType>> {
    if s.eq_ignore_ascii_case("all") {
        return Ok(FORMATS.to_vec());
    }
    s.split(',')
        .map(|f| {
            let f = f.trim();
            GgmlType::from_name(f)
                .filter(|t| FORMATS.contains(t))
                .with_context(|| format!("--formats: `{f}` is not one of the benchmarked formats"))
        })
        .collect()
}

fn kbench(
    args: &BenchKernelsArgs,
    threads: &[usize],
    peak_at: &dyn Fn(usize) -> f64,
) -> Result<()> {
    let formats = parse_formats(&args.formats)?;
    let tokens = super::bench::parse_list("--tokens", &args.tokens)?;
    if tokens.iter().any(|&n| n == 0 || n > 4096) {
        bail!("--tokens: token counts must be between 1 and 4096");
    }
    let max_n = tokens.iter().copied().max().unwrap_or(1);
    println!(
        "kbench: Llama-3.2-1B's matrices (rows x columns) times n tokens, engine matmul; best of {}; \
         n = 1 cycles through copies of the matrix larger than {} MiB (weights cold, as in decode)",
        args.reps, args.membw_mib
    );
    println!(
        "| format | matrix | shape | n | threads | ms | weights GB/s | of peak | GMAC/s | tok/s |"
    );
    println!("|---|---|---|--:|--:|--:|--:|--:|--:|--:|");
    for &ty in &formats {
        for &(rows, cols, what) in KBENCH_SHAPES {
            let w = random_matrix(ty, rows, cols);
            let info = TensorInfo {
                name: format!("kbench.{what}"),
                ggml_type: ty,
                shape: vec![cols as u64, rows as u64],
                offset: 0,
                size: w.len() as u64,
            };
            // Decode streams each matrix from memory (the whole model does not fit in the
            // caches): for one token, cycle through copies of the matrix that together exceed
            // the probe's buffer, so that each product finds its weights cold. With more tokens
            // the product is bound by arithmetic and one (warm) copy is timed.
            let copies = (((args.membw_mib << 20) / w.len().max(1)) + 1).min(4096);
            let ws: Vec<Vec<u8>> = (0..copies).map(|_| w.clone()).collect();
            let ms = ws
                .iter()
                .map(|w| {
                    // Packed where the CPU has kernels for it, as the engine loads a model.
                    Matrix::new(
                        TensorView {
                            info: &info,
                            data: w,
                        },
                        cols,
                        Some(rows),
                    )?
                    .pack(&info.name, &|_| ())
                })
                .collect::<Result<Vec<_>, _>>()?;
            let x: Vec<f32> = (0..max_n * cols)
                .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
                .collect();
            let mut acts = Acts::with_capacity(max_n, cols);
            let mut out = vec![0f32; max_n * rows];
            for &t in threads {
                let pool = Threads::new(t);
                for &n in &tokens {
                    acts.quantize(ms[0].act_type(), &x[..n * cols], cols, &pool);
                    let cycle = if n == 1 { &ms[..] } else { &ms[..1] };
                    let d = best_of(args.reps, || {
                        for m in cycle {
                            matmul(m, &acts, &mut out[..n * rows], &pool);
                            black_box(&out);
                        }
                    }) / cycle.len() as u32;
                    let gbs = w.len() as f64 / d.as_secs_f64() / 1e9;
                    let peak = peak_at(t);
                    println!(
                        "| {} | {what} | {rows}x{cols} | {n} | {t} | {:.3} | {gbs:.1} | {} | {:.1} | {:.0} |",
                        ty.name(),
                        d.as_secs_f64() * 1e3,
                        if peak > 0.0 { format!("{:.0}%", 100.0 * gbs / peak) } else { "-".into() },
                        (rows * cols * n) as f64 / d.as_secs_f64() / 1e9,
                        n as f64 / d.as_secs_f64(),
                    );
                }
            }
        }
    }
    Ok(())
}

fn gemv_bench(args: &BenchKernelsArgs, peak: f64) -> Result<()> {
    let n = args.size;
    if n == 0 || n % 256 != 0 {
        bail!("--size {n}: a positive multiple of 256 (the largest block)");
    }
    println!(
        "gemv-bench: {n} x {n}, one token, one thread; best of {}; fused timed over copies of the \
         matrix larger than {} MiB (weights cold), dequant+dot on one (it is bound by arithmetic)",
        args.reps, args.membw_mib
    );
    println!(
        "| format | weights MiB | fused ms | fused GB/s | of peak | dequant+dot ms | fused speed-up | packed ms | packed GB/s | packed of peak | packed speed-up |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
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
        // Cold weights, as in decode: cycle through copies larger than the probe's buffer.
        let copies = (((args.membw_mib << 20) / w.len().max(1)) + 1).min(4096);
        let ws: Vec<Vec<u8>> = (0..copies).map(|_| w.clone()).collect();
        let fused = best_of(args.reps, || {
            for w in &ws {
                (kernel.gemv)(w, row_bytes, &a, &mut out).expect("sizes agree");
                black_box(&out);
            }
        }) / copies as u32;
        // The same matrices packed (what the engine multiplies, where the CPU has kernels
        // for the format's packed rows).
        let repacked = synapse_quant::llama_cpp_repacks(ty, n);
        let packed = ws
            .iter()
            .map(|w| synapse_quant::pack_matrix(ty, repacked, w, row_bytes, &|_| ()))
            .collect::<Result<Option<Vec<_>>, _>>()?;
        drop(ws);
        let packed = packed.map(|ps| {
            best_of(args.reps, || {
                for p in &ps {
                    p.gemm(0..n, &a, 1, &mut out).expect("sizes agree");
                    black_box(&out);
                }
            }) / copies as u32
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
        let packed = packed.map_or("- | - | - | -".to_string(), |d| {
            let gbs = w.len() as f64 / d.as_secs_f64() / 1e9;
            format!(
                "{:.3} | {gbs:.1} | {:.0}% | {:.2}x",
                d.as_secs_f64() * 1e3,
                100.0 * gbs / peak,
                naive.as_secs_f64() / d.as_secs_f64()
            )
        });
        println!(
            "| {} | {:.1} | {:.3} | {:.1} | {:.0}% | {:.3} | {:.2}x | {packed} |",
            ty.name(),
            w.len() as f64 / (1 << 20) as f64,
            fused.as_secs_f64() * 1e3,
            gbs,
            100.0 * gbs / peak,
            naive.as_secs_f64() * 1e3,
            naive.as_secs_f64() / fused.as_secs_f64(),
        );
    }
    println!();
    Ok(())
}
