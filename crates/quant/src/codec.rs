//! The codec table: for each ggml type synapse can decode, its dequantizer, its quantizer (for
//! the activation and float formats) and its dot product with the activation type it pairs with.
//! Block sizes and ids come from [`GgmlType::traits`]; nothing here repeats them.

use bytemuck::Pod;
use half::{bf16, f16};
use synapse_gguf::GgmlType;

use crate::blocks::*;
use crate::reference::{dequant as dq, dot, quantize as qz};
use crate::QuantError;

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
/// kernels that ask for their bytes as they go (`x86::prefetch_ahead`): on top of those,
/// the burst cost the AVX2 rows about five points of the read bandwidth in gemv-bench (Q4_K
/// 71-75% without it, 65-68% with it).
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

fn gemv_erased<B: DotBlock>(
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

/// The tiled kernel ([`GemmFn`]) for a weight matrix of type `ty` (`repacked` as for
/// [`matrix_kernel`]): the fastest of [`gemm_kernels`]; `None` means: run [`VecDot::gemv`] per
/// token.
pub fn gemm_kernel(ty: GgmlType, repacked: bool) -> Option<GemmFn> {
    gemm_kernels(ty, repacked).first().map(|k| k.1)
}

/// The kernel for one token (decode) where a tile beats [`VecDot::gemv`]: Q5_0 and Q5_1, whose
/// row kernels take one row at a time (the AVX2 tiles take four), and Q2_K (both orders) and
/// Q3_K, whose AVX-512 VNNI tiles (four rows a token, weights asked for ahead) take 64 values
/// an instruction. The other formats' row kernels take several rows at once or are as fast as
/// the tiles, which pay for their token-sharing layout (best of 3000, one thread, 64x2048: Q4_K
/// 31 against 24 Gmac/s, Q6_K 32 against 24, Q8_0 25.5 against 25.0; Q5_0 11 against 14.7;
/// best of 20, 2048x2048, `tilebench .. 1`: Q2_K 15.4 against 29.4, Q2_K repacked 14.0
/// against 27.2, Q3_K 7.3 against 17.0, Q5_K 22.0 against 16.8, IQ4_XS 17.0 against 17.2).
pub fn decode_tile_kernel(ty: GgmlType, repacked: bool) -> Option<GemmFn> {
    let isa = match ty {
        GgmlType::Q5_0 | GgmlType::Q5_1 => "avx2",
        GgmlType::Q2_K | GgmlType::Q3_K => "avx512vnni",
        _ => return None,
    };
    gemm_kernels(ty, repacked)
        .into_iter()
        .find(|k| k.0 == isa)
        .map(|k| k.1)
}

/// Every tiled kernel this CPU can run for a weight matrix, fastest first, with the name of its
/// instruction set: all give the same bits (tested), so this is for tests and benchmarks.
pub fn gemm_kernels(ty: GgmlType, repacked: bool) -> Vec<(&'static str, GemmFn)> {
    #[cfg_attr(
        not(any(target_arch = "x86_64", target_arch = "aarch64")),
        allow(unused_mut)
    )]
    let mut kernels = Vec::new();
    let repacked = repacked && llama_cpp_repacks(ty, 8);
    #[cfg(target_arch = "aarch64")]
    kernels.extend(crate::aarch64::gemm(ty, repacked).map(|k| (kernel_isa(), k)));
    #[cfg(target_arch = "x86_64")]
    {
        use crate::x86::{avx512_ktile as avx512k, avx512_tile as avx512, tile};
        if avx512::available() {
            let k: Option<GemmFn> = match (ty, repacked) {
                (GgmlType::Q4_0, false) => Some(avx512::q4_0),
                (GgmlType::Q4_1, _) => Some(avx512::q4_1),
                (GgmlType::Q5_0, _) => Some(avx512::q5_0),
                (GgmlType::Q5_1, _) => Some(avx512::q5_1),
                (GgmlType::Q8_0, _) => Some(avx512::q8_0),
                (GgmlType::Q4_K, false) => Some(avx512k::q4_k),
                (GgmlType::Q4_K, true) => Some(avx512k::q4_k_rows8),
                (GgmlType::Q6_K, _) => Some(avx512k::q6_k),
                (GgmlType::Q5_K, _) => Some(avx512k::q5_k),
                (GgmlType::Q3_K, _) => Some(avx512k::q3_k),
                (GgmlType::Q2_K, false) => Some(avx512k::q2_k),
                (GgmlType::Q2_K, true) => Some(avx512k::q2_k_rows8),
                (GgmlType::IQ4_XS, _) => Some(avx512k::iq4_xs),
                (GgmlType::IQ4_NL, true) => Some(crate::x86::avx512_nl::iq4_nl_rows8),
                (GgmlType::Q4_0, true) => Some(crate::x86::avx512_nl::q4_0_rows8),
                _ => None,
            };
            kernels.extend(k.map(|k| ("avx512vnni", k)));
        }
        if ty == GgmlType::BF16 && crate::x86::bf16::has_avx512_bf16() {
            kernels.push(("avx512bf16", crate::x86::bf16::gemm_bf16));
        }
        if crate::x86::f16::has_avx512() {
            match ty {
                GgmlType::F16 => kernels.push(("avx512", crate::x86::f16::gemm_512::<f16>)),
                GgmlType::F32 => kernels.push(("avx512", crate::x86::f16::gemm_512::<f32>)),
                _ => {}
            }
        }
        if has_v3() {
            let k: Option<GemmFn> = match (ty, repacked) {
                (GgmlType::Q4_0, false) => Some(tile::q4_0),
                (GgmlType::Q4_0, true) => Some(tile::q4_0_rows8),
                (GgmlType::Q4_1, _) => Some(tile::q4_1),
                (GgmlType::Q5_0, _) => Some(tile::q5_0),
                (GgmlType::Q5_1, _) => Some(tile::q5_1),
                (GgmlType::Q8_0, _) => Some(tile::q8_0),
                (GgmlType::Q4_K, false) => Some(tile::q4_k),
                (GgmlType::Q4_K, true) => Some(tile::q4_k_rows8),
                (GgmlType::Q6_K, _) => Some(tile::q6_k),
                (GgmlType::Q2_K, false) => Some(tile::q2_k),
                (GgmlType::Q2_K, true) => Some(tile::q2_k_rows8),
                (GgmlType::Q3_K, _) => Some(tile::q3_k),
                (GgmlType::Q5_K, _) => Some(tile::q5_k),
                (GgmlType::IQ4_XS, _) => Some(tile::iq4_xs),
                (GgmlType::IQ4_NL, false) => Some(tile::iq4_nl),
                (GgmlType::IQ4_NL, true) => Some(tile::iq4_nl_rows8),
                (GgmlType::F16, _) => Some(crate::x86::f16::gemm_avx2::<f16>),
                (GgmlType::BF16, _) => Some(crate::x86::bf16::gemm_avx2),
                (GgmlType::F32, _) => Some(crate::x86::f16::gemm_avx2::<f32>),
                _ => None,
            };
            kernels.extend(k.map(|k| ("avx2", k)));
        }
    }
    let _ = (ty, repacked);
    kernels
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
fn check_sizes<B: Block>(n_values: usize, n_bytes: usize) -> Result<usize, QuantError> {
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

fn vec_dot_erased<B: DotBlock>(w: &[u8], a: &[u8]) -> Result<f32, QuantError> {
    dot_row::<B>(w, a, B::vec_dot)
}

/// The dot product the kernels run for a weight type, chosen at run time from the CPU's
/// features: on x86-64 with AVX-512, its kernels for Q4_0, Q4_1, Q8_0, Q6_K (with VNNI), F16
/// and F32 (`crate::x86::avx512`, `crate::x86::f16`) and, with AVX512-BF16, BF16
/// (`crate::x86::bf16`: the reference's own `vdpbf16ps`); with AVX-VNNI, the 32-value formats'
/// (`crate::x86::avxvnni`); with AVX2, FMA and F16C, hand-written AVX2 kernels for the 32-value
/// formats, the K-quants, IQ4_NL, IQ4_XS, F16 and F32 (`crate::x86::avx2`, `crate::x86::f16`)
/// and BF16 (`vdpbf16ps` emulated, `crate::x86::bf16`); on aarch64, NEON kernels for every quantized format and BF16 (`crate::aarch64`, with
/// `sdot` where the CPU has FEAT_DotProd). Either way every float operation and its order are the reference's,
/// so the results are bit-identical to it (tested); only the instructions differ.
pub fn vec_dot_kernel(ty: GgmlType) -> Result<VecDot, QuantError> {
    let reference = codec(ty)?.vec_dot.ok_or(QuantError::Unsupported {
        ty,
        what: "dot product",
    })?;
    #[cfg(target_arch = "x86_64")]
    if let Some((f, gemv)) =
        crate::x86::avx512_vec_dot(ty).or_else(|| crate::x86::avxvnni_vec_dot(ty))
    {
        return Ok(VecDot {
            f,
            gemv,
            ..reference
        });
    }
    #[cfg(target_arch = "x86_64")]
    if has_v3() {
        if let Some(k) = V3_KERNELS.iter().find(|k| k.0 == ty) {
            return Ok(VecDot {
                act: reference.act,
                f: k.1,
                gemv: k.2,
            });
        }
    }
    #[cfg(target_arch = "aarch64")]
    if let Some((f, gemv)) = crate::aarch64::vec_dot(ty) {
        return Ok(VecDot {
            f,
            gemv,
            ..reference
        });
    }
    Ok(reference)
}

/// Whether the kernel configuration ([`crate::configure`]) lets code outside this crate use x86
/// tier `tier` (`reference`, `avx2`, `avxvnni` or `avx512vnni`; AVX-512 in general for the
/// last), so that capping the tier caps the engine's own vector code (attention, the forward
/// pass) with the kernels. True where it is uncapped; it says nothing of what the CPU has.
#[cfg(target_arch = "x86_64")]
pub fn isa_tier_allowed(tier: &str) -> bool {
    crate::x86::tier_allowed(tier)
}

/// The best tier of kernels this CPU runs, for reports (`synapse bench`): `avx512vnni` (with
/// AVX2 for the formats it lacks), `avx2`, `neon+dotprod`, `neon` or `reference`.
pub fn kernel_isa() -> &'static str {
    #[cfg(target_arch = "x86_64")]
    let isa = if crate::x86::has_avx512_vnni() {
        "avx512vnni"
    } else if crate::x86::has_avxvnni() {
        "avxvnni"
    } else if has_v3() {
        "avx2"
    } else {
        "reference"
    };
    #[cfg(target_arch = "aarch64")]
    let isa = if std::arch::is_aarch64_feature_detected!("dotprod") {
        "neon+dotprod"
    } else {
        "neon"
    };
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let isa = "reference";
    isa
}

