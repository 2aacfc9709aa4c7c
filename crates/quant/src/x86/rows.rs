//! The type-erased entries of the x86 row kernels (one token, rows one or a few at a time), as
//! the kernel table ([`crate::kernels`]) lists them. Each is handed out only where the CPU runs
//! its tier, which is what makes the `unsafe` calls inside sound.

use crate::blocks::*;
use crate::codec::{cast_blocks, dot_row, gemv_rows_with, Block, DotBlock};
use crate::QuantError;

use crate::x86::prefetch::is_amd;
use crate::x86::{avx2, avx512, avxvnni, bf16, f16};

macro_rules! avx2_entry {
    ($( $name:ident, $gemv:ident: $block:ty => $kernel:path; )*) => {$(
        /// Type-erased entry to the AVX2 kernel.
        pub fn $name(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
            // SAFETY: the kernel table hands these entries out only for `Isa::Avx2` (AVX2, FMA
            // and F16C).
            dot_row::<$block>(w, a, |x, y| unsafe { $kernel(x, y) })
        }

        /// Type-erased entry to the AVX2 kernel, over consecutive rows.
        pub fn $gemv(w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
            // SAFETY: as above.
            gemv_rows_with::<$block, false>(w, row_bytes, a, out, |x, y| unsafe { $kernel(x, y) })
        }
    )*};
}

avx2_entry! {
    q4_0, q4_0_gemv: BlockQ4_0 => avx2::vec_dot_q4_0_q8_0;
    q4_1, q4_1_gemv: BlockQ4_1 => avx2::vec_dot_q4_1_q8_1;
    q5_0, q5_0_gemv: BlockQ5_0 => avx2::vec_dot_q5_0_q8_0;
    q5_1, q5_1_gemv: BlockQ5_1 => avx2::vec_dot_q5_1_q8_1;
    q8_0, q8_0_gemv: BlockQ8_0 => avx2::vec_dot_q8_0_q8_0;
    q3_k, q3_k_gemv: BlockQ3K => avx2::vec_dot_q3_k_q8_k;
    q4_k, q4_k_gemv: BlockQ4K => avx2::vec_dot_q4_k_q8_k;
    q4_k_rows8, q4_k_rows8_gemv: BlockQ4K => avx2::vec_dot_q4_k_q8_k_rows8;
    q5_k, q5_k_gemv: BlockQ5K => avx2::vec_dot_q5_k_q8_k;
    q6_k, q6_k_gemv: BlockQ6K => avx2::vec_dot_q6_k_q8_k;
    iq4_xs, iq4_xs_gemv: BlockIQ4XS => avx2::vec_dot_iq4_xs_q8_k;
    f16_avx2, f16_avx2_gemv: half::f16 => f16::dot_avx2;
    f32_avx2, f32_avx2_gemv: f32 => f16::dot_avx2;
    iq4_nl_rows8, iq4_nl_rows8_gemv: BlockIQ4NL => avx2::vec_dot_iq4_nl_q8_0_rows8;
    q4_0_rows8, q4_0_rows8_gemv: BlockQ4_0 => avx2::vec_dot_q4_0_q8_0_rows8;
    q2_k_rows8, q2_k_rows8_gemv: BlockQ2K => avx2::vec_dot_q2_k_q8_k_rows8;
    q2_k, q2_k_gemv: BlockQ2K => avx2::vec_dot_q2_k_q8_k;
    iq4_nl, iq4_nl_gemv: BlockIQ4NL => avx2::vec_dot_iq4_nl_q8_0;
    mxfp4, mxfp4_gemv: BlockMXFP4 => avx2::vec_dot_mxfp4_q8_0;
    mxfp4_rows8, mxfp4_rows8_gemv: BlockMXFP4 => avx2::vec_dot_mxfp4_q8_0_rows8;
}

