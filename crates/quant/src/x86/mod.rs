//! x86-64 kernels, chosen at run time from the kernel table ([`crate::kernels`]).

/// The safe entry point of a tiled kernel ([`crate::GemmFn`]): check the operands and cast
/// them to `$block` weights and their activation blocks, then run `$driver(weights,
/// activations, blocks per row, out)`, an `unsafe fn` whose CPU features `gemm_kernel` has
/// detected before it hands the entry out. An entry generic over its element (`name<E:
/// Elem>: E => ...`) names the parameter and its bound.
macro_rules! tiled_entry {
    ($(#[$doc:meta])* $name:ident $(<$g:ident: $bound:path>)?: $block:ty => $driver:expr) => {
        $(#[$doc])*
        pub fn $name $(<$g: $bound>)? (
            w: &[u8],
            row_bytes: usize,
            a: &[u8],
            n_tok: usize,
            out: &mut [f32],
        ) -> Result<(), QuantError> {
            let (x, y, per_row) =
                crate::codec::gemm_operands::<$block>(w, row_bytes, a, n_tok, out)?;
            // SAFETY: `gemm_kernel` hands this entry out only after detecting the CPU
            // features the driver needs; the operands' sizes agree (checked above).
            unsafe { $driver(x, y, per_row, out) };
            Ok(())
        }
    };
}

/// [`tiled_entry`]s of a tiled kernel family: the family's `gemm` driver for each kernel `$k`
/// (whose weight block is `<$k as $family>::W`).
macro_rules! gemm_entries {
    ($family:ident; $( $name:ident: $k:ty; )*) => {$(
        tiled_entry! {
            /// Tiled product of weight rows with a batch of tokens (see [`crate::GemmFn`]).
            $name: <$k as $family>::W => gemm::<$k>
        }
    )*};
}

pub(crate) mod actq;
pub mod avx2;
pub(crate) mod avx2_packed;
pub mod avx512;
pub mod avx512_ktile;
pub mod avx512_nl;
pub(crate) mod avx512_packed;
pub mod avx512_tile;
pub mod avxvnni;
pub mod bf16;
pub mod f16;
mod packed_common;
#[cfg(test)]
mod tests;
pub mod tile;

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};

use crate::blocks::*;
use crate::codec::{cast_blocks, dot_row, gemv_rows_with, Block, DotBlock};
use crate::QuantError;

macro_rules! avx2_entry {
    ($( $name:ident, $gemv:ident: $block:ty => $kernel:path; )*) => {$(
        /// Type-erased entry to the AVX2 kernel.
        pub fn $name(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
            // SAFETY: `vec_dot_kernel` hands these entries out only after detecting AVX2, FMA
            // and F16C on this CPU.
            dot_row::<$block>(w, a, |x, y| unsafe { $kernel(x, y) })
        }

        /// Type-erased entry to the AVX2 kernel, over consecutive rows.
        pub fn $gemv(w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
            // SAFETY: as above.
            gemv_rows_with::<$block, false>(w, row_bytes, a, out, |x, y| unsafe { $kernel(x, y) })
        }
    )*};
}

avx2_entry! {
    q4_0, q4_0_gemv: BlockQ4_0 => avx2::vec_dot_q4_0_q8_0;
    q4_1, q4_1_gemv: BlockQ4_1 => avx2::vec_dot_q4_1_q8_1;
    q5_0, q5_0_gemv: BlockQ5_0 => avx2::vec_dot_q5_0_q8_0;
    q5_1, q5_1_gemv: BlockQ5_1 => avx2::vec_dot_q5_1_q8_1;
    q8_0, q8_0_gemv: BlockQ8_0 => avx2::vec_dot_q8_0_q8_0;
    q3_k, q3_k_gemv: BlockQ3K => avx2::vec_dot_q3_k_q8_k;
    q4_k, q4_k_gemv: BlockQ4K => avx2::vec_dot_q4_k_q8_k;
    q4_k_rows8, q4_k_rows8_gemv: BlockQ4K => avx2::vec_dot_q4_k_q8_k_rows8;
    q5_k, q5_k_gemv: BlockQ5K => avx2::vec_dot_q5_k_q8_k;
    q6_k, q6_k_gemv: BlockQ6K => avx2::vec_dot_q6_k_q8_k;
    iq4_xs, iq4_xs_gemv: BlockIQ4XS => avx2::vec_dot_iq4_xs_q8_k;
    f16_avx2, f16_avx2_gemv: half::f16 => f16::dot_avx2;
    f32_avx2, f32_avx2_gemv: f32 => f16::dot_avx2;
    iq4_nl_rows8, iq4_nl_rows8_gemv: BlockIQ4NL => avx2::vec_dot_iq4_nl_q8_0_rows8;
    q4_0_rows8, q4_0_rows8_gemv: BlockQ4_0 => avx2::vec_dot_q4_0_q8_0_rows8;
    q2_k_rows8, q2_k_rows8_gemv: BlockQ2K => avx2::vec_dot_q2_k_q8_k_rows8;
    q2_k, q2_k_gemv: BlockQ2K => avx2::vec_dot_q2_k_q8_k;
    iq4_nl, iq4_nl_gemv: BlockIQ4NL => avx2::vec_dot_iq4_nl_q8_0;
}

/// Type-erased entry to the AVX2 BF16 kernel for one row (rows: [`bf16::gemv_avx2`]).
pub fn bf16_avx2(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
    // SAFETY: `vec_dot_kernel` hands this entry out only after detecting AVX2, FMA and F16C.
    dot_row::<half::bf16>(w, a, |x, y| unsafe { bf16::dot_bf16_avx2_row(x, y) })
}

macro_rules! avx512_entry {
    ($( $name:ident, $gemv:ident: $block:ty => $kernel:path; )*) => {$(
        /// Type-erased entry to the AVX-512 VNNI kernel.
        pub fn $name(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
            // SAFETY: `avx512_vec_dot`/`avx512_rows8` hand these entries out only after
            // `has_avx512_vnni` found every feature the kernel is compiled for.
            dot_row::<$block>(w, a, |x, y| unsafe { $kernel(x, y) })
        }

        /// Type-erased entry to the AVX-512 VNNI kernel, over consecutive rows.
        pub fn $gemv(w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
            // SAFETY: as above.
            gemv_rows_with::<$block, false>(w, row_bytes, a, out, |x, y| unsafe { $kernel(x, y) })
        }
    )*};
}

avx512_entry! {
    q6_k_512, q6_k_512_gemv: BlockQ6K => avx512::vec_dot_q6_k_q8_k;
}

/// How far ahead of the kernels their weights are asked for, in bytes: into the first-level
/// cache from `l1` bytes ahead, and into the second from `l2` (none where 0). The hardware's
/// prefetchers alone leave a core well under the bandwidth a streaming read reaches. Asked for
/// as the loop goes rather than in a burst before each row ([`crate::codec::prefetch_ahead`]),
/// gemv-bench's row kernels read 15-25 points more of the bandwidth (F16 on AVX-512 67% ->
/// 82-98%; on AVX2 Q4_K 53% -> 71-73%, Q8_0 55% -> 76%).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Prefetch {
    pub l1: usize,
    pub l2: usize,
}

