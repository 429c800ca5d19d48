//! Loading a GGUF model onto a backend.
//!
//! The tensors the architecture needs are checked against the file's
//! tensor table first ([`Layout`]: names, shapes, types) and their buffers
//! allocated; then tensor data is streamed in bounded chunks in file order
//! (over an mmap'd source the chunks borrow the mapping) straight into
//! those buffers: whole rows of a matrix as they complete (the backend may
//! repack them), vectors converted to f32 at their end. Peak host memory is
//! a chunk and a row, not the model. Progress is reported after every chunk.

use crate::graph::KvCacheConfig;
use std::collections::{HashMap, HashSet};

use thiserror::Error;

use half::{bf16, f16};

use crate::backend::cpu::{CpuBackend, CpuBuffer};
use crate::backend::memory::human;
use crate::backend::{Backend, BackendError, BufKind, MemoryNeed};
use crate::gguf::{ByteSource, GgufModel, TensorStream};
use crate::graph::plan::BufId;
use crate::graph::Op;
use crate::model::arch::plan::{PlanOptions, PlanSource, StepShape};
use crate::model::arch::{spec_for, ArchSpec};
use crate::model::generic::Model;
use crate::model::layout::{Layout, Slot, SlotKind};
use crate::model::memory::memory_need;
use crate::model::offload::{expert_bytes, plan_offload, ExpertOffload, OffloadPlan};
use crate::model::plans::{refused_step, unchecked_plan_for, PlanRecipe, Readout};
use crate::model::split::{self, SplitTensors};
use crate::model::stream::{plan_stream, BlockStream, HostMatrix, StreamPlan};
use crate::model::weights::{FfnWeights, ModelWeights};
use crate::model::ModelConfig;
use crate::moe::{CacheOptions, ExpertCache, HostExperts};
use crate::quant::GgmlType;
use crate::trace::{self, Track};

/// Bytes per streamed chunk.
const CHUNK_BYTES: usize = 8 << 20;

/// Errors building a model from a GGUF file's tensors.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum LoadError {
    /// A tensor the architecture needs is not in the file.
    #[error("tensor '{name}' is missing; the file does not look like a complete {arch} model")]
    MissingTensor {
        /// The tensor.
        name: String,
        /// The architecture.
        arch: String,
    },
    /// A tensor has another shape than the metadata implies.
    #[error("tensor '{name}' has shape {found:?} but the model's metadata implies {expected:?}")]
    WrongShape {
        /// The tensor.
        name: String,
        /// The shape the metadata implies (ggml order).
        expected: Vec<u64>,
        /// The file's shape.
        found: Vec<u64>,
    },
    /// A tensor larger than this target's address space.
    #[error(
        "tensor '{name}' has {bytes} bytes, more than this target can address; use a smaller model"
    )]
    TooLarge {
        /// The tensor.
        name: String,
        /// Its size.
        bytes: u64,
    },
    /// A device budget ([`ExpertOffload::device_bytes`], or the device's
    /// own) below what the model needs of the device however its weights
    /// are placed.
    #[error("the model needs at least {} of device memory (what cannot move to the host: its output head, the activations of a step, the rest of the weights besides the routed experts of the layers you keep on the device), more than the budget of {}; raise --gpu-mem, lower --gpu-layers, or shorten the context (--ctx)", human(*rest), human(*budget))]
    DeviceBudget {
        /// Bytes the device needs at least.
        rest: u64,
        /// The budget.
        budget: u64,
    },
    /// Placement options that cannot go together, or that the model or
    /// backend cannot take.
    #[error("{0}")]
    Placement(String),
    /// The K/V cache configuration is unusable.
    #[error("invalid K/V cache configuration: {0}")]
    Kv(String),
    /// A vector tensor (a norm weight, a bias) of a type Hearth does not
    /// read vectors as.
    #[error("tensor '{tensor}' is a vector of type {ty}; vectors must be F32, F16 or BF16 (requantize the model with `hearth quantize`)")]
    VectorType {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
    },
}

