//! The GPU backend: wgpu (Vulkan, Metal, DX12) and WGSL kernels that read ggml's blocks where
//! they lie, with the engine's contracts: every output's arithmetic is fixed by its own row and
//! token (a fixed split of each dot product and one fixed reduction tree, no float atomics),
//! so batch size, tile and subgroup width never change a bit.
//!
//! Activations stay f32 and each lane decodes its weights to f32 before fused multiply-adds:
//! no activation quantization error, at no cost that matters when the weights' bytes bound
//! the time (docs/PERF.md, GPU).

pub mod bench;
mod buffer;
mod device;
mod error;
mod layers;
mod matmul;
mod model;
mod ops;
mod pipelines;
mod program;
mod shape;
mod state;

pub use buffer::F32Buffer;
pub use device::{Gpu, GpuInfo, GpuOptions};
pub use error::GpuError;
pub use matmul::{supported, supported_types, Matrix, TOKEN_TILE};
pub use model::GpuDecoder;
