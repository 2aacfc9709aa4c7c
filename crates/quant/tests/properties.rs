//! Properties of the reference codecs on random blocks of every format: the dot product agrees
//! with the dot of the decoded values, the activation quantizers round to within half a step,
//! and bad lengths or alignment are errors, not panics.

use half::f16;
use rand::{rngs::StdRng, Rng, RngCore, SeedableRng};
use synapse_quant::blocks::*;
use synapse_quant::{dequantize, quantize, vec_dot, vec_dot_type, Block, GgmlType, QuantError};

/// A finite f16 scale of modest size, either sign.
fn scale(rng: &mut StdRng) -> f16 {
    f16::from_f32(rng.gen_range(-2.0f32..2.0) * 10f32.powi(rng.gen_range(-4..1)))
}

/// `n` blocks of random bits, with their float fields replaced by sane values.
fn random_blocks<B: Block>(
    rng: &mut StdRng,
    n: usize,
    fix: impl Fn(&mut StdRng, &mut B),
) -> Vec<u8> {
    let mut blocks = vec![B::zeroed(); n];
    for b in &mut blocks {
        rng.fill_bytes(bytemuck::bytes_of_mut(b));
        fix(rng, b);
    }
    bytemuck::cast_slice(&blocks).to_vec()
}

fn random_weights(rng: &mut StdRng, ty: GgmlType, n_blocks: usize) -> Vec<u8> {
    match ty {
        GgmlType::F32 => {
            let v: Vec<f32> = (0..n_blocks).map(|_| rng.gen_range(-1.0..1.0)).collect();
            bytemuck::cast_slice(&v).to_vec()
        }
        GgmlType::F16 | GgmlType::BF16 => {
            let v: Vec<f32> = (0..n_blocks).map(|_| rng.gen_range(-1.0..1.0)).collect();
            quantize(ty, &v).unwrap()
        }
        GgmlType::Q4_0 => random_blocks::<BlockQ4_0>(rng, n_blocks, |r, b| b.d = scale(r)),
        GgmlType::Q4_1 => random_blocks::<BlockQ4_1>(rng, n_blocks, |r, b| {
            b.d = scale(r);
            b.m = scale(r);
        }),
        GgmlType::Q5_0 => random_blocks::<BlockQ5_0>(rng, n_blocks, |r, b| b.d = scale(r)),
        GgmlType::Q5_1 => random_blocks::<BlockQ5_1>(rng, n_blocks, |r, b| {
            b.d = scale(r);
            b.m = scale(r);
        }),
        GgmlType::Q8_0 => random_blocks::<BlockQ8_0>(rng, n_blocks, |r, b| b.d = scale(r)),
        GgmlType::Q2_K => random_blocks::<BlockQ2K>(rng, n_blocks, |r, b| {
            b.d = scale(r);
            b.dmin = scale(r);
        }),
        GgmlType::Q3_K => random_blocks::<BlockQ3K>(rng, n_blocks, |r, b| b.d = scale(r)),
        GgmlType::Q4_K => random_blocks::<BlockQ4K>(rng, n_blocks, |r, b| {
            b.d = scale(r);
            b.dmin = scale(r);
        }),
        GgmlType::Q5_K => random_blocks::<BlockQ5K>(rng, n_blocks, |r, b| {
            b.d = scale(r);
            b.dmin = scale(r);
        }),
        GgmlType::Q6_K => random_blocks::<BlockQ6K>(rng, n_blocks, |r, b| b.d = scale(r)),
        GgmlType::IQ4_NL => random_blocks::<BlockIQ4NL>(rng, n_blocks, |r, b| b.d = scale(r)),
        GgmlType::IQ4_XS => random_blocks::<BlockIQ4XS>(rng, n_blocks, |r, b| b.d = scale(r)),
        // Exponents 2^-14 to 2^2: real files' range, products far from overflow.
        GgmlType::MXFP4 => {
            random_blocks::<BlockMXFP4>(rng, n_blocks, |r, b| b.e = r.gen_range(114..=130))
        }
        _ => unreachable!("{ty}"),
    }
}

const WEIGHT_TYPES: &[GgmlType] = &[
    GgmlType::F32,
    GgmlType::F16,
    GgmlType::BF16,
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
];

#[test]
fn dot_agrees_with_dot_of_decoded_values() {
    kernels_from_env();
    let mut rng = StdRng::seed_from_u64(1);
    for &ty in WEIGHT_TYPES {
        let act = vec_dot_type(ty).unwrap();
        let block = ty.block_len().max(act.block_len());
        for n_blocks in [1, 2, 3, 7] {
            let n = n_blocks * block;
            for _ in 0..50 {
                let w = random_weights(&mut rng, ty, n / ty.block_len());
                let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0..3.0)).collect();
                let a = quantize(act, &x).unwrap();
                let got = vec_dot(ty, &w, &a).unwrap() as f64;
                let wd = dequantize(ty, &w).unwrap();
                let ad = dequantize(act, &a).unwrap();
                let want: f64 = wd.iter().zip(&ad).map(|(p, q)| *p as f64 * *q as f64).sum();
                let mag: f64 = wd
                    .iter()
                    .zip(&ad)
                    .map(|(p, q)| (*p as f64 * *q as f64).abs())
                    .sum();
                // Q4_1/Q5_1 carry the min term through Q8_1's f16 sum `s`, which rounds.
                let rel = match ty {
                    GgmlType::Q4_1 | GgmlType::Q5_1 => 2e-3,
                    _ => 1e-5,
                };
                assert!(
                    (got - want).abs() <= rel * mag + 1e-12,
                    "{ty} x {n}: dot {got:e}, decoded dot {want:e} (magnitude {mag:e})"
                );
            }
        }
    }
}

