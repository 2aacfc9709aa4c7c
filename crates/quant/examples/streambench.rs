//! How close to a plain read a loop that computes as it streams can come on this core:
//! `cargo run --release -p synapse-quant --example streambench`. One thread reads a 1 GiB
//! buffer (transparent huge pages asked for, as the probe and the packed weights do) with
//! 512-bit loads, eight independent lines a step:
//!
//! - `plain`: loads only, the read-bandwidth probe's loop (`synapse bench --membw`);
//! - `plain, t0 D`: the same with a first-level prefetch `D` bytes ahead of every line;
//! - `compute`: each line's two nibble halves run through `W` pairs of `vpdpbusd`, about the
//!   work of a one-token kernel on 64 bytes of packed weights at `W = 3` (its hot rate, timed
//!   on a 1 MiB buffer, is printed beside it), without software prefetch and with first-level
//!   prefetch `D` bytes ahead, or first level `D1` plus second level (`t1`) `D2`;
//! - `compute W=3, S streams, chunk C`: the same work over `S` equal parts of the buffer at
//!   once, `C` bytes of each part in turn (a kernel reading two or four runs of rows side by
//!   side), without software prefetch or with first-level prefetch `D` ahead in each part.
//!
//! The decode kernels' distances are chosen from such numbers (docs/perf-log.md); this measures
//! the ceiling they work under. x86-64 with AVX-512 VNNI only.

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;
    use std::time::Instant;

    const BYTES: usize = 1 << 30;
    const HOT: usize = 1 << 20;

    /// XOR of every line, eight chains; `d1`/`d2`: first/second-level prefetch distances (0:
    /// none).
    #[target_feature(enable = "avx512f")]
    unsafe fn plain(p: *const u8, n: usize, d1: usize) -> __m512i {
        let mut a = [_mm512_setzero_si512(); 8];
        let mut i = 0;
        while i < n {
            for (k, a) in a.iter_mut().enumerate() {
                if d1 > 0 {
                    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(i + d1 + 64 * k).cast());
                }
                // SAFETY: line i / 64 + k lies inside the buffer (n is a multiple of 512).
                *a = _mm512_xor_si512(*a, unsafe { _mm512_load_si512(p.add(i + 64 * k).cast()) });
            }
            i += 512;
        }
        a.iter()
            .fold(_mm512_setzero_si512(), |x, &y| _mm512_xor_si512(x, y))
    }

    /// One step of the computing loops: the eight lines at `q` through `W` pairs of `vpdpbusd`
    /// on their nibble halves into `a`, each line with a first- (`d1`) and second-level (`d2`)
    /// request that far ahead (0: none).
    ///
    /// # Safety
    /// AVX-512 F, BW and VNNI (the callers' features); the eight lines lie in the buffer.
    #[inline(always)]
    unsafe fn step<const W: usize>(a: &mut [__m512i; 8], q: *const u8, d1: usize, d2: usize) {
        // SAFETY: the caller's.
        unsafe {
            let y = _mm512_set1_epi32(0x0102_0304);
            let m4 = _mm512_set1_epi8(15);
            for (k, a) in a.iter_mut().enumerate() {
                if d1 > 0 {
                    _mm_prefetch::<_MM_HINT_T0>(q.wrapping_add(d1 + 64 * k).cast());
                }
                if d2 > 0 {
                    _mm_prefetch::<_MM_HINT_T1>(q.wrapping_add(d2 + 64 * k).cast());
                }
                let v = _mm512_load_si512(q.add(64 * k).cast());
                let lo = _mm512_and_si512(v, m4);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
                for _ in 0..W {
                    *a = _mm512_dpbusd_epi32(*a, lo, y);
                    *a = _mm512_dpbusd_epi32(*a, hi, y);
                }
            }
        }
    }

    /// [`plain`] with `W` pairs of `vpdpbusd` on each line's nibble halves.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn compute<const W: usize>(p: *const u8, n: usize, d1: usize, d2: usize) -> __m512i {
        let mut a = [_mm512_setzero_si512(); 8];
        let mut i = 0;
        while i < n {
            // SAFETY: this function's features; lines i / 64.. + 8 lie inside the buffer (n is
            // a multiple of 512).
            unsafe { step::<W>(&mut a, p.add(i), d1, d2) };
            i += 512;
        }
        a.iter()
            .fold(_mm512_setzero_si512(), |x, &y| _mm512_xor_si512(x, y))
    }

    /// [`compute`] over `S` equal parts of the buffer at once: `chunk` bytes of each part in
    /// turn, each with its own first-level prefetch `d1` ahead.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    unsafe fn compute_streams<const W: usize, const S: usize>(
        p: *const u8,
        n: usize,
        d1: usize,
        chunk: usize,
    ) -> __m512i {
        let mut a = [_mm512_setzero_si512(); 8];
        let part = n / S / chunk * chunk;
        let mut i = 0;
        while i < part {
            for s in 0..S {
                let mut j = 0;
                while j < chunk {
                    // SAFETY: this function's features; the step's lines lie inside part `s`.
                    unsafe { step::<W>(&mut a, p.add(s * part + i + j), d1, 0) };
                    j += 512;
                }
            }
            i += chunk;
        }
        a.iter()
            .fold(_mm512_setzero_si512(), |x, &y| _mm512_xor_si512(x, y))
    }

    /// GB/s of the best of `reps` runs of `f` over `len` bytes.
    fn rate(len: usize, reps: usize, f: impl Fn() -> __m512i) -> f64 {
        let mut best = f64::MAX;
        for _ in 0..reps {
            let t = Instant::now();
            std::hint::black_box(f());
            best = best.min(t.elapsed().as_secs_f64());
        }
        len as f64 / best / 1e9
    }

    pub fn run() {
        if !(is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx512bw")
            && is_x86_feature_detected!("avx512vnni"))
        {
            println!("streambench: needs AVX-512 F, BW and VNNI");
            return;
        }
        let mut map = memmap2::MmapMut::map_anon(BYTES).expect("map the buffer");
        #[cfg(target_os = "linux")]
        let _ = map.advise(memmap2::Advice::HugePage);
        for (i, b) in map.iter_mut().enumerate().step_by(4096) {
            *b = i as u8;
        }
        let p = map.as_ptr();
        // The loops over `len` bytes of the buffer, safe to call: the CPU has the features
        // (checked above); the buffer holds BYTES bytes, a multiple of 512, and `len` is BYTES
        // or HOT, which is smaller.
        let plain_by = |len: usize, d1: usize| {
            // SAFETY: as above.
            unsafe { plain(p, len, d1) }
        };
        macro_rules! compute_by {
            ($w:literal, $len:expr, $d1:expr, $d2:expr) => {
                // SAFETY: as for `plain_by`.
                unsafe { compute::<$w>(p, $len, $d1, $d2) }
            };
        }
        println!("| loop | GB/s, round 1 | round 2 |\n|---|--:|--:|");
        let row = |name: String, f: &dyn Fn() -> f64| {
            let (a, b) = (f(), f());
            println!("| {name} | {a:.1} | {b:.1} |");
        };
        row("plain".into(), &|| rate(BYTES, 5, || plain_by(BYTES, 0)));
        for d in [4096, 8192, 16384] {
            row(format!("plain, t0 {d}"), &|| {
                rate(BYTES, 5, || plain_by(BYTES, d))
            });
        }
        macro_rules! with {
            ($w:literal) => {
                row(format!("compute W={} (hot, 1 MiB)", $w), &|| {
                    rate(HOT, 200, || compute_by!($w, HOT, 0, 0))
                });
                for (d1, d2) in [
                    (0, 0),
                    (4096, 0),
                    (8192, 0),
                    (12288, 0),
                    (4096, 32768),
                    (0, 16384),
                ] {
                    row(format!("compute W={}, t0 {d1}, t1 {d2}", $w), &|| {
                        rate(BYTES, 3, || compute_by!($w, BYTES, d1, d2))
                    });
                }
            };
        }
        with!(1);
        with!(3);
        for chunk in [512, 2048, 8192, 32768] {
            for d1 in [0, 4096, 8192] {
                row(
                    format!("compute W=3, 2 streams, chunk {chunk}, t0 {d1}"),
                    &|| {
                        // SAFETY: as for `plain_by`.
                        rate(BYTES, 3, || unsafe {
                            compute_streams::<3, 2>(p, BYTES, d1, chunk)
                        })
                    },
                );
                row(
                    format!("compute W=3, 4 streams, chunk {chunk}, t0 {d1}"),
                    &|| {
                        // SAFETY: as for `plain_by`.
                        rate(BYTES, 3, || unsafe {
                            compute_streams::<3, 4>(p, BYTES, d1, chunk)
                        })
                    },
                );
            }
        }
    }
}

fn main() {
    // SYNAPSE_ISA and its kin, as the synapse binary reads them.
    let (kernels, notes) = synapse_quant::KernelConfig::from_vars(|k| std::env::var(k).ok());
    notes.iter().for_each(|n| eprintln!("streambench: {n}"));
    let _ = synapse_quant::configure(kernels);
    #[cfg(target_arch = "x86_64")]
    x86::run();
    #[cfg(not(target_arch = "x86_64"))]
    println!("streambench: x86-64 only");
}
