//! Byte layouts of the ggml block formats, as `#[repr(C)]` structs that can be cast from file
//! bytes in place. Each carries a size assertion; the layouts are ggml's (`ggml-common.h`).
//!
//! In the diagrams, `f16` is an IEEE half, `[n]` a byte array, and the numbers under a field its
//! byte offset.

use bytemuck::{Pod, Zeroable};
use half::f16;

/// Values in a K-quant super-block.
pub const QK_K: usize = 256;
/// Values in a legacy (non-K) block.
pub const QK: usize = 32;

/// Q4_0: 32 values, `x = d * (q - 8)`, q unsigned 4-bit.
/// ```text
/// | d: f16 | qs: [16]  low nibbles = values 0..16, high nibbles = values 16..32 |
///   0        2                                                               18
/// ```
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_0 {
    pub d: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_0>() == 18);

/// Q4_1: 32 values, `x = d * q + m`, q unsigned 4-bit.
/// ```text
/// | d: f16 | m: f16 | qs: [16] (nibbles as Q4_0) |
///   0        2        4                         20
/// ```
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4_1 {
    pub d: f16,
    pub m: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ4_1>() == 20);

/// Q5_0: 32 values, `x = d * (q - 16)`, q unsigned 5-bit: low 4 bits as Q4_0, bit 4 of value
/// `j` is bit `j` of the little-endian u32 `qh`.
/// ```text
/// | d: f16 | qh: [4] | qs: [16] |
///   0        2         6        22
/// ```
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_0 {
    pub d: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_0>() == 22);

/// Q5_1: 32 values, `x = d * q + m`, q unsigned 5-bit packed as Q5_0.
/// ```text
/// | d: f16 | m: f16 | qh: [4] | qs: [16] |
///   0        2        4         8        24
/// ```
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5_1 {
    pub d: f16,
    pub m: f16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockQ5_1>() == 24);

/// Q8_0: 32 values, `x = d * q`, q signed 8-bit. Also the activation format for Q4_0, Q5_0,
/// Q8_0 and IQ4_NL weights.
/// ```text
/// | d: f16 | qs: [32] i8 |
///   0        2           34
/// ```
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_0 {
    pub d: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_0>() == 34);

/// Q8_1: Q8_0 plus `s = d * sum(qs)`, which carries the min term of Q4_1/Q5_1 dot products.
/// ```text
/// | d: f16 | s: f16 | qs: [32] i8 |
///   0        2        4           36
/// ```
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8_1 {
    pub d: f16,
    pub s: f16,
    pub qs: [i8; QK],
}
const _: () = assert!(size_of::<BlockQ8_1>() == 36);

/// Q2_K: 256 values in 16 groups of 16. Group `g` has a 4-bit scale (`scales[g] & 15`) and a
/// 4-bit min (`scales[g] >> 4`); `x = d * scale * q - dmin * min`, q unsigned 2-bit. Value
/// `128 * h + 32 * s + l` (h < 2, s < 4, l < 32) is bits `2s..2s+2` of `qs[32 * h + l]`.
/// ```text
/// | scales: [16] | qs: [64] | d: f16 | dmin: f16 |
///   0              16         80       82        84
/// ```
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: f16,
    pub dmin: f16,
}
const _: () = assert!(size_of::<BlockQ2K>() == 84);

/// Q3_K: 256 values in 16 groups of 16, `x = d * (scale - 32) * q`, q in -4..=3. The low two
/// bits of q are packed as Q2_K's; the high bit of value `128 * h + 32 * s + l` is bit `4h + s`
/// of `hmask[l]`, and *clear* means subtract 4. The 6-bit scales: low nibble of group `g` is
/// `scales[g] & 15` for g < 8 and `scales[g - 8] >> 4` after; its top two bits are bits
/// `2 * (g / 4)` of `scales[8 + g % 4]`.
/// ```text
/// | hmask: [32] | qs: [64] | scales: [12] | d: f16 |
///   0             32         96             108      110
/// ```
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: f16,
}
const _: () = assert!(size_of::<BlockQ3K>() == 110);

