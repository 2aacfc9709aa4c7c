//! Times every tiled kernel this CPU runs for one format on a hot matrix:
//! `cargo run --release -p synapse-quant --example tilebench -- Q4_K 512 2048 64 [repacked]`
//! (first the row kernel, `gemv` once per token, which the engine runs where there is no tile;
//! then the packed matrix, where the CPU has one). Each is timed `TILEBENCH_REPS` times (20
//! unless set; more for a profile), the best reported. `TILEBENCH_ONLY=row`, `packed` or `tiles`
//! runs that part alone (`none`: only the set-up), for counting a part's instructions apart, as
//! under qemu-user on aarch64 (see docs/perf-log.md). `TILEBENCH_COLD=MIB` times the packed matrix
//! cold instead, as prefill meets it: copies of it packed until they fill `MIB` MiB, each rep on
//! the next copy. `TILEBENCH_IN_TILES=1` calls the packed matrix tile by tile, `tile_rows()` rows
//! a call, as the engine's prefill does. `TILEBENCH_AB=N` sets `synapse_quant::ab`'s variant.
//! `TILEBENCH_SUSTAINED=A,B,..` (with `TILEBENCH_COLD`, x86-64 with AVX-512): after the best-of
//! timing, `TILEBENCH_REPS` rounds of sweeps over every copy, one sweep per `ab` variant listed,
//! each followed by a plain read of the same bytes; prints each variant's median of kernel rate
//! over plain-read rate, and the two rates' medians (GB/s; the plain read is one stream, where
//! `synapse bench --membw` reads four at once). Sustained and paired, that ratio holds still on
//! a noisy host where best-of times move by a third.
use std::time::Instant;
use synapse_quant::GgmlType;

