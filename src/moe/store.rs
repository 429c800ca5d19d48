//! [`ExpertStore`]: the seam between a model and wherever its routed
//! experts live (device slots, host memory, a file), with the routes of a
//! step ([`Routes`]) as what crosses it.

use crate::backend::BackendError;
#[cfg(doc)]
use crate::graph::plan::HostWrite;
use crate::graph::plan::SyncFuture;

/// The routes of one MoE layer for one step, as [`crate::graph::Op::MoeTopK`]
/// made them on the device: each token's `k` experts, best first, and their
/// weights.
#[derive(Debug, Clone, PartialEq)]
pub struct Routes {
    /// Experts per token.
    pub k: usize,
    /// Expert ids, `[tokens, k]`.
    pub ids: Vec<u32>,
    /// Their weights, `[tokens, k]` (each token's sum to 1).
    pub weights: Vec<f32>,
}

impl Routes {
    /// The routes read back from the device: `ids` and `weights` are the
    /// bytes of the router's two outputs.
    pub fn from_bytes(k: usize, ids: &[u8], weights: &[u8]) -> Result<Self, BackendError> {
        let ids: Vec<u32> = bytemuck::pod_collect_to_vec(ids);
        let weights: Vec<f32> = bytemuck::pod_collect_to_vec(weights);
        if k == 0 || ids.len() != weights.len() || !ids.len().is_multiple_of(k) {
            return Err(BackendError::Shape(format!(
                "routes of {} ids and {} weights for {k} experts per token",
                ids.len(),
                weights.len()
            )));
        }
        Ok(Self { k, ids, weights })
    }

    /// Tokens routed.
    pub fn tokens(&self) -> usize {
        self.ids.len() / self.k.max(1)
    }

    /// The experts used by any token, ascending, each once.
    pub fn experts(&self) -> Vec<u32> {
        let mut e = self.ids.clone();
        e.sort_unstable();
        e.dedup();
        e
    }
}

/// `Send` natively, where an engine may move between threads (a server's);
/// nothing in the browser, whose GPU handles stay on their thread.
#[cfg(not(target_arch = "wasm32"))]
pub trait MaybeSend: Send {}
#[cfg(not(target_arch = "wasm32"))]
impl<T: Send> MaybeSend for T {}
/// `Send` natively, where an engine may move between threads (a server's);
/// nothing in the browser, whose GPU handles stay on their thread.
#[cfg(target_arch = "wasm32")]
pub trait MaybeSend {}
#[cfg(target_arch = "wasm32")]
impl<T> MaybeSend for T {}

/// Where one MoE layer's routed experts are for a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpertPlacement {
    /// All of them on the device, in the model's stacked weights: the
    /// step does not stop.
    Device,
    /// In a pool of device slots: the layer's stacked weights hold the
    /// pool's experts, not the model's. The step stops after the layer's
    /// routing ([`ExpertStore::prepare`]: fill slots, rewrite the ids to
    /// slots) and again once the device runs the resident experts
    /// ([`ExpertStore::host_part`]: the store's share of the output, from
    /// the experts it computes where they live).
    Slots,
    /// On the host only: the store computes every routed expert
    /// (llama.cpp's `--cpu-moe`); the device runs none.
    Host,
}

/// Where a model's routed experts live, and how the ones a step routes to
/// get onto its device: the expert cache ([`super::ExpertCache`])
/// implements this.
///
/// A model given a store asks it once, layer by layer, where its experts
/// are ([`ExpertStore::placement`]); the plans of a layer off the device
/// stop after its routing, where [`ExpertStore::prepare`] sees the step's
/// routes and the layer's FFN input and says what to write before the
/// experts run (expert rows into device slots, the ids rewritten to
/// slots), and once the device runs them, where
/// [`ExpertStore::host_part`] adds what the store computed itself.
pub trait ExpertStore: MaybeSend {
    /// Where `layer`'s routed experts are.
    fn placement(&self, layer: usize) -> ExpertPlacement;

    /// Called after `layer`'s routing with its `routes` and FFN `input`
    /// (`[tokens, n_embd]`): the writes that make the experts the device
    /// runs resident. [`HostWrite::Act`] index 0 is the ids buffer
    /// (`[tokens, k]` u32; an id at or past the layer's slots is left to
    /// the host); a [`HostWrite::WeightRows`] fills a slot.
    fn prepare(&mut self, layer: usize, routes: Routes, input: Vec<f32>) -> SyncFuture<'_>;

    /// Called once the device runs `layer`'s resident experts (while it
    /// does): the store's share of the layer's output, the weighted sum of
    /// the experts it left to the host, as [`HostWrite::Act`] index 0
    /// (`[tokens, n_embd]` f32, zeros when none; for a
    /// [`ExpertPlacement::Host`] layer, the whole output).
    fn host_part(&mut self, layer: usize) -> SyncFuture<'_>;

    /// What the store did so far, if it keeps count.
    fn stats(&self) -> Option<super::ExpertStats> {
        None
    }
}
