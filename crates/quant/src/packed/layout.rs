//! The packed layout of weight matrices, ISA-neutral: sixteen rows moved block by block so
//! that each 4-byte word of a block lies as sixteen consecutive words, one per row (see
//! [`crate::x86::avx512::packed`] for why, and for the kernels that read it;
//! [`crate::x86::avx2::packed`] reads the same bytes eight rows a register). Here: the packed
//! blocks of each format and how a file's blocks are packed into them ([`Pack`],
//! [`pack_groups`]), and what a packed format is to [`crate::packed`] ([`PackedFormat`]).
//! Plain Rust: the kernels' own side of a format (its registers) lives with them, and only
//! x86-64 has such kernels today.

use bytemuck::{Pod, Zeroable};

use crate::blocks::*;
use crate::pages::Pages;
use crate::{GgmlType, QuantError};

/// Rows per group: one per i32 lane of a 512-bit register.
pub(crate) const ROWS: usize = 16;

/// A packed format: one value holds one block of each of sixteen rows.
pub(crate) trait Pack: Pod + Send {
    /// The file's block.
    type W: Pod + Sync;
    /// Block `b` of each of the sixteen rows (`rows[r]`).
    fn pack(rows: [&Self::W; ROWS]) -> Self;
    /// Whether the layout holds this block exactly (a matrix with a block it does not hold
    /// stays unpacked).
    fn holds(_: &Self::W) -> bool {
        true
    }
}

/// The little-endian 4-byte word `i` of `bytes`.
#[inline]
fn word(bytes: &[u8], i: usize) -> u32 {
    u32::from_le_bytes(bytes[4 * i..4 * i + 4].try_into().expect("4 bytes"))
}

/// Pack whole groups of sixteen rows (`groups` of them, `per_row` blocks a row) of `w` into
/// new anonymous memory: group `g`'s blocks are elements `g * per_row..(g + 1) * per_row` of
/// the `[P]` it holds. The groups are split over the machine's cores; after each piece, `release` is
/// given the file's bytes of the rows just packed (so that the process does not hold both
/// copies of a large matrix at once).
pub(crate) fn pack_groups<P: Pack>(
    w: &[P::W],
    per_row: usize,
    groups: usize,
    release: &(dyn Fn(&[u8]) + Sync),
) -> std::io::Result<Pages> {
    let bytes = groups * per_row * size_of::<P>();
    let mut pages = Pages::zeroed(bytes)?;
    let packed: &mut [P] = bytemuck::cast_slice_mut(pages.as_mut_slice());
    in_pieces(packed, per_row, &|first, out: &mut [P]| {
        for (i, group) in out.chunks_exact_mut(per_row).enumerate() {
            let g = first + i;
            for (b, p) in group.iter_mut().enumerate() {
                *p = P::pack(std::array::from_fn(|r| &w[(ROWS * g + r) * per_row + b]));
            }
        }
        let rows = &w[ROWS * first * per_row..ROWS * (first + out.len() / per_row) * per_row];
        release(bytemuck::cast_slice(rows));
    });
    Ok(pages)
}

/// `groups` groups of sixteen rows of `w` (`row_bytes` each) packed by `pack_group(g, out)`
/// (group `g`'s bytes into `out`, as many) into new anonymous memory ([`Pages`]), piece
/// by piece over the cores ([`in_pieces`]), `release` given each piece's rows once packed: the
/// float formats' packing, whose groups are bytes laid out anew rather than blocks.
pub(crate) fn pack_row_groups(
    w: &[u8],
    row_bytes: usize,
    groups: usize,
    release: &(dyn Fn(&[u8]) + Sync),
    pack_group: &(dyn Fn(usize, &mut [u8]) + Sync),
) -> std::io::Result<Pages> {
    let group_bytes = ROWS * row_bytes;
    let bytes = groups * group_bytes;
    let mut pages = Pages::zeroed(bytes)?;
    in_pieces(pages.as_mut_slice(), group_bytes, &|first, out| {
        for (i, out) in out.chunks_exact_mut(group_bytes).enumerate() {
            pack_group(first + i, out);
        }
        let n = out.len() / group_bytes;
        release(&w[first * group_bytes..(first + n) * group_bytes]);
    });
    Ok(pages)
}