/// How to load a model (how to run it is the backend's options).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// The K/V cache to allocate.
    pub kv: KvCacheConfig,
    /// Exact-f32 mode: f32 activations and weight rows expanded on the fly
    /// (for testing; slower), instead of ggml's quantized activations.
    pub exact_f32: bool,
    /// Tokens of the largest step the model will run (the engine's
    /// `max_num_batched_tokens`): the activations' share of the memory a
    /// device is checked for.
    pub max_step_tokens: usize,
    /// An MoE model's routed experts kept in host memory, with device
    /// slots for the ones in use (the expert cache, [`crate::moe::ExpertCache`]);
    /// `None`: every weight on the device, unless the backend's
    /// [`Backend::memory_budget`] is known and too small for the model, where
    /// the experts are offloaded within it by themselves. On the CPU
    /// backend, whose memory is the host's, only [`ExpertOffload::host_layers`]
    /// applies.
    pub experts: Option<ExpertOffload>,
    /// Blocks on the backend when the model is split with the host's CPU
    /// (llama.cpp's `-ngl`): the last `N` blocks and the output head run
    /// on the backend, the blocks before on the CPU, and the residual
    /// stream crosses once per step. `None`: every block on the backend,
    /// unless its memory budget (the experts' [`ExpertOffload::device_bytes`],
    /// else [`Backend::memory_budget`]) is known and too small even with
    /// the routed experts offloaded, where as many blocks go there as fit.
    /// llama.cpp counts the head as one of its layers: its `-ngl N+1` is
    /// `Some(N)` here.
    pub gpu_layers: Option<usize>,
    /// Every block's matrices stay in host memory and stream through two
    /// sets of device buffers, the next block's copy queued while this one
    /// computes ([`crate::model::stream`]): the whole model crosses the bus
    /// every step, so this is for steps of many tokens. Not with
    /// `gpu_layers` or experts kept on the host, nor on the CPU backend.
    pub stream_layers: bool,
    /// Threads of the host's CPU work beside a device (the blocks of a
    /// split, the experts the cache computes; 0: all cores).
    pub host_threads: usize,
}

impl LoadOptions {
    /// Options for the K/V cache `kv`, quantized activations as ggml's,
    /// steps of up to [`DEFAULT_MAX_STEP_TOKENS`] tokens.
    pub fn new(kv: KvCacheConfig) -> Self {
        Self {
            kv,
            exact_f32: false,
            max_step_tokens: DEFAULT_MAX_STEP_TOKENS,
            experts: None,
            gpu_layers: None,
            stream_layers: false,
            host_threads: 0,
        }
    }
}

/// [`LoadOptions::max_step_tokens`] by default: the engine's default
/// `max_num_batched_tokens`.
pub const DEFAULT_MAX_STEP_TOKENS: usize = 512;

/// Load progress, reported after every chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LoadProgress {
    /// Tensor bytes read so far.
    pub bytes_done: u64,
    /// Tensor bytes in the model.
    pub bytes_total: u64,
    /// Tensors read completely.
    pub tensors_done: usize,
    /// Tensors in the model.
    pub tensors_total: usize,
}

/// Fills one slot's buffer from the stream: whole rows of a matrix go to
/// the backend as soon as they are complete (a partial row waits in
/// `carry`); a vector is gathered, converted to f32 and uploaded at its end.
struct Filler<'a, B: Backend> {
    backend: &'a B,
    carry: Vec<u8>,
    rows_done: usize,
    received: u64,
}

