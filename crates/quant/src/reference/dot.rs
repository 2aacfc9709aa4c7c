//! Reference dot products of a weight row with a quantized activation row: the oracle the fast
//! kernels are tested against.
//!
//! Each block's integer sum is exact (i32); the floats are applied per block (per super-block
//! for the K-quants). Written for clarity, not speed.
//!
//! The 32-value formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0) sum their floats in the order of ggml's
//! x86 kernels (`Lanes8`), which llama.cpp runs on every AVX2 machine. Integer sums are exact in
//! any order, so matching the float order makes these dot products bit-identical to llama.cpp's,
//! and with them every matmul of a model in these formats: without it, last-bit differences flip
//! the rounding of requantized activations and the KL divergence to llama.cpp on SmolLM2 is ~3e-3
//! rather than ~1e-4.

use half::{bf16, f16};

use crate::blocks::*;
use crate::reference::dequant::{k_2bit, k_4bit, q3k_value, q5k_value, q6k_value};

/// F32 weights with F32 activations in the order of ggml's AVX-512 `ggml_vec_dot_f32`: the
/// 64-value part as [`vec_dot_f16_f16`]'s (four 16-lane accumulators, fused multiply-adds, the
/// same reduction), then the `n % 64` values left over as [`tail_f32`] adds them.
#[inline]
pub fn vec_dot_f32_f32(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    tail_f32(ggml_lanes_64(np, |e| (x[e], y[e])), &x[np..n], &y[np..n])
}

/// The leftovers of ggml's `ggml_vec_dot_f32` (`sumf += x[i] * y[i]` in f32), as GCC compiles
/// them in llama.cpp's x86-64 AVX-512 build (read from its machine code): sixteen values at a
/// time while sixteen are left, then eight if eight are, each product rounded to f32 and added
/// to the sum in order; the last one to seven with a fused multiply-add each.
#[inline]
pub fn tail_f32(mut sum: f32, x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let mut e = 0;
    let mut add_rounded = |len: usize, e: &mut usize| {
        for _ in 0..len {
            sum += x[*e] * y[*e];
            *e += 1;
        }
    };
    add_rounded(n / 16 * 16, &mut e);
    if n - e >= 8 {
        add_rounded(8, &mut e);
    }
    for i in e..n {
        sum = x[i].mul_add(y[i], sum);
    }
    sum
}

/// F16 weights with F16 activations (llama.cpp rounds activations to F16 for F16 weights, to
/// nearest even), in the order of ggml's AVX-512 `ggml_vec_dot_f16`, the kernel of its one-token
/// products: four 16-lane f32 accumulators over 64-value steps, accumulator `j` lane `l` taking
/// `fma(x[e], y[e], acc)` for `e = 64 i + 16 j + l`; then the accumulators added pairwise,
/// `(a0 + a2) + (a1 + a3)`, the 16 lanes reduced as `_mm512_reduce_add_ps` does
/// ([`reduce_add_16`]), and the `n % 64` values left over added one by one in f64 (each product
/// rounded to f32 first). The same on every ISA: the fast kernels are tested against this.
///
/// (For batches llama.cpp multiplies F16 with its tinyBLAS, in another order; synapse keeps
/// this one for every batch size, G1, and so matches llama.cpp's token-by-token logits.)
#[inline]
pub fn vec_dot_f16_f16(x: &[f16], y: &[f16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut sum = ggml_lanes_64(np, |e| (x[e].to_f32(), y[e].to_f32())) as f64;
    for e in np..n {
        sum += (x[e].to_f32() * y[e].to_f32()) as f64;
    }
    sum as f32
}

/// The 64-value part of ggml's AVX-512 `ggml_vec_dot_f16` and `ggml_vec_dot_f32` over values
/// `0..np` (`np` a multiple of 64), `xy(e)` giving the two factors of value `e`: four 16-lane
/// accumulators, accumulator `j` lane `l` taking `fma(x, y, acc)` for `e = 64 i + 16 j + l`;
/// then `(a0 + a2) + (a1 + a3)` lane by lane, and the lanes reduced by [`reduce_add_16`]. The
/// dot products of F16/F32 weights and attention's `q . k` differ only in their tails.
#[inline(always)]
pub fn ggml_lanes_64(np: usize, xy: impl Fn(usize) -> (f32, f32)) -> f32 {
    let mut acc = [[0.0f32; 16]; 4];
    for i in (0..np).step_by(64) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, a) in lanes.iter_mut().enumerate() {
                let (x, y) = xy(i + 16 * j + l);
                *a = x.mul_add(y, *a);
            }
        }
    }
    let v: [f32; 16] = std::array::from_fn(|l| (acc[0][l] + acc[2][l]) + (acc[1][l] + acc[3][l]));
    reduce_add_16(v)
}

