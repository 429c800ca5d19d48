//! `qwen3moe`: qwen3 attention with a MoE FFN (softmax router over all
//! experts, top-k, renormalised weights).

use super::ArchSpec;
use crate::gguf::Metadata;
use crate::model::ModelConfig;

/// The qwen3moe spec.
pub fn spec(cfg: &ModelConfig, md: &Metadata) -> ArchSpec {
    ArchSpec {
        moe: true,
        ..super::qwen3::spec(cfg, md)
    }
}
