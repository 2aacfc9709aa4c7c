//! The kernel table: every product of a weight format with its activations that synapse can
//! run, with what it needs of the CPU, and [`select`], the one function that chooses among them.
//!
//! A kernel is looked up by its weight format, its summation order ([`Order`]: ggml's
//! `vec_dot`, or the order of llama.cpp's repacked gemv) and its form ([`Form`]: one row at a
//! time, a tile of rows by tokens, or rows packed at load time). The table lists each key's
//! kernels fastest first; [`select`] takes the first the CPU runs. Every kernel of one key gives
//! the same bits (the property tests check each against the reference), so the choice changes
//! only the speed.

use half::bf16;
use synapse_gguf::GgmlType;

use crate::codec::{cast_blocks_mut, check_sizes, codec, GemmFn, QuantizeFn, VecDot};
use crate::cpu::{cpu, Cpu};
use crate::error::QuantError;
use crate::kernel::Entry;
pub use crate::kernel::{DotFn, Form, Isa, Kernel, Order, PACK_GROUP_ROWS};

/// The kernels of key `(ty, order, form)` that `cpu` runs, fastest first.
pub fn candidates(
    cpu: &Cpu,
    ty: GgmlType,
    order: Order,
    form: Form,
) -> impl Iterator<Item = &'static Kernel> + '_ {
    TABLE
        .iter()
        .filter(move |k| k.ty == ty && k.order == order && k.form == form && cpu.runs(k.isa))
}

/// The kernel of key `(ty, order, form)` that `cpu` runs best, if any runs.
pub fn select(cpu: &Cpu, ty: GgmlType, order: Order, form: Form) -> Option<&'static Kernel> {
    candidates(cpu, ty, order, form).next()
}

/// The tile that runs one token faster than the row kernel, if any: Q5_0's and Q5_1's AVX2
/// tiles (their row kernels take one row at a time, the tiles four), Q2_K's and Q3_K's AVX-512
/// VNNI tiles (64 values an instruction, weights asked for ahead) (measurements:
/// docs/perf-log.md, "Which kernels the table prefers").
pub fn decode_tile(cpu: &Cpu, ty: GgmlType, order: Order) -> Option<&'static Kernel> {
    candidates(cpu, ty, order, Form::Tile).find(|k| k.decode)
}

// The entries the engine takes: the table's choices for this process's CPU ([`crate::cpu`]).

/// The dot product the kernels run for a weight type, in ggml's `vec_dot` order: the kernel
/// table's best for this CPU ([`crate::kernels`]). Every kernel does the reference's float
/// operations in the reference's order, so the results are bit-identical to it (tested); only
/// the instructions differ.
pub fn vec_dot_kernel(ty: GgmlType) -> Result<VecDot, QuantError> {
    row_kernel(cpu(), ty, Order::VecDot)
}

/// The best tier of kernels this CPU runs, for reports (`synapse bench`): `avx512vnni` (with
/// AVX2 for the formats it lacks), `avxvnni`, `avx2`, `neon+dotprod`, `neon` or `reference`.
pub fn kernel_isa() -> &'static str {
    cpu().tier_name()
}

/// The activation quantizer the kernels use for `ty` (see
/// [`crate::QuantizeBlock::quantize_act`]), chosen at run time: on x86-64 with AVX2, FMA and
/// F16C, Q8_0, Q8_1 and Q8_K written out in AVX2 (`x86::actq`); same bits either way.
pub fn act_quantizer(ty: GgmlType) -> Result<QuantizeFn, QuantError> {
    let reference = codec(ty)?.quantize_act.ok_or(QuantError::Unsupported {
        ty,
        what: "quantizer",
    })?;
    if ty == GgmlType::BF16 {
        return Ok(quantize_bf16_row);
    }
    #[cfg(target_arch = "x86_64")]
    if cpu().avx2() {
        return Ok(match ty {
            GgmlType::Q8_0 => quantize_q8_0_avx2,
            GgmlType::Q8_1 => quantize_q8_1_avx2,
            GgmlType::Q8_K => quantize_q8_k_avx2,
            GgmlType::F16 => quantize_f16_f16c,
            _ => reference,
        });
    }
    Ok(reference)
}

/// The entries of the activation quantizers written out in AVX2 (`x86::actq`).
#[cfg(target_arch = "x86_64")]
macro_rules! avx2_act_quantizers {
    ($($name:ident: $block:ty => $f:path;)*) => {$(
        fn $name(src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
            check_sizes::<$block>(src.len(), dst.len())?;
            let blocks = cast_blocks_mut::<$block>(dst)?;
            // SAFETY: `act_quantizer` hands this function out only where `Cpu::avx2` (AVX2,
            // FMA and F16C).
            unsafe { $f(src, blocks) };
            Ok(())
        }
    )*};
}