/// The sum of 16 lanes in the order of `_mm512_reduce_add_ps`: halves, then quarters, then the
/// last four pairwise.
#[inline(always)]
pub fn reduce_add_16(v: [f32; 16]) -> f32 {
    let t8: [f32; 8] = std::array::from_fn(|i| v[i] + v[i + 8]);
    let t4: [f32; 4] = std::array::from_fn(|i| t8[i] + t8[i + 4]);
    (t4[0] + t4[2]) + (t4[1] + t4[3])
}

/// BF16 weights with BF16 activations (llama.cpp rounds activations to BF16 for BF16 weights,
/// [`crate::reference::quantize::quantize_bf16`]), in the order of ggml's `ggml_vec_dot_bf16`
/// as llama.cpp's x86-64 build runs it on a CPU with AVX512-BF16 (the reference's): two
/// accumulators of sixteen f32 lanes over 64-value steps, lane `l` of accumulator `j` taking
/// the pair of values `64 i + 32 j + 2 l` and `+ 1` as `vdpbf16ps` does ([`dpbf16_lane`]: the
/// odd one first); each accumulator reduced as `_mm512_reduce_add_ps` does
/// ([`reduce_add_16`]) and added to an f64 sum, then the `n % 64` values left over, each
/// product (exact in f32) added in f64.
#[inline]
pub fn vec_dot_bf16_bf16(x: &[bf16], y: &[bf16]) -> f32 {
    let n = x.len().min(y.len());
    let np = n & !63;
    let mut acc = [[0.0f32; 16]; 2];
    for i in (0..np).step_by(64) {
        for (j, lanes) in acc.iter_mut().enumerate() {
            for (l, a) in lanes.iter_mut().enumerate() {
                let e = i + 32 * j + 2 * l;
                *a = dpbf16_lane(*a, [x[e], x[e + 1]], [y[e], y[e + 1]]);
            }
        }
    }
    bf16_finish(acc, &x[np..n], &y[np..n])
}

/// The end of [`vec_dot_bf16_bf16`]: its two accumulators' lanes `acc` reduced and added in
/// f64, then the values left over past the 64-value steps (`x`, `y`).
#[inline]
pub fn bf16_finish(acc: [[f32; 16]; 2], x: &[bf16], y: &[bf16]) -> f32 {
    bf16_tail(reduce_add_16(acc[0]), reduce_add_16(acc[1]), x, y)
}

/// [`bf16_finish`] from its two reduced accumulators: ggml's f64 sum from zero (so that two
/// negative zeros give a positive one), then the leftovers.
#[inline]
pub fn bf16_tail(r0: f32, r1: f32, x: &[bf16], y: &[bf16]) -> f32 {
    let mut sum = 0.0f64;
    sum += r0 as f64;
    sum += r1 as f64;
    for (x, y) in x.iter().zip(y) {
        sum += (x.to_f32() * y.to_f32()) as f64;
    }
    sum as f32
}

/// One lane of `vdpbf16ps`: `acc + x1 y1`, then `+ x0 y0`, each a fused multiply-add rounded to
/// nearest even, with subnormal inputs taken as zero and subnormal results flushed to zero (of
/// their sign), as the instruction does whatever MXCSR says. (A product of two BF16 values is
/// exact in f32, so fused or not is the same but for underflow.)
#[inline(always)]
pub fn dpbf16_lane(acc: f32, x: [bf16; 2], y: [bf16; 2]) -> f32 {
    let daz = |v: bf16| {
        let f = v.to_f32();
        if f.is_subnormal() {
            0.0f32.copysign(f)
        } else {
            f
        }
    };
    let ftz = |v: f32| {
        if v.is_subnormal() {
            0.0f32.copysign(v)
        } else {
            v
        }
    };
    let a = ftz(daz(x[1]).mul_add(daz(y[1]), ftz(acc)));
    ftz(daz(x[0]).mul_add(daz(y[0]), a))
}

/// Σ over a 32-value block of `w(j) * y[j]`, with `w(j)` the integer weight of value `j`.
#[inline]
fn block_isum(y: &[i8; QK], w: impl Fn(usize) -> i32) -> i32 {
    (0..QK).map(|j| w(j) * y[j] as i32).sum()
}

