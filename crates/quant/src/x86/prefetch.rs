//! How far ahead of the x86 kernels their weights are asked for, one plan per CPU.

use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0, _MM_HINT_T1};

/// How far ahead of the kernels their weights are asked for, in bytes: into the first-level
/// cache from `l1` bytes ahead, and into the second from `l2` (none where 0). The hardware's
/// prefetchers alone leave a core well under the bandwidth a streaming read reaches; asked for
/// as the loop goes rather than in a burst before each row ([`crate::codec::prefetch_ahead`]),
/// the rows read more of it (measurements: docs/perf-log.md, "Prefetch: asked for as the loop
/// goes").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Prefetch {
    pub l1: usize,
    pub l2: usize,
}

/// Intel's cores (measured on a Xeon of the Sapphire Rapids generation): one distance alone is
/// bounded by the first level's few line-fill buffers, so both levels are asked, from 4 and 16
/// KiB ahead (measurements: docs/perf-log.md, "Prefetch distances").
pub(crate) const PREFETCH_BOTH: Prefetch = Prefetch {
    l1: 4096,
    l2: 16384,
};

/// AMD's (measured on a Zen 5 EPYC): the second-level requests cost more than they bring, and
/// the first level wants to be asked from further ahead, 8 KiB (measurements: docs/perf-log.md,
/// "Prefetch distances").
pub(crate) const PREFETCH_AMD: Prefetch = Prefetch { l1: 8192, l2: 0 };

/// Which prefetch distances a kernel asks ahead at. Only the speed depends on them;
/// `SYNAPSE_PREFETCH=L1,L2` (bytes) sets all three kinds to those distances, to tune a CPU
/// not measured here.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Ahead {
    /// The distances of this CPU: [`PREFETCH_AMD`] on AMD's, [`PREFETCH_BOTH`] on others.
    Plan,
    /// [`Ahead::Plan`] for the kernels whose loads lag the memory most: on AMD's cores before Zen 5
    /// (measured on a Zen 4 EPYC), a second-level request 16 KiB ahead besides the first-level
    /// one. The one-token kernels of Q6_K, IQ4_XS, Q3_K, Q2_K and the 32-value formats read more
    /// of the memory so, others gained nothing, and the plan for every kernel slowed Gemma 3's
    /// decode: only the kernels that gain take this one (measurements: docs/perf-log.md,
    /// "Prefetch distances").
    Deep,
    /// [`Ahead::Plan`] for the one-token kernels that stream best on their own: on AMD's cores
    /// before Zen 5 (measured on a Zen 4 EPYC), no requests at all. Q4_K's and Q8_0's, the kernels
    /// that spend the fewest operations a byte, read more of the memory with the core's own
    /// prefetchers alone (likely the requests only took line-fill buffers from their loads; not
    /// checked with counters, which that VM lacks), and so does F16's packed one-token kernel,
    /// whose rows are read chain by chain in address order; every other one-token kernel read
    /// less (measurements: docs/perf-log.md, "Prefetch distances").
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