#[cfg(target_arch = "x86_64")]
avx2_act_quantizers! {
    quantize_q8_0_avx2: BlockQ8_0 => crate::x86::actq::quantize_q8_0;
    quantize_q8_1_avx2: BlockQ8_1 => crate::x86::actq::quantize_q8_1;
    quantize_q8_k_avx2: BlockQ8K => crate::x86::actq::quantize_q8_k;
}

/// F32 to BF16, a row at a time: [`crate::reference::quantize::quantize_bf16`]'s bits (round
/// to nearest even, NaNs kept quiet) in a loop the compiler vectorises, where the reference's
/// value-by-value calls through [`crate::QuantizeBlock`] took a share of a BF16 file's prefill
/// (docs/perf-log.md, "F16 and BF16 kernels").
fn quantize_bf16_row(src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    check_sizes::<bf16>(src.len(), dst.len())?;
    let y = cast_blocks_mut::<bf16>(dst)?;
    #[cfg(target_arch = "x86_64")]
    if cpu().avx2() {
        // SAFETY: AVX2 detected.
        unsafe { bf16_row_avx2(src, y) };
        return Ok(());
    }
    bf16_row(src, y);
    Ok(())
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn bf16_row_avx2(x: &[f32], y: &mut [bf16]) {
    bf16_row(x, y)
}

#[inline(always)]
fn bf16_row(x: &[f32], y: &mut [bf16]) {
    for (x, y) in x.iter().zip(y) {
        *y = crate::reference::quantize::f32_to_bf16(*x);
    }
}

/// F32 to F16 with F16C (`vcvtps2ph`, round to nearest even): the reference's bits.
#[cfg(target_arch = "x86_64")]
fn quantize_f16_f16c(src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    check_sizes::<half::f16>(src.len(), dst.len())?;
    let y = cast_blocks_mut::<half::f16>(dst)?;
    // SAFETY: `act_quantizer` hands this function out only after detecting AVX2, FMA and F16C.
    unsafe { crate::x86::f16::quantize_f16(src, y) };
    Ok(())
}

/// The kernel for a weight matrix: [`vec_dot_kernel`], or, for a matrix llama.cpp repacks
/// ([`crate::llama_cpp_repacks`]), the dot product in the order of llama.cpp's repacked gemv.
pub fn matrix_kernel(ty: GgmlType, repacked: bool) -> Result<VecDot, QuantError> {
    row_kernel(cpu(), ty, Order::of(ty, repacked))
}

/// The tiled kernel ([`GemmFn`]) for a weight matrix of type `ty` (`repacked` as for
/// [`matrix_kernel`]): the table's best; `None` means: run
/// [`VecDot::gemv`] per token.
pub fn gemm_kernel(ty: GgmlType, repacked: bool) -> Option<GemmFn> {
    let order = Order::of(ty, repacked);
    select(cpu(), ty, order, Form::Tile).and_then(|k| k.tile())
}

/// The tile to run one token with where it beats [`VecDot::gemv`] ([`decode_tile`]).
pub fn decode_tile_kernel(ty: GgmlType, repacked: bool) -> Option<GemmFn> {
    decode_tile(cpu(), ty, Order::of(ty, repacked)).and_then(|k| k.tile())
}

/// Every tiled kernel this CPU can run for a weight matrix, fastest first, with the name of its
/// instruction set: all give the same bits (tested), so this is for tests and benchmarks.
pub fn gemm_kernels(ty: GgmlType, repacked: bool) -> Vec<(&'static str, GemmFn)> {
    let order = Order::of(ty, repacked);
    candidates(cpu(), ty, order, Form::Tile)
        .filter_map(|k| Some((k.isa().name(), k.tile()?)))
        .collect()
}

/// Every row of the table, in order (for `synapse info --kernels` and the tests).
pub fn table() -> &'static [Kernel] {
    TABLE
}

/// A row kernel with its two entries.
macro_rules! row {
    ($ty:ident, $order:ident, $isa:ident, $f:expr, $gemv:expr) => {
        Kernel {
            ty: GgmlType::$ty,
            order: Order::$order,
            form: Form::Row,
            isa: Isa::$isa,
            decode: false,
            entry: Entry::Row($f, $gemv),
        }
    };
}

/// A tile; `decode` marks the tiles [`decode_tile`] takes.
macro_rules! tile {
    ($ty:ident, $order:ident, $isa:ident, $g:expr) => {
        tile!($ty, $order, $isa, $g, false)
    };
    ($ty:ident, $order:ident, $isa:ident, $g:expr, decode) => {
        tile!($ty, $order, $isa, $g, true)
    };
    ($ty:ident, $order:ident, $isa:ident, $g:expr, $decode:expr) => {
        Kernel {
            ty: GgmlType::$ty,
            order: Order::$order,
            form: Form::Tile,
            isa: Isa::$isa,
            decode: $decode,
            entry: Entry::Tile($g),
        }
    };
}