impl<B: Backend> Filler<'_, B> {
    fn feed(&mut self, slot: &Slot, buf: &B::Buffer, data: &[u8], last: bool) -> crate::Result<()> {
        self.received += data.len() as u64;
        match slot.kind {
            SlotKind::Matrix { ty, cols, .. } => {
                let row_bytes = cols / ty.block_elems().max(1) * ty.block_bytes();
                let mut data = data;
                if !self.carry.is_empty() {
                    let need = (row_bytes - self.carry.len()).min(data.len());
                    self.carry.extend_from_slice(&data[..need]);
                    data = &data[need..];
                    if self.carry.len() == row_bytes {
                        self.backend.upload_weight_rows(
                            buf,
                            ty,
                            cols,
                            self.rows_done,
                            &self.carry,
                        )?;
                        self.rows_done += 1;
                        self.carry.clear();
                    }
                }
                let whole = data.len() / row_bytes * row_bytes;
                if whole > 0 {
                    self.backend.upload_weight_rows(
                        buf,
                        ty,
                        cols,
                        self.rows_done,
                        &data[..whole],
                    )?;
                    self.rows_done += whole / row_bytes;
                }
                self.carry.extend_from_slice(&data[whole..]);
            }
            SlotKind::Vector { ty, n } => {
                self.carry.extend_from_slice(data);
                if last {
                    let v = vector_f32(&slot.name, ty, n, &self.carry)?;
                    self.backend.upload(buf, 0, bytemuck::cast_slice(&v))?;
                }
            }
        }
        if last {
            if self.received != slot.file_bytes
                || (matches!(slot.kind, SlotKind::Matrix { .. }) && !self.carry.is_empty())
            {
                return Err(BackendError::Shape(format!(
                    "tensor '{}': {} of {} bytes arrived",
                    slot.name, self.received, slot.file_bytes
                ))
                .into());
            }
            self.carry = Vec::new();
            self.rows_done = 0;
            self.received = 0;
            if let SlotKind::Matrix { ty, cols, .. } = slot.kind {
                self.backend.finish_weight(buf, ty, cols)?;
            }
        }
        Ok(())
    }
}

/// A vector tensor's values as f32.
fn vector_f32(name: &str, ty: GgmlType, n: usize, bytes: &[u8]) -> crate::Result<Vec<f32>> {
    let short = || -> crate::Error {
        BackendError::Shape(format!(
            "tensor '{name}': {} bytes do not hold {n} values",
            bytes.len()
        ))
        .into()
    };
    Ok(match ty {
        GgmlType::F32 => bytes
            .get(..n * 4)
            .ok_or_else(short)?
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect(),
        GgmlType::F16 => bytes
            .get(..n * 2)
            .ok_or_else(short)?
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        GgmlType::BF16 => bytes
            .get(..n * 2)
            .ok_or_else(short)?
            .chunks_exact(2)
            .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect(),
        ty => {
            return Err(LoadError::VectorType {
                tensor: name.to_string(),
                ty,
            }
            .into())
        }
    })
}

/// The bytes of a slot's buffer on `backend`.
fn slot_bytes<B: Backend>(backend: &B, slot: &Slot) -> u64 {
    match slot.kind {
        SlotKind::Matrix { ty, cols, rows } => backend.weight_bytes(ty, cols, rows),
        SlotKind::Vector { n, .. } => (n * 4) as u64,
    }
}

/// Allocates every slot's buffer on `backend` (an empty one for a tensor
/// that streams to host memory: `on_host`).
fn alloc_weights<B: Backend>(
    backend: &B,
    slots: &[Slot],
    on_host: &dyn Fn(usize) -> bool,
) -> crate::Result<Vec<B::Buffer>> {
    let sizes: Vec<u64> = slots
        .iter()
        .enumerate()
        .map(|(i, s)| {
            if on_host(i) {
                0
            } else {
                slot_bytes(backend, s)
            }
        })
        .collect();
    Ok(backend.alloc_weights(&sizes)?)
}

/// Tensors that stream to host memory instead of the device: the layout
/// slot's index and its buffer on the host's backend (`shared`: those
/// that stream to the device as well).
struct HostTensors<'a> {
    cpu: &'a CpuBackend,
    buffers: HashMap<usize, CpuBuffer>,
    shared: HashSet<usize>,
    /// Tensors kept as the file's bytes (streamed blocks), not in `buffers`.
    raw: HashSet<usize>,
}

