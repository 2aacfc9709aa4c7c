//! How the kernels are chosen, as one value a program sets once ([`configure`]) before the first
//! matrix is made: the highest x86 tier to use, whether to pack weights, Q5_K's paired batches,
//! decode's prefetch distances. None of them changes a bit of any result: they exist to measure
//! and test one tier or form on a machine that has more. Without a call, every tier the CPU has,
//! packing on, and the CPU's own choices.
//!
//! This crate reads no environment variable: the `synapse` binary reads `SYNAPSE_ISA`,
//! `SYNAPSE_PACK`, `SYNAPSE_PAIRED` and `SYNAPSE_PREFETCH` and hands their values to
//! [`KernelConfig::from_vars`], which is where they are named and parsed.

use std::sync::OnceLock;

/// The x86 kernel tiers, lowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// The reference kernels (plain Rust).
    Reference,
    /// AVX2, FMA and F16C.
    Avx2,
    /// AVX-VNNI (the VEX encoding) on top of AVX2.
    AvxVnni,
    /// AVX-512 (F, BW, VL, DQ) with VNNI.
    Avx512Vnni,
}

impl Tier {
    pub const ALL: [Tier; 4] = [Tier::Reference, Tier::Avx2, Tier::AvxVnni, Tier::Avx512Vnni];

    /// `reference`, `avx2`, `avxvnni` or `avx512vnni`.
    pub fn name(self) -> &'static str {
        match self {
            Tier::Reference => "reference",
            Tier::Avx2 => "avx2",
            Tier::AvxVnni => "avxvnni",
            Tier::Avx512Vnni => "avx512vnni",
        }
    }

    pub fn from_name(name: &str) -> Option<Tier> {
        Tier::ALL.into_iter().find(|t| t.name() == name)
    }
}

/// Decode's software-prefetch distances, in bytes ahead of the rows being read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefetchDistances {
    pub l1: usize,
    pub l2: usize,
}

/// The kernel choices of a process; see the module doc.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct KernelConfig {
    /// The highest x86 tier used; `None`: every tier the CPU has.
    pub isa_cap: Option<Tier>,
    /// Leave weights unpacked (to measure what packing brings).
    pub no_pack: bool,
    /// Q5_K batches in the paired form (`Some(true)`), the plain one (`Some(false)`), or as the
    /// CPU suits (`None`: paired on AMD's cores).
    pub paired: Option<bool>,
    /// Decode's prefetch distances; `None`: the CPU's plan.
    pub prefetch: Option<PrefetchDistances>,
}

impl KernelConfig {
    /// The configuration variables name: `SYNAPSE_ISA` (a [`Tier`] name), `SYNAPSE_PACK=0`,
    /// `SYNAPSE_PAIRED=0|1`, `SYNAPSE_PREFETCH=L1,L2`, each looked up with `var`. A value that
    /// does not parse is left at its default and explained in the returned notes.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> (KernelConfig, Vec<String>) {
        let mut c = KernelConfig::default();
        let mut notes = Vec::new();
        if let Some(v) = var("SYNAPSE_ISA") {
            c.isa_cap = Tier::from_name(&v);
            if c.isa_cap.is_none() {
                let names: Vec<_> = Tier::ALL.iter().map(|t| t.name()).collect();
                notes.push(format!(
                    "SYNAPSE_ISA={v:?} is not one of {}; ignored",
                    names.join(", ")
                ));
            }
        }
        c.no_pack = var("SYNAPSE_PACK").as_deref() == Some("0");
        c.paired = match var("SYNAPSE_PAIRED").as_deref() {
            Some("1") => Some(true),
            Some("0") => Some(false),
            _ => None,
        };
        if let Some(v) = var("SYNAPSE_PREFETCH") {
            c.prefetch = parse_prefetch(&v);
            if c.prefetch.is_none() {
                notes.push(format!(
                    "SYNAPSE_PREFETCH={v:?} is not two byte distances \"L1,L2\"; ignored"
                ));
            }
        }
        (c, notes)
    }
}

fn parse_prefetch(v: &str) -> Option<PrefetchDistances> {
    let (l1, l2) = v.split_once(',')?;
    Some(PrefetchDistances {
        l1: l1.trim().parse().ok()?,
        l2: l2.trim().parse().ok()?,
    })
}

static CONFIG: OnceLock<KernelConfig> = OnceLock::new();

/// Set this process's kernel configuration. It is fixed by the first kernel chosen: set it
/// before. `Err` holds the one in force where a different one already is.
pub fn configure(c: KernelConfig) -> Result<(), KernelConfig> {
    let now = *CONFIG.get_or_init(|| c);
    if now == c {
        Ok(())
    } else {
        Err(now)
    }
}

/// The configuration in force (the default unless [`configure`] came first).
pub fn config() -> &'static KernelConfig {
    CONFIG.get_or_init(KernelConfig::default)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_distances_parse_as_two_byte_counts() {
        let d = |l1, l2| Some(PrefetchDistances { l1, l2 });
        assert_eq!(parse_prefetch("8192,0"), d(8192, 0));
        assert_eq!(parse_prefetch(" 4096 , 16384 "), d(4096, 16384));
        for bad in ["", "8192", "8192,", "a,b", "1,2,3", "-1,0"] {
            assert_eq!(parse_prefetch(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn variables_parse_and_bad_ones_are_explained() {
        let vars = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|p| p.0 == k).map(|p| p.1.to_string())
        };
        let (c, notes) = KernelConfig::from_vars(vars(&[
            ("SYNAPSE_ISA", "avx2"),
            ("SYNAPSE_PACK", "0"),
            ("SYNAPSE_PAIRED", "1"),
            ("SYNAPSE_PREFETCH", "4096, 16384"),
        ]));
        assert!(notes.is_empty());
        assert_eq!(
            c,
            KernelConfig {
                isa_cap: Some(Tier::Avx2),
                no_pack: true,
                paired: Some(true),
                prefetch: Some(PrefetchDistances {
                    l1: 4096,
                    l2: 16384
                }),
            }
        );
        let (c, notes) =
            KernelConfig::from_vars(vars(&[("SYNAPSE_ISA", "sse9"), ("SYNAPSE_PREFETCH", "x")]));
        assert_eq!(c, KernelConfig::default());
        assert_eq!(notes.len(), 2);
        assert!(notes[0].contains("sse9") && notes[1].contains("SYNAPSE_PREFETCH"));
    }
}