/// ggml's x86 summation order for 32-value blocks: eight float accumulators, accumulator `j`
/// taking, block by block, `fma(d_x * d_y, s_j, acc_j)` where `s_j` is the exact integer sum of
/// values `4j..4j+4` of the block; at the end one horizontal sum in the tree order of ggml's
/// `hsum_float_8`: `((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7))`.
struct Lanes8([f32; 8]);

impl Lanes8 {
    fn new() -> Lanes8 {
        Lanes8([0.0; 8])
    }

    #[inline]
    fn add_block(&mut self, dd: f32, y: &[i8; QK], w: impl Fn(usize) -> i32) {
        // Unpack first, then fixed-size sums: a shape the compiler vectorises.
        let w: [i32; QK] = std::array::from_fn(w);
        let mut lanes = [0i32; 8];
        for (e, (&w, &y)) in w.iter().zip(y).enumerate() {
            lanes[e / 4] += w * y as i32;
        }
        self.add_lanes(dd, &lanes);
    }

    /// `acc_j = fma(d, lane_j, acc_j)` for exact integer lane sums.
    #[inline]
    fn add_lanes(&mut self, d: f32, lanes: &[i32; 8]) {
        for (acc, &s) in self.0.iter_mut().zip(lanes) {
            *acc = d.mul_add(s as f32, *acc);
        }
    }

    fn hsum(&self) -> f32 {
        let a = &self.0;
        ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]))
    }
}

#[inline]
fn nibble(qs: &[u8; 16], j: usize) -> u8 {
    if j < 16 {
        qs[j] & 0xF
    } else {
        qs[j - 16] >> 4
    }
}

#[inline]
fn q5_value(qs: &[u8; 16], qh: [u8; 4], j: usize) -> u8 {
    nibble(qs, j) | (((u32::from_le_bytes(qh) >> j) & 1) as u8) << 4
}

#[inline]
pub fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = Lanes8::new();
    for (x, y) in x.iter().zip(y) {
        acc.add_block(x.d.to_f32() * y.d.to_f32(), &y.qs, |j| {
            nibble(&x.qs, j) as i32 - 8
        });
    }
    acc.hsum()
}

#[inline]
pub fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = Lanes8::new();
    // The min terms, in block order (ggml's compiler fuses this multiply-add).
    let mut mins = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        mins = x.m.to_f32().mul_add(y.s.to_f32(), mins);
        acc.add_block(x.d.to_f32() * y.d.to_f32(), &y.qs, |j| {
            nibble(&x.qs, j) as i32
        });
    }
    acc.hsum() + mins
}

#[inline]
pub fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = Lanes8::new();
    for (x, y) in x.iter().zip(y) {
        acc.add_block(x.d.to_f32() * y.d.to_f32(), &y.qs, |j| {
            q5_value(&x.qs, x.qh, j) as i32 - 16
        });
    }
    acc.hsum()
}

#[inline]
pub fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut acc = Lanes8::new();
    let mut mins = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        mins = x.m.to_f32().mul_add(y.s.to_f32(), mins);
        acc.add_block(x.d.to_f32() * y.d.to_f32(), &y.qs, |j| {
            q5_value(&x.qs, x.qh, j) as i32
        });
    }
    acc.hsum() + mins
}

#[inline]
pub fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = Lanes8::new();
    for (x, y) in x.iter().zip(y) {
        acc.add_block(x.d.to_f32() * y.d.to_f32(), &y.qs, |j| x.qs[j] as i32);
    }
    acc.hsum()
}

#[inline]
pub fn vec_dot_iq4_nl_q8_0(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    let kv = |x: &BlockIQ4NL, j: usize| KVALUES_IQ4NL[nibble(&x.qs, j) as usize] as i32;
    paired_blocks(x, y, |x| x.d.to_f32(), kv)
}

/// MXFP4 in ggml's x86 `vec_dot` order: IQ4_NL's, with the block's E8M0 scale.
#[inline]
pub fn vec_dot_mxfp4_q8_0(x: &[BlockMXFP4], y: &[BlockQ8_0]) -> f32 {
    let kv = |x: &BlockMXFP4, j: usize| KVALUES_MXFP4[nibble(&x.qs, j) as usize] as i32;
    paired_blocks(x, y, |x| e8m0_half(x.e), kv)
}

