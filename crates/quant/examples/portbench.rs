//! How many 512-bit integer operations this core issues a cycle, alone and in the instruction
//! mixes the AVX-512 kernels choose between: `cargo run --release -p synapse-quant --example
//! portbench`. Registers only (but for the broadcast-load table), several independent chains
//! per loop, so the numbers are issue rates, not latencies: single instructions, pairs of them
//! (whether they share issue ports), the forms of `vec_dot`'s scaled sums, and whole steps of
//! the 6-bit kernel in the packed layouts it could take. The kernels' choices that rest on
//! them (which form of the scaling a CPU's batches take, Q6_K's packed layout) are in
//! docs/perf-log.md.

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::asm;
    use std::time::Instant;

    /// Loop iterations per timing; each runs the body once.
    const ITERS: u64 = 20_000_000;

    /// Time `ITERS` runs of an assembly body (clobbering zmm0..zmm27, reading zmm12..zmm15 as
    /// inputs, `{p}` a pointer to 256 bytes), best of three; nanoseconds per iteration.
    macro_rules! time_body {
        ($($ins:expr),* $(,)?) => {{
            // What `{p}` points at: 256 bytes on a cache line's start (bodies that read memory).
            #[repr(align(64))]
            struct Line([u8; 256]);
            let buf = Line([1; 256]);
            let mut best = f64::MAX;
            for _ in 0..3 {
                let t = Instant::now();
                // SAFETY: the caller checked AVX-512 F/BW and VNNI; the body touches only the
                // registers named as clobbered, and reads only `buf` through `{p}`.
                unsafe {
                    asm!(
                        "vpxorq zmm0, zmm0, zmm0", "vpxorq zmm1, zmm1, zmm1",
                        "vpxorq zmm2, zmm2, zmm2", "vpxorq zmm3, zmm3, zmm3",
                        "vpxorq zmm4, zmm4, zmm4", "vpxorq zmm5, zmm5, zmm5",
                        "vpxorq zmm6, zmm6, zmm6", "vpxorq zmm7, zmm7, zmm7",
                        "vpternlogd zmm12, zmm12, zmm12, 0xFF", "vpabsb zmm13, zmm12",
                        "vpabsb zmm14, zmm12", "vpabsb zmm15, zmm12",
                        "prefetcht0 [{p}]",
                        "2:",
                        $($ins,)*
                        "dec {n}",
                        "jnz 2b",
                        n = inout(reg) ITERS => _,
                        p = in(reg) buf.0.as_ptr(),
                        out("zmm0") _, out("zmm1") _, out("zmm2") _, out("zmm3") _,
                        out("zmm4") _, out("zmm5") _, out("zmm6") _, out("zmm7") _,
                        out("zmm8") _, out("zmm9") _, out("zmm10") _, out("zmm11") _,
                        out("zmm12") _, out("zmm13") _, out("zmm14") _, out("zmm15") _,
                        out("zmm16") _, out("zmm17") _, out("zmm18") _, out("zmm19") _,
                        out("zmm20") _, out("zmm21") _, out("zmm22") _, out("zmm23") _,
                        out("zmm24") _, out("zmm25") _, out("zmm26") _, out("zmm27") _,
                        options(nostack, readonly),
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

    /// One instruction with its own source operands (`$src`), eight independent chains.
    macro_rules! alone_imm {
        ($name:literal, $op:literal, $src:literal) => {{
            let ns = time_body!(
                concat!($op, " zmm0, ", $src),
                concat!($op, " zmm1, ", $src),
                concat!($op, " zmm2, ", $src),
                concat!($op, " zmm3, ", $src),
                concat!($op, " zmm4, ", $src),
                concat!($op, " zmm5, ", $src),
                concat!($op, " zmm6, ", $src),
                concat!($op, " zmm7, ", $src),
            );
            println!("| {} | {:.1} |", $name, 8.0 / ns);
        }};
    }

    /// Two instructions interleaved, four chains of each: whether they share issue ports
    /// (sharing: the pair's rate is the slower one's halved).
    macro_rules! mixed {
        ($name:literal, $a:literal, $b:literal, $src:literal) => {{
            let ns = time_body!(
                concat!($a, " zmm0, zmm13, zmm14"),
                concat!($b, " zmm4, ", $src),
                concat!($a, " zmm1, zmm13, zmm14"),
                concat!($b, " zmm5, ", $src),
                concat!($a, " zmm2, zmm13, zmm14"),
                concat!($b, " zmm6, ", $src),
                concat!($a, " zmm3, zmm13, zmm14"),
                concat!($b, " zmm7, ", $src),
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
        alone!("vpaddw", "vpaddw");
        alone!("vpermt2w", "vpermt2w");
        alone!("vpermb", "vpermb");
        alone_imm!("vpslld imm", "vpslld", "zmm13, 4");
        alone_imm!("vpsrlw imm", "vpsrlw", "zmm13, 4");
        alone_imm!("vpsraw imm", "vpsraw", "zmm13, 8");
        alone_imm!("vpsrlvd", "vpsrlvd", "zmm13, zmm14");
        alone_imm!("vpternlogd", "vpternlogd", "zmm13, zmm14, 0xEA");
        alone_imm!("vgf2p8affineqb", "vgf2p8affineqb", "zmm13, zmm14, 0");
        alone!("vpmultishiftqb", "vpmultishiftqb");
        println!(
            "| vpmovsxbw | {:.1} |",
            8.0 / time_body!(
                "vpmovsxbw zmm0, ymm13",
                "vpmovsxbw zmm1, ymm13",
                "vpmovsxbw zmm2, ymm13",
                "vpmovsxbw zmm3, ymm13",
                "vpmovsxbw zmm4, ymm13",
                "vpmovsxbw zmm5, ymm13",
                "vpmovsxbw zmm6, ymm13",
                "vpmovsxbw zmm7, ymm13",
            )
        );
        println!();
        println!("| two instructions, interleaved | per ns (both) |");
        println!("|---|--:|");
        mixed!("vpmaddubsw + vpslld", "vpmaddubsw", "vpslld", "zmm13, 4");
        mixed!("vpdpbusd + vpslld", "vpdpbusd", "vpslld", "zmm13, 4");
        mixed!("vpdpwssd + vpslld", "vpdpwssd", "vpslld", "zmm13, 4");
        mixed!(
            "vpmaddubsw + vgf2p8affineqb",
            "vpmaddubsw",
            "vgf2p8affineqb",
            "zmm13, zmm14, 0"
        );
        mixed!(
            "vpmaddubsw + vpshufb",
            "vpmaddubsw",
            "vpshufb",
            "zmm13, zmm14"
        );
        mixed!(
            "vpmaddubsw + vpermt2w",
            "vpmaddubsw",
            "vpermt2w",
            "zmm13, zmm14"
        );
        mixed!(
            "vpmaddubsw + vpaddw",
            "vpmaddubsw",
            "vpaddw",
            "zmm13, zmm14"
        );
        mixed!(
            "vpmaddubsw + vpternlogd",
            "vpmaddubsw",
            "vpternlogd",
            "zmm13, zmm14, 0xEA"
        );
        mixed!("vpslld + vpshufb", "vpshufb", "vpslld", "zmm13, 4");
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
        println!();
        println!("| `vpdpbusd` and its broadcast token values | per ns |");
        println!("|---|--:|");
        let bcst = time_body!(
            "vpdpbusd zmm0, zmm13, dword ptr [{p}]{{1to16}}",
            "vpdpbusd zmm1, zmm13, dword ptr [{p} + 4]{{1to16}}",
            "vpdpbusd zmm2, zmm13, dword ptr [{p} + 8]{{1to16}}",
            "vpdpbusd zmm3, zmm13, dword ptr [{p} + 12]{{1to16}}",
            "vpdpbusd zmm4, zmm13, dword ptr [{p} + 16]{{1to16}}",
            "vpdpbusd zmm5, zmm13, dword ptr [{p} + 20]{{1to16}}",
            "vpdpbusd zmm6, zmm13, dword ptr [{p} + 24]{{1to16}}",
            "vpdpbusd zmm7, zmm13, dword ptr [{p} + 28]{{1to16}}",
        );
        println!("| vpdpbusd, one broadcast load each | {:.1} |", 8.0 / bcst);
        let shared = time_body!(
            "vpbroadcastd zmm16, dword ptr [{p}]",
            "vpdpbusd zmm0, zmm13, zmm16",
            "vpdpbusd zmm1, zmm14, zmm16",
            "vpbroadcastd zmm17, dword ptr [{p} + 4]",
            "vpdpbusd zmm2, zmm13, zmm17",
            "vpdpbusd zmm3, zmm14, zmm17",
            "vpbroadcastd zmm18, dword ptr [{p} + 8]",
            "vpdpbusd zmm4, zmm13, zmm18",
            "vpdpbusd zmm5, zmm14, zmm18",
            "vpbroadcastd zmm19, dword ptr [{p} + 12]",
            "vpdpbusd zmm6, zmm13, zmm19",
            "vpdpbusd zmm7, zmm14, zmm19",
        );
        println!(
            "| vpdpbusd, one broadcast load for two | {:.1} |",
            8.0 / shared
        );
        let with_values = time_body!(
            "vmovdqu64 zmm16, [{p}]",
            "vpdpbusd zmm0, zmm16, dword ptr [{p}]{{1to16}}",
            "vpdpbusd zmm1, zmm16, dword ptr [{p} + 4]{{1to16}}",
            "vpdpbusd zmm2, zmm16, dword ptr [{p} + 8]{{1to16}}",
            "vpdpbusd zmm3, zmm16, dword ptr [{p} + 12]{{1to16}}",
            "vmovdqu64 zmm17, [{p} + 64]",
            "vpdpbusd zmm4, zmm17, dword ptr [{p} + 16]{{1to16}}",
            "vpdpbusd zmm5, zmm17, dword ptr [{p} + 20]{{1to16}}",
            "vpdpbusd zmm6, zmm17, dword ptr [{p} + 24]{{1to16}}",
            "vpdpbusd zmm7, zmm17, dword ptr [{p} + 28]{{1to16}}",
        );
        println!(
            "| vpdpbusd, one broadcast each, a value load for four | {:.1} |",
            8.0 / with_values
        );
        println!();
        q6_k_steps();
    }

    /// The unpacking of `vec_dot`'s 6-bit values (`ql` nibbles zmm13, zmm14, `qh` pairs zmm15;
    /// masks zmm12) from ggml's layout: four registers of values from three.
    macro_rules! unpack_nibbles {
        () => {
            "
        vpslld zmm4, zmm15, 4
        vpandd zmm4, zmm4, zmm12
        vpternlogd zmm4, zmm13, zmm12, 0xf8
        vpslld zmm5, zmm15, 2
        vpandd zmm5, zmm5, zmm12
        vpternlogd zmm5, zmm14, zmm12, 0xf8
        vpsrld zmm6, zmm13, 4
        vpandd zmm7, zmm15, zmm12
        vpternlogd zmm7, zmm6, zmm12, 0xf8
        vpsrld zmm8, zmm14, 4
        vpsrld zmm9, zmm15, 2
        vpandd zmm9, zmm9, zmm12
        vpternlogd zmm9, zmm8, zmm12, 0xf8"
        };
    }

    /// Four registers of values from three holding three values in their low six bits and the
    /// fourth's bits in their top two (shifts by 6, 4 and 2, masks).
    macro_rules! unpack_tops {
        () => {
            "
        vpandd zmm4, zmm13, zmm12
        vpandd zmm5, zmm14, zmm12
        vpandd zmm7, zmm15, zmm12
        vpsrld zmm6, zmm13, 6
        vpsrld zmm8, zmm14, 4
        vpsrld zmm9, zmm15, 2
        vpandd zmm9, zmm9, zmm12
        vpternlogd zmm6, zmm8, zmm12, 0xe4
        vpternlogd zmm9, zmm6, zmm12, 0xf8"
        };
    }

    /// As [`unpack_tops`], each top pair moved by a `vgf2p8affineqb` (no masks).
    macro_rules! unpack_tops_gf {
        () => {
            "
        vpandd zmm4, zmm13, zmm12
        vpandd zmm5, zmm14, zmm12
        vpandd zmm7, zmm15, zmm12
        vgf2p8affineqb zmm6, zmm13, zmm12, 0
        vgf2p8affineqb zmm8, zmm14, zmm12, 0
        vgf2p8affineqb zmm9, zmm15, zmm12, 0
        vpternlogd zmm9, zmm6, zmm8, 0xfe"
        };
    }

    /// The products of the four value registers, two groups' sums a word: by `vpdpbusd`,
    /// shifted into halves.
    macro_rules! pair_dpbusd {
        ($a:literal, $b:literal, $c:literal, $d:literal) => {
            concat!(
                "vpxor xmm10, xmm10, xmm10\n",
                "vpdpbusd zmm10, zmm4, zmm13\n",
                "vpxor xmm11, xmm11, xmm11\n",
                "vpdpbusd zmm11, zmm5, zmm13\n",
                "vpslld zmm11, zmm11, 16\n",
                "vpternlogd zmm11, zmm12, zmm10, 0xf8\n",
                "vpdpwssd zmm",
                $a,
                ", zmm11, zmm15\n",
                "vpxor xmm10, xmm10, xmm10\n",
                "vpdpbusd zmm10, zmm7, zmm13\n",
                "vpxor xmm11, xmm11, xmm11\n",
                "vpdpbusd zmm11, zmm9, zmm13\n",
                "vpslld zmm11, zmm11, 16\n",
                "vpternlogd zmm11, zmm12, zmm10, 0xf8\n",
                "vpdpwssd zmm",
                $b,
                ", zmm11, zmm15\n",
            )
        };
    }

    /// The same, the two groups' values interleaved a word each in the registers: two
    /// `vpmaddubsw` added as words.
    macro_rules! pair_maddubs {
        ($a:literal, $b:literal, $c:literal, $d:literal) => {
            concat!(
                "vpmaddubsw zmm10, zmm4, zmm13\n",
                "vpmaddubsw zmm11, zmm5, zmm13\n",
                "vpaddw zmm10, zmm10, zmm11\n",
                "vpdpwssd zmm",
                $a,
                ", zmm10, zmm15\n",
                "vpmaddubsw zmm10, zmm7, zmm13\n",
                "vpmaddubsw zmm11, zmm9, zmm13\n",
                "vpaddw zmm10, zmm10, zmm11\n",
                "vpdpwssd zmm",
                $b,
                ", zmm10, zmm15\n",
            )
        };
    }

    /// As [`pair_maddubs`], the scaling by `vpmaddwd` and an add.
    macro_rules! pair_maddwd {
        ($a:literal, $b:literal, $c:literal, $d:literal) => {
            concat!(
                "vpmaddubsw zmm10, zmm4, zmm13\n",
                "vpmaddubsw zmm11, zmm5, zmm13\n",
                "vpaddw zmm10, zmm10, zmm11\n",
                "vpmaddwd zmm10, zmm10, zmm15\n",
                "vpaddd zmm",
                $a,
                ", zmm",
                $a,
                ", zmm10\n",
                "vpmaddubsw zmm10, zmm7, zmm13\n",
                "vpmaddubsw zmm11, zmm9, zmm13\n",
                "vpaddw zmm10, zmm10, zmm11\n",
                "vpmaddwd zmm10, zmm10, zmm15\n",
                "vpaddd zmm",
                $b,
                ", zmm",
                $b,
                ", zmm10\n",
            )
        };
    }

    /// Each group's products by `vpmaddubsw` and `vpdpwssd` by (s, s).
    macro_rules! plain {
        ($a:literal, $b:literal, $c:literal, $d:literal) => {
            concat!(
                "vpmaddubsw zmm10, zmm4, zmm13\n",
                "vpdpwssd zmm",
                $a,
                ", zmm10, zmm15\n",
                "vpmaddubsw zmm11, zmm5, zmm13\n",
                "vpdpwssd zmm",
                $b,
                ", zmm11, zmm15\n",
                "vpmaddubsw zmm10, zmm7, zmm13\n",
                "vpdpwssd zmm",
                $c,
                ", zmm10, zmm15\n",
                "vpmaddubsw zmm11, zmm9, zmm13\n",
                "vpdpwssd zmm",
                $d,
                ", zmm11, zmm15\n",
            )
        };
    }

    /// One token's step of the 6-bit kernel (sixteen rows times sixteen values: unpacking and
    /// products), in the forms a packed layout could take; products per ns.
    fn q6_k_steps() {
        println!("| 6-bit step: unpack + products (256 products) | products per ns |");
        println!("|---|--:|");
        macro_rules! step {
            ($name:expr, $unpack:expr, $products:ident) => {{
                let ns = time_body!(
                    $unpack,
                    $products!(0, 1, 2, 3),
                    $unpack,
                    $products!(16, 17, 18, 19),
                    $unpack,
                    $products!(20, 21, 22, 23),
                    $unpack,
                    $products!(24, 25, 26, 27),
                );
                println!("| {} | {:.0} |", $name, 1024.0 / ns);
            }};
        }
        step!(
            "nibbles + pairs by vpdpbusd (one token, before the paired layout)",
            unpack_nibbles!(),
            pair_dpbusd
        );
        step!(
            "nibbles + plain (batches, before the paired layout)",
            unpack_nibbles!(),
            plain
        );
        step!(
            "nibbles + pairs by vpmaddubsw",
            unpack_nibbles!(),
            pair_maddubs
        );
        step!(
            "nibbles + pairs by vpmaddubsw, vpmaddwd",
            unpack_nibbles!(),
            pair_maddwd
        );
        step!("tops + pairs by vpdpbusd", unpack_tops!(), pair_dpbusd);
        step!(
            "tops + pairs by vpmaddubsw (the Q6_K kernels now)",
            unpack_tops!(),
            pair_maddubs
        );
        step!(
            "tops + pairs by vpmaddubsw, vpmaddwd",
            unpack_tops!(),
            pair_maddwd
        );
        step!("tops + plain", unpack_tops!(), plain);
        step!(
            "tops (gf2p8affine) + pairs by vpmaddubsw",
            unpack_tops_gf!(),
            pair_maddubs
        );
        step!(
            "tops (gf2p8affine) + pairs by vpmaddubsw, vpmaddwd",
            unpack_tops_gf!(),
            pair_maddwd
        );
        step!("tops (gf2p8affine) + plain", unpack_tops_gf!(), plain);
        step!("products alone: plain", "", plain);
        step!("products alone: pairs by vpmaddubsw", "", pair_maddubs);
        step!("products alone: pairs by vpdpbusd", "", pair_dpbusd);
    }
}

fn main() {
    // SYNAPSE_ISA and its kin, as the synapse binary reads them.
    let (kernels, notes) = synapse_quant::KernelConfig::from_vars(|k| std::env::var(k).ok());
    notes.iter().for_each(|n| eprintln!("portbench: {n}"));
    let _ = synapse_quant::configure(kernels);
    #[cfg(target_arch = "x86_64")]
    x86::run();
    #[cfg(not(target_arch = "x86_64"))]
    println!("portbench: x86-64 only");
}
