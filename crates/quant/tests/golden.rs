//! synapse's reference codecs against golden data from the format's published references:
//! the `gguf` Python package's dequantizers and ggml's own quantizers and dot products.
//! The fixtures and how they were made: `scripts/golden/quant_fixtures.py`.

use std::path::PathBuf;

use synapse_gguf::{GgmlType, GgufFile};
use synapse_quant::{dequantize, quantize, vec_dot};

fn data(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name)
}

fn open(name: &str) -> GgufFile {
    GgufFile::open(data(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn floats(f: &GgufFile, name: &str) -> Vec<f32> {
    let t = f.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(t.info.ggml_type, GgmlType::F32);
    t.data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Every quantized tensor of `fixture` decodes to exactly the floats in its `.f32` twin.
/// Returns the types seen.
fn check_dequantize_exact(fixture: &str) -> Vec<GgmlType> {
    let q = open(&format!("{fixture}.gguf"));
    let g = open(&format!("{fixture}.f32.gguf"));
    let mut types = Vec::new();
    for t in q.tensors() {
        let got = dequantize(t.info.ggml_type, t.data).unwrap();
        let want = floats(&g, &t.info.name);
        assert_eq!(got.len(), want.len(), "{fixture}: {}", t.info.name);
        for (i, (a, b)) in got.iter().zip(&want).enumerate() {
            assert!(
                a.to_bits() == b.to_bits(),
                "{fixture}: {} ({}) value {i}: synapse {a:e}, reference {b:e}",
                t.info.name,
                t.info.ggml_type
            );
        }
        types.push(t.info.ggml_type);
    }
    types
}

#[test]
fn real_model_blocks_dequantize_exactly() {
    kernels_from_env();
    let mut seen = check_dequantize_exact("real_smollm2");
    seen.extend(check_dequantize_exact("real_gemma3"));
    for ty in [
        GgmlType::Q4_1,
        GgmlType::Q8_0,
        GgmlType::Q4_K,
        GgmlType::Q6_K,
        GgmlType::Q5_0,
    ] {
        assert!(seen.contains(&ty), "no real {ty} blocks in the fixtures");
    }
}

/// Every format synapse decodes has a fixture from llama-quantize (or, for the activation
/// formats, ggml's reference quantizer).
const FORMATS: &[GgmlType] = &[
    GgmlType::F16,
    GgmlType::BF16,
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::Q8_1,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::Q8_K,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::MXFP4,
];

#[test]
fn every_format_dequantizes_exactly() {
    kernels_from_env();
    for &ty in FORMATS {
        let seen = check_dequantize_exact(&format!("fmt_{}", ty.name()));
        assert!(
            !seen.is_empty() && seen.iter().all(|&t| t == ty),
            "fmt_{ty}: {seen:?}"
        );
    }
    // And every type with a codec is covered here or is F32.
    for ty in synapse_quant::supported_types() {
        assert!(
            ty == GgmlType::F32 || FORMATS.contains(&ty),
            "{ty} has no golden fixture"
        );
    }
}

/// Round-trip error budget: RMS error of (quantize by llama.cpp, decode by synapse) relative to
/// the RMS of the source weights, per format. The budgets are a little above what each format's
/// bits per weight give on these weights; a decoder that mixed up values would blow them.
#[test]
fn round_trip_error_within_budget() {
    kernels_from_env();
    // Observed maxima over these rows (2026-11-30) in comments; budgets about 1.2x those.
    let budget = |ty: GgmlType| match ty {
        GgmlType::F16 => 3e-4,                                          // 0.00022
        GgmlType::BF16 => 2.5e-3,                                       // 0.0019
        GgmlType::Q8_0 | GgmlType::Q8_1 | GgmlType::Q8_K => 1e-2,       // 0.0060-0.0078
        GgmlType::Q6_K => 2.5e-2,                                       // 0.0205
        GgmlType::Q5_1 | GgmlType::Q5_K => 5.5e-2,                      // 0.045, 0.042
        GgmlType::Q5_0 => 7.5e-2,                                       // 0.061
        GgmlType::Q4_1 | GgmlType::Q4_K => 1.05e-1,                     // 0.087, 0.085
        GgmlType::Q4_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => 1.3e-1, // 0.106, 0.098, 0.099
        GgmlType::Q3_K => 2.3e-1,                                       // 0.189
        GgmlType::Q2_K => 4e-1,                                         // 0.327
        GgmlType::MXFP4 => 1.65e-1,                                     // 0.136
        _ => unreachable!(),
    };
    for &ty in FORMATS {
        let fixture = format!("fmt_{}", ty.name());
        let q = open(&format!("{fixture}.gguf"));
        let g = open(&format!("{fixture}.f32.gguf"));
        for t in q.tensors() {
            let got = dequantize(ty, t.data).unwrap();
            let src = floats(&g, &format!("{}.src", t.info.name));
            let row = t.info.row_len() as usize;
            // Rows differ in scale by e^4; measure each row against itself.
            for (r, (a, b)) in got.chunks(row).zip(src.chunks(row)).enumerate() {
                let err: f64 = a.iter().zip(b).map(|(x, y)| ((x - y) as f64).powi(2)).sum();
                let rms: f64 = b.iter().map(|y| (*y as f64).powi(2)).sum();
                let rel = (err / rms).sqrt();
                assert!(
                    rel < budget(ty),
                    "{fixture} {} row {r}: relative RMS error {rel:.4}",
                    t.info.name
                );
                assert!(
                    rel > 0.0 || ty == GgmlType::F16,
                    "{fixture}: lossless? {rel}"
                );
            }
        }
    }
}

#[test]
fn activation_quantizers_match_ggml_bit_for_bit() {
    kernels_from_env();
    let f = open("act.gguf");
    let x = floats(&f, "x");
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
        let want = f.tensor(&format!("x.{}", ty.name())).unwrap();
        let row = want.info.row_len() as usize;
        let row_bytes = ty.bytes_for(row as u64).unwrap() as usize;
        for (r, (xr, wr)) in x.chunks(row).zip(want.data.chunks(row_bytes)).enumerate() {
            let got = quantize(ty, xr).unwrap();
            if got != wr {
                let first = got.iter().zip(wr).position(|(a, b)| a != b).unwrap();
                panic!(
                    "{ty} row {r}: first differing byte {first}: synapse {} ggml {}",
                    got[first], wr[first]
                );
            }
        }
    }
}

/// At inference llama.cpp quantizes activations with ggml-cpu's (vectorised) quantizers, which
/// round differently from the reference ones now and then; synapse's `quantize_act_row` must
/// match those byte for byte.
#[test]
fn runtime_activation_quantizers_match_ggml_cpu_bit_for_bit() {
    kernels_from_env();
    let f = open("act.gguf");
    let x = floats(&f, "x");
    for ty in [GgmlType::Q8_0, GgmlType::Q8_1, GgmlType::Q8_K] {
        let want = f.tensor(&format!("x.{}.cpu", ty.name())).unwrap();
        let row = want.info.row_len() as usize;
        let row_bytes = ty.bytes_for(row as u64).unwrap() as usize;
        for (r, (xr, wr)) in x.chunks(row).zip(want.data.chunks(row_bytes)).enumerate() {
            let mut got = vec![0u8; row_bytes];
            synapse_quant::quantize_act_row(ty, xr, &mut got).unwrap();
            assert!(got == wr, "{ty} row {r}: differs from ggml-cpu's quantizer");
            // The quantizer the engine runs (compiled for this CPU's vector features).
            let mut fast = vec![0u8; row_bytes];
            synapse_quant::act_quantizer(ty).unwrap()(xr, &mut fast).unwrap();
            assert!(
                fast == wr,
                "{ty} row {r}: the runtime kernel differs from ggml-cpu's"
            );
        }
    }
    // The fixture does exercise a difference between the two for Q8_0/Q8_1 (row 2 holds ties).
    let differ = [GgmlType::Q8_0, GgmlType::Q8_1].iter().any(|ty| {
        f.tensor(&format!("x.{}", ty.name())).unwrap().data
            != f.tensor(&format!("x.{}.cpu", ty.name())).unwrap().data
    });
    assert!(
        differ,
        "the fixture no longer tells the two quantizers apart"
    );
}

#[test]
fn dot_products_match_ggml() {
    kernels_from_env();
    let f = open("dot.gguf");
    let mut n = 0;
    for t in f.tensors().filter(|t| t.info.name.ends_with(".w")) {
        let tag = t.info.name.trim_end_matches(".w");
        let a = f.tensor(&format!("{tag}.a")).unwrap();
        let want = floats(&f, &format!("{tag}.dot"));
        let ty = t.info.ggml_type;
        // The float formats were stored with F32 activations; the others in their dot type.
        // F16 and BF16 dot with activations of their own type (as llama.cpp): round them, as
        // its runtime does.
        let act: Vec<u8> = if matches!(ty, GgmlType::F16 | GgmlType::BF16) {
            let x = dequantize(a.info.ggml_type, a.data).unwrap();
            synapse_quant::quantize(ty, &x).unwrap()
        } else {
            a.data.to_vec()
        };
        let row_bytes = t.data.len() / want.len();
        let deq = dequantize(ty, t.data).unwrap();
        let act_f = dequantize(a.info.ggml_type, &act).unwrap();
        for (r, (w, &expected)) in t.data.chunks(row_bytes).zip(&want).enumerate() {
            let got = vec_dot(ty, w, &act).unwrap();
            // ggml's SIMD kernels sum in another order: allow float re-association error,
            // relative to the sum of the magnitudes of the terms.
            let row = &deq[r * act_f.len()..(r + 1) * act_f.len()];
            let scale: f32 = row.iter().zip(&act_f).map(|(p, q)| (p * q).abs()).sum();
            // These formats follow ggml's x86 summation order: equal to the bit.
            let exact = matches!(
                ty,
                GgmlType::Q4_0
                    | GgmlType::Q4_1
                    | GgmlType::Q5_0
                    | GgmlType::Q5_1
                    | GgmlType::Q8_0
                    | GgmlType::Q6_K
                    | GgmlType::Q4_K
                    | GgmlType::Q5_K
                    | GgmlType::Q2_K
                    | GgmlType::Q3_K
                    | GgmlType::IQ4_XS
                    | GgmlType::IQ4_NL
                    | GgmlType::MXFP4
            );
            // The golden F16 and BF16 dots are float64 dots with the F32 activations: rounding
            // those to F16 (BF16) moves each term by at most 2^-11 (2^-8) of its size.
            let tol = match ty {
                _ if exact => 0.0,
                GgmlType::F16 => (2f32.powi(-11) + 2e-5) * scale + 1e-30,
                GgmlType::BF16 => (2f32.powi(-8) + 2e-5) * scale + 1e-30,
                _ => 2e-5 * scale + 1e-30,
            };
            assert!(
                (got - expected).abs() <= tol,
                "{tag} row {r}: synapse {got:e}, ggml {expected:e}, tolerance {tol:e}"
            );
            n += 1;
        }
    }
    assert!(n >= 14 * 2 * 6, "only {n} dot products checked");
}

/// The kernel configuration `scripts/test.sh` runs these tests under (`SYNAPSE_ISA=avx2`, ...),
/// set before any kernel is chosen.
fn kernels_from_env() {
    let (c, notes) = synapse_quant::KernelConfig::from_vars(|k| std::env::var(k).ok());
    assert!(notes.is_empty(), "{notes:?}");
    synapse_quant::configure(c).expect("one configuration for the whole test binary");
}