/// Type-erased entry to the AVX2 BF16 kernel for one row (rows: [`bf16::gemv_avx2`]).
pub fn bf16_avx2(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
    // SAFETY: the kernel table hands this entry out only for `Isa::Avx2`.
    dot_row::<half::bf16>(w, a, |x, y| unsafe { bf16::dot_bf16_avx2_row(x, y) })
}

macro_rules! avx512_entry {
    ($( $name:ident, $gemv:ident: $block:ty => $kernel:path; )*) => {$(
        /// Type-erased entry to the AVX-512 VNNI kernel.
        pub fn $name(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
            // SAFETY: the kernel table hands these entries out only for `Isa::Avx512Vnni` or
            // `Isa::AvxVnniEvex`: every feature the kernel is compiled for.
            dot_row::<$block>(w, a, |x, y| unsafe { $kernel(x, y) })
        }

        /// Type-erased entry to the AVX-512 VNNI kernel, over consecutive rows.
        pub fn $gemv(w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
            // SAFETY: as above.
            gemv_rows_with::<$block, false>(w, row_bytes, a, out, |x, y| unsafe { $kernel(x, y) })
        }
    )*};
}

avx512_entry! {
    q6_k_512, q6_k_512_gemv: BlockQ6K => avx512::vec_dot_q6_k_q8_k;
}

/// Rows of `w` with the activation row `a`, `R` rows at a time through `dot` (the last
/// `out.len() % R` one at a time through `dot::<1>`'s counterpart `one`): the shapes and casts
/// checked as [`crate::codec::gemv_rows`] checks them. The kernels ask for their rows' bytes
/// ahead as they go ([`prefetch_ahead`], [`prefetch_lines`]): a burst of requests for each
/// group before its loop, as `gemv_rows` makes, held the AVX-512 rows well under the read
/// bandwidth (measurements: docs/perf-log.md, "Prefetch: asked for as the loop goes").
fn gemv_by<B: DotBlock, const R: usize>(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    out: &mut [f32],
    dot: impl Fn([&[B]; R], &[B::Act]) -> [f32; R],
    one: impl Fn([&[B]; 1], &[B::Act]) -> [f32; 1],
) -> Result<(), QuantError> {
    let x = cast_blocks::<B>(w)?;
    let y = cast_blocks::<B::Act>(a)?;
    let per_row = row_bytes / size_of::<B>();
    // These kernels pair formats of equal block length: one activation block per weight block.
    let fits = per_row > 0
        && per_row * size_of::<B>() == row_bytes
        && x.len() == per_row * out.len()
        && per_row * B::TYPE.block_len() == y.len() * B::Act::TYPE.block_len()
        && per_row == y.len();
    if !fits {
        return Err(QuantError::DotLength {
            ty: B::TYPE,
            act: B::Act::TYPE,
            weights: w.len() / size_of::<B>() * B::TYPE.block_len(),
            activations: y.len() * B::Act::TYPE.block_len(),
        });
    }
    let mut rows = x.chunks_exact(per_row);
    let mut groups = out.chunks_exact_mut(R);
    for o in &mut groups {
        let group: [&[B]; R] = std::array::from_fn(|_| rows.next().unwrap_or_default());
        o.copy_from_slice(&dot(group, y));
    }
    for (o, row) in groups.into_remainder().iter_mut().zip(rows) {
        *o = one([row], y)[0];
    }
    Ok(())
}

macro_rules! vnni_rows_entry {
    ($module:ident; $( $name:ident, $gemv:ident: $block:ty => $kernel:ident; )*) => {$(
        /// Type-erased entry to the VNNI kernel.
        pub fn $name(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
            // SAFETY: the kernel table hands these entries out only where `Cpu::runs` every
            // feature `$module`'s kernels are compiled for (`avx512`'s: `Isa::Avx512Vnni` or
            // `Isa::AvxVnniEvex`; `avxvnni`'s: `Isa::AvxVnni`).
            dot_row::<$block>(w, a, |x, y| unsafe { $module::$kernel::<1>([x], y)[0] })
        }

        /// Type-erased entry to the VNNI kernel, over consecutive rows, four at a time.
        pub fn $gemv(w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
            // SAFETY: as above.
            unsafe {
                gemv_by::<$block, 4>(
                    w,
                    row_bytes,
                    a,
                    out,
                    |x, y| $module::$kernel::<4>(x, y),
                    |x, y| $module::$kernel::<1>(x, y),
                )
            }
        }
    )*};
}

