//! Opening a GPU: the adapter, its device and queue, and what it offers.

use std::sync::{Arc, Mutex};

use crate::GpuError;

/// The native backends: Vulkan (Linux, Windows, Android), Metal (Apple), DX12 (Windows).
const BACKENDS: wgpu::Backends = wgpu::Backends::VULKAN
    .union(wgpu::Backends::METAL)
    .union(wgpu::Backends::DX12);

/// Which adapter to open. The binary fills this from its flags; the library reads no
/// environment variable of its own (wgpu's loaders read theirs, such as `VK_DRIVER_FILES`).
#[derive(Debug, Clone, Default)]
pub struct GpuOptions {
    /// Open the first adapter whose name contains this (case-insensitive); else the first
    /// discrete GPU, then integrated, then any other (a CPU driver such as lavapipe last).
    pub adapter: Option<String>,
}

/// What the opened adapter is and offers.
#[derive(Debug, Clone)]
pub struct GpuInfo {
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    /// The subgroup widths the adapter may use (lavapipe: 4 to 16 lanes, NVIDIA 32, AMD 32
    /// or 64); the kernels assume none of them.
    pub subgroup_sizes: (u32, u32),
    pub subgroups: bool,
    pub shader_f16: bool,
    pub timestamps: bool,
    /// The largest storage buffer one binding may hold: a weight matrix must fit in it.
    pub max_binding_bytes: u64,
}

impl std::fmt::Display for GpuInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, {}, driver {}), subgroups {}..{} lanes{}{}, bindings up to {} MiB",
            self.name,
            self.backend,
            self.device_type,
            self.driver,
            self.subgroup_sizes.0,
            self.subgroup_sizes.1,
            if self.subgroups { "" } else { " (not used)" },
            if self.shader_f16 { ", f16" } else { "" },
            self.max_binding_bytes >> 20,
        )
    }
}

/// An open GPU: the device, its queue, and the kernels compiled for it.
pub struct Gpu {
    pub(crate) device: wgpu::Device,
    pub(crate) queue: wgpu::Queue,
    info: GpuInfo,
    /// The first error wgpu reported outside a call's own checks (validation, out of memory,
    /// device lost), which the next call returns instead of panicking as wgpu's default does.
    errors: Arc<Mutex<Option<String>>>,
    pub(crate) pipelines: crate::pipelines::Pipelines,
}

impl Gpu {
    /// Open an adapter as `options` says.
    pub fn new(options: &GpuOptions) -> Result<Gpu, GpuError> {
        let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
        desc.backends = BACKENDS;
        let instance = wgpu::Instance::new(desc);
        let adapters = pollster::block_on(instance.enumerate_adapters(BACKENDS));
        let names = || {
            let list: Vec<String> = adapters
                .iter()
                .map(|a| {
                    let i = a.get_info();
                    format!("{} ({:?})", i.name, i.backend)
                })
                .collect();
            if list.is_empty() {
                "none".to_string()
            } else {
                list.join(", ")
            }
        };
        let chosen = match &options.adapter {
            Some(want) => {
                let want_lc = want.to_lowercase();
                adapters
                    .iter()
                    .find(|a| a.get_info().name.to_lowercase().contains(&want_lc))
                    .ok_or_else(|| GpuError::AdapterNotFound {
                        wanted: want.clone(),
                        found: names(),
                    })?
            }
            None => {
                let rank = |a: &wgpu::Adapter| match a.get_info().device_type {
                    wgpu::DeviceType::DiscreteGpu => 0,
                    wgpu::DeviceType::IntegratedGpu => 1,
                    wgpu::DeviceType::VirtualGpu => 2,
                    wgpu::DeviceType::Other => 3,
                    wgpu::DeviceType::Cpu => 4,
                };
                adapters
                    .iter()
                    .min_by_key(|a| rank(a))
                    .ok_or_else(|| GpuError::NoAdapter {
                        tried: "Vulkan, Metal and DX12 adapters".to_string(),
                    })?
            }
        };
        Gpu::open(chosen)
    }

    fn open(adapter: &wgpu::Adapter) -> Result<Gpu, GpuError> {
        let a = adapter.get_info();
        let offered = adapter.features();
        let wanted = wgpu::Features::SUBGROUP
            | wgpu::Features::SHADER_F16
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS;
        let features = offered & wanted;
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("synapse"),
            required_features: features,
            required_limits: limits.clone(),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        }))
        .map_err(|e| GpuError::Device(e.to_string()))?;
        let errors = Arc::new(Mutex::new(None));
        let sink = Arc::clone(&errors);
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            let mut first = sink.lock().unwrap_or_else(|p| p.into_inner());
            first.get_or_insert_with(|| e.to_string());
        }));
        let info = GpuInfo {
            name: a.name.clone(),
            backend: format!("{:?}", a.backend),
            device_type: format!("{:?}", a.device_type),
            driver: if a.driver_info.is_empty() {
                a.driver.clone()
            } else {
                format!("{} {}", a.driver, a.driver_info)
            },
            subgroup_sizes: (a.subgroup_min_size, a.subgroup_max_size),
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            shader_f16: features.contains(wgpu::Features::SHADER_F16),
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            max_binding_bytes: limits.max_storage_buffer_binding_size,
        };
        Ok(Gpu {
            device,
            queue,
            info,
            errors,
            pipelines: Default::default(),
        })
    }

    /// What this GPU is.
    pub fn info(&self) -> &GpuInfo {
        &self.info
    }

    /// The first error wgpu reported since the last check, as this crate's error.
    pub(crate) fn check(&self) -> Result<(), GpuError> {
        let mut first = self.errors.lock().unwrap_or_else(|p| p.into_inner());
        match first.take() {
            Some(e) => Err(GpuError::Validation(e)),
            None => Ok(()),
        }
    }

    /// Wait until the queue's work so far has finished.
    pub fn finish(&self) -> Result<(), GpuError> {
        self.device
            .poll(wgpu::PollType::Wait {
                submission_index: None,
                timeout: None,
            })
            .map_err(|e| GpuError::Device(e.to_string()))?;
        self.check()
    }
}