/// Intel's cores (measured on a Xeon of the Sapphire Rapids generation): one distance alone is
/// bounded by the first level's few line-fill buffers (kbench, one token: packed Q4_K 67-81% of
/// the read bandwidth with one distance of 8 KiB, 78-105% with 4 and 16 KiB).
const PREFETCH_BOTH: Prefetch = Prefetch {
    l1: 4096,
    l2: 16384,
};

/// AMD's (measured on a Zen 5 EPYC, 43 GB/s for one core): the second-level requests cost
/// more than they bring, and the first level wants to be asked from further ahead. kbench, one
/// token, one thread, the 8192 x 2048 matrix: packed Q4_K 33.6 -> 39.5 GB/s with 8 KiB alone,
/// Q6_K 34.4 -> 38.5, Q4_0 33.7 -> 38.8, Q5_K 35.1 -> 41.0; any second-level distance (8 to
/// 64 KiB) took Q4_K back to 31-34.
const PREFETCH_AMD: Prefetch = Prefetch { l1: 8192, l2: 0 };

/// Which prefetch distances a kernel asks ahead at. Only the speed depends on them;
/// `SYNAPSE_PREFETCH=L1,L2` (bytes) sets all three kinds to those distances, to tune a CPU
/// not measured here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ahead {
    /// The distances of this CPU: [`PREFETCH_AMD`] on AMD's, [`PREFETCH_BOTH`] on others.
    Plan,
    /// [`Ahead::Plan`] for the kernels whose loads lag the memory most: on AMD's cores before Zen 5
    /// (measured on a Zen 4 EPYC), a second-level request 16 KiB ahead besides the first- level
    /// one. The one-token kernels streaming 512 MiB of copies of a 2048 x 8192 matrix, against a
    /// plain read of the same bytes (tilebench `TILEBENCH_SUSTAINED`, three runs each in turn),
    /// first-level request alone -> both: Q6_K 60-76% -> 83-93%, IQ4_XS 68-69% -> 80-82%, Q3_K
    /// 73-78% -> 79-85%; in decode of the 1B-shaped Q4_K_M file its Q6_K output matrix went from
    /// 19.0-20.0 to 21.4-23.1 GB/s. Q4_K (8192 x 2048: 67-74% -> 65-76%), Q5_K (87-89% either way)
    /// and Q8_0 gained nothing, and the plan for every kernel cost Gemma 3's decode 6%: only the
    /// kernels that gain take this one. The AVX2 tier's kernels of the same three formats
    /// (`SYNAPSE_ISA=avx2` on the Zen 4, two runs each): IQ4_XS 39-45% -> 55-57%, Q3_K 36-51% ->
    /// 50-61%, Q6_K 55-60% -> 58-61%. The 32-value formats' and Q2_K's one-token kernels (two runs
    /// each): Q4_1 60% -> 75-89%, Q4_0 57-63% -> 74-75%, Q5_0 60-65% -> 76-84%, Q2_K 52-68% ->
    /// 67-68%.
    Deep,
    /// [`Ahead::Plan`] for the one-token kernels that stream best on their own: on AMD's cores
    /// before Zen 5 (measured on a Zen 4 EPYC), no requests at all. Q4_K's and Q8_0's, the kernels
    /// that spend the fewest operations a byte, read more of the memory with the core's own
    /// prefetchers alone (likely the requests only took line-fill buffers from their loads; not
    /// checked with counters, which that VM lacks). Against a plain read of the same bytes
    /// (tilebench `TILEBENCH_COLD=512 TILEBENCH_SUSTAINED=0`, separate processes in turn), with
    /// requests (their plans then) -> none: Q4_K 8192 x 2048 50.7 / 67.1 / 72.6 / 69.9 / 77.8 /
    /// 75.8% -> 97.7 / 93.3 / 74.6 / 96.4 / 84.3 / 75.5%, Q8_0 2048 x 8192 67.8 / 68.6 / 70.0% ->
    /// 77.7 / 79.1 / 78.2%. Every other one-token kernel read less without them (Q5_K 75-85% ->
    /// 26-30%, Q4_1 71-73% -> 40-42%, Q6_K, IQ4_XS, Q3_K, Q5_0, Q5_1, IQ4_NL 10 to 30 points less,
    /// Q2_K and Q4_0 4 to 17). F16's packed one-token kernel too, whose rows are read chain by
    /// chain in address order: the pure F16 file's decode 1.113x the tok/s without requests
    /// (`SYNAPSE_PREFETCH=0,0`, bench/alternate.sh, five pairs at one thread, 1.020-1.165).
    Stream,
}

