//! Loading a GGUF model onto a backend.
//!
//! Tensor data is streamed in bounded chunks in file order (over an mmap'd
//! source the chunks borrow the mapping) into 4-byte aligned buffers, one per
//! tensor, reporting progress after every chunk. Then each tensor is checked
//! against the shape the architecture needs and uploaded to the backend
//! (vectors as f32).

use std::collections::HashMap;

use thiserror::Error;

use half::{bf16, f16};

use crate::backend::cpu::{CpuBackend, CpuModel};
use crate::backend::{Backend, BackendError, BufKind};
use crate::gguf::{ByteSource, GgufModel, TensorInfo, TensorStream};
use crate::graph::Op;
use crate::model::arch::{spec_for, ArchSpec};
use crate::model::generic::{FfnWeights, LayerWeights, Model, ModelWeights, WeightInfo};
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

/// One tensor's bytes, 4-byte aligned.
struct Raw {
    info: TensorInfo,
    data: Vec<u32>,
}

/// Reads every tensor of `model` from `sources` (one per split).
async fn read_all<S: ByteSource>(
    model: &GgufModel,
    sources: &[S],
    progress: &mut dyn FnMut(&LoadProgress),
) -> crate::Result<HashMap<String, Raw>> {
    let mut out: HashMap<String, Raw> = HashMap::new();
    let mut stream = TensorStream::for_model(model, sources, CHUNK_BYTES)?;
    while let Some(chunk) = stream.next().await? {
        if !out.contains_key(&chunk.tensor.name) {
            let size = usize::try_from(chunk.tensor.size).map_err(|_| LoadError::TooLarge {
                name: chunk.tensor.name.clone(),
                bytes: chunk.tensor.size,
            })?;
            let raw = Raw {
                info: chunk.tensor.clone(),
                data: vec![0u32; size.div_ceil(4)],
            };
            out.insert(chunk.tensor.name.clone(), raw);
        }
        let Some(raw) = out.get_mut(&chunk.tensor.name) else {
            continue;
        };
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut raw.data);
        let at = chunk.offset as usize;
        bytes[at..at + chunk.data.len()].copy_from_slice(chunk.data);
        let p = chunk.progress;
        progress(&LoadProgress {
            bytes_done: p.bytes_done,
            bytes_total: p.bytes_total,
            tensors_done: p.tensors_done,
            tensors_total: p.tensors_total,
        });
    }
    Ok(out)
}

/// Takes tensors out of the read set, checking shapes and types, and
/// uploads them to the backend.
struct Tensors<'a, B: Backend> {
    raw: HashMap<String, Raw>,
    backend: &'a B,
    buffers: Vec<B::Buffer>,
    arch: String,
}

impl<B: Backend> Tensors<'_, B> {
    fn take_raw(&mut self, name: &str, shape: &[usize]) -> crate::Result<Option<Raw>> {
        let Some(raw) = self.raw.remove(name) else {
            return Ok(None);
        };
        let expected: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        if raw.info.shape != expected {
            return Err(LoadError::WrongShape {
                name: name.to_string(),
                expected,
                found: raw.info.shape.clone(),
            }
            .into());
        }
        Ok(Some(raw))
    }

    fn missing(&self, name: &str) -> crate::Error {
        LoadError::MissingTensor {
            name: name.to_string(),
            arch: self.arch.clone(),
        }
        .into()
    }

    /// Uploads `bytes` as a new weight buffer.
    fn upload(
        &mut self,
        bytes: &[u8],
        ty: GgmlType,
        cols: usize,
        rows: usize,
    ) -> crate::Result<WeightInfo> {
        let buf = self.backend.alloc(bytes.len() as u64, BufKind::Weights)?;
        self.backend.upload(&buf, 0, bytes)?;
        self.buffers.push(buf);
        Ok(WeightInfo {
            id: self.buffers.len() - 1,
            ty,
            cols,
            rows,
        })
    }

    /// A matrix `[shape[0]]` columns by the product of the rest rows.
    fn weight_opt(&mut self, name: &str, shape: &[usize]) -> crate::Result<Option<WeightInfo>> {
        let Some(raw) = self.take_raw(name, shape)? else {
            return Ok(None);
        };
        let rows = shape[1..].iter().product();
        let ty = raw.info.ty;
        let len = raw.info.size as usize;
        let row_bytes = shape[0] / ty.block_elems().max(1) * ty.block_bytes();
        if shape[0] % ty.block_elems().max(1) != 0 || row_bytes * rows != len {
            return Err(BackendError::Shape(format!(
                "tensor '{name}': {len} bytes do not hold {rows} rows of {} {ty}",
                shape[0]
            ))
            .into());
        }
        let bytes: &[u8] = bytemuck::cast_slice(&raw.data);
        self.upload(&bytes[..len], ty, shape[0], rows).map(Some)
    }

    fn weight(&mut self, name: &str, shape: &[usize]) -> crate::Result<WeightInfo> {
        self.weight_opt(name, shape)?
            .ok_or_else(|| self.missing(name))
    }

    /// A vector (norm weight, bias), uploaded as f32.
    fn vector_opt(&mut self, name: &str, n: usize) -> crate::Result<Option<WeightInfo>> {
        let Some(raw) = self.take_raw(name, &[n])? else {
            return Ok(None);
        };
        let all: &[u8] = bytemuck::cast_slice(&raw.data);
        let bytes = all.get(..raw.info.size as usize).unwrap_or(all);
        if bytes.len() < n * raw.info.ty.block_bytes() / raw.info.ty.block_elems().max(1) {
            return Err(BackendError::Shape(format!(
                "tensor '{name}': {} bytes do not hold {n} values",
                bytes.len()
            ))
            .into());
        }
        let out: Vec<f32> = match raw.info.ty {
            GgmlType::F32 => bytes[..n * 4]
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
            GgmlType::F16 => bytes[..n * 2]
                .chunks_exact(2)
                .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
                .collect(),
            GgmlType::BF16 => bytes[..n * 2]
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
        };
        self.upload(bytemuck::cast_slice(&out), GgmlType::F32, n, 1)
            .map(Some)
    }

    fn vector(&mut self, name: &str, n: usize) -> crate::Result<WeightInfo> {
        self.vector_opt(name, n)?.ok_or_else(|| self.missing(name))
    }
}