fn main() {
    // SYNAPSE_ISA and its kin, as the synapse binary reads them.
    let (kernels, notes) = synapse_quant::KernelConfig::from_vars(|k| std::env::var(k).ok());
    notes.iter().for_each(|n| eprintln!("tilebench: {n}"));
    let _ = synapse_quant::configure(kernels);
    let args: Vec<String> = std::env::args().collect();
    let ty = GgmlType::from_name(&args[1]).expect("a ggml type name");
    let rows: usize = args[2].parse().unwrap();
    let cols: usize = args[3].parse().unwrap();
    let n_tok: usize = args[4].parse().unwrap();
    let repacked = args.get(5).is_some_and(|a| a == "repacked");
    let reps: usize = std::env::var("TILEBENCH_REPS").map_or(20, |r| r.parse().unwrap());
    let only = std::env::var("TILEBENCH_ONLY").ok();
    if let Ok(v) = std::env::var("TILEBENCH_AB") {
        synapse_quant::ab::set_variant(v.parse().expect("TILEBENCH_AB: a variant number"));
    }
    let runs = |part: &str| only.as_deref().is_none_or(|o| o == part);
    let act = synapse_quant::vec_dot_type(ty).unwrap();
    let mut seed = 1u64;
    let mut rnd = || {
        seed = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((seed >> 33) as f32 / (1u64 << 31) as f32) * 2.0 - 1.0
    };
    // Random bytes with every f16 scale 1.0 (no NaN or subnormal slowing the float side).
    let bb = ty.block_bytes();
    let mut w: Vec<u8> = (0..rows * cols / ty.block_len() * bb)
        .map(|_| (rnd() * 127.0) as i8 as u8)
        .collect();
    for b in w.chunks_exact_mut(bb) {
        let at: &[usize] = match ty {
            GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q2_K => &[0, 2],
            GgmlType::Q6_K | GgmlType::Q3_K => &[bb - 2],
            _ => &[0],
        };
        for &i in at {
            b[i..i + 2].copy_from_slice(&0x3C00u16.to_le_bytes());
        }
    }
    // The float formats: random values in -1..1, encoded (random bytes would be NaNs).
    if matches!(ty, GgmlType::F16 | GgmlType::BF16 | GgmlType::F32) {
        let v: Vec<f32> = (0..rows * cols).map(|_| rnd()).collect();
        w = synapse_quant::quantize(ty, &v).unwrap();
    }
    let xf: Vec<f32> = (0..n_tok * cols).map(|_| rnd()).collect();
    let a = synapse_quant::quantize(act, &xf).unwrap();
    let row_bytes = w.len() / rows;
    let mut out = vec![0f32; rows * n_tok];
    // The row kernel (`VecDot::gemv`) token by token: what runs where no tile is registered.
    let row = synapse_quant::matrix_kernel(ty, repacked).unwrap();
    let act_bytes = a.len() / n_tok;
    let mut best = f64::MAX;
    for _ in 0..if runs("row") { reps } else { 0 } {
        let t = Instant::now();
        for (at, o) in a.chunks_exact(act_bytes).zip(out.chunks_exact_mut(rows)) {
            (row.gemv)(&w, row_bytes, at, o).unwrap();
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    let gmac = (rows * cols * n_tok) as f64 / best / 1e9;
    if runs("row") {
        println!(
            "{ty} repacked={repacked} {:>10} {rows}x{cols} n={n_tok}: {:.3} ms, {gmac:.1} GMAC/s",
            "row gemv",
            best * 1e3
        );
    }
    // The packed matrix (made once, as the engine does at load time), where this CPU has one.
    let cold_mib: usize = std::env::var("TILEBENCH_COLD").map_or(0, |m| m.parse().unwrap());
    let in_tiles = std::env::var_os("TILEBENCH_IN_TILES").is_some();
    let copies = (cold_mib << 20).div_ceil(w.len()).max(1);
    let packed: Vec<_> = if runs("packed") {
        (0..copies)
            .map_while(|_| {
                synapse_quant::pack_matrix(ty, repacked, &w, row_bytes, &|_| ()).unwrap()
            })
            .collect()
    } else {
        Vec::new()
    };
    if let Some(p0) = packed.first() {
        let mut out = vec![0f32; p0.rows() * n_tok];
        let mut best = f64::MAX;
        for r in 0..reps {
            let p = &packed[r % packed.len()];
            let t = Instant::now();
            if in_tiles {
                for r0 in (0..p.rows()).step_by(p.tile_rows()) {
                    let r1 = (r0 + p.tile_rows()).min(p.rows());
                    p.gemm(r0..r1, &a, n_tok, &mut out[..(r1 - r0) * n_tok])
                        .unwrap();
                }
            } else {
                p.gemm(0..p.rows(), &a, n_tok, &mut out).unwrap();
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        let gmac = (p0.rows() * cols * n_tok) as f64 / best / 1e9;
        let part = if copies > 1 { "packed cold" } else { "packed" };
        println!(
            "{ty} repacked={repacked} {:>10} {rows}x{cols} n={n_tok}: {:.3} ms, {gmac:.1} GMAC/s",
            part,
            best * 1e3
        );
    }
    // Sustained: every copy in turn (one sweep), each sweep followed by a plain read of the
    // same bytes; with TILEBENCH_SUSTAINED=A,B,.. the sweeps take `ab` variants A, B, .. in
    // turn. Prints each variant's median of kernel / plain read over TILEBENCH_REPS rounds.
    #[cfg(target_arch = "x86_64")]
    if let (Ok(vs), true) = (std::env::var("TILEBENCH_SUSTAINED"), packed.len() > 1) {
        let variants: Vec<usize> = vs.split(',').map(|v| v.parse().unwrap_or(0)).collect();
        let bytes: usize = packed.iter().map(|p| p.data().len()).sum();
        let mut out = vec![0f32; packed[0].rows() * n_tok];
        // Each round's (kernel, plain read) GB/s, per variant.
        let mut rates = vec![Vec::new(); variants.len()];
        for _ in 0..reps {
            for (i, &v) in variants.iter().enumerate() {
                synapse_quant::ab::set_variant(v);
                let t = Instant::now();
                for p in &packed {
                    p.gemm(0..p.rows(), &a, n_tok, &mut out).unwrap();
                }
                let kernel = t.elapsed().as_secs_f64();
                let t = Instant::now();
                let mut x = 0u64;
                for p in &packed {
                    // SAFETY: AVX-512 F (the packed kernels ran); page-aligned whole lines.
                    x ^= unsafe { plain_read(p.data()) };
                }
                std::hint::black_box(x);
                let plain = t.elapsed().as_secs_f64();
                rates[i].push((bytes as f64 / kernel / 1e9, bytes as f64 / plain / 1e9));
            }
        }
        let sorted = |mut x: Vec<f64>| {
            x.sort_by(f64::total_cmp);
            x
        };
        for (v, gbs) in variants.iter().zip(rates) {
            let r = sorted(gbs.iter().map(|&(k, p)| k / p).collect());
            let q = |f: usize| 100.0 * r[(f * r.len() / 4).min(r.len() - 1)];
            let kernel = sorted(gbs.iter().map(|g| g.0).collect())[gbs.len() / 2];
            let plain = sorted(gbs.iter().map(|g| g.1).collect())[gbs.len() / 2];
            println!(
                "sustained over {} MiB, variant {v}: kernel / plain read median {:.1}% (quartiles {:.1}-{:.1}%); medians {kernel:.1} / {plain:.1} GB/s",
                bytes >> 20,
                q(2),
                q(1),
                q(3)
            );
        }
    }
    let tiles = if runs("tiles") {
        synapse_quant::gemm_kernels(ty, repacked)
    } else {
        Vec::new()
    };
    for (isa, k) in tiles {
        let mut best = f64::MAX;
        for _ in 0..reps {
            let t = Instant::now();
            k(&w, row_bytes, &a, n_tok, &mut out).unwrap();
            best = best.min(t.elapsed().as_secs_f64());
        }
        let gmac = (rows * cols * n_tok) as f64 / best / 1e9;
        println!("{ty} repacked={repacked} {isa:>10} {rows}x{cols} n={n_tok}: {:.3} ms, {gmac:.1} GMAC/s", best * 1e3);
    }
}

/// XOR of every 64-byte line, four lines a step.
///
/// # Safety
/// The CPU must have AVX-512 F; `b` 64-byte aligned.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn plain_read(b: &[u8]) -> u64 {
    use std::arch::x86_64::*;
    let mut acc = [_mm512_setzero_si512(); 4];
    let lines = b.len() / 256 * 4;
    let p = b.as_ptr();
    let mut i = 0;
    while i < lines {
        for (k, a) in acc.iter_mut().enumerate() {
            // SAFETY: line i + k < lines lies inside `b`, 64-byte aligned (the caller's word).
            let line = unsafe { _mm512_load_si512(p.add(64 * (i + k)).cast()) };
            *a = _mm512_xor_si512(*a, line);
        }
        i += 4;
    }
    let x = _mm512_xor_si512(
        _mm512_xor_si512(acc[0], acc[1]),
        _mm512_xor_si512(acc[2], acc[3]),
    );
    _mm512_reduce_add_epi64(x) as u64
}