impl Ahead {
    /// This kind's distances on this CPU (the three worked out once, together).
    #[inline(always)]
    pub(crate) fn plan(self) -> Prefetch {
        static PLANS: std::sync::OnceLock<[Prefetch; 3]> = std::sync::OnceLock::new();
        PLANS.get_or_init(|| {
            if let Some(plan) = prefetch_override() {
                return [plan; 3];
            }
            if crate::cpu().amd_family().is_some_and(|f| f < 0x1A) {
                let deep = Prefetch {
                    l2: 16384,
                    ..PREFETCH_AMD
                };
                return [PREFETCH_AMD, deep, Prefetch { l1: 0, l2: 0 }];
            }
            [if is_amd() {
                PREFETCH_AMD
            } else {
                PREFETCH_BOTH
            }; 3]
        })[self as usize]
    }
}

/// [`Ahead::Plan`]'s distances.
pub(crate) fn prefetch_plan() -> Prefetch {
    Ahead::Plan.plan()
}

/// The distances the kernel configuration sets, if any. Read once, by [`Ahead::plan`].
fn prefetch_override() -> Option<Prefetch> {
    let d = crate::config().prefetch?;
    Some(Prefetch { l1: d.l1, l2: d.l2 })
}

/// Whether this is an AMD CPU, whose memory system some kernels are tuned for apart.
pub(crate) fn is_amd() -> bool {
    crate::cpu().amd_family().is_some()
}

