//! What the packed kernels of both x86 tiers share ([`crate::x86::avx512::packed`] and
//! [`crate::x86::avx2::packed`], on the layout of [`crate::packed::layout`]): the register loads of a
//! packed block's rows, the passes over a batch's tokens, the tokens' tables built once a call,
//! and the 32-value formats' lanes ([`Pack32`]), which each tier reads in its own width. Neither
//! kernel module is imported here.

use std::arch::x86_64::*;
use std::cell::RefCell;

use crate::blocks::*;
use crate::packed::layout::{
    IQ4NLPacked, MXFP4Packed, Pack, Q4_0Packed, Q4_1Packed, Q5_0Packed, Q5_1Packed, Q8_0Packed,
    ROWS,
};
use crate::x86::avx512::ktile::q8_k_pair_sums;
use crate::x86::Ahead;

/// Sixteen consecutive u32 as a register.
#[inline(always)]
pub(super) unsafe fn ld(p: &[u32; ROWS]) -> __m512i {
    // SAFETY: 64 readable bytes; AVX-512 F (the callers' features).
    unsafe { _mm512_loadu_si512(p.as_ptr().cast()) }
}

/// Rows `8h..8h + 8` of sixteen consecutive u32, as a register.
#[inline(always)]
pub(super) unsafe fn ld8(p: &[u32; ROWS], h: usize) -> __m256i {
    // SAFETY: 32 readable bytes (h < 2); AVX (the callers' features).
    unsafe { _mm256_loadu_si256(p.as_ptr().add(8 * h).cast()) }
}

/// The 16 bytes of a `vpshufb` control that builds each 4-byte word from bytes `sel` of the
/// same word (0x80: a zero byte), for one 128-bit lane.
#[inline(always)]
pub(super) fn word_shuffle_bytes(sel: [u8; 4]) -> [u8; 16] {
    let mut c = [0u8; 16];
    for p in 0..4 {
        for i in 0..4 {
            c[4 * p + i] = if sel[i] == 0x80 {
                0x80
            } else {
                4 * p as u8 + sel[i]
            };
        }
    }
    c
}

/// `(a & 0x0F) | b` per byte, for `b` that has only bits 4 and 5 (or 4) set.
#[inline(always)]
pub(super) unsafe fn nibble_or(a: __m512i, b: __m512i) -> __m512i {
    // SAFETY: AVX-512 F (the callers' features). Truth table (a, b, c): (a & c) | b.
    unsafe { _mm512_ternarylogic_epi32::<0xEC>(a, b, _mm512_set1_epi32(0x0F0F_0F0F)) }
}

/// An F16's value by F16C (`vcvtph2ps`).
///
/// # Safety
/// The CPU must have F16C.
#[inline(always)]
unsafe fn f16_to_f32(bits: u16) -> f32 {
    // SAFETY: the caller's features.
    unsafe { _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))) }
}

// ---------------------------------------------------------------------------------------------
// Passes over the tokens.

/// `$pass!(T, t0)` for tokens `t0..t0 + T` over tokens `0..$n_tok`: passes of `$full`, then
/// one pass of those left (`$rest` lists every count below `$full`).
macro_rules! token_passes {
    ($n_tok:expr, $pass:ident, $full:expr, [$($rest:literal)*]) => {{
        let mut t0 = 0;
        while $n_tok - t0 >= $full {
            $pass!($full, t0);
            t0 += $full;
        }
        match $n_tok - t0 {
            0 => {}
            $($rest => $pass!($rest, t0),)*
            _ => unreachable!("a rest list covers every count below the pass"),
        }
    }};
}

pub(super) use token_passes;

