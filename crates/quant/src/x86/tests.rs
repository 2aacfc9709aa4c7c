//! The float kernels of every x86 tier against the reference, bit for bit, each where this CPU
//! can run it. (The quantized formats' row kernels are checked from the kernel table, in
//! `kernels.rs`.)

use crate::kernels::DotFn;
use crate::test_util::reference;
use crate::x86::rows::*;
use crate::x86::*;
use crate::{GemvFn, GgmlType};

fn has_v3() -> bool {
    crate::Cpu::detect().avx2()
}

/// The float kernels (AVX2, AVX-512 by one and by four rows, the AVX-512 tiles) against the
/// reference, bit for bit: lengths around the 64-value step (every tail shape), past one
/// 2048-value chunk of the tiles, 1..9 rows, 1..11 tokens.
#[test]
fn float_kernels_are_bit_identical_to_the_reference() {
    if !has_v3() {
        eprintln!("no AVX2/FMA/F16C on this CPU: the float kernels cannot run here");
        return;
    }
    float_kernels::<half::f16>(
        GgmlType::F16,
        2,
        (f16_avx2, f16_avx2_gemv),
        (f16_512, f16_512_gemv),
    );
    float_kernels::<f32>(
        GgmlType::F32,
        4,
        (f32_avx2, f32_avx2_gemv),
        (f32_512, f32_512_gemv),
    );
}

fn float_kernels<E: f16::Elem>(
    ty: GgmlType,
    size: usize,
    avx2: (DotFn, GemvFn),
    avx512: (DotFn, GemvFn),
) {
    use rand::{rngs::StdRng, Rng, SeedableRng};
    let reference = reference(ty);
    let mut rng = StdRng::seed_from_u64(16);
    for n in [
        1, 7, 8, 15, 16, 23, 24, 63, 64, 65, 88, 127, 128, 200, 256, 1000, 4100, 8200,
    ] {
        for n_rows in [1, 3, 4, 5, 9, 37] {
            let wf: Vec<f32> = (0..n * n_rows).map(|_| rng.gen_range(-1.0..1.0)).collect();
            let wb = crate::quantize(ty, &wf).unwrap();
            let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0f32..3.0)).collect();
            let mut a = vec![0u8; size * n];
            crate::quantize_act_row(ty, &x, &mut a).unwrap();
            assert_eq!(a, crate::quantize(ty, &x).unwrap(), "{ty} rounding, n {n}");
            let row_bytes = size * n;
            let mut kernels: Vec<(DotFn, GemvFn)> = vec![avx2];
            let mut gemms: Vec<crate::GemmFn> = vec![f16::gemm_avx2::<E>];
            if crate::Cpu::detect().avx512f() {
                kernels.push(avx512);
                gemms.push(f16::gemm_512::<E>);
            }
            for gemm in gemms {
                for n_tok in [1, 2, 3, 4, 5, 8, 11] {
                    let xs: Vec<f32> = (0..n * n_tok)
                        .map(|_| rng.gen_range(-3.0f32..3.0))
                        .collect();
                    let mut at = vec![0u8; size * n * n_tok];
                    crate::quantize_act_row(ty, &xs, &mut at).unwrap();
                    let mut out = vec![f32::NAN; n_rows * n_tok];
                    gemm(&wb, row_bytes, &at, n_tok, &mut out).unwrap();
                    for t in 0..n_tok {
                        for (r, wr) in wb.chunks_exact(row_bytes).enumerate() {
                            let want = reference(wr, &at[t * size * n..][..size * n]).unwrap();
                            let got = out[t * n_rows + r];
                            assert_eq!(
                                got.to_bits(),
                                want.to_bits(),
                                "{ty} n {n}: row {r}, token {t}"
                            );
                        }
                    }
                }
            }
            for (f, gemv) in kernels {
                let mut out = vec![f32::NAN; n_rows];
                gemv(&wb, row_bytes, &a, &mut out).unwrap();
                for (r, wr) in wb.chunks_exact(row_bytes).enumerate() {
                    let want = reference(wr, &a).unwrap();
                    assert_eq!(f(wr, &a).unwrap().to_bits(), want.to_bits(), "{ty} n {n}");
                    assert_eq!(out[r].to_bits(), want.to_bits(), "{ty} n {n} row {r}");
                }
            }
        }
    }
}