/// `out` (whole groups of `per_group` elements) filled piece by piece over the machine's
/// cores: pieces of about 1 MiB, dealt to the threads round-robin, each given to `fill` with
/// the index of its first group.
pub(crate) fn in_pieces<T: Send>(
    out: &mut [T],
    per_group: usize,
    fill: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    let piece = (1 << 20) / (per_group * size_of::<T>()).max(1) + 1;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut pieces: Vec<(usize, &mut [T])> = out
        .chunks_mut(piece * per_group.max(1))
        .enumerate()
        .map(|(i, out)| (i * piece, out))
        .collect();
    if threads <= 1 || pieces.len() <= 1 {
        for (first, out) in pieces {
            fill(first, out);
        }
        return;
    }
    let mut shares: Vec<Vec<(usize, &mut [T])>> = (0..threads).map(|_| Vec::new()).collect();
    for (i, p) in pieces.drain(..).enumerate() {
        shares[i % threads].push(p);
    }
    std::thread::scope(|s| {
        for share in shares {
            s.spawn(|| {
                for (first, out) in share {
                    fill(first, out);
                }
            });
        }
    });
}

// ---------------------------------------------------------------------------------------------
// The K-quants and IQ4_XS: 256-value blocks.

/// One Q4_K block of sixteen rows (2304 bytes, sixteen blocks' worth). The scales come first,
/// in the order the kernels read a block: its one-token pass streams with the hardware's
/// prefetchers alone on AMD's cores before Zen 5 ([`Ahead::Stream`]), and with the scales at
/// the block's end each block began with a jump forward and back, which read less of the
/// memory (measurements: docs/perf-log.md, "Packed layouts: each block's heads first").
///
/// [`Ahead::Stream`]: crate::x86::Ahead::Stream
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct Q4KPacked {
    /// `sc[m][r]`: bytes `4m..4m + 4` of row `r`'s twelve bytes of 6-bit scales and mins.
    pub(crate) sc: [[u32; ROWS]; 3],
    pub(crate) d: [u16; ROWS],
    pub(crate) dmin: [u16; ROWS],
    /// `qs[m][r]`: bytes `4m..4m + 4` of row `r`'s quants (`m = 8j + k`: values `4k..4k + 4`
    /// of sub-block `2j` in the low nibbles, of `2j + 1` in the high nibbles).
    pub(crate) qs: [[u32; ROWS]; 32],
}
const _: () = assert!(size_of::<Q4KPacked>() == ROWS * size_of::<BlockQ4K>());

impl Pack for Q4KPacked {
    type W = BlockQ4K;
    fn pack(rows: [&BlockQ4K; ROWS]) -> Self {
        let mut p = Self::zeroed();
        for (r, x) in rows.into_iter().enumerate() {
            for (m, qs) in p.qs.iter_mut().enumerate() {
                qs[r] = word(&x.qs, m);
            }
            for (m, sc) in p.sc.iter_mut().enumerate() {
                sc[r] = word(&x.scales, m);
            }
            p.d[r] = x.d.to_bits();
            p.dmin[r] = x.dmin.to_bits();
        }
        p
    }
}

/// One Q2_K block of sixteen rows (1344 bytes, sixteen blocks' worth).
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct Q2KPacked {
    /// Word `m` of each row's 64 bytes of bit pairs (`m = 8h + k`; bits `2s..2s + 2`: values
    /// `128h + 32s + 4k..+4`).
    pub(crate) qs: [[u32; ROWS]; 16],
    /// Word `m` of each row's sixteen bytes of (scale, min) nibbles.
    pub(crate) sc: [[u32; ROWS]; 4],
    pub(crate) d: [u16; ROWS],
    pub(crate) dmin: [u16; ROWS],
}
const _: () = assert!(size_of::<Q2KPacked>() == ROWS * size_of::<BlockQ2K>());

