//! This machine's read bandwidth: the roofline ceiling every speed number is measured against.
//!
//! Decoding a token reads every weight once, so a decoder's best possible speed is the memory
//! bandwidth divided by the bytes of weights touched per token. The probe measures that ceiling
//! the way a kernel would reach it: each thread of the engine's own persistent pool streams over
//! its own contiguous slice of a buffer several times larger than the last-level cache, with the
//! widest vector loads the CPU has (AVX-512 or AVX2 chosen at run time, NEON on aarch64, a
//! portable loop elsewhere), several independent accumulators so that no dependency chain
//! limits the loads, and the best of several repetitions (the least disturbed one).
//!
//! A scalar sum, or one thread's loop compiled without vectors, measures the core's issue rate
//! rather than the memory, and reports a fraction of what this probe reads (measurements:
//! docs/perf-log.md, "The read-bandwidth probe").

use std::hint::black_box;
use std::time::{Duration, Instant};

use crate::matmul::{parallel_for, Threads};

/// One cache line, the probe's unit of work (and its alignment).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u64; 8]);

/// The default buffer: 1 GiB, several times any LLC a VM is likely to see (the probe is
/// meaningless when the buffer fits in cache).
pub const DEFAULT_BYTES: usize = 1 << 30;

/// Which loop the probe runs on this CPU.
pub fn isa() -> &'static str {
    kernel().0
}

type ReadFn = fn(&[Line]) -> u64;

/// How the probe reads, set once by a program before its first probe ([`configure`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProbeOptions {
    /// On x86-64, one stream a thread in address order instead of four: what a kernel that
    /// reads its weights once, in order, meets. Decode's kernels each read one, and came nearer
    /// this probe's rate than the four-stream one's (measurements: docs/perf-log.md, "The
    /// read-bandwidth probe").
    pub one_stream: bool,
    /// Ask for transparent huge pages for the buffer (Linux).
    pub huge_pages: bool,
}

impl Default for ProbeOptions {
    fn default() -> ProbeOptions {
        ProbeOptions {
            one_stream: false,
            huge_pages: true,
        }
    }
}

static OPTIONS: std::sync::OnceLock<ProbeOptions> = std::sync::OnceLock::new();

/// Set how the probe reads. It is fixed by the first probe: set it before. `Err` holds the
/// options in force where different ones already are.
pub fn configure(o: ProbeOptions) -> Result<(), ProbeOptions> {
    let now = *OPTIONS.get_or_init(|| o);
    if now == o {
        Ok(())
    } else {
        Err(now)
    }
}

fn options() -> ProbeOptions {
    *OPTIONS.get_or_init(ProbeOptions::default)
}

/// The widest loop this CPU runs, chosen once: on x86-64 four streams a thread, or one
/// ([`ProbeOptions::one_stream`]).
fn kernel() -> (&'static str, ReadFn) {
    #[cfg(target_arch = "x86_64")]
    {
        let one = one_stream();
        if synapse_quant::Cpu::detect().avx512f() {
            return if one {
                ("avx512 one-stream", x86::read_avx512_one)
            } else {
                ("avx512", x86::read_avx512)
            };
        }
        if synapse_quant::Cpu::detect().avx2() {
            return if one {
                ("avx2 one-stream", x86::read_avx2_one)
            } else {
                ("avx2", x86::read_avx2)
            };
        }
    }
    // NEON is aarch64's baseline.
    #[cfg(target_arch = "aarch64")]
    return ("neon", arm::read_neon);
    #[cfg(not(target_arch = "aarch64"))]
    ("portable", read_portable)
}

#[cfg(target_arch = "x86_64")]
fn one_stream() -> bool {
    options().one_stream
}

#[cfg_attr(target_arch = "aarch64", allow(dead_code))]
/// XOR of every word, eight independent lanes (compilers vectorise it to the baseline ISA).
fn read_portable(lines: &[Line]) -> u64 {
    let mut acc = [0u64; 8];
    for l in lines {
        for (a, &x) in acc.iter_mut().zip(&l.0) {
            *a ^= x;
        }
    }
    acc.iter().fold(0, |a, &b| a ^ b)
}