/// Streams every tensor of `model` the layout needs from `sources` (one
/// per split) into its buffer, in bounded chunks (those of `host` into
/// host memory); returns the bytes of the tensors `host` keeps raw.
async fn stream_weights<B: Backend, S: ByteSource>(
    backend: &B,
    model: &GgufModel,
    sources: &[S],
    slots: &[Slot],
    buffers: &[B::Buffer],
    host: Option<&HostTensors<'_>>,
    progress: &mut dyn FnMut(&LoadProgress),
) -> crate::Result<HashMap<usize, Vec<u8>>> {
    let by_name: HashMap<&str, usize> = slots
        .iter()
        .enumerate()
        .map(|(i, s)| (s.name.as_str(), i))
        .collect();
    let mut filler = Filler {
        backend,
        carry: Vec::new(),
        rows_done: 0,
        received: 0,
    };
    let mut host_filler = host.map(|h| Filler {
        backend: h.cpu,
        carry: Vec::new(),
        rows_done: 0,
        received: 0,
    });
    let mut raw: HashMap<usize, Vec<u8>> = host
        .iter()
        .flat_map(|h| h.raw.iter())
        .map(|&i| (i, Vec::with_capacity(slots[i].file_bytes as usize)))
        .collect();
    let mut stream = TensorStream::for_model(model, sources, CHUNK_BYTES)?;
    loop {
        let read = trace::span(Track::Load, "read");
        let Some(chunk) = stream.next().await? else {
            break;
        };
        drop(read.arg("bytes", chunk.data.len()));
        let _upload = trace::span(Track::Load, "repack + upload")
            .arg("tensor", chunk.tensor.name.as_str())
            .arg("bytes", chunk.data.len());
        if let Some(&i) = by_name.get(chunk.tensor.name.as_str()) {
            let on_host = host.and_then(|h| Some((h.buffers.get(&i)?, h.shared.contains(&i))));
            match (raw.get_mut(&i), on_host, host_filler.as_mut()) {
                (Some(bytes), _, _) => bytes.extend_from_slice(chunk.data),
                (None, Some((buf, shared)), Some(f)) => {
                    f.feed(&slots[i], buf, chunk.data, chunk.last)?;
                    if shared {
                        filler.feed(&slots[i], &buffers[i], chunk.data, chunk.last)?;
                    }
                }
                (None, _, _) => filler.feed(&slots[i], &buffers[i], chunk.data, chunk.last)?,
            }
        }
        let p = chunk.progress;
        progress(&LoadProgress {
            bytes_done: p.bytes_done,
            bytes_total: p.bytes_total,
            tensors_done: p.tensors_done,
            tensors_total: p.tensors_total,
        });
    }
    Ok(raw)
}

/// Allocates the K and V cache of `blocks` layers.
fn alloc_kv<B: Backend>(
    backend: &B,
    cfg: &ModelConfig,
    kv: &KvCacheConfig,
    blocks: usize,
) -> crate::Result<Vec<[B::Buffer; 2]>> {
    let slots = (kv.num_blocks * kv.block_size) as u64;
    let elem = kv.dtype.bytes() as u64;
    let k = slots * (cfg.n_head_kv * cfg.head_dim_k) as u64 * elem;
    let v = slots * (cfg.n_head_kv * cfg.head_dim_v) as u64 * elem;
    (0..blocks)
        .map(|_| {
            Ok([
                backend.alloc(k, BufKind::KvCache)?,
                backend.alloc(v, BufKind::KvCache)?,
            ])
        })
        .collect()
}

/// What [`check_model`] found: the model's shapes, architecture and
/// weights, and what it needs of the device's memory.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The model's shapes.
    pub config: ModelConfig,
    /// Its architecture.
    pub spec: ArchSpec,
    /// Its weights, by buffer.
    pub weights: ModelWeights,
    /// The memory it needs on the backend checked.
    pub memory: MemoryNeed,
    /// Where the routed experts go, when [`LoadOptions::experts`] keeps
    /// some off the device.
    pub offload: Option<OffloadPlan>,
    /// Blocks that run on the host's CPU before the device's (0: none;
    /// [`LoadOptions::gpu_layers`]).
    pub host_blocks: usize,
    /// Where the blocks stream from, with [`LoadOptions::stream_layers`].
    pub stream: Option<StreamPlan>,
    /// Why the weights are placed so, in a line (`hearth info --plan`).
    pub reason: String,
}

/// Checks, from the header alone, that `model` loads onto `backend` with
/// `opts`: a supported architecture, every tensor the architecture needs
/// with the right shape, a kernel for every op of its forward pass
/// (weight types included), and the memory it needs on the device. A
/// caller choosing a backend calls it before downloading any tensor data;
/// [`load_model`] calls it first too.
///
/// Errors name what is wrong and what to do: the architecture (and the
/// supported ones), the tensor whose type the backend cannot run, the op
/// it has no kernel for, a missing or misshapen tensor, or what does not
/// fit the device.
pub fn check_model<B: Backend>(
    model: &GgufModel,
    backend: &B,
    opts: &LoadOptions,
) -> crate::Result<Checked> {
    check_layout(model, backend, opts).map(|(checked, _)| checked)
}