/// The reference row kernels of a format, in its `vec_dot` order.
macro_rules! reference {
    ($($ty:ident: $block:ty;)*) => {[$(
        row!(
            $ty,
            VecDot,
            Reference,
            crate::codec::vec_dot_erased::<$block>,
            crate::codec::gemv_erased::<$block>
        ),
    )*]};
}

use crate::blocks::*;

#[cfg(target_arch = "x86_64")]
static TABLE: &[Kernel] = &{
    use crate::x86::avx2::tile as t2;
    use crate::x86::avx512::{ktile as k512, nl as nl512, tile as t512};
    use crate::x86::rows as x;
    use crate::x86::{bf16, f16};
    use half::f16 as F16;
    const ACCELERATED: [Kernel; 75] = [
        // Rows, `vec_dot` order.
        row!(BF16, VecDot, Avx512Bf16, x::bf16_512, x::bf16_512_gemv),
        row!(F16, VecDot, Avx512, x::f16_512, x::f16_512_gemv),
        row!(F32, VecDot, Avx512, x::f32_512, x::f32_512_gemv),
        row!(Q4_0, VecDot, Avx512Vnni, x::q4_0_512, x::q4_0_512_gemv),
        row!(Q4_1, VecDot, Avx512Vnni, x::q4_1_512, x::q4_1_512_gemv),
        row!(Q8_0, VecDot, Avx512Vnni, x::q8_0_512, x::q8_0_512_gemv),
        row!(Q6_K, VecDot, Avx512Vnni, x::q6_k_512, x::q6_k_512_gemv),
        row!(Q4_0, VecDot, AvxVnni, x::q4_0_vnni, x::q4_0_vnni_gemv),
        row!(Q4_1, VecDot, AvxVnni, x::q4_1_vnni, x::q4_1_vnni_gemv),
        row!(Q8_0, VecDot, AvxVnni, x::q8_0_vnni, x::q8_0_vnni_gemv),
        row!(Q4_0, VecDot, AvxVnniEvex, x::q4_0_512, x::q4_0_512_gemv),
        row!(Q4_1, VecDot, AvxVnniEvex, x::q4_1_512, x::q4_1_512_gemv),
        row!(Q8_0, VecDot, AvxVnniEvex, x::q8_0_512, x::q8_0_512_gemv),
        row!(F32, VecDot, Avx2, x::f32_avx2, x::f32_avx2_gemv),
        row!(F16, VecDot, Avx2, x::f16_avx2, x::f16_avx2_gemv),
        row!(BF16, VecDot, Avx2, x::bf16_avx2, bf16::gemv_avx2),
        row!(Q4_0, VecDot, Avx2, x::q4_0, x::q4_0_gemv),
        row!(Q4_1, VecDot, Avx2, x::q4_1, x::q4_1_gemv),
        row!(Q5_0, VecDot, Avx2, x::q5_0, x::q5_0_gemv),
        row!(Q5_1, VecDot, Avx2, x::q5_1, x::q5_1_gemv),
        row!(Q8_0, VecDot, Avx2, x::q8_0, x::q8_0_gemv),
        row!(Q2_K, VecDot, Avx2, x::q2_k, x::q2_k_gemv),
        row!(Q3_K, VecDot, Avx2, x::q3_k, x::q3_k_gemv),
        row!(Q4_K, VecDot, Avx2, x::q4_k, x::q4_k_gemv),
        row!(Q5_K, VecDot, Avx2, x::q5_k, x::q5_k_gemv),
        row!(Q6_K, VecDot, Avx2, x::q6_k, x::q6_k_gemv),
        row!(IQ4_NL, VecDot, Avx2, x::iq4_nl, x::iq4_nl_gemv),
        row!(IQ4_XS, VecDot, Avx2, x::iq4_xs, x::iq4_xs_gemv),
        row!(MXFP4, VecDot, Avx2, x::mxfp4, x::mxfp4_gemv),
        // Rows, llama.cpp's repacked order.
        row!(
            Q4_0,
            Rows8,
            Avx512Vnni,
            x::q4_0_rows8_512,
            x::q4_0_rows8_512_gemv
        ),
        row!(
            Q4_0,
            Rows8,
            AvxVnni,
            x::q4_0_rows8_vnni,
            x::q4_0_rows8_vnni_gemv
        ),
        row!(
            Q4_0,
            Rows8,
            AvxVnniEvex,
            x::q4_0_rows8_512,
            x::q4_0_rows8_512_gemv
        ),
        row!(Q4_0, Rows8, Avx2, x::q4_0_rows8, x::q4_0_rows8_gemv),
        row!(IQ4_NL, Rows8, Avx2, x::iq4_nl_rows8, x::iq4_nl_rows8_gemv),
        row!(MXFP4, Rows8, Avx2, x::mxfp4_rows8, x::mxfp4_rows8_gemv),
        row!(Q4_K, Rows8, Avx2, x::q4_k_rows8, x::q4_k_rows8_gemv),
        row!(Q2_K, Rows8, Avx2, x::q2_k_rows8, x::q2_k_rows8_gemv),
        // Tiles.
        tile!(Q4_0, VecDot, Avx512Vnni, t512::q4_0),
        tile!(Q4_0, Rows8, Avx512Vnni, nl512::q4_0_rows8),
        tile!(Q4_1, VecDot, Avx512Vnni, t512::q4_1),
        tile!(Q5_0, VecDot, Avx512Vnni, t512::q5_0),
        tile!(Q5_1, VecDot, Avx512Vnni, t512::q5_1),
        tile!(Q8_0, VecDot, Avx512Vnni, t512::q8_0),
        tile!(Q4_K, VecDot, Avx512Vnni, k512::q4_k),
        tile!(Q4_K, Rows8, Avx512Vnni, k512::q4_k_rows8),
        tile!(Q6_K, VecDot, Avx512Vnni, k512::q6_k),
        tile!(Q5_K, VecDot, Avx512Vnni, k512::q5_k),
        tile!(Q3_K, VecDot, Avx512Vnni, k512::q3_k, decode),
        tile!(Q2_K, VecDot, Avx512Vnni, k512::q2_k, decode),
        tile!(Q2_K, Rows8, Avx512Vnni, k512::q2_k_rows8, decode),
        tile!(IQ4_XS, VecDot, Avx512Vnni, k512::iq4_xs),
        tile!(IQ4_NL, Rows8, Avx512Vnni, nl512::iq4_nl_rows8),
        tile!(MXFP4, Rows8, Avx512Vnni, nl512::mxfp4_rows8),
        tile!(BF16, VecDot, Avx512Bf16, bf16::gemm_bf16),
        tile!(F16, VecDot, Avx512, f16::gemm_512::<F16>),
        tile!(F32, VecDot, Avx512, f16::gemm_512::<f32>),
        tile!(Q4_0, VecDot, Avx2, t2::q4_0),
        tile!(Q4_0, Rows8, Avx2, t2::q4_0_rows8),
        tile!(Q4_1, VecDot, Avx2, t2::q4_1),
        tile!(Q5_0, VecDot, Avx2, t2::q5_0, decode),
        tile!(Q5_1, VecDot, Avx2, t2::q5_1, decode),
        tile!(Q8_0, VecDot, Avx2, t2::q8_0),
        tile!(Q4_K, VecDot, Avx2, t2::q4_k),
        tile!(Q4_K, Rows8, Avx2, t2::q4_k_rows8),
        tile!(Q6_K, VecDot, Avx2, t2::q6_k),
        tile!(Q2_K, VecDot, Avx2, t2::q2_k),
        tile!(Q2_K, Rows8, Avx2, t2::q2_k_rows8),
        tile!(Q3_K, VecDot, Avx2, t2::q3_k),
        tile!(Q5_K, VecDot, Avx2, t2::q5_k),
        tile!(IQ4_XS, VecDot, Avx2, t2::iq4_xs),
        tile!(IQ4_NL, VecDot, Avx2, t2::iq4_nl),
        tile!(IQ4_NL, Rows8, Avx2, t2::iq4_nl_rows8),
        tile!(F16, VecDot, Avx2, f16::gemm_avx2::<F16>),
        tile!(BF16, VecDot, Avx2, bf16::gemm_avx2),
        tile!(F32, VecDot, Avx2, f16::gemm_avx2::<f32>),
    ];
    concat::<105, 21, 126>(concat::<75, 30, 105>(ACCELERATED, PACKED), REFERENCE)
};

