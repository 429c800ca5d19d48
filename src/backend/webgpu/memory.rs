//! Device memory planned before a load: weights, K/V cache and a step's
//! activations against the adapter's limits, so a model that cannot fit
//! fails with a clear message before any byte is read.

use super::caps::GpuCaps;
use super::GpuError;
use crate::gguf::GgufModel;
use crate::model::{KvCacheConfig, KvType, ModelConfig};

/// What a model needs on the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryPlan {
    /// All weights, as stored on the device.
    pub weights: u64,
    /// The largest single weight.
    pub largest_weight: u64,
    /// The K/V cache of every layer.
    pub kv: u64,
    /// One layer's K (or V) cache buffer.
    pub kv_layer: u64,
    /// Activations of a step of `max_tokens` tokens.
    pub activations: u64,
}

impl MemoryPlan {
    /// The estimate for `model` with `kv` and steps of up to `max_tokens`.
    /// `device_bytes(info)` is a tensor's size on the device (repacked).
    pub fn estimate(
        model: &GgufModel,
        cfg: &ModelConfig,
        kv: &KvCacheConfig,
        max_tokens: usize,
        device_bytes: impl Fn(&crate::gguf::TensorInfo) -> u64,
    ) -> Self {
        let mut p = MemoryPlan::default();
        for t in &model.tensors {
            let b = device_bytes(t);
            p.weights += b;
            p.largest_weight = p.largest_weight.max(b);
        }
        let elem = match kv.dtype {
            KvType::F16 => 2,
            KvType::F32 => 4,
        };
        let slots = (kv.num_blocks * kv.block_size) as u64;
        let width = (cfg.n_head_kv * cfg.head_dim_k.max(cfg.head_dim_v)) as u64;
        p.kv_layer = slots * width * elem;
        p.kv = 2 * p.kv_layer * cfg.n_layer as u64;
        let row = 4
            * (3 * cfg.n_embd
                + 2 * cfg.n_head * cfg.head_dim_k.max(cfg.head_dim_v)
                + 2 * cfg.n_head_kv * cfg.head_dim_k.max(cfg.head_dim_v)
                + 2 * cfg.n_ff.max(cfg.n_ff_expert.unwrap_or(0))
                + cfg.n_vocab) as u64;
        p.activations = row * max_tokens as u64;
        p
    }

    /// Total bytes.
    pub fn total(&self) -> u64 {
        self.weights + self.kv + self.activations
    }

    /// Checks the plan against `caps` and, when known, the device's memory
    /// `budget` in bytes (WebGPU does not report it; `HEARTH_GPU_MEMORY`
    /// or the caller does).
    pub fn check(&self, caps: &GpuCaps, budget: Option<u64>) -> Result<(), GpuError> {
        let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
        if self.largest_weight > caps.max_buffer {
            return Err(GpuError::DoesNotFit(format!(
                "a weight of {:.2} GiB is larger than the largest buffer {} allows ({:.2} GiB)",
                gib(self.largest_weight),
                caps.adapter_name,
                gib(caps.max_buffer)
            )));
        }
        if self.kv_layer > caps.max_storage_binding {
            return Err(GpuError::DoesNotFit(format!(
                "one layer's K/V cache ({:.2} GiB) exceeds {}'s storage binding limit ({:.2} GiB); use fewer K/V blocks or an f16 cache",
                gib(self.kv_layer),
                caps.adapter_name,
                gib(caps.max_storage_binding)
            )));
        }
        if let Some(budget) = budget {
            if self.total() > budget {
                return Err(GpuError::DoesNotFit(format!(
                    "the model needs {:.2} GiB ({:.2} weights, {:.2} K/V cache, {:.2} activations) but {} has {:.2} GiB; use a smaller model, fewer K/V blocks or a smaller batch",
                    gib(self.total()),
                    gib(self.weights),
                    gib(self.kv),
                    gib(self.activations),
                    caps.adapter_name,
                    gib(budget)
                )));
            }
        }
        Ok(())
    }
}

/// The device memory budget from `HEARTH_GPU_MEMORY` (bytes, or with a
/// `G`/`M` suffix), if set.
pub fn budget_from_env() -> Option<u64> {
    let v = std::env::var("HEARTH_GPU_MEMORY").ok()?;
    let v = v.trim();
    let (num, mul) = match v.chars().last()? {
        'G' | 'g' => (&v[..v.len() - 1], 1u64 << 30),
        'M' | 'm' => (&v[..v.len() - 1], 1u64 << 20),
        _ => (v, 1),
    };
    num.trim()
        .parse::<f64>()
        .ok()
        .map(|n| (n * mul as f64) as u64)
}
