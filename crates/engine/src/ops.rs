//! Element-wise and per-row operations of the forward pass. Each works on one token's row, so a
//! token's result never depends on the batch it was computed in (contract G1). The norms, the
//! residual add and the RoPE rotation are always inlined, so that the forward pass's x86-64-v3
//! and AVX-512 builds compile them for those features (out of line, they ran in SSE2 lanes, and
//! the rotation's multiply-adds called `fmaf`); SwiGLU and SiLU pick their lanes themselves, and
//! `rms_scales4` stays out of line on purpose (its note).
//!
//! Numerics follow ggml's CPU ops to the bit where that costs nothing (RMSNorm's f64 sum of f32
//! squares, RoPE's angle advanced by repeated multiplication and its contracted rotations, SiLU's
//! vectorised exponential): a last-bit difference upstream can flip the rounding of a quantized
//! activation downstream, and those flips are what separate two engines' logits.

/// `1 / sqrt(mean(x^2) + eps)` as ggml's `rms_norm` computes it: each square rounded to f32,
/// summed in f64 in order.
#[inline]
fn rms_scale(x: &[f32], eps: f32) -> f32 {
    let sum: f64 = x.iter().map(|&v| (v * v) as f64).sum();
    scale_of(sum, x.len(), eps)
}

/// The scale of a row of `n` values whose squares sum to `sum`.
#[inline(always)]
fn scale_of(sum: f64, n: usize, eps: f32) -> f32 {
    let mean = (sum / n as f64) as f32;
    1.0 / (mean + eps).sqrt()
}

/// [`rms_scale`] of each of the up to four rows of `width` values in `rows`: four rows go in
/// step, each row's f64 sum in its own order, so that four chains of dependent additions
/// overlap where one row's waits on each addition's latency (2048 values: about 8000 cycles
/// alone). The same bits as one row at a time. Never inlined: compiled into the forward
/// pass's AVX-512 build, the four chains went into one register of four f64 lanes gathered
/// from the four rows, and the norms ran much slower (measurements: docs/perf-log.md,
/// "Element-wise operations").
#[inline(never)]
fn rms_scales4(rows: &[f32], width: usize, eps: f32) -> [f32; 4] {
    if rows.len() != 4 * width {
        let mut scales = [0.0; 4];
        for (s, row) in scales.iter_mut().zip(rows.chunks_exact(width)) {
            *s = rms_scale(row, eps);
        }
        return scales;
    }
    let rows: [&[f32]; 4] = std::array::from_fn(|r| &rows[r * width..][..width]);
    let mut sum = [0.0f64; 4];
    for i in 0..width {
        for (s, r) in sum.iter_mut().zip(&rows) {
            *s += (r[i] * r[i]) as f64;
        }
    }
    sum.map(|s| scale_of(s, width, eps))
}

/// `y = x * scale * w`, over one row.
#[inline(always)]
fn scale_row(x: &[f32], scale: f32, w: &[f32], y: &mut [f32]) {
    for ((y, &x), &w) in y.iter_mut().zip(x).zip(w) {
        *y = (x * scale) * w;
    }
}

/// [`scale_row`] in place.
#[inline(always)]
fn scale_row_inplace(x: &mut [f32], scale: f32, w: &[f32]) {
    for (x, &w) in x.iter_mut().zip(w) {
        *x = (*x * scale) * w;
    }
}

/// `y = x / sqrt(mean(x^2) + eps) * w`, over one row.
#[inline(always)]
pub fn rms_norm(x: &[f32], w: &[f32], eps: f32, y: &mut [f32]) {
    scale_row(x, rms_scale(x, eps), w, y);
}

