//! Compute pipelines, compiled once per device when first used: the one place that turns WGSL
//! and a list of bindings into a pipeline and its bind group layout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::GpuError;

/// What one binding of a kernel is.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Bind {
    Read,
    Write,
    Uniform,
}

pub(crate) struct Compiled {
    pub pipeline: wgpu::ComputePipeline,
    pub layout: wgpu::BindGroupLayout,
    /// Its bindings, by binding number.
    pub binds: &'static [(u32, Bind)],
}

/// The pipelines a device has compiled, by name.
#[derive(Default)]
pub(crate) struct Pipelines {
    cache: Mutex<HashMap<String, Arc<Compiled>>>,
}

impl Pipelines {
    /// The pipeline named `name`, compiled from `source()` on first use.
    pub fn get(
        &self,
        device: &wgpu::Device,
        name: &str,
        (source, entry, binds): (&dyn Fn() -> String, &str, &'static [(u32, Bind)]),
    ) -> Result<Arc<Compiled>, GpuError> {
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(c) = cache.get(name) {
            return Ok(Arc::clone(c));
        }
        let c = Arc::new(compile(device, name, &source(), entry, binds)?);
        cache.insert(name.to_string(), Arc::clone(&c));
        Ok(c)
    }
}

fn compile(
    device: &wgpu::Device,
    label: &str,
    source: &str,
    entry: &str,
    binds: &'static [(u32, Bind)],
) -> Result<Compiled, GpuError> {
    let entries: Vec<wgpu::BindGroupLayoutEntry> = binds
        .iter()
        .map(|&(binding, kind)| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::COMPUTE,
            ty: wgpu::BindingType::Buffer {
                ty: match kind {
                    Bind::Read => wgpu::BufferBindingType::Storage { read_only: true },
                    Bind::Write => wgpu::BufferBindingType::Storage { read_only: false },
                    Bind::Uniform => wgpu::BufferBindingType::Uniform,
                },
                has_dynamic_offset: false,
                min_binding_size: None,
            },
            count: None,
        })
        .collect();
    let scope = device.push_error_scope(wgpu::ErrorFilter::Validation);
    let layout = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
        label: Some(label),
        entries: &entries,
    });
    let pipeline_layout = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
        label: Some(label),
        bind_group_layouts: &[Some(&layout)],
        immediate_size: 0,
    });
    let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some(label),
        source: wgpu::ShaderSource::Wgsl(source.into()),
    });
    let pipeline = device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some(label),
        layout: Some(&pipeline_layout),
        module: &module,
        entry_point: Some(entry),
        compilation_options: Default::default(),
        cache: None,
    });
    if let Some(e) = pollster::block_on(scope.pop()) {
        return Err(GpuError::Validation(format!("{label}: {e}")));
    }
    Ok(Compiled {
        pipeline,
        layout,
        binds,
    })
}
