//! [`CudaBackend`]: the core's [`Backend`] on a CUDA device.
//!
//! Buffers are plain device allocations; every op is queued on one stream
//! of the backend, in plan order, so nothing between ops waits on the host.
//! Weights are repacked at upload into the layout the GPU backends share
//! ([`hearth::backend::packed`]), which gives the kernels aligned word
//! loads. Matrix products quantize their activations once per product (or
//! once per fused group of products) to int8 and run on `DP4A`.

use std::collections::HashMap;
use std::ffi::c_void;
use std::future::Future;
use std::ops::Range;
use std::path::PathBuf;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUdeviceptr};
use cudarc::driver::{result, CudaContext, CudaEvent, CudaFunction, CudaModule, CudaStream};
use cudarc::nvrtc::Ptx;
use hearth::backend::packed::{packed_layout_aligned, PackedLayout, Repacker};
use hearth::backend::{
    Backend, BackendError, BufKind, Caps, HostBytes, MemoryNeed, OpIo, RowsUpload,
};
use hearth::graph::plan::{BufId, Held, HostSync, Plan, StepInputs};
use hearth::graph::{Activation, KvType, Op, Prologue, RopeMode, RopeSpec, MAX_TOP_K};
use hearth::quant::{GgmlType, WEIGHT_TYPES};

use crate::graphs::{self, Action, Graph, Graphs};
use crate::sources::{Module, MODULES};
use crate::{compile, CudaDevice, CudaError};

/// The backend's name in errors and reports.
const NAME: &str = "CUDA";

/// Threads of the element kernels' blocks.
const ELEM_BLOCK: u32 = 256;
/// Threads of the row kernels' blocks (`ROW_BLOCK` of rowops.cu).
const ROW_BLOCK: u32 = 256;
/// Warps of the matrix-vector kernels' blocks (`MV_WARPS` of matmul.cu).
const MV_WARPS: u32 = 4;
/// Rows a warp of the int8 matrix-vector kernels by default
/// ([`CudaBackend::set_mv_rows`]).
pub const DEFAULT_MV_ROWS: u32 = 2;
/// Tokens from which products run on the tensor-core tiles: fewer run on
/// the matrix-vector kernels, a pass over the weights per 8 tokens
/// ([`CudaBackend::set_tile_tokens`]).
const DEFAULT_TILE_TOKENS: usize = 32;
/// Tokens from which prefill dequantizes a weight once
/// ([`CudaBackend::set_dequant_tokens`]).
const DEFAULT_DEQUANT_TOKENS: usize = 128;
/// Tokens from which batched decode products run on the few-token int8
/// tensor-core kernel (`mq_q8`) instead of the matrix-vector kernels
/// ([`CudaBackend::set_mq_tokens`]).
pub const DEFAULT_MQ_TOKENS: usize = 9;
/// Tokens and weight rows of an `mq_q8` block, values of its k stages
/// (`MQ_BM`, `MQ_BN`, `MQ_KC` of matmul.cu).
const MQ_BM: u32 = 16;
const MQ_BN: u32 = 32;
const MQ_KC: usize = 256;
/// Blocks of `mq_q8` a streaming multiprocessor is given: split-k fills
/// the device to this many (its 96 registers a thread and 38 KB of
/// shared memory would allow five; four is what was measured).
const MQ_BLOCKS_PER_SM: u32 = 4;
/// Query rows from which attention runs on the flash kernel
/// ([`CudaBackend::set_flash_rows`]).
const DEFAULT_FLASH_ROWS: usize = 64;
/// Query rows of a flash attention block and keys of its tiles
/// (`FA_ROWS`, `FA_KEYS` of attention.cu).
const FA_ROWS: usize = 64;
const FA_KEYS: usize = 64;
/// Tokens and weight rows of a prefill tile (`MM_BM`, `MM_BN` of matmul.cu).
const MM_BM: u32 = 64;
const MM_BN: u32 = 64;

/// Tokens, weight rows and k step of an f16 prefill tile (`MF_BM`,
/// `MF_BN`, `MF_BK` of matmul.cu).
const MF_BM: u32 = 128;
const MF_BN: u32 = 128;
const MF_BK: usize = 32;
/// Dynamic shared memory of `mm_h16` (`MH_SMEM` of matmul.cu).
const MH_SMEM: u32 = 4 * (MF_BM + MF_BN) * (MF_BK as u32 + 8) * 2;
/// The largest weight dequantized to f16 for `mm_h16` (bytes of f16):
/// larger ones (an output head) multiply on `mm_f16_*`.
const DEQUANT_MAX_BYTES: u64 = 512 << 20;

/// The activations of a product as its kernels take them.
#[derive(Debug, Clone, Copy)]
enum Act {
    /// f32 rows (float weights, exact mode).
    F32(u64),
    /// int8 quants and their scales (decode; the int8 tiles).
    Int8(u64, u64),
    /// f16 rows (the f16 tiles).
    F16(u64),
}

/// Values of a row one block of the wide argmax and top-k takes
/// (`TOPK_SLICE` of rowops.cu).
const ARGMAX_SLICE: usize = 4096;

/// The widest head the attention kernel holds (`ATT_MAX_DIM`).
const ATT_MAX_DIM: usize = 256;
/// Query heads a K/V head of the split attention kernel serves at most
/// (two a warp), and their values it holds (`ATT_MAX_Q`).
const ATT_SPLIT_HEADS: usize = 8;
const ATT_MAX_Q: usize = 2048;
/// Blocks the split attention aims at (a few per SM of the largest cards),
/// and the most splits of a row's keys.
const ATT_TARGET_BLOCKS: usize = 512;
const ATT_MAX_SPLITS: usize = 32;

fn driver(e: impl std::fmt::Debug) -> BackendError {
    BackendError::from_device(CudaError::Driver(format!("{e:?}")))
}

trait FromDevice {
    fn from_device(e: CudaError) -> Self;
}

impl FromDevice for BackendError {
    fn from_device(e: CudaError) -> Self {
        BackendError::Device(Box::new(e))
    }
}

/// One device allocation, freed when its last buffer goes.
struct DeviceMem {
    ptr: CUdeviceptr,
    bytes: u64,
    ctx: Arc<CudaContext>,
}

impl Drop for DeviceMem {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // Work queued on the memory finishes before it goes.
            let _ = result::ctx::synchronize();
            // SAFETY: `ptr` came from malloc_sync and is freed once, after
            // every use of it.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}

/// A buffer on the CUDA device: a range of an allocation.
#[derive(Clone)]
pub struct CudaBuffer {
    mem: Arc<DeviceMem>,
    offset: u64,
    len: u64,
}

impl std::fmt::Debug for CudaBuffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "CudaBuffer({:#x}+{}, {} bytes)",
            self.mem.ptr, self.offset, self.len
        )
    }
}

impl CudaBuffer {
    /// The device address of the buffer's first byte.
    pub fn ptr(&self) -> u64 {
        self.mem.ptr + self.offset
    }

    /// Bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// A kernel argument (the driver reads 4 or 8 bytes, as the kernel declares).
#[derive(Debug, Clone, Copy)]
enum Arg {
    /// A device pointer.
    P(u64),
    /// An unsigned int.
    U(u32),
    /// A float.
    F(f32),
}

/// The kernel modules, loaded, and their functions by name.
struct Kernels {
    modules: Vec<Arc<CudaModule>>,
    functions: HashMap<String, CudaFunction>,
    /// Blocks of a kernel an SM holds at once (by name, for its block size).
    resident: HashMap<String, u32>,
    /// Dynamic shared memory a kernel's limit was raised to (by name).
    smem: HashMap<String, u32>,
}

/// The CUDA backend.
pub struct CudaBackend {
    dev: CudaDevice,
    stream: Arc<CudaStream>,
    /// The stream a sync point's weight writes copy on, beside the work
    /// queued on `stream` ([`Backend::upload_weight_rows_many`]).
    copy: Arc<CudaStream>,
    /// Weight buffers (by device address) whose copy on `copy` is still
    /// in flight, with the event after it: the first op reading one waits
    /// for its event on `stream`.
    copies: std::cell::RefCell<Vec<(CUdeviceptr, Arc<CudaEvent>)>>,
    /// Page-locked memory the sync points' file rows stage through
    /// ([`Staging`]).
    staging: std::cell::RefCell<Staging>,
    caps: Caps,
    kernels: Kernels,
    /// Step activations, one allocation per plan index, kept across steps.
    pool: Vec<Arc<DeviceMem>>,
    /// Scratch of the ops (int8 activations, expert products), by use.
    scratch: HashMap<&'static str, Arc<DeviceMem>>,
    /// Bumped whenever a pool or scratch buffer is (re)allocated: graphs
    /// recorded before may point at memory that moved.
    generation: std::cell::Cell<u64>,
    /// Plans recorded as CUDA graphs.
    graphs: Graphs,
    /// Whether plans run as CUDA graphs ([`CudaBackend::set_graphs`]).
    use_graphs: bool,
    /// Whether a sync point's weight rows are repacked side by side
    /// ([`CudaBackend::set_batched_uploads`]).
    batched_uploads: bool,
    /// Products of at least this many tokens run on the tensor-core tiles.
    tile_tokens: usize,
    /// Products of at least this many tokens dequantize the weight to f16
    /// once and multiply on `mm_h16` (fewer dequantize in the tiles).
    dequant_tokens: usize,
    /// Kernel timings ([`CudaBackend::set_profile`]).
    prof: Option<Profile>,
    /// Scratch replaced during a step, freed once the step is read back.
    retired: Vec<Arc<DeviceMem>>,
    /// Warps of an attention block (4, 8 or 16), 0 for the split kernel.
    att_warps: u32,
    /// Products of this many tokens (up to `tile_tokens`) run on `mq_q8`
    /// (0: never).
    mq_tokens: usize,
    /// Splits of `mq_q8`'s k (0: enough to fill the device).
    mq_splits: u32,
    /// Attention of at least this many query rows runs on the flash
    /// kernel where it fits (0: never).
    flash_rows: usize,
    /// Rows a warp of the int8 matrix-vector kernels sweeps together
    /// (1, 2 or 4), or 0 for the persistent kernels of a row a warp.
    mv_rows: u32,
    /// Whether prefill multiplies on the f16 tiles (off: the int8 tiles).
    prefill_f16: bool,
    /// Streaming multiprocessors of the device.
    sm_count: u32,
}

/// Device time per kernel, from a pair of CUDA events around each launch.
#[derive(Default)]
struct Profile {
    /// Launches whose events are not read yet.
    pending: Vec<(String, sys::CUevent, sys::CUevent)>,
    /// Per kernel: milliseconds and launches.
    totals: HashMap<String, (f64, u64)>,
    /// For the trace alone: no table printed at drop.
    quiet: bool,
    /// The trace's track of this device's kernels (`None`: not traced).
    track: Option<hearth::trace::Track>,
}

impl Profile {
    /// Puts the pending launches on the trace's device track, the last
    /// one ending at `end` (seconds on the trace's clock, read just after
    /// the stream finished) and each placed by its events' distance from
    /// that last one. Call before [`Profile::collect`].
    fn trace(&self, end: f64) {
        let (Some(track), Some(&(_, _, last))) = (self.track, self.pending.last()) else {
            return;
        };
        // Seconds from `e` to the last launch's end.
        let before = |e: sys::CUevent| {
            // SAFETY: both events were recorded on a stream that is done.
            let ms = unsafe { result::event::elapsed(e, last) }.unwrap_or(0.0);
            f64::from(ms.max(0.0)) * 1e-3
        };
        for (name, a, b) in &self.pending {
            hearth::trace::complete(
                track,
                name.clone(),
                end - before(*a),
                end - before(*b),
                Vec::new(),
            );
        }
    }

