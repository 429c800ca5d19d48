//! The weight layout of a model: which GGUF tensors it needs, checked
//! against the file's tensor table (names, shapes, types, sizes) before any
//! data is read, each given a buffer index.

use std::collections::HashMap;

use crate::backend::BackendError;
use crate::gguf::{GgufModel, TensorInfo};
use crate::model::arch::ArchSpec;
use crate::model::load::LoadError;
use crate::model::weights::{FfnWeights, LayerWeights, ModelWeights, WeightInfo};
use crate::model::ModelConfig;
use crate::quant::GgmlType;

/// How a tensor is stored on the backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotKind {
    /// A matrix of `rows` rows of `cols` values of `ty`, uploaded row by row.
    Matrix {
        /// Element type.
        ty: GgmlType,
        /// Values per row.
        cols: usize,
        /// Rows.
        rows: usize,
    },
    /// A vector (norm weight, bias) of `n` values of `ty`, converted to f32.
    Vector {
        /// Element type in the file.
        ty: GgmlType,
        /// Values.
        n: usize,
    },
}

/// One weight buffer to fill from one tensor of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slot {
    /// The tensor's name.
    pub name: String,
    /// How it is stored.
    pub kind: SlotKind,
    /// Its bytes in the file.
    pub file_bytes: u64,
}

/// Collects the tensors a model needs, in the order the model declares them.
#[derive(Debug)]
pub struct Layout<'a> {
    infos: HashMap<&'a str, &'a TensorInfo>,
    /// Buffers by [`WeightInfo::id`].
    pub slots: Vec<Slot>,
    arch: String,
}

impl<'a> Layout<'a> {
    /// An empty layout over `model`'s tensor table.
    pub fn new(model: &'a GgufModel, arch: &str) -> Self {
        Self {
            infos: model.tensors.iter().map(|t| (t.name.as_str(), t)).collect(),
            slots: Vec::new(),
            arch: arch.to_string(),
        }
    }