/// [`check_model`], with the tensors' slots that the loader streams into.
fn check_layout<B: Backend>(
    model: &GgufModel,
    backend: &B,
    opts: &LoadOptions,
) -> crate::Result<(Checked, Vec<Slot>)> {
    let cfg = ModelConfig::from_metadata_supported(model.metadata())?;
    let spec = spec_for(&cfg, model.metadata())?;
    if opts.kv.num_blocks < 2 || opts.kv.block_size == 0 {
        return Err(LoadError::Kv(format!(
            "{} blocks of {} tokens; need at least 2 blocks (block 0 is the null block) of at least 1 token",
            opts.kv.num_blocks, opts.kv.block_size
        ))
        .into());
    }
    let mut layout = Layout::new(model, &cfg.arch);
    let mut weights = layout.model(&cfg, &spec)?;
    // The whole model's need, from the header: what the device is checked
    // for, less what goes to host memory.
    let whole = memory_need(model, &cfg, &opts.kv, opts.max_step_tokens, backend);
    let n_layer = weights.layers.len();
    // The CPU's memory is the host's: there only the layers asked to keep
    // their experts on the host do (as llama.cpp's `--cpu-moe` on its CPU
    // backend); its weights cannot be refilled as slots.
    let on_host = backend.caps().backend == CpuBackend::NAME;
    let budget = match on_host {
        true => None,
        false => opts
            .experts
            .and_then(|o| o.device_bytes)
            .or_else(|| backend.memory_budget()),
    };
    if opts.stream_layers {
        return check_streamed(backend, opts, (cfg, spec), layout, weights, whole);
    }
    let mut host_blocks = opts.gpu_layers.map_or(0, |n| n_layer - n.min(n_layer));
    macro_rules! need {
        ($k:expr) => {
            split::device_need(&whole, &weights, &layout.slots, $k, backend)
        };
    }
    let short = budget.filter(|&b| need!(host_blocks).total() > b);
    let mut reason = match (budget, opts.gpu_layers) {
        (_, Some(n)) => format!("--gpu-layers {n}"),
        (Some(b), None) if short.is_none() => {
            format!("the whole model fits the device budget of {}", human(b))
        }
        (None, None) => "no device budget is known: every weight on the device".to_string(),
        (Some(_), None) => String::new(),
    };
    // Nothing said and the budget short: the routed experts go behind the
    // cache, the slots in what the rest leaves.
    let auto = short
        .filter(|_| opts.experts.is_none())
        .map(|b| ExpertOffload {
            device_bytes: Some(b),
            ..ExpertOffload::with_slot_bytes(u64::MAX)
        });
    let mut offload = None;
    if let Some(mut o) = opts.experts.or(auto).filter(|_| spec.moe) {
        let mut fits = true;
        if on_host {
            o.slot_bytes = u64::MAX;
        } else if let Some(total) = o.device_bytes {
            let need = need!(host_blocks).total();
            let experts = expert_bytes(&weights, &layout.slots, host_blocks, backend);
            let rest = need - experts.min(need);
            match total.checked_sub(rest) {
                Some(b) => o.slot_bytes = b,
                // Not even without the experts: the layers split instead.
                None if opts.gpu_layers.is_none() => fits = false,
                None => {
                    return Err(LoadError::DeviceBudget {
                        rest,
                        budget: total,
                    }
                    .into())
                }
            }
        }
        if fits {
            let plan = plan_offload(
                &mut weights,
                &mut layout.slots,
                cfg.n_expert,
                host_blocks,
                &o,
                backend,
            );
            if !plan.layers.is_empty() && short.is_some() {
                reason = format!(
                    "the model needs {}, more than the device budget of {}: the routed experts went behind the cache",
                    human(need!(host_blocks).total()),
                    human(short.unwrap_or_default())
                );
            }
            offload = (!plan.layers.is_empty()).then_some(plan);
        }
    }
    if offload.is_some() && short.is_none() && opts.gpu_layers.is_none() {
        reason =
            "the routed experts stay in host memory, as asked (--cpu-moe, --n-cpu-moe, --gpu-mem)"
                .into();
    }
    if let (Some(b), None, None) = (short, &offload, opts.gpu_layers) {
        // Still short: as many blocks on the device as fit, the rest on the host.
        host_blocks = split::fit_blocks(&whole, &weights, &layout.slots, b, backend).ok_or(
            LoadError::DeviceBudget {
                rest: need!(n_layer).total(),
                budget: b,
            },
        )?;
        reason = format!(
            "the model needs {}, more than the device budget of {}{}: the last {} of {n_layer} blocks fit on the device",
            human(whole.total()),
            human(b),
            if spec.moe { " even with its routed experts offloaded" } else { "" },
            n_layer - host_blocks
        );
    }
    check_plans(&cfg, &spec, &weights, opts, backend, &layout.slots)?;
    let mut memory = need!(host_blocks);
    if let Some(p) = &offload {
        memory.weights = memory.weights.saturating_sub(p.offloaded_bytes) + p.pool_bytes;
    }
    backend.check_memory(&memory)?;
    let checked = Checked {
        config: cfg,
        spec,
        weights,
        memory,
        offload,
        host_blocks,
        stream: None,
        reason,
    };
    Ok((checked, layout.slots))
}