/// [`rms_norm`] of each row of `x` (rows of `width`) into the same row of `y`, four rows'
/// sums at a time (`rms_scales4`).
#[inline(always)]
pub fn rms_norm_rows(x: &[f32], w: &[f32], eps: f32, y: &mut [f32], width: usize) {
    let x = &x[..x.len() / width * width];
    for (xs, ys) in x.chunks(4 * width).zip(y.chunks_mut(4 * width)) {
        let scales = rms_scales4(xs, width, eps);
        for ((xr, yr), scale) in xs
            .chunks_exact(width)
            .zip(ys.chunks_exact_mut(width))
            .zip(scales)
        {
            scale_row(xr, scale, w, yr);
        }
    }
}

/// In-place [`rms_norm`].
#[inline(always)]
pub fn rms_norm_inplace(x: &mut [f32], w: &[f32], eps: f32) {
    scale_row_inplace(x, rms_scale(x, eps), w);
}

/// [`rms_norm_inplace`] of each of the rows of `x` (rows of `width`), four rows' sums at a
/// time (`rms_scales4`).
#[inline(always)]
pub fn rms_norm_rows_inplace(x: &mut [f32], w: &[f32], eps: f32, width: usize) {
    let n = x.len() / width;
    for xs in x[..n * width].chunks_mut(4 * width) {
        let scales = rms_scales4(xs, width, eps);
        for (xr, scale) in xs.chunks_exact_mut(width).zip(scales) {
            scale_row_inplace(xr, scale, w);
        }
    }
}

/// `x / |x|` as llama.cpp's delta-net graphs compute it (`build_gdn_l2_norm`): ggml's RMSNorm
/// with `eps / n`, then a scale by `1 / sqrt(n)`, each rounded.
#[inline]
pub fn l2_norm_inplace(x: &mut [f32], eps: f32) {
    let n = x.len() as f32;
    let scale = rms_scale(x, eps / n);
    let inv = 1.0 / n.sqrt();
    for v in x.iter_mut() {
        *v = (*v * scale) * inv;
    }
}

#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// `e^x` as ggml's vectorised `ggml_v_expf` (AVX-512 variant) computes it: a degree-5
/// polynomial on the reduced argument, then a scaling by `2^n`; within 1.5 ulp of `e^x`.
/// ggml's SiLU uses it, and a last-bit difference in an FFN activation can flip the rounding of
/// its quantized copy, so synapse computes the same function to stay bit-close to llama.cpp.
#[inline(always)]
pub fn expf_ggml(x: f32) -> f32 {
    const R: f32 = 12582912.0; // 0x1.8p23: adding it rounds to an integer
    let z = x.mul_add(f32::from_bits(0x3fb8aa3b), R); // x * log2(e) + R
    let n = z - R;
    let b = (-n).mul_add(
        f32::from_bits(0x35bfbe8e),
        (-n).mul_add(f32::from_bits(0x3f317200), x),
    );
    if n.abs() > 192.0 {
        return if n <= 0.0 { 0.0 } else { f32::INFINITY };
    }
    let u = b * b;
    let p = f32::from_bits(0x3c072010).mul_add(b, f32::from_bits(0x3d2b9f17));
    let q = f32::from_bits(0x3e2aaf33).mul_add(b, f32::from_bits(0x3efffedb));
    let r = f32::from_bits(0x3f7ffff6).mul_add(b, 1.0);
    let j = p.mul_add(u, q).mul_add(u, r);
    // scalef: j * 2^n, rounded once (the f64 product is exact).
    // |n| <= 192 here, so 2^n is a normal f64: build it from its exponent bits.
    (j as f64 * f64::from_bits(((n as i64 + 1023) as u64) << 52)) as f32
}

/// `gate = silu(gate) * up`, the SwiGLU of the llama FFN, computed as ggml's AVX-512
/// `ggml_vec_swiglu_f32` does: [`expf_ggml`] on whole groups of 16, libm's `expf` on the tail.
#[inline]
pub fn swiglu(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if synapse_quant::cpu().avx512f() {
        let body = gate.len() / 16 * 16;
        // SAFETY: the CPU has AVX-512 F and FMA (just checked).
        unsafe { swiglu16(&mut gate[..body], &up[..body]) };
        return swiglu_tail(&mut gate[body..], &up[body..]);
    }
    swiglu_scalar(gate, up);
}

