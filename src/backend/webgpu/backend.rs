//! [`WebGpuBackend`]: the [`Backend`] trait over a wgpu device.
//!
//! `record` compiles (once) and queues a dispatch; `submit` packs every
//! queued dispatch's parameters into one uniform buffer, encodes them into
//! one compute pass (wgpu orders dependent dispatches) and submits once;
//! `download` copies a range out and maps it.

use std::future::Future;
use std::num::NonZeroU64;
use std::ops::Range;
use std::sync::Arc;

use wgpu::util::DeviceExt;

use super::buffer::{read_back, usages, GpuBuffer};
use super::caps::ShaderTarget;
use super::context::GpuContext;
use super::quant::{KernelConfig, QuantKernels};
use super::shader::{PipelineCache, PipelineKey};
use super::GpuError;
use crate::backend::{Backend, BackendError, BufKind, Caps, OpIo};
use crate::graph::Op;
use crate::quant::GgmlType;

/// One storage binding: a whole buffer or a byte range of it (a weight
/// larger than the adapter's binding limit is bound in parts).
#[derive(Debug, Clone)]
pub struct Bind {
    /// The buffer.
    pub buf: wgpu::Buffer,
    /// First byte (a multiple of the adapter's storage offset alignment).
    pub offset: u64,
    /// Bytes, or `None` for the rest of the buffer.
    pub size: Option<NonZeroU64>,
}

impl Bind {
    /// The whole of `b`.
    pub fn whole(b: &GpuBuffer) -> Self {
        Self {
            buf: b.raw.clone(),
            offset: 0,
            size: None,
        }
    }
}

/// A queued dispatch: binding 0 is a uniform of `params`, bindings 1.. are
/// `binds` in order.
#[derive(Debug, Clone)]
pub struct Dispatch {
    /// The pipeline (entry point `main`, layout from the shader).
    pub pipeline: Arc<wgpu::ComputePipeline>,
    /// The uniform's words (padded to 16 bytes when packed).
    pub params: Vec<u32>,
    /// Storage bindings 1...
    pub binds: Vec<Bind>,
    /// Workgroups (x, y); see [`WebGpuBackend::grid`].
    pub groups: (u32, u32),
}

/// The WebGPU backend.
#[derive(Debug)]
pub struct WebGpuBackend {
    pub(super) ctx: GpuContext,
    caps: Caps,
    pub(super) pipelines: PipelineCache,
    /// The kernels of quantized (and split) weights; shared so that they
    /// can record onto `self`.
    pub(super) quant: Arc<QuantKernels>,
    pending: Vec<Dispatch>,
}

impl WebGpuBackend {
    /// A backend on `ctx`'s device.
    pub fn new(ctx: GpuContext) -> Self {
        let caps = Caps {
            name: format!("webgpu {} ({})", ctx.caps.adapter_name, ctx.caps.api),
            max_buffer_bytes: ctx.caps.max_buffer,
            f16: ctx.caps.f16,
            threads: 1,
        };
        let quant = Arc::new(QuantKernels::new(&ctx.caps, KernelConfig::default()));
        Self {
            ctx,
            caps,
            pipelines: PipelineCache::default(),
            quant,
            pending: Vec::new(),
        }
    }

    /// The device context.
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// The pipeline of `key` composed from `parts` (cached).
    pub fn pipeline(&mut self, key: &PipelineKey, parts: &[&str]) -> Arc<wgpu::ComputePipeline> {
        self.pipelines
            .get(&self.ctx.device, &self.ctx.caps, key, parts)
    }

    /// A grid of `n` workgroups as (x, y) within the per-dimension limit;
    /// kernels index groups with `group_index` and skip those past `n`.
    pub fn grid(&self, n: u32) -> (u32, u32) {
        let max = self.ctx.caps.max_workgroups_per_dim.max(1);
        let x = n.clamp(1, max);
        (x, n.div_ceil(x).max(1))
    }

    /// Queues a dispatch for the next [`Backend::submit`].
    pub fn enqueue(&mut self, d: Dispatch) {
        self.pending.push(d);
    }

    /// Encodes and submits every queued dispatch.
    fn flush(&mut self) -> Result<(), GpuError> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let dev = &self.ctx.device;
        let align = u64::from(self.ctx.caps.uniform_offset_alignment.max(16));
        let mut arena: Vec<u8> = Vec::new();
        let mut offsets = Vec::with_capacity(self.pending.len());
        for d in &self.pending {
            let at = (arena.len() as u64).div_ceil(align) * align;
            arena.resize(at as usize, 0);
            arena.extend_from_slice(bytemuck::cast_slice(&d.params));
            let padded = arena.len().div_ceil(16) * 16;
            arena.resize(padded, 0);
            offsets.push(at);
        }
        let uniform = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("params"),
            contents: &arena,
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let copies: Vec<Vec<Snapshot>> = if self.ctx.caps.target == ShaderTarget::Browser {
            self.pending.iter_mut().map(|d| unalias(dev, d)).collect()
        } else {
            vec![Vec::new(); self.pending.len()]
        };
        let groups: Vec<wgpu::BindGroup> = self
            .pending
            .iter()
            .zip(&offsets)
            .map(|(d, &at)| bind_group(dev, d, &uniform, at))
            .collect();
        let mut enc = dev.create_command_encoder(&wgpu::CommandEncoderDescriptor {
            label: Some("step"),
        });
        // One pass, split only where a snapshot must be copied first.
        let mut i = 0;
        while i < self.pending.len() {
            for c in &copies[i] {
                enc.copy_buffer_to_buffer(&c.src, c.offset, &c.dst, 0, c.size);
            }
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor {
                label: Some("step"),
                timestamp_writes: None,
            });
            loop {
                let d = &self.pending[i];
                pass.set_pipeline(&d.pipeline);
                pass.set_bind_group(0, &groups[i], &[]);
                pass.dispatch_workgroups(d.groups.0, d.groups.1, 1);
                i += 1;
                if i == self.pending.len() || !copies[i].is_empty() {
                    break;
                }
            }
        }
        self.ctx.queue.submit([enc.finish()]);
        self.pending.clear();
        self.ctx.errors.check("a submission")
    }
}

