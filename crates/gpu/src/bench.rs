//! Measurements for `synapse-dev bench-gpu` (bench/gpu.sh): the device's read bandwidth, and
//! each format's matrix-vector product with its weights cold (rotated through copies that
//! together dwarf the GPU's last-level cache), as bytes read per second.

use std::time::Instant;

use synapse_gguf::GgmlType;

use crate::ops::Op;
use crate::program::Pass;
use crate::{Gpu, GpuError};

/// Seconds per round of `rounds` submissions of `record`, waited for; the median round.
fn time(
    gpu: &Gpu,
    rounds: usize,
    mut record: impl FnMut(&mut wgpu::CommandEncoder) -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    let mut once = || -> Result<f64, GpuError> {
        let mut enc = gpu.encoder();
        record(&mut enc)?;
        let t = Instant::now();
        gpu.submit(enc);
        gpu.finish()?;
        Ok(t.elapsed().as_secs_f64())
    };
    once()?;
    let mut times: Vec<f64> = (0..rounds).map(|_| once()).collect::<Result<_, _>>()?;
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// GB/s of reading a buffer of `bytes` (rounded down to 16-byte vectors), `passes` passes per
/// submission.
pub fn read_bandwidth(gpu: &Gpu, bytes: usize, passes: usize) -> Result<f64, GpuError> {
    let n = bytes / 16;
    let src = gpu.buffer(4 * n)?;
    let threads = 256 * 1024;
    let sink = gpu.buffer(threads)?;
    let secs = time(gpu, 5, |enc| {
        let mut pass = Pass::default();
        for _ in 0..passes {
            gpu.dispatch(
                &mut pass,
                Op::Read,
                &[src.raw(), sink.raw()],
                &[n as u32, threads as u32, 0, 0],
                ((threads / 256) as u32, 1, 1),
            )?;
        }
        gpu.record_once(enc, &pass);
        Ok(())
    })?;
    Ok((16 * n * passes) as f64 / secs / 1e9)
}

/// GB/s of weights read by the product of a `rows` x `cols` matrix of `ty` (random bytes with
/// finite scales) and one token, each dispatch on the next of as many copies as make up
/// `cold_bytes`, `per_round` dispatches per submission.
pub fn matvec_bandwidth(
    gpu: &Gpu,
    ty: GgmlType,
    (rows, cols): (usize, usize),
    cold_bytes: usize,
    per_round: usize,
) -> Result<f64, GpuError> {
    let row_bytes = cols / ty.block_len() * ty.block_bytes();
    let bytes = random_blocks(ty, rows * row_bytes / ty.block_bytes());
    let copies = cold_bytes.div_ceil(bytes.len()).max(1);
    let matrices: Vec<_> = (0..copies)
        .map(|i| gpu.upload_matrix(&format!("bench.{i}"), ty, rows, cols, &bytes))
        .collect::<Result<_, _>>()?;
    let x = gpu.upload(&vec![1.0; cols])?;
    let y = gpu.buffer(rows)?;
    let mut next = 0;
    let secs = time(gpu, 5, |enc| {
        for _ in 0..per_round {
            gpu.encode_matmul(enc, &matrices[next % copies], &x, &y, 1)?;
            next += 1;
        }
        Ok(())
    })?;
    Ok((bytes.len() * per_round) as f64 / secs / 1e9)
}

/// `blocks` blocks of `ty` of random bits, each half-precision scale set to a small finite
/// value (what the kernels read is what a real file's blocks hold: only the speed matters).
fn random_blocks(ty: GgmlType, blocks: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut bytes: Vec<u8> = (0..blocks * ty.block_bytes())
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect();
    // Every f16 in a block may be a scale: 0x2c00 is 1/16. For the float types, every value.
    let halves: &[usize] = match ty {
        GgmlType::F16 | GgmlType::BF16 | GgmlType::F32 => &[],
        GgmlType::Q6_K => &[208],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        _ => &[0],
    };
    for block in bytes.chunks_exact_mut(ty.block_bytes()) {
        for &h in halves {
            block[h..h + 2].copy_from_slice(&0x2c00u16.to_le_bytes());
        }
        if matches!(ty, GgmlType::F16 | GgmlType::BF16) {
            for v in block.chunks_exact_mut(2) {
                v[1] &= 0x3f;
            }
        }
        if ty == GgmlType::F32 {
            for v in block.chunks_exact_mut(4) {
                v[3] &= 0x3f;
            }
        }
    }
    bytes
}
