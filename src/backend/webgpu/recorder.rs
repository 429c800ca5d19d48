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
//! [`EVICT_AFTER`] steps are dropped once the cache outgrows a step.
//!
//! A step may be submitted in pieces (the backend flushes every few
//! hundred dispatches so the GPU starts while the host records the rest):
//! a step's pieces take consecutive ranges of the uniform buffer, and only
//! the last piece carries the copy out.
//!
//! Browsers reject a dispatch that binds overlapping ranges of one buffer
//! when either is writable (an in-place op: `x` and `out` the same), which
//! native wgpu allows. On the browser target the earlier binding of each
//! such pair (the input) reads a snapshot of the range, copied just before
//! the dispatch: the kernel reads the snapshot and writes the original, the
//! out-of-place result. Snapshot buffers are kept per range, so a step like
//! the previous one still creates nothing.

use std::collections::HashMap;
use std::num::NonZeroU64;

use super::backend::{Bind, Dispatch};
use super::caps::ShaderTarget;
use super::context::GpuContext;
use super::counters::{Counters, Event};
use super::profile::Profiler;
use super::GpuError;

/// Steps after which an unused bind group is dropped.
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
    /// The step that last used it.
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
    /// Snapshot buffers of aliased ranges, by (buffer, offset, size).
    snapshots: HashMap<(wgpu::Buffer, u64, u64), wgpu::Buffer>,
    /// Per pending dispatch, the copies to make before it.
    copies: Vec<Vec<Snapshot>>,
    /// Submissions so far.
    submits: u64,
    /// Steps ended so far (a step may be submitted in pieces).
    steps: u64,
    /// Where the next piece's parameters start in the uniform buffer: a
    /// step's pieces take consecutive ranges, so that no piece overwrites
    /// parameters an earlier one, maybe still running, reads.
    step_base: u64,
}

/// A copy of a bound range into its snapshot buffer.
#[derive(Debug, Clone)]
struct Snapshot {
    src: wgpu::Buffer,
    offset: u64,
    size: u64,
    dst: wgpu::Buffer,
}

impl Recorder {
    /// Queues `d` for the next [`Recorder::flush`].
    pub fn push(&mut self, d: Dispatch) {
        self.pending.push(d);
    }

    /// Dispatches queued since the last flush.
    pub fn pending(&self) -> usize {
        self.pending.len()
    }

    /// Steps ended so far ([`Recorder::flush`] with `end_step`).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    /// Submissions so far (a step counter: results computed before the
    /// last submission can no longer be trusted to be current).
    pub fn submits(&self) -> u64 {
        self.submits
    }

    /// Encodes every queued dispatch, then `copy` if any, into one command
    /// buffer and submits it. Nothing queued and no copy: does nothing.
    /// `end_step`: the last piece of the step (the next flush starts a new
    /// step, whose parameters start again at the uniform buffer's start).
    ///
    /// With a profiler, its timestamps go around every dispatch.
    pub fn flush(
        &mut self,
        ctx: &GpuContext,
        counters: &Counters,
        copy: Option<&CopyOut>,
        end_step: bool,
        prof: Option<&mut Profiler>,
    ) -> Result<(), GpuError> {
        let r = if self.pending.is_empty() && copy.is_none() {
            Ok(())
        } else {
            self.submit(ctx, counters, copy, prof)
        };
        if end_step {
            self.steps += 1;
            self.step_base = 0;
        }
        r
    }

