//! [`WebGpuBackend`]: the [`Backend`] trait over a wgpu device.
//!
//! `record` compiles (once) and queues a dispatch; `submit` encodes every
//! queued dispatch into one compute pass and submits once (the step
//! recorder, `recorder.rs`, reuses the uniform buffer and bind groups
//! between steps);
//! `step_buffers` hands out the same activation buffers step after step;
//! `submit_read` records the copy of the step's result into that same
//! submission and maps a reused staging buffer, so a decode step is one
//! submission and one wait.

use std::future::Future;
use std::num::NonZeroU64;
use std::ops::Range;
use std::sync::Arc;

use std::sync::Mutex;

use super::buffer::{copy_span, read_back, staging_buffer, usages, GpuBuffer, PendingMap};
use super::context::{GpuContext, GpuProfile};
use super::counters::{Counters, Event, GpuCounters};
use super::pool::ActPool;
use super::profile::Profiler;
use super::quant::QuantKernels;
use super::recorder::{CopyOut, Recorder};
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
    /// The whole of the wgpu buffer `buf`.
    pub fn whole_raw(buf: wgpu::Buffer) -> Self {
        Self {
            buf,
            offset: 0,
            size: None,
        }
    }

    /// The whole of `b`.
    pub fn whole(b: &GpuBuffer) -> Self {
        Self {
            buf: b.raw.clone(),
            offset: b.offset,
            size: b.bound_size(),
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

/// Keys per span of split-context decode attention, by default: a decode
/// step has one workgroup per head and span, so short spans spread even a
/// short context over the device. On the H200 (Vulkan), an 8B model at
/// tg128: spans of 32 keys decoded at 174.5 tokens/s (4 sequences 564.5),
/// of 64 at 172.3, of 256 at 157.6 (498.7); with the joined matvecs, 16
/// keys 182.4 (546.1) against 32 keys' 173.5 (531.6), and 8 keys 187.3
/// (502.0) against 16 keys' 177.4-179.1 (500.6-513.1) in another call.
pub const DEFAULT_SPLIT_KEYS: u32 = 8;

/// The WebGPU backend.
#[derive(Debug)]
pub struct WebGpuBackend {
    pub(super) ctx: GpuContext,
    caps: Caps,
    pub(super) pipelines: PipelineCache,
    /// The kernels of quantized (and split) weights; shared so that they
    /// can record onto `self`.
    pub(super) quant: Arc<QuantKernels>,
    rec: Recorder,
    pool: ActPool,
    /// The staging buffer of [`Backend::submit_read`], when free (taken
    /// while a readback is in flight, put back when it completes).
    staging: Arc<Mutex<Option<wgpu::Buffer>>>,
    pub(super) counters: Arc<Counters>,
    /// Keys per span of split-context decode attention (0: never split).
    pub(super) attn_split_keys: u32,
    /// Scratch of split-context attention's partial results.
    pub(super) attn_partials: Option<GpuBuffer>,
    /// Scratch of the selection kernels' per-slice partials (argmax, top-k).
    pub(super) sel_partials: Option<GpuBuffer>,
    /// Scratch of the MoE experts: routed entries, gate, up and down rows.
    pub(super) moe_scratch: [Option<GpuBuffer>; 4],
    /// Step timings, with `HEARTH_PROFILE=gpu` (see the `profile` module).
    prof: Option<Arc<Mutex<Profiler>>>,
    /// Dispatches per submitted piece of a step (0: whole steps).
    submit_every: usize,
    /// The same for decode steps (at most [`DECODE_TOKENS`] tokens), where
    /// measured ([`WebGpuBackend::set_decode_submit_every`]).
    decode_submit_every: Option<usize>,
    /// Tokens of the step being recorded, from its embedding lookup (0:
    /// not known yet).
    step_tokens: usize,
    /// A small buffer bound where a kernel uses no buffer.
    pub(super) unused: Option<GpuBuffer>,
    /// The prologue of the fused product being recorded, offered to its
    /// quantizer (the `fuse` module); queued before that product's first
    /// dispatch unless the quantizer takes it.
    pub(super) offer: Option<super::fuse::Held>,
}

/// Dispatches per piece of a step, by default: about four Llama layers
/// (12-14 dispatches each in decode), so that the first piece starts the
/// GPU early and a step of an 8B model is about seven submissions. On the
/// H200 (Vulkan), an 8B model: 56 decoded at 183.0 tokens/s, 112 at
/// 177.4-179.1, 200 at 167.3.
pub const DEFAULT_SUBMIT_EVERY: usize = 56;

/// Steps of at most this many tokens are decode steps for
/// [`WebGpuBackend::set_decode_submit_every`].
pub const DECODE_TOKENS: usize = 16;

/// Most bytes of one wgpu buffer holding several weights
/// ([`Backend::alloc_weights`]).
pub const WEIGHT_GROUP_BYTES: u64 = 128 << 20;

/// Locks `m`, whether or not a panic poisoned it.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    match m.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    }
}

impl WebGpuBackend {
    /// A backend on `ctx`'s device.
    pub fn new(ctx: GpuContext) -> Self {
        let caps = Caps {
            backend: "WebGPU",
            name: format!("webgpu {} ({})", ctx.caps.adapter_name, ctx.caps.api),
            max_buffer_bytes: ctx.caps.max_buffer,
            f16: ctx.caps.f16,
            threads: 1,
        };
        let quant = Arc::new(QuantKernels::new(&ctx.caps, ctx.options.kernels));
        let submit_every = ctx.options.submit_every.unwrap_or(DEFAULT_SUBMIT_EVERY);
        let attn_split_keys = ctx.options.attention_split.unwrap_or(DEFAULT_SPLIT_KEYS);
        let prof = ctx.profile.then(|| {
            let quiet = ctx.options.profile == GpuProfile::Trace;
            let name = format!("{} ({})", ctx.caps.adapter_name, ctx.caps.api);
            let mut p = Profiler::new(&ctx.queue, ctx.timestamps, quiet);
            if ctx.timestamps && crate::trace::on() {
                p.set_track(crate::trace::device_track(&name));
            }
            Arc::new(Mutex::new(p))
        });
        Self {
            ctx,
            caps,
            pipelines: PipelineCache::default(),
            quant,
            rec: Recorder::default(),
            pool: ActPool::default(),
            staging: Arc::new(Mutex::new(None)),
            counters: Arc::new(Counters::default()),
            attn_split_keys,
            attn_partials: None,
            sel_partials: None,
            moe_scratch: Default::default(),
            prof,
            submit_every,
            decode_submit_every: None,
            step_tokens: 0,
            unused: None,
            offer: None,
        }
    }

    /// Sets the keys per span of split-context decode attention: steps of
    /// a few query rows whose block tables reach past `keys` positions cut
    /// the context into spans of about `keys`, one workgroup each, and
    /// merge them (0: never split). Default [`DEFAULT_SPLIT_KEYS`].
    pub fn set_attention_split(&mut self, keys: u32) {
        self.attn_split_keys = keys;
    }

    /// Host-side work counted since the backend was created (dispatches,
    /// submissions, buffers and bind groups created, uploads, readbacks).
    pub fn counters(&self) -> GpuCounters {
        self.counters.snapshot()
    }

    /// Submissions so far (a step is one or more, see
    /// [`WebGpuBackend::set_submit_every`]).
    pub fn submissions(&self) -> u64 {
        self.rec.submits()
    }

    /// Steps submitted so far: device contents computed before the last
    /// one may have been overwritten since (see the int8 activation cache).
    pub fn steps(&self) -> u64 {
        self.rec.steps()
    }

    /// Submits a step in pieces of about `n` dispatches (whole ops), so
    /// the GPU runs the first layers while the host records the rest; the
    /// step still reads back once, after its last piece. 0: one submission
    /// per step. Default [`DEFAULT_SUBMIT_EVERY`], or
    /// `HEARTH_GPU_SUBMIT_EVERY`.
    pub fn set_submit_every(&mut self, n: usize) {
        self.submit_every = n;
    }

    /// The submit interval of decode steps (at most [`DECODE_TOKENS`]
    /// tokens) alone, the others keeping [`WebGpuBackend::set_submit_every`]'s:
    /// what the tune probe measures (`None`: the same for all steps).
    pub fn set_decode_submit_every(&mut self, n: Option<usize>) {
        self.decode_submit_every = n;
    }

    /// The submit interval of the step being recorded.
    fn piece_dispatches(&self) -> usize {
        match self.decode_submit_every {
            Some(n) if self.step_tokens > 0 && self.step_tokens <= DECODE_TOKENS => n,
            _ => self.submit_every,
        }
    }

    /// The device context.
    pub fn context(&self) -> &GpuContext {
        &self.ctx
    }

    /// The pipeline of `key` composed from `parts` (cached).
    pub fn pipeline(&mut self, key: &PipelineKey, parts: &[&str]) -> Arc<wgpu::ComputePipeline> {
        let p = self
            .pipelines
            .get(&self.ctx.device, &self.ctx.caps, key, parts);
        if let Some(prof) = &self.prof {
            lock(prof).name_kind(&p, &key.kind());
        }
        p
    }

    /// With `HEARTH_PROFILE=gpu`: the table of step timings and GPU time
    /// per kernel kind so far (waits for the device); `None` when off.
    /// It also prints when the backend drops.
    pub fn profile_report(&self) -> Option<String> {
        let prof = self.prof.as_ref()?;
        let name = format!("{} ({})", self.ctx.caps.adapter_name, self.ctx.caps.api);
        Some(lock(prof).report(&self.ctx.device, &name))
    }

    /// Notes a matrix product of `rows` token rows (profiling groups steps
    /// by it).
    pub(super) fn note_rows(&self, rows: u64) {
        if let Some(prof) = &self.prof {
            lock(prof).note_rows(rows);
        }
    }

    /// A grid of `n` workgroups as (x, y) within the per-dimension limit;
    /// kernels index groups with `group_index` and skip those past `n`.
    pub fn grid(&self, n: u32) -> (u32, u32) {
        let max = self.ctx.caps.max_workgroups_per_dim.max(1);
        let x = n.clamp(1, max);
        (x, n.div_ceil(x).max(1))
    }

    /// Queues a held dispatch (recorded before anything now offered).
    pub(super) fn enqueue_held(&mut self, d: Dispatch) {
        if let Some(prof) = &self.prof {
            lock(prof).touch();
        }
        self.rec.push(d);
    }

    /// Queues a dispatch for the next [`Backend::submit`], after the
    /// matvec held for joining, if any.
    pub fn enqueue(&mut self, d: Dispatch) {
        if let Some(prof) = &self.prof {
            lock(prof).touch();
        }
        let quant = self.quant.clone();
        if let Err(e) = quant.flush_join(self) {
            // Its shapes were checked when it was held: a failure here is
            // a device limit, reported as the submission's error.
            self.ctx
                .errors
                .push(format!("queueing a joined matvec: {e}"));
        }
        if self.offer.is_some() {
            self.emit_offer();
        }
        self.rec.push(d);
    }

    /// Encodes and submits every queued dispatch, then `copy`: the end of
    /// a step.
    fn flush(&mut self, copy: Option<&CopyOut>) -> Result<(), GpuError> {
        self.flush_piece(copy, true)
    }

    /// Encodes and submits every queued dispatch, then `copy`; `end_step`:
    /// the last piece of the step.
    fn flush_piece(&mut self, copy: Option<&CopyOut>, end_step: bool) -> Result<(), GpuError> {
        let quant = self.quant.clone();
        if let Err(e) = quant.flush_join(self) {
            return Err(GpuError::Device {
                during: "queueing a joined matvec".into(),
                detail: e.to_string(),
            });
        }
        let Some(prof) = self.prof.clone() else {
            return self
                .rec
                .flush(&self.ctx, &self.counters, copy, end_step, None);
        };
        let mut p = lock(&prof);
        let before = self.counters.snapshot().dispatches;
        let t = std::time::Instant::now();
        let r = self
            .rec
            .flush(&self.ctx, &self.counters, copy, end_step, Some(&mut p));
        let n = self.counters.snapshot().dispatches - before;
        p.submitted(t.elapsed(), n);
        if end_step {
            p.end_step();
        }
        r
    }

    /// The step's readback is ready (`waited`: there was one).
    fn step_done(prof: &Option<Arc<Mutex<Profiler>>>, counters: &Counters, waited: bool) {
        if let Some(prof) = prof {
            let counts = counters.step_line();
            lock(prof).finish(waited, &counts);
        }
    }

    /// Submits the step with the copy of `range` of `src` into the staging
    /// buffer, and starts mapping it.
    fn submit_copy(
        &mut self,
        src: &GpuBuffer,
        range: Range<u64>,
    ) -> Result<PendingMap, BackendError> {
        if range.start > range.end || range.end > src.len {
            return Err(BackendError::OutOfBounds {
                range,
                len: src.len,
            });
        }
        let (start, size, at) = copy_span(&range);
        let free = match self.staging.lock() {
            Ok(mut s) => s.take(),
            Err(p) => p.into_inner().take(),
        };
        let staging = match free {
            Some(b) if b.size() >= size => b,
            _ => {
                self.counters.add(Event::Buffer);
                staging_buffer(&self.ctx.device, size.next_power_of_two().max(256))
            }
        };
        let copy = CopyOut {
            src: src.raw.clone(),
            src_offset: start,
            dst: staging.clone(),
            size,
        };
        self.counters.add(Event::Readback);
        self.flush(Some(&copy))?;
        let len = (range.end - range.start) as usize;
        Ok(PendingMap::start(staging, size, at, len))
    }
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
        self.counters.add(Event::Buffer);
        Ok(GpuBuffer {
            raw,
            offset: 0,
            len: bytes,
            kind,
        })
    }

    /// Weights of up to [`WEIGHT_GROUP_BYTES`] side by side in shared
    /// wgpu buffers, in order (each at a multiple of the storage offset
    /// alignment), so that neighbouring weights (q, k, v; gate, up) can be
    /// bound as one range; larger ones alone.
    fn alloc_weights(&self, sizes: &[u64]) -> Result<Vec<GpuBuffer>, BackendError> {
        let align = u64::from(self.ctx.caps.storage_offset_alignment.max(4));
        let cap = WEIGHT_GROUP_BYTES
            .min(self.ctx.caps.max_buffer)
            .min(self.ctx.caps.max_storage_binding);
        let words = |b: u64| b.div_ceil(4).max(1) * 4;
        let mut out = Vec::with_capacity(sizes.len());
        let mut i = 0;
        while i < sizes.len() {
            // The run of weights from i that fits one shared buffer.
            let (mut end, mut total) = (i, 0u64);
            while end < sizes.len() {
                let at = total.next_multiple_of(align);
                if at + words(sizes[end]) > cap {
                    break;
                }
                total = at + words(sizes[end]);
                end += 1;
            }
            if end == i {
                out.push(self.alloc(sizes[i], BufKind::Weights)?);
                i += 1;
                continue;
            }
            let shared = self.alloc(total, BufKind::Weights)?;
            let mut at = 0u64;
            for &bytes in &sizes[i..end] {
                at = at.next_multiple_of(align);
                out.push(GpuBuffer {
                    raw: shared.raw.clone(),
                    offset: at,
                    len: bytes,
                    kind: BufKind::Weights,
                });
                at += words(bytes);
            }
            i = end;
        }
        Ok(out)
    }

    fn upload(&self, dst: &GpuBuffer, offset: u64, src: &[u8]) -> Result<(), BackendError> {
        let end = offset + src.len() as u64;
        if end > dst.len || !offset.is_multiple_of(4) {
            return Err(BackendError::OutOfBounds {
                range: offset..end,
                len: dst.len,
            });
        }
        self.counters.add(Event::Upload);
        if src.len().is_multiple_of(4) {
            self.ctx
                .queue
                .write_buffer(&dst.raw, dst.offset + offset, src);
        } else {
            let mut padded = src.to_vec();
            padded.resize(src.len().div_ceil(4) * 4, 0);
            self.ctx
                .queue
                .write_buffer(&dst.raw, dst.offset + offset, &padded);
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

    fn memory_budget(&self) -> Option<u64> {
        self.ctx.options.memory_budget
    }

    fn check_memory(&self, need: &crate::backend::MemoryNeed) -> Result<(), BackendError> {
        let budget = self.ctx.options.memory_budget;
        Ok(super::memory::check_fits(need, &self.ctx.caps, budget)?)
    }

    fn supports(&self, op: &Op) -> bool {
        self.supports_op(op)
    }

    fn record(&mut self, op: &Op, io: &OpIo<'_, GpuBuffer>) -> Result<(), BackendError> {
        // A step starts with its embedding lookup: one id per token.
        if let (Op::GetRows { .. }, [table, ids]) = (op, io.inputs) {
            if table.kind == crate::backend::BufKind::Weights {
                self.step_tokens = (ids.len / 4) as usize;
            }
        }
        self.record_op(op, io)?;
        let every = self.piece_dispatches();
        if every > 0 && self.rec.pending() >= every {
            self.flush_piece(None, false)?;
        }
        Ok(())
    }

    fn submit(&mut self) -> Result<(), BackendError> {
        self.step_tokens = 0;
        self.flush(None)?;
        Self::step_done(&self.prof, &self.counters, false);
        Ok(())
    }

    fn step_buffers(&mut self, sizes: &[u64]) -> Result<Vec<GpuBuffer>, BackendError> {
        if let Some(prof) = &self.prof {
            lock(prof).touch();
        }
        Ok(self.pool.take(&self.ctx, &self.counters, sizes)?)
    }

    fn submit_read(
        &mut self,
        src: &GpuBuffer,
        range: Range<u64>,
    ) -> impl Future<Output = Result<Vec<u8>, BackendError>> {
        self.step_tokens = 0;
        let pending = if range.start == range.end {
            self.flush(None).map_err(BackendError::from).map(|()| None)
        } else {
            self.submit_copy(src, range).map(Some)
        };
        let (dev, slot) = (self.ctx.device.clone(), self.staging.clone());
        let (prof, counters) = (self.prof.clone(), self.counters.clone());
        async move {
            let Some(p) = pending? else {
                Self::step_done(&prof, &counters, false);
                return Ok(Vec::new());
            };
            let (bytes, staging) = p.finish(&dev).await?;
            Self::step_done(&prof, &counters, true);
            match slot.lock() {
                Ok(mut s) => *s = Some(staging),
                Err(p) => *p.into_inner() = Some(staging),
            }
            Ok(bytes)
        }
    }

    fn download(
        &self,
        src: &GpuBuffer,
        range: Range<u64>,
    ) -> impl Future<Output = Result<Vec<u8>, BackendError>> {
        let (dev, queue, src) = (self.ctx.device.clone(), self.ctx.queue.clone(), src.clone());
        let counters = self.counters.clone();
        async move {
            if range.start > range.end || range.end > src.len {
                return Err(BackendError::OutOfBounds {
                    range,
                    len: src.len,
                });
            }
            if range.start < range.end {
                for e in [Event::Buffer, Event::Submit, Event::Readback] {
                    counters.add(e);
                }
            }
            Ok(read_back(&dev, &queue, &src, range).await?)
        }
    }
}

impl Drop for WebGpuBackend {
    /// With `HEARTH_PROFILE=gpu`, prints the profile table; tracing, puts
    /// the kernels not yet in the trace there.
    fn drop(&mut self) {
        let quiet = self.prof.as_ref().is_some_and(|p| lock(p).quiet());
        if quiet {
            if let Some(prof) = &self.prof {
                lock(prof).flush(&self.ctx.device);
            }
        } else if let Some(report) = self.profile_report() {
            eprint!("{report}");
        }
    }
}
