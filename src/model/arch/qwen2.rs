//! `qwen2`: llama with NEOX RoPE and biases on the q/k/v projections.

use super::ArchSpec;
use crate::gguf::Metadata;
use crate::graph::RopeMode;
use crate::model::ModelConfig;

/// The qwen2 spec.
pub fn spec(cfg: &ModelConfig, md: &Metadata) -> ArchSpec {
    ArchSpec {
        qkv_bias: true,
        ..ArchSpec::base(cfg, md, RopeMode::Neox)
    }
}