/// gpt-oss's gated activation, as ggml's `swiglu_oai` computes it (a scalar loop, libm's
/// `expf`): the gate clamped above at 7 and the up value to [-7, 7],
/// `gate = (x / (1 + e^(1.702 * -x))) * (y + 1)`.
pub fn swiglu_oai(gate: &mut [f32], up: &[f32]) {
    const ALPHA: f32 = 1.702;
    const LIMIT: f32 = 7.0;
    for (g, &u) in gate.iter_mut().zip(up) {
        // `std::min(g, limit)` and `std::clamp(u, -limit, limit)`, NaN passing through.
        let x = if LIMIT < *g { LIMIT } else { *g };
        let y = u.clamp(-LIMIT, LIMIT);
        *g = (x / (1.0 + (ALPHA * -x).exp())) * (y + 1.0);
    }
}

/// [`swiglu`] one value at a time (the value of its sixteen-lane form, bit for bit).
fn swiglu_scalar(gate: &mut [f32], up: &[f32]) {
    let body = gate.len() / 16 * 16;
    for (g, &u) in gate[..body].iter_mut().zip(up) {
        *g = (*g / (1.0 + expf_ggml(-*g))) * u;
    }
    swiglu_tail(&mut gate[body..], &up[body..]);
}

/// [`swiglu`]'s tail (fewer than sixteen values): libm's `expf`, as ggml's scalar loop.
fn swiglu_tail(gate: &mut [f32], up: &[f32]) {
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = silu(*g) * u;
    }
}

/// `x = silu(x)` over each row of `width` values, as ggml's `ggml_vec_silu_f32` (AVX-512) does a
/// row: [`expf_ggml`] on whole groups of 16, libm's `expf` on the row's tail.
#[inline]
pub fn silu_rows(x: &mut [f32], width: usize) {
    for row in x.chunks_exact_mut(width) {
        let body = width / 16 * 16;
        silu_body(&mut row[..body]);
        for v in row[body..].iter_mut() {
            *v = silu(*v);
        }
    }
}

/// `x = x / (1 + expf_ggml(-x))` over whole groups of sixteen (`x.len()` a multiple of
/// sixteen): sixteen lanes at a time where the CPU has AVX-512, one value at a time elsewhere.
fn silu_body(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if synapse_quant::cpu().avx512f() {
        // SAFETY: the CPU has AVX-512 F and FMA (just checked).
        return unsafe { silu16(x) };
    }
    silu_scalar(x);
}

/// `x = x / (1 + expf_ggml(-x))`, one value at a time.
fn silu_scalar(x: &mut [f32]) {
    for v in x.iter_mut() {
        *v = *v / (1.0 + expf_ggml(-*v));
    }
}

/// [`expf_ggml`] of sixteen lanes: ggml's `ggml_v_expf` itself, with `vscalefps` for the
/// scaling by `2^n` (one rounding, as the scalar form's exact f64 product then rounded).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn expf_ggml16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let c = |bits: u32| _mm512_set1_ps(f32::from_bits(bits));
    let r = _mm512_set1_ps(12582912.0);
    let z = _mm512_fmadd_ps(x, c(0x3fb8aa3b), r);
    let n = _mm512_sub_ps(z, r);
    let b = _mm512_fnmadd_ps(n, c(0x35bfbe8e), _mm512_fnmadd_ps(n, c(0x3f317200), x));
    let big = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(_mm512_abs_ps(n), _mm512_set1_ps(192.0));
    let u = _mm512_mul_ps(b, b);
    let p = _mm512_fmadd_ps(c(0x3c072010), b, c(0x3d2b9f17));
    let q = _mm512_fmadd_ps(c(0x3e2aaf33), b, c(0x3efffedb));
    let r1 = _mm512_fmadd_ps(c(0x3f7ffff6), b, _mm512_set1_ps(1.0));
    let j = _mm512_fmadd_ps(_mm512_fmadd_ps(p, u, q), u, r1);
    let res = _mm512_scalef_ps(j, n);
    if big == 0 {
        return res;
    }
    let low = _mm512_cmp_ps_mask::<_CMP_LE_OQ>(n, _mm512_setzero_ps());
    let alt = _mm512_mask_blend_ps(low, _mm512_set1_ps(f32::INFINITY), _mm512_setzero_ps());
    _mm512_mask_blend_ps(big, res, alt)
}

