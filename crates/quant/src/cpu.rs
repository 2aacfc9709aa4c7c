//! What this CPU can run: its features asked for once, here and nowhere else in the library, and
//! the kernel tiers they make, capped by the kernel configuration ([`crate::KernelConfig`]).
//!
//! A [`Cpu`] can only be made by [`Cpu::detect`] and narrowed by [`Cpu::capped`], so a value
//! never claims more than the machine has: the kernel table ([`crate::kernels`]) hands out
//! `unsafe` kernels on its word.

use std::sync::OnceLock;

use crate::config::Tier;

/// The CPU's vector features that the kernels use, and the highest kernel tier allowed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Cpu {
    /// x86-64-v3's vector features: AVX2, FMA and F16C.
    v3: bool,
    avx512f: bool,
    /// AVX-512 BW, DQ, VL and VNNI, with F.
    avx512_int: bool,
    avx512bf16: bool,
    avx512fp16: bool,
    /// AVX-VNNI, the VEX encoding of the 256-bit `vpdpbusd`.
    avxvnni: bool,
    /// AMD's CPU family (CPUID leaf 1), `None` on other makers' CPUs.
    amd_family: Option<u32>,
    /// FEAT_DotProd (aarch64's `sdot`).
    dotprod: bool,
    /// The highest x86 tier the kernels may use.
    cap: Tier,
}

/// How this CPU runs the AVX-VNNI tier's kernels, whose integer products are the 256-bit
/// `vpdpbusd`: in AVX-VNNI's VEX encoding, or in AVX-512 VNNI's EVEX encoding of the same
/// instruction. The tiers above take precedence where the cap allows them, so the EVEX form
/// runs where the kernels are capped at this tier on a CPU with AVX-512 and no AVX-VNNI: that
/// is how such a CPU runs (and tests) this tier's kernels, which qemu-user cannot emulate. The
/// two forms give the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vnni256 {
    /// AVX-VNNI (Intel's client cores since Alder Lake, AMD's Zen 5).
    Vex,
    /// AVX-512 F, BW, DQ, VL and VNNI, without AVX-VNNI.
    Evex,
}

impl Cpu {
    /// This machine's features (asked for once), every tier allowed.
    pub fn detect() -> Cpu {
        static DETECTED: OnceLock<Cpu> = OnceLock::new();
        *DETECTED.get_or_init(ask)
    }

    /// This CPU with the kernels kept at tier `cap` or below (`None`: no cap). Capping only
    /// removes: the tiers give the same bits, so a cap changes only the speed.
    #[inline]
    pub fn capped(self, cap: Option<Tier>) -> Cpu {
        Cpu {
            cap: cap.map_or(self.cap, |c| c.min(self.cap)),
            ..self
        }
    }

    /// The tier cap in force.
    #[inline]
    pub fn cap(&self) -> Tier {
        self.cap
    }

    /// Whether the AVX2 tier runs: AVX2, FMA and F16C, and the cap allows it.
    #[inline]
    pub fn avx2(&self) -> bool {
        self.cap >= Tier::Avx2 && self.v3
    }

    /// How the AVX-VNNI tier runs, if it does ([`Vnni256`]): it needs the AVX2 tier's
    /// features besides.
    #[inline]
    pub fn vnni256(&self) -> Option<Vnni256> {
        if self.cap < Tier::AvxVnni || !self.v3 {
            None
        } else if self.avxvnni {
            Some(Vnni256::Vex)
        } else if self.avx512_int {
            Some(Vnni256::Evex)
        } else {
            None
        }
    }

    /// Whether AVX-512 F runs beside the AVX2 tier's features (the float kernels, attention's
    /// sixteen-lane passes): the cap must allow the AVX-512 tier.
    #[inline]
    pub fn avx512f(&self) -> bool {
        self.cap >= Tier::Avx512Vnni && self.v3 && self.avx512f
    }

    /// Whether the AVX-512 VNNI tier runs: AVX-512 F, BW, DQ, VL and VNNI with the AVX2 tier's
    /// features.
    #[inline]
    pub fn avx512_vnni(&self) -> bool {
        self.avx512f() && self.avx512_int
    }

    /// Whether AVX512-BF16's `vdpbf16ps` runs (within the AVX-512 tier).
    #[inline]
    pub fn avx512_bf16(&self) -> bool {
        self.avx512f() && self.avx512bf16
    }