/// Q4_K: 256 values in 8 sub-blocks of 32, each with a 6-bit scale and a 6-bit min packed in
/// `scales` (see [`k_scale_min`]); `x = d * scale * q - dmin * min`, q unsigned 4-bit. Value
/// `64 * p + l` is the low nibble of `qs[32 * p + l]` and value `64 * p + 32 + l` the high one.
/// ```text
/// | d: f16 | dmin: f16 | scales: [12] | qs: [128] |
///   0        2           4              16         144
/// ```
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ4K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ4K>() == 144);

/// Q5_K: Q4_K with a fifth bit per value: bit 4 of value `64 * p + 32 * h + l` is bit `2p + h`
/// of `qh[l]`.
/// ```text
/// | d: f16 | dmin: f16 | scales: [12] | qh: [32] | qs: [128] |
///   0        2           4              16         48         176
/// ```
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ5K {
    pub d: f16,
    pub dmin: f16,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockQ5K>() == 176);

/// Q6_K: 256 values in 16 groups of 16 with signed 8-bit scales, `x = d * scale * (q - 32)`, q
/// unsigned 6-bit. For half `h` (128 values) and `l < 32`, the four values `128h + l + 32k`
/// (k < 4) take their low nibble from `ql[64h + l]` (k = 0, 2: low/high nibble) or
/// `ql[64h + 32 + l]` (k = 1, 3), and their top two bits from bits `2k` of `qh[32h + l]`.
/// ```text
/// | ql: [128] | qh: [64] | scales: [16] i8 | d: f16 |
///   0           128        192               208      210
/// ```
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: f16,
}
const _: () = assert!(size_of::<BlockQ6K>() == 210);

/// Q8_K: the activation format of the K-quants and IQ4_XS. `x = d * q`, plus the sum of each
/// group of 16 quants, which carries the min terms of Q2_K/Q4_K/Q5_K dot products.
/// ```text
/// | d: f32 | qs: [256] i8 | bsums: [16] i16 |
///   0        4              260               292
/// ```
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockQ8K {
    pub d: f32,
    pub qs: [i8; QK_K],
    pub bsums: [i16; QK_K / 16],
}
const _: () = assert!(size_of::<BlockQ8K>() == 292);

/// The 16 non-uniform levels of IQ4_NL and IQ4_XS.
pub const KVALUES_IQ4NL: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// IQ4_NL: 32 values, `x = d * KVALUES_IQ4NL[q]`, q a 4-bit index packed as Q4_0.
/// ```text
/// | d: f16 | qs: [16] |
///   0        2        18
/// ```
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ4NL {
    pub d: f16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockIQ4NL>() == 18);

/// MXFP4's levels: twice the values of FP4 (E2M1), `0, 0.5, 1, 1.5, 2, 3, 4, 6` and their
/// negatives, as ggml stores them; [`e8m0_half`] halves the scale to match.
pub const KVALUES_MXFP4: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// MXFP4 (OCP microscaling, gpt-oss's experts): 32 values,
/// `x = e8m0_half(e) * KVALUES_MXFP4[q]`, q a 4-bit index packed as Q4_0. 17 bytes: its
/// blocks are not aligned in a row.
/// ```text
/// | e: u8 | qs: [16] |
///   0       1        17
/// ```
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockMXFP4 {
    pub e: u8,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(size_of::<BlockMXFP4>() == 17);

/// An E8M0 scale halved: `2^(e - 128)`, as ggml's `GGML_E8M0_TO_FP32_HALF` (subnormal for
/// `e < 2`; `e = 255`, E8M0's NaN, is not special-cased, as there).
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 {
        0x0020_0000u32 << e
    } else {
        (e as u32 - 1) << 23
    };
    f32::from_bits(bits)
}