impl Pack for Q2KPacked {
    type W = BlockQ2K;
    fn pack(rows: [&BlockQ2K; ROWS]) -> Self {
        let mut p = Self::zeroed();
        for (r, x) in rows.into_iter().enumerate() {
            for (m, qs) in p.qs.iter_mut().enumerate() {
                qs[r] = word(&x.qs, m);
            }
            for (m, sc) in p.sc.iter_mut().enumerate() {
                sc[r] = word(&x.scales, m);
            }
            p.d[r] = x.d.to_bits();
            p.dmin[r] = x.dmin.to_bits();
        }
        p
    }
}

/// One Q6_K block of sixteen rows laid out for [`q6_k_pass`]'s paired products (3360 bytes,
/// sixteen blocks' worth). `vec_dot`'s lane `l` (values whose index mod 32 is in `4l..4l + 4`)
/// of pair `p` (groups `4p + l / 4` and `4p + 2 + l / 4`: values `64p + 4l..+4` and
/// `64p + 32 + 4l..+4`) lies in two words of a row, `R1 = [a0, a1, b0, b1]` and
/// `R2 = [a2, a3, b2, b3]`, so that `vpmaddubsw` of each against the token's values in the
/// same order, added as words, gives the two groups' four-value sums as the halves of each
/// word. The four words of pairs `2h` and `2h + 1` (`R1, R2, R1, R2`) are stored in three,
/// triple `2l + h`: three in their low six bits, the fourth's six bits in their top two bits
/// (its bits 0-1, 2-3, 4-5).
///
/// [`q6_k_pass`]: crate::x86::avx512::packed
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct Q6KPairs {
    /// Words `3τ..3τ + 3` of each row: triple `τ` ([`q6_k_triple`]).
    ///
    /// [`q6_k_triple`]: crate::x86::avx512::packed
    pub(crate) q: [[u32; ROWS]; 48],
    /// Word `m` of each row's sixteen i8 scales.
    pub(crate) sc: [[u32; ROWS]; 4],
    pub(crate) d: [u16; ROWS],
}
const _: () = assert!(size_of::<Q6KPairs>() == ROWS * size_of::<BlockQ6K>());

impl Pack for Q6KPairs {
    type W = BlockQ6K;
    fn pack(rows: [&BlockQ6K; ROWS]) -> Self {
        let mut p = Self::zeroed();
        for (r, x) in rows.into_iter().enumerate() {
            let qv = q6k_unsigned(x);
            let q = |i: usize| qv[i];
            for l in 0..8 {
                for h in 0..2 {
                    let v: [[u8; 4]; 4] = lane_words(l, 2 * h, q);
                    let tau = 2 * l + h;
                    for (i, shift) in [0, 2, 4].into_iter().enumerate() {
                        let word: [u8; 4] =
                            std::array::from_fn(|j| v[i][j] | ((v[3][j] >> shift) & 3) << 6);
                        p.q[3 * tau + i][r] = u32::from_le_bytes(word);
                    }
                }
            }
            for (m, sc) in p.sc.iter_mut().enumerate() {
                sc[r] = word(bytemuck::cast_slice(&x.scales), m);
            }
            p.d[r] = x.d.to_bits();
        }
        p
    }
}

/// Every value of a Q6_K block unsigned (`q6k_value + 32`, 0..64), in one pass over its bytes
/// in their own order: packing value by value (the index arithmetic per value) took a third
/// of a Llama-3.2-1B-shaped file's load.
fn q6k_unsigned(b: &BlockQ6K) -> [u8; QK_K] {
    let mut q = [0u8; QK_K];
    for h in 0..2 {
        for k in 0..4 {
            let (ql, qh) = (&b.ql[64 * h + 32 * (k % 2)..][..32], &b.qh[32 * h..][..32]);
            let out = &mut q[128 * h + 32 * k..][..32];
            for l in 0..32 {
                out[l] = (ql[l] >> (4 * (k / 2))) & 0xF | ((qh[l] >> (2 * k)) & 3) << 4;
            }
        }
    }
    q
}

/// Every value of a Q3_K block unsigned (`q3k_value + 4`, 0..8), as [`q6k_unsigned`].
fn q3k_unsigned(b: &BlockQ3K) -> [u8; QK_K] {
    let mut u = [0u8; QK_K];
    for h in 0..2 {
        for k in 0..4 {
            let (qs, hm) = (&b.qs[32 * h..][..32], &b.hmask[..32]);
            let out = &mut u[128 * h + 32 * k..][..32];
            for l in 0..32 {
                out[l] = (qs[l] >> (2 * k)) & 3 | ((hm[l] >> (4 * h + k)) & 1) << 2;
            }
        }
    }
    u
}

