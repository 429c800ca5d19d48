//! [`Recorder`]: the dispatches queued during a step, encoded into ONE
//! command buffer and ONE submission, reusing across steps whatever does
//! not change between them.
//!
//! A decode step is the same few hundred dispatches over the same buffers
//! each time (the activation pool hands out the same buffers, weights never
//! move), with only the uniform parameters' values changing. So:
//! - every dispatch's parameters go into one persistent uniform buffer,
//!   rewritten with one `write_buffer` per step (dispatch `i` of a step
//!   always lands at the same offset);
//! - bind groups are cached by (pipeline, uniform offset, bindings), so a
//!   step like the previous one creates none;
//! - an optional copy out (the step's result, for readback) is recorded
//!   into the same command buffer.
//!
//! Bind groups keep their buffers alive: entries unused for
//! [`EVICT_AFTER`] submissions are dropped once the cache outgrows a step.

use std::collections::HashMap;
use std::num::NonZeroU64;

use super::backend::Dispatch;
use super::context::GpuContext;
use super::counters::{Counters, Event};
use super::GpuError;

/// Submissions after which an unused bind group is dropped.
const EVICT_AFTER: u64 = 8;
/// Smallest uniform buffer (bytes).
const MIN_UNIFORM: u64 = 64 << 10;

/// A bind group's identity: what it binds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct BindKey {
    pipeline: wgpu::ComputePipeline,
    /// Byte offset and size of the parameters in the uniform buffer.
    params: (u64, u64),
    /// (buffer, offset, size) of bindings 1...
    binds: Vec<(wgpu::Buffer, u64, Option<NonZeroU64>)>,
}

#[derive(Debug)]
struct Cached {
    group: wgpu::BindGroup,
    /// The submission that last used it.
    used: u64,
}

/// A copy recorded after a step's dispatches, in the same submission.
#[derive(Debug, Clone)]
pub struct CopyOut {
    /// Source buffer.
    pub src: wgpu::Buffer,
    /// First byte of the source (a multiple of 4).
    pub src_offset: u64,
    /// Destination (a mappable staging buffer).
    pub dst: wgpu::Buffer,
    /// Bytes (a multiple of 4).
    pub size: u64,
}

/// Queued dispatches and what is reused between steps.
#[derive(Debug, Default)]
pub struct Recorder {
    pending: Vec<Dispatch>,
    /// The step's parameters, packed (reused allocation).
    params: Vec<u8>,
    offsets: Vec<u64>,
    uniform: Option<wgpu::Buffer>,
    groups: HashMap<BindKey, Cached>,
    /// Submissions so far.
    submits: u64,
}

impl Recorder {
    /// Queues `d` for the next [`Recorder::flush`].
    pub fn push(&mut self, d: Dispatch) {
        self.pending.push(d);
    }

    /// Submissions so far (a step counter: results computed before the
    /// last submission can no longer be trusted to be current).
    pub fn submits(&self) -> u64 {
        self.submits
    }

