//! Weight matrices packed once, when a model is loaded, for kernels that read sixteen rows
//! as one (see `x86::avx512::packed`, and `x86::avx2::packed` for CPUs without AVX-512): the
//! same bytes as the file's, moved so that a 512-bit load holds the same four bytes of
//! sixteen rows (and a 256-bit load eight of them). A packed matrix gives the bits of the row
//! kernels for every batch size (tested), so it changes only the speed.
//!
//! Only whole groups of sixteen rows are packed; a matrix's last `rows % 16` rows stay with
//! the kernels that read the file's layout.

#[cfg(target_arch = "x86_64")]
pub(crate) mod layout;

use std::ops::Range;

use crate::{GgmlType, QuantError};

pub use crate::kernel::PACK_GROUP_ROWS;
#[cfg(target_arch = "x86_64")]
const _: () = assert!(layout::ROWS == PACK_GROUP_ROWS);

/// A packed weight matrix: its first [`PackedMatrix::rows`] rows, in groups of sixteen.
pub struct PackedMatrix {
    ty: GgmlType,
    rows: usize,
    /// Blocks per row.
    per_row: usize,
    /// Page-aligned, in huge pages where the system gives them ([`crate::pages`]).
    #[cfg(target_arch = "x86_64")]
    data: crate::pages::Pages,
    #[cfg(target_arch = "x86_64")]
    format: &'static layout::PackedFormat,
}

impl std::fmt::Debug for PackedMatrix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PackedMatrix")
            .field("ty", &self.ty)
            .field("rows", &self.rows)
            .field("per_row", &self.per_row)
            .finish_non_exhaustive()
    }
}

/// Whether the kernel configuration packs weights (it may leave them unpacked, to measure what
/// packing brings).
fn packing_enabled() -> bool {
    !crate::config().no_pack
}

/// Pack the whole groups of sixteen rows of a weight matrix of type `ty` (`repacked` as for
/// [`crate::matrix_kernel`]; `w`: its rows, `row_bytes` each), if this CPU has a packed kernel
/// for that format (and the kernel configuration packs). `Ok(None)`: no packed form; the matrix
/// stays with the kernels of [`crate::matrix_kernel`] and [`crate::gemm_kernel`]. The format
/// is the kernel table's ([`crate::kernels::select`]).
///
/// Packing goes piece by piece over the machine's cores; `release` is given the bytes of `w`
/// each piece has packed, once it has (to let a file's pages go as their copy is made).
pub fn pack_matrix(
    ty: GgmlType,
    repacked: bool,
    w: &[u8],
    row_bytes: usize,
    release: &(dyn Fn(&[u8]) + Sync),
) -> Result<Option<PackedMatrix>, QuantError> {
    #[cfg(target_arch = "x86_64")]
    {
        use crate::kernels::{select, Form, Order};
        let order = Order::of(ty, repacked);
        let Some(format) = select(crate::cpu(), ty, order, Form::Packed).and_then(|k| k.packed())
        else {
            return Ok(None);
        };
        if !packing_enabled() || row_bytes == 0 {
            return Ok(None);
        }
        let per_row = row_bytes / ty.block_bytes();
        if per_row * ty.block_bytes() != row_bytes || w.len() % row_bytes != 0 {
            return Err(QuantError::ByteLength {
                ty,
                bytes: row_bytes,
            });
        }
        let groups = w.len() / row_bytes / PACK_GROUP_ROWS;
        if groups == 0 {
            return Ok(None);
        }
        use layout::PackError;
        let data = match (format.pack)(w, row_bytes, groups, release) {
            Ok(data) => data,
            Err(PackError::Declined) => return Ok(None),
            Err(PackError::Quant(e)) => return Err(e),
            Err(PackError::Io(e)) => {
                return Err(QuantError::NoMemory {
                    ty,
                    bytes: groups * PACK_GROUP_ROWS * row_bytes,
                    reason: e.to_string(),
                })
            }
        };
        Ok(Some(PackedMatrix {
            ty,
            rows: PACK_GROUP_ROWS * groups,
            per_row,
            data,
            format,
        }))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (ty, repacked, w, row_bytes, release, packing_enabled());
        Ok(None)
    }
}

impl PackedMatrix {
    /// Rows packed: a multiple of sixteen.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The weight type.
    pub fn ty(&self) -> GgmlType {
        self.ty
    }

    /// Rows a batch product should give [`Self::gemm`] a call: more where the kernel has work
    /// on the tokens to do in every call.
    pub fn tile_rows(&self) -> usize {
        #[cfg(target_arch = "x86_64")]
        {
            use layout::TILE_ROWS;
            let columns = self.per_row * self.ty.block_len();
            let rows = self.format.tile_weights / columns.max(1) / PACK_GROUP_ROWS;
            TILE_ROWS.max(rows * PACK_GROUP_ROWS)
        }
        #[cfg(not(target_arch = "x86_64"))]
        64
    }

    /// Bytes the packed rows take (those of the file's rows, moved).
    pub fn bytes(&self) -> usize {
        #[cfg(target_arch = "x86_64")]
        return self.rows / PACK_GROUP_ROWS * self.per_row * self.format.block_bytes;
        #[cfg(not(target_arch = "x86_64"))]
        0
    }

    /// The packed rows' bytes, as the kernels read them ([`Self::bytes`] of them).
    pub fn data(&self) -> &[u8] {
        #[cfg(target_arch = "x86_64")]
        return &self.data[..self.bytes()];
        #[cfg(not(target_arch = "x86_64"))]
        &[]
    }

    /// Rows `rows` (whole groups of sixteen, within [`Self::rows`]) times the `n_tok`
    /// activation rows in `a` (the weight type's activation blocks), into `out` as `(n_tok,
    /// rows.len())`: bit for bit what the matrix's row kernel gives, token by token.
    pub fn gemm(
        &self,
        rows: Range<usize>,
        a: &[u8],
        n_tok: usize,
        out: &mut [f32],
    ) -> Result<(), QuantError> {
        let g = PACK_GROUP_ROWS;
        let whole = rows.start % g == 0 && rows.end % g == 0 && rows.start <= rows.end;
        if !whole || rows.end > self.rows {
            return Err(QuantError::DotLength {
                ty: self.ty,
                act: self.ty,
                weights: rows.len() * self.per_row * self.ty.block_len(),
                activations: a.len(),
            });
        }
        #[cfg(target_arch = "x86_64")]
        {
            let group = self.per_row * self.format.block_bytes;
            let p = &self.data[rows.start / g * group..rows.end / g * group];
            (self.format.kernel)(p, self.per_row, a, n_tok, out)
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (a, n_tok, out);
            unreachable!("no packed matrices without x86-64")
        }
    }
}
