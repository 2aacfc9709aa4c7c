//! The vocabulary of the kernel table ([`crate::kernels`]): a kernel's key (format, [`Order`],
//! [`Form`]), what it needs of the CPU ([`Isa`]), and its entry points.

use synapse_gguf::GgmlType;

use crate::codec::{GemmFn, GemvFn};
use crate::cpu::{Cpu, Vnni256};
use crate::error::QuantError;

/// A type-erased single-row dot product ([`crate::VecDot::f`]).
pub type DotFn = fn(&[u8], &[u8]) -> Result<f32, QuantError>;

/// Rows per packed group: a packed matrix is multiplied in whole groups, so a caller that
/// splits one over threads gives each a multiple of this many rows.
pub const PACK_GROUP_ROWS: usize = 16;

/// The order a product sums a row's blocks in.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Order {
    /// ggml's `vec_dot` for the format (the reference's order).
    VecDot,
    /// The order of llama.cpp's repacked gemv, for the matrices it repacks
    /// ([`crate::llama_cpp_repacks`]).
    Rows8,
}

impl Order {
    /// The order of a matrix of type `ty` that llama.cpp repacks (`repacked`) or not: only the
    /// formats it repacks have a second order.
    pub fn of(ty: GgmlType, repacked: bool) -> Order {
        if repacked && crate::codec::llama_cpp_repacks(ty, 8) {
            Order::Rows8
        } else {
            Order::VecDot
        }
    }
}

/// How a kernel reads the weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Form {
    /// Weight rows one (or a few) at a time, with one token ([`crate::VecDot`]).
    Row,
    /// A tile of weight rows by tokens, in the file's layout ([`crate::GemmFn`]).
    Tile,
    /// Rows packed at load time, sixteen as one ([`crate::PackedMatrix`]).
    Packed,
}

/// What a kernel needs of the CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// Plain Rust.
    Reference,
    /// AVX2, FMA and F16C.
    Avx2,
    /// The 256-bit `vpdpbusd` in AVX-VNNI's VEX encoding.
    AvxVnni,
    /// The same instruction in AVX-512 VNNI's EVEX encoding, on CPUs with AVX-512 and no
    /// AVX-VNNI ([`Vnni256::Evex`]).
    AvxVnniEvex,
    /// AVX-512 F.
    Avx512,
    /// AVX-512 F, BW, DQ, VL and VNNI.
    Avx512Vnni,
    /// AVX512-BF16.
    Avx512Bf16,
    /// NEON, aarch64's baseline.
    Neon,
    /// NEON with FEAT_DotProd's `sdot`.
    NeonDotProd,
}

impl Isa {
    /// The name reports and tests use.
    pub fn name(self) -> &'static str {
        match self {
            Isa::Reference => "reference",
            Isa::Avx2 => "avx2",
            Isa::AvxVnni => "avxvnni",
            Isa::AvxVnniEvex => "avxvnni-evex",
            Isa::Avx512 => "avx512",
            Isa::Avx512Vnni => "avx512vnni",
            Isa::Avx512Bf16 => "avx512bf16",
            Isa::Neon => "neon",
            Isa::NeonDotProd => "neon+dotprod",
        }
    }
}

impl Cpu {
    /// Whether this CPU runs kernels that need `isa`.
    pub fn runs(&self, isa: Isa) -> bool {
        match isa {
            Isa::Reference => true,
            Isa::Avx2 => self.avx2(),
            Isa::AvxVnni => self.vnni256() == Some(Vnni256::Vex),
            Isa::AvxVnniEvex => self.vnni256() == Some(Vnni256::Evex),
            Isa::Avx512 => self.avx512f(),
            Isa::Avx512Vnni => self.avx512_vnni(),
            Isa::Avx512Bf16 => self.avx512_bf16(),
            Isa::Neon => cfg!(target_arch = "aarch64"),
            Isa::NeonDotProd => cfg!(target_arch = "aarch64") && self.dotprod(),
        }
    }
}

/// A kernel's entry points.
#[derive(Clone, Copy)]
pub(crate) enum Entry {
    Row(DotFn, GemvFn),
    Tile(GemmFn),
    #[cfg(target_arch = "x86_64")]
    Packed(&'static crate::packed::layout::PackedFormat),
}

/// One row of the table.
#[derive(Clone, Copy)]
pub struct Kernel {
    pub(crate) ty: GgmlType,
    pub(crate) order: Order,
    pub(crate) form: Form,
    pub(crate) isa: Isa,
    /// For a tile: whether it also beats the row kernel at one token
    /// ([`crate::kernels::decode_tile`]).
    pub(crate) decode: bool,
    pub(crate) entry: Entry,
}

impl std::fmt::Debug for Kernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl Kernel {
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    pub fn order(&self) -> Order {
        self.order
    }

    pub fn form(&self) -> Form {
        self.form
    }

    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The kernel's full name, one per row of the table: format, order, form and instruction
    /// set, such as `q4_k.rows8.packed.avx512vnni`.
    pub fn name(&self) -> String {
        let order = match self.order {
            Order::VecDot => "",
            Order::Rows8 => ".rows8",
        };
        let form = match self.form {
            Form::Row => "row",
            Form::Tile => "tile",
            Form::Packed => "packed",
        };
        format!(
            "{}{order}.{form}.{}",
            self.ty.to_string().to_lowercase(),
            self.isa.name()
        )
    }

    /// The row kernel's entries, for a [`Form::Row`] kernel.
    pub(crate) fn row(&self) -> Option<(DotFn, GemvFn)> {
        match self.entry {
            Entry::Row(f, gemv) => Some((f, gemv)),
            _ => None,
        }
    }

    /// The packed format, for a [`Form::Packed`] kernel.
    #[cfg(target_arch = "x86_64")]
    pub(crate) fn packed(&self) -> Option<&'static crate::packed::layout::PackedFormat> {
        match self.entry {
            Entry::Packed(p) => Some(p),
            _ => None,
        }
    }

    /// The tile's entry, for a [`Form::Tile`] kernel.
    pub(crate) fn tile(&self) -> Option<GemmFn> {
        match self.entry {
            Entry::Tile(g) => Some(g),
            _ => None,
        }
    }
}
