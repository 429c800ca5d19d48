//! What a model asks of a device's memory, estimated from its header before
//! anything is allocated ([`crate::model::load::check_model`]), so that a
//! model that cannot fit fails with a clear message before any tensor data
//! is read. A backend checks it against what its device has
//! ([`Backend::check_memory`](super::Backend::check_memory)).

use std::fmt;

/// The device memory a model needs, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MemoryNeed {
    /// All weights, as the backend stores them (repacked, where it repacks).
    pub weights: u64,
    /// The largest single weight.
    pub largest_weight: u64,
    /// The K/V cache of every layer.
    pub kv: u64,
    /// One layer's K (or V) cache buffer.
    pub kv_layer: u64,
    /// Activations of the largest step.
    pub activations: u64,
}

impl MemoryNeed {
    /// Total bytes.
    pub fn total(&self) -> u64 {
        self.weights + self.kv + self.activations
    }
}

/// Bytes as GiB with two decimals.
pub(crate) fn gib(bytes: u64) -> String {
    format!("{:.2}", bytes as f64 / (1u64 << 30) as f64)
}

/// Bytes with their unit: GiB with two decimals from 1 GiB, else MiB with one.
pub(crate) fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
    }
}

impl fmt::Display for MemoryNeed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} GiB ({} weights, {} K/V cache, {} activations)",
            gib(self.total()),
            gib(self.weights),
            gib(self.kv),
            gib(self.activations)
        )
    }
}
