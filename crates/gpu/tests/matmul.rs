//! Every GPU matmul kernel against synapse's reference decoders, and the contracts: the same
//! bits for any number of tokens (G1) and from run to run. On a machine without a GPU these run
//! on Mesa's lavapipe (scripts/test.sh installs it and runs them at two subgroup widths); with
//! no adapter at all they fail, saying how to get one.

use rand::{rngs::StdRng, Rng, SeedableRng};
use synapse_gguf::GgmlType;
use synapse_gpu::{supported_types, Gpu, GpuError, GpuOptions, Matrix, TOKEN_TILE};

fn gpu() -> Gpu {
    match Gpu::new(&GpuOptions::default()) {
        Ok(g) => {
            eprintln!("GPU: {}", g.info());
            g
        }
        Err(e) => panic!("{e}"),
    }
}

/// A row length with a partial last step: 2.5 steps of 256 values for the 32-value formats and
/// floats, 3 blocks for the 256-value ones.
fn cols_for(ty: GgmlType) -> usize {
    if ty.block_len() == 256 {
        768
    } else {
        640
    }
}

fn normal(rng: &mut StdRng) -> f32 {
    // Box-Muller: weights with outliers, as trained matrices have.
    let (u, v): (f32, f32) = (rng.gen_range(1e-7..1.0), rng.gen());
    (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
}

/// A random matrix in `ty` and its reference decoding.
fn matrix(gpu: &Gpu, ty: GgmlType, rows: usize, cols: usize, seed: u64) -> (Matrix, Vec<f32>) {
    let mut rng = StdRng::seed_from_u64(seed);
    let src: Vec<f32> = (0..rows * cols).map(|_| normal(&mut rng)).collect();
    let mut bytes = vec![0u8; rows * cols / ty.block_len() * ty.block_bytes()];
    synapse_quant::encode::quantize_rows(ty, &src, cols, None, &mut bytes).unwrap();
    let reference = synapse_quant::dequantize(ty, &bytes).unwrap();
    let m = gpu
        .upload_matrix(&format!("w.{ty}"), ty, rows, cols, &bytes)
        .unwrap();
    (m, reference)
}

fn activations(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n).map(|_| normal(&mut rng)).collect()
}

/// Formats whose reference decoder is a product alone: the GPU's decode is then exact. The
/// others subtract or add a min, which the GPU fuses (`fma`), one rounding instead of two.
fn decodes_exactly(ty: GgmlType) -> bool {
    !matches!(
        ty,
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q2_K | GgmlType::Q4_K | GgmlType::Q5_K
    )
}

#[test]
fn every_format_decodes_as_the_reference() {
    // Multiplying by the identity reads the decoded weights back: y[t][r] = W[r][t], since
    // fma(1, w, 0) = w and fma(0, w, a) = a (a zero weight's sign is lost: -0 + 0 = +0).
    let gpu = gpu();
    for ty in supported_types() {
        let (rows, cols) = (5, cols_for(ty));
        let (m, reference) = matrix(&gpu, ty, rows, cols, 1);
        let mut eye = vec![0f32; cols * cols];
        for t in 0..cols {
            eye[t * cols + t] = 1.0;
        }
        let y = gpu.matmul(&m, &eye, cols).unwrap();
        let scale = reference.iter().fold(0f32, |a, w| a.max(w.abs()));
        for r in 0..rows {
            for c in 0..cols {
                let (got, want) = (y[c * rows + r], reference[r * cols + c]);
                let ok = if decodes_exactly(ty) {
                    got.to_bits() == want.to_bits() || (got == 0.0 && want == 0.0)
                } else {
                    (got - want).abs() <= scale * 2.0f32.powi(-21)
                };
                assert!(
                    ok,
                    "{ty}: weight ({r}, {c}) decodes to {got}, reference {want}"
                );
            }
        }
    }
}