    /// Reads the events of finished launches (the stream was synchronized).
    fn collect(&mut self) {
        for (name, a, b) in self.pending.drain(..) {
            // SAFETY: both events were recorded on a stream that is done.
            let ms = unsafe { result::event::elapsed(a, b) }.unwrap_or(0.0);
            let t = self.totals.entry(name).or_default();
            t.0 += f64::from(ms);
            t.1 += 1;
            // SAFETY: made by event::create, destroyed once.
            unsafe {
                let _ = result::event::destroy(a);
                let _ = result::event::destroy(b);
            }
        }
    }

    fn report(&self) -> String {
        let mut rows: Vec<(&String, &(f64, u64))> = self.totals.iter().collect();
        rows.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        let total: f64 = rows.iter().map(|r| r.1 .0).sum();
        let mut out = format!(
            "cuda profile: {total:.2} ms of kernels\n{:<28} {:>10} {:>8} {:>10} {:>6}\n",
            "kernel", "ms", "calls", "us/call", "share"
        );
        for (name, &(ms, n)) in rows {
            out += &format!(
                "{name:<28} {ms:>10.3} {n:>8} {:>10.2} {:>5.1}%\n",
                ms * 1e3 / n.max(1) as f64,
                100.0 * ms / total.max(1e-12)
            );
        }
        out
    }
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.dev)
            .finish()
    }
}

/// Where compiled kernels are kept: `HEARTH_CUDA_CACHE`, else the user's
/// cache directory (`$XDG_CACHE_HOME/hearth/cuda`, `~/.cache/hearth/cuda`);
/// `HEARTH_CUDA_CACHE=off` keeps none.
pub fn cache_dir() -> Option<PathBuf> {
    match std::env::var("HEARTH_CUDA_CACHE") {
        Ok(v) if v == "off" => return None,
        Ok(v) if !v.is_empty() => return Some(PathBuf::from(v)),
        _ => {}
    }
    let base = std::env::var_os("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("hearth").join("cuda"))
}

/// Rows of packed weights start at multiples of this many bytes (the
/// kernels' 128-bit loads, `w_vec4` of quant.cuh).
const ROW_ALIGN: u64 = 16;

/// The device layout of a `[rows, cols]` weight of `ty`.
fn layout_of(ty: GgmlType, rows: usize, cols: usize) -> Result<PackedLayout, BackendError> {
    packed_layout_aligned(NAME, ty, rows as u64, cols as u64, ROW_ALIGN)
}

/// Whole rows `first_row..` of a weight (`src`, as the GGUF file stores
/// them) in the kernels' layout, and their byte offset in the buffer.
fn packed_rows(
    ty: GgmlType,
    cols: usize,
    first_row: usize,
    src: &[u8],
) -> Result<(u64, Vec<u8>), BackendError> {
    let row_bytes = cols / ty.block_elems().max(1) * ty.block_bytes();
    if row_bytes == 0 || !src.len().is_multiple_of(row_bytes) {
        return Err(BackendError::Shape(format!(
            "{} bytes of a {ty} weight are not whole rows of {cols} values",
            src.len()
        )));
    }
    let layout = layout_of(ty, src.len() / row_bytes, cols)?;
    let mut packed = Vec::with_capacity(layout.bytes as usize);
    let mut rp = Repacker::for_layout(layout)?;
    rp.push_rows(src, &mut packed)?;
    rp.finish()?;
    Ok((first_row as u64 * layout.row_bytes, packed))
}

/// Page-locked host memory ([`Backend::host_bytes`], [`Staging`]).
struct PinnedBytes {
    ptr: *mut u8,
    len: usize,
    ctx: Arc<CudaContext>,
}

impl PinnedBytes {
    /// `len` bytes of page-locked memory (contents unspecified), or `None`
    /// when the driver gives none.
    fn alloc(ctx: &Arc<CudaContext>, len: usize) -> Option<Self> {
        if len == 0 {
            return None;
        }
        ctx.bind_to_thread().ok()?;
        // SAFETY: a plain allocation of `len` bytes in the bound context.
        let ptr = unsafe { result::malloc_host(len, 0) }.ok()? as *mut u8;
        Some(Self {
            ptr,
            len,
            ctx: ctx.clone(),
        })
    }

    /// A page-locked copy of `bytes`, or `None` when the driver gives none.
    fn new(ctx: &Arc<CudaContext>, bytes: &[u8]) -> Option<Self> {
        let mut p = Self::alloc(ctx, bytes.len())?;
        p.write(0, bytes);
        Some(p)
    }

    /// Writes `bytes` at `at` (within the allocation: the caller checks).
    fn write(&mut self, at: usize, bytes: &[u8]) {
        assert!(
            at + bytes.len() <= self.len,
            "a write past page-locked memory"
        );
        // SAFETY: `at + bytes.len()` bytes lie in the allocation (checked),
        // which `&mut self` holds alone and `bytes` cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr.add(at), bytes.len()) };
    }
}

/// Two page-locked buffers the sync points' weight rows stage through when
/// they are not page-locked already (slot fills): a copy from pageable
/// memory returns only once the driver staged it, which waits behind the
/// work queued before it, so the host stalled on every fill. Each buffer is
/// reused once the copy out of it is done (the one before last: done by
/// then, as a read-back came between).
#[derive(Default)]
struct Staging {
    bufs: [Option<PinnedBytes>; 2],
    busy: [Option<Arc<CudaEvent>>; 2],
    next: usize,
}

impl Staging {
    /// The next buffer, of at least `len` bytes and free, with its index;
    /// `None` where page-locked memory is not to be had.
    fn take(
        &mut self,
        ctx: &Arc<CudaContext>,
        len: usize,
    ) -> Result<Option<(usize, &mut PinnedBytes)>, BackendError> {
        let i = self.next;
        self.next ^= 1;
        if let Some(ev) = self.busy[i].take() {
            ev.synchronize().map_err(driver)?;
        }
        if self.bufs[i].as_ref().is_none_or(|b| b.len < len) {
            self.bufs[i] = None;
            self.bufs[i] = PinnedBytes::alloc(ctx, len.next_power_of_two().max(8 << 20));
        }
        Ok(self.bufs[i].as_mut().map(|b| (i, b)))
    }
}

// SAFETY: the allocation is owned, read through `&self` only, and freed
// once; the context handle is shareable across threads.
unsafe impl Send for PinnedBytes {}

impl HostBytes for PinnedBytes {
    fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes written at `new`, alive until drop.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::fmt::Debug for PinnedBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "PinnedBytes({} bytes)", self.len)
    }
}

impl Drop for PinnedBytes {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by malloc_host, freed once.
            let _ = unsafe { result::free_host(self.ptr.cast()) };
        }
    }
}

/// Whether `ty` rows of `k` values run on the product kernels.
fn weight_runs(ty: GgmlType, k: usize) -> bool {
    WEIGHT_TYPES.contains(&ty) && k > 0 && layout_of(ty, 1, k).is_ok()
}

/// The kernel-name stem of a weight type (`q4_k`).
fn format_name(ty: GgmlType) -> Option<&'static str> {
    ty.weight_label()
}

/// Whether the dot of `ty` takes q8_K activations (per 256 values).
fn per_256(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(ty, Q2_K | Q3_K | Q4_K | Q5_K | Q6_K | IQ4_XS)
}

/// Tokens per matrix-vector launch for `m` tokens (the kernels' variants).
/// Tokens a launch of the int8 matrix-vector kernels of R rows a warp
/// (`mvr_q8`) multiplies in one pass over the weights: up to 8 (16 a pass
/// measured slower than two passes of 8: past 4 tokens the kernels are
/// bound by their loads of the activations, not by the weights).
fn mvr_tokens(m: usize) -> u32 {
    match m {
        0 | 1 => 1,
        2 => 2,
        3 | 4 => 4,
        _ => 8,
    }
}

/// Rows a warp of `mvr_q8` for `nt` tokens when `rows` are asked for:
/// 4 only with one token (the registers of more tokens' sums).
fn mvr_rows(rows: u32, nt: u32) -> u32 {
    if nt > 1 {
        rows.min(2)
    } else {
        rows
    }
}

/// Tokens a launch of the f32 and the persistent int8 matrix-vector kernels.
fn tokens_per_launch(m: usize) -> u32 {
    match m {
        0 | 1 => 1,
        2 => 2,
        3 | 4 => 4,
        _ => 8,
    }
}

fn blocks(n: u64, per: u32) -> u32 {
    n.div_ceil(u64::from(per)).max(1) as u32
}

fn nth<'a>(bufs: &[&'a CudaBuffer], i: usize, op: &Op) -> Result<&'a CudaBuffer, BackendError> {
    bufs.get(i)
        .copied()
        .ok_or_else(|| BackendError::Shape(format!("{} is missing buffer {i}", op.describe())))
}

fn shape(op: &Op, what: String) -> BackendError {
    BackendError::Shape(format!("{}: {what}", op.describe()))
}