/// Thread `i`'s share of `n` lines (of `threads`): about an equal part, the inner boundaries
/// moved on by `i * SKEW` lines modulo `WINDOW`, so that the threads' streams do not start a
/// large power of two apart either (as the four streams of a thread's loop, `quarter`).
fn share(n: usize, threads: usize, i: usize) -> std::ops::Range<usize> {
    let skewed = n / threads.max(1) >= 2 * WINDOW;
    let bound = |i: usize| match i {
        i if i >= threads => n,
        i if skewed => i * n / threads + i * SKEW % WINDOW,
        i => i * n / threads,
    };
    bound(i)..bound(i + 1)
}

/// [`quarter`]'s and [`share`]'s skew: starts `SKEW` lines apart modulo `WINDOW` lines (64
/// KiB), a prime count.
const WINDOW: usize = 1024;
const SKEW: usize = 613;

/// Lines each of the four streams of the x86 loops reads from a slice of `n` lines: about a
/// quarter, but such that no two streams start a multiple of a large power of two apart (the
/// rest of the slice goes through a plain loop). Streams that far apart (a buffer of 1 GiB cut
/// in exact quarters put them 256 MiB apart) contend for the same cache sets and memory banks:
/// the probe read far less than one stream did, and every ratio against it came out too high
/// (measurements: docs/perf-log.md, "The read-bandwidth probe").
#[cfg(any(target_arch = "x86_64", test))]
fn quarter(n: usize) -> usize {
    // Starts 613 lines (mod 1024) apart: 0, 613, 202 and 815 lines into a 64 KiB window.
    match n / 4 {
        q if q < 2 * WINDOW => q,
        q => (q / WINDOW - 1) * WINDOW + SKEW,
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::Line;
    use std::arch::x86_64::*;

    pub fn read_avx512(lines: &[Line]) -> u64 {
        let w = Walk::four(super::quarter(lines.len()));
        // SAFETY: chosen only when the CPU has AVX-512F (`kernel` checks it); the walk's lines
        // are the first `w.covered()` of `lines`.
        unsafe { avx512(lines, w) ^ super::read_portable(&lines[w.covered()..]) }
    }

    pub fn read_avx2(lines: &[Line]) -> u64 {
        let w = Walk::four(super::quarter(lines.len()));
        // SAFETY: chosen only when the CPU has AVX2 (`kernel` checks it).
        unsafe { avx2(lines, w) ^ super::read_portable(&lines[w.covered()..]) }
    }

    pub fn read_avx512_one(lines: &[Line]) -> u64 {
        let w = Walk::one(lines.len());
        // SAFETY: as `read_avx512`.
        unsafe { avx512(lines, w) ^ super::read_portable(&lines[w.covered()..]) }
    }

    pub fn read_avx2_one(lines: &[Line]) -> u64 {
        let w = Walk::one(lines.len());
        // SAFETY: as `read_avx2`.
        unsafe { avx2(lines, w) ^ super::read_portable(&lines[w.covered()..]) }
    }

    /// The lines a loop reads, four a step into four accumulators: at step `j < steps`, line
    /// `j * advance + s * stride` for `s < 4`.
    ///
    /// - [`Walk::four`], the probe's: four streams at once, the slice's first `4 * part` lines
    ///   cut in four equal parts, each step the next line of every part. Several streams can
    ///   keep more requests in flight than one, at least with 32-byte AVX2 loads (measurements:
    ///   docs/perf-log.md, "The read-bandwidth probe"). The parts are [`super::quarter`]s: never
    ///   a large power of two apart.
    /// - [`Walk::one`]: one stream, four consecutive lines a step, what a kernel reading its
    ///   weights in order meets (`SYNAPSE_MEMBW_STREAMS=1`).
    #[derive(Clone, Copy)]
    struct Walk {
        steps: usize,
        stride: usize,
        advance: usize,
    }

    impl Walk {
        fn four(part: usize) -> Walk {
            Walk {
                steps: part,
                stride: part,
                advance: 1,
            }
        }

        fn one(n: usize) -> Walk {
            Walk {
                steps: n / 4,
                stride: 1,
                advance: 4,
            }
        }

        /// One past the last line the walk reads: both walks read every line below it, once.
        fn covered(self) -> usize {
            match self.steps {
                0 => 0,
                steps => (steps - 1) * self.advance + 3 * self.stride + 1,
            }
        }
    }

    /// The lines of `w` (which must lie inside `lines`) with 64-byte loads. Written as
    /// assembly so that it needs no AVX-512 intrinsics (newer than the crate's minimum Rust)
    /// and so that the compiler can neither narrow nor drop the loads.
    ///
    /// # Safety
    /// The CPU must have AVX-512F.
    unsafe fn avx512(lines: &[Line], w: Walk) -> u64 {
        assert!(w.covered() <= lines.len());
        let mut out: u64;
        // SAFETY: reads lines `j * advance + s * stride` for j < steps, s < 4, all inside
        // `lines` (asserted; r8 starts at stream 2); the loop runs only when `steps > 0`;
        // every vector register it writes is declared clobbered (all of them are caller-saved
        // in the C ABI).
        unsafe {
            std::arch::asm!(
                "vpxorq zmm4, zmm4, zmm4",
                "vpxorq zmm5, zmm5, zmm5",
                "vpxorq zmm6, zmm6, zmm6",
                "vpxorq zmm7, zmm7, zmm7",
                "test rcx, rcx",
                "jz 3f",
                "lea r8, [rsi + 2 * rdx]",
                "2:",
                "vpxorq zmm4, zmm4, zmmword ptr [rsi]",
                "vpxorq zmm5, zmm5, zmmword ptr [rsi + rdx]",
                "vpxorq zmm6, zmm6, zmmword ptr [r8]",
                "vpxorq zmm7, zmm7, zmmword ptr [r8 + rdx]",
                "add rsi, r9",
                "add r8, r9",
                "dec rcx",
                "jnz 2b",
                "3:",
                "vpxorq zmm4, zmm4, zmm5",
                "vpxorq zmm6, zmm6, zmm7",
                "vpxorq zmm4, zmm4, zmm6",
                "vextracti64x4 ymm5, zmm4, 1",
                "vpxor ymm4, ymm4, ymm5",
                "vextracti128 xmm5, ymm4, 1",
                "vpxor xmm4, xmm4, xmm5",
                "vpshufd xmm5, xmm4, 0x4e",
                "vpxor xmm4, xmm4, xmm5",
                "vmovq rax, xmm4",
                "vzeroupper",
                inout("rsi") lines.as_ptr() => _,
                inout("rcx") w.steps => _,
                in("rdx") w.stride * 64,
                in("r9") w.advance * 64,
                out("r8") _,
                lateout("rax") out,
                clobber_abi("C"),
                options(nostack, readonly),
            );
        }
        out
    }

    /// [`avx512`]'s walk, each 64-byte line as two 32-byte loads.
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    unsafe fn avx2(lines: &[Line], w: Walk) -> u64 {
        let mut acc = [_mm256_setzero_si256(); 8];
        for j in 0..w.steps {
            for s in 0..4 {
                let p = &lines[j * w.advance + s * w.stride] as *const Line as *const __m256i;
                // SAFETY: a line is 64 bytes, 64-byte aligned: two aligned 32-byte vectors.
                let (lo, hi) = unsafe { (_mm256_load_si256(p), _mm256_load_si256(p.add(1))) };
                acc[2 * s] = _mm256_xor_si256(acc[2 * s], lo);
                acc[2 * s + 1] = _mm256_xor_si256(acc[2 * s + 1], hi);
            }
        }
        let x = acc[1..].iter().fold(acc[0], |x, &a| _mm256_xor_si256(x, a));
        let x = _mm_xor_si128(_mm256_castsi256_si128(x), _mm256_extracti128_si256::<1>(x));
        (_mm_cvtsi128_si64(x) ^ _mm_extract_epi64::<1>(x)) as u64
    }
}

#[cfg(target_arch = "aarch64")]
mod arm {
    use super::Line;
    use std::arch::aarch64::*;

    pub fn read_neon(lines: &[Line]) -> u64 {
        // SAFETY: NEON is part of the aarch64 baseline.
        unsafe { neon(lines) }
    }

    /// # Safety
    /// The CPU must have NEON.
    #[target_feature(enable = "neon")]
    unsafe fn neon(lines: &[Line]) -> u64 {
        let mut acc = [vdupq_n_u64(0); 4];
        for l in lines {
            let p = l.0.as_ptr();
            for (k, a) in acc.iter_mut().enumerate() {
                // SAFETY: a line is 8 u64: four 2-lane vectors.
                *a = veorq_u64(*a, unsafe { vld1q_u64(p.add(2 * k)) });
            }
        }
        let x = veorq_u64(veorq_u64(acc[0], acc[1]), veorq_u64(acc[2], acc[3]));
        vgetq_lane_u64::<0>(x) ^ vgetq_lane_u64::<1>(x)
    }
}

/// A buffer for the probe: `bytes` rounded down to whole lines, every page written once (so
/// that it is really backed by memory, not by the shared zero page). On Linux it asks for
/// transparent huge pages: with 4 KiB pages a VM pays a two-level page walk every 4 KiB, which
/// measures the TLB rather than the memory.
pub struct ProbeBuffer {
    map: memmap2::MmapMut,
    n: usize,
}

impl ProbeBuffer {
    pub fn new(bytes: usize) -> ProbeBuffer {
        let n = (bytes / 64).max(1);
        let mut map = memmap2::MmapMut::map_anon(n * 64).expect("map the probe buffer");
        #[cfg(target_os = "linux")]
        if options().huge_pages {
            // Only a hint: without huge pages the probe still runs.
            let _ = map.advise(memmap2::Advice::HugePage);
        }
        for (i, w) in map.chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)).to_le_bytes());
        }
        ProbeBuffer { map, n }
    }

    fn lines(&self) -> &[Line] {
        // SAFETY: the map is page-aligned (so 64-byte aligned), holds `n * 64` initialised
        // bytes, and `Line` is plain `u64`s, valid for any bits.
        unsafe { std::slice::from_raw_parts(self.map.as_ptr() as *const Line, self.n) }
    }

    pub fn bytes(&self) -> usize {
        self.n * 64
    }
}