    /// [`Recorder::flush`]'s encoding and submission.
    fn submit(
        &mut self,
        ctx: &GpuContext,
        counters: &Counters,
        copy: Option<&CopyOut>,
        mut prof: Option<&mut Profiler>,
    ) -> Result<(), GpuError> {
        self.unalias(ctx, counters);
        self.pack_params(ctx);
        let uniform = self.uniform_for(ctx, counters);
        if !self.params.is_empty() {
            ctx.queue
                .write_buffer(&uniform, self.step_base, &self.params);
            counters.add(Event::Upload);
        }
        let groups = self.bind_groups(ctx, counters, &uniform);
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("step"),
            });
        let mut stamps = prof
            .as_deref_mut()
            .and_then(|p| p.begin(&ctx.device, self.pending.len()));
        // One pass, split only where a snapshot must be copied first.
        let mut i = 0;
        while i < self.pending.len() {
            for c in &self.copies[i] {
                enc.copy_buffer_to_buffer(&c.src, c.offset, &c.dst, 0, c.size);
            }
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("step"),
                timestamp_writes: None,
            });
            if let (Some(st), 0) = (stamps.as_mut(), i) {
                st.write(&mut pass);
            }
            loop {
                let d = &self.pending[i];
                pass.set_pipeline(&d.pipeline);
                pass.set_bind_group(0, &groups[i], &[]);
                pass.dispatch_workgroups(d.groups.0, d.groups.1, 1);
                if let Some(st) = stamps.as_mut() {
                    st.write(&mut pass);
                }
                i += 1;
                if i == self.pending.len() || !self.copies[i].is_empty() {
                    break;
                }
            }
        }
        let written = stamps.map_or(0, |st| st.next);
        if let Some(p) = prof {
            let pipelines: Vec<&wgpu::ComputePipeline> =
                self.pending.iter().map(|d| &*d.pipeline).collect();
            p.resolve(&ctx.device, &mut enc, written, &pipelines);
        }
        counters.add(Event::Dispatches(self.pending.len() as u64));
        if let Some(c) = copy {
            enc.copy_buffer_to_buffer(&c.src, c.src_offset, &c.dst, 0, c.size);
        }
        ctx.queue.submit([enc.finish()]);
        counters.add(Event::Submit);
        self.submits += 1;
        self.step_base += self.params.len() as u64;
        self.evict();
        self.pending.clear();
        ctx.errors.check("a submission")
    }

    /// On the browser target, points the earlier binding of every pair of
    /// overlapping bindings (one of them writable) at a snapshot of its
    /// range, and notes the copy; elsewhere notes no copies.
    fn unalias(&mut self, ctx: &GpuContext, counters: &Counters) {
        self.copies.clear();
        let browser = ctx.caps.target == ShaderTarget::Browser;
        for d in &mut self.pending {
            let mut copies = Vec::new();
            for i in 0..d.binds.len() {
                if !browser {
                    break;
                }
                let r = bind_range(&d.binds[i]);
                let aliased = d.binds[i + 1..].iter().any(|b| {
                    let o = bind_range(b);
                    b.buf == d.binds[i].buf && o.start < r.end && r.start < o.end
                });
                let copyable = d.binds[i]
                    .buf
                    .usage()
                    .contains(wgpu::BufferUsages::COPY_SRC);
                if !aliased || !copyable {
                    continue;
                }
                let key = (d.binds[i].buf.clone(), r.start, r.end - r.start);
                let dst = self
                    .snapshots
                    .entry(key)
                    .or_insert_with(|| {
                        counters.add(Event::Buffer);
                        ctx.device.create_buffer(&wgpu::BufferDescriptor {
                            label: Some("snapshot"),
                            size: r.end - r.start,
                            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                            mapped_at_creation: false,
                        })
                    })
                    .clone();
                copies.push(Snapshot {
                    src: d.binds[i].buf.clone(),
                    offset: r.start,
                    size: r.end - r.start,
                    dst: dst.clone(),
                });
                d.binds[i] = Bind {
                    buf: dst,
                    offset: 0,
                    size: None,
                };
            }
            self.copies.push(copies);
        }
    }

    /// Packs every pending dispatch's parameters into `self.params` (bytes
    /// from `step_base` of the uniform buffer), each at an offset aligned
    /// for a uniform binding; `self.offsets` are uniform buffer offsets.
    fn pack_params(&mut self, ctx: &GpuContext) {
        let align = u64::from(ctx.caps.uniform_offset_alignment.max(16));
        // Pieces end 16-byte aligned; start each at a binding alignment.
        self.step_base = self.step_base.div_ceil(align) * align;
        self.params.clear();
        self.offsets.clear();
        for d in &self.pending {
            let at = (self.params.len() as u64).div_ceil(align) * align;
            self.params.resize(at as usize, 0);
            self.params
                .extend_from_slice(bytemuck::cast_slice(&d.params));
            let padded = self.params.len().div_ceil(16) * 16;
            self.params.resize(padded, 0);
            self.offsets.push(self.step_base + at);
        }
    }

    /// The uniform buffer, grown (and the bind groups over the old one
    /// dropped) when the step's parameters outgrow it.
    fn uniform_for(&mut self, ctx: &GpuContext, counters: &Counters) -> wgpu::Buffer {
        let need = (self.step_base + self.params.len() as u64).max(16);
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
        let now = self.steps;
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

    /// Drops bind groups unused for [`EVICT_AFTER`] steps once the cache
    /// holds more than two pieces' worth.
    fn evict(&mut self) {
        // Snapshots of ranges of buffers the pool no longer hands out.
        if self.snapshots.len() > 256 {
            self.snapshots.clear();
        }
        if self.groups.len() <= 2 * self.pending.len() + 256 {
            return;
        }
        let now = self.steps;
        self.groups.retain(|_, c| c.used + EVICT_AFTER >= now);
    }
}

/// The byte range a binding covers.
fn bind_range(b: &Bind) -> std::ops::Range<u64> {
    let end = b.size.map_or(b.buf.size(), |s| b.offset + s.get());
    b.offset..end
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
