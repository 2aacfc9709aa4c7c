//! The steps of a layer besides the matrix products: norms, RoPE, the KV store, attention and
//! the element-wise ops (`shaders/ops/`), each a pipeline with its explicit bind group layout,
//! built once per device when first used.

use std::sync::Arc;

use crate::pipelines::{Bind, Compiled};
use crate::program::Pass;
use crate::{Gpu, GpuError};

const REDUCE: &str = include_str!("shaders/ops/reduce.wgsl");
const RMS_NORM: &str = include_str!("shaders/ops/rms_norm.wgsl");
const ELEMENTWISE: &str = include_str!("shaders/ops/elementwise.wgsl");
const ROPE: &str = include_str!("shaders/ops/rope.wgsl");
const KV_STORE: &str = include_str!("shaders/ops/kv_store.wgsl");
const ATTENTION: &str = include_str!("shaders/ops/attention.wgsl");
const READ: &str = include_str!("shaders/ops/read.wgsl");
const DN_PARAMS: &str = include_str!("shaders/ops/dn_params.wgsl");
const DN_GATES: &str = include_str!("shaders/ops/dn_gates.wgsl");
const CONV: &str = include_str!("shaders/ops/conv.wgsl");
const DELTA_RULE: &str = include_str!("shaders/ops/delta_rule.wgsl");

/// An op: its source, entry point and bindings (by binding number).
struct OpDesc {
    source: fn() -> String,
    entry: &'static str,
    binds: &'static [(u32, Bind)],
}

use Bind::{Read as R, Uniform as U, Write as W};

/// Every op, by name.
fn desc(op: Op) -> OpDesc {
    let elementwise = |entry| OpDesc {
        source: || ELEMENTWISE.to_string(),
        entry,
        binds: &[(0, W), (1, R), (2, U)],
    };
    match op {
        Op::RmsNorm => OpDesc {
            source: || format!("{REDUCE}\n{}", RMS_NORM.replace("OUT[", "y[")),
            entry: "main",
            binds: &[(0, W), (1, R), (2, W), (3, U)],
        },
        Op::RmsNormInPlace => OpDesc {
            source: || {
                let body = RMS_NORM
                    .replace(
                        "@group(0) @binding(2) var<storage, read_write> y: array<f32>;",
                        "",
                    )
                    .replace("OUT[", "x[");
                format!("{REDUCE}\n{body}")
            },
            entry: "main",
            binds: &[(0, W), (1, R), (3, U)],
        },
        Op::AddScaled => elementwise("add_scaled"),
        Op::AddBias => elementwise("add_bias"),
        Op::Swiglu => elementwise("swiglu"),
        Op::Geglu => elementwise("geglu"),
        Op::Scale => elementwise("scale"),
        Op::ScaleRows => elementwise("scale_rows"),
        Op::Rope => OpDesc {
            source: || ROPE.to_string(),
            entry: "main",
            binds: &[(0, W), (1, R), (2, U)],
        },
        Op::KvStore => OpDesc {
            source: || KV_STORE.to_string(),
            entry: "main",
            binds: &[(0, R), (1, R), (2, W), (3, W), (4, U)],
        },
        Op::Attention => OpDesc {
            source: || format!("{REDUCE}\n{ATTENTION}"),
            entry: "main",
            binds: &[(0, R), (1, R), (2, R), (3, W), (4, U)],
        },
        Op::TakeQuery => elementwise("take_query"),
        Op::SigmoidGate => elementwise("sigmoid_gate"),
        Op::DnGates => OpDesc {
            source: || format!("{DN_PARAMS}\n{DN_GATES}"),
            entry: "gates",
            binds: &[(0, W), (1, W), (2, R), (3, R), (4, U)],
        },
        Op::Conv => OpDesc {
            source: || format!("{DN_PARAMS}\n{CONV}"),
            entry: "main",
            binds: &[(0, R), (1, R), (2, W), (3, W), (4, U)],
        },
        Op::DeltaRule => OpDesc {
            source: || format!("{DN_PARAMS}\n{DELTA_RULE}"),
            entry: "main",
            binds: &[(0, R), (1, R), (2, R), (3, W), (4, W), (5, U)],
        },
        Op::Read => OpDesc {
            source: || READ.to_string(),
            entry: "main",
            binds: &[(0, R), (1, W), (2, U)],
        },
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Op {
    RmsNorm,
    RmsNormInPlace,
    AddScaled,
    AddBias,
    Swiglu,
    Geglu,
    Scale,
    /// Each row times its position's factor.
    ScaleRows,
    Rope,
    KvStore,
    Attention,
    /// Qwen 3.5's gated attention.
    TakeQuery,
    SigmoidGate,
    /// Qwen 3.5's delta net.
    DnGates,
    Conv,
    DeltaRule,
    /// The bandwidth probe (`bench.rs`).
    Read,
}

impl Op {
    #[cfg(test)]
    const ALL: [Op; 17] = [
        Op::RmsNorm,
        Op::RmsNormInPlace,
        Op::AddScaled,
        Op::AddBias,
        Op::Swiglu,
        Op::Geglu,
        Op::Scale,
        Op::ScaleRows,
        Op::Rope,
        Op::KvStore,
        Op::Attention,
        Op::TakeQuery,
        Op::SigmoidGate,
        Op::DnGates,
        Op::Conv,
        Op::DeltaRule,
        Op::Read,
    ];
}

impl Gpu {
    fn op(&self, op: Op) -> Result<Arc<Compiled>, GpuError> {
        let d = desc(op);
        self.pipelines.get(
            &self.device,
            &format!("{op:?}"),
            (&d.source, d.entry, d.binds),
        )
    }

    /// Add a dispatch of `op` over `groups` workgroups to `pass`: its storage buffers in
    /// binding order and its parameters (the uniform).
    pub(crate) fn dispatch(
        &self,
        pass: &mut Pass,
        op: Op,
        buffers: &[&wgpu::Buffer],
        params: &[u32],
        groups: (u32, u32, u32),
    ) -> Result<(), GpuError> {
        pass.push(self.op(op)?, buffers, bytemuck::cast_slice(params), groups);
        Ok(())
    }

    /// The grid of an element-wise op over `n` elements, 256 per workgroup.
    pub(crate) fn elementwise_groups(n: usize) -> (u32, u32, u32) {
        let groups = n.div_ceil(256).max(1) as u32;
        (groups.min(65535), groups.div_ceil(65535), 1)
    }

    /// The grid of a row op (one workgroup per row).
    pub(crate) fn row_groups(rows: usize) -> (u32, u32, u32) {
        let rows = rows.max(1) as u32;
        (rows.min(65535), rows.div_ceil(65535), 1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_is_valid_wgsl() {
        for op in Op::ALL {
            let src = (desc(op).source)();
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{op:?}: {}", e.emit_to_string(&src)));
            naga::valid::Validator::new(
                naga::valid::ValidationFlags::all(),
                naga::valid::Capabilities::all(),
            )
            .validate(&module)
            .unwrap_or_else(|e| panic!("{op:?}: {e:?}"));
        }
    }
}
