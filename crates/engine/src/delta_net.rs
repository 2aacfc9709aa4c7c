//! The gated delta net (linear attention with a recurrent state), as ggml-cpu computes it for
//! Qwen3-Next and Qwen 3.5: a short causal convolution over the mixed Q/K/V channels, then per
//! value head the gated delta rule on an `S x S` state matrix.
//!
//! Both run token by token, in prefill as in decode (llama.cpp's fused `gated_delta_net` op does
//! the same on the CPU), so a token's result does not depend on its batch (G1); heads are
//! independent, so it does not depend on threads either (D1).

use crate::ops::dot_f32;

/// The sizes of a gated delta-net layer.
#[derive(Debug, Clone, Copy)]
pub struct DeltaNetShape {
    /// Key (and query) heads: `ssm.group_count`.
    pub n_k_heads: usize,
    /// Value heads: `ssm.time_step_rank`; a multiple of `n_k_heads`.
    pub n_v_heads: usize,
    /// Width of every head, keys and values: `ssm.state_size`.
    pub head_dim: usize,
    /// Taps of the causal convolution: `ssm.conv_kernel`.
    pub d_conv: usize,
}

impl DeltaNetShape {
    pub fn key_dim(&self) -> usize {
        self.n_k_heads * self.head_dim
    }

    pub fn value_dim(&self) -> usize {
        self.n_v_heads * self.head_dim
    }

    /// Channels of the convolution: queries, keys, values.
    pub fn conv_dim(&self) -> usize {
        2 * self.key_dim() + self.value_dim()
    }

    /// [`DeltaNetShape::conv_dim`], or `None` where it overflows a `usize`.
    pub fn conv_dim_checked(&self) -> Option<usize> {
        let key_dim = self.n_k_heads.checked_mul(self.head_dim)?;
        let value_dim = self.n_v_heads.checked_mul(self.head_dim)?;
        key_dim.checked_mul(2)?.checked_add(value_dim)
    }

    fn conv_state_len(&self) -> usize {
        self.conv_dim() * (self.d_conv - 1)
    }

    fn ssm_state_len(&self) -> usize {
        self.n_v_heads * self.head_dim * self.head_dim
    }
}

/// The recurrent state of one sequence, for every delta-net layer: the convolution's last
/// `d_conv - 1` inputs per channel and each head's state matrix. Kept next to the KV cache in
/// [`crate::State`] and allocated once.
#[derive(Default)]
pub struct RecurrentState {
    shape: Option<DeltaNetShape>,
    /// `(n_layers, conv_dim, d_conv - 1)`, oldest input first.
    conv: Vec<f32>,
    /// `(n_layers, n_v_heads, S, S)`: row `j` of a head's block is column `j` of its state
    /// matrix (ggml's layout: the rule's dot products read rows).
    ssm: Vec<f32>,
}

impl RecurrentState {
    /// Whether there is a state to carry (the model has recurrent layers): such a state holds
    /// every token fed so far and cannot be taken back to an earlier position.
    pub fn is_recurrent(&self) -> bool {
        self.shape.is_some()
    }

    /// The bytes of [`RecurrentState::new`]'s arrays, or `None` where that overflows a `usize`
    /// (checked before the state is made, whose own arithmetic then does not overflow).
    pub fn bytes(n_layers: usize, shape: &DeltaNetShape) -> Option<usize> {
        let conv = shape
            .conv_dim_checked()?
            .checked_mul(shape.d_conv.checked_sub(1)?)?;
        let ssm = [shape.head_dim, shape.head_dim]
            .into_iter()
            .try_fold(shape.n_v_heads, |a, d| a.checked_mul(d))?;
        conv.checked_add(ssm)?
            .checked_mul(n_layers)?
            .checked_mul(size_of::<f32>())
    }

    pub fn new(n_layers: usize, shape: DeltaNetShape) -> RecurrentState {
        RecurrentState {
            shape: Some(shape),
            conv: vec![0.0; n_layers * shape.conv_state_len()],
            ssm: vec![0.0; n_layers * shape.ssm_state_len()],
        }
    }

    /// Back to the state before the first token.
    pub fn reset(&mut self) {
        self.conv.fill(0.0);
        self.ssm.fill(0.0);
    }

