//! Weight matrices on the GPU, read in place, and the fused dequantize + matrix-vector kernels
//! over them (one per ggml format, `shaders/formats/`), for one token or a tile of tokens.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use synapse_gguf::GgmlType;

use crate::buffer::F32Buffer;
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

/// The compiled matmul kernels of one device, built when first asked for.
pub(crate) struct Kernels {
    layout: wgpu::BindGroupLayout,
    pipeline_layout: wgpu::PipelineLayout,
    cache: Mutex<HashMap<(GgmlType, u32), Arc<wgpu::ComputePipeline>>>,
}

impl Kernels {
    pub(crate) fn new(device: &wgpu::Device) -> Kernels {
        let storage = |binding, read_only| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: wgpu::BufferBindingType::Storage { read_only },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        };
        let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("matmul"),
            entries: &[
                storage(0, true),
                storage(1, true),
                storage(2, false),
                wgpu::BindGroupLayoutEntry {
                    binding: 3,
                    visibility: wgpu::ShaderStages::COMPUTE,
                    ty: wgpu::BindingType::Buffer {
                        ty: wgpu::BufferBindingType::Uniform,
                        has_dynamic_offset: false,
                        min_binding_size: None,
                    },
                    count: None,
                },
            ],
        });
        let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("matmul"),
            bind_group_layouts: &[Some(&layout)],
            immediate_size: 0,
        });
        Kernels {
            layout,
            pipeline_layout,
            cache: Mutex::new(HashMap::new()),
        }
    }
}

/// A weight matrix on the GPU: the file's bytes, row-major, `rows` rows of `cols` values.
#[derive(Debug)]
pub struct Matrix {
    buffer: wgpu::Buffer,
    pub ty: GgmlType,
    pub rows: usize,
    pub cols: usize,
    row_bytes: usize,
}

impl Matrix {
    /// The bytes it occupies on the GPU.
    pub fn bytes(&self) -> u64 {
        self.buffer.size()
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
    w_offset: u32,
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
        // Word reads may look one word past the last byte; the size is a whole number of words.
        let size = (bytes.len() as u64).div_ceil(4) * 4 + 4;
        let limit = self.info().max_binding_bytes.min(u64::from(u32::MAX));
        if size > limit {
            return Err(GpuError::TooLarge {
                what: name.to_string(),
                bytes: size,
                limit,
            });
        }
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(name),
            size,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: true,
        });
        let mut view = buffer
            .get_mapped_range_mut(..)
            .map_err(|e| GpuError::Device(format!("{name}: {e}")))?;
        view.slice(..bytes.len()).copy_from_slice(bytes);
        drop(view);
        buffer.unmap();
        self.check()?;
        Ok(Matrix {
            buffer,
            ty,
            rows,
            cols,
            row_bytes,
        })
    }

    fn matmul_pipeline(
        &self,
        ty: GgmlType,
        tokens: u32,
    ) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        let k = &self.kernels;
        let mut cache = k.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = cache.get(&(ty, tokens)) {
            return Ok(Arc::clone(p));
        }
        let src = source(ty, tokens).ok_or(GpuError::Unsupported { ty })?;
        let scope = self.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let label = format!("matmul {ty} x{tokens}");
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(&label),
                source: wgpu::ShaderSource::Wgsl(src.into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(&label),
                layout: Some(&k.pipeline_layout),
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        if let Some(e) = pollster::block_on(scope.pop()) {
            return Err(GpuError::Validation(format!("{label}: {e}")));
        }
        let pipeline = Arc::new(pipeline);
        cache.insert((ty, tokens), Arc::clone(&pipeline));
        Ok(pipeline)
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
        let groups = (m.rows as u64).div_ceil(u64::from(2 * ROWS));
        let groups_x = groups.min(u64::from(max_dim));
        let groups_z = groups.div_ceil(groups_x);
        if token_groups > u64::from(max_dim)
            || groups_z > u64::from(max_dim)
            || (tokens * m.cols.max(m.rows)) as u64 > u64::from(u32::MAX)
        {
            return Err(shape(format!(
                "{tokens} tokens are more than one dispatch holds"
            )));
        }
        let params = Params {
            rows: m.rows as u32,
            cols: m.cols as u32,
            tokens: tokens as u32,
            row_bytes: m.row_bytes as u32,
            steps: m.cols.div_ceil(256) as u32,
            lanes: (m.cols / 32) as u32,
            groups_x: groups_x as u32,
            w_offset: 0,
        };
        let pipeline = self.matmul_pipeline(m.ty, tile)?;
        let uniform = self.uniform(bytemuck::bytes_of(&params));
        let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("matmul"),
            layout: &self.kernels.layout,
            entries: &[
                entry(0, &m.buffer),
                entry(1, x.raw()),
                entry(2, y.raw()),
                entry(3, &uniform),
            ],
        });
        let mut pass = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: Some("matmul"),
            timestamp_writes: None,
        });
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bind, &[]);
        pass.dispatch_workgroups(groups_x as u32, token_groups as u32, groups_z as u32);
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

fn entry(binding: u32, buffer: &wgpu::Buffer) -> wgpu::BindGroupEntry<'_> {
    wgpu::BindGroupEntry {
        binding,
        resource: buffer.as_entire_binding(),
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
