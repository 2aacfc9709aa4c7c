//! The codec table: for each ggml type synapse can decode, its dequantizer, its quantizer (for
//! the activation and float formats) and its reference dot product with the activation type it
//! pairs with; and the checked, safe shapes every kernel's entry shares (`gemv_rows`,
//! `gemm_operands`, [`cast_blocks`]). Block sizes and ids come from [`GgmlType::traits`];
//! nothing here repeats them. This module knows no instruction set: the kernels build on it,
//! and the kernel table ([`crate::kernels`]) chooses among them.

use bytemuck::Pod;
use half::{bf16, f16};
use synapse_gguf::GgmlType;

use crate::blocks::*;
use crate::error::QuantError;
use crate::reference::{dequant as dq, dot, quantize as qz};

/// A block of a ggml format, castable from file bytes.
pub trait Block: Pod {
    const TYPE: GgmlType;
    /// Decode this block's `TYPE.block_len()` values into `y`.
    fn dequantize(&self, y: &mut [f32]);
}

/// A format synapse can also encode: the activation formats and the float formats.
pub trait QuantizeBlock: Block {
    /// Encode `TYPE.block_len()` values as ggml's reference quantizer does.
    fn quantize(x: &[f32], y: &mut Self);
    /// Encode activations for a dot product as llama.cpp does at inference (see
    /// [`crate::reference::quantize`]); the reference quantizer unless that differs.
    #[inline(always)]
    fn quantize_act(x: &[f32], y: &mut Self) {
        Self::quantize(x, y)
    }
}

/// A weight format with a reference dot product against its activation format.
pub trait DotBlock: Block {
    type Act: QuantizeBlock;
    /// Dot product of a row of weight blocks with a row of activation blocks of equal length.
    fn vec_dot(x: &[Self], y: &[Self::Act]) -> f32;
}

macro_rules! impl_blocks {
    ($( $block:ty: $ty:ident, $deq:path $(, quantize $q:path $(| $qa:path)?)? $(, dot $act:ty => $dot:path)?; )*) => {
        $(
            impl Block for $block {
                const TYPE: GgmlType = GgmlType::$ty;
                #[inline]
                fn dequantize(&self, y: &mut [f32]) {
                    $deq(self, y)
                }
            }
            $(impl QuantizeBlock for $block {
                #[inline(always)]
                fn quantize(x: &[f32], y: &mut Self) {
                    $q(x, y)
                }
                $(#[inline(always)]
                fn quantize_act(x: &[f32], y: &mut Self) {
                    $qa(x, y)
                })?
            })?
            $(impl DotBlock for $block {
                type Act = $act;
                #[inline]
                fn vec_dot(x: &[Self], y: &[$act]) -> f32 {
                    $dot(x, y)
                }
            })?
        )*

        /// Every type with a codec, with its entry points.
        static CODECS: &[Codec] = &[$( Codec::of::<$block>(
            impl_blocks!(@quantize $block $(, $q $(| $qa)?)?),
            impl_blocks!(@dot $block $(, $act)?),
        ), )*];
    };
    (@quantize $block:ty) => { None };
    (@quantize $block:ty, $q:path $(| $qa:path)?) => {
        Some((quantize_erased::<$block>, quantize_act_erased::<$block>))
    };
    (@dot $block:ty) => { None };
    (@dot $block:ty, $act:ty) => { Some(VecDot { act: <$act as Block>::TYPE, f: vec_dot_erased::<$block>, gemv: gemv_erased::<$block> }) };
}

