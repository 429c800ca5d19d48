//! `llama`: Llama 2/3, SmolLM2, Mistral; Mixtral when `expert_count` is set.
//! NORM-mode RoPE, SiLU-gated FFN (or MoE), tied output when no `output.weight`.

use super::ArchSpec;
use crate::gguf::Metadata;
use crate::graph::RopeMode;
use crate::model::ModelConfig;

/// The llama spec.
pub fn spec(cfg: &ModelConfig, md: &Metadata) -> ArchSpec {
    ArchSpec::base(cfg, md, RopeMode::Norm)
}
