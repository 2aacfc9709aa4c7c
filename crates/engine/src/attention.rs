//! Causal grouped-query attention of one token over the positions in the KV cache.
//!
//! A token attends to positions `0..n_pos` in the same order whether it came alone (decode) or in
//! a batch (prefill): the batch's keys and values are stored first, then each token reads its own
//! causal prefix. So a token's result does not depend on its batch (G1).

use half::f16;

pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub head_dim: usize,
    /// Multiplies `q . k` before the softmax (`1 / sqrt(head_dim)` unless the model says).
    pub scale: f32,
}

/// `out (n_head * head_dim) = softmax(scale * q k^T) v`, over positions `0..n_pos`.
/// `keys`, `values` are `(n_pos, n_head_kv * head_dim)`; `scores` has room for `n_pos`.
pub fn attend(
    s: &AttnShape,
    q: &[f32],
    keys: &[f16],
    values: &[f16],
    n_pos: usize,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let hd = s.head_dim;
    let kv_dim = s.n_head_kv * hd;
    let group = s.n_head / s.n_head_kv;
    let scores = &mut scores[..n_pos];
    for h in 0..s.n_head {
        let qh = &q[h * hd..(h + 1) * hd];
        let off = (h / group) * hd;
        for (j, sc) in scores.iter_mut().enumerate() {
            let k = &keys[j * kv_dim + off..j * kv_dim + off + hd];
            let dot: f32 = qh.iter().zip(k).map(|(a, b)| a * b.to_f32()).sum();
            *sc = dot * s.scale;
        }
        softmax(scores);
        let oh = &mut out[h * hd..(h + 1) * hd];
        oh.fill(0.0);
        for (j, &p) in scores.iter().enumerate() {
            let v = &values[j * kv_dim + off..j * kv_dim + off + hd];
            for (o, x) in oh.iter_mut().zip(v) {
                *o += p * x.to_f32();
            }
        }
    }
}

/// In-place softmax; the normalising sum is taken in f64, as ggml does.
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