/// [`check_layout`] with [`LoadOptions::stream_layers`]: the blocks'
/// matrices in host memory, two sets of device buffers for them.
fn check_streamed<B: Backend>(
    backend: &B,
    opts: &LoadOptions,
    (cfg, spec): (ModelConfig, ArchSpec),
    mut layout: Layout,
    mut weights: ModelWeights,
    whole: MemoryNeed,
) -> crate::Result<(Checked, Vec<Slot>)> {
    let place = |m: &str| -> crate::Error { LoadError::Placement(m.to_string()).into() };
    if backend.caps().backend == CpuBackend::NAME {
        return Err(place("--stream-layers streams blocks to a GPU; the CPU backend holds every weight in host memory already"));
    }
    if opts.gpu_layers.is_some() || opts.experts.is_some_and(|o| o.host_layers > 0) {
        return Err(place(
            "--stream-layers streams every block; drop --gpu-layers, --cpu-moe and --n-cpu-moe",
        ));
    }
    let plan = plan_stream(&mut weights, &mut layout.slots, backend).ok_or_else(|| {
        place("--stream-layers needs blocks with the same matrices; this model's blocks differ")
    })?;
    check_plans(&cfg, &spec, &weights, opts, backend, &layout.slots)?;
    let mut memory = whole;
    memory.weights = memory.weights.saturating_sub(plan.streamed_bytes) + plan.set_bytes;
    let budget = opts
        .experts
        .and_then(|o| o.device_bytes)
        .or_else(|| backend.memory_budget());
    if let Some(b) = budget.filter(|&b| memory.total() > b) {
        return Err(LoadError::DeviceBudget {
            rest: memory.total(),
            budget: b,
        }
        .into());
    }
    backend.check_memory(&memory)?;
    let reason = format!(
        "--stream-layers: {} of block matrices stream through two device sets of {} every step",
        human(plan.streamed_bytes),
        human(plan.set_bytes / 2)
    );
    let checked = Checked {
        config: cfg,
        spec,
        weights,
        memory,
        offload: None,
        host_blocks: 0,
        stream: Some(plan),
        reason,
    };
    Ok((checked, layout.slots))
}

/// [`check_support`] of the model `cfg`, `spec`, `weights` loaded with `opts`.
fn check_plans<B: Backend>(
    cfg: &ModelConfig,
    spec: &ArchSpec,
    weights: &ModelWeights,
    opts: &LoadOptions,
    backend: &B,
    slots: &[Slot],
) -> Result<(), BackendError> {
    let src = PlanSource {
        cfg,
        spec,
        weights,
        kv: &opts.kv,
        exact: opts.exact_f32,
    };
    check_support(&src, backend, slots)
}

