//! Loading a GGUF model onto the CPU backend.
//!
//! Tensor data is streamed in bounded chunks in file order (over an mmap'd
//! source the chunks borrow the mapping) into 4-byte aligned buffers, one per
//! tensor, reporting progress after every chunk. Then each tensor is checked
//! against the shape the architecture needs and wrapped for its kernels.

use std::collections::HashMap;

use thiserror::Error;

use crate::backend::cpu::attention::KvCache;
use crate::backend::cpu::kernels::KernelTable;
use crate::backend::cpu::matmul::Weight;
use crate::backend::cpu::model::{Ffn, Layer};
use crate::backend::cpu::threads::Threads;
use crate::backend::cpu::CpuModel;
use crate::backend::BackendError;
use crate::gguf::{ByteSource, GgufModel, TensorInfo, TensorStream};
use crate::model::arch::spec_for;
use crate::model::{KvCacheConfig, ModelConfig};
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

/// Takes tensors out of the read set, checking shapes and types.
struct Tensors<'a> {
    raw: HashMap<String, Raw>,
    table: &'a KernelTable,
    arch: String,
}

impl Tensors<'_> {
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

    /// A matrix `[shape[0]]` columns by the product of the rest rows.
    fn weight_opt(&mut self, name: &str, shape: &[usize]) -> crate::Result<Option<Weight>> {
        let Some(raw) = self.take_raw(name, shape)? else {
            return Ok(None);
        };
        let rows = shape[1..].iter().product();
        let len = raw.info.size as usize;
        let w = Weight::new(self.table, name, raw.info.ty, shape[0], rows, raw.data, len)?;
        Ok(Some(w))
    }

    fn weight(&mut self, name: &str, shape: &[usize]) -> crate::Result<Weight> {
        self.weight_opt(name, shape)?
            .ok_or_else(|| self.missing(name))
    }

    /// A vector (norm weight, bias) as f32.
    fn vector_opt(&mut self, name: &str, n: usize) -> crate::Result<Option<Vec<f32>>> {
        let Some(raw) = self.take_raw(name, &[n])? else {
            return Ok(None);
        };
        let ty = raw.info.ty;
        if !matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
            return Err(BackendError::UnsupportedType {
                tensor: name.to_string(),
                ty,
            }
            .into());
        }
        let w = Weight::new(self.table, name, ty, n, 1, raw.data, raw.info.size as usize)?;
        let mut out = vec![0.0f32; n];
        w.dequantize_row(0, &mut out);
        Ok(Some(out))
    }

    fn vector(&mut self, name: &str, n: usize) -> crate::Result<Vec<f32>> {
        self.vector_opt(name, n)?.ok_or_else(|| self.missing(name))
    }
}

/// Checks up front that every matrix has a CPU kernel, so a bad file fails
/// before its data is read.
fn check_types(model: &GgufModel, table: &KernelTable) -> Result<(), BackendError> {
    for t in &model.tensors {
        if t.shape.len() >= 2 && table.weight(t.ty).is_none() {
            return Err(BackendError::UnsupportedType {
                tensor: t.name.clone(),
                ty: t.ty,
            });
        }
    }
    Ok(())
}

fn load_ffn(t: &mut Tensors<'_>, cfg: &ModelConfig, moe: bool, p: &str) -> crate::Result<Ffn> {
    let d = cfg.n_embd;
    if moe {
        let (ne, ff) = (cfg.n_expert, cfg.n_ff_expert.unwrap_or(cfg.n_ff));
        return Ok(Ffn::Moe {
            router: t.weight(&format!("{p}.ffn_gate_inp.weight"), &[d, ne])?,
            gate: t.weight(&format!("{p}.ffn_gate_exps.weight"), &[d, ff, ne])?,
            up: t.weight(&format!("{p}.ffn_up_exps.weight"), &[d, ff, ne])?,
            down: t.weight(&format!("{p}.ffn_down_exps.weight"), &[ff, d, ne])?,
            n_ff: ff,
        });
    }
    let ff = cfg.n_ff;
    Ok(Ffn::Dense {
        gate: t.weight(&format!("{p}.ffn_gate.weight"), &[d, ff])?,
        up: t.weight(&format!("{p}.ffn_up.weight"), &[d, ff])?,
        down: t.weight(&format!("{p}.ffn_down.weight"), &[ff, d])?,
    })
}

fn load_layer(
    t: &mut Tensors<'_>,
    cfg: &ModelConfig,
    spec: &crate::model::arch::ArchSpec,
    il: usize,
) -> crate::Result<Layer> {
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
    let post = |t: &mut Tensors<'_>, name: &str| -> crate::Result<Option<Vec<f32>>> {
        if spec.post_norms {
            t.vector(&format!("{p}.{name}.weight"), d).map(Some)
        } else {
            Ok(None)
        }
    };
    Ok(Layer {
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
    let cfg = ModelConfig::from_metadata_supported(model.metadata())?;
    let spec = spec_for(&cfg, model.metadata())?;
    if opts.kv.num_blocks < 2 || opts.kv.block_size == 0 {
        return Err(LoadError::Kv(format!(
            "{} blocks of {} tokens; need at least 2 blocks (block 0 is the null block) of at least 1 token",
            opts.kv.num_blocks, opts.kv.block_size
        ))
        .into());
    }
    let table = KernelTable::detect();
    check_types(model, &table)?;
    let raw = read_all(model, sources, progress).await?;
    let mut t = Tensors {
        raw,
        table: &table,
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
    let kv = KvCache::new(
        opts.kv,
        cfg.n_layer,
        cfg.n_head_kv * cfg.head_dim_k,
        cfg.n_head_kv * cfg.head_dim_v,
    );
    Ok(CpuModel {
        spec,
        table: table.clone(),
        threads: Threads::new(opts.threads),
        exact: opts.exact_f32,
        tok_embd,
        output_norm,
        output,
        layers,
        rope_freqs,
        kv,
        cfg,
    })
}