/// ggml's x86 order for the table formats (IQ4_NL, MXFP4) whose weights have one `scale` a
/// block: blocks in pairs, even blocks into one set of eight lanes and odd into another, the two
/// added lane by lane before the horizontal sum; a last odd block is fused onto that sum.
#[inline(always)]
fn paired_blocks<X>(
    x: &[X],
    y: &[BlockQ8_0],
    scale: impl Fn(&X) -> f32,
    kv: impl Fn(&X, usize) -> i32,
) -> f32 {
    let (mut even, mut odd) = (Lanes8::new(), Lanes8::new());
    let pairs = x.len() / 2;
    for ib in 0..pairs {
        let (x0, y0, x1, y1) = (&x[2 * ib], &y[2 * ib], &x[2 * ib + 1], &y[2 * ib + 1]);
        even.add_block(y0.d.to_f32() * scale(x0), &y0.qs, |j| kv(x0, j));
        odd.add_block(y1.d.to_f32() * scale(x1), &y1.qs, |j| kv(x1, j));
    }
    let mut sum = Lanes8(std::array::from_fn(|l| even.0[l] + odd.0[l])).hsum();
    if let (Some(x), Some(y)) = (x.get(2 * pairs), y.get(2 * pairs)) {
        let isum = block_isum(&y.qs, |j| kv(x, j));
        sum = (y.d.to_f32() * scale(x)).mul_add(isum as f32, sum);
    }
    sum
}

/// The eight lanes of a super-block in ggml's x86 order: lane `l` sums `w[v] * y[v]` over the
/// values `v` whose index mod 32 is in `4l..4l+4`. `w` holds each value times its scale.
#[inline]
fn k_lanes(w: &[i32; QK_K], y: &[i8; QK_K]) -> [i32; 8] {
    let mut lanes = [0i32; 8];
    for (wc, yc) in w.chunks_exact(32).zip(y.chunks_exact(32)) {
        for (l, lane) in lanes.iter_mut().enumerate() {
            for b in 4 * l..4 * l + 4 {
                *lane += wc[b] * yc[b] as i32;
            }
        }
    }
    lanes
}

/// Σ over group `g` of 16 values of `w(i) * y.qs[i]`.
#[inline]
fn group_isum(y: &BlockQ8K, g: usize, len: usize, w: impl Fn(usize) -> i32) -> i32 {
    (g * len..(g + 1) * len)
        .map(|i| w(i) * y.qs[i] as i32)
        .sum()
}

#[inline]
pub fn vec_dot_q2_k_q8_k(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    // ggml's x86 order: per super-block, first the min term as eight lanes (lane l:
    // min[2l] * bsum[2l] + min[2l+1] * bsum[2l+1]) fused by -d_y * dmin_x, then the main term in
    // the eight lanes of the other K-quants fused by d_y * d_x, into the same accumulators.
    let mut acc = Lanes8::new();
    for (x, y) in x.iter().zip(y) {
        let min_lanes: [i32; 8] = std::array::from_fn(|l| {
            (x.scales[2 * l] >> 4) as i32 * y.bsums[2 * l] as i32
                + (x.scales[2 * l + 1] >> 4) as i32 * y.bsums[2 * l + 1] as i32
        });
        acc.add_lanes(-y.d * x.dmin.to_f32(), &min_lanes);
        let w: [i32; QK_K] =
            std::array::from_fn(|v| (x.scales[v / 16] & 0xF) as i32 * k_2bit(&x.qs, v) as i32);
        let lanes = k_lanes(&w, &y.qs);
        acc.add_lanes(y.d * x.d.to_f32(), &lanes);
    }
    acc.hsum()
}

#[inline]
pub fn vec_dot_q3_k_q8_k(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    // ggml's x86 order: the eight lanes of the other K-quants, fused by d_y * d_x.
    let mut acc = Lanes8::new();
    for (x, y) in x.iter().zip(y) {
        let scales: [i32; 16] = std::array::from_fn(|g| q3k_scale(&x.scales, g) as i32 - 32);
        let w: [i32; QK_K] = std::array::from_fn(|v| scales[v / 16] * q3k_value(x, v) as i32);
        acc.add_lanes(y.d * x.d.to_f32(), &k_lanes(&w, &y.qs));
    }
    acc.hsum()
}

/// Σ_j min_j * (bsums of the two groups of 16 that make sub-block j).
fn k_min_sum(scales: &[u8; 12], y: &BlockQ8K) -> i32 {
    (0..8)
        .map(|j| {
            let (_, m) = k_scale_min(scales, j);
            m as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32)
        })
        .sum()
}

