//! A model's memory need ([`MemoryNeed`]) against the adapter's limits and,
//! where known, the device's memory budget.

use super::caps::GpuCaps;
use super::GpuError;
use crate::backend::memory::gib;
use crate::backend::MemoryNeed;

/// Checks `need` against `caps` and, when known, the device's memory
/// `budget` in bytes (WebGPU does not report it: the caller may, see
/// [`GpuOptions::memory_budget`](super::GpuOptions::memory_budget)).
pub fn check_fits(need: &MemoryNeed, caps: &GpuCaps, budget: Option<u64>) -> Result<(), GpuError> {
    if need.largest_weight > caps.max_buffer {
        return Err(GpuError::DoesNotFit(format!(
            "a weight of {} GiB is larger than the largest buffer {} allows ({} GiB)",
            gib(need.largest_weight),
            caps.adapter_name,
            gib(caps.max_buffer)
        )));
    }
    if need.kv_layer > caps.max_storage_binding {
        return Err(GpuError::DoesNotFit(format!(
            "one layer's K/V cache ({} GiB) exceeds {}'s storage binding limit ({} GiB); use fewer K/V blocks or an f16 cache",
            gib(need.kv_layer),
            caps.adapter_name,
            gib(caps.max_storage_binding)
        )));
    }
    match budget {
        Some(budget) if need.total() > budget => Err(GpuError::DoesNotFit(format!(
            "the model needs {need} but {} has {} GiB; use a smaller model, fewer K/V blocks or a smaller batch",
            caps.adapter_name,
            gib(budget)
        ))),
        _ => Ok(()),
    }
}

/// A memory size: bytes, or with a `G` / `M` suffix (`HEARTH_GPU_MEMORY`'s
/// syntax, `--gpu-mem`'s too).
pub fn parse_bytes(v: &str) -> Option<u64> {
    let v = v.trim();
    let (num, mul) = match v.chars().last()? {
        'G' | 'g' => (&v[..v.len() - 1], 1u64 << 30),
        'M' | 'm' => (&v[..v.len() - 1], 1u64 << 20),
        _ => (v, 1),
    };
    num.trim()
        .parse::<f64>()
        .ok()
        .filter(|n| n.is_finite() && *n >= 0.0)
        .map(|n| (n * mul as f64) as u64)
}