    /// Whether AVX512-FP16's arithmetic runs (within the AVX-512 tier).
    #[inline]
    pub fn avx512_fp16(&self) -> bool {
        self.avx512f() && self.avx512fp16
    }

    /// Whether aarch64's FEAT_DotProd runs.
    #[inline]
    pub fn dotprod(&self) -> bool {
        self.dotprod
    }

    /// AMD's CPU family, on AMD's CPUs (whose memory systems some kernels are tuned for apart).
    #[inline]
    pub fn amd_family(&self) -> Option<u32> {
        self.amd_family
    }

    /// The best tier this CPU runs, for reports: `avx512vnni`, `avxvnni`, `avx2`,
    /// `neon+dotprod`, `neon` or `reference`.
    pub fn tier_name(&self) -> &'static str {
        if cfg!(target_arch = "aarch64") {
            return if self.dotprod { "neon+dotprod" } else { "neon" };
        }
        if self.avx512_vnni() {
            "avx512vnni"
        } else if self.vnni256().is_some() {
            "avxvnni"
        } else if self.avx2() {
            "avx2"
        } else {
            "reference"
        }
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
impl Cpu {
    /// A made-up CPU, for the tests of the kernel table's choices on machines other than this
    /// one (never run: its kernels may need what this machine lacks).
    pub(crate) fn made_up(features: &str, amd_family: Option<u32>) -> Cpu {
        let has = |f: &str| features.split(',').any(|x| x == f);
        Cpu {
            v3: has("v3"),
            avx512f: has("avx512f"),
            avx512_int: has("avx512int"),
            avx512bf16: has("avx512bf16"),
            avx512fp16: has("avx512fp16"),
            avxvnni: has("avxvnni"),
            amd_family,
            dotprod: has("dotprod"),
            cap: Tier::Avx512Vnni,
        }
    }
}

/// The one place the library asks the CPU what it has.
fn ask() -> Cpu {
    let mut c = Cpu {
        v3: false,
        avx512f: false,
        avx512_int: false,
        avx512bf16: false,
        avx512fp16: false,
        avxvnni: false,
        amd_family: None,
        dotprod: false,
        cap: Tier::Avx512Vnni,
    };
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        c.v3 = has!("avx2") && has!("fma") && has!("f16c");
        c.avx512f = has!("avx512f");
        c.avx512_int = c.avx512f
            && has!("avx512bw")
            && has!("avx512dq")
            && has!("avx512vl")
            && has!("avx512vnni");
        c.avx512bf16 = c.avx512f && has!("avx512bf16");
        c.avx512fp16 = c.avx512f && has!("avx512fp16");
        c.avxvnni = has!("avxvnni");
        c.amd_family = amd_family();
    }
    #[cfg(target_arch = "aarch64")]
    {
        c.dotprod = std::arch::is_aarch64_feature_detected!("dotprod");
    }
    c
}

/// The family of an AMD CPU (CPUID leaf 1: the base family, plus the extended family where the
/// base is 0xF), `None` on others.
#[cfg(target_arch = "x86_64")]
fn amd_family() -> Option<u32> {
    let id = std::arch::x86_64::__cpuid(0);
    if [id.ebx, id.edx, id.ecx].map(u32::to_le_bytes).concat() != b"AuthenticAMD" {
        return None;
    }
    let eax = std::arch::x86_64::__cpuid(1).eax;
    let base = (eax >> 8) & 0xF;
    Some(if base == 0xF {
        base + ((eax >> 20) & 0xFF)
    } else {
        base
    })
}

/// The CPU the kernels run on: [`Cpu::detect`] capped as the kernel configuration says
/// ([`crate::configure`]).
#[inline]
pub fn cpu() -> &'static Cpu {
    static CPU: OnceLock<Cpu> = OnceLock::new();
    CPU.get_or_init(|| Cpu::detect().capped(crate::config().isa_cap))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_only_removes() {
        let full = Cpu::detect();
        for cap in Tier::ALL {
            let c = full.capped(Some(cap));
            assert!(c.cap() <= cap);
            assert!(!c.avx2() || full.avx2());
            assert!(!c.avx512_vnni() || (full.avx512_vnni() && cap == Tier::Avx512Vnni));
            assert!(c.vnni256().is_none() || cap >= Tier::AvxVnni);
            assert!(!c.avx2() || cap >= Tier::Avx2);
            // Capping twice keeps the lower cap.
            assert_eq!(c.capped(Some(Tier::Avx512Vnni)), c);
        }
        assert_eq!(full.capped(None), full);
    }
}
