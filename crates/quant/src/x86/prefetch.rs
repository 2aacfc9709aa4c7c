//! How far ahead of the x86 kernels their weights are asked for, one plan per CPU.

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};

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
pub(crate) const PREFETCH_BOTH: Prefetch = Prefetch {
    l1: 4096,
    l2: 16384,
};

/// AMD's (measured on a Zen 5 EPYC, 43 GB/s for one core): the second-level requests cost
/// more than they bring, and the first level wants to be asked from further ahead. kbench, one
/// token, one thread, the 8192 x 2048 matrix: packed Q4_K 33.6 -> 39.5 GB/s with 8 KiB alone,
/// Q6_K 34.4 -> 38.5, Q4_0 33.7 -> 38.8, Q5_K 35.1 -> 41.0; any second-level distance (8 to
/// 64 KiB) took Q4_K back to 31-34.
pub(crate) const PREFETCH_AMD: Prefetch = Prefetch { l1: 8192, l2: 0 };

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
pub(crate) fn prefetch_lines(p: *const u8, lines: std::ops::Range<usize>) {
    prefetch_lines_by(p, lines, prefetch_plan());
}

/// [`prefetch_lines`] at the distances `plan`.
#[inline(always)]
pub(crate) fn prefetch_lines_by(p: *const u8, lines: std::ops::Range<usize>, plan: Prefetch) {
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
pub(crate) fn prefetch_ahead<P>(p: &P) {
    prefetch_part(p, 0, 1);
}

/// Part `part` of `parts` of [`prefetch_ahead`]: a block's requests spread over its loop, so
/// that they do not all wait at once for the core's few line-fill buffers.
#[inline(always)]
pub(crate) fn prefetch_part<P>(p: &P, part: usize, parts: usize) {
    prefetch_part_as(Ahead::Plan, p, part, parts);
}

/// [`prefetch_part`] at the distances of `ahead`.
#[inline(always)]
pub(crate) fn prefetch_part_as<P>(ahead: Ahead, p: &P, part: usize, parts: usize) {
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
pub(crate) fn prefetch_share(bytes: &[u8], part: usize, parts: usize) {
    let lines = bytes.len().div_ceil(64);
    let parts = parts.max(1);
    prefetch_now(
        bytes.as_ptr(),
        lines * part / parts..lines * (part + 1) / parts,
    );
}

/// Every line that `x` lies on, asked for now into the first level.
#[inline(always)]
pub(crate) fn prefetch_value<X>(x: &X) {
    let at = (x as *const X).cast::<u8>();
    let skip = at as usize % 64;
    let lines = (skip + size_of::<X>()).div_ceil(64);
    prefetch_now(at.wrapping_sub(skip), 0..lines);
}

/// Lines `lines` (64 bytes each) of the bytes at `p` asked for now, into the first level: what
/// the batch kernels request of the rows their later passes read. A hint: it reads nothing and
/// never faults, past the end of the weights too.
#[inline(always)]
pub(crate) fn prefetch_now(p: *const u8, lines: std::ops::Range<usize>) {
    for line in lines {
        // SAFETY: a prefetch reads nothing into the program and never faults.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(64 * line).cast()) };
    }
}
