//! Loading a GGUF model onto a backend.
//!
//! The tensors the architecture needs are checked against the file's
//! tensor table first ([`Layout`]: names, shapes, types) and their buffers
//! allocated; then tensor data is streamed in bounded chunks in file order
//! (over an mmap'd source the chunks borrow the mapping) straight into
//! those buffers: whole rows of a matrix as they complete (the backend may
//! repack them), vectors converted to f32 at their end. Peak host memory is
//! a chunk and a row, not the model. Progress is reported after every chunk.

use std::collections::HashMap;

use thiserror::Error;

use half::{bf16, f16};

use crate::backend::cpu::{CpuBackend, CpuModel};
use crate::backend::{Backend, BackendError, BufKind};
use crate::gguf::{ByteSource, GgufModel, TensorStream};
use crate::graph::Op;
use crate::model::arch::spec_for;
use crate::model::generic::Model;
use crate::model::layout::{Layout, Slot, SlotKind};
use crate::model::{KvCacheConfig, KvType, ModelConfig};
use crate::quant::GgmlType;

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
    /// The K/V cache configuration is unusable.
    #[error("invalid K/V cache configuration: {0}")]
    Kv(String),
}

/// How to load a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadOptions {
    /// The K/V cache to allocate.
    pub kv: KvCacheConfig,
    /// Worker threads (0 = all cores).
    pub threads: usize,
    /// Exact-f32 mode: f32 activations and weight rows expanded on the fly
    /// (for testing; slower), instead of ggml's quantized activations.
    pub exact_f32: bool,
}

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
            return Err(BackendError::UnsupportedType {
                tensor: name.to_string(),
                ty,
            }
            .into())
        }
    })
}

/// Allocates every slot's buffer on `backend`.
fn alloc_weights<B: Backend>(backend: &B, slots: &[Slot]) -> crate::Result<Vec<B::Buffer>> {
    let sizes: Vec<u64> = slots
        .iter()
        .map(|s| match s.kind {
            SlotKind::Matrix { ty, cols, rows } => backend.weight_bytes(ty, cols, rows),
            SlotKind::Vector { n, .. } => (n * 4) as u64,
        })
        .collect();
    Ok(backend.alloc_weights(&sizes)?)
}

/// Streams every tensor of `model` the layout needs from `sources` (one
/// per split) into its buffer, in bounded chunks.
async fn stream_weights<B: Backend, S: ByteSource>(
    backend: &B,
    model: &GgufModel,
    sources: &[S],
    slots: &[Slot],
    buffers: &[B::Buffer],
    progress: &mut dyn FnMut(&LoadProgress),
) -> crate::Result<()> {
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
    let mut stream = TensorStream::for_model(model, sources, CHUNK_BYTES)?;
    while let Some(chunk) = stream.next().await? {
        if let Some(&i) = by_name.get(chunk.tensor.name.as_str()) {
            filler.feed(&slots[i], &buffers[i], chunk.data, chunk.last)?;
        }
        let p = chunk.progress;
        progress(&LoadProgress {
            bytes_done: p.bytes_done,
            bytes_total: p.bytes_total,
            tensors_done: p.tensors_done,
            tensors_total: p.tensors_total,
        });
    }
    Ok(())
}

/// Checks up front that `backend` runs every matrix's type, so a bad file
/// fails before its data is read (the loaders call it; so does a caller
/// choosing a backend before downloading the tensors).
pub fn check_types<B: Backend>(model: &GgufModel, backend: &B) -> Result<(), BackendError> {
    for t in &model.tensors {
        let op = Op::MatMul {
            ty: t.ty,
            k: t.shape.first().copied().unwrap_or(0) as usize,
            n: 1,
            exact: false,
        };
        if t.shape.len() >= 2 && !backend.supports(&op) {
            return Err(BackendError::UnsupportedType {
                tensor: t.name.clone(),
                ty: t.ty,
            });
        }
    }
    Ok(())
}

/// Allocates the K and V cache of every layer.
fn alloc_kv<B: Backend>(
    backend: &B,
    cfg: &ModelConfig,
    kv: &KvCacheConfig,
) -> crate::Result<Vec<[B::Buffer; 2]>> {
    let slots = (kv.num_blocks * kv.block_size) as u64;
    let elem = match kv.dtype {
        KvType::F16 => 2,
        KvType::F32 => 4,
    };
    let k = slots * (cfg.n_head_kv * cfg.head_dim_k) as u64 * elem;
    let v = slots * (cfg.n_head_kv * cfg.head_dim_v) as u64 * elem;
    (0..cfg.n_layer)
        .map(|_| {
            Ok([
                backend.alloc(k, BufKind::KvCache)?,
                backend.alloc(v, BufKind::KvCache)?,
            ])
        })
        .collect()
}

/// Loads `model` (read from `sources`, one per split) onto the CPU backend.
///
/// Errors name what is wrong: an unsupported architecture (and the
/// supported ones), a tensor type without a CPU kernel (and the tensor), a
/// missing tensor, or a tensor of the wrong shape.
pub async fn load_cpu_model<S: ByteSource>(
    model: &GgufModel,
    sources: &[S],
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> crate::Result<CpuModel> {
    let backend = CpuBackend::new(opts.threads);
    load_model(backend, model, sources, opts, progress).await
}

/// Loads `model` (read from `sources`, one per split) onto `backend`
/// (`opts.threads` is the CPU's business: the backend is already made).
///
/// Errors as [`load_cpu_model`], naming the backend's missing support.
pub async fn load_model<B: Backend, S: ByteSource>(
    backend: B,
    model: &GgufModel,
    sources: &[S],
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> crate::Result<Model<B>> {
    let cfg = ModelConfig::from_metadata_supported(model.metadata())?;
    let spec = spec_for(&cfg, model.metadata())?;
    if opts.kv.num_blocks < 2 || opts.kv.block_size == 0 {
        return Err(LoadError::Kv(format!(
            "{} blocks of {} tokens; need at least 2 blocks (block 0 is the null block) of at least 1 token",
            opts.kv.num_blocks, opts.kv.block_size
        ))
        .into());
    }
    check_types(model, &backend)?;
    let mut layout = Layout::new(model, &cfg.arch);
    let weights = layout.model(&cfg, &spec)?;
    let buffers = alloc_weights(&backend, &layout.slots)?;
    stream_weights(&backend, model, sources, &layout.slots, &buffers, progress).await?;
    let kv = alloc_kv(&backend, &cfg, &opts.kv)?;
    Ok(Model {
        spec,
        backend,
        exact: opts.exact_f32,
        buffers,
        weights,
        kv,
        kv_cfg: opts.kv,
        cfg,
    })
}
