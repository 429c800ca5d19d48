//! A model split by blocks between the host's CPU and a device (llama.cpp's
//! `-ngl`): the first blocks run on the host, the last ones and the output
//! head on the device, and the residual stream crosses once per step.
//!
//! Which tensor goes where, what the device then needs, and how many
//! blocks a device budget holds, from the layout alone (before anything
//! is read).

use std::collections::HashSet;

use crate::backend::{Backend, MemoryNeed};
use crate::model::layout::{Slot, SlotKind};
use crate::model::weights::ModelWeights;

/// Where the weights of a split model go: the layout slots the host holds,
/// and those of them the device holds too.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SplitTensors {
    /// Slots the host's blocks read (their weights, the token embeddings,
    /// RoPE factors).
    pub host: HashSet<usize>,
    /// Slots of `host` that the device reads as well (RoPE factors; the
    /// token embeddings when the output head is tied to them).
    pub shared: HashSet<usize>,
}

impl SplitTensors {
    /// The tensors of a model whose first `host_blocks` blocks run on the host.
    pub fn new(weights: &ModelWeights, host_blocks: usize) -> Self {
        let mut t = Self::default();
        if host_blocks == 0 {
            return t;
        }
        t.host.extend(
            weights
                .layers
                .iter()
                .take(host_blocks)
                .flat_map(|l| l.ids()),
        );
        t.host.insert(weights.tok_embd.id);
        if weights.output.is_none() {
            t.shared.insert(weights.tok_embd.id);
        }
        if let Some(f) = weights.rope_freqs {
            t.host.insert(f.id);
            t.shared.insert(f.id);
        }
        t
    }

    /// Whether slot `i` is on the host only (the device holds nothing of it).
    pub fn host_only(&self, i: usize) -> bool {
        self.host.contains(&i) && !self.shared.contains(&i)
    }
}

/// The bytes of slot `i` on `backend` (0 for a slot the layout does not have).
fn slot_bytes<B: Backend>(slots: &[Slot], i: usize, backend: &B) -> u64 {
    match slots.get(i).map(|s| s.kind) {
        Some(SlotKind::Matrix { ty, cols, rows }) => backend.weight_bytes(ty, cols, rows),
        Some(SlotKind::Vector { n, .. }) => (n * 4) as u64,
        None => 0,
    }
}

/// What the device needs of `whole` (the model's need with every block on
/// it) when the first `host_blocks` blocks run on the host.
pub fn device_need<B: Backend>(
    whole: &MemoryNeed,
    weights: &ModelWeights,
    slots: &[Slot],
    host_blocks: usize,
    backend: &B,
) -> MemoryNeed {
    let t = SplitTensors::new(weights, host_blocks);
    let moved: u64 = t
        .host
        .iter()
        .filter(|&&i| t.host_only(i))
        .map(|&i| slot_bytes(slots, i, backend))
        .sum();
    let n_layer = weights.layers.len() as u64;
    let host = host_blocks.min(weights.layers.len()) as u64;
    MemoryNeed {
        weights: whole.weights.saturating_sub(moved),
        kv: whole.kv / n_layer.max(1) * (n_layer - host),
        ..*whole
    }
}

/// The fewest host blocks with which the device's need fits `budget`
/// (`None`: not even with every block on the host, the device holding the
/// output head alone).
pub fn fit_blocks<B: Backend>(
    whole: &MemoryNeed,
    weights: &ModelWeights,
    slots: &[Slot],
    budget: u64,
    backend: &B,
) -> Option<usize> {
    // The need falls block by block: the first count that fits is the answer.
    (0..=weights.layers.len())
        .find(|&k| device_need(whole, weights, slots, k, backend).total() <= budget)
}