    /// Encodes every queued dispatch, then `copy` if any, into one command
    /// buffer and submits it. Nothing queued and no copy: does nothing.
    pub fn flush(
        &mut self,
        ctx: &GpuContext,
        counters: &Counters,
        copy: Option<&CopyOut>,
    ) -> Result<(), GpuError> {
        if self.pending.is_empty() && copy.is_none() {
            return Ok(());
        }
        self.pack_params(ctx);
        let uniform = self.uniform_for(ctx, counters);
        if !self.params.is_empty() {
            ctx.queue.write_buffer(&uniform, 0, &self.params);
            counters.add(Event::Upload);
        }
        let groups = self.bind_groups(ctx, counters, &uniform);
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("step"),
            });
        if !self.pending.is_empty() {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("step"),
                timestamp_writes: None,
            });
            for (d, g) in self.pending.iter().zip(&groups) {
                pass.set_pipeline(&d.pipeline);
                pass.set_bind_group(0, g, &[]);
                pass.dispatch_workgroups(d.groups.0, d.groups.1, 1);
            }
        }
        counters.add(Event::Dispatches(self.pending.len() as u64));
        if let Some(c) = copy {
            enc.copy_buffer_to_buffer(&c.src, c.src_offset, &c.dst, 0, c.size);
        }
        ctx.queue.submit([enc.finish()]);
        counters.add(Event::Submit);
        self.submits += 1;
        self.evict();
        self.pending.clear();
        ctx.errors.check("a submission")
    }

    /// Packs every pending dispatch's parameters into `self.params`, each
    /// at an offset aligned for a uniform binding.
    fn pack_params(&mut self, ctx: &GpuContext) {
        let align = u64::from(ctx.caps.uniform_offset_alignment.max(16));
        self.params.clear();
        self.offsets.clear();
        for d in &self.pending {
            let at = (self.params.len() as u64).div_ceil(align) * align;
            self.params.resize(at as usize, 0);
            self.params
                .extend_from_slice(bytemuck::cast_slice(&d.params));
            let padded = self.params.len().div_ceil(16) * 16;
            self.params.resize(padded, 0);
            self.offsets.push(at);
        }
    }

    /// The uniform buffer, grown (and the bind groups over the old one
    /// dropped) when the step's parameters outgrow it.
    fn uniform_for(&mut self, ctx: &GpuContext, counters: &Counters) -> wgpu::Buffer {
        let need = (self.params.len() as u64).max(16);
        if let Some(u) = &self.uniform {
            if u.size() >= need {
                return u.clone();
            }
        }
        self.groups.clear();
        let u = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("params"),
            size: need.next_power_of_two().max(MIN_UNIFORM),
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        counters.add(Event::Buffer);
        self.uniform = Some(u.clone());
        u
    }

    /// The bind group of every pending dispatch, from the cache or new.
    fn bind_groups(
        &mut self,
        ctx: &GpuContext,
        counters: &Counters,
        uniform: &wgpu::Buffer,
    ) -> Vec<wgpu::BindGroup> {
        let now = self.submits;
        let mut out = Vec::with_capacity(self.pending.len());
        for (d, &at) in self.pending.iter().zip(&self.offsets) {
            let size = (d.params.len() as u64 * 4).div_ceil(16) * 16;
            let key = BindKey {
                pipeline: (*d.pipeline).clone(),
                params: (at, size),
                binds: d
                    .binds
                    .iter()
                    .map(|b| (b.buf.clone(), b.offset, b.size))
                    .collect(),
            };
            let entry = self.groups.entry(key).or_insert_with(|| {
                counters.add(Event::BindGroup);
                Cached {
                    group: bind_group(&ctx.device, d, uniform, at, size),
                    used: now,
                }
            });
            entry.used = now;
            out.push(entry.group.clone());
        }
        out
    }

    /// Drops bind groups unused for [`EVICT_AFTER`] submissions once the
    /// cache holds more than two steps' worth.
    fn evict(&mut self) {
        if self.groups.len() <= 2 * self.pending.len() + 256 {
            return;
        }
        let now = self.submits;
        self.groups.retain(|_, c| c.used + EVICT_AFTER >= now);
    }
}

/// The bind group of `d`: its params at `at` of `uniform`, then its buffers.
fn bind_group(
    dev: &wgpu::Device,
    d: &Dispatch,
    uniform: &wgpu::Buffer,
    at: u64,
    size: u64,
) -> wgpu::BindGroup {
    let mut entries = vec![wgpu::BindGroupEntry {
        binding: 0,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: uniform,
            offset: at,
            size: NonZeroU64::new(size),
        }),
    }];
    for (i, b) in d.binds.iter().enumerate() {
        entries.push(wgpu::BindGroupEntry {
            binding: i as u32 + 1,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: &b.buf,
                offset: b.offset,
                size: b.size,
            }),
        });
    }
    dev.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &d.pipeline.get_bind_group_layout(0),
        entries: &entries,
    })
}
