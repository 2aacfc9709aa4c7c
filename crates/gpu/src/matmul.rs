//! Weight matrices on the GPU, read in place, and the fused dequantize + matrix-vector kernels
//! over them (one per ggml format, `shaders/formats/`), for one token or a tile of tokens.

use std::sync::Arc;

use synapse_gguf::GgmlType;

use crate::buffer::F32Buffer;
use crate::pipelines::{Bind, Compiled};
use crate::program::Pass;
use crate::{Gpu, GpuError};

/// Rows per 32-thread team; a workgroup is two teams.
const ROWS: u32 = 2;
/// Tokens per workgroup when more than one token is multiplied: each weight a lane decodes
/// serves this many tokens. The arithmetic of every output is the same for any tile (G1).
pub const TOKEN_TILE: u32 = 8;

const BYTES: &str = include_str!("shaders/bytes.wgsl");
const MATMUL: &str = include_str!("shaders/matmul.wgsl");
const BLOCK32: &str = include_str!("shaders/formats/block32.wgsl");
const KQUANT: &str = include_str!("shaders/formats/kquant.wgsl");
const IQ4: &str = include_str!("shaders/formats/iq4.wgsl");

/// The WGSL that decodes a format for the matmul kernel, in the order it is joined.
fn format_sources(ty: GgmlType) -> Option<&'static [&'static str]> {
    use GgmlType as T;
    macro_rules! f {
        ($file:literal) => {
            include_str!(concat!("shaders/formats/", $file))
        };
    }
    Some(match ty {
        T::F32 => &[BLOCK32, f!("f32.wgsl")],
        T::F16 => &[BLOCK32, f!("f16.wgsl")],
        T::BF16 => &[BLOCK32, f!("bf16.wgsl")],
        T::Q4_0 => &[BLOCK32, f!("q4_0.wgsl")],
        T::Q4_1 => &[BLOCK32, f!("q4_1.wgsl")],
        T::Q5_0 => &[BLOCK32, f!("q5_0.wgsl")],
        T::Q5_1 => &[BLOCK32, f!("q5_1.wgsl")],
        T::Q8_0 => &[BLOCK32, f!("q8_0.wgsl")],
        T::IQ4_NL => &[BLOCK32, IQ4, f!("iq4_nl.wgsl")],
        T::MXFP4 => &[BLOCK32, f!("mxfp4.wgsl")],
        T::Q2_K => &[KQUANT, f!("q2_k.wgsl")],
        T::Q3_K => &[KQUANT, f!("q3_k.wgsl")],
        T::Q4_K => &[KQUANT, f!("q4_k.wgsl")],
        T::Q5_K => &[KQUANT, f!("q5_k.wgsl")],
        T::Q6_K => &[KQUANT, f!("q6_k.wgsl")],
        T::IQ4_XS => &[KQUANT, IQ4, f!("iq4_xs.wgsl")],
        _ => return None,
    })
}

/// Whether the GPU multiplies matrices of this type.
pub fn supported(ty: GgmlType) -> bool {
    format_sources(ty).is_some()
}

/// Every type the GPU multiplies.
pub fn supported_types() -> impl Iterator<Item = GgmlType> {
    GgmlType::ALL.iter().copied().filter(|&t| supported(t))
}

/// The kernel's source for one format and token tile.
fn source(ty: GgmlType, tokens: u32) -> Option<String> {
    let mut s = String::from(BYTES);
    for part in format_sources(ty)? {
        s.push('\n');
        s.push_str(part);
    }
    s.push('\n');
    s.push_str(
        &MATMUL
            .replace("{{TOKENS}}", &tokens.to_string())
            .replace("{{ROWS}}", &ROWS.to_string()),
    );
    Some(s)
}

/// The matmul kernels' bindings: weights, activations, outputs, parameters.
const BINDS: &[(u32, Bind)] = &[
    (0, Bind::Read),
    (1, Bind::Read),
    (2, Bind::Write),
    (3, Bind::Uniform),
];