/// Every group of packed blocks `$p` (`$per_row` blocks each) times every token of `$a`, in
/// passes of `$full` tokens and one of those left (`$rest` lists every count below `$full`):
/// `$f::<T>(group, [each token's blocks], [each token's rows of each table of `$tabs`, a
/// parenthesised list], out, (stride, r0, t0))`, `out` being `(n_tok, 16 * groups)`. A pass reads the group's blocks once.
macro_rules! group_passes {
    ($p:expr, $per_row:expr, $a:expr, $out:expr, $f:ident, $full:literal,
     [$($rest:literal)*], $tabs:tt) => {{
        let (p, per_row, a) = ($p, $per_row, $a);
        let rows = $crate::packed::layout::ROWS;
        let stride = p.len() / per_row * rows;
        let n_tok = a.len() / per_row;
        for (gi, g) in p.chunks_exact(per_row).enumerate() {
            let mut t0 = 0;
            while n_tok - t0 >= $full {
                group_passes!(@pass $full, t0, $f, g, $out, (stride, rows * gi), per_row, a, $tabs);
                t0 += $full;
            }
            match n_tok - t0 {
                0 => {}
                $($rest => group_passes!(
                    @pass $rest, t0, $f, g, $out, (stride, rows * gi), per_row, a, $tabs
                ),)*
                _ => unreachable!("a rest list covers every count below the pass"),
            }
        }
    }};
    (@pass $n:expr, $t0:expr, $f:ident, $g:expr, $out:expr, $at:expr, $per_row:expr,
     $a:expr, ($($tab:expr),*)) => {
        $f::<{ $n }>(
            $g,
            std::array::from_fn(|t| &$a[($t0 + t) * $per_row..][..$per_row]),
            $(std::array::from_fn(|t| &$tab[($t0 + t) * $per_row..][..$per_row]),)*
            $out,
            ($at.0, $at.1, $t0),
        )
    };
}

pub(super) use group_passes;

/// [`group_passes`] for kernels that take a group's blocks unpacked: `$unpack(group, $vb)` once
/// before the group's passes, then `$f::<T>((group, &$vb[..]), ...)` for each pass, each pass
/// first asking for its share of the next group's bytes ([`crate::x86::prefetch_share`]):
/// unpacking a group from memory waited for it, and the K-quant files' prefill ran slower
/// without the requests (measurements: docs/perf-log.md, "Prefetch: asked for as the loop
/// goes").
macro_rules! unpacked_passes {
    ($p:expr, $per_row:expr, $a:expr, $out:expr, $unpack:ident, $vb:expr, $f:ident,
     $full:literal, [$($rest:literal)*], $tabs:tt) => {{
        let (p, per_row, a, vb) = ($p, $per_row, $a, $vb);
        let rows = $crate::packed::layout::ROWS;
        let stride = p.len() / per_row * rows;
        let n_tok = a.len() / per_row;
        let parts = n_tok.div_ceil($full);
        for (gi, g) in p.chunks_exact(per_row).enumerate() {
            $unpack(g, vb);
            let next = p.get((gi + 1) * per_row..(gi + 2) * per_row).unwrap_or(&[]);
            let next: &[u8] = bytemuck::cast_slice(next);
            macro_rules! pass {
                ($n:expr, $t0:expr) => {{
                    $crate::x86::prefetch_share(next, $t0 / $full, parts);
                    group_passes!(@pass $n, $t0, $f, (g, &vb[..]), $out, (stride, rows * gi),
                        per_row, a, $tabs)
                }};
            }
            token_passes!(n_tok, pass, $full, [$($rest)*]);
        }
    }};
}

pub(super) use unpacked_passes;