#[test]
fn activation_quantizers_round_to_half_a_step() {
    kernels_from_env();
    let mut rng = StdRng::seed_from_u64(2);
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
        for _ in 0..200 {
            let n = ty.block_len() * rng.gen_range(1..4);
            // Q8_0/Q8_1 keep d in f16: below ~1e-2 it goes subnormal and loses precision, as in
            // ggml; the half-step bound is checked where the format can keep it.
            let low = if ty == GgmlType::Q8_K { -20 } else { -2 };
            let mag = 10f32.powi(rng.gen_range(low..6));
            let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-mag..mag)).collect();
            let q = quantize(ty, &x).unwrap();
            let y = dequantize(ty, &q).unwrap();
            for (blk, (xb, yb)) in x
                .chunks(ty.block_len())
                .zip(y.chunks(ty.block_len()))
                .enumerate()
            {
                let amax = xb.iter().fold(0f32, |m, v| m.max(v.abs()));
                // Q8_0/Q8_1 store d as f16, which adds its own relative error to each value.
                let step = amax / 127.0;
                let slack = match ty {
                    GgmlType::Q8_K => 1e-6 * amax,
                    _ => 1e-3 * amax,
                };
                for (a, b) in xb.iter().zip(yb) {
                    assert!(
                        (a - b).abs() <= step / 2.0 + slack,
                        "{ty} block {blk}: {a} -> {b}"
                    );
                }
            }
        }
    }
}

/// The activation quantizer the engine runs (compiled for this CPU) encodes exactly as the
/// runtime reference does: ties, zero blocks, the largest magnitude twice with both signs
/// (Q8_K takes the first), and NaN, infinities and subnormals among the values.
#[test]
fn chosen_activation_quantizer_is_bit_identical_to_the_reference() {
    kernels_from_env();
    let mut rng = StdRng::seed_from_u64(5);
    let special = [
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7FC0_0123),
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::from_bits(1),
        -f32::from_bits(0x0000_8000),
    ];
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
        let fast = synapse_quant::act_quantizer(ty).unwrap();
        for case in 0..600 {
            let n = ty.block_len() * rng.gen_range(1..5);
            let mag = 10f32.powi(rng.gen_range(-6..6));
            let mut x: Vec<f32> = (0..n).map(|_| rng.gen_range(-mag..mag)).collect();
            match case % 6 {
                // Halves of a step: values that round to even.
                1 => x.iter_mut().for_each(|v| *v = (*v * 4.0).round() / 2.0),
                2 => x[..ty.block_len()].fill(0.0),
                // The largest magnitude at two places, of opposite signs, in either order.
                3 => {
                    let (i, j) = (rng.gen_range(0..n), rng.gen_range(0..n));
                    let sign = if rng.gen() { 1.0 } else { -1.0 };
                    x[i] = sign * 2.0 * mag;
                    x[j] = -sign * 2.0 * mag;
                }
                // A special value or two somewhere.
                4 => {
                    for _ in 0..rng.gen_range(1..3) {
                        x[rng.gen_range(0..n)] = special[rng.gen_range(0..special.len())];
                    }
                }
                // Every value tiny: subnormal scales.
                5 => x.iter_mut().for_each(|v| *v *= 1e-38),
                _ => {}
            }
            let bytes = ty.bytes_for(n as u64).unwrap() as usize;
            let (mut want, mut got) = (vec![0u8; bytes], vec![0u8; bytes]);
            synapse_quant::quantize_act_row(ty, &x, &mut want).unwrap();
            fast(&x, &mut got).unwrap();
            assert!(got == want, "{ty} case {case}: differs from the reference");
        }
    }
}

/// BF16 activations (a row at a time) take the reference's bits for every kind of f32: random
/// bit patterns (NaNs of both signs, infinities, subnormals) and ties of each parity, at
/// lengths with and without a vector tail.
#[test]
fn chosen_bf16_activation_conversion_is_bit_identical_to_the_reference() {
    kernels_from_env();
    let mut rng = StdRng::seed_from_u64(6);
    let fast = synapse_quant::act_quantizer(GgmlType::BF16).unwrap();
    for n in [1, 7, 8, 16, 33, 100, 2048 + 5] {
        let mut x: Vec<f32> = (0..n).map(|_| f32::from_bits(rng.gen())).collect();
        let special = [
            f32::NAN,
            -f32::NAN,
            f32::from_bits(0xFFFF_FFFF),
            f32::from_bits(0x7F80_0001),
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::from_bits(0x0000_8000),
            f32::from_bits(0x3F80_8000),
            f32::from_bits(0x3F81_8000),
            f32::from_bits(0x7F7F_FFFF),
            -0.0,
        ];
        for (x, s) in x.iter_mut().step_by(3).zip(special) {
            *x = s;
        }
        let (mut want, mut got) = (vec![0u8; 2 * n], vec![0u8; 2 * n]);
        synapse_quant::quantize_act_row(GgmlType::BF16, &x, &mut want).unwrap();
        fast(&x, &mut got).unwrap();
        assert!(got == want, "BF16, {n} values: differs from the reference");
    }
}