/// A copy of a bound range, made before a dispatch that binds the range twice.
#[derive(Debug, Clone)]
struct Snapshot {
    src: wgpu::Buffer,
    offset: u64,
    size: u64,
    dst: wgpu::Buffer,
}

/// Browsers reject a dispatch that binds overlapping ranges of one buffer
/// when either is writable (an in-place op: `x` and `out` the same), which
/// native wgpu allows. The earlier binding of each such pair (the input)
/// is pointed at a snapshot of the range, copied just before the
/// dispatch: the kernel reads the snapshot and writes the original, the
/// out-of-place result. Returns the copies to make.
fn unalias(dev: &wgpu::Device, d: &mut Dispatch) -> Vec<Snapshot> {
    let range = |b: &Bind| {
        let end = b.size.map_or(b.buf.size(), |s| b.offset + s.get());
        b.offset..end
    };
    let mut out = Vec::new();
    for i in 0..d.binds.len() {
        let r = range(&d.binds[i]);
        let aliased = d.binds[i + 1..]
            .iter()
            .any(|b| b.buf == d.binds[i].buf && range(b).start < r.end && r.start < range(b).end);
        if !aliased
            || !d.binds[i]
                .buf
                .usage()
                .contains(wgpu::BufferUsages::COPY_SRC)
        {
            continue;
        }
        let size = r.end - r.start;
        let dst = dev.create_buffer(&wgpu::BufferDescriptor {
            label: Some("snapshot"),
            size,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        out.push(Snapshot {
            src: d.binds[i].buf.clone(),
            offset: r.start,
            size,
            dst: dst.clone(),
        });
        d.binds[i] = Bind {
            buf: dst,
            offset: 0,
            size: None,
        };
    }
    out
}

/// The bind group of `d`: its params at `at` of `uniform`, then its buffers.
fn bind_group(
    dev: &wgpu::Device,
    d: &Dispatch,
    uniform: &wgpu::Buffer,
    at: u64,
) -> wgpu::BindGroup {
    let size = NonZeroU64::new((d.params.len() as u64 * 4).div_ceil(16) * 16);
    let mut entries = vec![wgpu::BindGroupEntry {
        binding: 0,
        resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
            buffer: uniform,
            offset: at,
            size,
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

impl Backend for WebGpuBackend {
    type Buffer = GpuBuffer;

    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn alloc(&self, bytes: u64, kind: BufKind) -> Result<GpuBuffer, BackendError> {
        let size = bytes.div_ceil(4).max(1) * 4;
        if size > self.ctx.caps.max_buffer {
            return Err(GpuError::TooLarge {
                bytes,
                max: self.ctx.caps.max_buffer,
                adapter: self.ctx.caps.adapter_name.clone(),
            }
            .into());
        }
        let raw = self.ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size,
            usage: usages(kind),
            mapped_at_creation: false,
        });
        Ok(GpuBuffer {
            raw,
            len: bytes,
            kind,
        })
    }

    fn upload(&self, dst: &GpuBuffer, offset: u64, src: &[u8]) -> Result<(), BackendError> {
        let end = offset + src.len() as u64;
        if end > dst.len || !offset.is_multiple_of(4) {
            return Err(BackendError::OutOfBounds {
                range: offset..end,
                len: dst.len,
            });
        }
        if src.len().is_multiple_of(4) {
            self.ctx.queue.write_buffer(&dst.raw, offset, src);
        } else {
            let mut padded = src.to_vec();
            padded.resize(src.len().div_ceil(4) * 4, 0);
            self.ctx.queue.write_buffer(&dst.raw, offset, &padded);
        }
        Ok(())
    }

    /// Packed bytes, split into parts within the storage binding limit (see
    /// the `weights` module); an unsupported shape keeps the GGUF size and
    /// fails at upload with the reason.
    fn weight_bytes(&self, ty: GgmlType, cols: usize, rows: usize) -> u64 {
        match self.placement(ty, cols, rows) {
            Ok(p) => p.bytes(),
            Err(_) => (cols / ty.block_elems().max(1) * ty.block_bytes() * rows) as u64,
        }
    }

    fn upload_weight_rows(
        &self,
        dst: &GpuBuffer,
        ty: GgmlType,
        cols: usize,
        first_row: usize,
        src: &[u8],
    ) -> Result<(), BackendError> {
        self.upload_rows(dst, ty, cols, first_row, src)
    }

    fn supports(&self, op: &Op) -> bool {
        self.supports_op(op)
    }

    fn record(&mut self, op: &Op, io: &OpIo<'_, GpuBuffer>) -> Result<(), BackendError> {
        self.record_op(op, io)
    }

    fn submit(&mut self) -> Result<(), BackendError> {
        Ok(self.flush()?)
    }

    fn download(
        &self,
        src: &GpuBuffer,
        range: Range<u64>,
    ) -> impl Future<Output = Result<Vec<u8>, BackendError>> {
        let (dev, queue, src) = (self.ctx.device.clone(), self.ctx.queue.clone(), src.clone());
        async move {
            if range.start > range.end || range.end > src.len {
                return Err(BackendError::OutOfBounds {
                    range,
                    len: src.len,
                });
            }
            Ok(read_back(&dev, &queue, &src, range).await?)
        }
    }
}