/// Lane `l`'s words `w = 2p + e` for pairs `p0..p0 + W / 2` of a row as [`Q6KPairs`] and
/// [`Q3KPairs`] pair values: byte `j` of word `w` is `value(64p + 32 (j / 2) + 4l + 2e + j % 2)`
/// (`[a0 a1 b0 b1]`, `[a2 a3 b2 b3]` of the groups at `64p + 4l` and `64p + 32 + 4l`).
fn lane_words<const W: usize>(l: usize, p0: usize, value: impl Fn(usize) -> u8) -> [[u8; 4]; W] {
    std::array::from_fn(|w| {
        let (p, e) = (p0 + w / 2, w % 2);
        std::array::from_fn(|j| value(64 * p + 32 * (j / 2) + 4 * l + 2 * e + j % 2))
    })
}

/// One Q5_K block of sixteen rows (2816 bytes, sixteen blocks' worth).
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct Q5KPacked {
    /// Word `m` of each row's 128 bytes of nibbles (`m = 8p + k`: values `64p + 4k..+4` in the
    /// low nibbles, `64p + 32 + 4k..+4` in the high).
    pub(crate) qs: [[u32; ROWS]; 32],
    /// Word `k` of each row's 32 bytes of fifth bits (bit `2p + h` of byte `l`: value `64p +
    /// 32h + l`).
    pub(crate) qh: [[u32; ROWS]; 8],
    /// As Q4_K's.
    pub(crate) sc: [[u32; ROWS]; 3],
    pub(crate) d: [u16; ROWS],
    pub(crate) dmin: [u16; ROWS],
}
const _: () = assert!(size_of::<Q5KPacked>() == ROWS * size_of::<BlockQ5K>());

impl Pack for Q5KPacked {
    type W = BlockQ5K;
    fn pack(rows: [&BlockQ5K; ROWS]) -> Self {
        let mut p = Self::zeroed();
        for (r, x) in rows.into_iter().enumerate() {
            for (m, qs) in p.qs.iter_mut().enumerate() {
                qs[r] = word(&x.qs, m);
            }
            for (m, qh) in p.qh.iter_mut().enumerate() {
                qh[r] = word(&x.qh, m);
            }
            for (m, sc) in p.sc.iter_mut().enumerate() {
                sc[r] = word(&x.scales, m);
            }
            p.d[r] = x.d.to_bits();
            p.dmin[r] = x.dmin.to_bits();
        }
        p
    }
}

/// One Q3_K block of sixteen rows laid out for [`q3_k_pass`]'s paired products (1760 bytes,
/// sixteen blocks' worth), as [`Q6KPairs`] lays Q6_K out: lane `l`'s eight words of a row
/// (`2p + e`, pair `p`: `[a0 a1 b0 b1]` and `[a2 a3 b2 b3]` of groups `4p + l / 4` and
/// `4p + 2 + l / 4`), one byte a value `u = q + 4` (0..8, `q` the signed value), stored as
/// three words whose bytes are `u0 | u1 << 3 | (u6 & 3) << 6`,
/// `u2 | u3 << 3 | (u6 >> 2) << 6 | (u7 & 1) << 7` and `u4 | u5 << 3 | (u7 >> 1) << 6`
/// ([`q3_k_octet`]).
///
/// [`q3_k_pass`]: crate::x86::avx512::packed
/// [`q3_k_octet`]: crate::x86::avx512::packed
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct Q3KPairs {
    /// Words `3l..3l + 3` of each row: lane `l`'s 32 values.
    pub(crate) q: [[u32; ROWS]; 24],
    /// Word `m` of each row's twelve bytes of 6-bit scales.
    pub(crate) sc: [[u32; ROWS]; 3],
    pub(crate) d: [u16; ROWS],
}
const _: () = assert!(size_of::<Q3KPairs>() == ROWS * size_of::<BlockQ3K>());