/// A weight matrix on the GPU: the file's bytes, row-major, `rows` rows of `cols` values, in
/// one buffer or, where it is larger than the adapter binds at once, in parts of whole rows.
#[derive(Debug)]
pub struct Matrix {
    /// Each part's buffer and its first row.
    parts: Vec<(wgpu::Buffer, usize)>,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
}

impl Matrix {
    /// The bytes it occupies on the GPU.
    pub fn bytes(&self) -> u64 {
        self.parts.iter().map(|(b, _)| b.size()).sum()
    }
}

#[repr(C)]
#[derive(Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    rows: u32,
    cols: u32,
    tokens: u32,
    row_bytes: u32,
    steps: u32,
    lanes: u32,
    groups_x: u32,
    row_base: u32,
    out_rows: u32,
    _pad: [u32; 3],
}

impl Gpu {
    /// Copy a matrix's bytes (as a GGUF file holds them) to the GPU.
    pub fn upload_matrix(
        &self,
        name: &str,
        ty: GgmlType,
        rows: usize,
        cols: usize,
        bytes: &[u8],
    ) -> Result<Matrix, GpuError> {
        let shape = |detail: String| GpuError::Shape {
            what: format!("{name} ({ty}, {rows} x {cols})"),
            detail,
        };
        if !supported(ty) {
            return Err(GpuError::Unsupported { ty });
        }
        if cols == 0 || rows == 0 {
            return Err(shape("an empty matrix".into()));
        }
        // The float types are cut into runs of 32 like the 32-value formats.
        let unit = ty.block_len().max(32);
        if cols % unit != 0 {
            return Err(shape(format!("the row length is not a multiple of {unit}")));
        }
        let row_bytes = cols / ty.block_len() * ty.block_bytes();
        let expected = row_bytes.checked_mul(rows);
        if expected != Some(bytes.len()) {
            return Err(shape(format!(
                "{} bytes given, {} expected",
                bytes.len(),
                expected.map_or("more than memory holds".into(), |e| e.to_string())
            )));
        }
        // Word reads may look one word past a part's last byte: each part is a whole number of
        // words and one more.
        let padded = |b: usize| (b as u64).div_ceil(4) * 4 + 4;
        let limit = self.info().max_binding_bytes.min(u64::from(u32::MAX));
        let rows_per_part = ((limit.saturating_sub(8)) / row_bytes as u64) as usize;
        if rows_per_part == 0 {
            return Err(GpuError::TooLarge {
                what: format!("{name}: one row"),
                bytes: padded(row_bytes),
                limit,
            });
        }
        let mut parts = Vec::new();
        for first in (0..rows).step_by(rows_per_part) {
            let part = &bytes[first * row_bytes..(first + rows_per_part).min(rows) * row_bytes];
            let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(name),
                size: padded(part.len()),
                usage: wgpu::BufferUsages::STORAGE,
                mapped_at_creation: true,
            });
            let mut view = buffer
                .get_mapped_range_mut(..)
                .map_err(|e| GpuError::Device(format!("{name}: {e}")))?;
            view.slice(..part.len()).copy_from_slice(part);
            drop(view);
            buffer.unmap();
            parts.push((buffer, first));
        }
        self.check()?;
        Ok(Matrix {
            parts,
            ty,
            rows,
            cols,
            row_bytes,
        })
    }

    fn matmul_pipeline(&self, ty: GgmlType, tokens: u32) -> Result<Arc<Compiled>, GpuError> {
        if !supported(ty) {
            return Err(GpuError::Unsupported { ty });
        }
        let source = || source(ty, tokens).unwrap_or_default();
        self.pipelines.get(
            &self.device,
            &format!("matmul {ty} x{tokens}"),
            (&source, "main", BINDS),
        )
    }

    /// Record `y[t] = m * x[t]` for `tokens` tokens into `encoder`: `x` holds `tokens` rows of
    /// `m.cols` values, `y` gets `tokens` rows of `m.rows`. Each output's bits are the same
    /// whatever `tokens` is (G1).
    pub fn encode_matmul(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        m: &Matrix,
        x: &F32Buffer,
        y: &F32Buffer,
        tokens: usize,
    ) -> Result<(), GpuError> {
        let mut pass = Pass::default();
        self.matmul_into(&mut pass, m, x, y, tokens)?;
        self.record_once(encoder, &pass);
        Ok(())
    }

    /// [`Gpu::encode_matmul`]'s dispatches, added to `pass`.
    pub(crate) fn matmul_into(
        &self,
        pass: &mut Pass,
        m: &Matrix,
        x: &F32Buffer,
        y: &F32Buffer,
        tokens: usize,
    ) -> Result<(), GpuError> {
        let shape = |detail: String| GpuError::Shape {
            what: format!("matmul of a {} x {} {} matrix", m.rows, m.cols, m.ty),
            detail,
        };
        if tokens == 0 {
            return Ok(());
        }
        if x.len() < tokens * m.cols || y.len() < tokens * m.rows {
            return Err(shape(format!(
                "{tokens} tokens need {} inputs and {} outputs; the buffers hold {} and {}",
                tokens * m.cols,
                tokens * m.rows,
                x.len(),
                y.len()
            )));
        }
        let max_dim = self.device.limits().max_compute_workgroups_per_dimension;
        let tile = if tokens == 1 { 1 } else { TOKEN_TILE };
        let token_groups = (tokens as u64).div_ceil(u64::from(tile));
        if token_groups > u64::from(max_dim)
            || (tokens * m.cols.max(m.rows)) as u64 > u64::from(u32::MAX)
        {
            return Err(shape(format!(
                "{tokens} tokens are more than one dispatch holds"
            )));
        }
        let pipeline = self.matmul_pipeline(m.ty, tile)?;
        for (i, (buffer, first)) in m.parts.iter().enumerate() {
            let rows = m.parts.get(i + 1).map_or(m.rows, |p| p.1) - first;
            let groups = (rows as u64).div_ceil(u64::from(2 * ROWS));
            let groups_x = groups.min(u64::from(max_dim));
            let groups_z = groups.div_ceil(groups_x);
            if groups_z > u64::from(max_dim) {
                return Err(shape(format!(
                    "{rows} rows are more than one dispatch holds"
                )));
            }
            let params = Params {
                rows: rows as u32,
                cols: m.cols as u32,
                tokens: tokens as u32,
                row_bytes: m.row_bytes as u32,
                steps: m.cols.div_ceil(256) as u32,
                lanes: (m.cols / 32) as u32,
                groups_x: groups_x as u32,
                row_base: *first as u32,
                out_rows: m.rows as u32,
                _pad: [0; 3],
            };
            pass.push(
                Arc::clone(&pipeline),
                &[buffer, x.raw(), y.raw()],
                bytemuck::bytes_of(&params),
                (groups_x as u32, token_groups as u32, groups_z as u32),
            );
        }
        Ok(())
    }

    /// `m * x[t]` for the `tokens` rows of `x`, read back: one submission, waited for.
    pub fn matmul(&self, m: &Matrix, x: &[f32], tokens: usize) -> Result<Vec<f32>, GpuError> {
        let xb = self.upload(x)?;
        let yb = self.buffer(tokens * m.rows)?;
        let mut encoder = self.encoder();
        self.encode_matmul(&mut encoder, m, &xb, &yb, tokens)?;
        self.submit(encoder);
        self.read(&yb)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_source_is_valid_wgsl() {
        // naga's own front end, without a device: a typo fails here on any machine.
        for ty in supported_types() {
            for tile in [1, TOKEN_TILE] {
                let src = source(ty, tile).unwrap();
                if let Err(e) = naga_check(&src) {
                    panic!("{ty} x{tile}: {e}");
                }
            }
        }
    }

    fn naga_check(src: &str) -> Result<(), String> {
        let module = naga::front::wgsl::parse_str(src).map_err(|e| e.emit_to_string(src))?;
        naga::valid::Validator::new(
            naga::valid::ValidationFlags::all(),
            naga::valid::Capabilities::all(),
        )
        .validate(&module)
        .map_err(|e| format!("{e:?}"))?;
        Ok(())
    }
}