/// The two entries of a pass body `$body::<T, UNPACKED>`: `$direct`, which unpacks as it goes
/// (the shape [`group_passes`] calls), and `$unpacked`, which reads a group unpacked once into
/// entries of type `$v` (the shape [`unpacked_passes`] calls); both with the CPU features
/// `$features`, and the per-token arguments `$arg: $ty` between the group and `out`.
macro_rules! pass_entries {
    ($features:literal, $body:ident $(<$paired:literal>)?: $direct:ident, $unpacked:ident,
     $p:ty, $v:ty, ($($arg:ident: $ty:ty),*)) => {
        #[doc = concat!(
            "[`", stringify!($body), "`] unpacking as it goes (up to a pass of tokens)."
        )]
        #[inline]
        #[target_feature(enable = $features)]
        fn $direct<const T: usize>(
            g: &[$p],
            $($arg: $ty,)*
            out: &mut [f32],
            at: (usize, usize, usize),
        ) {
            // SAFETY: this function's features.
            unsafe { $body::<T, false $(, $paired)?>((g, &[]), $($arg,)* out, at) }
        }

        #[doc = concat!("[`", stringify!($body), "`] from the group unpacked once.")]
        #[inline]
        #[target_feature(enable = $features)]
        fn $unpacked<const T: usize>(
            g: (&[$p], &[$v]),
            $($arg: $ty,)*
            out: &mut [f32],
            at: (usize, usize, usize),
        ) {
            // SAFETY: this function's features.
            unsafe { $body::<T, true $(, $paired)?>(g, $($arg,)* out, at) }
        }
    };
}

pub(super) use pass_entries;

// ---------------------------------------------------------------------------------------------
// The tokens of the K-quants, prepared once a call.

thread_local! {
    /// Each thread's per-call token tables, reused from call to call.
    pub(super) static PAIR_SUMS: RefCell<Vec<[i16; 8]>> = const { RefCell::new(Vec::new()) };
    /// Each thread's tokens reordered for Q6_K's paired products ([`q6_k_acts`]).
    pub(super) static Q6K_ACTS: RefCell<Vec<Q6KAct>> = const { RefCell::new(Vec::new()) };
}

/// Each token block's eight sub-block sums (what the mins of Q4_K and Q5_K multiply), into
/// `ps`.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) fn pair_sums(a: &[BlockQ8K], ps: &mut Vec<[i16; 8]>) {
    ps.clear();
    ps.extend(a.iter().map(|y| {
        let mut s = [0i16; 8];
        // SAFETY: 16 writable bytes.
        unsafe { _mm_storeu_si128(s.as_mut_ptr().cast(), q8_k_pair_sums(y)) };
        s
    }));
}

/// A token's Q8_K block in the order [`Q6KPairs`] pairs values (its 16-bit words of each 64
/// values `64p..64p + 64` interleaved, the first half's with the second's: the bytes `R1` and
/// `R2` of lane `l`, pair `p` multiply lie at `64p + 8l` and `64p + 8l + 4`), its group sums
/// times -2, and its scale.
///
/// [`Q6KPairs`]: crate::packed::layout::Q6KPairs
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct Q6KAct {
    pub(super) qs: [i8; QK_K],
    /// `-2 * bsums` (what the scales times 16 multiply: the `-32` offset).
    pub(super) nb: [i16; 16],
    pub(super) d: f32,
}

/// Every token block of `a` as a [`Q6KAct`], into `ya`.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
pub(super) unsafe fn q6_k_acts(a: &[BlockQ8K], ya: &mut Vec<Q6KAct>) {
    ya.clear();
    for y in a {
        let mut o = Q6KAct {
            qs: [0; QK_K],
            nb: [0; 16],
            d: y.d,
        };
        // SAFETY: the caller's features; the 16 sums.
        unsafe {
            interleave_halves(&y.qs, &mut o.qs, _mm256_setzero_si256());
            let bs = _mm256_loadu_si256(y.bsums.as_ptr().cast());
            let nb = _mm256_sub_epi16(_mm256_setzero_si256(), _mm256_add_epi16(bs, bs));
            _mm256_storeu_si256(o.nb.as_mut_ptr().cast(), nb);
        }
        ya.push(o);
    }
}

/// A token's Q8_K block for [`q3_k_pass`]: its values in [`Q6KAct`]'s order (plus 128, as
/// unsigned bytes, for [`Q3KActs::Flipped`]), `off` as [`Q3KActs`] says, and its scale.
///
/// [`q3_k_pass`]: crate::x86::avx512::packed
#[derive(Clone, Copy)]
#[repr(C)]
pub(crate) struct Q3KAct {
    pub(super) qs: [i8; QK_K],
    pub(super) off: [u32; 32],
    pub(super) d: f32,
}