/// A packed format.
#[cfg(target_arch = "x86_64")]
macro_rules! packed {
    ($ty:ident, $order:ident, $isa:ident, $format:expr) => {
        Kernel {
            ty: GgmlType::$ty,
            order: Order::$order,
            form: Form::Packed,
            isa: Isa::$isa,
            decode: false,
            entry: Entry::Packed(&$format),
        }
    };
}

/// The packed formats (`crate::packed`): the AVX-512 VNNI kernels, then the AVX2 ones on the
/// same layout. The AVX2 rows of Q4_K and Q3_K run their batch passes in 256-bit `vpdpbusd`
/// where the CPU has the AVX-VNNI tier (`Cpu::vnni256`), inside the one entry. Q8_0 is packed
/// on AVX2 since its passes caught up (docs/perf-log.md, "Which kernels the table prefers").
#[cfg(target_arch = "x86_64")]
const PACKED: [Kernel; 30] = {
    use crate::x86::avx2::packed as p2;
    use crate::x86::avx512::packed as p512;
    [
        packed!(Q4_K, Rows8, Avx512Vnni, p512::Q4_K_ROWS8),
        packed!(Q2_K, Rows8, Avx512Vnni, p512::Q2_K_ROWS8),
        packed!(Q3_K, VecDot, Avx512Vnni, p512::Q3_K),
        packed!(IQ4_XS, VecDot, Avx512Vnni, p512::IQ4_XS),
        packed!(Q5_K, VecDot, Avx512Vnni, p512::Q5_K),
        packed!(Q6_K, VecDot, Avx512Vnni, p512::Q6_K),
        packed!(Q8_0, VecDot, Avx512Vnni, p512::Q8_0),
        packed!(Q5_0, VecDot, Avx512Vnni, p512::Q5_0),
        packed!(Q4_0, VecDot, Avx512Vnni, p512::Q4_0),
        packed!(Q4_0, Rows8, Avx512Vnni, p512::Q4_0_ROWS8),
        packed!(IQ4_NL, Rows8, Avx512Vnni, p512::IQ4_NL_ROWS8),
        packed!(MXFP4, Rows8, Avx512Vnni, p512::MXFP4_ROWS8),
        packed!(Q4_1, VecDot, Avx512Vnni, p512::Q4_1),
        packed!(Q5_1, VecDot, Avx512Vnni, p512::Q5_1),
        packed!(F16, VecDot, Avx512Vnni, p512::F16_PACKED),
        packed!(BF16, VecDot, Avx512Bf16, p512::BF16_PACKED),
        packed!(Q4_K, Rows8, Avx2, p2::Q4_K_ROWS8),
        packed!(Q2_K, Rows8, Avx2, p2::Q2_K_ROWS8),
        packed!(Q3_K, VecDot, Avx2, p2::Q3_K),
        packed!(Q5_K, VecDot, Avx2, p2::Q5_K),
        packed!(Q6_K, VecDot, Avx2, p2::Q6_K),
        packed!(IQ4_XS, VecDot, Avx2, p2::IQ4_XS),
        packed!(Q5_0, VecDot, Avx2, p2::Q5_0),
        packed!(Q4_0, VecDot, Avx2, p2::Q4_0),
        packed!(Q4_0, Rows8, Avx2, p2::Q4_0_ROWS8),
        packed!(IQ4_NL, Rows8, Avx2, p2::IQ4_NL_ROWS8),
        packed!(MXFP4, Rows8, Avx2, p2::MXFP4_ROWS8),
        packed!(Q4_1, VecDot, Avx2, p2::Q4_1),
        packed!(Q5_1, VecDot, Avx2, p2::Q5_1),
        packed!(Q8_0, VecDot, Avx2, p2::Q8_0),
    ]
};