impl_blocks! {
    f32: F32, dq::dequantize_f32, quantize qz::quantize_f32, dot f32 => dot::vec_dot_f32_f32;
    f16: F16, dq::dequantize_f16, quantize qz::quantize_f16, dot f16 => dot::vec_dot_f16_f16;
    bf16: BF16, dq::dequantize_bf16, quantize qz::quantize_bf16, dot bf16 => dot::vec_dot_bf16_bf16;
    BlockQ4_0: Q4_0, dq::dequantize_q4_0, dot BlockQ8_0 => dot::vec_dot_q4_0_q8_0;
    BlockQ4_1: Q4_1, dq::dequantize_q4_1, dot BlockQ8_1 => dot::vec_dot_q4_1_q8_1;
    BlockQ5_0: Q5_0, dq::dequantize_q5_0, dot BlockQ8_0 => dot::vec_dot_q5_0_q8_0;
    BlockQ5_1: Q5_1, dq::dequantize_q5_1, dot BlockQ8_1 => dot::vec_dot_q5_1_q8_1;
    BlockQ8_0: Q8_0, dq::dequantize_q8_0, quantize qz::quantize_q8_0 | qz::quantize_q8_0_act, dot BlockQ8_0 => dot::vec_dot_q8_0_q8_0;
    BlockQ8_1: Q8_1, dq::dequantize_q8_1, quantize qz::quantize_q8_1 | qz::quantize_q8_1_act;
    BlockQ2K: Q2_K, dq::dequantize_q2_k, dot BlockQ8K => dot::vec_dot_q2_k_q8_k;
    BlockQ3K: Q3_K, dq::dequantize_q3_k, dot BlockQ8K => dot::vec_dot_q3_k_q8_k;
    BlockQ4K: Q4_K, dq::dequantize_q4_k, dot BlockQ8K => dot::vec_dot_q4_k_q8_k;
    BlockQ5K: Q5_K, dq::dequantize_q5_k, dot BlockQ8K => dot::vec_dot_q5_k_q8_k;
    BlockQ6K: Q6_K, dq::dequantize_q6_k, dot BlockQ8K => dot::vec_dot_q6_k_q8_k;
    BlockQ8K: Q8_K, dq::dequantize_q8_k, quantize qz::quantize_q8_k;
    BlockIQ4NL: IQ4_NL, dq::dequantize_iq4_nl, dot BlockQ8_0 => dot::vec_dot_iq4_nl_q8_0;
    BlockIQ4XS: IQ4_XS, dq::dequantize_iq4_xs, dot BlockQ8K => dot::vec_dot_iq4_xs_q8_k;
    BlockMXFP4: MXFP4, dq::dequantize_mxfp4, dot BlockQ8_0 => dot::vec_dot_mxfp4_q8_0;
}

/// Decode a row: bytes in, floats out (lengths must agree).
pub type DequantizeFn = fn(&[u8], &mut [f32]) -> Result<(), QuantError>;
/// Encode a row: floats in, bytes out (lengths must agree).
pub type QuantizeFn = fn(&[f32], &mut [u8]) -> Result<(), QuantError>;

/// A type-erased dot product: weight row bytes, activation row bytes.
#[derive(Clone, Copy)]
pub struct VecDot {
    /// The activation type the weights pair with.
    pub act: GgmlType,
    /// One weight row with one activation row.
    pub f: fn(&[u8], &[u8]) -> Result<f32, QuantError>,
    /// Consecutive weight rows (`out.len()` of them, `row_bytes` each) with one activation row:
    /// `out[r]` is what `f` gives for row `r`, bit for bit; checks and casts are paid once.
    pub gemv: GemvFn,
}

/// See [`VecDot::gemv`]: weight rows, bytes per row, activation row, one output per row.
pub type GemvFn = fn(&[u8], usize, &[u8], &mut [f32]) -> Result<(), QuantError>;

/// Dot each of the weight rows in `w` with the activation row `a`, through `dot`, asking for
/// each row's bytes ahead of it ([`prefetch_ahead`]).
pub(crate) fn gemv_rows<B: DotBlock>(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    out: &mut [f32],
    dot: impl Fn(&[B], &[B::Act]) -> f32,
) -> Result<(), QuantError> {
    gemv_rows_with::<B, true>(w, row_bytes, a, out, dot)
}