/// Read bandwidth in GB/s (1e9 bytes/s) of `threads`, each streaming its own contiguous share
/// of `buf`: best of `reps` passes (after one untimed pass).
pub fn read_bandwidth(buf: &ProbeBuffer, threads: &Threads, reps: usize) -> f64 {
    let (_, read) = kernel();
    let n = threads.n();
    let lines = buf.lines();
    let pass = || {
        parallel_for(threads, n, |r| {
            for i in r {
                black_box(read(&lines[share(lines.len(), n, i)]));
            }
        })
    };
    pass();
    let best = (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            pass();
            t.elapsed()
        })
        .min()
        .unwrap_or(Duration::MAX);
    buf.bytes() as f64 / best.as_secs_f64() / 1e9
}

/// One timed pass of `threads` over slice `part` of `parts` equal slices of `buf`, each thread
/// streaming its own contiguous share of the slice, in GB/s. A slice still several times the
/// last-level cache is a short probe to pair with other work of the same moment (`synapse bench
/// --probe-each-token`); passes over successive slices find each one cold.
pub fn read_part(buf: &ProbeBuffer, threads: &Threads, part: usize, parts: usize) -> f64 {
    let (_, read) = kernel();
    let n = threads.n();
    let all = buf.lines();
    let parts = parts.clamp(1, all.len());
    let lines = &all[part % parts * all.len() / parts..(part % parts + 1) * all.len() / parts];
    let t = Instant::now();
    parallel_for(threads, n, |r| {
        for i in r {
            black_box(read(&lines[share(lines.len(), n, i)]));
        }
    });
    (lines.len() * 64) as f64 / t.elapsed().as_secs_f64().max(1e-9) / 1e9
}

