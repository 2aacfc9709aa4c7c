//! Causal grouped-query attention of one token over the positions in the KV cache.
//!
//! A token attends to positions `0..n_pos` in the same order whether it came alone (decode) or in
//! a batch (prefill): the batch's keys and values are stored first, then each token reads its own
//! causal prefix. So a token's result does not depend on its batch (G1).

use half::f16;
use half::slice::HalfFloatSliceExt;

pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Multiplies `q . k` before the softmax (`1 / sqrt(head_dim)` unless the model says).
    pub scale: f32,
}

/// Largest head dimension [`attend`] supports (Gemma's 256 with room to spare).
pub const MAX_HEAD_DIM: usize = 512;

/// `out (n_head * head_dim) = softmax(scale * q k^T) v`, over positions `0..n_pos`.
/// `keys`, `values` are `(n_pos, n_head_kv * head_dim)`.
///
/// The numerics are those of ggml's CPU flash attention, which llama.cpp uses by default, so
/// that logits agree with llama.cpp's closely: the query is rounded to F16 for the `q . k` dot,
/// the softmax is computed online (running maximum `M` and sum `S`), and the weighted sum of
/// values is accumulated in an F16 vector, rescaled whenever the maximum grows. Matching that
/// rounding halves the KL divergence to llama.cpp against an all-f32 attention (measured on
/// SmolLM2: see the forward tests).
#[inline(always)]
pub fn attend(
    s: &AttnShape,
    q: &[f32],
    keys: &[f16],
    values: &[f16],
    n_pos: usize,
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let kv_dim = s.n_head_kv * hd;
    let group = s.n_head / s.n_head_kv;
    // F16 values are held as f32 (exactly) and converted a row at a time, which the `half`
    // crate vectorises; rounding to F16 is a round trip through an F16 buffer.
    let mut h16 = [f16::ZERO; MAX_HEAD_DIM];
    let mut qf = [0.0f32; MAX_HEAD_DIM];
    let mut acc = [0.0f32; MAX_HEAD_DIM];
    let mut row = [0.0f32; MAX_HEAD_DIM];
    let round_f16 = |x: &mut [f32], h16: &mut [f16]| {
        h16.convert_from_f32_slice(x);
        h16.convert_to_f32_slice(x);
    };
    for h in 0..s.n_head {
        let (qf, acc, row, h16) = (
            &mut qf[..hd],
            &mut acc[..hd],
            &mut row[..hd],
            &mut h16[..hd],
        );
        qf.copy_from_slice(&q[h * hd..(h + 1) * hd]);
        round_f16(qf, h16);
        acc.fill(0.0);
        let off = (h / group) * hd;
        let (mut m, mut sum) = (f32::NEG_INFINITY, 0.0f32);
        for j in 0..n_pos {
            keys[j * kv_dim + off..j * kv_dim + off + hd].convert_to_f32_slice(row);
            let sc = dot_f16(qf, row) * s.scale;
            let (mut ms, mut vs) = (1.0f32, 1.0f32);
            if sc > m {
                let m_old = m;
                m = sc;
                ms = (m_old - m).exp();
                acc.iter_mut().for_each(|a| *a *= ms);
                round_f16(acc, h16);
            } else {
                vs = (sc - m).exp();
            }
            values[j * kv_dim + off..j * kv_dim + off + hd].convert_to_f32_slice(row);
            // A fused multiply-add in f32, then rounded to F16, as ggml's does.
            for (a, &x) in acc.iter_mut().zip(row.iter()) {
                *a = x.mul_add(vs, *a);
            }
            round_f16(acc, h16);
            // ggml's C is compiled with contraction: this is one fused multiply-add there.
            sum = sum.mul_add(ms, vs);
        }
        let inv = if sum == 0.0 { 0.0 } else { 1.0 / sum };
        for (o, a) in out[h * hd..(h + 1) * hd].iter_mut().zip(acc.iter()) {
            *o = a * inv;
        }
    }
}

/// `q . k` of F16 values (held in f32) in the order of ggml's AVX-512 `ggml_vec_dot_f16` (the build the
/// golden data comes from): four 16-lane accumulators over 64-value steps, fused multiply-adds,
/// the accumulators added pairwise, the lanes reduced by halves, the tail added in f64.
/// Products of two F16 values are exact in f32, so only this order decides the rounding.
#[inline(always)]
fn dot_f16(q: &[f32], k: &[f32]) -> f32 {
    let n = q.len();
    let np = n & !63;
    let mut acc = [[0.0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, a) in lanes.iter_mut().enumerate() {
                let e = i + 16 * j + l;
                *a = q[e].mul_add(k[e], *a);
            }
        }
    }
    let mut v = [0.0f32; 16];
    for l in 0..16 {
        v[l] = (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]);
    }
    let t3: [f32; 8] = std::array::from_fn(|i| v[i] + v[i + 8]);
    let t6: [f32; 4] = std::array::from_fn(|i| t3[i] + t3[i + 4]);
    let mut sum = ((t6[0] + t6[2]) + (t6[1] + t6[3])) as f64;
    for e in np..n {
        sum += (q[e] * k[e]) as f64;
    }
    sum as f32
}

/// In-place softmax; the normalising sum is taken in f64, as ggml does.
#[inline]
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
    let mut sum = 0.0f64;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v as f64;
    }
    let inv = (1.0 / sum) as f32;
    for v in x.iter_mut() {
        *v *= inv;
    }
}