/// [`gemv_rows`], with the burst of requests before each row (`BURST`) or without, for the
/// kernels that ask for their bytes as they go (`x86::prefetch_ahead`): on top of those, the
/// burst cost the AVX2 rows some of the read bandwidth (measurements: docs/perf-log.md,
/// "Prefetch: asked for as the loop goes").
pub(crate) fn gemv_rows_with<B: DotBlock, const BURST: bool>(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    out: &mut [f32],
    dot: impl Fn(&[B], &[B::Act]) -> f32,
) -> Result<(), QuantError> {
    let x = cast_blocks::<B>(w)?;
    let y = cast_blocks::<B::Act>(a)?;
    let per_row = row_bytes / size_of::<B>();
    let values = per_row * B::TYPE.block_len();
    let fits = per_row > 0
        && per_row * size_of::<B>() == row_bytes
        && x.len() == per_row * out.len()
        && values == y.len() * B::Act::TYPE.block_len();
    if !fits {
        return Err(QuantError::DotLength {
            ty: B::TYPE,
            act: B::Act::TYPE,
            weights: w.len() / size_of::<B>().max(1) * B::TYPE.block_len(),
            activations: y.len() * B::Act::TYPE.block_len(),
        });
    }
    for (i, (o, row)) in out.iter_mut().zip(x.chunks_exact(per_row)).enumerate() {
        if BURST {
            prefetch_ahead(w, i * row_bytes..(i + 1) * row_bytes);
        }
        *o = dot(row, y);
    }
    Ok(())
}

/// How far ahead of the kernel a one-token product asks for its weights, in bytes. The
/// hardware's stream prefetchers alone leave a core reading a few rows at a time at well under
/// half the bandwidth a streaming read reaches; asking early keeps more misses in flight.
pub(crate) const PREFETCH_AHEAD: usize = 4096;

/// Asks the cache for the bytes of `w` that lie `PREFETCH_AHEAD` beyond `span` (the part of `w`
/// about to be read), one request per 64-byte line. A hint: it reads nothing, and bytes past
/// the end of `w` are not asked for.
#[inline]
pub(crate) fn prefetch_ahead(w: &[u8], span: std::ops::Range<usize>) {
    let end = (span.end + PREFETCH_AHEAD).min(w.len());
    let mut at = (span.start + PREFETCH_AHEAD) & !63;
    while at < end {
        // SAFETY: `at < w.len()`, so the address lies inside `w`; a prefetch reads nothing into
        // the program and never faults.
        unsafe {
            let p = w.as_ptr().add(at);
            #[cfg(target_arch = "x86_64")]
            std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p.cast());
            #[cfg(target_arch = "aarch64")]
            std::arch::asm!("prfm pldl1keep, [{0}]", in(reg) p, options(nostack, readonly, preserves_flags));
            #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
            let _ = p;
        }
        at += 64;
    }
}

pub(crate) fn gemv_erased<B: DotBlock>(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    out: &mut [f32],
) -> Result<(), QuantError> {
    gemv_rows::<B>(w, row_bytes, a, out, B::vec_dot)
}

/// Weight rows times a batch of tokens: weight rows (`row_bytes` each), `n_tok` activation rows
/// (back to back), and `out` as `(n_tok, rows)`. `out[t * rows + r]` is what [`VecDot::f`]
/// gives for row `r` and token `t`, bit for bit, whatever `n_tok`.
pub type GemmFn = fn(&[u8], usize, &[u8], usize, &mut [f32]) -> Result<(), QuantError>;

/// The operands of a [`GemmFn`], checked and cast: weight blocks, activation blocks, blocks per
/// row.
pub(crate) type GemmOperands<'a, 'b, B> = (&'a [B], &'b [<B as DotBlock>::Act], usize);