/// A block's 256 values with the 16-bit words of each 64 interleaved, the first half's with the
/// second's ([`Q6KAct`]'s order), each byte xor `flip`.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
unsafe fn interleave_halves(src: &[i8; QK_K], dst: &mut [i8; QK_K], flip: __m256i) {
    // SAFETY: the caller's features; 32-byte halves of the 256 values.
    unsafe {
        for p in 0..4 {
            let from = src[64 * p..].as_ptr();
            let lo = _mm256_xor_si256(_mm256_loadu_si256(from.cast()), flip);
            let hi = _mm256_xor_si256(_mm256_loadu_si256(from.add(32).cast()), flip);
            let (ulo, uhi) = (_mm256_unpacklo_epi16(lo, hi), _mm256_unpackhi_epi16(lo, hi));
            let to = dst[64 * p..].as_mut_ptr();
            _mm256_storeu_si256(to.cast(), _mm256_permute2x128_si256::<0x20>(ulo, uhi));
            _mm256_storeu_si256(
                to.add(32).cast(),
                _mm256_permute2x128_si256::<0x31>(ulo, uhi),
            );
        }
    }
}

/// What [`q3_k_acts`] makes of a token block besides its values.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Q3KActs {
    /// `off` entry `8p + l`: each lane and pair's two groups' `-4 * (y0 + y1 + y2 + y3)` as a
    /// word's halves (the `-4` of `q = u - 4`), for the passes that unpack as they go.
    Offsets,
    /// The values plus 128, as unsigned bytes (the AVX-VNNI passes over folded groups).
    Flipped,
    /// `off` entry `l`: `-128` times the sum of lane `l`'s 32 values, as an i32 (the AVX-512
    /// passes over unpacked groups, [`q3_k_unpack`]).
    ///
    /// [`q3_k_unpack`]: crate::x86::avx512::packed
    LaneSums,
}

/// Every token block of `a` as a [`Q3KAct`], into `ya`, in the `form` its passes take.
///
/// # Safety
/// The CPU must have AVX2.
#[inline(always)]
pub(super) unsafe fn q3_k_acts(a: &[BlockQ8K], ya: &mut Vec<Q3KAct>, form: Q3KActs) {
    ya.clear();
    for y in a {
        let mut o = Q3KAct {
            qs: [0; QK_K],
            off: [0; 32],
            d: y.d,
        };
        // SAFETY: the caller's features; 32-byte halves of the values, 32-byte rows of `off`.
        unsafe {
            let flip = _mm256_set1_epi8(if form == Q3KActs::Flipped { -128 } else { 0 });
            interleave_halves(&y.qs, &mut o.qs, flip);
            match form {
                // The values alone: the passes fold their offsets themselves.
                Q3KActs::Flipped => {}
                Q3KActs::LaneSums => {
                    // Lane l's values: bytes 8l..8l + 8 of each 64. `vpsadbw` against zero sums
                    // eight unsigned bytes: the values plus 128 (their top bit flipped), less
                    // 4 * 8 * 128 for the four eights.
                    let (top, zero) = (_mm256_set1_epi8(-128), _mm256_setzero_si256());
                    let mut sums = [zero; 2];
                    for p in 0..4 {
                        for (h, sum) in sums.iter_mut().enumerate() {
                            let v = _mm256_loadu_si256(o.qs.as_ptr().add(64 * p + 32 * h).cast());
                            let eights = _mm256_sad_epu8(_mm256_xor_si256(v, top), zero);
                            *sum = _mm256_add_epi64(*sum, eights);
                        }
                    }
                    for (h, sum) in sums.into_iter().enumerate() {
                        let mut lanes = [0i64; 4];
                        _mm256_storeu_si256(lanes.as_mut_ptr().cast(), sum);
                        for (i, s) in lanes.into_iter().enumerate() {
                            o.off[4 * h + i] = (-128 * (s as i32 - 4 * 8 * 128)) as u32;
                        }
                    }
                }
                Q3KActs::Offsets => {
                    let (ones, ones16) = (_mm256_set1_epi8(1), _mm256_set1_epi16(1));
                    for p in 0..4 {
                        // The four-value sums of values 64p..+32 (lo[l]) and 64p + 32..+32 (hi[l]),
                        // times -4, as the halves of word l: (-4 lo[l], -4 hi[l]).
                        let mut sums = [_mm256_setzero_si256(); 2];
                        for (half, sum) in sums.iter_mut().enumerate() {
                            let q =
                                _mm256_loadu_si256(y.qs.as_ptr().add(64 * p + 32 * half).cast());
                            let pairs = _mm256_maddubs_epi16(ones, q);
                            let fours = _mm256_madd_epi16(pairs, ones16);
                            *sum = _mm256_sub_epi32(
                                _mm256_setzero_si256(),
                                _mm256_slli_epi32::<2>(fours),
                            );
                        }
                        let w =
                            _mm256_blend_epi16::<0xAA>(sums[0], _mm256_slli_epi32::<16>(sums[1]));
                        _mm256_storeu_si256(o.off[8 * p..].as_mut_ptr().cast(), w);
                    }
                }
            }
        }
        ya.push(o);
    }
}