/// The reference's rows in both orders, last: they run everywhere.
const REFERENCE: [Kernel; 21] = {
    use crate::codec::rows8;
    let vec_dot = reference! {
        F32: f32; F16: half::f16; BF16: half::bf16;
        Q4_0: BlockQ4_0; Q4_1: BlockQ4_1; Q5_0: BlockQ5_0; Q5_1: BlockQ5_1; Q8_0: BlockQ8_0;
        Q2_K: BlockQ2K; Q3_K: BlockQ3K; Q4_K: BlockQ4K; Q5_K: BlockQ5K; Q6_K: BlockQ6K;
        IQ4_NL: BlockIQ4NL; IQ4_XS: BlockIQ4XS; MXFP4: BlockMXFP4;
    };
    let rows8 = [
        row!(Q4_0, Rows8, Reference, rows8::q4_0, rows8::q4_0_gemv),
        row!(IQ4_NL, Rows8, Reference, rows8::iq4_nl, rows8::iq4_nl_gemv),
        row!(MXFP4, Rows8, Reference, rows8::mxfp4, rows8::mxfp4_gemv),
        row!(Q4_K, Rows8, Reference, rows8::q4_k, rows8::q4_k_gemv),
        row!(Q2_K, Rows8, Reference, rows8::q2_k, rows8::q2_k_gemv),
    ];
    concat::<16, 5, 21>(vec_dot, rows8)
};

/// `a` then `b`, as one array (the table is built in pieces, by instruction set).
const fn concat<const A: usize, const B: usize, const N: usize>(
    a: [Kernel; A],
    b: [Kernel; B],
) -> [Kernel; N] {
    assert!(A + B == N);
    let mut out = [a[0]; N];
    let mut i = 0;
    while i < A {
        out[i] = a[i];
        i += 1;
    }
    while i < N {
        out[i] = b[i - A];
        i += 1;
    }
    out
}

/// The NEON kernels of a format in one order: FEAT_DotProd's first, then the widening form's.
#[cfg(target_arch = "aarch64")]
macro_rules! neon {
    ($($ty:ident, $order:ident: $f:ident, $gemv:ident, $gemm:ident;)*) => {[$(
        row!($ty, $order, NeonDotProd, a::$f::<DotProd>, a::$gemv::<DotProd>),
        row!($ty, $order, Neon, a::$f::<Widen>, a::$gemv::<Widen>),
        tile!($ty, $order, NeonDotProd, a::$gemm::<DotProd>),
        tile!($ty, $order, Neon, a::$gemm::<Widen>),
    )*]};
}