/// IQ4_XS: 256 values in 8 sub-blocks of 32, each an IQ4_NL block without its own `d`:
/// `x = d * (ls - 32) * KVALUES_IQ4NL[q]`, with the 6-bit `ls` of sub-block `j` made of nibble
/// `j % 2` of `scales_l[j / 2]` and bits `2j..2j+2` of `scales_h` on top.
/// ```text
/// | d: f16 | scales_h: u16 | scales_l: [4] | qs: [128] |
///   0        2               4               8          136
/// ```
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
#[repr(C)]
pub struct BlockIQ4XS {
    pub d: f16,
    pub scales_h: u16,
    pub scales_l: [u8; QK_K / 64],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(size_of::<BlockIQ4XS>() == 136);

/// Scale and min of sub-block `j` (0..8) of a Q4_K or Q5_K block: eight 6-bit pairs in 12 bytes.
/// ```text
/// byte 0..4:  scale[0..4] in bits 0..6, top bits of scale[4..8] in bits 6..8
/// byte 4..8:  min[0..4]   in bits 0..6, top bits of min[4..8]   in bits 6..8
/// byte 8..12: low nibble = low bits of scale[4..8], high nibble = low bits of min[4..8]
/// ```
#[inline]
pub fn k_scale_min(scales: &[u8; 12], j: usize) -> (u8, u8) {
    if j < 4 {
        (scales[j] & 63, scales[j + 4] & 63)
    } else {
        (
            (scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4),
            (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4),
        )
    }
}

/// The eight 6-bit scales and the eight mins of a Q4_K/Q5_K super-block ([`k_scale_min`] for
/// every sub-block at once), unpacked four at a time in 32-bit words.
#[inline]
pub fn k_scales_mins(s: &[u8; 12]) -> ([u8; 8], [u8; 8]) {
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (w0, w1, w2) = (w(0), w(1), w(2));
    let sc_hi = (w2 & 0x0F0F_0F0F) | ((w0 >> 2) & 0x3030_3030);
    let mn_hi = ((w2 >> 4) & 0x0F0F_0F0F) | ((w1 >> 2) & 0x3030_3030);
    let join = |lo: u32, hi: u32| ((lo as u64) | ((hi as u64) << 32)).to_le_bytes();
    (join(w0 & 0x3F3F_3F3F, sc_hi), join(w1 & 0x3F3F_3F3F, mn_hi))
}

/// The sixteen 6-bit scales of a Q3_K block (0..64, before subtracting 32), as [`q3k_scale`]
/// gives them one by one, unpacked four at a time in 32-bit words: low nibbles from bytes
/// 0..8 (groups 0..8) and their high nibbles (8..16), the two high bits of group `g` from byte
/// `8 + g % 4` at bit `2 * (g / 4)`.
#[inline]
pub fn q3k_scales(s: &[u8; 12]) -> [u8; 16] {
    let w = |i: usize| u32::from_le_bytes([s[4 * i], s[4 * i + 1], s[4 * i + 2], s[4 * i + 3]]);
    let (w0, w1, hi) = (w(0), w(1), w(2));
    let join = |lo: u32, shift: u32| lo & 0x0F0F_0F0F | ((hi >> shift) & 0x0303_0303) << 4;
    let words = [join(w0, 0), join(w1, 2), join(w0 >> 4, 4), join(w1 >> 4, 6)];
    let mut out = [0u8; 16];
    for (o, w) in out.chunks_exact_mut(4).zip(words) {
        o.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// The 6-bit scale (0..64, before subtracting 32) of group `g` (0..16) of a Q3_K block.
#[inline]
pub fn q3k_scale(scales: &[u8; 12], g: usize) -> u8 {
    let low = if g < 8 {
        scales[g] & 0xF
    } else {
        scales[g - 8] >> 4
    };
    let high = (scales[8 + g % 4] >> (2 * (g / 4))) & 3;
    low | (high << 4)
}

/// The 6-bit scale (0..64, before subtracting 32) of sub-block `j` (0..8) of an IQ4_XS block.
#[inline]
pub fn iq4xs_scale(b: &BlockIQ4XS, j: usize) -> u8 {
    let low = (b.scales_l[j / 2] >> (4 * (j % 2))) & 0xF;
    let high = ((b.scales_h >> (2 * j)) & 3) as u8;
    low | (high << 4)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q3k_scales_unpacks_as_q3k_scale() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..4096 {
            let scales: [u8; 12] = std::array::from_fn(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            });
            for (g, &s) in q3k_scales(&scales).iter().enumerate() {
                assert_eq!(s, q3k_scale(&scales, g), "group {g} of {scales:?}");
            }
        }
    }

    #[test]
    fn k_scales_mins_unpacks_as_k_scale_min() {
        // Random scale bytes (xorshift).
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for _ in 0..4096 {
            let scales: [u8; 12] = std::array::from_fn(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state as u8
            });
            let (sc, mn) = k_scales_mins(&scales);
            for j in 0..8 {
                assert_eq!(
                    (sc[j], mn[j]),
                    k_scale_min(&scales, j),
                    "{scales:?} sub-block {j}"
                );
            }
        }
    }
}