#[inline]
pub fn vec_dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    // ggml's x86 order. Main term: per super-block eight exact integer lanes (lane `l` takes the
    // values whose index mod 32 is in 4l..4l+4, each times its sub-block's scale), one fused
    // multiply-add by d_y * d_x into eight accumulators. Min term: four lanes, lane `p` holding
    // min[2p] * (bsum[4p] + bsum[4p+1]) + min[2p+1] * (bsum[4p+2] + bsum[4p+3]), fused into four
    // accumulators by -d_y * dmin_x. Result: hsum8(main) + ((m0 + m2) + (m1 + m3)).
    let mut acc = Lanes8::new();
    let mut mins = [0.0f32; 4];
    for (x, y) in x.iter().zip(y) {
        let (sc, mn): ([i32; 8], [i32; 8]) = {
            let pairs: [(u8, u8); 8] = std::array::from_fn(|j| k_scale_min(&x.scales, j));
            (pairs.map(|p| p.0 as i32), pairs.map(|p| p.1 as i32))
        };
        let dmin = -y.d * x.dmin.to_f32();
        for (p, m) in mins.iter_mut().enumerate() {
            let sub = |j: usize| y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32;
            let prod = mn[2 * p] * sub(2 * p) + mn[2 * p + 1] * sub(2 * p + 1);
            *m = dmin.mul_add(prod as f32, *m);
        }
        let mut lanes = [0i32; 8];
        for (v, &a) in y.qs.iter().enumerate() {
            lanes[(v % 32) / 4] += sc[v / 32] * k_4bit(&x.qs, v) as i32 * a as i32;
        }
        acc.add_lanes(y.d * x.d.to_f32(), &lanes);
    }
    acc.hsum() + ((mins[0] + mins[2]) + (mins[1] + mins[3]))
}

#[inline]
pub fn vec_dot_q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    // ggml's x86 order: the main term in eight lanes as Q4_K's; the min term reduced to one
    // integer per super-block and fused into one running float by -d_y * dmin_x.
    let mut acc = Lanes8::new();
    let mut mins = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let pairs: [(u8, u8); 8] = std::array::from_fn(|j| k_scale_min(&x.scales, j));
        let total: i32 = (0..8)
            .map(|j| pairs[j].1 as i32 * (y.bsums[2 * j] as i32 + y.bsums[2 * j + 1] as i32))
            .sum();
        mins = (-y.d * x.dmin.to_f32()).mul_add(total as f32, mins);
        let mut lanes = [0i32; 8];
        for (v, &a) in y.qs.iter().enumerate() {
            lanes[(v % 32) / 4] += pairs[v / 32].0 as i32 * q5k_value(x, v) as i32 * a as i32;
        }
        acc.add_lanes(y.d * x.d.to_f32(), &lanes);
    }
    acc.hsum() + mins
}

#[inline]
pub fn vec_dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    // ggml's x86 order: per super-block, eight exact integer lanes (lane `l` takes values whose
    // index mod 32 is in 4l..4l+4, with q unsigned in 0..64, and then subtracts
    // 32 * (bsum[2l] * scale[2l] + bsum[2l+1] * scale[2l+1])), one fused multiply-add of the lanes
    // by d_y * d_x into eight float accumulators, one horizontal sum at the end.
    let mut acc = Lanes8::new();
    for (x, y) in x.iter().zip(y) {
        let mut lanes = [0i32; 8];
        for (v, &a) in y.qs.iter().enumerate() {
            let q = q6k_value(x, v) as i32 + 32;
            lanes[(v % 32) / 4] += x.scales[v / 16] as i32 * q * a as i32;
        }
        for (l, lane) in lanes.iter_mut().enumerate() {
            let s = y.bsums[2 * l] as i32 * x.scales[2 * l] as i32
                + y.bsums[2 * l + 1] as i32 * x.scales[2 * l + 1] as i32;
            *lane -= 32 * s;
        }
        acc.add_lanes(y.d * x.d.to_f32(), &lanes);
    }
    acc.hsum()
}