#[cfg(target_arch = "aarch64")]
static TABLE: &[Kernel] = &{
    use crate::aarch64::{self as a, DotProd, Widen};
    const NEON: [Kernel; 72] = neon! {
        Q4_0, VecDot: q4_0, q4_0_gemv, q4_0_gemm;
        Q4_1, VecDot: q4_1, q4_1_gemv, q4_1_gemm;
        Q5_0, VecDot: q5_0, q5_0_gemv, q5_0_gemm;
        Q5_1, VecDot: q5_1, q5_1_gemv, q5_1_gemm;
        Q8_0, VecDot: q8_0, q8_0_gemv, q8_0_gemm;
        IQ4_NL, VecDot: iq4_nl, iq4_nl_gemv, iq4_nl_gemm;
        Q2_K, VecDot: q2_k, q2_k_gemv, q2_k_gemm;
        Q3_K, VecDot: q3_k, q3_k_gemv, q3_k_gemm;
        Q4_K, VecDot: q4_k, q4_k_gemv, q4_k_gemm;
        Q5_K, VecDot: q5_k, q5_k_gemv, q5_k_gemm;
        Q6_K, VecDot: q6_k, q6_k_gemv, q6_k_gemm;
        IQ4_XS, VecDot: iq4_xs, iq4_xs_gemv, iq4_xs_gemm;
        Q4_0, Rows8: q4_0_rows8, q4_0_rows8_gemv, q4_0_rows8_gemm;
        IQ4_NL, Rows8: iq4_nl_rows8, iq4_nl_rows8_gemv, iq4_nl_rows8_gemm;
        MXFP4, VecDot: mxfp4, mxfp4_gemv, mxfp4_gemm;
        MXFP4, Rows8: mxfp4_rows8, mxfp4_rows8_gemv, mxfp4_rows8_gemm;
        Q4_K, Rows8: q4_k_rows8, q4_k_rows8_gemv, q4_k_rows8_gemm;
        Q2_K, Rows8: q2_k_rows8, q2_k_rows8_gemv, q2_k_rows8_gemm;
    };
    const BF16: [Kernel; 2] = [
        row!(BF16, VecDot, Neon, a::bf16_dot, a::bf16_gemv),
        tile!(BF16, VecDot, Neon, a::bf16::gemm_bf16),
    ];
    concat::<74, 21, 95>(concat::<72, 2, 74>(NEON, BF16), REFERENCE)
};

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
static TABLE: &[Kernel] = &REFERENCE;

/// What runs for one weight matrix on a CPU: the kernels the engine takes for it, chosen once
/// when the model is loaded.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    pub ty: GgmlType,
    /// The summation order: llama.cpp's repacked one for the matrices it repacks.
    pub order: Order,
    /// The row kernel (the reference's where no other runs); `None` for a type without a dot
    /// product.
    pub row: Option<&'static Kernel>,
    /// The tile for batches, in the file's layout.
    pub tile: Option<&'static Kernel>,
    /// The tile that runs one token faster than [`Plan::row`], if any.
    pub decode_tile: Option<&'static Kernel>,
    /// The packed kernel, where the matrix is packed: its whole groups of sixteen rows run on
    /// it for every batch size.
    pub packed: Option<&'static Kernel>,
    /// Rows packed (a multiple of [`crate::kernel::PACK_GROUP_ROWS`]); the rest run on the other
    /// kernels.
    pub packed_rows: usize,
}

/// The kernels of a weight matrix of type `ty` with `rows` rows on `cpu` (`pack`: whether the
/// matrix is to be packed, where a packed kernel runs).
pub fn plan(cpu: &Cpu, ty: GgmlType, rows: usize, pack: bool) -> Plan {
    let order = Order::of(ty, crate::llama_cpp_repacks(ty, rows));
    let packed = select(cpu, ty, order, Form::Packed).filter(|_| pack);
    let group = crate::kernel::PACK_GROUP_ROWS;
    Plan {
        ty,
        order,
        row: select(cpu, ty, order, Form::Row),
        tile: select(cpu, ty, order, Form::Tile),
        decode_tile: decode_tile(cpu, ty, order),
        packed_rows: packed.map_or(0, |_| rows / group * group),
        packed: packed.filter(|_| rows >= group),
    }
}

impl Plan {
    /// The kernels one token's product runs, with why: `(kernel, rows it takes, reason)`.
    pub fn decode(&self, rows: usize) -> Vec<(&'static Kernel, usize, &'static str)> {
        let rest = (self
            .decode_tile
            .map(|t| (t, "tile beats the row kernel at one token")))
        .or_else(|| self.row.map(|r| (r, row_reason(r))));
        self.split(rows, rest)
    }

    /// The kernels a batch's product runs, with why, as [`Plan::decode`].
    pub fn batch(&self, rows: usize) -> Vec<(&'static Kernel, usize, &'static str)> {
        let rest = (self
            .tile
            .map(|t| (t, "tile: weights unpacked once for several tokens")))
        .or_else(|| {
            self.row
                .map(|r| (r, "no tile: the row kernel, token by token"))
        });
        self.split(rows, rest)
    }