thread_local! {
    /// Each thread's token blocks for [`q3_k_pass`].
    ///
    /// [`q3_k_pass`]: crate::x86::avx512::packed
    pub(super) static Q3K_ACTS: RefCell<Vec<Q3KAct>> = const { RefCell::new(Vec::new()) };
}

// ---------------------------------------------------------------------------------------------
// The 32-value formats' lanes.

/// A token block of the 32-value formats' activations (Q8_0, Q8_1).
pub(crate) trait Act32: crate::codec::Block {
    fn qs(&self) -> &[i8; 32];
    /// The scale's F16 bits.
    fn d_bits(&self) -> u16;
    /// The F16 bits of `d * sum(qs)` (Q8_1), which the weights' min multiplies; `None`
    /// without one.
    fn s_bits(&self) -> Option<u16>;
}

impl Act32 for BlockQ8_0 {
    #[inline(always)]
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
    #[inline(always)]
    fn d_bits(&self) -> u16 {
        self.d.to_bits()
    }
    #[inline(always)]
    fn s_bits(&self) -> Option<u16> {
        None
    }
}

impl Act32 for BlockQ8_1 {
    #[inline(always)]
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
    #[inline(always)]
    fn d_bits(&self) -> u16 {
        self.d.to_bits()
    }
    #[inline(always)]
    fn s_bits(&self) -> Option<u16> {
        Some(self.s.to_bits())
    }
}

