//! The memory a model will need on a backend, from the GGUF header alone.

use crate::backend::{Backend, MemoryNeed};
use crate::gguf::GgufModel;
use crate::graph::KvCacheConfig;
use crate::model::ModelConfig;

/// The estimate for `model` with the K/V cache `kv` and steps of up to
/// `max_tokens` tokens, with each tensor at its size on `backend`
/// ([`Backend::weight_bytes`], at least the file's).
pub fn memory_need<B: Backend>(
    model: &GgufModel,
    cfg: &ModelConfig,
    kv: &KvCacheConfig,
    max_tokens: usize,
    backend: &B,
) -> MemoryNeed {
    let mut need = MemoryNeed::default();
    for t in &model.tensors {
        let cols = t.shape.first().copied().unwrap_or(0) as usize;
        let rows = (t.n_elements() as usize) / cols.max(1);
        let b = backend.weight_bytes(t.ty, cols, rows).max(t.size);
        need.weights += b;
        need.largest_weight = need.largest_weight.max(b);
    }
    let slots = (kv.num_blocks * kv.block_size) as u64;
    let width = (cfg.n_head_kv * cfg.head_dim_k.max(cfg.head_dim_v)) as u64;
    need.kv_layer = slots * width * kv.dtype.bytes() as u64;
    need.kv = 2 * need.kv_layer * cfg.n_layer as u64;
    let head = cfg.head_dim_k.max(cfg.head_dim_v);
    let row = 4
        * (3 * cfg.n_embd
            + 2 * cfg.n_head * head
            + 2 * cfg.n_head_kv * head
            + 2 * cfg.n_ff.max(cfg.n_ff_expert.unwrap_or(0))
            + cfg.n_vocab) as u64;
    need.activations = row * max_tokens as u64;
    need
}
