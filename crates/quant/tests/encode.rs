//! The file quantizers against ggml's: `encode.gguf` holds rows of floats and the bytes
//! `ggml_quantize_chunk` (what llama-quantize calls) wrote for them in every type, with and
//! without an importance vector (`scripts/golden/encode_fixtures.py`). Also the rows the
//! format fixtures were quantized from by llama-quantize itself (`fmt_<TYPE>.gguf`, their sources in `fmt_<TYPE>.f32.gguf`).

use std::path::PathBuf;

use synapse_gguf::{GgmlType, GgufFile};
use synapse_quant::encode::{quantize_rows, uses_importance, ENCODABLE};

fn open(name: &str) -> GgufFile {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data")
        .join(name);
    GgufFile::open(&path).unwrap_or_else(|e| panic!("{name}: {e}"))
}

fn floats(f: &GgufFile, name: &str) -> (Vec<f32>, usize) {
    let t = f.tensor(name).unwrap_or_else(|e| panic!("{name}: {e}"));
    assert_eq!(t.info.ggml_type, GgmlType::F32, "{name}");
    let x = t
        .data
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()));
    (x.collect(), t.info.shape[0] as usize)
}

/// Panics naming the first differing row and block of `ours` against `want`.
fn assert_same(what: &str, ty: GgmlType, n_per_row: usize, ours: &[u8], want: &[u8]) {
    assert_eq!(ours.len(), want.len(), "{what}: lengths");
    let row_bytes = n_per_row / ty.block_len() * ty.block_bytes();
    if let Some(i) = ours.iter().zip(want).position(|(a, b)| a != b) {
        let (row, at) = (i / row_bytes, i % row_bytes);
        let block = at / ty.block_bytes();
        let range = row * row_bytes + block * ty.block_bytes();
        panic!(
            "{what}: row {row}, block {block} (byte {} of it) differs\n ours: {:02x?}\n ggml: {:02x?}",
            at % ty.block_bytes(),
            &ours[range..range + ty.block_bytes()],
            &want[range..range + ty.block_bytes()],
        );
    }
}

#[test]
fn every_type_encodes_as_ggml_does() {
    let f = open("encode.gguf");
    let (x, cols) = floats(&f, "x");
    let (importance, _) = floats(&f, "importance");
    let mut checked = 0;
    for &ty in ENCODABLE {
        for (label, qw) in [("plain", None), ("weighted", Some(importance.as_slice()))] {
            let name = format!("{label}.{}", ty.name());
            let want = match f.tensor(&name) {
                Ok(t) => t.data,
                Err(_) if qw.is_some() && !uses_importance(ty) => {
                    f.tensor(&format!("plain.{}", ty.name())).unwrap().data
                }
                Err(e) => panic!("{name}: {e}"),
            };
            let mut ours = vec![0u8; want.len()];
            quantize_rows(ty, &x, cols, qw, &mut ours).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_same(&name, ty, cols, &ours, want);
            checked += 1;
        }
    }
    assert_eq!(checked, 2 * ENCODABLE.len());
}

/// The same bytes when the matrix is encoded one row at a time (the quantize command splits
/// matrices across threads by rows).
#[test]
fn rows_encode_independently() {
    let f = open("encode.gguf");
    let (x, cols) = floats(&f, "x");
    let (importance, _) = floats(&f, "importance");
    for &ty in ENCODABLE {
        let row_bytes = cols / ty.block_len() * ty.block_bytes();
        let rows = x.len() / cols;
        let mut whole = vec![0u8; rows * row_bytes];
        quantize_rows(ty, &x, cols, Some(&importance), &mut whole).unwrap();
        for r in 0..rows {
            let mut one = vec![0u8; row_bytes];
            quantize_rows(
                ty,
                &x[r * cols..][..cols],
                cols,
                Some(&importance),
                &mut one,
            )
            .unwrap();
            assert_eq!(one, whole[r * row_bytes..][..row_bytes], "{ty} row {r}");
        }
    }
}