    /// Copy the whole state (every layer's convolution state, then its state matrices) into
    /// `into`, replacing what it held: a checkpoint to come back to.
    pub fn save(&self, into: &mut Vec<f32>) {
        into.clear();
        into.extend_from_slice(&self.conv);
        into.extend_from_slice(&self.ssm);
    }

    /// Back to a state [`RecurrentState::save`] saved; `false`, and nothing changed, where
    /// `from` is not the size of this state's arrays.
    pub fn restore(&mut self, from: &[f32]) -> bool {
        if from.len() != self.conv.len() + self.ssm.len() {
            return false;
        }
        let (conv, ssm) = from.split_at(self.conv.len());
        self.conv.copy_from_slice(conv);
        self.ssm.copy_from_slice(ssm);
        true
    }

    /// Layer `l`'s convolution state and state matrices.
    pub fn layer(&mut self, l: usize) -> (&mut [f32], &mut [f32]) {
        let shape = self
            .shape
            .expect("a recurrent state for a model with recurrent layers");
        let (c, s) = (shape.conv_state_len(), shape.ssm_state_len());
        (
            &mut self.conv[l * c..(l + 1) * c],
            &mut self.ssm[l * s..(l + 1) * s],
        )
    }
}

/// The per-batch buffers of a delta-net layer, for batches of up to `n` tokens.
#[derive(Default)]
pub struct DeltaNetBuffers {
    pub mixed: Vec<f32>, // (n, conv_dim) the Q/K/V projection, before the convolution
    pub conv: Vec<f32>,  // (n, conv_dim) after the convolution and SiLU: q, k, v
    pub z: Vec<f32>,     // (n, value_dim) the output gate's projection
    pub beta: Vec<f32>,  // (n, n_v_heads)
    pub g: Vec<f32>,     // (n, n_v_heads) the log of the decay
    pub core: Vec<f32>,  // (n, value_dim) the rule's output, then gated and normed
    pub delta: Vec<f32>, // (head_dim) scratch of the rule
}

impl DeltaNetBuffers {
    /// The bytes of [`DeltaNetBuffers::new`]'s buffers, or `None` where that overflows a
    /// `usize`.
    pub fn bytes(n: usize, shape: &DeltaNetShape) -> Option<usize> {
        let value_dim = shape.n_v_heads.checked_mul(shape.head_dim)?;
        let per_row = [shape.conv_dim_checked()?, value_dim, shape.n_v_heads]
            .into_iter()
            .try_fold(0usize, |a, w| a.checked_add(w.checked_mul(2)?))?;
        per_row
            .checked_mul(n)?
            .checked_add(shape.head_dim)?
            .checked_mul(size_of::<f32>())
    }

    pub fn new(n: usize, shape: &DeltaNetShape) -> DeltaNetBuffers {
        DeltaNetBuffers {
            mixed: vec![0.0; n * shape.conv_dim()],
            conv: vec![0.0; n * shape.conv_dim()],
            z: vec![0.0; n * shape.value_dim()],
            beta: vec![0.0; n * shape.n_v_heads],
            g: vec![0.0; n * shape.n_v_heads],
            core: vec![0.0; n * shape.value_dim()],
            delta: vec![0.0; shape.head_dim],
        }
    }
}

/// One token of the causal convolution (ggml's `ssm_conv`): for each channel `c`,
/// `out[c] = sum_i window[i] * w[c][i]` over the window of the state's `d_conv - 1` inputs and
/// `x[c]`, oldest first, one fused multiply-add at a time (ggml's loop, contracted by GCC); then
/// `x` joins the state. `w` is `(conv_dim, d_conv)`.
#[inline(always)]
pub fn conv_step(state: &mut [f32], w: &[f32], x: &[f32], out: &mut [f32], d_conv: usize) {
    let k = d_conv - 1;
    for ((st, w), (&x, o)) in state
        .chunks_exact_mut(k)
        .zip(w.chunks_exact(d_conv))
        .zip(x.iter().zip(out.iter_mut()))
    {
        let mut sum = 0.0f32;
        for (&s, &w) in st.iter().zip(w) {
            sum = s.mul_add(w, sum);
        }
        *o = x.mul_add(w[k], sum);
        st.copy_within(1.., 0);
        st[k - 1] = x;
    }
}

