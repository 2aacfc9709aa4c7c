//! x86-64 kernels, chosen at run time from the kernel table ([`crate::kernels`]).

/// The safe entry point of a tiled kernel ([`crate::GemmFn`]): check the operands and cast
/// them to `$block` weights and their activation blocks, then run `$driver(weights,
/// activations, blocks per row, out)`, an `unsafe fn` whose CPU features the kernel table's
/// row for the entry names (`Isa`): it hands the entry out only where `Cpu::runs` them. An entry generic over its element (`name<E:
/// Elem>: E => ...`) names the parameter and its bound.
macro_rules! tiled_entry {
    ($(#[$doc:meta])* $name:ident $(<$g:ident: $bound:path>)?: $block:ty => $driver:expr) => {
        $(#[$doc])*
        pub fn $name $(<$g: $bound>)? (
            w: &[u8],
            row_bytes: usize,
            a: &[u8],
            n_tok: usize,
            out: &mut [f32],
        ) -> Result<(), QuantError> {
            let (x, y, per_row) =
                crate::codec::gemm_operands::<$block>(w, row_bytes, a, n_tok, out)?;
            // SAFETY: the kernel table hands this entry out only where `Cpu::runs` its row's
            // `Isa`, the features the driver needs; the operands' sizes agree (checked above).
            unsafe { $driver(x, y, per_row, out) };
            Ok(())
        }
    };
}

/// [`tiled_entry`]s of a tiled kernel family: the family's `gemm` driver for each kernel `$k`
/// (whose weight block is `<$k as $family>::W`).
macro_rules! gemm_entries {
    ($family:ident; $( $name:ident: $k:ty; )*) => {$(
        tiled_entry! {
            /// Tiled product of weight rows with a batch of tokens (see [`crate::GemmFn`]).
            $name: <$k as $family>::W => gemm::<$k>
        }
    )*};
}

pub(crate) mod actq;
pub mod avx2;
pub mod avx512;
pub mod avxvnni;
pub mod bf16;
pub mod f16;
mod packed_common;
mod prefetch;
pub(crate) mod rows;
#[cfg(test)]
mod tests;

// What the kernels share, under the paths they name it by.
pub(crate) use crate::cpu::Vnni256;
pub(crate) use prefetch::*;