/// Ask the caches for the 64-byte lines `lines` of the bytes at `p`, as far ahead as
/// [`prefetch_plan`] says. A hint: it reads nothing and never faults, past the end of the
/// weights too.
#[inline(always)]
fn prefetch_lines(p: *const u8, lines: std::ops::Range<usize>) {
    prefetch_lines_by(p, lines, prefetch_plan());
}

/// [`prefetch_lines`] at the distances `plan`.
#[inline(always)]
fn prefetch_lines_by(p: *const u8, lines: std::ops::Range<usize>, plan: Prefetch) {
    if plan.l1 == 0 && plan.l2 == 0 {
        return;
    }
    for line in lines {
        let at = p.wrapping_add(64 * line);
        // SAFETY: a prefetch reads nothing into the program and never faults.
        unsafe {
            if plan.l1 > 0 {
                _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(plan.l1).cast());
            }
            if plan.l2 > 0 {
                _mm_prefetch::<_MM_HINT_T1>(at.wrapping_add(plan.l2).cast());
            }
        }
    }
}

/// [`prefetch_lines`] for every line of block `p` (a weight block, or a packed group's).
#[inline(always)]
fn prefetch_ahead<P>(p: &P) {
    prefetch_part(p, 0, 1);
}

/// Part `part` of `parts` of [`prefetch_ahead`]: a block's requests spread over its loop, so
/// that they do not all wait at once for the core's few line-fill buffers.
#[inline(always)]
fn prefetch_part<P>(p: &P, part: usize, parts: usize) {
    prefetch_part_as(Ahead::Plan, p, part, parts);
}

/// [`prefetch_part`] at the distances of `ahead`.
#[inline(always)]
fn prefetch_part_as<P>(ahead: Ahead, p: &P, part: usize, parts: usize) {
    let lines = size_of::<P>().div_ceil(64);
    let at = (p as *const P).cast::<u8>();
    prefetch_lines_by(
        at,
        lines * part / parts..lines * (part + 1) / parts,
        ahead.plan(),
    );
}

/// Part `part` of `parts` of the lines of `bytes`, asked for now: what a batch's passes over
/// one group request of the group after it, a share a pass, so that unpacking it does not
/// wait for memory.
#[inline(always)]
pub(super) fn prefetch_share(bytes: &[u8], part: usize, parts: usize) {
    let lines = bytes.len().div_ceil(64);
    let parts = parts.max(1);
    prefetch_now(
        bytes.as_ptr(),
        lines * part / parts..lines * (part + 1) / parts,
    );
}