/// Whether the CPU has AVX2, FMA and F16C (x86-64-v3's vector features).
#[cfg(target_arch = "x86_64")]
fn has_v3() -> bool {
    crate::x86::tier_allowed("avx2")
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
        && std::arch::is_x86_feature_detected!("f16c")
}

/// The activation quantizer the kernels use for `ty` (see [`QuantizeBlock::quantize_act`]),
/// chosen at run time: on x86-64 with AVX2, FMA and F16C, Q8_0, Q8_1 and Q8_K written out in
/// AVX2 (`x86::actq`); same bits either way.
pub fn act_quantizer(ty: GgmlType) -> Result<QuantizeFn, QuantError> {
    let reference = codec(ty)?.quantize_act.ok_or(QuantError::Unsupported {
        ty,
        what: "quantizer",
    })?;
    if ty == GgmlType::BF16 {
        return Ok(quantize_bf16_row);
    }
    #[cfg(target_arch = "x86_64")]
    if has_v3() {
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
            // SAFETY: `act_quantizer` hands this function out only after detecting AVX2, FMA
            // and F16C.
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
/// value-by-value calls through [`QuantizeBlock`] took 3% of a BF16 file's two-thread prefill.
fn quantize_bf16_row(src: &[f32], dst: &mut [u8]) -> Result<(), QuantError> {
    check_sizes::<bf16>(src.len(), dst.len())?;
    let y = cast_blocks_mut::<bf16>(dst)?;
    #[cfg(target_arch = "x86_64")]
    if has_v3() {
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
    check_sizes::<f16>(src.len(), dst.len())?;
    let y = cast_blocks_mut::<f16>(dst)?;
    // SAFETY: `act_quantizer` hands this function out only after detecting AVX2, FMA and F16C.
    unsafe { crate::x86::f16::quantize_f16(src, y) };
    Ok(())
}

/// A type-erased single-row dot product ([`VecDot::f`]).
type DotFn = fn(&[u8], &[u8]) -> Result<f32, QuantError>;

#[cfg(target_arch = "x86_64")]
static V3_KERNELS: &[(GgmlType, DotFn, GemvFn)] = &[
    (
        GgmlType::F32,
        crate::x86::f32_avx2,
        crate::x86::f32_avx2_gemv,
    ),
    (
        GgmlType::F16,
        crate::x86::f16_avx2,
        crate::x86::f16_avx2_gemv,
    ),
    (
        GgmlType::BF16,
        crate::x86::bf16_avx2,
        crate::x86::bf16::gemv_avx2,
    ),
    (GgmlType::Q4_0, crate::x86::q4_0, crate::x86::q4_0_gemv),
    (GgmlType::Q4_1, crate::x86::q4_1, crate::x86::q4_1_gemv),
    (GgmlType::Q5_0, crate::x86::q5_0, crate::x86::q5_0_gemv),
    (GgmlType::Q5_1, crate::x86::q5_1, crate::x86::q5_1_gemv),
    (GgmlType::Q8_0, crate::x86::q8_0, crate::x86::q8_0_gemv),
    (GgmlType::Q2_K, crate::x86::q2_k, crate::x86::q2_k_gemv),
    (GgmlType::Q3_K, crate::x86::q3_k, crate::x86::q3_k_gemv),
    (GgmlType::Q4_K, crate::x86::q4_k, crate::x86::q4_k_gemv),
    (GgmlType::Q5_K, crate::x86::q5_k, crate::x86::q5_k_gemv),
    (GgmlType::Q6_K, crate::x86::q6_k, crate::x86::q6_k_gemv),
    (
        GgmlType::IQ4_NL,
        crate::x86::iq4_nl,
        crate::x86::iq4_nl_gemv,
    ),
    (
        GgmlType::IQ4_XS,
        crate::x86::iq4_xs,
        crate::x86::iq4_xs_gemv,
    ),
];

/// Whether llama.cpp's x86-64 AVX-512 build (the reference synapse's logits are checked against)
/// stores a weight matrix of type `ty` with `rows` rows in its interleaved ("repacked") layout
/// and multiplies it with its own gemv, whose float order differs from `vec_dot`'s (see
/// `reference::dot`, `*_rows8`): Q4_0, IQ4_NL, Q4_K and Q2_K matrices whose row count is a
/// multiple of 8. A fixed rule, not a property of the host: synapse computes the same bits on
/// every machine.
pub fn llama_cpp_repacks(ty: GgmlType, rows: usize) -> bool {
    rows.is_multiple_of(8)
        && matches!(
            ty,
            GgmlType::Q4_0 | GgmlType::IQ4_NL | GgmlType::Q4_K | GgmlType::Q2_K
        )
}

/// The kernel for a weight matrix: [`vec_dot_kernel`], or, for a matrix llama.cpp repacks
/// ([`llama_cpp_repacks`]), the dot product in the order of llama.cpp's repacked gemv.
pub fn matrix_kernel(ty: GgmlType, repacked: bool) -> Result<VecDot, QuantError> {
    let base = vec_dot_kernel(ty)?;
    if !repacked {
        return Ok(base);
    }
    #[cfg(target_arch = "x86_64")]
    let tier = crate::x86::avx512_rows8(ty)
        .or_else(|| crate::x86::avxvnni_rows8(ty))
        .or_else(|| {
            has_v3()
                .then(|| AVX2_ROWS8.iter().find(|k| k.0 == ty).map(|k| (k.1, k.2)))
                .flatten()
        });
    #[cfg(target_arch = "aarch64")]
    let tier = crate::aarch64::rows8(ty);
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    let tier = None;
    let kernel = tier.or_else(|| {
        rows8::REFERENCE
            .iter()
            .find(|k| k.0 == ty)
            .map(|k| (k.1, k.2))
    });
    Ok(match kernel {
        Some((f, gemv)) => VecDot { f, gemv, ..base },
        None => base,
    })
}

/// The AVX2 kernels in the repacked order.
#[cfg(target_arch = "x86_64")]
static AVX2_ROWS8: &[(GgmlType, DotFn, GemvFn)] = &[
    (
        GgmlType::Q4_0,
        crate::x86::q4_0_rows8,
        crate::x86::q4_0_rows8_gemv,
    ),
    (
        GgmlType::IQ4_NL,
        crate::x86::iq4_nl_rows8,
        crate::x86::iq4_nl_rows8_gemv,
    ),
    (
        GgmlType::Q4_K,
        crate::x86::q4_k_rows8,
        crate::x86::q4_k_rows8_gemv,
    ),
    (
        GgmlType::Q2_K,
        crate::x86::q2_k_rows8,
        crate::x86::q2_k_rows8_gemv,
    ),
];

/// Type-erased entries to the repacked-order dot products.
mod rows8 {
    use super::{dot_row, gemv_rows, GemvFn};
    use crate::blocks::*;
    use crate::reference::dot;
    use crate::{GgmlType, QuantError};

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

    /// The reference in the repacked order, for every type llama.cpp repacks.
    pub static REFERENCE: &[(GgmlType, super::DotFn, GemvFn)] = &[
        (GgmlType::Q4_0, q4_0, q4_0_gemv),
        (GgmlType::IQ4_NL, iq4_nl, iq4_nl_gemv),
        (GgmlType::Q4_K, q4_k, q4_k_gemv),
        (GgmlType::Q2_K, q2_k, q2_k_gemv),
    ];

    entries! {
        q4_0, q4_0_gemv: BlockQ4_0 => dot::vec_dot_q4_0_q8_0_rows8;
        iq4_nl, iq4_nl_gemv: BlockIQ4NL => dot::vec_dot_iq4_nl_q8_0_rows8;
        q4_k, q4_k_gemv: BlockQ4K => dot::vec_dot_q4_k_q8_k_rows8;
        q2_k, q2_k_gemv: BlockQ2K => dot::vec_dot_q2_k_q8_k_rows8;
    }
}