/// [`read_part`] over memory of the caller's instead of a probe buffer: one timed pass of
/// `threads` over part `part` of `parts` equal parts of the bytes of `slices` taken end to end
/// (each thread its own contiguous share), in GB/s. Over a model's weights
/// ([`crate::Model::weight_memory`]) it measures the bandwidth of the very pages a decode step
/// streams. (Such passes once read well over the probe's buffer, whose four streams lay 256 MiB
/// apart then, not its pages: docs/perf-log.md, "The read-bandwidth probe".)
pub fn read_slices_part(slices: &[&[u8]], threads: &Threads, part: usize, parts: usize) -> f64 {
    let (_, read) = kernel();
    let total: usize = slices.iter().map(|s| s.len()).sum();
    let parts = parts.max(1);
    let (p0, p1) = (
        part % parts * total / parts,
        (part % parts + 1) * total / parts,
    );
    let n = threads.n();
    let t = Instant::now();
    parallel_for(threads, n, |r| {
        for i in r {
            let (s, e) = (p0 + i * (p1 - p0) / n, p0 + (i + 1) * (p1 - p0) / n);
            black_box(read_range(slices, s..e, read));
        }
    });
    (p1 - p0) as f64 / t.elapsed().as_secs_f64().max(1e-9) / 1e9
}