#[test]
fn q8_k_block_sums_and_q8_1_sum_are_consistent() {
    kernels_from_env();
    let mut rng = StdRng::seed_from_u64(3);
    let x: Vec<f32> = (0..1024).map(|_| rng.gen_range(-1.0..1.0)).collect();
    let q = quantize(GgmlType::Q8_K, &x).unwrap();
    for b in bytemuck::cast_slice::<u8, BlockQ8K>(&q) {
        for (g, s) in b.bsums.iter().enumerate() {
            let sum: i16 = b.qs[16 * g..16 * g + 16].iter().map(|&v| v as i16).sum();
            assert_eq!(*s, sum);
        }
        assert!(b.qs.iter().all(|&v| v >= -127));
    }
    let q = quantize(GgmlType::Q8_1, &x).unwrap();
    for b in bytemuck::cast_slice::<u8, BlockQ8_1>(&q) {
        let sum: i32 = b.qs.iter().map(|&v| v as i32).sum();
        assert!(
            (b.s.to_f32() - sum as f32 * b.d.to_f32()).abs() <= 1e-3 * b.s.to_f32().abs() + 1e-7
        );
    }
}

#[test]
fn bad_lengths_and_alignment_are_errors() {
    kernels_from_env();
    let ty = GgmlType::Q4_K;
    let bytes = vec![0u8; 2 * 144 + 1];
    assert!(matches!(
        dequantize(ty, &bytes),
        Err(QuantError::ByteLength { .. })
    ));
    let mut out = vec![0f32; 100];
    assert!(matches!(
        synapse_quant::dequantize_row(ty, &bytes[..144], &mut out),
        Err(QuantError::NotBlockMultiple { .. })
    ));
    let mut out = vec![0f32; 512];
    assert!(matches!(
        synapse_quant::dequantize_row(ty, &bytes[..144], &mut out),
        Err(QuantError::SizeMismatch { .. })
    ));
    // An odd address cannot hold f16 fields.
    let r = synapse_quant::dequantize_row(ty, &bytes[1..145], &mut out[..256]);
    assert!(matches!(r, Err(QuantError::Misaligned { .. })), "{r:?}");
    // Mismatched dot lengths, and types without a codec.
    let a = quantize(GgmlType::Q8_K, &[0.5; 512]).unwrap();
    assert!(matches!(
        vec_dot(ty, &bytes[..144], &a),
        Err(QuantError::DotLength { .. })
    ));
    assert!(matches!(
        dequantize(GgmlType::IQ2_XXS, &[0; 66]),
        Err(QuantError::Unsupported { .. })
    ));
    assert!(matches!(
        quantize(GgmlType::Q4_K, &[0.0; 256]),
        Err(QuantError::Unsupported { .. })
    ));
    assert!(matches!(
        vec_dot(GgmlType::Q8_K, &a, &a),
        Err(QuantError::Unsupported { .. })
    ));
}

#[test]
fn bf16_conversion_rounds_to_nearest_even_and_keeps_nan() {
    kernels_from_env();
    let cases: [(f32, u16); 5] = [
        (1.0, 0x3F80),
        (f32::from_bits(0x3F80_8000), 0x3F80), // tie, even stays
        (f32::from_bits(0x3F81_8000), 0x3F82), // tie, odd rounds up
        (f32::from_bits(0x3F80_8001), 0x3F81),
        (f32::INFINITY, 0x7F80),
    ];
    for (x, want) in cases {
        let q = quantize(GgmlType::BF16, &[x]).unwrap();
        assert_eq!(u16::from_le_bytes([q[0], q[1]]), want, "{x:e}");
    }
    let q = quantize(GgmlType::BF16, &[f32::NAN]).unwrap();
    assert!(dequantize(GgmlType::BF16, &q).unwrap()[0].is_nan());
}

/// BF16 values for the BF16 kernel tests: mostly of modest size (`tiny`: all near 1e-20, so
/// that products and sums fall below f32's normal range, where `vdpbf16ps` flushes them to
/// zero, and some near 1e18), some subnormal (which it takes as zero), some tinier, some
/// negative zeros.
fn bf16_values(rng: &mut StdRng, n: usize, odd: bool, tiny: bool) -> Vec<u8> {
    let v: Vec<u16> = (0..n)
        .map(|_| {
            let bits = |x: f32| (x.to_bits() >> 16) as u16;
            // Tiny: 1e-21..1e-18, so that products and partial sums cross into f32's
            // subnormals and back.
            let size = if tiny {
                10f32.powf(rng.gen_range(-21.0..-18.0))
            } else {
                3.0
            };
            match rng.gen_range(0..if odd { 10 } else { 100 }) {
                0 => rng.gen_range(1..0x80) | (rng.gen_range(0..2) << 15), // subnormal
                1 => bits(rng.gen_range(-1.0f32..1.0) * 1e-20),
                2 => bits(rng.gen_range(-1.0f32..1.0) * 1e-36),
                3 => 0x8000,
                // Against a subnormal, large enough that taking it as zero shows.
                4 if tiny => bits(rng.gen_range(-1.0f32..1.0) * 1e18),
                _ => bits(rng.gen_range(-1.0f32..1.0) * size),
            }
        })
        .collect();
    bytemuck::cast_slice(&v).to_vec()
}