    fn info(&self, name: &str, shape: &[usize]) -> crate::Result<Option<&'a TensorInfo>> {
        let Some(&info) = self.infos.get(name) else {
            return Ok(None);
        };
        let expected: Vec<u64> = shape.iter().map(|&d| d as u64).collect();
        if info.shape != expected {
            return Err(LoadError::WrongShape {
                name: name.to_string(),
                expected,
                found: info.shape.clone(),
            }
            .into());
        }
        Ok(Some(info))
    }

    fn missing(&self, name: &str) -> crate::Error {
        LoadError::MissingTensor {
            name: name.to_string(),
            arch: self.arch.clone(),
        }
        .into()
    }

    fn push(&mut self, info: &TensorInfo, kind: SlotKind) -> usize {
        self.slots.push(Slot {
            name: info.name.clone(),
            kind,
            file_bytes: info.size,
        });
        self.slots.len() - 1
    }

    /// A matrix `[shape[0]]` columns by the product of the rest rows.
    pub fn weight_opt(&mut self, name: &str, shape: &[usize]) -> crate::Result<Option<WeightInfo>> {
        let Some(info) = self.info(name, shape)? else {
            return Ok(None);
        };
        let rows = shape[1..].iter().product();
        let ty = info.ty;
        let be = ty.block_elems().max(1);
        let row_bytes = shape[0] / be * ty.block_bytes();
        if !shape[0].is_multiple_of(be) || (row_bytes * rows) as u64 != info.size {
            return Err(BackendError::Shape(format!(
                "tensor '{name}': {} bytes do not hold {rows} rows of {} {ty}",
                info.size, shape[0]
            ))
            .into());
        }
        let cols = shape[0];
        let id = self.push(info, SlotKind::Matrix { ty, cols, rows });
        Ok(Some(WeightInfo { id, ty, cols, rows }))
    }

    /// [`Layout::weight_opt`] of a tensor the model needs.
    pub fn weight(&mut self, name: &str, shape: &[usize]) -> crate::Result<WeightInfo> {
        self.weight_opt(name, shape)?
            .ok_or_else(|| self.missing(name))
    }

    /// A vector (norm weight, bias), stored as f32.
    pub fn vector_opt(&mut self, name: &str, n: usize) -> crate::Result<Option<WeightInfo>> {
        let Some(info) = self.info(name, &[n])? else {
            return Ok(None);
        };
        let elem = match info.ty {
            GgmlType::F32 => 4,
            GgmlType::F16 | GgmlType::BF16 => 2,
            ty => {
                return Err(LoadError::VectorType {
                    tensor: name.to_string(),
                    ty,
                }
                .into())
            }
        };
        if info.size < (n * elem) as u64 {
            return Err(BackendError::Shape(format!(
                "tensor '{name}': {} bytes do not hold {n} values",
                info.size
            ))
            .into());
        }
        let id = self.push(info, SlotKind::Vector { ty: info.ty, n });
        Ok(Some(WeightInfo {
            id,
            ty: GgmlType::F32,
            cols: n,
            rows: 1,
        }))
    }

    /// [`Layout::vector_opt`] of a tensor the model needs.
    pub fn vector(&mut self, name: &str, n: usize) -> crate::Result<WeightInfo> {
        self.vector_opt(name, n)?.ok_or_else(|| self.missing(name))
    }

    /// Every weight of the model `cfg` / `spec` describes.
    pub fn model(&mut self, cfg: &ModelConfig, spec: &ArchSpec) -> crate::Result<ModelWeights> {
        let d = cfg.n_embd;
        let tok_embd = self.weight("token_embd.weight", &[d, cfg.n_vocab])?;
        let output = self.weight_opt("output.weight", &[d, cfg.n_vocab])?;
        let output_norm = self.vector("output_norm.weight", d)?;
        let rope_freqs = self.vector_opt("rope_freqs.weight", spec.n_rot / 2)?;
        let layers = (0..cfg.n_layer)
            .map(|il| self.layer(cfg, spec, il))
            .collect::<crate::Result<Vec<_>>>()?;
        Ok(ModelWeights {
            tok_embd,
            output_norm,
            output,
            rope_freqs,
            layers,
        })
    }

    fn ffn(&mut self, cfg: &ModelConfig, moe: bool, p: &str) -> crate::Result<FfnWeights> {
        let d = cfg.n_embd;
        if moe {
            let (ne, ff) = (cfg.n_expert, cfg.n_ff_expert.unwrap_or(cfg.n_ff));
            // An expert-parallel shard holds some of the experts; its
            // router still scores them all.
            let held = cfg.expert_shard.map_or(ne, |(_, count)| count);
            return Ok(FfnWeights::Moe {
                router: self.weight(&format!("{p}.ffn_gate_inp.weight"), &[d, ne])?,
                gate: self.weight(&format!("{p}.ffn_gate_exps.weight"), &[d, ff, held])?,
                up: self.weight(&format!("{p}.ffn_up_exps.weight"), &[d, ff, held])?,
                down: self.weight(&format!("{p}.ffn_down_exps.weight"), &[ff, d, held])?,
                n_ff: ff,
            });
        }
        let ff = cfg.n_ff;
        Ok(FfnWeights::Dense {
            gate: self.weight(&format!("{p}.ffn_gate.weight"), &[d, ff])?,
            up: self.weight(&format!("{p}.ffn_up.weight"), &[d, ff])?,
            down: self.weight(&format!("{p}.ffn_down.weight"), &[ff, d])?,
        })
    }

    fn layer(
        &mut self,
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
                self.vector(&format!("{p}.attn_q.bias"), qd)?,
                self.vector(&format!("{p}.attn_k.bias"), kd)?,
                self.vector(&format!("{p}.attn_v.bias"), vd)?,
            ])
        } else {
            None
        };
        let qk_norm = if spec.qk_norm {
            Some([
                self.vector(&format!("{p}.attn_q_norm.weight"), cfg.head_dim_k)?,
                self.vector(&format!("{p}.attn_k_norm.weight"), cfg.head_dim_k)?,
            ])
        } else {
            None
        };
        let post = |l: &mut Self, name: &str| -> crate::Result<Option<WeightInfo>> {
            if spec.post_norms {
                l.vector(&format!("{p}.{name}.weight"), d).map(Some)
            } else {
                Ok(None)
            }
        };
        Ok(LayerWeights {
            attn_norm: self.vector(&format!("{p}.attn_norm.weight"), d)?,
            wq: self.weight(&format!("{p}.attn_q.weight"), &[d, qd])?,
            wk: self.weight(&format!("{p}.attn_k.weight"), &[d, kd])?,
            wv: self.weight(&format!("{p}.attn_v.weight"), &[d, vd])?,
            wo: self.weight(
                &format!("{p}.attn_output.weight"),
                &[cfg.n_head * cfg.head_dim_v, d],
            )?,
            bias,
            qk_norm,
            post_attn_norm: post(self, "post_attention_norm")?,
            ffn_norm: self.vector(&format!("{p}.ffn_norm.weight"), d)?,
            ffn: self.ffn(cfg, spec.moe, &p)?,
            post_ffn_norm: post(self, "post_ffw_norm")?,
        })
    }
}