/// Checks that `backend` runs every op of the plans the model will run
/// (fused as they will be): a decode step and a prompt of several tokens,
/// reading back logits, their argmax or their best pairs. A product or a
/// lookup it refuses is reported as its weight's type.
fn check_support<B: Backend>(
    src: &PlanSource<'_>,
    backend: &B,
    slots: &[Slot],
) -> Result<(), BackendError> {
    let recipe = PlanRecipe {
        src: *src,
        n_weights: slots.len(),
        opts: &PlanOptions::default(),
        fused: true,
    };
    let shapes = [1, 2].map(|n| StepShape {
        tokens: n,
        logit_rows: n,
    });
    for shape in shapes {
        for readout in [Readout::Logits, Readout::Argmax, Readout::TopK(1)] {
            let plan = unchecked_plan_for(&recipe, shape, readout, backend)?;
            let Some(step) = refused_step(&plan, backend) else {
                continue;
            };
            let weight = step.inputs.iter().find_map(|b| match *b {
                BufId::Weight(i) => slots.get(i),
                _ => None,
            });
            return Err(match (&step.op, weight) {
                (Op::MatMul { ty, .. } | Op::GetRows { ty, .. }, Some(slot)) => {
                    BackendError::UnsupportedType {
                        tensor: slot.name.clone(),
                        ty: *ty,
                        backend: backend.caps().backend.to_string(),
                    }
                }
                _ => BackendError::unsupported_op(backend.caps(), &step.op),
            });
        }
    }
    Ok(())
}