/// Every line that `x` lies on, asked for now into the first level.
#[inline(always)]
pub(super) fn prefetch_value<X>(x: &X) {
    let at = (x as *const X).cast::<u8>();
    let skip = at as usize % 64;
    let lines = (skip + size_of::<X>()).div_ceil(64);
    prefetch_now(at.wrapping_sub(skip), 0..lines);
}

/// Lines `lines` (64 bytes each) of the bytes at `p` asked for now, into the first level: what
/// the batch kernels request of the rows their later passes read. A hint: it reads nothing and
/// never faults, past the end of the weights too.
#[inline(always)]
pub(super) fn prefetch_now(p: *const u8, lines: std::ops::Range<usize>) {
    for line in lines {
        // SAFETY: a prefetch reads nothing into the program and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * line).cast()) };
    }
}

/// Rows of `w` with the activation row `a`, `R` rows at a time through `dot` (the last
/// `out.len() % R` one at a time through `dot::<1>`'s counterpart `one`): the shapes and casts
/// checked as [`crate::codec::gemv_rows`] checks them. The kernels ask for their rows' bytes
/// ahead as they go ([`prefetch_ahead`], [`prefetch_lines`]): a burst of requests for each
/// group before its loop, as `gemv_rows` makes, held the AVX-512 rows at 34-61% of the read
/// bandwidth (gemv-bench, one thread), where they now read 51-91%.
fn gemv_by<B: DotBlock, const R: usize>(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    out: &mut [f32],
    dot: impl Fn([&[B]; R], &[B::Act]) -> [f32; R],
    one: impl Fn([&[B]; 1], &[B::Act]) -> [f32; 1],
) -> Result<(), QuantError> {
    let x = cast_blocks::<B>(w)?;
    let y = cast_blocks::<B::Act>(a)?;
    let per_row = row_bytes / size_of::<B>();
    // These kernels pair formats of equal block length: one activation block per weight block.
    let fits = per_row > 0
        && per_row * size_of::<B>() == row_bytes
        && x.len() == per_row * out.len()
        && per_row * B::TYPE.block_len() == y.len() * B::Act::TYPE.block_len()
        && per_row == y.len();
    if !fits {
        return Err(QuantError::DotLength {
            ty: B::TYPE,
            act: B::Act::TYPE,
            weights: w.len() / size_of::<B>() * B::TYPE.block_len(),
            activations: y.len() * B::Act::TYPE.block_len(),
        });
    }
    let mut rows = x.chunks_exact(per_row);
    let mut groups = out.chunks_exact_mut(R);
    for o in &mut groups {
        let group: [&[B]; R] = std::array::from_fn(|_| rows.next().unwrap_or_default());
        o.copy_from_slice(&dot(group, y));
    }
    for (o, row) in groups.into_remainder().iter_mut().zip(rows) {
        *o = one([row], y)[0];
    }
    Ok(())
}

macro_rules! vnni_rows_entry {
    ($module:ident; $( $name:ident, $gemv:ident: $block:ty => $kernel:ident; )*) => {$(
        /// Type-erased entry to the VNNI kernel.
        pub fn $name(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
            // SAFETY: the table functions below hand these entries out only after detecting
            // every feature `$module`'s kernels are compiled for (`has_avx512_vnni` or
            // `vnni256` for `avx512`, `vnni256` for `avxvnni`).
            dot_row::<$block>(w, a, |x, y| unsafe { $module::$kernel::<1>([x], y)[0] })
        }

        /// Type-erased entry to the VNNI kernel, over consecutive rows, four at a time.
        pub fn $gemv(w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
            // SAFETY: as above.
            unsafe {
                gemv_by::<$block, 4>(
                    w,
                    row_bytes,
                    a,
                    out,
                    |x, y| $module::$kernel::<4>(x, y),
                    |x, y| $module::$kernel::<1>(x, y),
                )
            }
        }
    )*};
}