impl Pack for Q3KPairs {
    type W = BlockQ3K;
    fn pack(rows: [&BlockQ3K; ROWS]) -> Self {
        let mut p = Self::zeroed();
        for (r, x) in rows.into_iter().enumerate() {
            let uv = q3k_unsigned(x);
            let u = |i: usize| uv[i];
            for l in 0..8 {
                let v: [[u8; 4]; 8] = lane_words(l, 0, u);
                let words: [[u8; 4]; 3] = [
                    std::array::from_fn(|j| v[0][j] | v[1][j] << 3 | (v[6][j] & 3) << 6),
                    std::array::from_fn(|j| {
                        v[2][j] | v[3][j] << 3 | (v[6][j] >> 2) << 6 | (v[7][j] & 1) << 7
                    }),
                    std::array::from_fn(|j| v[4][j] | v[5][j] << 3 | (v[7][j] >> 1) << 6),
                ];
                for (i, word) in words.into_iter().enumerate() {
                    p.q[3 * l + i][r] = u32::from_le_bytes(word);
                }
            }
            for (m, sc) in p.sc.iter_mut().enumerate() {
                sc[r] = word(&x.scales, m);
            }
            p.d[r] = x.d.to_bits();
        }
        p
    }
}

/// One IQ4_XS block of sixteen rows (2176 bytes, sixteen blocks' worth).
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct IQ4XSPacked {
    /// Word `m` of each row's 128 bytes of level indices (`m = 4j + k`: values `32j + 4k..+4`
    /// in the low nibbles, `32j + 16 + 4k..+4` in the high).
    pub(crate) qs: [[u32; ROWS]; 32],
    /// Each row's four bytes of the scales' low four bits.
    pub(crate) scales_l: [u32; ROWS],
    /// Each row's two high bits of the eight scales.
    pub(crate) scales_h: [u16; ROWS],
    pub(crate) d: [u16; ROWS],
}
const _: () = assert!(size_of::<IQ4XSPacked>() == ROWS * size_of::<BlockIQ4XS>());

impl Pack for IQ4XSPacked {
    type W = BlockIQ4XS;
    fn pack(rows: [&BlockIQ4XS; ROWS]) -> Self {
        let mut p = Self::zeroed();
        for (r, x) in rows.into_iter().enumerate() {
            for (m, qs) in p.qs.iter_mut().enumerate() {
                qs[r] = word(&x.qs, m);
            }
            p.scales_l[r] = u32::from_le_bytes(x.scales_l);
            p.scales_h[r] = x.scales_h;
            p.d[r] = x.d.to_bits();
        }
        p
    }
}

// ---------------------------------------------------------------------------------------------
// The 32-value formats.

/// One Q8_0 block of sixteen rows (544 bytes), each value stored plus 128; the scales first,
/// as Q4_K's ([`Q4KPacked`]), which read more of the memory than the scales last
/// (measurements: docs/perf-log.md, "Packed layouts: each block's heads first").
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct Q8_0Packed {
    pub(crate) d: [u16; ROWS],
    pub(crate) q: [[u32; ROWS]; 8],
}
const _: () = assert!(size_of::<Q8_0Packed>() == ROWS * size_of::<BlockQ8_0>());

impl Pack for Q8_0Packed {
    type W = BlockQ8_0;
    fn pack(rows: [&BlockQ8_0; ROWS]) -> Self {
        let mut p = Self::zeroed();
        for (r, x) in rows.into_iter().enumerate() {
            for (l, q) in p.q.iter_mut().enumerate() {
                q[r] = word(bytemuck::cast_slice(&x.qs), l) ^ 0x8080_8080;
            }
            p.d[r] = x.d.to_bits();
        }
        p
    }
}

/// The fifth bits of a row of Q5_0/Q5_1 (the little-endian `qh`: bit `v` for value `v`),
/// reordered so that bit `l` of byte `i` is the bit of value `4l + i`: lane `l`'s four bits
/// then move to bit 4 of their bytes with one shift.
fn fifth_bits(qh: [u8; 4]) -> u32 {
    let qh = u32::from_le_bytes(qh);
    (0..32)
        .map(|v| ((qh >> v) & 1) << (8 * (v % 4) + v / 4))
        .fold(0, |a, b| a | b)
}