/// One token of the gated delta rule for one head, as ggml-cpu's `gated_delta_net` computes it.
/// With `S` the state (`s` holds its columns as rows):
///
/// ```text
/// S     = S * exp(g)
/// delta = (v - S^T k) * beta
/// S     = S + k delta^T
/// out   = (S^T q) / sqrt(head_dim)
/// ```
/// `q` and `k` are L2-normalised; `delta` is scratch of `head_dim`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
pub fn delta_rule_step(
    s: &mut [f32],
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: f32,
    beta: f32,
    delta: &mut [f32],
    out: &mut [f32],
) {
    let n = v.len();
    let scale = 1.0 / (n as f32).sqrt();
    let decay = g.exp();
    s.iter_mut().for_each(|x| *x *= decay);
    for ((row, d), &v) in s.chunks_exact(n).zip(delta.iter_mut()).zip(v) {
        *d = (v - dot_f32(row, k)) * beta;
    }
    for (row, &d) in s.chunks_exact_mut(n).zip(delta.iter()) {
        for (x, &k) in row.iter_mut().zip(k) {
            *x = k.mul_add(d, *x);
        }
    }
    for (row, o) in s.chunks_exact(n).zip(out.iter_mut()) {
        *o = dot_f32(row, q) * scale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The rule against its definition in f64 on a small head.
    #[test]
    fn delta_rule_matches_its_definition() {
        let n = 8;
        let mut s: Vec<f32> = (0..n * n)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) * 0.1)
            .collect();
        let s0 = s.clone();
        let norm = |x: Vec<f32>| {
            let r = x.iter().map(|v| v * v).sum::<f32>().sqrt();
            x.iter().map(|v| v / r).collect::<Vec<f32>>()
        };
        let q = norm((0..n).map(|i| i as f32 - 3.0).collect());
        let k = norm((0..n).map(|i| (i * i) as f32 * 0.1 - 1.0).collect());
        let v: Vec<f32> = (0..n).map(|i| 0.3 * i as f32 - 1.0).collect();
        let (g, beta) = (-0.4f32, 0.7f32);
        let (mut delta, mut out) = (vec![0.0; n], vec![0.0; n]);
        delta_rule_step(&mut s, &q, &k, &v, g, beta, &mut delta, &mut out);

        // m[i][j] = S[i][j] = s0[j * n + i]
        let e = (g as f64).exp();
        let m = |i: usize, j: usize| s0[j * n + i] as f64 * e;
        for j in 0..n {
            let sk: f64 = (0..n).map(|i| m(i, j) * k[i] as f64).sum();
            let d = (v[j] as f64 - sk) * beta as f64;
            let col: Vec<f64> = (0..n).map(|i| m(i, j) + k[i] as f64 * d).collect();
            for i in 0..n {
                assert!((s[j * n + i] as f64 - col[i]).abs() < 1e-5);
            }
            let o: f64 = (0..n).map(|i| col[i] * q[i] as f64).sum::<f64>() / (n as f64).sqrt();
            assert!((out[j] as f64 - o).abs() < 1e-5, "{j}: {} vs {o}", out[j]);
        }
    }

    #[test]
    fn conv_step_is_a_causal_convolution() {
        // Two channels, three taps: out_t = w0 x_{t-2} + w1 x_{t-1} + w2 x_t.
        let w = [1.0f32, 2.0, 3.0, -1.0, 0.5, 0.25];
        let mut st = vec![0.0f32; 4];
        let xs = [[1.0f32, 4.0], [2.0, 8.0], [3.0, 16.0]];
        let mut out = [0.0f32; 2];
        let mut got = vec![];
        for x in &xs {
            conv_step(&mut st, &w, x, &mut out, 3);
            got.push(out);
        }
        assert_eq!(got[0], [3.0, 1.0]);
        assert_eq!(got[1], [2.0 + 6.0, 2.0 + 2.0]);
        assert_eq!(got[2], [1.0 + 4.0 + 9.0, -4.0 + 4.0 + 4.0]);
    }
}