/// A packed 32-value format.
pub(crate) trait Pack32: Pack {
    /// Its activation blocks.
    type A: Act32;
    /// What [`Self::lane`] adds to each value: the kernel starts each lane at `-OFFSET *
    /// sum(y)`.
    const OFFSET: i32;
    /// Whether the format has a min (`x = d * q + m`), fused against the token's `s`.
    const MIN: bool;
    /// Whether its values come from a table of levels in -127..=127, never -128 (with
    /// [`Self::OFFSET`] 128): a pass may then give the level the token's sign instead of the
    /// token the level's (`vpsignb` cannot negate -128).
    const LEVELS: bool = false;
    /// The distances its one-token kernels ask for its bytes at: [`Ahead::Deep`], or
    /// [`Ahead::Stream`] for Q8_0, which streams best on its own.
    const AHEAD: Ahead = Ahead::Deep;
    /// Tokens a pass of the AVX-512 `vec_dot`-order kernels takes (2 or 3), whichever measured
    /// faster: three tokens' 24 accumulators and their operands do not fit the 32 registers,
    /// a cost that only Q8_0 (whose lanes are plain loads) and Q5_0 (whose lanes cost the most
    /// to build) earn back.
    const PASS_TOKENS: usize = 2;
    /// From how many such passes over a batch's tokens a group's lanes are unpacked once
    /// (stored, then loaded by every pass) instead of in every pass: a format whose lane is a
    /// load or a mask of one never gains from it (docs/perf-log.md, "Small batches").
    const UNPACK_FROM_PASSES: usize = 3;
    /// Values `4l..4l + 4` of the sixteen rows, plus [`Self::OFFSET`], as unsigned bytes.
    ///
    /// # Safety
    /// AVX-512 F.
    unsafe fn lane(&self, l: usize) -> __m512i;
    /// [`Self::lane`] of rows `8h..8h + 8` (for [`crate::x86::avx2::packed`]).
    ///
    /// # Safety
    /// AVX2.
    unsafe fn lane8(&self, l: usize, h: usize) -> __m256i;
    fn d(&self) -> &[u16; ROWS];
    /// The mins (the scales, unused, without [`Self::MIN`]).
    fn m(&self) -> &[u16; ROWS];
}

impl Pack32 for Q8_0Packed {
    type A = BlockQ8_0;
    const OFFSET: i32 = 128;
    const MIN: bool = false;
    const AHEAD: Ahead = Ahead::Stream;
    const PASS_TOKENS: usize = 3;
    const UNPACK_FROM_PASSES: usize = usize::MAX;
    #[inline(always)]
    unsafe fn lane(&self, l: usize) -> __m512i {
        // SAFETY: a row of `q`; the caller's features.
        unsafe { ld(&self.q[l]) }
    }
    #[inline(always)]
    unsafe fn lane8(&self, l: usize, h: usize) -> __m256i {
        // SAFETY: a row of `q`; the caller's features.
        unsafe { ld8(&self.q[l], h) }
    }
    fn d(&self) -> &[u16; ROWS] {
        &self.d
    }
    fn m(&self) -> &[u16; ROWS] {
        &self.d
    }
}

/// Values `4l..4l + 4` of sixteen rows of a 4-bit 32-value format (`qs`: the rows' nibble
/// words; values `0..16` in the low nibbles, `16..32` in the high), with the fifth bits of
/// [`fifth_bits`] (`qh`) if there are.
///
/// [`fifth_bits`]: crate::packed::layout
#[inline(always)]
unsafe fn nibble_lane(qs: &[[u32; ROWS]; 4], qh: Option<&[u32; ROWS]>, l: usize) -> __m512i {
    // SAFETY: rows of `qs`, `qh`; the caller's features.
    unsafe {
        let q = if l < 4 {
            ld(&qs[l])
        } else {
            _mm512_srli_epi32::<4>(ld(&qs[l - 4]))
        };
        let Some(qh) = qh else {
            return _mm512_and_si512(q, _mm512_set1_epi8(0x0F));
        };
        let qh = ld(qh);
        let bit = _mm512_and_si512(
            if l <= 4 {
                _mm512_sllv_epi32(qh, _mm512_set1_epi32(4 - l as i32))
            } else {
                _mm512_srlv_epi32(qh, _mm512_set1_epi32(l as i32 - 4))
            },
            _mm512_set1_epi32(0x1010_1010),
        );
        nibble_or(q, bit)
    }
}

/// [`nibble_lane`] of rows `8h..8h + 8`.
#[inline(always)]
unsafe fn nibble_lane8(
    qs: &[[u32; ROWS]; 4],
    qh: Option<&[u32; ROWS]>,
    l: usize,
    h: usize,
) -> __m256i {
    // SAFETY: rows of `qs`, `qh`; the caller's features (AVX2).
    unsafe {
        let q = if l < 4 {
            ld8(&qs[l], h)
        } else {
            _mm256_srli_epi32::<4>(ld8(&qs[l - 4], h))
        };
        let q = _mm256_and_si256(q, _mm256_set1_epi8(0x0F));
        let Some(qh) = qh else {
            return q;
        };
        let qh = ld8(qh, h);
        let bit = _mm256_and_si256(
            if l <= 4 {
                _mm256_sllv_epi32(qh, _mm256_set1_epi32(4 - l as i32))
            } else {
                _mm256_srlv_epi32(qh, _mm256_set1_epi32(l as i32 - 4))
            },
            _mm256_set1_epi32(0x1010_1010),
        );
        _mm256_or_si256(q, bit)
    }
}