vnni_rows_entry! {
    avx512;
    q4_0_512, q4_0_512_gemv: BlockQ4_0 => vec_dot_q4_0_q8_0_xr;
    q4_1_512, q4_1_512_gemv: BlockQ4_1 => vec_dot_q4_1_q8_1_xr;
    q8_0_512, q8_0_512_gemv: BlockQ8_0 => vec_dot_q8_0_q8_0_xr;
    q4_0_rows8_512, q4_0_rows8_512_gemv: BlockQ4_0 => vec_dot_q4_0_q8_0_rows8_xr;
}

vnni_rows_entry! {
    avxvnni;
    q4_0_vnni, q4_0_vnni_gemv: BlockQ4_0 => vec_dot_q4_0_q8_0_xr;
    q4_1_vnni, q4_1_vnni_gemv: BlockQ4_1 => vec_dot_q4_1_q8_1_xr;
    q8_0_vnni, q8_0_vnni_gemv: BlockQ8_0 => vec_dot_q8_0_q8_0_xr;
    q4_0_rows8_vnni, q4_0_rows8_vnni_gemv: BlockQ4_0 => vec_dot_q4_0_q8_0_rows8_xr;
}

pub(crate) use crate::cpu::Vnni256;

/// The form of the AVX-VNNI tier this CPU runs, if any ([`crate::Cpu::vnni256`]).
pub(crate) fn vnni256() -> Option<Vnni256> {
    crate::cpu().vnni256()
}

macro_rules! float_512_entry {
    ($( $name:ident, $gemv:ident: $elem:ty; )*) => {$(
        /// Type-erased entry to the AVX-512 float kernel.
        pub fn $name(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
            // SAFETY: `avx512_vec_dot` hands this entry out only after `f16::has_avx512`
            // found every feature the kernel is compiled for.
            dot_row::<$elem>(w, a, |x, y| unsafe { f16::dot_512::<$elem, 1>([x], y)[0] })
        }

        /// Type-erased entry to the AVX-512 float kernel, over consecutive rows: four at a
        /// time (the token's values loaded once for four rows), or one at a time on AMD's
        /// CPUs, which stream one row at 34-36 GB/s and four side by side at 26-28 (kbench,
        /// F16, one token, one thread, on a Zen 5 EPYC; the prefetch distances did not
        /// change it). The rows' sums are the same either way.
        pub fn $gemv(w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
            let one = |x: [&[$elem]; 1], y: &[$elem]| {
                // SAFETY: as above.
                unsafe { f16::dot_512::<$elem, 1>(x, y) }
            };
            if is_amd() {
                gemv_by::<$elem, 1>(w, row_bytes, a, out, one, one)
            } else {
                gemv_by::<$elem, 4>(
                    w,
                    row_bytes,
                    a,
                    out,
                    // SAFETY: as above.
                    |x, y| unsafe { f16::dot_512::<$elem, 4>(x, y) },
                    one,
                )
            }
        }
    )*};
}

float_512_entry! {
    f16_512, f16_512_gemv: half::f16;
    f32_512, f32_512_gemv: f32;
}

/// Type-erased entry to the AVX512-BF16 kernel.
pub fn bf16_512(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
    // SAFETY: `avx512_vec_dot` hands this entry out only after `bf16::has_avx512_bf16`.
    dot_row::<half::bf16>(w, a, |x, y| unsafe { bf16::dot_bf16::<1>([x], y)[0] })
}

/// Type-erased entry to the AVX512-BF16 kernel over consecutive rows, one at a time (as F16's
/// on AMD CPUs, where one row streams faster than four side by side).
pub fn bf16_512_gemv(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let one = |x: [&[half::bf16]; 1], y: &[half::bf16]| {
        // SAFETY: as above.
        unsafe { bf16::dot_bf16::<1>(x, y) }
    };
    gemv_by::<half::bf16, 1>(w, row_bytes, a, out, one, one)
}