impl CudaBackend {
    /// Opens CUDA device `ordinal` and loads the kernels, compiling those
    /// not in the cache ([`cache_dir`]) for its architecture.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        let dev = CudaDevice::open(ordinal)?;
        let stream = dev
            .ctx
            .new_stream()
            .map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        let copy = stream
            .fork()
            .map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        let cache = cache_dir();
        let mut modules = Vec::with_capacity(MODULES.len());
        for Module { name, source } in MODULES {
            let cubin = compile(name, source, dev.arch, cache.as_deref())?;
            modules.push(
                dev.ctx
                    .load_module(Ptx::from_binary(cubin))
                    .map_err(|e| CudaError::Driver(format!("loading {name}.cu: {e:?}")))?,
            );
        }
        let (_, total) = dev
            .ctx
            .mem_get_info()
            .map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        let sm_count = dev
            .ctx
            .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
            .map_err(|e| CudaError::Driver(format!("{e:?}")))?
            .max(1) as u32;
        let caps = Caps {
            backend: NAME,
            name: format!("{} ({})", dev.name, dev.arch.sm()),
            max_buffer_bytes: total as u64,
            f16: true,
            threads: 1,
        };
        Ok(CudaBackend {
            dev,
            stream,
            copy,
            copies: Default::default(),
            staging: Default::default(),
            caps,
            kernels: Kernels {
                modules,
                functions: HashMap::new(),
                resident: HashMap::new(),
                smem: HashMap::new(),
            },
            pool: Vec::new(),
            scratch: HashMap::new(),
            generation: std::cell::Cell::new(0),
            graphs: Graphs::default(),
            use_graphs: true,
            batched_uploads: true,
            tile_tokens: DEFAULT_TILE_TOKENS,
            dequant_tokens: DEFAULT_DEQUANT_TOKENS,
            prof: None,
            retired: Vec::new(),
            att_warps: 0,
            flash_rows: DEFAULT_FLASH_ROWS,
            mq_tokens: DEFAULT_MQ_TOKENS,
            mq_splits: 0,
            mv_rows: DEFAULT_MV_ROWS,
            prefill_f16: true,
            sm_count,
        })
    }

    /// Whether whole plans run as CUDA graphs (on by default; off records
    /// every op of every step, for comparison and debugging).
    pub fn set_graphs(&mut self, on: bool) {
        self.use_graphs = on;
        self.graphs.clear();
    }

    /// Whether the weight rows of a sync point (the expert cache's slot
    /// fills) are repacked side by side and waited for once (the default),
    /// or uploaded one run at a time (for comparison).
    pub fn set_batched_uploads(&mut self, on: bool) {
        self.batched_uploads = on;
    }

    /// Times every kernel with CUDA events (and records op by op: a graph
    /// replay has no per-kernel events); [`CudaBackend::profile_report`]
    /// gives the table, and the backend prints it when dropped.
    pub fn set_profile(&mut self, on: bool) {
        self.prof = on.then(Profile::default);
        if on {
            self.set_graphs(false);
        }
    }

    /// Times every kernel as [`CudaBackend::set_profile`] does, for the
    /// [`hearth::trace`] recording alone: after each plan its kernels go
    /// on the trace's device track, and nothing is printed. Steps run op
    /// by op (no graphs), so the trace shows the ungraphed step.
    pub fn set_trace_profile(&mut self) {
        self.prof = Some(Profile {
            quiet: true,
            track: Some(hearth::trace::device_track(&self.caps.name)),
            ..Profile::default()
        });
        self.set_graphs(false);
    }

    /// Device time per kernel so far, where profiling is on.
    pub fn profile_report(&mut self) -> Option<String> {
        let _ = self.stream.synchronize();
        let prof = self.prof.as_mut()?;
        prof.collect();
        Some(prof.report())
    }

    /// The attention kernel: 0 (the default) the split kernel, which
    /// serves the query heads of a K/V head together and cuts a row's keys
    /// into splits, where the shapes fit it; 4, 8 or 16 the kernel of one
    /// block per query head and token with that many warps over its keys.
    pub fn set_attention_warps(&mut self, warps: u32) {
        self.att_warps = match warps {
            0 => 0,
            1..=5 => 4,
            6..=11 => 8,
            _ => 16,
        };
    }

    /// Products of at least `tokens` tokens (and fewer than the tiles'
    /// [`Self::set_tile_tokens`]) run on the few-token int8 tensor-core
    /// kernel, which reads each weight once for 16 tokens, instead of the
    /// matrix-vector kernels' passes of 8. 9 by default; 0 never.
    pub fn set_mq_tokens(&mut self, tokens: usize) {
        self.mq_tokens = tokens;
    }

    /// Splits of the k of `mq_q8`'s products: 0 (the default) as many as
    /// fill the device with blocks, else this many (for comparison).
    pub fn set_mq_splits(&mut self, splits: u32) {
        self.mq_splits = splits;
    }

    /// Attention of at least `rows` query rows (tokens of the step) runs on
    /// the flash kernel (tensor cores over tiles of queries and keys) where
    /// it fits: an f16 cache and heads of 64 or 128 values. 64 by default;
    /// 0 never, so prefill takes the split kernel, a block per row.
    pub fn set_flash_rows(&mut self, rows: usize) {
        self.flash_rows = rows;
    }

    /// Rows a warp of the int8 matrix-vector kernels (decode) sweeps
    /// together: 1, 2 or 4 (more share each activation load, fewer keep
    /// more warps busy on small weights); 0 runs the persistent kernels
    /// of one row a warp, each warp loading a unit ahead, for comparison.
    pub fn set_mv_rows(&mut self, rows: u32) {
        self.mv_rows = match rows {
            0 => 0,
            1 => 1,
            2 | 3 => 2,
            _ => 4,
        };
    }

    /// Whether prefill products multiply f16 activations against weights
    /// dequantized to f16 (on by default) or int8 ones on the int8 tiles.
    pub fn set_prefill_f16(&mut self, on: bool) {
        self.prefill_f16 = on;
    }

    /// Products of at least `tokens` tokens run on the tensor-core tiles
    /// (32 by default; fewer run on the matrix-vector kernels).
    pub fn set_tile_tokens(&mut self, tokens: usize) {
        self.tile_tokens = tokens.max(1);
    }

    /// Products of at least `tokens` tokens dequantize the weight to f16
    /// once and multiply it on the pipelined f16 tiles (128 by default;
    /// fewer tokens dequantize inside the tiles, where the extra pass over
    /// the weight would cost more than it saves).
    pub fn set_dequant_tokens(&mut self, tokens: usize) {
        self.dequant_tokens = tokens.max(1);
    }

    /// Plans replayed from a CUDA graph, and plans captured into one, so far.
    pub fn graph_counts(&self) -> (u64, u64) {
        (self.graphs.replays, self.graphs.captures)
    }

    /// Records every step of `plan` over the step's `acts` and the model's `held` buffers.
    fn record_steps(
        &mut self,
        plan: &Plan,
        acts: &[CudaBuffer],
        held: &Held<'_, CudaBuffer>,
    ) -> Result<(), BackendError> {
        let get = |b: &BufId| -> &CudaBuffer {
            match *b {
                BufId::Weight(i) => &held.weights[i],
                BufId::Act(i) => &acts[i],
                BufId::KvK(i) => &held.kv[i][0],
                BufId::KvV(i) => &held.kv[i][1],
            }
        };
        for s in &plan.steps {
            let inputs: Vec<&CudaBuffer> = s.inputs.iter().map(get).collect();
            let outputs: Vec<&CudaBuffer> = s.outputs.iter().map(get).collect();
            self.record(
                &s.op,
                &OpIo {
                    inputs: &inputs,
                    outputs: &outputs,
                },
            )?;
        }
        Ok(())
    }

    /// [`Backend::run_plan`] through CUDA graphs (see [`crate::graphs`]).
    async fn run_graph(
        &mut self,
        plan: &Plan,
        inputs: &StepInputs,
        held: &Held<'_, CudaBuffer>,
    ) -> Result<Vec<u8>, BackendError> {
        plan.check(held.weights.len(), held.kv.len())?;
        let sizes = plan.sizes(inputs);
        let acts = self.step_buffers(&sizes)?;
        for (a, buf) in plan.acts.iter().zip(&acts) {
            if let Some(input) = a.input {
                let bytes: Vec<u8> = inputs
                    .get(input)
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect();
                self.upload(buf, 0, &bytes)?;
            }
        }
        let held_at: Vec<u64> = held
            .weights
            .iter()
            .chain(held.kv.iter().flatten())
            .map(CudaBuffer::ptr)
            .collect();
        let generation = self.generation.get();
        let stream = self.stream.cu_stream();
        self.bind()?;
        // A graph's kernels read what they read: every copy lands first.
        self.await_copies(|_| true)?;
        match self.graphs.action(plan, &sizes, &held_at, generation) {
            // SAFETY: the graph's buffers are those of this plan, alive
            // (the generation did not change since it was recorded).
            Action::Replay(g) => unsafe { g.launch(stream) }.map_err(driver)?,
            Action::Record => self.record_steps(plan, &acts, held)?,
            Action::Capture => {
                // SAFETY: our own stream, in the bound context.
                unsafe { graphs::begin(stream) }.map_err(driver)?;
                let recorded = self.record_steps(plan, &acts, held);
                // SAFETY: the capture began above.
                let graph = unsafe { Graph::end(stream) };
                recorded?;
                let graph = graph.map_err(driver)?;
                // SAFETY: just recorded over live buffers.
                unsafe { graph.launch(stream) }.map_err(driver)?;
                if self.generation.get() == generation {
                    self.graphs.captured(graph);
                } else {
                    // A scratch buffer grew while recording: keep nothing
                    // that points at memory the next step may not have.
                    self.stream.synchronize().map_err(driver)?;
                }
            }
        }
        match plan.result {
            Some((i, n)) => self.download_now(&acts[i], 0..n),
            None => Ok(Vec::new()),
        }
    }

    /// Has `stream` wait for the weight copies in flight to the buffers
    /// `which` picks (by device address), and forgets them.
    fn await_copies(&self, which: impl Fn(CUdeviceptr) -> bool) -> Result<(), BackendError> {
        let mut copies = self.copies.borrow_mut();
        let mut err = None;
        copies.retain(|(p, ev)| {
            if !which(*p) {
                return true;
            }
            if let Err(e) = self.stream.wait(ev) {
                err = Some(driver(e));
            }
            false
        });
        err.map_or(Ok(()), Err)
    }

    /// The device.
    pub fn device(&self) -> &CudaDevice {
        &self.dev
    }

    fn bind(&self) -> Result<(), BackendError> {
        self.dev.ctx.bind_to_thread().map_err(driver)
    }

    fn malloc(&self, bytes: u64, what: &str) -> Result<Arc<DeviceMem>, BackendError> {
        self.bind()?;
        let size = bytes.max(1).next_multiple_of(256);
        // SAFETY: a plain allocation of `size` bytes in the bound context.
        let ptr = unsafe { result::malloc_sync(size as usize) }.map_err(|e| {
            let (free, _) = result::mem_get_info().unwrap_or((0, 0));
            BackendError::from_device(CudaError::Driver(format!(
                "could not allocate {} MiB for {what} ({e:?}; {} MiB free on {}); load a smaller model or a shorter context (--ctx)",
                size.div_ceil(1 << 20),
                free >> 20,
                self.dev.name
            )))
        })?;
        let mem = Arc::new(DeviceMem {
            ptr,
            bytes: size,
            ctx: self.dev.ctx.clone(),
        });
        self.generation.set(self.generation.get() + 1);
        // SAFETY: zeroes the allocation just made.
        unsafe { result::memset_d8_async(ptr, 0, size as usize, self.stream.cu_stream()) }
            .map_err(driver)?;
        Ok(mem)
    }

    /// Scratch of at least `bytes` for `what`, kept for later ops.
    fn scratch(&mut self, what: &'static str, bytes: u64) -> Result<u64, BackendError> {
        if let Some(m) = self.scratch.get(what) {
            if m.bytes >= bytes {
                return Ok(m.ptr);
            }
        }
        let mem = self.malloc(bytes.next_power_of_two(), what)?;
        let ptr = mem.ptr;
        // The old buffer goes after the step: freeing synchronizes, which
        // a stream being captured into a graph must not do.
        if let Some(old) = self.scratch.insert(what, mem) {
            self.retired.push(old);
        }
        Ok(ptr)
    }

    /// Kernel `name` from the loaded modules, kept for later launches.
    fn load_function(&mut self, name: &str) -> Result<&CudaFunction, BackendError> {
        if !self.kernels.functions.contains_key(name) {
            let f = self
                .kernels
                .modules
                .iter()
                .find_map(|m| m.load_function(name).ok())
                .ok_or_else(|| {
                    BackendError::from_device(CudaError::Driver(format!(
                        "no kernel {name} in the loaded modules"
                    )))
                })?;
            self.kernels.functions.insert(name.to_string(), f);
        }
        self.kernels.functions.get(name).ok_or_else(|| {
            BackendError::from_device(CudaError::Driver(format!("kernel {name} not kept")))
        })
    }

    /// Blocks of `block` threads of kernel `name` the whole device holds
    /// at once (at least one).
    fn resident_blocks(&mut self, name: &str, block: u32) -> Result<u32, BackendError> {
        if let Some(&n) = self.kernels.resident.get(name) {
            return Ok(n);
        }
        let per_sm = self
            .load_function(name)?
            .occupancy_max_active_blocks_per_multiprocessor(block, 0, None)
            .map_err(|e| driver(format!("occupancy of {name}: {e:?}")))?;
        let n = (per_sm * self.sm_count).max(1);
        self.kernels.resident.insert(name.to_string(), n);
        Ok(n)
    }

    /// Queues kernel `name` on the stream.
    fn launch(
        &mut self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        args: &[Arg],
    ) -> Result<(), BackendError> {
        self.launch_smem(name, grid, block, 0, args)
    }

    /// [`Self::launch`] with `smem` bytes of dynamic shared memory (the
    /// kernel's limit raised to it on first use).
    fn launch_smem(
        &mut self,
        name: &str,
        grid: (u32, u32, u32),
        block: u32,
        smem: u32,
        args: &[Arg],
    ) -> Result<(), BackendError> {
        self.load_function(name)?;
        if smem > 48 << 10 && self.kernels.smem.get(name).copied() != Some(smem) {
            self.kernels.functions[name]
                .set_attribute(
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    smem as i32,
                )
                .map_err(|e| driver(format!("shared memory of {name}: {e:?}")))?;
            self.kernels.smem.insert(name.to_string(), smem);
        }
        let mut values: Vec<u64> = args
            .iter()
            .map(|a| match *a {
                Arg::P(p) => p,
                Arg::U(u) => u64::from(u),
                Arg::F(f) => u64::from(f.to_bits()),
            })
            .collect();
        let mut params: Vec<*mut c_void> = values
            .iter_mut()
            .map(|v| (v as *mut u64).cast::<c_void>())
            .collect();
        self.bind()?;
        let stream = self.stream.cu_stream();
        let events = match self.prof {
            Some(_) => {
                let flags = sys::CUevent_flags::CU_EVENT_DEFAULT;
                let (a, b) = (
                    result::event::create(flags).map_err(driver)?,
                    result::event::create(flags).map_err(driver)?,
                );
                // SAFETY: a fresh event on our stream.
                unsafe { result::event::record(a, stream) }.map_err(driver)?;
                Some((a, b))
            }
            None => None,
        };
        let f = &self.kernels.functions[name];
        // SAFETY: the arguments are those the kernel declares, in order
        // (pointers as 8 bytes, u32 / f32 as the low 4 bytes of a
        // little-endian slot), and the buffers they point into are alive
        // and large enough (checked by each op before its launch).
        unsafe {
            result::launch_kernel(
                f.cu_function(),
                grid,
                (block, 1, 1),
                smem,
                stream,
                &mut params,
            )
        }
        .map_err(|e| driver(format!("{name}: {e:?}")))?;
        if let (Some(prof), Some((a, b))) = (self.prof.as_mut(), events) {
            // SAFETY: a fresh event on our stream.
            unsafe { result::event::record(b, stream) }.map_err(driver)?;
            prof.pending.push((name.to_string(), a, b));
        }
        Ok(())
    }

    /// A copy between device buffers, queued.
    fn copy(&self, dst: u64, src: u64, bytes: u64) -> Result<(), BackendError> {
        if dst == src || bytes == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges lie in live buffers (checked by the caller).
        unsafe { result::memcpy_dtod_async(dst, src, bytes as usize, self.stream.cu_stream()) }
            .map_err(driver)
    }

    fn layout(&self, ty: GgmlType, rows: usize, cols: usize) -> Result<PackedLayout, BackendError> {
        layout_of(ty, rows, cols)
    }

    /// `name` over `n` threads in blocks of 128 (a kernel that checks its
    /// own bound).
    fn elementwise_n(&mut self, name: &str, n: u64, args: &[Arg]) -> Result<(), BackendError> {
        if n == 0 {
            return Ok(());
        }
        self.launch(name, (blocks(n, 128), 1, 1), 128, args)
    }

    fn elementwise(&mut self, name: &str, n: u64, args: &[Arg]) -> Result<(), BackendError> {
        if n == 0 {
            return Ok(());
        }
        self.launch(name, (blocks(n, ELEM_BLOCK), 1, 1), ELEM_BLOCK, args)
    }

    /// Scratch for `n` values quantized as the dot of a weight type takes
    /// them (`per_256`: q8_K, else q8_0 rounding): the address of the
    /// quants and of the scales.
    fn quant_scratch(&mut self, per_256: bool, n: u64) -> Result<(u64, u64), BackendError> {
        let (q_name, s_name) = if per_256 {
            ("int8 activations (q8_K)", "int8 activation scales (q8_K)")
        } else {
            ("int8 activations", "int8 activation scales")
        };
        Ok((self.scratch(q_name, n)?, self.scratch(s_name, n / 16 * 8)?))
    }

    /// Quantizes `m` rows of `k` f32 values at `x` to int8 as the dot of
    /// `ty` takes them (ggml's `vec_dot_type`: q8_K for the K-quants and
    /// IQ4_XS, per 256 values; q8_0 / q8_1 rounding per 32 for the rest);
    /// the address of the quants and of the scales.
    fn quantize(
        &mut self,
        ty: GgmlType,
        x: u64,
        m: usize,
        k: usize,
    ) -> Result<(u64, u64), BackendError> {
        let n = (m * k) as u64;
        let per_256 = per_256(ty);
        let (xq, xs) = self.quant_scratch(per_256, n)?;
        self.launch(
            "quantize_q8",
            (blocks(n.div_ceil(256), 4), 1, 1),
            128,
            &[
                Arg::P(x),
                Arg::U(n as u32),
                Arg::U(u32::from(per_256)),
                Arg::P(xq),
                Arg::P(xs),
            ],
        )?;
        Ok((xq, xs))
    }

    /// Whether `m` tokens of `k` values against `ty` weights multiply on
    /// the f16 tensor-core tiles (prefill).
    fn f16_tiles(&self, ty: GgmlType, k: usize, m: usize, exact: bool) -> bool {
        self.prefill_f16
            && !exact
            && m >= self.tile_tokens
            && k.is_multiple_of(MF_BK)
            && (ty.is_quantized() || ty == GgmlType::F16)
    }

    /// x (`m` rows of `k` f32 at `x`) as f16, for the f16 tiles.
    fn halves(&mut self, x: u64, m: usize, k: usize) -> Result<u64, BackendError> {
        let n = (m * k) as u64;
        let xh = self.scratch("f16 activations", n * 2)?;
        self.elementwise_n("to_f16", n / 8, &[Arg::P(x), Arg::P(xh), Arg::U(n as u32)])?;
        Ok(xh)
    }

    /// `y_i[t, ..n_i] = x[t, :] · W_iᵀ` for `m` tokens and every part
    /// `(W_i, n_i, y_i)` of one weight type, from x as `act` holds it; the
    /// matrix-vector kernels take up to three parts a launch (q | k | v,
    /// gate | up).
    fn products(
        &mut self,
        ty: GgmlType,
        parts: &[(&CudaBuffer, usize, u64)],
        k: usize,
        act: Act,
        m: usize,
    ) -> Result<(), BackendError> {
        let fmt = format_name(ty).ok_or_else(|| BackendError::UnsupportedType {
            tensor: format!("[{}, {k}] weight", parts.first().map_or(0, |p| p.1)),
            ty,
            backend: NAME.into(),
        })?;
        let mut row_words = 0;
        let mut nb = 0;
        for &(w, n, _) in parts {
            let layout = self.layout(ty, n, k)?;
            if w.len < layout.bytes {
                return Err(BackendError::Shape(format!(
                    "a {ty} weight of {n} x {k} needs {} bytes, its buffer has {}",
                    layout.bytes, w.len
                )));
            }
            row_words = layout.row_words() as u32;
            nb = layout.blocks_per_row as u32;
        }
        if let Act::Int8(xq, xs) = act {
            if self.mq_tokens > 0 && m >= self.mq_tokens && m < self.tile_tokens {
                for &(w, n, y) in parts {
                    self.product_mq(fmt, w.ptr(), n, k, (xq, xs), m, y, (row_words, nb))?;
                }
                return Ok(());
            }
        }
        let nt = tokens_per_launch(m);
        // One launch per part, the same arguments around the activations:
        // the prefill tiles (f16 rows, or int8 values and scales) and the
        // f32 mat-vec. Int8 mat-vecs join up to three parts a launch.
        let (name, (bn, bm), threads, acts) = match act {
            Act::F16(xh) => (
                format!("mm_f16_{fmt}"),
                (MF_BN, MF_BM),
                256,
                vec![Arg::P(xh)],
            ),
            Act::Int8(xq, xs) if m >= self.tile_tokens => (
                format!("mm_q8_{fmt}"),
                (MM_BN, MM_BM),
                128,
                vec![Arg::P(xq), Arg::P(xs)],
            ),
            Act::F32(x) => (
                format!("mv_f_{fmt}_{nt}"),
                (MV_WARPS, nt),
                MV_WARPS * 32,
                vec![Arg::P(x)],
            ),
            Act::Int8(xq, xs) => {
                for group in parts.chunks(3) {
                    let (mut ws, mut ys, mut ends) = ([0u64; 3], [0u64; 3], [0u32; 3]);
                    let mut end = 0u32;
                    for i in 0..3 {
                        if let Some(&(w, n, y)) = group.get(i) {
                            ws[i] = w.ptr();
                            ys[i] = y;
                            end += n as u32;
                        }
                        ends[i] = end;
                    }
                    let (name, gx, gy) = if self.mv_rows == 0 {
                        // As many blocks as the device holds at once: each
                        // warp walks its rows, loading one unit ahead.
                        let gy = blocks(m as u64, nt);
                        let name = format!("mv_q8_{fmt}_{nt}");
                        let resident = self.resident_blocks(&name, MV_WARPS * 32)?;
                        let rows_grid = blocks(u64::from(end), MV_WARPS);
                        (name, rows_grid.min((resident / gy).max(1)), gy)
                    } else {
                        let nt = mvr_tokens(m);
                        let r = mvr_rows(self.mv_rows, nt);
                        let name = format!("mvr_q8_{fmt}_{nt}_{r}");
                        (
                            name,
                            blocks(u64::from(end), MV_WARPS * r),
                            blocks(m as u64, nt),
                        )
                    };
                    self.launch(
                        &name,
                        (gx, gy, 1),
                        MV_WARPS * 32,
                        &[
                            Arg::P(ws[0]),
                            Arg::P(ws[1]),
                            Arg::P(ws[2]),
                            Arg::U(ends[0]),
                            Arg::U(ends[1]),
                            Arg::U(ends[2]),
                            Arg::U(row_words),
                            Arg::U(nb),
                            Arg::P(xq),
                            Arg::P(xs),
                            Arg::P(ys[0]),
                            Arg::P(ys[1]),
                            Arg::P(ys[2]),
                            Arg::U(k as u32),
                            Arg::U(m as u32),
                        ],
                    )?;
                }
                return Ok(());
            }
        };
        let mut rest = parts.to_vec();
        if let Act::F16(xh) = act {
            if m >= self.dequant_tokens {
                let mut left = Vec::new();
                for (w, n, y) in rest {
                    if !self.product_h16(ty, fmt, w, n, k, xh, m, y, row_words, nb)? {
                        left.push((w, n, y));
                    }
                }
                rest = left;
            }
        }
        for (w, n, y) in rest {
            let grid = (blocks(n as u64, bn), blocks(m as u64, bm), 1);
            let mut args = vec![Arg::P(w.ptr()), Arg::U(row_words), Arg::U(nb)];
            args.extend(acts.iter().copied());
            args.extend([
                Arg::P(y),
                Arg::U(n as u32),
                Arg::U(k as u32),
                Arg::U(m as u32),
                Arg::U(n as u32),
            ]);
            self.launch(&name, grid, threads, &args)?;
        }
        Ok(())
    }

    /// `y[t, ..n] = x[t, :] · Wᵀ` for a few tokens (`m` below the tiles')
    /// of int8 activations on `mq_q8`: blocks of 32 rows by 16 tokens, the
    /// k stages split across enough blocks to fill the device, the splits'
    /// partial sums added by `mq_reduce`.
    #[allow(clippy::too_many_arguments)]
    fn product_mq(
        &mut self,
        fmt: &str,
        w: u64,
        n: usize,
        k: usize,
        (xq, xs): (u64, u64),
        m: usize,
        y: u64,
        (row_words, nb): (u32, u32),
    ) -> Result<(), BackendError> {
        let grid = (blocks(n as u64, MQ_BN), blocks(m as u64, MQ_BM));
        let stages = k.div_ceil(MQ_KC) as u32;
        let want = match self.mq_splits {
            0 => (MQ_BLOCKS_PER_SM * self.sm_count).div_ceil(grid.0 * grid.1),
            n => n,
        };
        let per = stages.div_ceil(want.clamp(1, stages.max(1)));
        let splits = stages.div_ceil(per.max(1)).max(1);
        let part = if splits > 1 {
            self.scratch("mq partials", u64::from(splits) * (m * n * 4) as u64)?
        } else {
            0
        };
        self.launch(
            &format!("mq_q8_{fmt}"),
            (grid.0, grid.1, splits),
            128,
            &[
                Arg::P(w),
                Arg::U(row_words),
                Arg::U(nb),
                Arg::P(xq),
                Arg::P(xs),
                Arg::P(y),
                Arg::P(part),
                Arg::U(n as u32),
                Arg::U(k as u32),
                Arg::U(m as u32),
                Arg::U(n as u32),
                Arg::U(per),
            ],
        )?;
        if splits > 1 {
            self.elementwise_n(
                "mq_reduce",
                (n * m) as u64,
                &[
                    Arg::P(part),
                    Arg::P(y),
                    Arg::U(n as u32),
                    Arg::U(m as u32),
                    Arg::U(n as u32),
                    Arg::U(splits),
                ],
            )?;
        }
        Ok(())
    }

    /// `y[t, ..n] = x[t, :] · Wᵀ` for `m` tokens of f16 rows at `xh`: the
    /// weight dequantized to f16 rows once (an f16 weight as it is), then
    /// the pipelined f16 tiles. A weight of more than `DEQUANT_MAX_BYTES`
    /// as f16 (an output head) is left to the caller's tiles: false.
    #[allow(clippy::too_many_arguments)]
    fn product_h16(
        &mut self,
        ty: GgmlType,
        fmt: &str,
        w: &CudaBuffer,
        n: usize,
        k: usize,
        xh: u64,
        m: usize,
        y: u64,
        row_words: u32,
        nb: u32,
    ) -> Result<bool, BackendError> {
        let half_bytes = (n * k * 2) as u64;
        let wh = if ty == GgmlType::F16 && u64::from(row_words) * 4 == (k * 2) as u64 {
            w.ptr()
        } else if half_bytes <= DEQUANT_MAX_BYTES {
            let wh = self.scratch("f16 weights", half_bytes)?;
            let groups = (n * k / 8) as u64;
            self.launch(
                &format!("dequant_f16_{fmt}"),
                (blocks(groups, 256), 1, 1),
                256,
                &[
                    Arg::P(w.ptr()),
                    Arg::U(row_words),
                    Arg::U(nb),
                    Arg::P(wh),
                    Arg::U(n as u32),
                    Arg::U(k as u32),
                ],
            )?;
            wh
        } else {
            return Ok(false);
        };
        // Token tiles along x: the tiles of one weight tile run side by side.
        let grid = (blocks(m as u64, MF_BM), blocks(n as u64, MF_BN), 1);
        self.launch_smem(
            "mm_h16",
            grid,
            256,
            MH_SMEM,
            &[
                Arg::P(xh),
                Arg::P(wh),
                Arg::P(y),
                Arg::U(n as u32),
                Arg::U(k as u32),
                Arg::U(m as u32),
                Arg::U(n as u32),
            ],
        )?;
        Ok(true)
    }

    fn matmul(&mut self, op: &Op, io: &OpIo<'_, CudaBuffer>) -> Result<(), BackendError> {
        let Op::MatMul { ty, k, n, exact } = *op else {
            return Err(BackendError::unsupported_op(&self.caps, op));
        };
        let x = nth(io.inputs, 0, op)?;
        let w = nth(io.inputs, 1, op)?;
        let y = nth(io.outputs, 0, op)?;
        let m = (x.len / (4 * k as u64)) as usize;
        if x.len % (4 * k as u64) != 0 || y.len < (m * n * 4) as u64 {
            return Err(shape(op, format!("x of {} bytes, y of {}", x.len, y.len)));
        }
        if m == 0 {
            return Ok(());
        }
        let act = if self.f16_tiles(ty, k, m, exact) {
            Act::F16(self.halves(x.ptr(), m, k)?)
        } else if ty.is_quantized() && !exact {
            let (xq, xs) = self.quantize(ty, x.ptr(), m, k)?;
            Act::Int8(xq, xs)
        } else {
            Act::F32(x.ptr())
        };
        self.products(ty, &[(w, n, y.ptr())], k, act, m)
    }

    fn fused_matmul(&mut self, op: &Op, io: &OpIo<'_, CudaBuffer>) -> Result<(), BackendError> {
        let Op::FusedMatMul {
            pre,
            k,
            ref parts,
            exact,
            rows,
        } = *op
        else {
            return Err(BackendError::unsupported_op(&self.caps, op));
        };
        let (n_in, n_out) = pre.arity();
        let bytes = (rows * k * 4) as u64;
        // When every product takes int8 of one rounding, the prologue's
        // kernel quantizes its output too (one launch fewer, x not re-read).
        let roundings: Vec<bool> = parts.iter().map(|&(ty, _)| per_256(ty)).collect();
        // Prefill: every product on the f16 tiles, x converted once.
        let f16 = !parts.is_empty()
            && parts
                .iter()
                .all(|&(ty, _)| self.f16_tiles(ty, k, rows, exact));
        let all_int8 = !f16 && !exact && parts.iter().all(|&(ty, _)| ty.is_quantized());
        let fused_q = match roundings.first() {
            Some(&r) if all_int8 && roundings.iter().all(|&o| o == r) && rows > 0 => {
                let (xq, xs) = self.quant_scratch(r, bytes / 4)?;
                Some((r, xq, xs))
            }
            _ => None,
        };
        let q_args = |q: Option<(bool, u64, u64)>| match q {
            Some((r, xq, xs)) => [Arg::U(u32::from(r)), Arg::P(xq), Arg::P(xs)],
            None => [Arg::U(0), Arg::P(0), Arg::P(0)],
        };
        // The prologue writes x (or x is input 0).
        let x = match pre {
            Prologue::None => {
                let x = nth(io.inputs, 0, op)?;
                if x.len < bytes {
                    return Err(shape(op, format!("x of {} bytes", x.len)));
                }
                x.ptr()
            }
            Prologue::RmsNorm { eps } => {
                let (a, w, x) = (
                    nth(io.inputs, 0, op)?,
                    nth(io.inputs, 1, op)?,
                    nth(io.outputs, 0, op)?,
                );
                if a.len < bytes || x.len < bytes || w.len < (k * 4) as u64 {
                    return Err(shape(op, "prologue buffers too small".into()));
                }
                let mut args = vec![
                    Arg::P(a.ptr()),
                    Arg::P(w.ptr()),
                    Arg::P(x.ptr()),
                    Arg::U(k as u32),
                    Arg::F(eps),
                ];
                let name = if fused_q.is_some() {
                    args.extend(q_args(fused_q));
                    "rms_norm_q8"
                } else {
                    "rms_norm_f32"
                };
                self.launch(name, (rows as u32, 1, 1), ROW_BLOCK, &args)?;
                x.ptr()
            }
            Prologue::AddRmsNorm { eps } => {
                let (a, b, w) = (
                    nth(io.inputs, 0, op)?,
                    nth(io.inputs, 1, op)?,
                    nth(io.inputs, 2, op)?,
                );
                let (s, x) = (nth(io.outputs, 0, op)?, nth(io.outputs, 1, op)?);
                if a.len < bytes
                    || b.len < bytes
                    || s.len < bytes
                    || x.len < bytes
                    || w.len < (k * 4) as u64
                {
                    return Err(shape(op, "prologue buffers too small".into()));
                }
                let mut args = vec![
                    Arg::P(a.ptr()),
                    Arg::P(b.ptr()),
                    Arg::P(w.ptr()),
                    Arg::P(s.ptr()),
                    Arg::P(x.ptr()),
                    Arg::U(k as u32),
                    Arg::F(eps),
                ];
                let name = if fused_q.is_some() {
                    args.extend(q_args(fused_q));
                    "add_rms_norm_q8"
                } else {
                    "add_rms_norm_f32"
                };
                self.launch(name, (rows as u32, 1, 1), ROW_BLOCK, &args)?;
                x.ptr()
            }
            Prologue::Glu(act) => {
                let (g, u, x) = (
                    nth(io.inputs, 0, op)?,
                    nth(io.inputs, 1, op)?,
                    nth(io.outputs, 0, op)?,
                );
                if g.len < bytes || u.len < bytes || x.len < bytes {
                    return Err(shape(op, "prologue buffers too small".into()));
                }
                let n = (rows * k) as u64;
                if fused_q.is_some() {
                    let mut args = vec![
                        Arg::P(g.ptr()),
                        Arg::P(u.ptr()),
                        Arg::P(x.ptr()),
                        Arg::U(n as u32),
                        Arg::U(u32::from(act == Activation::GeluTanh)),
                    ];
                    args.extend(q_args(fused_q));
                    self.launch("glu_q8", (blocks(n.div_ceil(256), 4), 1, 1), 128, &args)?;
                } else {
                    let name = match act {
                        Activation::Silu => "silu_mul_f32",
                        Activation::GeluTanh => "gelu_mul_f32",
                    };
                    self.elementwise(
                        name,
                        n,
                        &[
                            Arg::P(g.ptr()),
                            Arg::P(u.ptr()),
                            Arg::P(x.ptr()),
                            Arg::U(n as u32),
                        ],
                    )?;
                }
                x.ptr()
            }
        };
        if rows == 0 {
            return Ok(());
        }
        // x quantized once for all products of each rounding (q8_K, q8_0),
        // unless the prologue did it.
        let mut quantized: [Option<(u64, u64)>; 2] = [None, None];
        match fused_q {
            Some((r, xq, xs)) if !matches!(pre, Prologue::None) => {
                quantized[usize::from(r)] = Some((xq, xs));
            }
            _ => {}
        }
        let xh = if f16 {
            Some(self.halves(x, rows, k)?)
        } else {
            None
        };
        // Consecutive products of one type share a launch.
        let mut i = 0;
        while i < parts.len() {
            let ty = parts[i].0;
            let mut group = Vec::new();
            while i < parts.len() && parts[i].0 == ty {
                let n = parts[i].1;
                let w = nth(io.inputs, n_in + i, op)?;
                let y = nth(io.outputs, n_out + i, op)?;
                if y.len < (rows * n * 4) as u64 {
                    return Err(shape(op, format!("product {i} of {} bytes", y.len)));
                }
                group.push((w, n, y.ptr()));
                i += 1;
            }
            let act = if let Some(xh) = xh {
                Act::F16(xh)
            } else if ty.is_quantized() && !exact {
                let slot = usize::from(per_256(ty));
                let (xq, xs) = match quantized[slot] {
                    Some(q) => q,
                    None => self.quantize(ty, x, rows, k)?,
                };
                quantized[slot] = Some((xq, xs));
                Act::Int8(xq, xs)
            } else {
                Act::F32(x)
            };
            self.products(ty, &group, k, act, rows)?;
        }
        Ok(())
    }

    fn get_rows(&mut self, op: &Op, io: &OpIo<'_, CudaBuffer>) -> Result<(), BackendError> {
        let Op::GetRows { ty, width } = *op else {
            return Err(BackendError::unsupported_op(&self.caps, op));
        };
        let (table, ids, out) = (
            nth(io.inputs, 0, op)?,
            nth(io.inputs, 1, op)?,
            nth(io.outputs, 0, op)?,
        );
        let tokens = (ids.len / 4) as usize;
        if out.len < (tokens * width * 4) as u64 {
            return Err(shape(op, format!("{tokens} ids into {} bytes", out.len)));
        }
        if tokens == 0 {
            return Ok(());
        }
        let layout = self.layout(ty, 1, width)?;
        let fmt = format_name(ty).ok_or_else(|| BackendError::unsupported_op(&self.caps, op))?;
        // The kernel trusts the ids: the tokenizer and the engine check
        // them against the vocabulary before a step is made.
        let groups = (width / 8) as u64;
        self.launch(
            &format!("get_rows_{fmt}"),
            (blocks(groups, 128), tokens as u32, 1),
            128,
            &[
                Arg::P(table.ptr()),
                Arg::U(layout.row_words() as u32),
                Arg::U(layout.blocks_per_row as u32),
                Arg::P(ids.ptr()),
                Arg::P(out.ptr()),
                Arg::U(width as u32),
            ],
        )
    }

    fn rope(
        &mut self,
        spec: RopeSpec,
        x: &CudaBuffer,
        pos: &CudaBuffer,
        ff: Option<&CudaBuffer>,
        out: &CudaBuffer,
    ) -> Result<(), BackendError> {
        let rows = (pos.len / 4) as usize;
        let RopeSpec {
            mode,
            head_dim,
            n_rot,
            base,
            scale,
        } = spec;
        if rows == 0 {
            return Ok(());
        }
        if head_dim == 0 || !x.len.is_multiple_of((rows * head_dim * 4) as u64) || out.len < x.len {
            return Err(BackendError::Shape(format!(
                "RoPE of {} bytes over {rows} positions and heads of {head_dim}",
                x.len
            )));
        }
        let heads = (x.len / (rows * head_dim * 4) as u64) as usize;
        let rotates = n_rot >= 2 && n_rot <= head_dim;
        if !rotates {
            return self.copy(out.ptr(), x.ptr(), x.len);
        }
        let theta_scale = base.powf(-2.0 / n_rot as f32);
        let n = (rows * heads * head_dim / 2) as u64;
        self.elementwise(
            "rope_f32",
            n,
            &[
                Arg::P(x.ptr()),
                Arg::P(pos.ptr()),
                Arg::P(ff.map_or(0, CudaBuffer::ptr)),
                Arg::P(out.ptr()),
                Arg::U(heads as u32),
                Arg::U(head_dim as u32),
                Arg::U(n_rot as u32),
                Arg::F(theta_scale),
                Arg::F(scale),
                Arg::U(match mode {
                    RopeMode::Norm => 0,
                    RopeMode::Neox => 1,
                }),
                Arg::U(rows as u32),
            ],
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn kv_write(
        &mut self,
        k: &CudaBuffer,
        v: &CudaBuffer,
        slots: &CudaBuffer,
        kc: &CudaBuffer,
        vc: &CudaBuffer,
        k_width: usize,
        v_width: usize,
        dtype: KvType,
    ) -> Result<(), BackendError> {
        let rows = (slots.len / 4) as usize;
        if k.len < (rows * k_width * 4) as u64 || v.len < (rows * v_width * 4) as u64 {
            return Err(BackendError::Shape(format!(
                "K/V write of {rows} rows from {} / {} bytes",
                k.len, v.len
            )));
        }
        // Slots past the cache would write outside it; the scheduler hands
        // out slots of its blocks only, and the kernel trusts them.
        let n = (rows * k_width.max(v_width)) as u64;
        self.elementwise(
            "kv_write",
            n,
            &[
                Arg::P(k.ptr()),
                Arg::P(v.ptr()),
                Arg::P(slots.ptr()),
                Arg::P(kc.ptr()),
                Arg::P(vc.ptr()),
                Arg::U(k_width as u32),
                Arg::U(v_width as u32),
                Arg::U(rows as u32),
                Arg::U(u32::from(dtype == KvType::F16)),
            ],
        )
    }

    fn attention(&mut self, op: &Op, io: &OpIo<'_, CudaBuffer>) -> Result<(), BackendError> {
        let Op::PagedAttention {
            n_head,
            n_head_kv,
            head_dim_k,
            head_dim_v,
            scale,
            window,
            softcap,
            block_size,
            dtype,
            ..
        } = *op
        else {
            return Err(BackendError::unsupported_op(&self.caps, op));
        };
        let q = nth(io.inputs, 0, op)?;
        let (kc, vc) = (nth(io.inputs, 1, op)?, nth(io.inputs, 2, op)?);
        let (seqs, tables) = (nth(io.inputs, 3, op)?, nth(io.inputs, 4, op)?);
        let out = nth(io.outputs, 0, op)?;
        let rows = (q.len / (4 * (n_head * head_dim_k) as u64)) as usize;
        if out.len < (rows * n_head * head_dim_v * 4) as u64 {
            return Err(shape(op, format!("{rows} rows into {} bytes", out.len)));
        }
        if rows == 0 {
            return Ok(());
        }
        let group = n_head / n_head_kv.max(1);
        let n_seq = (seqs.len / 16) as usize;
        let flash_fits = self.flash_rows > 0
            && rows >= self.flash_rows
            && self.att_warps == 0
            && dtype == KvType::F16
            && n_head_kv > 0
            && n_head % n_head_kv == 0
            && head_dim_k == head_dim_v
            && matches!(head_dim_k, 64 | 128);
        if flash_fits {
            // Blocks are numbered over the sequences, ceil(len * group /
            // FA_ROWS) each: at most one partial block a sequence past the
            // full ones.
            let blocks = (rows * group).div_ceil(FA_ROWS) + n_seq.min(rows);
            let smem = ((FA_ROWS + 4 * FA_KEYS) * (head_dim_k + 8) * 2) as u32;
            return self.launch_smem(
                &format!("flash_attention_{head_dim_k}"),
                (n_head_kv as u32, blocks as u32, 1),
                128,
                smem,
                &[
                    Arg::P(q.ptr()),
                    Arg::P(kc.ptr()),
                    Arg::P(vc.ptr()),
                    Arg::P(seqs.ptr()),
                    Arg::U(n_seq as u32),
                    Arg::P(tables.ptr()),
                    Arg::P(out.ptr()),
                    Arg::U(n_head as u32),
                    Arg::U(n_head_kv as u32),
                    Arg::F(scale),
                    Arg::U(window.unwrap_or(0) as u32),
                    Arg::F(softcap.unwrap_or(0.0)),
                    Arg::U(block_size as u32),
                ],
            );
        }
        let split_fits = n_head_kv > 0
            && n_head % n_head_kv == 0
            && group <= ATT_SPLIT_HEADS
            && group * head_dim_k <= ATT_MAX_Q
            && head_dim_k % 2 == 0
            && head_dim_v % 2 == 0
            && self.att_warps == 0;
        if split_fits {
            // Enough blocks to fill the device whatever the context: the
            // count is fixed when the step is recorded, the keys of each
            // split follow the lengths when it runs.
            let splits = ATT_TARGET_BLOCKS
                .div_ceil(n_head_kv * rows)
                .clamp(1, ATT_MAX_SPLITS) as u32;
            let part = if splits > 1 {
                let floats = rows * n_head * splits as usize * (head_dim_v + 2);
                self.scratch("attention partials", (floats * 4) as u64)?
            } else {
                0
            };
            self.launch(
                "paged_attention_split",
                (n_head_kv as u32, rows as u32, splits),
                128,
                &[
                    Arg::P(q.ptr()),
                    Arg::P(kc.ptr()),
                    Arg::P(vc.ptr()),
                    Arg::P(seqs.ptr()),
                    Arg::U(n_seq as u32),
                    Arg::P(tables.ptr()),
                    Arg::P(out.ptr()),
                    Arg::P(part),
                    Arg::U(n_head as u32),
                    Arg::U(n_head_kv as u32),
                    Arg::U(head_dim_k as u32),
                    Arg::U(head_dim_v as u32),
                    Arg::F(scale),
                    Arg::U(window.unwrap_or(0) as u32),
                    Arg::F(softcap.unwrap_or(0.0)),
                    Arg::U(block_size as u32),
                    Arg::U(u32::from(dtype == KvType::F16)),
                    Arg::U(splits),
                ],
            )?;
            if splits > 1 {
                self.launch(
                    "attention_combine",
                    (n_head as u32, rows as u32, 1),
                    128,
                    &[
                        Arg::P(part),
                        Arg::P(out.ptr()),
                        Arg::P(seqs.ptr()),
                        Arg::U((seqs.len / 16) as u32),
                        Arg::U(window.unwrap_or(0) as u32),
                        Arg::U(n_head as u32),
                        Arg::U(head_dim_v as u32),
                        Arg::U(splits),
                    ],
                )?;
            }
            return Ok(());
        }
        let warps = if self.att_warps == 0 {
            4
        } else {
            self.att_warps
        };
        self.launch(
            &format!("paged_attention_{warps}"),
            (n_head as u32, rows as u32, 1),
            warps * 32,
            &[
                Arg::P(q.ptr()),
                Arg::P(kc.ptr()),
                Arg::P(vc.ptr()),
                Arg::P(seqs.ptr()),
                Arg::U((seqs.len / 16) as u32),
                Arg::P(tables.ptr()),
                Arg::P(out.ptr()),
                Arg::U(n_head as u32),
                Arg::U(n_head_kv as u32),
                Arg::U(head_dim_k as u32),
                Arg::U(head_dim_v as u32),
                Arg::F(scale),
                Arg::U(window.unwrap_or(0) as u32),
                Arg::F(softcap.unwrap_or(0.0)),
                Arg::U(block_size as u32),
                Arg::U(u32::from(dtype == KvType::F16)),
            ],
        )
    }

    fn moe_experts(&mut self, op: &Op, io: &OpIo<'_, CudaBuffer>) -> Result<(), BackendError> {
        let Op::MoeExperts {
            n_expert,
            k,
            n_embd,
            n_ff,
            act,
            tys,
            ..
        } = *op
        else {
            return Err(BackendError::unsupported_op(&self.caps, op));
        };
        let x = nth(io.inputs, 0, op)?;
        let (ids, wts) = (nth(io.inputs, 1, op)?, nth(io.inputs, 2, op)?);
        let out = nth(io.outputs, 0, op)?;
        let tokens = (x.len / (4 * n_embd as u64)) as usize;
        let pairs = tokens * k;
        if ids.len < (pairs * 4) as u64 || wts.len < (pairs * 4) as u64 || out.len < x.len {
            return Err(shape(
                op,
                format!("{tokens} tokens, ids of {} bytes", ids.len),
            ));
        }
        if pairs == 0 {
            return Ok(());
        }
        let gate_up = (pairs * n_ff * 4) as u64;
        let hg = self.scratch("expert gate", gate_up)?;
        let hu = self.scratch("expert up", gate_up)?;
        let yd = self.scratch("expert down", (pairs * n_embd * 4) as u64)?;
        let expert =
            |b: &mut Self, i: usize, x: u64, x_div: usize, y: u64, n: usize, cols: usize| {
                let w = nth(io.inputs, 3 + i, op)?;
                let layout = b.layout(tys[i], n_expert * n, cols)?;
                if w.len < layout.bytes {
                    return Err(shape(op, format!("expert weight {i} of {} bytes", w.len)));
                }
                let fmt =
                    format_name(tys[i]).ok_or_else(|| BackendError::unsupported_op(&b.caps, op))?;
                b.launch(
                    &format!("moe_mv_{fmt}"),
                    (blocks(n as u64, MV_WARPS), pairs as u32, 1),
                    MV_WARPS * 32,
                    &[
                        Arg::P(w.ptr()),
                        Arg::U(layout.row_words() as u32),
                        Arg::U(layout.blocks_per_row as u32),
                        Arg::P(x),
                        Arg::P(ids.ptr()),
                        Arg::U(x_div as u32),
                        Arg::P(y),
                        Arg::U(n as u32),
                        Arg::U(cols as u32),
                        Arg::U(n_expert as u32),
                    ],
                )
            };
        expert(self, 0, x.ptr(), k, hg, n_ff, n_embd)?;
        expert(self, 1, x.ptr(), k, hu, n_ff, n_embd)?;
        let glu = match act {
            Activation::Silu => "silu_mul_f32",
            Activation::GeluTanh => "gelu_mul_f32",
        };
        let n = (pairs * n_ff) as u64;
        self.elementwise(
            glu,
            n,
            &[Arg::P(hg), Arg::P(hu), Arg::P(hg), Arg::U(n as u32)],
        )?;
        expert(self, 2, hg, 1, yd, n_embd, n_ff)?;
        let total = (tokens * n_embd) as u64;
        self.elementwise(
            "moe_combine",
            total,
            &[
                Arg::P(yd),
                Arg::P(wts.ptr()),
                Arg::P(ids.ptr()),
                Arg::P(out.ptr()),
                Arg::U(n_embd as u32),
                Arg::U(k as u32),
                Arg::U(total as u32),
                Arg::U(n_expert as u32),
            ],
        )
    }

    fn record_op(&mut self, op: &Op, io: &OpIo<'_, CudaBuffer>) -> Result<(), BackendError> {
        let input = |i: usize| nth(io.inputs, i, op);
        let output = |i: usize| nth(io.outputs, i, op);
        let f32s = |b: &CudaBuffer| b.len / 4;
        match *op {
            Op::GetRows { .. } => self.get_rows(op, io),
            Op::MatMul { .. } => self.matmul(op, io),
            Op::FusedMatMul { .. } => self.fused_matmul(op, io),
            Op::RmsNorm { width, eps } => {
                let (x, w, y) = (input(0)?, input(1)?, output(0)?);
                let rows = f32s(x) / width.max(1) as u64;
                if width == 0 || y.len < x.len || w.len < (width * 4) as u64 {
                    return Err(shape(op, format!("x of {} bytes", x.len)));
                }
                if rows == 0 {
                    return Ok(());
                }
                self.launch(
                    "rms_norm_f32",
                    (rows as u32, 1, 1),
                    ROW_BLOCK,
                    &[
                        Arg::P(x.ptr()),
                        Arg::P(w.ptr()),
                        Arg::P(y.ptr()),
                        Arg::U(width as u32),
                        Arg::F(eps),
                    ],
                )
            }
            Op::Rope { .. } => {
                let spec =
                    RopeSpec::of(op).ok_or_else(|| BackendError::unsupported_op(&self.caps, op))?;
                let ff = io.inputs.get(2).copied();
                self.rope(spec, input(0)?, input(1)?, ff, output(0)?)
            }
            Op::Add | Op::Mul | Op::SiluMul | Op::GeluTanhMul => {
                let (x, y, out) = (input(0)?, input(1)?, output(0)?);
                if y.len < x.len || out.len < x.len {
                    return Err(shape(
                        op,
                        format!("{} / {} / {} bytes", x.len, y.len, out.len),
                    ));
                }
                let name = match op {
                    Op::Add => "add_f32",
                    Op::Mul => "mul_f32",
                    Op::SiluMul => "silu_mul_f32",
                    _ => "gelu_mul_f32",
                };
                let n = f32s(x);
                self.elementwise(
                    name,
                    n,
                    &[
                        Arg::P(x.ptr()),
                        Arg::P(y.ptr()),
                        Arg::P(out.ptr()),
                        Arg::U(n as u32),
                    ],
                )
            }
            Op::Scale(s) | Op::LogitSoftcap(s) => {
                let (x, out) = (input(0)?, output(0)?);
                if out.len < x.len {
                    return Err(shape(op, format!("{} bytes into {}", x.len, out.len)));
                }
                let name = if matches!(op, Op::Scale(_)) {
                    "scale_f32"
                } else {
                    "softcap_f32"
                };
                let n = f32s(x);
                self.elementwise(
                    name,
                    n,
                    &[
                        Arg::P(x.ptr()),
                        Arg::P(out.ptr()),
                        Arg::F(s),
                        Arg::U(n as u32),
                    ],
                )
            }
            Op::BiasAdd => {
                let (x, bias, out) = (input(0)?, input(1)?, output(0)?);
                let width = f32s(bias);
                if width == 0 || f32s(x) % width != 0 || out.len < x.len {
                    return Err(shape(
                        op,
                        format!("x of {} bytes, bias of {}", x.len, bias.len),
                    ));
                }
                let n = f32s(x);
                self.elementwise(
                    "bias_add_f32",
                    n,
                    &[
                        Arg::P(x.ptr()),
                        Arg::P(bias.ptr()),
                        Arg::P(out.ptr()),
                        Arg::U(width as u32),
                        Arg::U(n as u32),
                    ],
                )
            }
            Op::Softmax { width } => {
                let (x, out) = (input(0)?, output(0)?);
                let rows = f32s(x) / width.max(1) as u64;
                if width == 0 || out.len < x.len {
                    return Err(shape(op, format!("x of {} bytes", x.len)));
                }
                if rows == 0 {
                    return Ok(());
                }
                self.launch(
                    "softmax_f32",
                    (rows as u32, 1, 1),
                    ROW_BLOCK,
                    &[Arg::P(x.ptr()), Arg::P(out.ptr()), Arg::U(width as u32)],
                )
            }
            Op::KvWrite {
                k_width,
                v_width,
                dtype,
                ..
            } => self.kv_write(
                input(0)?,
                input(1)?,
                input(2)?,
                output(0)?,
                output(1)?,
                k_width,
                v_width,
                dtype,
            ),
            Op::RopeKvWrite {
                rope,
                k_width,
                v_width,
                dtype,
                ..
            } => {
                let (q, k, v, pos, slots) = (input(0)?, input(1)?, input(2)?, input(3)?, input(4)?);
                let ff = io.inputs.get(5).copied();
                let (qo, ko, kc, vc) = (output(0)?, output(1)?, output(2)?, output(3)?);
                let rows = (pos.len / 4) as usize;
                let hd = rope.head_dim;
                let fits = rows > 0
                    && hd > 0
                    && rope.n_rot >= 2
                    && rope.n_rot <= hd
                    && k_width.is_multiple_of(hd)
                    && q.len.is_multiple_of((rows * hd * 4) as u64)
                    && k.len >= (rows * k_width * 4) as u64
                    && v.len >= (rows * v_width * 4) as u64
                    && qo.len >= q.len
                    && ko.len >= (rows * k_width * 4) as u64
                    && slots.len >= (rows * 4) as u64;
                if !fits {
                    // Edge shapes take the ops apart (their own checks and errors).
                    self.rope(rope, q, pos, ff, qo)?;
                    self.rope(rope, k, pos, ff, ko)?;
                    return self.kv_write(ko, v, slots, kc, vc, k_width, v_width, dtype);
                }
                let q_heads = (q.len / (rows * hd * 4) as u64) as u32;
                let kv_heads = (k_width / hd) as u32;
                let n = u64::from(q_heads + kv_heads) * (rows * hd / 2) as u64
                    + (rows * v_width) as u64;
                self.elementwise(
                    "rope_kv_write",
                    n,
                    &[
                        Arg::P(q.ptr()),
                        Arg::P(k.ptr()),
                        Arg::P(v.ptr()),
                        Arg::P(pos.ptr()),
                        Arg::P(slots.ptr()),
                        Arg::P(ff.map_or(0, CudaBuffer::ptr)),
                        Arg::P(qo.ptr()),
                        Arg::P(ko.ptr()),
                        Arg::P(kc.ptr()),
                        Arg::P(vc.ptr()),
                        Arg::U(q_heads),
                        Arg::U(kv_heads),
                        Arg::U(hd as u32),
                        Arg::U(rope.n_rot as u32),
                        Arg::F(rope.base.powf(-2.0 / rope.n_rot as f32)),
                        Arg::F(rope.scale),
                        Arg::U(match rope.mode {
                            RopeMode::Norm => 0,
                            RopeMode::Neox => 1,
                        }),
                        Arg::U(rows as u32),
                        Arg::U(v_width as u32),
                        Arg::U(u32::from(dtype == KvType::F16)),
                    ],
                )
            }
            Op::PagedAttention { .. } => self.attention(op, io),
            Op::MoeTopK { n_expert, k } => {
                let (logits, ids, wts) = (input(0)?, output(0)?, output(1)?);
                let tokens = f32s(logits) / n_expert.max(1) as u64;
                if n_expert == 0
                    || k == 0
                    || k > n_expert
                    || ids.len < tokens * k as u64 * 4
                    || wts.len < tokens * k as u64 * 4
                {
                    return Err(shape(op, format!("{} bytes of logits", logits.len)));
                }
                if tokens == 0 {
                    return Ok(());
                }
                self.elementwise(
                    "moe_top_k",
                    tokens,
                    &[
                        Arg::P(logits.ptr()),
                        Arg::P(ids.ptr()),
                        Arg::P(wts.ptr()),
                        Arg::U(n_expert as u32),
                        Arg::U(k as u32),
                        Arg::U(tokens as u32),
                    ],
                )
            }
            Op::MoeExperts { .. } => self.moe_experts(op, io),
            Op::Argmax { width } => {
                let (x, out) = (input(0)?, output(0)?);
                let rows = f32s(x) / width.max(1) as u64;
                if width == 0 || out.len < rows * 4 {
                    return Err(shape(op, format!("x of {} bytes", x.len)));
                }
                if rows == 0 {
                    return Ok(());
                }
                if width < ARGMAX_SLICE * 2 {
                    return self.launch(
                        "argmax_f32",
                        (rows as u32, 1, 1),
                        ROW_BLOCK,
                        &[Arg::P(x.ptr()), Arg::P(out.ptr()), Arg::U(width as u32)],
                    );
                }
                // Wide rows (a vocabulary): slices of a row in parallel,
                // then the best of the slices.
                let slices = width.div_ceil(ARGMAX_SLICE) as u32;
                let part = self.scratch("argmax slices", rows * u64::from(slices) * 12)?;
                self.launch(
                    "argmax_part",
                    (slices, rows as u32, 1),
                    ROW_BLOCK,
                    &[
                        Arg::P(x.ptr()),
                        Arg::P(part),
                        Arg::U(width as u32),
                        Arg::U(ARGMAX_SLICE as u32),
                    ],
                )?;
                self.launch(
                    "argmax_final",
                    (rows as u32, 1, 1),
                    32,
                    &[Arg::P(part), Arg::P(out.ptr()), Arg::U(slices)],
                )
            }
            Op::TopK { width, k } => {
                let (x, out) = (input(0)?, output(0)?);
                let rows = f32s(x) / width.max(1) as u64;
                if width == 0
                    || k == 0
                    || k > MAX_TOP_K
                    || k > width
                    || out.len < rows * k as u64 * 8
                {
                    return Err(shape(op, format!("x of {} bytes", x.len)));
                }
                if rows == 0 {
                    return Ok(());
                }
                if width < ARGMAX_SLICE * 2 {
                    return self.launch(
                        "top_k_f32",
                        (rows as u32, 1, 1),
                        ROW_BLOCK,
                        &[
                            Arg::P(x.ptr()),
                            Arg::P(out.ptr()),
                            Arg::U(width as u32),
                            Arg::U(k as u32),
                        ],
                    );
                }
                // Wide rows: each slice's k best in parallel, then the
                // row's k best of those.
                let slices = width.div_ceil(ARGMAX_SLICE) as u64;
                let part = self.scratch("top-k slices", rows * slices * k as u64 * 8)?;
                let flags = self.scratch("top-k slice flags", rows * slices * 4)?;
                self.launch(
                    "top_k_part",
                    (slices as u32, rows as u32, 1),
                    ROW_BLOCK,
                    &[
                        Arg::P(x.ptr()),
                        Arg::P(part),
                        Arg::P(flags),
                        Arg::U(width as u32),
                        Arg::U(ARGMAX_SLICE as u32),
                        Arg::U(k as u32),
                    ],
                )?;
                self.launch(
                    "top_k_final",
                    (rows as u32, 1, 1),
                    ROW_BLOCK,
                    &[
                        Arg::P(part),
                        Arg::P(flags),
                        Arg::P(out.ptr()),
                        Arg::U(slices as u32),
                        Arg::U(k as u32),
                    ],
                )
            }
        }
    }

    fn download_now(&self, src: &CudaBuffer, range: Range<u64>) -> Result<Vec<u8>, BackendError> {
        if range.start > range.end || range.end > src.len {
            return Err(BackendError::OutOfBounds {
                range,
                len: src.len,
            });
        }
        // Weight copies in flight go on: only an op reading their buffer
        // waits for them.
        self.stream.synchronize().map_err(driver)?;
        let mut out = vec![0u8; (range.end - range.start) as usize];
        if !out.is_empty() {
            self.bind()?;
            // SAFETY: the range lies in the buffer (checked above) and the
            // stream's work on it is done.
            unsafe { result::memcpy_dtoh_sync(&mut out, src.ptr() + range.start) }
                .map_err(driver)?;
        }
        Ok(out)
    }
}

impl Backend for CudaBackend {
    type Buffer = CudaBuffer;

    fn caps(&self) -> &Caps {
        &self.caps
    }

    fn alloc(&self, bytes: u64, kind: BufKind) -> Result<CudaBuffer, BackendError> {
        let what = match kind {
            BufKind::Weights => "weights",
            BufKind::Activations => "activations",
            BufKind::KvCache => "the K/V cache",
            BufKind::Readback => "results",
        };
        Ok(CudaBuffer {
            mem: self.malloc(bytes, what)?,
            offset: 0,
            len: bytes,
        })
    }

    fn upload(&self, dst: &CudaBuffer, offset: u64, src: &[u8]) -> Result<(), BackendError> {
        let end = offset + src.len() as u64;
        if end > dst.len {
            return Err(BackendError::OutOfBounds {
                range: offset..end,
                len: dst.len,
            });
        }
        if src.is_empty() {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: the range lies in the buffer (checked above); from pageable
        // host memory the call returns once `src` is staged, so it may go.
        unsafe { result::memcpy_htod_async(dst.ptr() + offset, src, self.stream.cu_stream()) }
            .map_err(driver)
    }

    fn weight_bytes(&self, ty: GgmlType, cols: usize, rows: usize) -> u64 {
        match self.layout(ty, rows, cols) {
            Ok(l) => l.bytes,
            Err(_) => (cols / ty.block_elems().max(1) * ty.block_bytes() * rows) as u64,
        }
    }

    fn upload_weight_rows(
        &self,
        dst: &CudaBuffer,
        ty: GgmlType,
        cols: usize,
        first_row: usize,
        src: &[u8],
    ) -> Result<(), BackendError> {
        let (offset, packed) = packed_rows(ty, cols, first_row, src)?;
        self.upload(dst, offset, &packed)?;
        // The staging copy of pageable memory may still be in flight
        // inside the driver: keep the loader's memory bounded.
        self.stream.synchronize().map_err(driver)
    }

    /// The runs repacked side by side (the expert cache fills many slots
    /// a step: one after the other, repack, copy and wait took 1.8 ms per
    /// 3 MB expert; streamed blocks come packed), then copied in order on
    /// the copy stream once the work recorded so far (the last reads of
    /// these buffers) is done, while the work recorded next runs up to the
    /// first op that reads one of them.
    fn upload_weight_rows_many(
        &self,
        runs: &[RowsUpload<'_, CudaBuffer>],
    ) -> Result<(), BackendError> {
        use rayon::prelude::*;
        use std::borrow::Cow;
        if runs.is_empty() {
            return Ok(());
        }
        if !self.batched_uploads {
            for r in runs {
                match r.packed_at {
                    Some(at) => self.upload(r.dst, at, r.src)?,
                    None => self.upload_weight_rows(r.dst, r.ty, r.cols, r.first_row, r.src)?,
                }
            }
            return self.stream.synchronize().map_err(driver);
        }
        // Each run's offset in its buffer and bytes, as the kernels read them.
        type Packed<'a> = Result<(u64, Cow<'a, [u8]>), BackendError>;
        let packed: Vec<Packed<'_>> = runs
            .par_iter()
            .map(|r| match r.packed_at {
                Some(at) => Ok((at, Cow::Borrowed(r.src))),
                None => packed_rows(r.ty, r.cols, r.first_row, r.src).map(|(o, v)| (o, v.into())),
            })
            .collect();
        let packed: Vec<(u64, Cow<'_, [u8]>)> = packed.into_iter().collect::<Result<_, _>>()?;
        for (r, (offset, bytes)) in runs.iter().zip(&packed) {
            let end = offset + bytes.len() as u64;
            if end > r.dst.len {
                return Err(BackendError::OutOfBounds {
                    range: *offset..end,
                    len: r.dst.len,
                });
            }
        }
        self.bind()?;
        // Rows packed at load (streamed blocks) are page-locked already;
        // the others stage through a page-locked buffer.
        let staged = |r: &RowsUpload<'_, CudaBuffer>| r.packed_at.is_none();
        let total: usize = runs
            .iter()
            .zip(&packed)
            .filter(|(r, _)| staged(r))
            .map(|(_, (_, b))| b.len())
            .sum();
        let mut staging = self.staging.borrow_mut();
        let mut stage = match total {
            0 => None,
            n => staging.take(&self.dev.ctx, n)?,
        };
        let no_timing = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let ready = self.stream.record_event(no_timing).map_err(driver)?;
        self.copy.wait(&ready).map_err(driver)?;
        let mut at = 0usize;
        for (r, (offset, bytes)) in runs.iter().zip(&packed) {
            let src: &[u8] = match stage.as_mut() {
                Some((_, buf)) if staged(r) => {
                    buf.write(at, bytes);
                    at += bytes.len();
                    &buf.bytes()[at - bytes.len()..at]
                }
                _ => bytes,
            };
            // SAFETY: the range lies in the buffer (checked above); the
            // source is page-locked memory kept until the copy is done (a
            // staging buffer waits for its event before it is written
            // again), or pageable memory, whose copy returns once staged.
            unsafe { result::memcpy_htod_async(r.dst.ptr() + offset, src, self.copy.cu_stream()) }
                .map_err(driver)?;
        }
        let done = Arc::new(self.copy.record_event(no_timing).map_err(driver)?);
        if let Some((i, _)) = stage {
            staging.busy[i] = Some(done.clone());
        }
        let mut copies = self.copies.borrow_mut();
        copies.extend(runs.iter().map(|r| (r.dst.ptr(), done.clone())));
        Ok(())
    }

    /// Page-locked memory, whose copies run beside the kernels (from
    /// pageable memory a copy returns only once the driver staged it,
    /// which waits for the work queued before it); the bytes as they are
    /// where the driver has no such memory to give.
    fn host_bytes(&self, bytes: Vec<u8>) -> Result<Box<dyn HostBytes>, BackendError> {
        Ok(match PinnedBytes::new(&self.dev.ctx, &bytes) {
            Some(p) => Box::new(p),
            None => Box::new(bytes),
        })
    }

    fn pack_weight_rows(
        &self,
        ty: GgmlType,
        cols: usize,
        first_row: usize,
        src: &[u8],
    ) -> Result<Option<(u64, Vec<u8>)>, BackendError> {
        packed_rows(ty, cols, first_row, src).map(Some)
    }

    fn memory_budget(&self) -> Option<u64> {
        self.bind().ok()?;
        result::mem_get_info().ok().map(|(free, _)| free as u64)
    }

    fn check_memory(&self, need: &MemoryNeed) -> Result<(), BackendError> {
        self.bind()?;
        let (free, total) = result::mem_get_info().map_err(driver)?;
        if need.total() > free as u64 {
            return Err(BackendError::from_device(CudaError::Driver(format!(
                "the model needs {need}, and {} has {:.2} GiB free of {:.2} GiB; load a smaller model or a shorter context (--ctx)",
                self.dev.name,
                free as f64 / f64::from(1u32 << 30),
                total as f64 / f64::from(1u32 << 30),
            ))));
        }
        Ok(())
    }

    fn supports(&self, op: &Op) -> bool {
        match *op {
            Op::GetRows { ty, width } => weight_runs(ty, width),
            Op::MatMul { ty, k, .. } => weight_runs(ty, k),
            Op::FusedMatMul { k, ref parts, .. } => parts.iter().all(|&(ty, _)| weight_runs(ty, k)),
            Op::MoeExperts {
                tys, n_embd, n_ff, ..
            } => {
                weight_runs(tys[0], n_embd)
                    && weight_runs(tys[1], n_embd)
                    && weight_runs(tys[2], n_ff)
            }
            Op::PagedAttention {
                n_head,
                n_head_kv,
                head_dim_k,
                head_dim_v,
                ..
            } => {
                n_head_kv > 0
                    && n_head % n_head_kv == 0
                    && head_dim_k <= ATT_MAX_DIM
                    && head_dim_v <= ATT_MAX_DIM
            }
            Op::Rope { head_dim, .. } => head_dim % 2 == 0,
            Op::RopeKvWrite { rope, .. } => rope.head_dim % 2 == 0,
            Op::TopK { k, width } => (1..=MAX_TOP_K).contains(&k) && k <= width,
            _ => true,
        }
    }

    fn record(&mut self, op: &Op, io: &OpIo<'_, CudaBuffer>) -> Result<(), BackendError> {
        if !self.supports(op) {
            return Err(BackendError::unsupported_op(&self.caps, op));
        }
        if !self.copies.get_mut().is_empty() {
            let reads: Vec<CUdeviceptr> = io.inputs.iter().map(|b| b.ptr()).collect();
            self.await_copies(|p| reads.contains(&p))?;
        }
        self.record_op(op, io)
    }

    fn submit(&mut self) -> Result<(), BackendError> {
        // Work is queued as it is recorded; a submission is a point the
        // host may wait at, not a flush.
        Ok(())
    }

    fn step_buffers(&mut self, sizes: &[u64]) -> Result<Vec<CudaBuffer>, BackendError> {
        // A new step: nothing is being captured, the old scratch can go.
        self.retired.clear();
        let mut out = Vec::with_capacity(sizes.len());
        for (i, &bytes) in sizes.iter().enumerate() {
            if self.pool.get(i).is_none_or(|m| m.bytes < bytes) {
                let mem = self.malloc(bytes.next_power_of_two().max(256), "activations")?;
                if i < self.pool.len() {
                    self.pool[i] = mem;
                } else {
                    self.pool.push(mem);
                }
            }
            out.push(CudaBuffer {
                mem: self.pool[i].clone(),
                offset: 0,
                len: bytes,
            });
        }
        Ok(out)
    }

    /// Whole plans as CUDA graphs where they have no host stops (see
    /// [`crate::graphs`]), else op by op.
    // The trait's signature (`impl Future` without `Send`), kept as written.
    #[allow(clippy::manual_async_fn)]
    fn run_plan(
        &mut self,
        plan: &Plan,
        inputs: &StepInputs,
        held: &Held<'_, CudaBuffer>,
        host: &mut dyn HostSync,
    ) -> impl Future<Output = Result<Vec<u8>, BackendError>> {
        async move {
            if self.use_graphs && plan.syncs.is_empty() {
                self.run_graph(plan, inputs, held).await
            } else {
                let out = hearth::graph::plan::execute(self, plan, inputs, held, host).await;
                if let (Some(prof), Some(end)) = (self.prof.as_mut(), hearth::trace::now()) {
                    // The plan's result was read back: the stream is done.
                    if self.stream.synchronize().is_ok() {
                        prof.trace(end);
                        prof.collect();
                    }
                }
                out
            }
        }
    }

    fn download(
        &self,
        src: &CudaBuffer,
        range: Range<u64>,
    ) -> impl Future<Output = Result<Vec<u8>, BackendError>> {
        std::future::ready(self.download_now(src, range))
    }
}

impl Drop for CudaBackend {
    /// With profiling on, prints the table of kernel times.
    fn drop(&mut self) {
        if self.prof.as_ref().is_some_and(|p| !p.quiet) {
            if let Some(report) = self.profile_report() {
                eprint!("{report}");
            }
        }
    }
}