/// llama-quantize's own output for the format fixtures' source rows (`--pure`, no imatrix).
#[test]
fn format_fixtures_reencode_as_llama_quantize_wrote_them() {
    let mut checked = 0;
    for &ty in ENCODABLE.iter().filter(|&&t| t != GgmlType::F32) {
        let fixture = format!("fmt_{}.gguf", ty.name());
        let f = open(&fixture);
        let sources = open(&format!("fmt_{}.f32.gguf", ty.name()));
        for t in f.tensors().filter(|t| t.info.ggml_type == ty) {
            let Ok(src) = sources.tensor(&format!("{}.src", t.info.name)) else {
                continue;
            };
            let x: Vec<f32> = src
                .data
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
                .collect();
            let want = t.data;
            let cols = t.info.shape[0] as usize;
            let mut ours = vec![0u8; want.len()];
            quantize_rows(ty, &x, cols, None, &mut ours).unwrap();
            assert_same(&format!("{fixture} {}", t.info.name), ty, cols, &ours, want);
            checked += 1;
        }
    }
    assert!(checked >= 14, "only {checked} fixture tensors re-encoded");
}

#[test]
fn bad_shapes_are_errors() {
    let x = vec![0.5f32; 512];
    let mut out = vec![0u8; 2 * 144];
    // 256-value super-blocks: a 128-column row is not whole blocks.
    assert!(quantize_rows(GgmlType::Q4_K, &x, 128, None, &mut out).is_err());
    // Wrong output length, wrong importance length.
    assert!(quantize_rows(GgmlType::Q4_K, &x, 512, None, &mut out[..100]).is_err());
    assert!(quantize_rows(GgmlType::Q4_K, &x, 256, Some(&[1.0; 100]), &mut out).is_err());
    // A type with no file quantizer.
    assert!(quantize_rows(GgmlType::Q8_K, &x, 256, None, &mut out).is_err());
    quantize_rows(GgmlType::Q4_K, &x, 256, Some(&[1.0; 256]), &mut out).unwrap();
}

/// Weights no model should hold (NaN, infinities, the largest finite values, subnormals) and
/// hostile importance (negative, NaN, infinite) give bytes, not a panic or an overflow.
#[test]
fn hostile_values_encode_without_panicking() {
    let specials = [
        f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE / 8.0,
        -0.0,
        1e30,
        -3e-39,
    ];
    let cols = 512;
    let mut rows = Vec::new();
    for (k, &s) in specials.iter().enumerate() {
        // The special value alone, then mixed into ordinary values at a few places.
        rows.extend(std::iter::repeat_n(s, cols));
        rows.extend((0..cols).map(|i| {
            if i % (k + 3) == 0 {
                s
            } else {
                (i as f32 * 0.37).sin()
            }
        }));
    }
    let importance: Vec<f32> = (0..cols)
        .map(|i| [1.0, -2.0, f32::NAN, f32::INFINITY, 0.0][i % 5])
        .collect();
    for &ty in ENCODABLE {
        let mut out = vec![0u8; rows.len() / ty.block_len() * ty.block_bytes()];
        quantize_rows(ty, &rows, cols, None, &mut out).unwrap();
        quantize_rows(ty, &rows, cols, Some(&importance), &mut out).unwrap();
    }
}

/// What llama-quantize refuses to write, [`check_finite`] finds: in every type with f16 scales,
/// an infinite weight or one past f16's range makes a non-finite scale; a finite row passes.
/// (MXFP4's E8M0 exponent reaches every f32 magnitude: ggml writes a block of an infinite
/// weight with exponent 0 and level 0, as synapse does, and checks only for E8M0's NaN.)
#[test]
fn non_finite_output_is_found() {
    use synapse_quant::encode::check_finite;
    let cols = 256;
    for &ty in ENCODABLE {
        let row: Vec<f32> = (0..cols).map(|i| (i as f32 * 0.1).cos()).collect();
        let mut out = vec![0u8; cols / ty.block_len() * ty.block_bytes()];
        quantize_rows(ty, &row, cols, None, &mut out).unwrap();
        check_finite(ty, &out).unwrap();
        if ty == GgmlType::MXFP4 {
            let mut bad = row.clone();
            bad[40] = f32::INFINITY;
            quantize_rows(ty, &bad, cols, None, &mut out).unwrap();
            assert_eq!(out[17], 0, "the exponent of the infinite weight's block");
            out[0] = 0xFF;
            assert!(check_finite(ty, &out).is_err());
            continue;
        }
        let caught = [f32::INFINITY, 1e9].iter().any(|&poison| {
            let mut bad = row.clone();
            bad[40] = poison;
            quantize_rows(ty, &bad, cols, None, &mut out).unwrap();
            check_finite(ty, &out).is_err()
        });
        assert!(caught, "{ty}: no poisoned row was caught");
    }
}