/// The operands of a [`GemmFn`], checked and cast.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(crate) fn gemm_operands<'a, 'b, B: DotBlock>(
    w: &'a [u8],
    row_bytes: usize,
    a: &'b [u8],
    n_tok: usize,
    out: &[f32],
) -> Result<GemmOperands<'a, 'b, B>, QuantError> {
    let x = cast_blocks::<B>(w)?;
    let y = cast_blocks::<B::Act>(a)?;
    let per_row = row_bytes / size_of::<B>();
    let rows = x.len() / per_row.max(1);
    let act_per_row = per_row * B::TYPE.block_len() / B::Act::TYPE.block_len();
    let fits = per_row > 0
        && per_row * size_of::<B>() == row_bytes
        && x.len() == per_row * rows
        // The tiles index both operands by weight block.
        && act_per_row == per_row
        && y.len() == n_tok * per_row
        && out.len() == n_tok * rows;
    if !fits {
        return Err(QuantError::DotLength {
            ty: B::TYPE,
            act: B::Act::TYPE,
            weights: w.len() / size_of::<B>().max(1) * B::TYPE.block_len(),
            activations: y.len() * B::Act::TYPE.block_len(),
        });
    }
    Ok((x, y, per_row))
}

/// The entry points for one type, on raw bytes (length and alignment checked).
#[derive(Clone, Copy)]
pub struct Codec {
    pub ty: GgmlType,
    pub dequantize: DequantizeFn,
    pub quantize: Option<QuantizeFn>,
    /// Encoding of activations at inference: see [`QuantizeBlock::quantize_act`].
    pub quantize_act: Option<QuantizeFn>,
    pub vec_dot: Option<VecDot>,
}

impl Codec {
    const fn of<B: Block>(
        quantize: Option<(QuantizeFn, QuantizeFn)>,
        vec_dot: Option<VecDot>,
    ) -> Codec {
        let (quantize, quantize_act) = match quantize {
            Some((q, qa)) => (Some(q), Some(qa)),
            None => (None, None),
        };
        Codec {
            ty: B::TYPE,
            dequantize: dequantize_erased::<B>,
            quantize,
            quantize_act,
            vec_dot,
        }
    }
}

/// The codec of a type, or an error saying synapse has none for it.
pub fn codec(ty: GgmlType) -> Result<&'static Codec, QuantError> {
    CODECS
        .iter()
        .find(|c| c.ty == ty)
        .ok_or(QuantError::Unsupported { ty, what: "codec" })
}

/// Every type synapse can decode.
pub fn supported_types() -> impl Iterator<Item = GgmlType> {
    CODECS.iter().map(|c| c.ty)
}

/// View bytes as blocks of `B`, checking the length and the alignment.
pub fn cast_blocks<B: Block>(bytes: &[u8]) -> Result<&[B], QuantError> {
    bytemuck::try_cast_slice(bytes).map_err(|_| bad_cast::<B>(bytes.len(), bytes.as_ptr() as usize))
}

/// Mutable counterpart of [`cast_blocks`].
pub fn cast_blocks_mut<B: Block>(bytes: &mut [u8]) -> Result<&mut [B], QuantError> {
    let (len, addr) = (bytes.len(), bytes.as_ptr() as usize);
    bytemuck::try_cast_slice_mut(bytes).map_err(|_| bad_cast::<B>(len, addr))
}

fn bad_cast<B: Block>(len: usize, addr: usize) -> QuantError {
    if !len.is_multiple_of(size_of::<B>()) {
        QuantError::ByteLength {
            ty: B::TYPE,
            bytes: len,
        }
    } else {
        QuantError::Misaligned {
            ty: B::TYPE,
            addr,
            align: align_of::<B>(),
        }
    }
}

/// Check that `n_values` values of `B` are exactly `n_bytes` bytes.
pub(crate) fn check_sizes<B: Block>(n_values: usize, n_bytes: usize) -> Result<usize, QuantError> {
    let len = B::TYPE.block_len();
    if !n_values.is_multiple_of(len) {
        return Err(QuantError::NotBlockMultiple {
            ty: B::TYPE,
            values: n_values,
        });
    }
    let blocks = n_values / len;
    if blocks * size_of::<B>() != n_bytes {
        return Err(QuantError::SizeMismatch {
            ty: B::TYPE,
            values: n_values,
            bytes: n_bytes,
            expected: blocks * size_of::<B>(),
        });
    }
    Ok(blocks)
}