/// `x / (1 + expf_ggml(-x))` of sixteen lanes (ggml's `ggml_v_silu`).
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn silu_v16(x: std::arch::x86_64::__m512) -> std::arch::x86_64::__m512 {
    use std::arch::x86_64::*;
    let e = expf_ggml16(_mm512_sub_ps(_mm512_setzero_ps(), x));
    _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0), e))
}

/// [`swiglu_scalar`]'s body sixteen values at a time (`gate.len()` a multiple of sixteen): the
/// scalar loop is not vectorised (its exponential's range test and f64 scaling), and took a
/// share of a decode step (measurements: docs/perf-log.md, "Element-wise operations").
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn swiglu16(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    for (g, u) in gate.chunks_exact_mut(16).zip(up.chunks_exact(16)) {
        // SAFETY: sixteen floats each.
        unsafe {
            let x = _mm512_loadu_ps(g.as_ptr());
            let y = _mm512_mul_ps(silu_v16(x), _mm512_loadu_ps(u.as_ptr()));
            _mm512_storeu_ps(g.as_mut_ptr(), y);
        }
    }
}

/// [`silu_scalar`] sixteen values at a time (`x.len()` a multiple of sixteen).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
fn silu16(x: &mut [f32]) {
    use std::arch::x86_64::*;
    for v in x.chunks_exact_mut(16) {
        // SAFETY: sixteen floats.
        unsafe { _mm512_storeu_ps(v.as_mut_ptr(), silu_v16(_mm512_loadu_ps(v.as_ptr()))) };
    }
}

/// ggml's `sigmoid` op: `1 / (1 + expf(-x))`, libm's `expf`.
#[inline]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + (-x).exp())
}

/// ggml's `softplus` op: `log(1 + e^x)`, the identity above 20.
#[inline]
pub fn softplus(x: f32) -> f32 {
    if x > 20.0 {
        x
    } else {
        (1.0 + x.exp()).ln()
    }
}

/// `x . y` in the order of ggml's AVX-512 `ggml_vec_dot_f32`: four 16-lane accumulators of
/// fused multiply-adds over 64-value steps, added pairwise, the lanes reduced by halves
/// ([`reduce_add_16`]), then the tail in f32 (fused, as GCC contracts it).
#[inline(always)]
pub fn dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut sum = ggml_lanes_64(np, |e| (x[e], y[e]));
    for e in np..n {
        sum = x[e].mul_add(y[e], sum);
    }
    sum
}

pub use synapse_quant::reference::dot::{ggml_lanes_64, reduce_add_16};

/// `gelu(x)` with the tanh approximation, as ggml's `ggml_gelu_f32` computes it when GCC contracts
/// it (`-march=native`, `-std=gnu11`): `1 + a*x*x` is one fused multiply-add; `tanhf` is libm's.
pub fn gelu_tanh(x: f32) -> f32 {
    const GELU_COEF_A: f32 = 0.044715;
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let inner = (GELU_COEF_A * x).mul_add(x, 1.0);
    (0.5 * x) * (1.0 + ((SQRT_2_OVER_PI * x) * inner).tanh())
}

/// ggml's `ggml_table_gelu_f16`: [`gelu_tanh`] of every F16 value, rounded to F16.
fn gelu_f16_table() -> &'static [half::f16] {
    static TABLE: std::sync::OnceLock<Vec<half::f16>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|bits| half::f16::from_f32(gelu_tanh(half::f16::from_bits(bits).to_f32())))
            .collect()
    })
}