/// XOR of the bytes `range` of `slices` taken end to end: whole lines through `read`, the
/// unaligned ends byte by byte.
fn read_range(slices: &[&[u8]], range: std::ops::Range<usize>, read: ReadFn) -> u64 {
    let mut acc = 0u64;
    for bytes in segments(slices, range) {
        // SAFETY: `Line` is plain `u64`s (any bits are a value), so viewing the aligned
        // middle of initialised bytes as lines is sound.
        let (head, lines, tail) = unsafe { bytes.align_to::<Line>() };
        acc ^= read(lines);
        for &b in head.iter().chain(tail) {
            acc = acc.rotate_left(8) ^ u64::from(b);
        }
    }
    acc
}

/// The pieces of `slices` (taken end to end) that bytes `range` covers, in order.
fn segments<'a>(slices: &[&'a [u8]], range: std::ops::Range<usize>) -> Vec<&'a [u8]> {
    let mut out = Vec::new();
    let mut start = 0;
    for s in slices {
        let (lo, hi) = (range.start.max(start), range.end.min(start + s.len()));
        if lo < hi {
            out.push(&s[lo - start..hi - start]);
        }
        start += s.len();
    }
    out
}

/// One probe result.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bandwidth {
    pub threads: usize,
    pub gbs: f64,
}

