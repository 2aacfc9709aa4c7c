//! x86-64 kernels, chosen at run time by [`crate::vec_dot_kernel`] from the CPU's features.

pub mod avx2;
pub mod avx512_tile;
pub mod tile;

use crate::blocks::*;
use crate::codec::{dot_row, gemv_rows};
use crate::QuantError;

macro_rules! avx2_entry {
    ($( $name:ident, $gemv:ident: $block:ty => $kernel:path; )*) => {$(
        /// Type-erased entry to the AVX2 kernel.
        pub fn $name(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
            // SAFETY: `vec_dot_kernel` hands these entries out only after detecting AVX2, FMA
            // and F16C on this CPU.
            dot_row::<$block>(w, a, |x, y| unsafe { $kernel(x, y) })
        }

        /// Type-erased entry to the AVX2 kernel, over consecutive rows.
        pub fn $gemv(w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
            // SAFETY: as above.
            gemv_rows::<$block>(w, row_bytes, a, out, |x, y| unsafe { $kernel(x, y) })
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
    iq4_nl_rows8, iq4_nl_rows8_gemv: BlockIQ4NL => avx2::vec_dot_iq4_nl_q8_0_rows8;
    q4_0_rows8, q4_0_rows8_gemv: BlockQ4_0 => avx2::vec_dot_q4_0_q8_0_rows8;
    q2_k_rows8, q2_k_rows8_gemv: BlockQ2K => avx2::vec_dot_q2_k_q8_k_rows8;
}