/// `gate = gelu(gate) * up`, the GEGLU of the Gemma FFN, as ggml-cpu's `ggml_vec_geglu_f32` does
/// it (`GGML_GELU_FP16`): the argument rounded to F16 and looked up in a table of F16 results,
/// except at and beyond +-10 (0 below, the identity above).
pub fn geglu(gate: &mut [f32], up: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if synapse_quant::cpu().avx2() {
        // SAFETY: the CPU has AVX2, FMA and F16C (just checked).
        return unsafe { geglu_avx2(gate, up) };
    }
    geglu_scalar(gate, up);
}

/// [`geglu`] one value at a time.
fn geglu_scalar(gate: &mut [f32], up: &[f32]) {
    let table = gelu_f16_table();
    for (g, &u) in gate.iter_mut().zip(up) {
        let x = *g;
        *g = if x <= -10.0 {
            0.0
        } else if x >= 10.0 {
            x * u
        } else {
            table[half::f16::from_f32(x).to_bits() as usize].to_f32() * u
        };
    }
}

/// [`gelu_f16_table`] widened to f32 (exactly), for eight lookups at once by `vgatherdps`.
#[cfg(target_arch = "x86_64")]
fn gelu_f32_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| gelu_f16_table().iter().map(|v| v.to_f32()).collect())
}

/// [`geglu_scalar`] eight values at a time: each rounded to F16 by `vcvtps2ph` (the conversion
/// `half` makes one value at a time with F16C, round to nearest even), its table entry
/// gathered, then the same one multiply; the same selections at +-10. Every value's arithmetic
/// is the scalar one, so the same bits (tested over every F16 value). Gemma 3's prefill spent
/// a share of its time in the scalar loop's conversions (docs/perf-log.md, "Element-wise
/// operations").
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn geglu_avx2(gate: &mut [f32], up: &[f32]) {
    use std::arch::x86_64::*;
    let n = gate.len().min(up.len());
    let table = gelu_f32_table();
    let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    let body = n / 8 * 8;
    for i in (0..body).step_by(8) {
        // SAFETY: i + 8 <= n floats of both; every index is a u16, below the table's 65536.
        unsafe {
            let x = _mm256_loadu_ps(gate.as_ptr().add(i));
            let u = _mm256_loadu_ps(up.as_ptr().add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x);
            let t = _mm256_i32gather_ps::<4>(table.as_ptr(), _mm256_cvtepu16_epi32(h));
            let below = _mm256_cmp_ps::<_CMP_LE_OQ>(x, lo);
            let above = _mm256_cmp_ps::<_CMP_GE_OQ>(x, hi);
            let v = _mm256_blendv_ps(t, x, above);
            let y = _mm256_andnot_ps(below, _mm256_mul_ps(v, u));
            _mm256_storeu_ps(gate.as_mut_ptr().add(i), y);
        }
    }
    geglu_scalar(&mut gate[body..n], &up[body..n]);
}

/// `x *= s`, element by element (ggml's `ggml_scale`).
pub fn scale_inplace(x: &mut [f32], s: f32) {
    for v in x.iter_mut() {
        *v *= s;
    }
}

/// `x = cap * tanh(x / cap)`, final-logit soft-capping as ggml composes it: a scale by the
/// rounded `1 / cap`, libm's `tanhf`, a scale by `cap`.
pub fn softcap_inplace(x: &mut [f32], cap: f32) {
    let inv = 1.0 / cap;
    for v in x.iter_mut() {
        *v = (*v * inv).tanh() * cap;
    }
}

#[inline(always)]
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
#[derive(Debug, Clone, PartialEq)]
pub struct Rope {
    pub style: RopeStyle,
    /// Dimensions rotated (the first `n_rot` of each head).
    pub n_rot: usize,
    pub base: f32,
    /// Per-pair divisors of the angle (Llama 3's `rope_freqs`, Phi-3's LongRoPE factors),
    /// `n_rot / 2` of them.
    pub freq_factors: Option<Vec<f32>>,
    /// Linear or YaRN scaling of the angles, and a factor on their cosines and sines.
    pub scaling: RopeScaling,
}