/// [`Pack32`] of a packed 4-bit 32-value format (`crate::packed::layout`'s `packed_nibbles`):
/// `$name` against `$act`, [`Pack32::OFFSET`] `$off`; `min`: with a min; `passes of`:
/// [`Pack32::PASS_TOKENS`]; `unpacked from`: [`Pack32::UNPACK_FROM_PASSES`].
macro_rules! pack32_nibbles {
    ($name:ident: $act:ty, offset $off:literal, min $min:tt,
     passes of $pass:literal unpacked from $unpack:expr) => {
        impl Pack32 for $name {
            type A = $act;
            const OFFSET: i32 = $off;
            const MIN: bool = $min;
            const PASS_TOKENS: usize = $pass;
            const UNPACK_FROM_PASSES: usize = $unpack;
            #[inline(always)]
            unsafe fn lane(&self, l: usize) -> __m512i {
                // SAFETY: the caller's.
                unsafe { nibble_lane(&self.qs, self.qh.first(), l) }
            }
            #[inline(always)]
            unsafe fn lane8(&self, l: usize, h: usize) -> __m256i {
                // SAFETY: the caller's.
                unsafe { nibble_lane8(&self.qs, self.qh.first(), l, h) }
            }
            fn d(&self) -> &[u16; ROWS] {
                &self.d
            }
            fn m(&self) -> &[u16; ROWS] {
                self.m.first().unwrap_or(&self.d)
            }
        }
    };
}

pack32_nibbles!(Q4_0Packed: BlockQ8_0, offset 8, min false, passes of 2 unpacked from 3);
pack32_nibbles!(Q4_1Packed: BlockQ8_1, offset 0, min true, passes of 2 unpacked from usize::MAX);
pack32_nibbles!(Q5_0Packed: BlockQ8_0, offset 16, min false, passes of 3 unpacked from 3);
pack32_nibbles!(Q5_1Packed: BlockQ8_1, offset 0, min true, passes of 2 unpacked from 5);

/// A table of levels plus 128, as unsigned bytes (looked up sixteen at a time by `vpshufb`).
const fn plus_128(levels: &[i8; 16]) -> [u8; 16] {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (levels[i] as i16 + 128) as u8;
        i += 1;
    }
    t
}

const IQ4NL_PLUS_128: [u8; 16] = plus_128(&KVALUES_IQ4NL);
const MXFP4_PLUS_128: [u8; 16] = plus_128(&KVALUES_MXFP4);

// The IQ4_XS kernels take a level's sign from bit 3 of its index: levels 0..8 are the negative
// ones.
const _: () = {
    let mut i = 0;
    while i < 16 {
        assert!((KVALUES_IQ4NL[i] < 0) == (i < 8));
        i += 1;
    }
};

/// The packed formats of levels looked up in a table (IQ4_NL, MXFP4): same layout, F16 scales.
macro_rules! pack32_levels {
    ($name:ident, $table:ident) => {
        impl Pack32 for $name {
            type A = BlockQ8_0;
            const OFFSET: i32 = 128;
            const MIN: bool = false;
            const LEVELS: bool = true;
            #[inline(always)]
            unsafe fn lane(&self, l: usize) -> __m512i {
                // SAFETY: 16 readable bytes; the caller's features.
                unsafe {
                    let table = _mm512_broadcast_i32x4(_mm_loadu_si128($table.as_ptr().cast()));
                    _mm512_shuffle_epi8(table, nibble_lane(&self.qs, None, l))
                }
            }
            #[inline(always)]
            unsafe fn lane8(&self, l: usize, h: usize) -> __m256i {
                // SAFETY: 16 readable bytes; the caller's features.
                unsafe {
                    let table =
                        _mm256_broadcastsi128_si256(_mm_loadu_si128($table.as_ptr().cast()));
                    _mm256_shuffle_epi8(table, nibble_lane8(&self.qs, None, l, h))
                }
            }
            fn d(&self) -> &[u16; ROWS] {
                &self.d
            }
            fn m(&self) -> &[u16; ROWS] {
                &self.d
            }
        }
    };
}