#[inline]
pub fn vec_dot_iq4_xs_q8_k(x: &[BlockIQ4XS], y: &[BlockQ8K]) -> f32 {
    // ggml's x86 order: the eight lanes of the K-quants, fused by d_x * d_y.
    let mut acc = Lanes8::new();
    for (x, y) in x.iter().zip(y) {
        let ls: [i32; 8] = std::array::from_fn(|j| iq4xs_scale(x, j) as i32 - 32);
        let w: [i32; QK_K] = std::array::from_fn(|v| {
            let (j, l) = (v / 32, v % 32);
            let q = if l < 16 {
                x.qs[16 * j + l] & 0xF
            } else {
                x.qs[16 * j + l - 16] >> 4
            };
            ls[j] * KVALUES_IQ4NL[q as usize] as i32
        });
        acc.add_lanes(x.d.to_f32() * y.d, &k_lanes(&w, &y.qs));
    }
    acc.hsum()
}

// ---------------------------------------------------------------------------------------------
// The order of llama.cpp's repacked kernels. On x86 with AVX2, llama.cpp stores Q4_0, IQ4_NL, MXFP4,
// Q4_K and (with AVX-512) Q2_K weight matrices whose row count is a multiple of 8 interleaved
// eight rows at a time and multiplies them with its own gemv, whose per-row float order differs
// from `vec_dot`'s: each block's (super-block's) exact integer sum is fused into one running
// float by d_x * d_y, and the K-quants keep their min term in a second running float that is
// subtracted at the end. These functions are that order; the engine uses them for the matrices
// llama.cpp repacks, so that logits stay bit-identical to llama.cpp's.

/// Repacked-order Q4_0: `acc = fma(isum, d_x * d_y, acc)` block by block.
#[inline]
pub fn vec_dot_q4_0_q8_0_rows8(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum = block_isum(&y.qs, |j| nibble(&x.qs, j) as i32 - 8);
        acc = (isum as f32).mul_add(x.d.to_f32() * y.d.to_f32(), acc);
    }
    acc
}

/// Repacked-order IQ4_NL: as [`vec_dot_q4_0_q8_0_rows8`].
#[inline]
pub fn vec_dot_iq4_nl_q8_0_rows8(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum = block_isum(&y.qs, |j| KVALUES_IQ4NL[nibble(&x.qs, j) as usize] as i32);
        acc = (isum as f32).mul_add(x.d.to_f32() * y.d.to_f32(), acc);
    }
    acc
}

/// Repacked-order MXFP4: as [`vec_dot_q4_0_q8_0_rows8`], with the block's E8M0 scale.
#[inline]
pub fn vec_dot_mxfp4_q8_0_rows8(x: &[BlockMXFP4], y: &[BlockQ8_0]) -> f32 {
    let mut acc = 0.0f32;
    for (x, y) in x.iter().zip(y) {
        let isum = block_isum(&y.qs, |j| KVALUES_MXFP4[nibble(&x.qs, j) as usize] as i32);
        acc = (isum as f32).mul_add(e8m0_half(x.e) * y.d.to_f32(), acc);
    }
    acc
}

/// Repacked-order Q4_K: main and min terms in two running floats, subtracted at the end.
#[inline]
pub fn vec_dot_q4_k_q8_k_rows8(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let (mut main, mut mins) = (0.0f32, 0.0f32);
    for (x, y) in x.iter().zip(y) {
        let isum: i32 = (0..8)
            .map(|j| {
                let (sc, _) = k_scale_min(&x.scales, j);
                sc as i32 * group_isum(y, j, 32, |i| k_4bit(&x.qs, i) as i32)
            })
            .sum();
        main = (isum as f32).mul_add(x.d.to_f32() * y.d, main);
        mins = (k_min_sum(&x.scales, y) as f32).mul_add(x.dmin.to_f32() * y.d, mins);
    }
    main - mins
}

/// Repacked-order Q2_K: as [`vec_dot_q4_k_q8_k_rows8`].
#[inline]
pub fn vec_dot_q2_k_q8_k_rows8(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let (mut main, mut mins) = (0.0f32, 0.0f32);
    for (x, y) in x.iter().zip(y) {
        let (mut isum, mut msum) = (0i32, 0i32);
        for g in 0..16 {
            let sc = x.scales[g];
            isum += (sc & 0xF) as i32 * group_isum(y, g, 16, |i| k_2bit(&x.qs, i) as i32);
            msum += (sc >> 4) as i32 * y.bsums[g] as i32;
        }
        main = (isum as f32).mul_add(x.d.to_f32() * y.d, main);
        mins = (msum as f32).mul_add(x.dmin.to_f32() * y.d, mins);
    }
    main - mins
}