/// How ggml's `ggml_rope_ext` scales a RoPE's angles, as llama.cpp's context sets it up.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeScaling {
    /// Multiplies every angle: `1 / factor` of linear or YaRN scaling, else 1.
    pub freq_scale: f32,
    /// YaRN's weight of the unscaled angle on the fast-turning pairs: 1 under YaRN, else 0.
    pub ext_factor: f32,
    /// The pairs between which YaRN's ramp goes from the unscaled to the scaled angle.
    pub corr_dims: [f32; 2],
    /// Multiplies every cosine and sine (`attn_factor`: YaRN's and LongRoPE's magnitude).
    pub attn_factor: f32,
}

impl RopeScaling {
    /// No scaling: the angles and their cosines and sines as they are.
    pub const NONE: RopeScaling = RopeScaling {
        freq_scale: 1.0,
        ext_factor: 0.0,
        corr_dims: [0.0, 0.0],
        attn_factor: 1.0,
    };

    /// YaRN's ramp dims for `n_dims` rotated dims of a model trained on `n_ctx_orig` positions
    /// (ggml's `ggml_rope_yarn_corr_dims`): the pairs that turn `beta_fast` and `beta_slow`
    /// times over that context, floored and ceiled, within `0..n_dims - 1`.
    pub fn corr_dims(
        n_dims: usize,
        n_ctx_orig: usize,
        base: f32,
        beta_fast: f32,
        beta_slow: f32,
    ) -> [f32; 2] {
        let dim = |turns: f32| {
            n_dims as f32 * (n_ctx_orig as f32 / (turns * 2.0 * std::f32::consts::PI)).ln()
                / (2.0 * base.ln())
        };
        let (start, end) = (dim(beta_fast).floor(), dim(beta_slow).ceil());
        [start.max(0.0), end.min(n_dims as f32 - 1.0)]
    }
}

/// Llama 4's attention temperature (`attention.temperature_scale`, Mistral 3): the queries of
/// position `p` are multiplied, after RoPE, by `1 + scale * ln(1 + floor(p / floor))`. Past
/// `floor` positions (the original context) they sharpen slowly with the distance.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnTemp {
    pub scale: f32,
    /// Positions per step of the logarithm (YaRN's original context); at least 1.
    pub floor: usize,
}

impl AttnTemp {
    /// The factor of position `pos`, as llama.cpp computes it: the quotient in f32, the rest
    /// in f64, rounded to f32.
    pub fn at(&self, pos: usize) -> f32 {
        let steps = (pos as f32 / self.floor as f32).floor();
        ((f64::from(steps) + 1.0).ln() * f64::from(self.scale) + 1.0) as f32
    }

    /// Multiply each of the rows of `q` (`width` values each, at positions `pos0..`) by its
    /// position's factor (ggml's `ggml_mul` by a broadcast column).
    pub fn apply(&self, q: &mut [f32], width: usize, pos0: usize) {
        for (i, row) in q.chunks_exact_mut(width).enumerate() {
            let t = self.at(pos0 + i);
            row.iter_mut().for_each(|v| *v *= t);
        }
    }
}

impl Rope {
    /// The cosines and sines for position `pos`, `n_rot / 2` pairs, into `cs`: ggml's rope
    /// cache, YaRN's ramp included, its sums fused as ggml's compiler fuses them.
    #[inline]
    pub fn angles(&self, pos: usize, cs: &mut [(f32, f32)]) {
        let sc = &self.scaling;
        let theta_scale = self.base.powf(-2.0 / self.n_rot as f32);
        let yarn = sc.ext_factor != 0.0;
        let mscale = if yarn {
            sc.attn_factor * 0.1f32.mul_add((1.0 / sc.freq_scale).ln(), 1.0)
        } else {
            sc.attn_factor
        };
        let mut theta = pos as f32;
        for (i, cs) in cs.iter_mut().enumerate().take(self.n_rot / 2) {
            let ff = self.freq_factors.as_ref().map_or(1.0, |f| f[i]);
            let extrap = theta / ff;
            let interp = sc.freq_scale * extrap;
            let t = if yarn {
                let [low, high] = sc.corr_dims;
                let y = (i as f32 - low) / (high - low).max(0.001);
                let mix = (1.0 - y.clamp(0.0, 1.0)) * sc.ext_factor;
                interp.mul_add(1.0 - mix, extrap * mix)
            } else {
                interp
            };
            *cs = (t.cos() * mscale, t.sin() * mscale);
            theta *= theta_scale;
        }
    }