/// The BF16 kernels this CPU runs (one row, rows, tiles of a batch) give the reference's bits
/// (`vec_dot_bf16_bf16`: `vdpbf16ps` emulated, subnormals included) on every row length from
/// one value to past several 64-value steps, and with values at the edges of f32's range.
#[test]
fn bf16_kernels_are_bit_identical_to_the_reference() {
    kernels_from_env();
    let mut rng = StdRng::seed_from_u64(11);
    let ty = GgmlType::BF16;
    let kernel = synapse_quant::vec_dot_kernel(ty).unwrap();
    let matrix = synapse_quant::matrix_kernel(ty, false).unwrap();
    let tiles = synapse_quant::gemm_kernels(ty, false);
    let mut steps = 0;
    for n in (1..=200).chain([255, 256, 257, 320, 1000]) {
        let (odd, tiny) = (n % 3 == 0, n % 4 == 1);
        let (rows, n_tok) = (rng.gen_range(1..6), rng.gen_range(1..15));
        let w = bf16_values(&mut rng, rows * n, odd, tiny);
        let a = bf16_values(&mut rng, n_tok * n, odd, tiny);
        let (rb, ab) = (2 * n, 2 * n);
        let want: Vec<f32> = (0..n_tok)
            .flat_map(|t| {
                let a = &a[t * ab..][..ab];
                (0..rows)
                    .map(|r| vec_dot(ty, &w[r * rb..][..rb], a).unwrap())
                    .collect::<Vec<_>>()
            })
            .collect();
        let at = |t: usize, r: usize| want[t * rows + r].to_bits();
        for t in 0..n_tok {
            let a = &a[t * ab..][..ab];
            for r in 0..rows {
                let got = (kernel.f)(&w[r * rb..][..rb], a).unwrap();
                assert_eq!(
                    got.to_bits(),
                    at(t, r),
                    "one row: {n} values, row {r}, token {t}"
                );
            }
            let mut out = vec![f32::NAN; rows];
            (matrix.gemv)(&w, rb, a, &mut out).unwrap();
            for (r, got) in out.iter().enumerate() {
                assert_eq!(
                    got.to_bits(),
                    at(t, r),
                    "rows: {n} values, row {r}, token {t}"
                );
            }
        }
        for (isa, gemm) in &tiles {
            let mut out = vec![f32::NAN; rows * n_tok];
            gemm(&w, rb, &a, n_tok, &mut out).unwrap();
            for t in 0..n_tok {
                for r in 0..rows {
                    let got = out[t * rows + r].to_bits();
                    assert_eq!(got, at(t, r), "{isa} tile: {n} values, row {r}, token {t}");
                }
            }
        }
        steps += n / 64;
    }
    assert!(steps > 20);
    // A subnormal against a large value, in each place of a pair: `vdpbf16ps` takes it as zero
    // (without that the product, about 3e-9, would be the sum).
    for e in [4, 5, 36, 63] {
        let mut w = vec![0u16; 128];
        let mut a = vec![0u16; 128];
        w[e] = 0x0040;
        a[e] = (1e30f32.to_bits() >> 16) as u16;
        let (w, a): (&[u8], &[u8]) = (bytemuck::cast_slice(&w), bytemuck::cast_slice(&a));
        let want = vec_dot(ty, w, a).unwrap();
        assert_eq!(want, 0.0, "value {e}: the reference keeps a subnormal");
        assert_eq!(
            (kernel.f)(w, a).unwrap().to_bits(),
            want.to_bits(),
            "value {e}"
        );
    }
}

/// The kernel chosen for this CPU (the reference recompiled for x86-64-v3 where the CPU has it)
/// gives the reference's bits, on every format and odd block counts.
#[test]
fn chosen_kernel_is_bit_identical_to_the_reference() {
    kernels_from_env();
    let mut rng = StdRng::seed_from_u64(4);
    for &ty in WEIGHT_TYPES {
        let act = vec_dot_type(ty).unwrap();
        let block = ty.block_len().max(act.block_len());
        let kernel = synapse_quant::vec_dot_kernel(ty).unwrap();
        assert_eq!(kernel.act, act);
        for n_blocks in [1, 3, 8, 13] {
            let n = n_blocks * block;
            for _ in 0..20 {
                let w = random_weights(&mut rng, ty, n / ty.block_len());
                let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0..3.0)).collect();
                let a = quantize(act, &x).unwrap();
                let want = vec_dot(ty, &w, &a).unwrap();
                let got = (kernel.f)(&w, &a).unwrap();
                assert_eq!(got.to_bits(), want.to_bits(), "{ty} x {n}");
            }
        }
    }
}

/// The kernels for matrices llama.cpp repacks give the bits of the reference in that order.
#[test]
fn repacked_order_kernels_are_bit_identical_to_their_reference() {
    kernels_from_env();
    use synapse_quant::codec::cast_blocks;
    use synapse_quant::reference::dot as r;
    let mut rng = StdRng::seed_from_u64(5);
    for ty in [
        GgmlType::Q4_0,
        GgmlType::IQ4_NL,
        GgmlType::MXFP4,
        GgmlType::Q4_K,
        GgmlType::Q2_K,
    ] {
        assert!(
            synapse_quant::llama_cpp_repacks(ty, 16) && !synapse_quant::llama_cpp_repacks(ty, 12)
        );
        let act = vec_dot_type(ty).unwrap();
        let kernel = synapse_quant::matrix_kernel(ty, true).unwrap();
        for n_blocks in [1, 2, 5, 8] {
            let n = n_blocks * 256;
            for _ in 0..20 {
                let w = random_weights(&mut rng, ty, n / ty.block_len());
                let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0..3.0)).collect();
                let a = quantize(act, &x).unwrap();
                let want = match ty {
                    GgmlType::Q4_0 => r::vec_dot_q4_0_q8_0_rows8(
                        cast_blocks(&w).unwrap(),
                        cast_blocks(&a).unwrap(),
                    ),
                    GgmlType::IQ4_NL => r::vec_dot_iq4_nl_q8_0_rows8(
                        cast_blocks(&w).unwrap(),
                        cast_blocks(&a).unwrap(),
                    ),
                    GgmlType::MXFP4 => r::vec_dot_mxfp4_q8_0_rows8(
                        cast_blocks(&w).unwrap(),
                        cast_blocks(&a).unwrap(),
                    ),
                    GgmlType::Q4_K => r::vec_dot_q4_k_q8_k_rows8(
                        cast_blocks(&w).unwrap(),
                        cast_blocks(&a).unwrap(),
                    ),
                    _ => r::vec_dot_q2_k_q8_k_rows8(
                        cast_blocks(&w).unwrap(),
                        cast_blocks(&a).unwrap(),
                    ),
                };
                let got = (kernel.f)(&w, &a).unwrap();
                assert_eq!(got.to_bits(), want.to_bits(), "{ty} x {n}");
                // And the same order, to rounding, as the plain dot product.
                let plain = vec_dot(ty, &w, &a).unwrap();
                assert!(
                    (got - plain).abs() <= 1e-4 * plain.abs().max(1.0),
                    "{ty}: {got} vs {plain}"
                );
            }
        }
    }
}

