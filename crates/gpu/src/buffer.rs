//! Float buffers on the GPU (activations, outputs) and the round trips to the host.

use wgpu::util::DeviceExt;

use crate::{Gpu, GpuError};

/// A storage buffer of `len` f32 values.
#[derive(Debug)]
pub struct F32Buffer {
    buffer: wgpu::Buffer,
    len: usize,
}

impl F32Buffer {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        &self.buffer
    }
}

const USAGE: wgpu::BufferUsages = wgpu::BufferUsages::STORAGE
    .union(wgpu::BufferUsages::COPY_SRC)
    .union(wgpu::BufferUsages::COPY_DST);

impl Gpu {
    /// A zeroed buffer of `len` values.
    pub fn buffer(&self, len: usize) -> Result<F32Buffer, GpuError> {
        let buffer = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: 4 * len.max(1) as u64,
            usage: USAGE,
            mapped_at_creation: false,
        });
        self.check()?;
        Ok(F32Buffer { buffer, len })
    }

    /// A buffer holding `data`.
    pub fn upload(&self, data: &[f32]) -> Result<F32Buffer, GpuError> {
        let contents: &[u8] = if data.is_empty() {
            &[0; 4]
        } else {
            bytemuck::cast_slice(data)
        };
        let buffer = self
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: None,
                contents,
                usage: USAGE,
            });
        self.check()?;
        Ok(F32Buffer {
            buffer,
            len: data.len(),
        })
    }

    /// Overwrite the start of `dst` with `data`.
    pub fn write(&self, dst: &F32Buffer, data: &[f32]) -> Result<(), GpuError> {
        if data.len() > dst.len {
            return Err(GpuError::Shape {
                what: "a buffer write".into(),
                detail: format!("{} values into a buffer of {}", data.len(), dst.len),
            });
        }
        if !data.is_empty() {
            self.queue
                .write_buffer(&dst.buffer, 0, bytemuck::cast_slice(data));
        }
        self.check()
    }

    pub fn encoder(&self) -> wgpu::CommandEncoder {
        self.device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
    }

    pub fn submit(&self, encoder: wgpu::CommandEncoder) {
        self.queue.submit([encoder.finish()]);
    }

    /// Wait for the queue and copy a buffer's values back.
    pub fn read(&self, src: &F32Buffer) -> Result<Vec<f32>, GpuError> {
        let staging = self.staging(src.len);
        let mut values = vec![0.0; src.len];
        self.read_into(self.encoder(), src, &staging, &mut values)?;
        Ok(values)
    }

    /// A buffer the host can map, for reading back up to `len` values.
    pub(crate) fn staging(&self, len: usize) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: 4 * len.max(1) as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Finish `encoder` with a copy of the first `out.len()` values of `src` into `staging`,
    /// submit it, wait, and copy them into `out`: the one submission and the one copy a pass's
    /// logits need.
    pub(crate) fn read_into(
        &self,
        mut encoder: wgpu::CommandEncoder,
        src: &F32Buffer,
        staging: &wgpu::Buffer,
        out: &mut [f32],
    ) -> Result<(), GpuError> {
        let size = 4 * out.len() as u64;
        if out.len() > src.len || size > staging.size() {
            return Err(GpuError::Shape {
                what: "a readback".into(),
                detail: format!("{} values from a buffer of {}", out.len(), src.len),
            });
        }
        if out.is_empty() {
            self.submit(encoder);
            return self.finish();
        }
        encoder.copy_buffer_to_buffer(&src.buffer, 0, staging, 0, size);
        self.submit(encoder);
        let (tx, rx) = std::sync::mpsc::channel();
        staging
            .slice(..size)
            .map_async(wgpu::MapMode::Read, move |r| {
                let _ = tx.send(r);
            });
        self.finish()?;
        match rx.recv() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(GpuError::Readback(e.to_string())),
            Err(_) => return Err(GpuError::Readback("the map callback never ran".into())),
        }
        let view = staging
            .get_mapped_range(..size)
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        out.copy_from_slice(bytemuck::cast_slice(&view));
        drop(view);
        staging.unmap();
        Ok(())
    }
}