    /// Rotate every head of `x` (heads of `head_dim`) by the angles of one position. Always
    /// inlined, so that the forward pass's x86-64-v3 and AVX-512 builds compile it with FMA:
    /// called out of line, its multiply-adds were calls to libm's `fmaf`.
    #[inline(always)]
    pub fn apply(&self, x: &mut [f32], head_dim: usize, cs: &[(f32, f32)]) {
        let half = self.n_rot / 2;
        for head in x.chunks_exact_mut(head_dim) {
            for (i, &(c, s)) in cs.iter().enumerate().take(half) {
                let (a, b) = match self.style {
                    RopeStyle::Adjacent => (2 * i, 2 * i + 1),
                    RopeStyle::Neox => (i, i + half),
                };
                let (x0, x1) = (head[a], head[b]);
                // ggml's `x0*cos - x1*sin` and `x0*sin + x1*cos`, as its compiler contracts them
                // (the first product fused, the second rounded).
                head[a] = x0.mul_add(c, -(x1 * s));
                head[b] = x0.mul_add(s, x1 * c);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expf_ggml_is_within_two_ulp_of_exp() {
        for i in -2000..2000 {
            let x = i as f32 * 0.043;
            let (a, b) = (expf_ggml(x), x.exp());
            let ulp = f32::from_bits(b.to_bits() + 1) - b;
            assert!((a - b).abs() <= 2.0 * ulp, "{x}: {a} vs {b}");
        }
        assert_eq!(expf_ggml(-200.0), 0.0);
        assert_eq!(expf_ggml(200.0), f32::INFINITY);
    }

    /// The sixteen-lane SwiGLU and SiLU against the scalar forms, bit for bit: a sweep of the
    /// exponential's range (every 997th f32), its cut-offs, zeros, infinities and NaNs.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn vector_silu_matches_the_scalar_form() {
        if !synapse_quant::cpu().avx512f() {
            eprintln!("no AVX-512 F on this CPU: the sixteen-lane SiLU cannot run here");
            return;
        }
        let mut x: Vec<f32> = (0..u32::MAX / 997)
            .map(|i| f32::from_bits(i * 997))
            .collect();
        x.extend([
            0.0,
            -0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -f32::NAN,
        ]);
        x.extend([
            88.72, 88.73, -103.97, -103.98, 133.0, -133.0, 192.0, -192.0, 1e-40, -1e-40,
        ]);
        x.truncate(x.len() / 16 * 16);
        let u: Vec<f32> = (0..x.len()).map(|i| 0.5 + (i % 7) as f32 * 0.37).collect();
        let same = |what: &str, a: &[f32], b: &[f32]| {
            for (i, (a, b)) in a.iter().zip(b).enumerate() {
                assert!(
                    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()),
                    "{what} {}: {a} against {b}",
                    x[i]
                );
            }
        };
        let (mut a, mut b) = (x.clone(), x.clone());
        // SAFETY: AVX-512 F and FMA (checked above).
        unsafe { swiglu16(&mut a, &u) };
        swiglu_scalar(&mut b, &u);
        same("swiglu", &a, &b);
        let (mut a, mut b) = (x.clone(), x.clone());
        // SAFETY: as above.
        unsafe { silu16(&mut a) };
        silu_scalar(&mut b);
        same("silu", &a, &b);
    }

    /// Four rows' sums in step give each row's bits of one row at a time, in place or not, for
    /// row counts that leave every remainder.
    #[test]
    fn rms_norm_rows_match_one_row_at_a_time() {
        let mut seed = 0x2545_f491u32;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 17;
            seed ^= seed << 5;
            // A wide spread of magnitudes, so that the f64 sums round.
            (seed as f32 / u32::MAX as f32 - 0.5) * 10f32.powi((seed % 13) as i32 - 6)
        };
        let width = 67;
        let w: Vec<f32> = (0..width).map(|_| next()).collect();
        for n in [1, 3, 4, 5, 8, 11] {
            let x: Vec<f32> = (0..n * width).map(|_| next()).collect();
            let mut want = vec![0.0; n * width];
            for (xr, yr) in x.chunks_exact(width).zip(want.chunks_exact_mut(width)) {
                rms_norm(xr, &w, 1e-6, yr);
            }
            let mut got = vec![0.0; n * width];
            rms_norm_rows(&x, &w, 1e-6, &mut got, width);
            let mut inplace = x.clone();
            rms_norm_rows_inplace(&mut inplace, &w, 1e-6, width);
            for i in 0..n * width {
                assert_eq!(got[i].to_bits(), want[i].to_bits(), "{n} rows, value {i}");
                assert_eq!(
                    inplace[i].to_bits(),
                    want[i].to_bits(),
                    "{n} rows in place, value {i}"
                );
            }
        }
    }

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
                scaling: RopeScaling::NONE,
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