#[test]
fn every_format_multiplies_as_the_reference() {
    let gpu = gpu();
    for ty in supported_types() {
        let (rows, cols) = (37, cols_for(ty));
        let (m, w) = matrix(&gpu, ty, rows, cols, 2);
        let tokens = 3;
        let x = activations(tokens * cols, 3);
        let y = gpu.matmul(&m, &x, tokens).unwrap();
        for t in 0..tokens {
            for r in 0..rows {
                let (mut dot, mut mag) = (0f64, 0f64);
                for c in 0..cols {
                    let p = f64::from(w[r * cols + c]) * f64::from(x[t * cols + c]);
                    dot += p;
                    mag += p.abs();
                }
                let got = f64::from(y[t * rows + r]);
                assert!(
                    (got - dot).abs() <= 1e-5 * mag,
                    "{ty}: token {t} row {r}: {got}, reference {dot} (sum of |terms| {mag})"
                );
            }
        }
    }
}

#[test]
fn any_number_of_tokens_gives_the_same_bits() {
    // G1: a batch of n tokens, cut into tiles of TOKEN_TILE with a partial last one, gives each
    // token the bits it gets alone; and a second run gives the same bits again.
    let gpu = gpu();
    for ty in supported_types() {
        let (rows, cols) = (9, cols_for(ty));
        let (m, _) = matrix(&gpu, ty, rows, cols, 4);
        let n = 2 * TOKEN_TILE as usize + 3;
        let x = activations(n * cols, 5);
        let alone: Vec<Vec<f32>> = (0..n)
            .map(|t| gpu.matmul(&m, &x[t * cols..(t + 1) * cols], 1).unwrap())
            .collect();
        for batch in [1, 7, TOKEN_TILE as usize, n] {
            for start in (0..n).step_by(batch) {
                let count = batch.min(n - start);
                let y = gpu
                    .matmul(&m, &x[start * cols..(start + count) * cols], count)
                    .unwrap();
                for t in 0..count {
                    let got = &y[t * rows..(t + 1) * rows];
                    let want = &alone[start + t];
                    assert!(
                        got.iter()
                            .zip(want)
                            .all(|(a, b)| a.to_bits() == b.to_bits()),
                        "{ty}: token {} in a batch of {count} differs from alone",
                        start + t
                    );
                }
            }
        }
        let again = gpu.matmul(&m, &x[..cols], 1).unwrap();
        assert!(again
            .iter()
            .zip(&alone[0])
            .all(|(a, b)| a.to_bits() == b.to_bits()));
    }
}

#[test]
fn more_rows_than_one_grid_dimension_holds() {
    // 4 * 65535 + 5 rows: the workgroups fold into a second grid dimension.
    let gpu = gpu();
    let ty = GgmlType::Q8_0;
    let (rows, cols) = (4 * 65535 + 5, 32);
    let (m, w) = matrix(&gpu, ty, rows, cols, 6);
    let x = activations(cols, 7);
    let y = gpu.matmul(&m, &x, 1).unwrap();
    for r in (0..rows).step_by(4099).chain(rows - 8..rows) {
        let dot: f64 = (0..cols)
            .map(|c| f64::from(w[r * cols + c]) * f64::from(x[c]))
            .sum();
        assert!(
            (f64::from(y[r]) - dot).abs() < 1e-4,
            "row {r}: {} vs {dot}",
            y[r]
        );
    }
}

#[test]
fn bad_shapes_are_errors() {
    let gpu = gpu();
    let err = gpu
        .upload_matrix("w", GgmlType::Q4_K, 2, 256, &[0; 100])
        .unwrap_err();
    assert!(matches!(err, GpuError::Shape { .. }), "{err}");
    assert!(err.to_string().contains("288 expected"), "{err}");
    let err = gpu
        .upload_matrix("w", GgmlType::F16, 1, 48, &[0; 96])
        .unwrap_err();
    assert!(err.to_string().contains("multiple of 32"), "{err}");
    let err = gpu
        .upload_matrix("w", GgmlType::Q8_1, 1, 32, &[0; 36])
        .unwrap_err();
    assert_eq!(err, GpuError::Unsupported { ty: GgmlType::Q8_1 });
    let m = gpu
        .upload_matrix("w", GgmlType::Q8_0, 2, 32, &[0; 68])
        .unwrap();
    let err = gpu.matmul(&m, &[0.0; 33], 2).unwrap_err();
    assert!(err.to_string().contains("need 64 inputs"), "{err}");
    let err = Gpu::new(&GpuOptions {
        adapter: Some("no such adapter".into()),
    })
    .err()
    .unwrap();
    assert!(matches!(err, GpuError::AdapterNotFound { .. }), "{err}");
}
