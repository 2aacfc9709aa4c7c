//! How many 512-bit integer operations this core issues a cycle, alone and in the instruction
//! mixes the AVX-512 kernels choose between: `cargo run --release -p synapse-quant --example
//! portbench`. Registers only (no memory), twelve independent chains per loop, so the numbers
//! are issue rates, not latencies. The kernels' choices that rest on them (which form of the
//! `vec_dot` scaling a CPU's batches take) are in docs/PERF.md.

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::time::Instant;

    /// Loop iterations per timing; each runs the body once.
    const ITERS: u64 = 20_000_000;

    /// Time `ITERS` runs of an assembly body (clobbering zmm0..zmm15, reading zmm12..zmm15 as
    /// inputs), best of three; nanoseconds per iteration.
    macro_rules! time_body {
        ($($ins:expr),* $(,)?) => {{
            let mut best = f64::MAX;
            for _ in 0..3 {
                let t = Instant::now();
                // SAFETY: the caller checked AVX-512 F/BW and VNNI; the body touches only the
                // registers named as clobbered.
                unsafe {
                    asm!(
                        "vpxorq zmm0, zmm0, zmm0", "vpxorq zmm1, zmm1, zmm1",
                        "vpxorq zmm2, zmm2, zmm2", "vpxorq zmm3, zmm3, zmm3",
                        "vpxorq zmm4, zmm4, zmm4", "vpxorq zmm5, zmm5, zmm5",
                        "vpxorq zmm6, zmm6, zmm6", "vpxorq zmm7, zmm7, zmm7",
                        "vpternlogd zmm12, zmm12, zmm12, 0xFF", "vpabsb zmm13, zmm12",
                        "vpabsb zmm14, zmm12", "vpabsb zmm15, zmm12",
                        "2:",
                        $($ins,)*
                        "dec {n}",
                        "jnz 2b",
                        n = inout(reg) ITERS => _,
                        out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                        out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                        out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                        out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                        options(nostack),
                    );
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            best / ITERS as f64 * 1e9
        }};
    }

    /// One instruction, eight independent chains (zmm0..zmm7) of it per iteration.
    macro_rules! alone {
        ($name:literal, $op:literal) => {{
            let ns = time_body!(
                concat!($op, " zmm0, zmm13, zmm14"),
                concat!($op, " zmm1, zmm13, zmm14"),
                concat!($op, " zmm2, zmm13, zmm14"),
                concat!($op, " zmm3, zmm13, zmm14"),
                concat!($op, " zmm4, zmm13, zmm14"),
                concat!($op, " zmm5, zmm13, zmm14"),
                concat!($op, " zmm6, zmm13, zmm14"),
                concat!($op, " zmm7, zmm13, zmm14"),
            );
            println!("| {} | {:.1} |", $name, 8.0 / ns);
        }};
    }

    pub fn run() {
        if !(is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vnni")) {
            println!("portbench: needs AVX-512 BW and VNNI");
            return;
        }
        println!("| instruction (512-bit) | per ns |");
        println!("|---|--:|");
        alone!("vpdpbusd", "vpdpbusd");
        alone!("vpdpwssd", "vpdpwssd");
        alone!("vpmaddubsw", "vpmaddubsw");
        alone!("vpmaddwd", "vpmaddwd");
        alone!("vpmulld", "vpmulld");
        alone!("vpaddd", "vpaddd");
        alone!("vpandd", "vpandd");
        alone!("vpshufb", "vpshufb");
        alone!("vfmadd231ps", "vfmadd231ps");
        if is_x86_feature_detected!("avx512bf16") {
            alone!("vdpbf16ps", "vdpbf16ps");
            // Twelve chains: one instruction's latency over more than eight in flight.
            let ns = time_body!(
                "vdpbf16ps zmm0, zmm13, zmm14",
                "vdpbf16ps zmm1, zmm13, zmm14",
                "vdpbf16ps zmm2, zmm13, zmm14",
                "vdpbf16ps zmm3, zmm13, zmm14",
                "vdpbf16ps zmm4, zmm13, zmm14",
                "vdpbf16ps zmm5, zmm13, zmm14",
                "vdpbf16ps zmm6, zmm13, zmm14",
                "vdpbf16ps zmm7, zmm13, zmm14",
                "vdpbf16ps zmm8, zmm13, zmm14",
                "vdpbf16ps zmm9, zmm13, zmm14",
                "vdpbf16ps zmm10, zmm13, zmm14",
                "vdpbf16ps zmm11, zmm13, zmm14",
            );
            println!("| vdpbf16ps (12 chains) | {:.1} |", 12.0 / ns);
        }
        println!();
        // 512 products of four-value sums, each scaled by its group's scale.
        // One `vpmaddubsw` pair-sum step into accumulator `$acc` through `$tmp`.
        macro_rules! plain {
            ($tmp:literal, $acc:literal) => {
                concat!(
                    "vpmaddubsw zmm",
                    $tmp,
                    ", zmm13, zmm14\n",
                    "vpdpwssd zmm",
                    $acc,
                    ", zmm",
                    $tmp,
                    ", zmm15",
                )
            };
        }
        // Two four-value sums (through `$a`, `$b`) as the halves of a word into `$acc`.
        macro_rules! paired {
            ($a:literal, $b:literal, $acc:literal) => {
                concat!(
                    "vpxorq zmm",
                    $a,
                    ", zmm",
                    $a,
                    ", zmm",
                    $a,
                    "\n",
                    "vpdpbusd zmm",
                    $a,
                    ", zmm13, zmm14\n",
                    "vpxorq zmm",
                    $b,
                    ", zmm",
                    $b,
                    ", zmm",
                    $b,
                    "\n",
                    "vpdpbusd zmm",
                    $b,
                    ", zmm13, zmm14\n",
                    "vpslld zmm",
                    $b,
                    ", zmm",
                    $b,
                    ", 16\n",
                    "vpternlogd zmm",
                    $a,
                    ", zmm",
                    $b,
                    ", zmm12, 0xEA\n",
                    "vpdpwssd zmm",
                    $acc,
                    ", zmm",
                    $a,
                    ", zmm15",
                )
            };
        }
        let plain = time_body!(
            plain!(8, 0),
            plain!(9, 0),
            plain!(10, 1),
            plain!(11, 1),
            plain!(8, 2),
            plain!(9, 2),
            plain!(10, 3),
            plain!(11, 3),
        );
        let paired = time_body!(
            paired!(8, 9, 0),
            paired!(10, 11, 1),
            paired!(8, 9, 2),
            paired!(10, 11, 3),
        );
        let folded = time_body!(
            "vpdpbusd zmm0, zmm13, zmm14",
            "vpdpbusd zmm1, zmm13, zmm14",
            "vpdpbusd zmm2, zmm13, zmm14",
            "vpdpbusd zmm3, zmm13, zmm14",
            "vpdpbusd zmm4, zmm13, zmm14",
            "vpdpbusd zmm5, zmm13, zmm14",
            "vpdpbusd zmm6, zmm13, zmm14",
            "vpdpbusd zmm7, zmm13, zmm14",
        );
        println!("| form of 512 products of scaled four-value sums | products per ns |");
        println!("|---|--:|");
        for (name, ns) in [
            ("plain: vpmaddubsw + vpdpwssd by (s, s)", plain),
            (
                "paired: 2 vpdpbusd, vpslld, vpternlogd, vpdpwssd by (s0, s1)",
                paired,
            ),
            ("folded (scale in the values): vpdpbusd", folded),
        ] {
            println!("| {name} | {:.0} |", 512.0 / ns);
        }
    }
}

fn main() {
    #[cfg(target_arch = "x86_64")]
    x86::run();
    #[cfg(not(target_arch = "x86_64"))]
    println!("portbench: x86-64 only");
}