    #[test]
    fn gelu_table_is_ggmls() {
        // FNV-1a over ggml's `ggml_table_gelu_f16` (read from llama.cpp's x86-64 AVX-512 build
        // after `ggml_cpu_init`), every non-NaN entry in order. Without the fused multiply-add
        // in `gelu_tanh` one entry differs.
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for (i, v) in gelu_f16_table().iter().enumerate() {
            if !half::f16::from_bits(i as u16).is_nan() {
                h = (h ^ v.to_bits() as u64).wrapping_mul(0x100_0000_01b3);
            }
        }
        assert_eq!(h, 0x69c3_62a0_a24d_0647);
        // The vectorized form against the scalar one, bit for bit: every F16 value (and the
        // f32 values between them that round to it), the bounds, infinities and NaNs, with a
        // tail of three.
        let mut x: Vec<f32> = (0..=u16::MAX)
            .map(|b| half::f16::from_bits(b).to_f32())
            .chain((0..=u16::MAX).map(|b| {
                let v = half::f16::from_bits(b).to_f32();
                f32::from_bits(v.to_bits() ^ 0x1000)
            }))
            .collect();
        x.extend([
            -10.0,
            10.0,
            -9.999_999,
            9.999_999,
            f32::INFINITY,
            f32::NEG_INFINITY,
        ]);
        x.extend([f32::NAN, -f32::NAN, 1e-30, -1e-30, 65504.0, 65520.0, 1e10]);
        let u: Vec<f32> = (0..x.len()).map(|i| 0.5 + (i % 7) as f32 * 0.37).collect();
        let (mut a, mut b) = (x.clone(), x.clone());
        geglu(&mut a, &u);
        geglu_scalar(&mut b, &u);
        for (i, (a, b)) in a.iter().zip(&b).enumerate() {
            assert_eq!(a.to_bits(), b.to_bits(), "{}: {a} against {b}", x[i]);
        }
        let (mut g, u) = ([-12.0f32, -1.0, 0.0, 0.5, 3.0, 11.0], [2.0f32; 6]);
        geglu(&mut g, &u);
        assert_eq!(g[0], 0.0);
        assert_eq!(g[5], 22.0);
        for (g, x) in g
            .iter()
            .zip([-12.0f32, -1.0, 0.0, 0.5, 3.0, 11.0])
            .skip(1)
            .take(4)
        {
            assert!(
                (g - 2.0 * gelu_tanh(x)).abs() < 2e-3 * (1.0 + x.abs()),
                "{x}: {g}"
            );
        }
    }
}