pack32_levels!(IQ4NLPacked, IQ4NL_PLUS_128);
pack32_levels!(MXFP4Packed, MXFP4_PLUS_128);

/// A packed 32-value block's eight lanes as bytes, with its heads.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
pub(super) struct Unpacked32 {
    pub(super) q: [[u32; ROWS]; 8],
    pub(super) d: [u16; ROWS],
    pub(super) m: [u16; ROWS],
}

/// What the rows need of a token block: `-offset * sum` of each lane's four values (`bias`)
/// and of all 32 (`total`, for the repacked order), `d` and `s`.
#[derive(Clone, Copy)]
pub(super) struct Tok32 {
    pub(super) bias: [i32; 8],
    pub(super) total: i32,
    pub(super) d: f32,
    pub(super) s: f32,
}

impl Tok32 {
    /// A token block `y` whose lanes of four values sum to `sums` (i32 lanes), against weights
    /// stored plus `offset`: in registers, the scales by F16C (the scalar form, through `half`'s
    /// conversions, took a share of a Q4_0 file's prefill, the table being built once a call:
    /// docs/perf-log.md, "Batch calls' sizes").
    ///
    /// # Safety
    /// The CPU must have AVX2 and F16C.
    #[inline(always)]
    pub(super) unsafe fn new<A: Act32>(y: &A, sums: __m256i, offset: i32) -> Tok32 {
        // SAFETY: the caller's features; 32 writable bytes.
        unsafe {
            let bias = _mm256_mullo_epi32(sums, _mm256_set1_epi32(-offset));
            let four = _mm_add_epi32(
                _mm256_castsi256_si128(bias),
                _mm256_extracti128_si256::<1>(bias),
            );
            let two = _mm_add_epi32(four, _mm_shuffle_epi32::<0b01_00_11_10>(four));
            let one = _mm_add_epi32(two, _mm_shuffle_epi32::<0b10_11_00_01>(two));
            let mut t = Tok32 {
                bias: [0; 8],
                total: _mm_cvtsi128_si32(one),
                d: f16_to_f32(y.d_bits()),
                s: match y.s_bits() {
                    Some(s) => f16_to_f32(s),
                    None => 0.0,
                },
            };
            _mm256_storeu_si256(t.bias.as_mut_ptr().cast(), bias);
            t
        }
    }
}

thread_local! {
    /// Each thread's per-call token table, and the unpacked lanes of [`lanes32`].
    ///
    /// [`lanes32`]: crate::x86::avx512::packed
    pub(super) static TOKS32: RefCell<(Vec<Tok32>, Vec<Unpacked32>)> =
        const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Weights a batch call of the 32-value formats ([`lanes32`]) covers: each call builds a table
/// of every token block's lane sums (48 bytes a block: 786 KiB for 64 tokens of 8192 columns),
/// and in calls of 64 rows that table cost about as much as the products themselves. Calls of
/// 1024 x 2048 weights ran faster, at the AVX2 tier too; larger calls changed nothing
/// measurable for the K-quants, whose per-call work on the tokens is smaller (measurements:
/// docs/perf-log.md, "Batch calls' sizes").
///
/// [`lanes32`]: crate::x86::avx512::packed
pub(super) const LANES32_TILE_WEIGHTS: usize = 1024 * 2048;