/// Loads `model` (read from `sources`, one per split) onto `backend`:
/// [`check_model`] first, so nothing is allocated or read for a model that
/// cannot run there, then the weights streamed in bounded chunks into
/// their buffers, then the K/V cache allocated.
pub async fn load_model<B: Backend, S: ByteSource>(
    backend: B,
    model: &GgufModel,
    sources: &[S],
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> crate::Result<Model<B>> {
    let _span = trace::span(Track::Load, "load model").arg("tensors", model.tensors.len());
    let check = trace::span(Track::Load, "check layout");
    let (checked, slots) = check_layout(model, &backend, opts)?;
    drop(check);
    let plan = checked.offload.clone().unwrap_or_default();
    let (n_layer, host_blocks) = (checked.weights.layers.len(), checked.host_blocks);
    let split = SplitTensors::new(&checked.weights, host_blocks);
    let streamed = checked.stream.clone().unwrap_or_default();
    let buffers = alloc_weights(&backend, &slots, &|i| {
        plan.on_host(i) || split.host_only(i) || streamed.streams(i)
    })?;
    let cpu = CpuBackend::new(opts.host_threads);
    // The offloaded layers' routers, on the device and, when the cache
    // prefetches, on the host.
    let router_of = |layer: usize| match checked.weights.layers.get(layer).map(|l| &l.ffn) {
        Some(FfnWeights::Moe { router, .. }) => Some(router.id),
        _ => None,
    };
    let prefetch = opts.experts.is_some_and(|o| o.prefetch);
    let routers: Vec<usize> = plan
        .layers
        .iter()
        .filter(|_| prefetch)
        .filter_map(|l| router_of(l.layer))
        .collect();
    let mut host = HostTensors {
        cpu: &cpu,
        buffers: HashMap::new(),
        shared: split.shared.iter().chain(&routers).copied().collect(),
        raw: streamed.blocks.iter().flatten().map(|m| m.tensor).collect(),
    };
    let to_host = plan
        .layers
        .iter()
        .flat_map(|l| l.tensors)
        .chain(routers.iter().copied())
        .chain(split.host.iter().copied());
    for t in to_host {
        let b = cpu.alloc(slot_bytes(&cpu, &slots[t]), BufKind::Weights)?;
        host.buffers.insert(t, b);
    }
    let on_host = (!host.buffers.is_empty() || !host.raw.is_empty()).then_some(&host);
    let _stream = trace::span(Track::Load, "stream weights");
    let mut raw = stream_weights(
        &backend, model, sources, &slots, &buffers, on_host, progress,
    )
    .await?;
    let mut host_buffers = host.buffers;
    let stream = match checked.stream {
        Some(_) => {
            let mut blocks = Vec::with_capacity(streamed.blocks.len());
            for b in &streamed.blocks {
                let mut block = Vec::with_capacity(b.len());
                for m in b {
                    let bytes = raw.remove(&m.tensor).ok_or_else(|| {
                        BackendError::Shape(format!(
                            "tensor '{}' did not stream into host memory",
                            slots[m.tensor].name
                        ))
                    })?;
                    block.push(HostMatrix::new(&backend, *m, bytes)?);
                }
                blocks.push(block);
            }
            Some(BlockStream {
                blocks,
                bytes_written: 0,
            })
        }
        None => None,
    };
    drop(_stream);
    let kv = alloc_kv(&backend, &checked.config, &opts.kv, n_layer - host_blocks)?;
    // A split model's first blocks: a model of their own on the host's CPU,
    // over the same layout (the device's tensors empty there).
    let host_model = if host_blocks == 0 {
        None
    } else {
        let cpu = CpuBackend::new(opts.host_threads);
        let mut bufs = Vec::with_capacity(slots.len());
        for i in 0..slots.len() {
            bufs.push(match host_buffers.remove(&i) {
                Some(b) if split.host.contains(&i) => b,
                Some(b) => {
                    // An expert tensor the cache takes below.
                    host_buffers.insert(i, b);
                    cpu.alloc(0, BufKind::Weights)?
                }
                None => cpu.alloc(0, BufKind::Weights)?,
            });
        }
        let kv = alloc_kv(&cpu, &checked.config, &opts.kv, host_blocks)?;
        Some(Box::new(Model {
            spec: checked.spec.clone(),
            exact: opts.exact_f32,
            buffers: bufs,
            weights: checked.weights.clone(),
            kv,
            kv_cfg: opts.kv,
            cfg: checked.config.clone(),
            fuse: true,
            experts: None,
            plans: Default::default(),
            plan_opts: PlanOptions {
                blocks: Some(0..host_blocks),
                hidden_out: true,
                ..PlanOptions::default()
            },
            host: None,
            stream: None,
            reduce: None,
            backend: cpu,
        }))
    };
    let cache = if plan.layers.is_empty() {
        None
    } else {
        let mut layers = Vec::with_capacity(plan.layers.len());
        for l in &plan.layers {
            let mut take = |t: usize| {
                host_buffers.remove(&t).ok_or_else(|| {
                    BackendError::Shape(format!("tensor '{}' is not in host memory", slots[t].name))
                })
            };
            let [g, u, d] = l.tensors;
            let router = match router_of(l.layer).filter(|_| prefetch) {
                Some(r) => Some((take(r)?, slots[r].kind)),
                None => None,
            };
            layers.push(HostExperts {
                layer: l.layer,
                placement: l.placement,
                pool: l.pool,
                weights: [take(g)?, take(u)?, take(d)?],
                tys: l.tys,
                n_expert: l.n_expert,
                router: router.and_then(|(b, kind)| match kind {
                    SlotKind::Matrix { ty, .. } => Some((b, ty)),
                    SlotKind::Vector { .. } => None,
                }),
            });
        }
        let cfg = &checked.config;
        let offload = opts.experts.unwrap_or(ExpertOffload::with_slot_bytes(0));
        let cache_opts = CacheOptions {
            policy: offload.policy,
            host_tokens: offload.host_tokens,
            k: cfg.n_expert_used,
            n_embd: cfg.n_embd,
            n_ff: checked
                .weights
                .layers
                .iter()
                .find_map(|l| match l.ffn {
                    FfnWeights::Moe { n_ff, .. } => Some(n_ff),
                    FfnWeights::Dense { .. } => None,
                })
                .unwrap_or(cfg.n_ff),
            act: checked.spec.act,
            exact: opts.exact_f32,
            prefetch: offload.prefetch,
        };
        Some(ExpertCache::new(
            cpu,
            plan.pools.clone(),
            layers,
            cache_opts,
        )?)
    };
    let mut m = Model {
        spec: checked.spec,
        backend,
        exact: opts.exact_f32,
        buffers,
        weights: checked.weights,
        kv,
        kv_cfg: opts.kv,
        cfg: checked.config,
        fuse: true,
        experts: None,
        plans: Default::default(),
        plan_opts: PlanOptions {
            blocks: (host_blocks > 0).then_some(host_blocks..n_layer),
            stream: stream.is_some(),
            ..PlanOptions::default()
        },
        host: host_model,
        stream,
        reduce: None,
    };
    if let Some(cache) = cache {
        m.set_expert_store(Some(Box::new(cache)));
    }
    Ok(m)
}