fn dequantize_erased<B: Block>(src: &[u8], dst: &mut [f32]) -> Result<(), QuantError> {
    check_sizes::<B>(dst.len(), src.len())?;
    let blocks = cast_blocks::<B>(src)?;
    for (b, y) in blocks.iter().zip(dst.chunks_exact_mut(B::TYPE.block_len())) {
        b.dequantize(y);
    }
    Ok(())
}

fn quantize_with<B: QuantizeBlock>(
    src: &[f32],
    dst: &mut [u8],
    f: fn(&[f32], &mut B),
) -> Result<(), QuantError> {
    check_sizes::<B>(src.len(), dst.len())?;
    let blocks = cast_blocks_mut::<B>(dst)?;
    for (b, x) in blocks.iter_mut().zip(src.chunks_exact(B::TYPE.block_len())) {
        f(x, b);
    }
    Ok(())
}

fn quantize_erased<B: QuantizeBlock>(src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    quantize_with::<B>(src, dst, B::quantize)
}

fn quantize_act_erased<B: QuantizeBlock>(src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    quantize_with::<B>(src, dst, B::quantize_act)
}

/// One weight row with one activation row, through `dot`: [`gemv_rows`] over a single row.
pub(crate) fn dot_row<B: DotBlock>(
    w: &[u8],
    a: &[u8],
    dot: impl Fn(&[B], &[B::Act]) -> f32,
) -> Result<f32, QuantError> {
    let mut out = [0.0f32];
    gemv_rows::<B>(w, w.len(), a, &mut out, dot)?;
    Ok(out[0])
}

pub(crate) fn vec_dot_erased<B: DotBlock>(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
    dot_row::<B>(w, a, B::vec_dot)
}

/// Whether llama.cpp's x86-64 AVX-512 build (the reference synapse's logits are checked against)
/// stores a weight matrix of type `ty` with `rows` rows in its interleaved ("repacked") layout
/// and multiplies it with its own gemv, whose float order differs from `vec_dot`'s (see
/// `reference::dot`, `*_rows8`): Q4_0, IQ4_NL, MXFP4, Q4_K and Q2_K matrices whose row count is a
/// multiple of 8. A fixed rule, not a property of the host: synapse computes the same bits on
/// every machine.
pub fn llama_cpp_repacks(ty: GgmlType, rows: usize) -> bool {
    rows.is_multiple_of(8)
        && matches!(
            ty,
            GgmlType::Q4_0 | GgmlType::IQ4_NL | GgmlType::MXFP4 | GgmlType::Q4_K | GgmlType::Q2_K
        )
}

/// Type-erased entries to the repacked-order dot products.
pub(crate) mod rows8 {
    use super::{dot_row, gemv_rows};
    use crate::blocks::*;
    use crate::error::QuantError;
    use crate::reference::dot;

    macro_rules! entries {
        ($( $name:ident, $gemv:ident: $block:ty => $f:path; )*) => {$(
            pub fn $name(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
                dot_row::<$block>(w, a, $f)
            }

            pub fn $gemv(w: &[u8], row_bytes: usize, a: &[u8], out: &mut [f32]) -> Result<(), QuantError> {
                gemv_rows::<$block>(w, row_bytes, a, out, $f)
            }
        )*};
    }

    entries! {
        q4_0, q4_0_gemv: BlockQ4_0 => dot::vec_dot_q4_0_q8_0_rows8;
        iq4_nl, iq4_nl_gemv: BlockIQ4NL => dot::vec_dot_iq4_nl_q8_0_rows8;
        mxfp4, mxfp4_gemv: BlockMXFP4 => dot::vec_dot_mxfp4_q8_0_rows8;
        q4_k, q4_k_gemv: BlockQ4K => dot::vec_dot_q4_k_q8_k_rows8;
        q2_k, q2_k_gemv: BlockQ2K => dot::vec_dot_q2_k_q8_k_rows8;
    }
}
