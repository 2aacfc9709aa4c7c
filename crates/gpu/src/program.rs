//! A pass's dispatches, recorded as one compute pass. Recording is the host's cost per token:
//! a uniform buffer and a bind group made for every dispatch cost about 18 us each on
//! lavapipe's host side, 8 ms a SmolLM2 token. So a pass's list of dispatches is kept as a
//! [`Program`]: its bind groups made once, every dispatch's parameters in one slot of one
//! uniform buffer, written at once; the next pass of the same shape (a decode step: the same
//! kernels on the same buffers, other positions) only rewrites the parameters.

use std::sync::Arc;

use crate::pipelines::{Bind, Compiled};
use crate::Gpu;

/// The most bytes of parameters one dispatch takes.
const MAX_PARAMS: usize = 64;

/// One dispatch: its kernel, its storage buffers in binding order, its parameters, its grid.
pub(crate) struct Dispatch {
    kernel: Arc<Compiled>,
    buffers: Vec<wgpu::Buffer>,
    params: [u8; MAX_PARAMS],
    params_len: usize,
    groups: (u32, u32, u32),
}

/// The dispatches of a pass, in order.
#[derive(Default)]
pub(crate) struct Pass {
    dispatches: Vec<Dispatch>,
}

impl Pass {
    pub(crate) fn push(
        &mut self,
        kernel: Arc<Compiled>,
        buffers: &[&wgpu::Buffer],
        params: &[u8],
        groups: (u32, u32, u32),
    ) {
        assert!(
            params.len() <= MAX_PARAMS,
            "a kernel's parameters outgrew MAX_PARAMS"
        );
        let mut p = [0u8; MAX_PARAMS];
        p[..params.len()].copy_from_slice(params);
        self.dispatches.push(Dispatch {
            kernel,
            buffers: buffers.iter().map(|&b| b.clone()).collect(),
            params: p,
            params_len: params.len(),
            groups,
        });
    }
}

/// A pass's bind groups, each binding its slot of one uniform buffer.
pub(crate) struct Program {
    steps: Vec<(Arc<Compiled>, Vec<wgpu::Buffer>, wgpu::BindGroup)>,
    uniform: wgpu::Buffer,
    slot: usize,
    staging: Vec<u8>,
}

impl Program {
    /// Whether it was built for these dispatches: the same kernels on the same buffers.
    fn fits(&self, pass: &Pass) -> bool {
        self.steps.len() == pass.dispatches.len()
            && self
                .steps
                .iter()
                .zip(&pass.dispatches)
                .all(|((k, b, _), d)| Arc::ptr_eq(k, &d.kernel) && *b == d.buffers)
    }
}

impl Gpu {
    fn build(&self, pass: &Pass) -> Program {
        let align = self.device.limits().min_uniform_buffer_offset_alignment as usize;
        let slot = MAX_PARAMS.div_ceil(align) * align;
        let uniform = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("pass parameters"),
            size: (slot * pass.dispatches.len().max(1)) as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let steps = pass
            .dispatches
            .iter()
            .enumerate()
            .map(|(i, d)| {
                let mut next = d.buffers.iter();
                let entries: Vec<wgpu::BindGroupEntry> = d
                    .kernel
                    .binds
                    .iter()
                    .map(|&(binding, kind)| wgpu::BindGroupEntry {
                        binding,
                        resource: match kind {
                            Bind::Uniform => wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                                buffer: &uniform,
                                offset: (i * slot) as u64,
                                size: wgpu::BufferSize::new(MAX_PARAMS as u64),
                            }),
                            _ => next
                                .next()
                                .expect("a buffer for every storage binding")
                                .as_entire_binding(),
                        },
                    })
                    .collect();
                let bind = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: None,
                    layout: &d.kernel.layout,
                    entries: &entries,
                });
                (Arc::clone(&d.kernel), d.buffers.clone(), bind)
            })
            .collect();
        Program {
            steps,
            uniform,
            slot,
            staging: vec![0; slot * pass.dispatches.len().max(1)],
        }
    }

    /// Record `pass` into `encoder` as one compute pass, with `program`'s bind groups where it
    /// was built for the same dispatches (else it is rebuilt for them).
    pub(crate) fn record(
        &self,
        encoder: &mut wgpu::CommandEncoder,
        pass: &Pass,
        program: &mut Option<Program>,
    ) {
        if !program.as_ref().is_some_and(|p| p.fits(pass)) {
            *program = Some(self.build(pass));
        }
        let Some(p) = program.as_mut() else { return };
        for (i, d) in pass.dispatches.iter().enumerate() {
            p.staging[i * p.slot..i * p.slot + d.params_len]
                .copy_from_slice(&d.params[..d.params_len]);
        }
        self.queue.write_buffer(&p.uniform, 0, &p.staging);
        let mut cp = encoder.begin_compute_pass(&wgpu::ComputePassDescriptor {
            label: None,
            timestamp_writes: None,
        });
        for ((kernel, _, bind), d) in p.steps.iter().zip(&pass.dispatches) {
            cp.set_pipeline(&kernel.pipeline);
            cp.set_bind_group(0, bind, &[]);
            cp.dispatch_workgroups(d.groups.0, d.groups.1, d.groups.2);
        }
    }

    /// Record `pass` once (its bind groups made for it and dropped).
    pub(crate) fn record_once(&self, encoder: &mut wgpu::CommandEncoder, pass: &Pass) {
        self.record(encoder, pass, &mut None);
    }
}