/// The tiled kernels (several rows by several tokens) give, for every (row, token), the bits of
/// the single-row kernel of that matrix: odd row counts, tails of the tiles, batch sizes 1..100.
#[test]
fn tiled_kernels_are_bit_identical_to_the_row_kernel() {
    kernels_from_env();
    let mut rng = StdRng::seed_from_u64(6);
    let mut tested = Vec::new();
    for &ty in WEIGHT_TYPES {
        for repacked in [false, true] {
            for (isa, gemm) in synapse_quant::gemm_kernels(ty, repacked) {
                tested.push((ty, repacked, isa));
                let act = vec_dot_type(ty).unwrap();
                let row_kernel = synapse_quant::matrix_kernel(ty, repacked).unwrap();
                for (rows, n_tok, n_blocks) in [
                    (1, 1, 1),
                    (4, 1, 2),
                    (7, 1, 1),
                    (3, 4, 1),
                    (5, 9, 2),
                    (2, 64, 1),
                    (3, 93, 1),
                    (1, 100, 1),
                    (9, 7, 3),
                    (6, 37, 1),
                    (5, 17, 2),
                    // Sixteen rows and more, with rows left over.
                    (16, 8, 1),
                    (35, 13, 2),
                    (48, 93, 1),
                ] {
                    // With an odd row count, the 32-value formats get an odd number of blocks
                    // (IQ4_NL's `vec_dot` order treats a last odd block apart).
                    let odd = ty.block_len() == 32 && rows % 2 == 1;
                    let n = n_blocks * 256 + if odd { 32 } else { 0 };
                    let w = random_weights(&mut rng, ty, rows * n / ty.block_len());
                    let row_bytes = w.len() / rows;
                    let x: Vec<f32> = (0..n_tok * n).map(|_| rng.gen_range(-3.0..3.0)).collect();
                    let a = quantize(act, &x).unwrap();
                    let act_bytes = a.len() / n_tok;
                    let mut out = vec![f32::NAN; rows * n_tok];
                    gemm(&w, row_bytes, &a, n_tok, &mut out).unwrap();
                    for t in 0..n_tok {
                        for r in 0..rows {
                            let wr = &w[r * row_bytes..(r + 1) * row_bytes];
                            let at = &a[t * act_bytes..(t + 1) * act_bytes];
                            let want = (row_kernel.f)(wr, at).unwrap();
                            assert_eq!(
                            out[t * rows + r].to_bits(),
                            want.to_bits(),
                            "{ty} {isa} repacked={repacked}: row {r} of {rows}, token {t} of {n_tok}"
                        );
                        }
                    }
                    // Operands that do not fit are errors, not panics.
                    assert!(gemm(&w, row_bytes, &a, n_tok + 1, &mut out).is_err());
                    assert!(gemm(&w, row_bytes + 1, &a, n_tok, &mut out).is_err());
                }
            }
        }
    }
    // What the dispatch may use here: the CPU's best tier, or less under SYNAPSE_ISA.
    let isa = synapse_quant::kernel_isa();
    // On aarch64 every quantized format has a NEON tile, in both orders where llama.cpp repacks.
    #[cfg(target_arch = "aarch64")]
    for &ty in WEIGHT_TYPES {
        if ty.block_len() == 1 {
            continue;
        }
        for repacked in [false, synapse_quant::llama_cpp_repacks(ty, 8)] {
            assert!(
                tested
                    .iter()
                    .any(|&(t, r, i)| t == ty && r == repacked && i == isa),
                "no NEON tile for {ty} (repacked: {repacked})"
            );
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa != "reference" {
        for want in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q8_0,
            GgmlType::Q2_K,
            GgmlType::Q3_K,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::IQ4_NL,
            GgmlType::IQ4_XS,
        ] {
            assert!(
                tested.iter().any(|&(t, _, _)| t == want),
                "no tiled kernel for {want}"
            );
        }
        // Both orders of the formats llama.cpp repacks.
        for want in [
            GgmlType::Q4_0,
            GgmlType::Q4_K,
            GgmlType::Q2_K,
            GgmlType::IQ4_NL,
        ] {
            for repacked in [false, true] {
                assert!(
                    tested
                        .iter()
                        .any(|&(t, r, isa)| t == want && r == repacked && isa == "avx2"),
                    "no AVX2 tile for {want} (repacked: {repacked})"
                );
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa == "avx512vnni" {
        for want in [
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
            GgmlType::IQ4_XS,
        ] {
            let have = tested
                .iter()
                .any(|&(t, _, isa)| t == want && isa == "avx512vnni");
            assert!(have, "no AVX-512 VNNI kernel for {want}");
        }
        for (want, repacked) in [
            (GgmlType::Q2_K, true),
            (GgmlType::IQ4_NL, true),
            (GgmlType::MXFP4, true),
        ] {
            let have = tested
                .iter()
                .any(|&(t, r, isa)| t == want && r == repacked && isa == "avx512vnni");
            assert!(
                have,
                "no AVX-512 VNNI kernel for {want} (repacked: {repacked})"
            );
        }
    }
    #[cfg(target_arch = "x86_64")]
    if isa == "avx512vnni" {
        for want in [GgmlType::F16, GgmlType::F32] {
            let have = tested
                .iter()
                .any(|&(t, _, isa)| t == want && isa == "avx512");
            assert!(have, "no AVX-512 tile for {want}");
        }
    }
    let _ = (tested, isa);
}

/// Over several rows at once (odd row counts), the chosen kernels' gemv gives, row by row, the
/// bits of the single-row dot product: the reference for `vec_dot` order, and the (tested above)
/// repacked-order kernel for matrices llama.cpp repacks.
#[test]
fn chosen_gemv_is_row_by_row_bit_identical() {
    kernels_from_env();
    let mut rng = StdRng::seed_from_u64(6);
    for &ty in WEIGHT_TYPES {
        let act = vec_dot_type(ty).unwrap();
        let block = ty.block_len().max(act.block_len());
        for repacked in [false, true] {
            if repacked && !synapse_quant::llama_cpp_repacks(ty, 8) {
                continue;
            }
            let kernel = synapse_quant::matrix_kernel(ty, repacked).unwrap();
            for (n_blocks, n_rows) in [(1, 1), (3, 3), (8, 7), (13, 13), (2, 8)] {
                let n = n_blocks * block;
                let w = random_weights(&mut rng, ty, n_rows * n / ty.block_len());
                let x: Vec<f32> = (0..n).map(|_| rng.gen_range(-3.0..3.0)).collect();
                let a = quantize(act, &x).unwrap();
                let row_bytes = w.len() / n_rows;
                let mut out = vec![f32::NAN; n_rows];
                (kernel.gemv)(&w, row_bytes, &a, &mut out).unwrap();
                for (r, (wr, got)) in w.chunks_exact(row_bytes).zip(&out).enumerate() {
                    let want = if repacked {
                        (kernel.f)(wr, &a).unwrap()
                    } else {
                        vec_dot(ty, wr, &a).unwrap()
                    };
                    assert_eq!(
                        got.to_bits(),
                        want.to_bits(),
                        "{ty} (repacked: {repacked}) x {n}, row {r} of {n_rows}"
                    );
                }
            }
        }
    }
}

/// Packed matrices (`pack_matrix`: whole groups of sixteen rows) give, for every (row, token)
/// and every batch size, the bits of the single-row kernel of that matrix; a range of rows that
/// is not whole groups, or operands that do not fit, are errors.
#[test]
fn packed_matrices_are_bit_identical_to_the_row_kernel() {
    kernels_from_env();
    let mut rng = StdRng::seed_from_u64(7);
    let mut packed_types = Vec::new();
    for &ty in WEIGHT_TYPES {
        for repacked in [false, true] {
            let act = vec_dot_type(ty).unwrap();
            let row_kernel = synapse_quant::matrix_kernel(ty, repacked).unwrap();
            for (rows, n_tok, n_blocks) in [
                (16, 1, 1),
                (35, 1, 2),
                (48, 2, 1),
                (32, 3, 3),
                (16, 4, 1),
                (33, 5, 1),
                (16, 7, 2),
                (16, 8, 1),
                (32, 9, 1),
                (16, 13, 1),
                (17, 64, 1),
                (16, 93, 1),
                (32, 21, 3),
                (5, 3, 1),
                // Rows wider than 8192 values: one token's passes ask for the token's next
                // block ahead there (Q4_K).
                (16, 1, 33),
            ] {
                let n = n_blocks * 256 + if ty.block_len() == 32 { 32 } else { 0 };
                let w = random_weights(&mut rng, ty, rows * n / ty.block_len());
                let row_bytes = w.len() / rows;
                let released = std::sync::Mutex::new(0);
                let release = |b: &[u8]| *released.lock().unwrap() += b.len();
                let Some(p) =
                    synapse_quant::pack_matrix(ty, repacked, &w, row_bytes, &release).unwrap()
                else {
                    continue;
                };
                // Every packed row's bytes were handed back, once.
                assert_eq!(*released.lock().unwrap(), p.rows() * row_bytes);
                assert!(rows >= 16, "{ty}: {rows} rows packed");
                assert_eq!(p.rows(), rows / 16 * 16);
                // The same bytes moved; MXFP4's 1-byte scales are held as F16 (17 -> 18).
                let held = match ty {
                    GgmlType::MXFP4 => p.rows() * row_bytes / 17 * 18,
                    _ => p.rows() * row_bytes,
                };
                assert_eq!(p.bytes(), held, "{ty}: packed size");
                packed_types.push((ty, repacked));
                let x: Vec<f32> = (0..n_tok * n).map(|_| rng.gen_range(-3.0..3.0)).collect();
                let a = quantize(act, &x).unwrap();
                let act_bytes = a.len() / n_tok;
                // The whole packed range, and its groups one by one.
                let ranges = std::iter::once(0..p.rows())
                    .chain((0..p.rows()).step_by(16).map(|r| r..r + 16));
                for range in ranges {
                    let len = range.len();
                    let mut out = vec![f32::NAN; len * n_tok];
                    p.gemm(range.clone(), &a, n_tok, &mut out).unwrap();
                    for t in 0..n_tok {
                        for (i, r) in range.clone().enumerate() {
                            let wr = &w[r * row_bytes..(r + 1) * row_bytes];
                            let at = &a[t * act_bytes..(t + 1) * act_bytes];
                            let want = (row_kernel.f)(wr, at).unwrap();
                            assert_eq!(
                                out[t * len + i].to_bits(),
                                want.to_bits(),
                                "{ty} packed, repacked={repacked}: row {r} of {rows}, token {t} of {n_tok}"
                            );
                        }
                    }
                    assert!(p.gemm(range.clone(), &a, n_tok + 1, &mut out).is_err());
                    assert!(p
                        .gemm(range, &a[..act_bytes * (n_tok - 1)], n_tok, &mut out)
                        .is_err());
                }
                let mut out = vec![0.0; 8 * n_tok];
                assert!(p.gemm(0..8, &a, n_tok, &mut out).is_err());
                let mut out = vec![0.0; (p.rows() + 16) * n_tok];
                assert!(p.gemm(0..p.rows() + 16, &a, n_tok, &mut out).is_err());
            }
        }
    }
    // The formats with a packed kernel on this CPU (AVX-512 VNNI, or AVX2 for fewer, unless
    // SYNAPSE_ISA or SYNAPSE_PACK=0 say otherwise) are all packed, in the orders they have.
    #[cfg(target_arch = "x86_64")]
    let packing = !synapse_quant::config().no_pack;
    #[cfg(target_arch = "x86_64")]
    if ["avx2", "avxvnni"].contains(&synapse_quant::kernel_isa()) && packing {
        let want = [
            (GgmlType::Q4_K, true),
            (GgmlType::Q2_K, true),
            (GgmlType::Q3_K, false),
            (GgmlType::Q3_K, true),
            (GgmlType::Q5_K, false),
            (GgmlType::Q5_K, true),
            (GgmlType::Q6_K, false),
            (GgmlType::Q6_K, true),
            (GgmlType::IQ4_XS, false),
            (GgmlType::IQ4_XS, true),
            (GgmlType::Q5_0, false),
            (GgmlType::Q4_0, false),
            (GgmlType::Q4_0, true),
            (GgmlType::IQ4_NL, true),
            (GgmlType::MXFP4, true),
            (GgmlType::Q4_1, false),
            (GgmlType::Q5_1, false),
            (GgmlType::Q8_0, false),
            (GgmlType::Q8_0, true),
        ];
        for w in want {
            assert!(packed_types.contains(&w), "{w:?} not packed");
        }
        // And no other format (in either order).
        assert!(packed_types.iter().all(|p| want.iter().any(|w| w.0 == p.0)));
    }
    #[cfg(target_arch = "x86_64")]
    if synapse_quant::kernel_isa() == "avx512vnni" && packing {
        for want in [
            (GgmlType::Q4_K, true),
            (GgmlType::Q6_K, false),
            (GgmlType::Q6_K, true),
            (GgmlType::IQ4_XS, false),
            (GgmlType::IQ4_XS, true),
            (GgmlType::Q5_0, false),
            (GgmlType::Q4_0, false),
            (GgmlType::Q4_1, false),
            (GgmlType::Q5_1, false),
            (GgmlType::Q4_0, true),
            (GgmlType::IQ4_NL, true),
            (GgmlType::MXFP4, true),
            (GgmlType::Q5_K, false),
            (GgmlType::Q3_K, false),
            (GgmlType::IQ4_XS, false),
            (GgmlType::Q2_K, true),
        ] {
            assert!(packed_types.contains(&want), "{want:?} not packed");
        }
    }
}

/// Packed F16 matrices (sixteen rows a register, chain by chain: a layout of their own, with
/// the values past the last 64-value step kept apart) give the row kernel's bits for row
/// lengths on both sides of the steps, with and without values left over, over odd row
/// counts, and for every pass shape of a batch (tokens 1..=17, 64 and 93); where this CPU
/// packs F16 at all.
#[test]
fn packed_float_matrices_are_bit_identical_to_the_row_kernel() {
    kernels_from_env();
    let mut rng = StdRng::seed_from_u64(9);
    for ty in [GgmlType::F16, GgmlType::BF16] {
        let row_kernel = synapse_quant::matrix_kernel(ty, false).unwrap();
        let mut packed = 0;
        for k in [1, 37, 64, 100, 128, 200, 576, 2048 + 37] {
            for rows in [16, 33, 50, 64] {
                // BF16: values at the edges of f32's range too (see `bf16_values`).
                let (odd, tiny) = (rows == 33, rows == 50);
                let w = match ty {
                    GgmlType::BF16 => bf16_values(&mut rng, rows * k, odd, tiny),
                    _ => random_weights(&mut rng, ty, rows * k),
                };
                let row_bytes = 2 * k;
                let Some(p) =
                    synapse_quant::pack_matrix(ty, false, &w, row_bytes, &|_| ()).unwrap()
                else {
                    continue;
                };
                packed += 1;
                assert_eq!(p.rows(), rows / 16 * 16);
                for n_tok in (1..=17).chain([64, 93]) {
                    let a = match ty {
                        GgmlType::BF16 => bf16_values(&mut rng, n_tok * k, odd, tiny),
                        _ => {
                            let x: Vec<f32> =
                                (0..n_tok * k).map(|_| rng.gen_range(-3.0..3.0)).collect();
                            quantize(ty, &x).unwrap()
                        }
                    };
                    let mut out = vec![f32::NAN; p.rows() * n_tok];
                    p.gemm(0..p.rows(), &a, n_tok, &mut out).unwrap();
                    for t in 0..n_tok {
                        for r in 0..p.rows() {
                            let want = (row_kernel.f)(
                                &w[r * row_bytes..(r + 1) * row_bytes],
                                &a[t * row_bytes..(t + 1) * row_bytes],
                            )
                            .unwrap();
                            assert_eq!(
                                out[t * p.rows() + r].to_bits(),
                                want.to_bits(),
                                "{ty} packed, {k} values: row {r} of {rows}, token {t} of {n_tok}"
                            );
                        }
                    }
                }
            }
        }
        #[cfg(target_arch = "x86_64")]
        if synapse_quant::kernel_isa() == "avx512vnni"
            && !synapse_quant::config().no_pack
            && (ty == GgmlType::F16 || std::arch::is_x86_feature_detected!("avx512bf16"))
        {
            assert_eq!(
                packed, 32,
                "AVX-512 packs every {ty} matrix of sixteen rows or more"
            );
        }
        eprintln!("{packed} packed {ty} matrices checked");
    }
}

/// A matrix large enough that packing splits it into pieces over the threads (about 1 MiB
/// each) gives the row kernel's bits in every row, and hands every packed row back once.
#[test]
fn packing_a_large_matrix_over_threads_keeps_every_row() {
    kernels_from_env();
    let mut rng = StdRng::seed_from_u64(8);
    for (ty, repacked) in [
        (GgmlType::Q8_0, false),
        (GgmlType::Q4_K, true),
        (GgmlType::F16, false),
    ] {
        let (rows, cols) = (1040, 2048);
        let w = random_weights(&mut rng, ty, rows * cols / ty.block_len());
        let row_bytes = w.len() / rows;
        let released = std::sync::Mutex::new(Vec::new());
        let release = |b: &[u8]| {
            released
                .lock()
                .unwrap()
                .push((b.as_ptr() as usize, b.len()))
        };
        let Some(p) = synapse_quant::pack_matrix(ty, repacked, &w, row_bytes, &release).unwrap()
        else {
            continue;
        };
        assert_eq!(p.rows(), rows);
        // Pieces handed back: disjoint, covering the matrix exactly, more than one.
        let mut pieces = released.into_inner().unwrap();
        pieces.sort();
        assert!(pieces.len() > 1, "{ty}: one piece");
        let mut at = w.as_ptr() as usize;
        for (start, len) in pieces {
            assert_eq!(start, at, "{ty}: pieces not contiguous");
            at += len;
        }
        assert_eq!(at, w.as_ptr() as usize + w.len());
        let act = vec_dot_type(ty).unwrap();
        let row_kernel = synapse_quant::matrix_kernel(ty, repacked).unwrap();
        let x: Vec<f32> = (0..2 * cols).map(|_| rng.gen_range(-3.0..3.0)).collect();
        let a = quantize(act, &x).unwrap();
        let act_bytes = a.len() / 2;
        let mut out = vec![f32::NAN; rows * 2];
        p.gemm(0..rows, &a, 2, &mut out).unwrap();
        for t in 0..2 {
            for r in 0..rows {
                let want = (row_kernel.f)(
                    &w[r * row_bytes..(r + 1) * row_bytes],
                    &a[t * act_bytes..(t + 1) * act_bytes],
                )
                .unwrap();
                assert_eq!(
                    out[t * rows + r].to_bits(),
                    want.to_bits(),
                    "{ty}: row {r}, token {t}"
                );
            }
        }
    }
}

/// The kernel configuration `scripts/test.sh` runs these tests under (`SYNAPSE_ISA=avx2`, ...),
/// set before any kernel is chosen.
fn kernels_from_env() {
    let (c, notes) = synapse_quant::KernelConfig::from_vars(|k| std::env::var(k).ok());
    assert!(notes.is_empty(), "{notes:?}");
    synapse_quant::configure(c).expect("one configuration for the whole test binary");
}

/// An MXFP4 matrix with a scale no F16 holds (beyond 2^15 or below 2^-24) stays unpacked: the
/// packed kernels widen F16 scales, and an inexact one would change the bits. A block of zero
/// levels is packed whatever its scale.
#[test]
fn mxfp4_scales_out_of_f16s_range_stay_unpacked() {
    kernels_from_env();
    let mut rng = StdRng::seed_from_u64(9);
    let (rows, per_row) = (16, 9);
    let row_bytes = per_row * 17;
    let ok = random_weights(&mut rng, GgmlType::MXFP4, rows * per_row);
    let release = |_: &[u8]| {};
    let packs = |w: &[u8]| {
        synapse_quant::pack_matrix(GgmlType::MXFP4, true, w, row_bytes, &release)
            .unwrap()
            .is_some()
    };
    if !packs(&ok) {
        eprintln!("this CPU or configuration packs no MXFP4 matrix: nothing to decline");
        return;
    }
    for e in [0u8, 103, 144, 254] {
        let mut w = ok.clone();
        w[5 * 17] = e;
        assert!(!packs(&w), "exponent {e} packed");
        // Zero levels (nibbles 0 and 8): any exponent.
        w[5 * 17 + 1..6 * 17].copy_from_slice(&[0x80; 16]);
        assert!(packs(&w), "a block of zeros with exponent {e} not packed");
    }
}