    /// The packed rows on the packed kernel, the rest on `rest`.
    fn split(
        &self,
        rows: usize,
        rest: Option<(&'static Kernel, &'static str)>,
    ) -> Vec<(&'static Kernel, usize, &'static str)> {
        let packed = self.packed.map(|p| (p, self.packed_rows, "packed at load"));
        let left = rows - self.packed_rows;
        let rest = rest.filter(|_| left > 0).map(|(k, why)| (k, left, why));
        packed.into_iter().chain(rest).collect()
    }
}

fn row_reason(k: &Kernel) -> &'static str {
    if k.isa == Isa::Reference {
        "no faster kernel for this format on this CPU (or under its tier cap)"
    } else {
        "row kernel"
    }
}

/// The row kernel of a matrix: the table's best for its key, the reference where none other
/// runs.
pub(crate) fn row_kernel(cpu: &Cpu, ty: GgmlType, order: Order) -> Result<VecDot, QuantError> {
    let reference = crate::codec::codec(ty)?
        .vec_dot
        .ok_or(QuantError::Unsupported {
            ty,
            what: "dot product",
        })?;
    Ok(
        match select(cpu, ty, order, Form::Row).and_then(Kernel::row) {
            Some((f, gemv)) => VecDot {
                f,
                gemv,
                ..reference
            },
            None => reference,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::{check, reference, reference_rows8, Case};

    /// Every quantized format's row kernels of every tier this CPU has (capped or not) against
    /// the reference in their order, bit for bit, on random blocks, odd block and row counts.
    /// (The property tests check the kernel the dispatch picks; that hides the lower tiers.)
    #[test]
    fn every_row_kernel_this_cpu_runs_is_the_reference() {
        let cpu = Cpu::detect();
        let (mut cases, mut not_run): (Vec<Case>, Vec<String>) = (Vec::new(), Vec::new());
        for k in table()
            .iter()
            .filter(|k| k.form == Form::Row && k.isa != Isa::Reference)
        {
            let float = matches!(k.ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16);
            if float {
                continue; // x86/tests.rs and the BF16 tests: lengths in values, not blocks
            }
            if !cpu.runs(k.isa) {
                not_run.push(k.name());
                continue;
            }
            let (f, g) = k.row().unwrap();
            let reference = match k.order {
                Order::VecDot => reference(k.ty),
                Order::Rows8 => reference_rows8(k.ty),
            };
            cases.push((k.ty, f, g, reference));
        }
        if !not_run.is_empty() {
            eprintln!("this CPU cannot run: {}", not_run.join(", "));
        }
        assert!(
            !cases.is_empty()
                || cfg!(not(any(target_arch = "x86_64", target_arch = "aarch64")))
                || !cpu.avx2()
        );
        for seed in 0..20 {
            check(seed, &cases);
        }
    }

    /// What the table chooses on CPUs other than this one (made up, never run): the kernels
    /// the dispatch chose before the table, for each tier.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_table_chooses_each_tiers_kernels() {
        use crate::Tier;
        use GgmlType as T;
        let sapphire = "v3,avx512f,avx512int,avx512bf16,avx512fp16,avxvnni";
        // CPU features, tier cap, key, the kernel chosen.
        type Case<'a> = (&'a str, Option<Tier>, T, Order, Form, Option<&'a str>);
        let cases: &[Case] = &[
            (
                "",
                None,
                T::Q4_K,
                Order::VecDot,
                Form::Row,
                Some("q4_k.row.reference"),
            ),
            ("", None, T::Q4_0, Order::VecDot, Form::Tile, None),
            (
                "v3",
                None,
                T::Q4_0,
                Order::VecDot,
                Form::Row,
                Some("q4_0.row.avx2"),
            ),
            (
                "v3",
                None,
                T::Q4_K,
                Order::Rows8,
                Form::Packed,
                Some("q4_k.rows8.packed.avx2"),
            ),
            ("v3", None, T::Q4_K, Order::VecDot, Form::Packed, None),
            ("v3", None, T::BF16, Order::VecDot, Form::Packed, None),
            (
                "v3,avxvnni",
                None,
                T::Q4_0,
                Order::Rows8,
                Form::Row,
                Some("q4_0.rows8.row.avxvnni"),
            ),
            (
                "v3,avxvnni",
                None,
                T::Q4_1,
                Order::VecDot,
                Form::Tile,
                Some("q4_1.tile.avx2"),
            ),
            // An AVX-512 CPU without AVX-VNNI capped at that tier: the EVEX form.
            (
                "v3,avx512f,avx512int",
                Some(Tier::AvxVnni),
                T::Q8_0,
                Order::VecDot,
                Form::Row,
                Some("q8_0.row.avxvnni-evex"),
            ),
            // With both encodings, the VEX one.
            (
                sapphire,
                Some(Tier::AvxVnni),
                T::Q4_0,
                Order::VecDot,
                Form::Row,
                Some("q4_0.row.avxvnni"),
            ),
            (
                sapphire,
                Some(Tier::AvxVnni),
                T::Q4_K,
                Order::Rows8,
                Form::Packed,
                Some("q4_k.rows8.packed.avx2"),
            ),
            (
                sapphire,
                None,
                T::Q4_0,
                Order::VecDot,
                Form::Row,
                Some("q4_0.row.avx512vnni"),
            ),
            (
                sapphire,
                None,
                T::Q4_K,
                Order::Rows8,
                Form::Row,
                Some("q4_k.rows8.row.avx2"),
            ),
            (
                sapphire,
                None,
                T::BF16,
                Order::VecDot,
                Form::Row,
                Some("bf16.row.avx512bf16"),
            ),
            (
                sapphire,
                None,
                T::BF16,
                Order::VecDot,
                Form::Packed,
                Some("bf16.packed.avx512bf16"),
            ),
            (
                sapphire,
                None,
                T::F16,
                Order::VecDot,
                Form::Packed,
                Some("f16.packed.avx512vnni"),
            ),
            (
                sapphire,
                None,
                T::F32,
                Order::VecDot,
                Form::Tile,
                Some("f32.tile.avx512"),
            ),
            (
                sapphire,
                None,
                T::IQ4_NL,
                Order::VecDot,
                Form::Tile,
                Some("iq4_nl.tile.avx2"),
            ),
            (
                sapphire,
                None,
                T::IQ4_NL,
                Order::Rows8,
                Form::Tile,
                Some("iq4_nl.rows8.tile.avx512vnni"),
            ),
            (
                sapphire,
                None,
                T::Q6_K,
                Order::VecDot,
                Form::Packed,
                Some("q6_k.packed.avx512vnni"),
            ),
            // AVX-512 VNNI without BF16 (Ice Lake): BF16 on the AVX2 tier, not packed.
            (
                "v3,avx512f,avx512int",
                None,
                T::BF16,
                Order::VecDot,
                Form::Row,
                Some("bf16.row.avx2"),
            ),
            (
                "v3,avx512f,avx512int",
                None,
                T::BF16,
                Order::VecDot,
                Form::Packed,
                None,
            ),
            (
                "v3,avx512f,avx512int",
                None,
                T::BF16,
                Order::VecDot,
                Form::Tile,
                Some("bf16.tile.avx2"),
            ),
        ];
        for &(features, cap, ty, order, form, want) in cases {
            let cpu = Cpu::made_up(features, None).capped(cap);
            let got = select(&cpu, ty, order, form).map(Kernel::name);
            assert_eq!(
                got.as_deref(),
                want,
                "{features:?} capped at {cap:?}: {ty} {order:?} {form:?}"
            );
        }
        // The tiles that run one token: Q5_0's and Q5_1's AVX2 tiles, Q2_K's and Q3_K's
        // AVX-512 ones.
        let spr = Cpu::made_up(sapphire, None);
        let decode = |ty, order| decode_tile(&spr, ty, order).map(Kernel::name);
        assert_eq!(
            decode(T::Q5_0, Order::VecDot).as_deref(),
            Some("q5_0.tile.avx2")
        );
        assert_eq!(
            decode(T::Q2_K, Order::Rows8).as_deref(),
            Some("q2_k.rows8.tile.avx512vnni")
        );
        assert_eq!(
            decode(T::Q3_K, Order::VecDot).as_deref(),
            Some("q3_k.tile.avx512vnni")
        );
        assert_eq!(decode(T::Q4_K, Order::Rows8), None);
        let avx2 = Cpu::made_up("v3", None);
        assert_eq!(
            decode_tile(&avx2, T::Q2_K, Order::VecDot).map(Kernel::name),
            None
        );
    }

    /// A capped CPU selects only from the tiers its cap allows.
    #[test]
    fn a_capped_cpu_selects_within_its_cap() {
        let full = Cpu::detect();
        for cap in crate::Tier::ALL {
            let cpu = full.capped(Some(cap));
            for k in table() {
                if let Some(chosen) = select(&cpu, k.ty, k.order, k.form) {
                    assert!(
                        rank(chosen.isa) <= cap as usize,
                        "{} under {cap:?}",
                        chosen.name()
                    );
                }
            }
        }
        // The x86 tiers in `Tier`'s order; NEON is not capped.
        fn rank(isa: Isa) -> usize {
            match isa {
                Isa::Reference | Isa::Neon | Isa::NeonDotProd => 0,
                Isa::Avx2 => 1,
                Isa::AvxVnni | Isa::AvxVnniEvex => 2,
                Isa::Avx512 | Isa::Avx512Vnni | Isa::Avx512Bf16 => 3,
            }
        }
    }

    /// One name per row of the table.
    #[test]
    fn names_are_unique() {
        let mut names: Vec<String> = table().iter().map(Kernel::name).collect();
        names.sort();
        let n = names.len();
        names.dedup();
        assert_eq!(names.len(), n);
    }
}