/// A packed 4-bit 32-value format: `$name` for `$block`; `qh`: with fifth bits; `min`: with a
/// min (its kernels' side, against its activations: `crate::x86::packed_common`'s
/// `pack32_nibbles`). The heads (scales, mins, fifth bits) come first, in the order the
/// one-token passes read a block, as Q4_K's and Q8_0's do: with them after the values each
/// block began with a load a few lines ahead and then went back, which read less of the memory
/// and decoded slower (measurements: docs/perf-log.md, "Packed layouts: each block's heads
/// first").
macro_rules! packed_nibbles {
    ($(#[$doc:meta])* $name:ident: $block:ty, qh $qh:tt, min $min:tt) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Pod, Zeroable)]
        #[repr(C)]
        pub(crate) struct $name {
            pub(crate) d: [u16; ROWS],
            pub(crate) m: [[u16; ROWS]; $min as usize],
            pub(crate) qh: [[u32; ROWS]; $qh as usize],
            pub(crate) qs: [[u32; ROWS]; 4],
        }
        const _: () = assert!(size_of::<$name>() == ROWS * size_of::<$block>());

        impl Pack for $name {
            type W = $block;
            #[allow(unused_variables)] // `x` without fifth bits or a min
            fn pack(rows: [&$block; ROWS]) -> Self {
                let mut p = Self::zeroed();
                for (r, x) in rows.into_iter().enumerate() {
                    for (m, qs) in p.qs.iter_mut().enumerate() {
                        qs[r] = word(&x.qs, m);
                    }
                    packed_nibbles!(@heads p, r, x, qh $qh, min $min);
                    p.d[r] = x.d.to_bits();
                }
                p
            }
        }
    };
    (@heads $p:ident, $r:ident, $x:ident, qh true, min $min:tt) => {
        $p.qh[0][$r] = fifth_bits($x.qh);
        packed_nibbles!(@heads $p, $r, $x, qh false, min $min);
    };
    (@heads $p:ident, $r:ident, $x:ident, qh false, min true) => {
        $p.m[0][$r] = $x.m.to_bits();
    };
    (@heads $p:ident, $r:ident, $x:ident, qh false, min false) => {};
}

packed_nibbles!(
    /// One Q4_0 block of sixteen rows (288 bytes), in `vec_dot` order.
    Q4_0Packed: BlockQ4_0, qh false, min false
);
packed_nibbles!(
    /// One Q4_1 block of sixteen rows (320 bytes).
    Q4_1Packed: BlockQ4_1, qh false, min true
);
packed_nibbles!(
    /// One Q5_0 block of sixteen rows (352 bytes), fifth bits as [`fifth_bits`].
    Q5_0Packed: BlockQ5_0, qh true, min false
);
packed_nibbles!(
    /// One Q5_1 block of sixteen rows (384 bytes), fifth bits as [`fifth_bits`].
    Q5_1Packed: BlockQ5_1, qh true, min true
);

/// One IQ4_NL block of sixteen rows (288 bytes): Q4_0's layout (its scales first), each
/// nibble an index into the sixteen non-uniform levels. (Its one-token pass read about as much
/// of the memory either way, and its file decoded a little faster with the scales first:
/// docs/perf-log.md, "Packed layouts: each block's heads first".)
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct IQ4NLPacked {
    pub(crate) d: [u16; ROWS],
    pub(crate) qs: [[u32; ROWS]; 4],
}
const _: () = assert!(size_of::<IQ4NLPacked>() == ROWS * size_of::<BlockIQ4NL>());

impl Pack for IQ4NLPacked {
    type W = BlockIQ4NL;
    fn pack(rows: [&BlockIQ4NL; ROWS]) -> Self {
        let (d, qs) = pack_levels(rows, |x| (x.d.to_bits(), &x.qs));
        IQ4NLPacked { d, qs }
    }
}

/// The packed layout of the formats of an F16 scale and 16 bytes of nibbles a block (IQ4_NL's,
/// MXFP4's): the sixteen rows' scales, then their words of nibbles, word by word.
fn pack_levels<W>(
    rows: [&W; ROWS],
    block: impl Fn(&W) -> (u16, &[u8; QK / 2]),
) -> ([u16; ROWS], [[u32; ROWS]; 4]) {
    let (mut d, mut qs) = ([0u16; ROWS], [[0u32; ROWS]; 4]);
    for (r, x) in rows.into_iter().enumerate() {
        let (scale, bytes) = block(x);
        d[r] = scale;
        for (m, words) in qs.iter_mut().enumerate() {
            words[r] = word(bytes, m);
        }
    }
    (d, qs)
}

/// One MXFP4 block of sixteen rows (288 bytes): IQ4_NL's layout, each block's E8M0 scale held
/// as the F16 of the same value ([`mxfp4_scale_f16`]), which the packed kernels widen exactly.
#[derive(Clone, Copy, Pod, Zeroable)]
#[repr(C)]
pub(crate) struct MXFP4Packed {
    pub(crate) d: [u16; ROWS],
    pub(crate) qs: [[u32; ROWS]; 4],
}

/// The bits of the F16 equal to an MXFP4 block's scale ([`e8m0_half`]), where one is: scales of
/// 2^-24 to 2^15 (2^-128 to 2^127 in E8M0); 0 for a block whose levels are all zero (its
/// products are 0 whatever the scale). Real weights' scales are far inside that range.
pub(crate) fn mxfp4_scale_f16(x: &BlockMXFP4) -> Option<u16> {
    let zero =
        |q: u8| KVALUES_MXFP4[(q & 0xF) as usize] == 0 && KVALUES_MXFP4[(q >> 4) as usize] == 0;
    if x.qs.iter().all(|&q| zero(q)) {
        return Some(0);
    }
    let d = half::f16::from_f32(e8m0_half(x.e));
    (d.to_f32() == e8m0_half(x.e)).then(|| d.to_bits())
}

impl Pack for MXFP4Packed {
    type W = BlockMXFP4;
    fn pack(rows: [&BlockMXFP4; ROWS]) -> Self {
        let (d, qs) = pack_levels(rows, |x| {
            let d = mxfp4_scale_f16(x).expect("only blocks it holds are packed");
            (d, &x.qs)
        });
        MXFP4Packed { d, qs }
    }
    fn holds(x: &BlockMXFP4) -> bool {
        mxfp4_scale_f16(x).is_some()
    }
}

// ---------------------------------------------------------------------------------------------
// Packed formats.

/// The product of packed groups with a batch of tokens: `(packed groups' bytes, blocks per
/// row, activation blocks, tokens, out)`, `out` as `(n_tok, 16 * groups)`.
pub(crate) type PackedFn = fn(&[u8], usize, &[u8], usize, &mut [f32]) -> Result<(), QuantError>;

/// Pack the first `groups` groups of sixteen rows of a matrix: `(rows' bytes, row_bytes,
/// groups, release)`, as [`pack_groups`].
pub(crate) type PackFn =
    fn(&[u8], usize, usize, &(dyn Fn(&[u8]) + Sync)) -> Result<Pages, PackError>;

/// Why a matrix could not be packed.
pub(crate) enum PackError {
    Quant(QuantError),
    /// No memory for the packed copy.
    Io(std::io::Error),
    /// A block the layout does not hold ([`Pack::holds`]): the matrix stays unpacked.
    Declined,
}

impl From<QuantError> for PackError {
    fn from(e: QuantError) -> Self {
        PackError::Quant(e)
    }
}

/// A packed format's pieces: how to pack a matrix, its kernel, its packed block's bytes.
pub(crate) struct PackedFormat {
    pub pack: PackFn,
    pub kernel: PackedFn,
    pub block_bytes: usize,
    /// Weights (rows times columns) a call of a batch product should cover at least, in
    /// calls of at least [`TILE_ROWS`] rows: more than that only where the kernel has work on
    /// the tokens to spread over more rows.
    pub tile_weights: usize,
}

/// Rows a call of a batch product, for most formats: the kernels tile for the caches inside.
pub(crate) const TILE_ROWS: usize = 64;

/// Check and cast the operands of a packed kernel.
pub(crate) fn operands<'p, 'a, P: Pod, A: crate::codec::Block>(
    ty: GgmlType,
    act: GgmlType,
    p: &'p [u8],
    per_row: usize,
    a: &'a [u8],
    n_tok: usize,
    out: &[f32],
) -> Result<(&'p [P], &'a [A]), QuantError> {
    let bad = || QuantError::DotLength {
        ty,
        act,
        weights: p.len() / size_of::<P>() * ROWS * ty.block_len(),
        activations: a.len() / size_of::<A>() * act.block_len(),
    };
    let p: &[P] = bytemuck::try_cast_slice(p).map_err(|_| bad())?;
    let a: &[A] = crate::codec::cast_blocks::<A>(a)?;
    let groups = p.len() / per_row.max(1);
    let fits = per_row > 0
        && p.len() == groups * per_row
        && a.len() == n_tok * per_row
        && out.len() == n_tok * ROWS * groups;
    if fits {
        Ok((p, a))
    } else {
        Err(bad())
    }
}

macro_rules! packed_format {
    ($name:ident: $p:ty, $act:ty, $ty:expr, $act_ty:expr => $driver:expr) => {
        $crate::packed::layout::packed_format!(
            $name: $p, $act, $ty, $act_ty => $driver, 0
        );
    };
    ($name:ident: $p:ty, $act:ty, $ty:expr, $act_ty:expr => $driver:expr, $tile_weights:expr) => {
        pub(crate) static $name: $crate::packed::layout::PackedFormat =
            $crate::packed::layout::PackedFormat {
                pack: |w, row_bytes, groups, release| {
                    let x = $crate::codec::cast_blocks::<
                        <$p as $crate::packed::layout::Pack>::W,
                    >(w)?;
                    let per_row =
                        row_bytes / size_of::<<$p as $crate::packed::layout::Pack>::W>();
                    if per_row == 0 || x.len() < groups * ROWS * per_row {
                        return Err($crate::packed::layout::PackError::Quant(
                            $crate::QuantError::ByteLength {
                                ty: $ty,
                                bytes: w.len(),
                            },
                        ));
                    }
                    let held = x[..groups * ROWS * per_row]
                        .iter()
                        .all(<$p as $crate::packed::layout::Pack>::holds);
                    if !held {
                        return Err($crate::packed::layout::PackError::Declined);
                    }
                    $crate::packed::layout::pack_groups::<$p>(x, per_row, groups, release)
                        .map_err($crate::packed::layout::PackError::Io)
                },
                kernel: |p, per_row, a, n_tok, out| {
                    let (p, a) = $crate::packed::layout::operands::<$p, $act>(
                        $ty, $act_ty, p, per_row, a, n_tok, out,
                    )?;
                    // SAFETY: the kernel table hands these formats out only where `Cpu::runs` the
                    // features of their row's `Isa`, which the drivers need; the operands' sizes agree (checked above).
                    unsafe { $driver(p, per_row, a, out) };
                    Ok(())
                },
                block_bytes: size_of::<$p>(),
                tile_weights: $tile_weights,
            };
    };
}

pub(crate) use packed_format;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reference::dequant::{q3k_value, q6k_value};

    /// The packers' one-pass unpacking gives the reference's values (random blocks).
    #[test]
    fn one_pass_unpacking_gives_the_reference_values() {
        use rand::SeedableRng;
        let mut rng = rand::rngs::StdRng::seed_from_u64(23);
        let random = crate::test_util::random_weights;
        for _ in 0..200 {
            let b6: BlockQ6K = bytemuck::pod_read_unaligned(&random(&mut rng, GgmlType::Q6_K, 1));
            let b3: BlockQ3K = bytemuck::pod_read_unaligned(&random(&mut rng, GgmlType::Q3_K, 1));
            let (q6, q3) = (q6k_unsigned(&b6), q3k_unsigned(&b3));
            for i in 0..QK_K {
                assert_eq!(
                    q6[i] as i32,
                    q6k_value(&b6, i) as i32 + 32,
                    "Q6_K value {i}"
                );
                assert_eq!(q3[i] as i32, q3k_value(&b3, i) as i32 + 4, "Q3_K value {i}");
            }
        }
    }
}
