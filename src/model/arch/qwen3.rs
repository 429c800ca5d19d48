//! `qwen3`: llama with NEOX RoPE and an RMS norm on each q and k head before RoPE.

use super::ArchSpec;
use crate::gguf::Metadata;
use crate::graph::RopeMode;
use crate::model::ModelConfig;

/// The qwen3 spec.
pub fn spec(cfg: &ModelConfig, md: &Metadata) -> ArchSpec {
    ArchSpec {
        qk_norm: true,
        ..ArchSpec::base(cfg, md, RopeMode::Neox)
    }
}
