//! `gemma3`: embeddings scaled by sqrt(n_embd), q/k head norms, norms after
//! attention and FFN, GELU-tanh FFN, NEOX RoPE, and sliding-window layers:
//! layer i is local when `i % pattern < pattern - 1` (pattern from
//! `gemma3.attention.sliding_window_pattern`, default 6), with RoPE base
//! `rope.freq_base_swa` (default 10000) on local layers.

use super::ArchSpec;
use crate::gguf::Metadata;
use crate::graph::Activation;
use crate::graph::RopeMode;
use crate::model::ModelConfig;

/// llama.cpp's default `sliding_window_pattern` for gemma3.
const DEFAULT_PATTERN: usize = 6;
/// Default RoPE base of local layers.
const DEFAULT_SWA_BASE: f32 = 10_000.0;

/// The gemma3 spec.
pub fn spec(cfg: &ModelConfig, md: &Metadata) -> ArchSpec {
    let mut spec = ArchSpec {
        qk_norm: true,
        post_norms: true,
        embd_scale: Some((cfg.n_embd as f32).sqrt()),
        act: Activation::GeluTanh,
        ..ArchSpec::base(cfg, md, RopeMode::Neox)
    };
    if let Some(window) = cfg.sliding_window.filter(|&w| w > 0) {
        let pattern = md
            .get_u64("gemma3.attention.sliding_window_pattern")
            .map_or(DEFAULT_PATTERN, |v| v as usize);
        let swa_base = cfg.rope_base_swa.unwrap_or(DEFAULT_SWA_BASE);
        for (i, l) in spec.layers.iter_mut().enumerate() {
            if pattern == 0 || i % pattern < pattern - 1 {
                l.window = Some(window);
                l.rope_base = swa_base;
            }
        }
    }
    spec
}