vnni_rows_entry! {
    avx512;
    q4_0_512, q4_0_512_gemv: BlockQ4_0 => vec_dot_q4_0_q8_0_xr;
    q4_1_512, q4_1_512_gemv: BlockQ4_1 => vec_dot_q4_1_q8_1_xr;
    q8_0_512, q8_0_512_gemv: BlockQ8_0 => vec_dot_q8_0_q8_0_xr;
    q4_0_rows8_512, q4_0_rows8_512_gemv: BlockQ4_0 => vec_dot_q4_0_q8_0_rows8_xr;
}

vnni_rows_entry! {
    avxvnni;
    q4_0_vnni, q4_0_vnni_gemv: BlockQ4_0 => vec_dot_q4_0_q8_0_xr;
    q4_1_vnni, q4_1_vnni_gemv: BlockQ4_1 => vec_dot_q4_1_q8_1_xr;
    q8_0_vnni, q8_0_vnni_gemv: BlockQ8_0 => vec_dot_q8_0_q8_0_xr;
    q4_0_rows8_vnni, q4_0_rows8_vnni_gemv: BlockQ4_0 => vec_dot_q4_0_q8_0_rows8_xr;
}

macro_rules! float_512_entry {
    ($( $name:ident, $gemv:ident: $elem:ty; )*) => {$(
        /// Type-erased entry to the AVX-512 float kernel.
        pub fn $name(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
            // SAFETY: the kernel table hands this entry out only for `Isa::Avx512`: every
            // feature the kernel is compiled for.
            dot_row::<$elem>(w, a, |x, y| unsafe { f16::dot_512::<$elem, 1>([x], y)[0] })
        }

        /// Type-erased entry to the AVX-512 float kernel, over consecutive rows: four at a
        /// time (the token's values loaded once for four rows), or one at a time on AMD's
        /// CPUs, which stream one row faster than four side by side (measurements:
        /// docs/perf-log.md, "Row kernels"). The rows' sums are the same either way.
        pub fn $gemv(w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
            let one = |x: [&[$elem]; 1], y: &[$elem]| {
                // SAFETY: as above.
                unsafe { f16::dot_512::<$elem, 1>(x, y) }
            };
            if is_amd() {
                gemv_by::<$elem, 1>(w, row_bytes, a, out, one, one)
            } else {
                gemv_by::<$elem, 4>(
                    w,
                    row_bytes,
                    a,
                    out,
                    // SAFETY: as above.
                    |x, y| unsafe { f16::dot_512::<$elem, 4>(x, y) },
                    one,
                )
            }
        }
    )*};
}

float_512_entry! {
    f16_512, f16_512_gemv: half::f16;
    f32_512, f32_512_gemv: f32;
}

/// Type-erased entry to the AVX512-BF16 kernel.
pub fn bf16_512(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
    // SAFETY: the kernel table hands this entry out only for `Isa::Avx512Bf16`.
    dot_row::<half::bf16>(w, a, |x, y| unsafe { bf16::dot_bf16::<1>([x], y)[0] })
}

/// Type-erased entry to the AVX512-BF16 kernel over consecutive rows, one at a time (as F16's
/// on AMD CPUs, where one row streams faster than four side by side).
pub fn bf16_512_gemv(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    let one = |x: [&[half::bf16]; 1], y: &[half::bf16]| {
        // SAFETY: as above.
        unsafe { bf16::dot_bf16::<1>(x, y) }
    };
    gemv_by::<half::bf16, 1>(w, row_bytes, a, out, one, one)
}
