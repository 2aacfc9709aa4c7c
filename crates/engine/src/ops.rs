//! Element-wise and per-row operations of the forward pass. Each works on one token's row, so a
//! token's result never depends on the batch it was computed in (contract G1).
//!
//! Numerics follow ggml's CPU ops where that costs nothing: RMSNorm sums squares in f64, SiLU is
//! `x / (1 + e^-x)`, RoPE advances its angle by repeated multiplication as `ggml_rope` does.

/// `y = x / sqrt(mean(x^2) + eps) * w`, over one row.
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    let sum: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
        *y = (x * scale) * w;
    }
}

/// In-place [`rms_norm`].
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    let sum: f64 = x.iter().map(|&v| (v as f64) * (v as f64)).sum();
    let mean = (sum / x.len() as f64) as f32;
    let scale = 1.0 / (mean + eps).sqrt();
    for (x, &w) in x.iter_mut().zip(w) {
        *x = (*x * scale) * w;
    }
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `gate = silu(gate) * up`, the SwiGLU of the llama FFN.
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

pub fn add_inplace(x: &mut [f32], y: &[f32]) {
    for (x, &y) in x.iter_mut().zip(y) {
        *x += y;
    }
}

/// How a RoPE rotates pairs within a head.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RopeStyle {
    /// Adjacent pairs `(x[2i], x[2i+1])`: llama, Mistral (`LLAMA_ROPE_TYPE_NORM`).
    Adjacent,
    /// Halves `(x[i], x[i + n/2])`: GPT-NeoX, Qwen, Gemma (`LLAMA_ROPE_TYPE_NEOX`).
    Neox,
}

/// Rotary position embedding parameters for one attention layer.
#[derive(Debug, Clone)]
pub struct Rope {
    pub style: RopeStyle,
    /// Dimensions rotated (the first `n_rot` of each head).
    pub n_rot: usize,
    pub base: f32,
    /// Per-pair divisors of the angle (Llama 3's `rope_freqs`), `n_rot / 2` of them.
    pub freq_factors: Option<Vec<f32>>,
}

impl Rope {
    /// The cosines and sines for position `pos`, `n_rot / 2` pairs, into `cs`.
    pub fn angles(&self, pos: usize, cs: &mut [(f32, f32)]) {
        let theta_scale = self.base.powf(-2.0 / self.n_rot as f32);
        let mut theta = pos as f32;
        for (i, cs) in cs.iter_mut().enumerate().take(self.n_rot / 2) {
            let ff = self.freq_factors.as_ref().map_or(1.0, |f| f[i]);
            let t = theta / ff;
            *cs = (t.cos(), t.sin());
            theta *= theta_scale;
        }
    }

    /// Rotate every head of `x` (heads of `head_dim`) by the angles of one position.
    pub fn apply(&self, x: &mut [f32], head_dim: usize, cs: &[(f32, f32)]) {
        let half = self.n_rot / 2;
        for head in x.chunks_exact_mut(head_dim) {
            for (i, &(c, s)) in cs.iter().enumerate().take(half) {
                let (a, b) = match self.style {
                    RopeStyle::Adjacent => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                head[a] = x0 * c - x1 * s;
                head[b] = x0 * s + x1 * c;
            }
        }
    }
}

/// Index of the largest value (the first, on ties).
pub fn argmax(x: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in x.iter().enumerate() {
        if v > x[best] {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rms_norm_matches_definition() {
        let x = [1.0f32, -2.0, 3.0, 0.5];
        let w = [1.0f32, 2.0, 0.5, 1.0];
        let mut y = [0.0; 4];
        rms_norm(&x, &w, 1e-6, &mut y);
        let rms = (x.iter().map(|v| v * v).sum::<f32>() / 4.0 + 1e-6).sqrt();
        for i in 0..4 {
            assert!((y[i] - x[i] / rms * w[i]).abs() < 1e-6);
        }
    }

    #[test]
    fn rope_rotates_pairs_and_keeps_norms() {
        for style in [RopeStyle::Adjacent, RopeStyle::Neox] {
            let rope = Rope {
                style,
                n_rot: 8,
                base: 10000.0,
                freq_factors: None,
            };
            let mut cs = vec![(0.0, 0.0); 4];
            rope.angles(0, &mut cs);
            let x0: Vec<f32> = (0..8).map(|i| i as f32 - 3.0).collect();
            let mut x = x0.clone();
            rope.apply(&mut x, 8, &cs);
            assert_eq!(x, x0, "position 0 is the identity");
            rope.angles(7, &mut cs);
            rope.apply(&mut x, 8, &cs);
            let n0: f32 = x0.iter().map(|v| v * v).sum();
            let n1: f32 = x.iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-4);
            // The first pair turns by exactly `pos` radians.
            let (a, b) = if style == RopeStyle::Adjacent {
                (0, 1)
            } else {
                (0, 4)
            };
            let want = (
                x0[a] * 7f32.cos() - x0[b] * 7f32.sin(),
                x0[a] * 7f32.sin() + x0[b] * 7f32.cos(),
            );
            assert!((x[a] - want.0).abs() < 1e-5 && (x[b] - want.1).abs() < 1e-5);
        }
    }
}
