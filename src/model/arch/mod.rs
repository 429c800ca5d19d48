//! What each supported architecture computes, as data: one file per
//! architecture fills an [`ArchSpec`] from the configuration and metadata,
//! and the one transformer forward pass reads it.
//!
//! The spec follows llama.cpp (see `tests/fixtures/llamacpp/README.md`).

pub mod gemma3;
pub mod llama;
pub mod plan;
pub mod qwen2;
pub mod qwen3;
pub mod qwen3moe;

use crate::gguf::Metadata;
use crate::graph::{Activation, RopeMode};
use crate::model::{ConfigError, ModelConfig, SUPPORTED_ARCHITECTURES};

/// Per-layer attention settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerSpec {
    /// Sliding window for local layers.
    pub window: Option<usize>,
    /// RoPE base of the layer.
    pub rope_base: f32,
}

/// How an architecture's forward pass differs from plain llama.
#[derive(Debug, Clone, PartialEq)]
pub struct ArchSpec {
    /// RoPE pair layout.
    pub rope_mode: RopeMode,
    /// Rotated dims per head.
    pub n_rot: usize,
    /// Linear RoPE scaling (`rope.scaling.type = linear`: 1 / factor; else 1).
    pub rope_freq_scale: f32,
    /// q/k/v projections carry biases (qwen2).
    pub qkv_bias: bool,
    /// RMS norm of each q and k head before RoPE (qwen3, gemma3).
    pub qk_norm: bool,
    /// Norms on the attention and FFN outputs before the residual adds (gemma3).
    pub post_norms: bool,
    /// Multiplier of the input embeddings (gemma3: sqrt(n_embd)).
    pub embd_scale: Option<f32>,
    /// FFN activation.
    pub act: Activation,
    /// MoE FFN (experts) instead of a dense one.
    pub moe: bool,
    /// Attention score multiplier.
    pub attn_scale: f32,
    /// Final logit softcap, when the model has one.
    pub final_softcap: Option<f32>,
    /// Per-layer settings.
    pub layers: Vec<LayerSpec>,
}

impl ArchSpec {
    /// The llama defaults for `cfg`: NORM RoPE over the whole head, SiLU FFN,
    /// global attention, `1 / sqrt(head_dim)` scale.
    pub fn base(cfg: &ModelConfig, md: &Metadata, rope_mode: RopeMode) -> Self {
        let n_rot = md
            .get_u64(&format!("{}.rope.dimension_count", cfg.arch))
            .map_or(cfg.head_dim_k, |v| v as usize);
        let key = |k: &str| format!("{}.{k}", cfg.arch);
        let linear = md.get_str(&key("rope.scaling.type")) == Some("linear");
        let rope_freq_scale = match md.get_f32(&key("rope.scaling.factor")) {
            Some(f) if linear && f > 0.0 => 1.0 / f,
            _ => 1.0,
        };
        Self {
            rope_mode,
            n_rot,
            rope_freq_scale,
            qkv_bias: false,
            qk_norm: false,
            post_norms: false,
            embd_scale: None,
            act: Activation::Silu,
            moe: cfg.n_expert > 0,
            attn_scale: 1.0 / (cfg.head_dim_k as f32).sqrt(),
            final_softcap: md.get_f32(&key("final_logit_softcapping")),
            layers: vec![
                LayerSpec {
                    window: None,
                    rope_base: cfg.rope_base,
                };
                cfg.n_layer
            ],
        }
    }
}

/// The spec of `cfg.arch`, or an error naming the supported architectures.
pub fn spec_for(cfg: &ModelConfig, md: &Metadata) -> Result<ArchSpec, ConfigError> {
    let spec = match cfg.arch.as_str() {
        "llama" => llama::spec(cfg, md),
        "qwen2" => qwen2::spec(cfg, md),
        "qwen3" => qwen3::spec(cfg, md),
        "qwen3moe" => qwen3moe::spec(cfg, md),
        "gemma3" => gemma3::spec(cfg, md),
        _ => {
            return Err(ConfigError::UnsupportedArchitecture {
                arch: cfg.arch.clone(),
            })
        }
    };
    debug_assert!(SUPPORTED_ARCHITECTURES.contains(&cfg.arch.as_str()));
    if spec.n_rot > cfg.head_dim_k || spec.n_rot % 2 != 0 {
        return Err(ConfigError::Invalid(format!(
            "rope.dimension_count {} does not fit heads of {}",
            spec.n_rot, cfg.head_dim_k
        )));
    }
    Ok(spec)
}