/// Checks up front that the backend runs every matrix's type, so a bad file
/// fails before its data is read.
fn check_types<B: Backend>(model: &GgufModel, backend: &B) -> Result<(), BackendError> {
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

fn load_ffn<B: Backend>(
    t: &mut Tensors<'_, B>,
    cfg: &ModelConfig,
    moe: bool,
    p: &str,
) -> crate::Result<FfnWeights> {
    let d = cfg.n_embd;
    if moe {
        let (ne, ff) = (cfg.n_expert, cfg.n_ff_expert.unwrap_or(cfg.n_ff));
        return Ok(FfnWeights::Moe {
            router: t.weight(&format!("{p}.ffn_gate_inp.weight"), &[d, ne])?,
            gate: t.weight(&format!("{p}.ffn_gate_exps.weight"), &[d, ff, ne])?,
            up: t.weight(&format!("{p}.ffn_up_exps.weight"), &[d, ff, ne])?,
            down: t.weight(&format!("{p}.ffn_down_exps.weight"), &[ff, d, ne])?,
            n_ff: ff,
        });
    }
    let ff = cfg.n_ff;
    Ok(FfnWeights::Dense {
        gate: t.weight(&format!("{p}.ffn_gate.weight"), &[d, ff])?,
        up: t.weight(&format!("{p}.ffn_up.weight"), &[d, ff])?,
        down: t.weight(&format!("{p}.ffn_down.weight"), &[ff, d])?,
    })
}

fn load_layer<B: Backend>(
    t: &mut Tensors<'_, B>,
    cfg: &ModelConfig,
    spec: &ArchSpec,
    il: usize,
) -> crate::Result<LayerWeights> {
    let p = format!("blk.{il}");
    let d = cfg.n_embd;
    let (qd, kd, vd) = (
        cfg.n_head * cfg.head_dim_k,
        cfg.n_head_kv * cfg.head_dim_k,
        cfg.n_head_kv * cfg.head_dim_v,
    );
    let bias = if spec.qkv_bias {
        Some([
            t.vector(&format!("{p}.attn_q.bias"), qd)?,
            t.vector(&format!("{p}.attn_k.bias"), kd)?,
            t.vector(&format!("{p}.attn_v.bias"), vd)?,
        ])
    } else {
        None
    };
    let qk_norm = if spec.qk_norm {
        Some([
            t.vector(&format!("{p}.attn_q_norm.weight"), cfg.head_dim_k)?,
            t.vector(&format!("{p}.attn_k_norm.weight"), cfg.head_dim_k)?,
        ])
    } else {
        None
    };
    let post = |t: &mut Tensors<'_, B>, name: &str| -> crate::Result<Option<WeightInfo>> {
        if spec.post_norms {
            t.vector(&format!("{p}.{name}.weight"), d).map(Some)
        } else {
            Ok(None)
        }
    };
    Ok(LayerWeights {
        attn_norm: t.vector(&format!("{p}.attn_norm.weight"), d)?,
        wq: t.weight(&format!("{p}.attn_q.weight"), &[d, qd])?,
        wk: t.weight(&format!("{p}.attn_k.weight"), &[d, kd])?,
        wv: t.weight(&format!("{p}.attn_v.weight"), &[d, vd])?,
        wo: t.weight(
            &format!("{p}.attn_output.weight"),
            &[cfg.n_head * cfg.head_dim_v, d],
        )?,
        bias,
        qk_norm,
        post_attn_norm: post(t, "post_attention_norm")?,
        ffn_norm: t.vector(&format!("{p}.ffn_norm.weight"), d)?,
        ffn: load_ffn(t, cfg, spec.moe, &p)?,
        post_ffn_norm: post(t, "post_ffw_norm")?,
    })
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
    let raw = read_all(model, sources, progress).await?;
    let mut t = Tensors {
        raw,
        backend: &backend,
        buffers: Vec::new(),
        arch: cfg.arch.clone(),
    };
    let d = cfg.n_embd;
    let tok_embd = t.weight("token_embd.weight", &[d, cfg.n_vocab])?;
    let output = t.weight_opt("output.weight", &[d, cfg.n_vocab])?;
    let output_norm = t.vector("output_norm.weight", d)?;
    let rope_freqs = t.vector_opt("rope_freqs.weight", spec.n_rot / 2)?;
    let layers = (0..cfg.n_layer)
        .map(|il| load_layer(&mut t, &cfg, &spec, il))
        .collect::<crate::Result<Vec<_>>>()?;
    let buffers = t.buffers;
    let kv = alloc_kv(&backend, &cfg, &opts.kv)?;
    Ok(Model {
        spec,
        backend,
        exact: opts.exact_f32,
        buffers,
        weights: ModelWeights {
            tok_embd,
            output_norm,
            output,
            rope_freqs,
            layers,
        },
        kv,
        kv_cfg: opts.kv,
        cfg,
    })
}