/// The probe for each thread count in `counts`, on one buffer of `bytes`.
pub fn probe(counts: &[usize], bytes: usize, reps: usize) -> Vec<Bandwidth> {
    let buf = ProbeBuffer::new(bytes);
    counts
        .iter()
        .map(|&t| {
            let threads = Threads::new(t);
            Bandwidth {
                threads: t,
                gbs: read_bandwidth(&buf, &threads, reps),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_loop_reads_every_word() {
        // The XOR of all words is the same whichever loop computes it, tails included.
        // (8197 lines and more: four streams a skewed quarter long, and a tail.)
        for n in [0, 1, 2, 3, 5, 8, 13, 64, 67, 8197, 1 << 14] {
            let b = ProbeBuffer::new(n * 64);
            let lines = &b.lines()[..n.min(b.lines().len())];
            let want = read_portable(lines);
            assert_eq!(kernel().1(lines), want, "{} on {n} lines", isa());
            #[cfg(target_arch = "x86_64")]
            if synapse_quant::Cpu::detect().avx2() {
                assert_eq!(x86::read_avx2(lines), want, "avx2 on {n} lines");
                assert_eq!(
                    x86::read_avx2_one(lines),
                    want,
                    "avx2, one stream, {n} lines"
                );
            }
            #[cfg(target_arch = "x86_64")]
            if synapse_quant::Cpu::detect().avx512f() {
                assert_eq!(x86::read_avx512(lines), want, "avx512 on {n} lines");
                assert_eq!(
                    x86::read_avx512_one(lines),
                    want,
                    "avx512, one stream, {n} lines"
                );
            }
        }
    }

    #[test]
    fn streams_and_shares_never_start_a_large_power_of_two_apart() {
        for n in [
            0,
            1,
            5,
            900,
            4096,
            8191,
            8192,
            1 << 20,
            (1 << 24) + 7,
            1 << 24,
        ] {
            let q = quarter(n);
            assert!(4 * q <= n, "{n} lines: four quarters of {q} overrun");
            if n >= 8 * WINDOW {
                // Large slices: the parts are long, and stream starts differ below 64 KiB.
                assert!(
                    4 * q + 8 * WINDOW > n,
                    "{n} lines: quarters of {q} leave too much"
                );
                assert_ne!(q % WINDOW, 0, "{n} lines: quarter {q}");
            }
            for threads in 1..=4 {
                let shares: Vec<_> = (0..threads).map(|i| share(n, threads, i)).collect();
                // In order, end to end, every line once.
                assert_eq!(shares[0].start, 0);
                assert_eq!(shares[threads - 1].end, n);
                for w in shares.windows(2) {
                    assert_eq!(w[0].end, w[1].start, "{n} lines, {threads} threads");
                }
                for (i, r) in shares.iter().enumerate() {
                    assert!(r.start <= r.end, "{n} lines, {threads} threads: {r:?}");
                    if i > 0 && n / threads >= 2 * WINDOW {
                        assert_ne!(r.start % WINDOW, 0, "{n} lines, thread {i} of {threads}");
                    }
                }
            }
        }
    }

    #[test]
    fn a_part_pass_gives_a_positive_finite_rate() {
        let b = ProbeBuffer::new(4 << 20);
        for t in [1, 2] {
            let threads = Threads::new(t);
            for part in 0..5 {
                let gbs = read_part(&b, &threads, part, 4);
                assert!(
                    gbs.is_finite() && gbs > 0.0,
                    "{t} threads, part {part}: {gbs}"
                );
            }
        }
    }

    #[test]
    fn parts_of_slices_cover_every_byte_once_in_order() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        // Uneven pieces, an empty one, unaligned starts.
        let slices: Vec<&[u8]> = vec![&data[..1], &data[1..130], &data[130..130], &data[130..]];
        for parts in [1, 2, 3, 7] {
            let mut got = Vec::new();
            for p in 0..parts {
                let (s, e) = (p * data.len() / parts, (p + 1) * data.len() / parts);
                for seg in segments(&slices, s..e) {
                    got.extend_from_slice(seg);
                }
            }
            assert_eq!(got, data, "{parts} parts");
        }
        // A pass over them runs and gives a rate.
        let threads = Threads::new(2);
        let gbs = read_slices_part(&slices, &threads, 1, 3);
        assert!(gbs.is_finite() && gbs > 0.0);
    }

    #[test]
    fn probe_gives_a_positive_finite_rate_per_thread_count() {
        let r = probe(&[1, 2], 8 << 20, 2);
        assert_eq!(r.iter().map(|b| b.threads).collect::<Vec<_>>(), [1, 2]);
        assert!(r.iter().all(|b| b.gbs.is_finite() && b.gbs > 0.0), "{r:?}");
    }
}
