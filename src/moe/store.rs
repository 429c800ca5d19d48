//! [`ExpertStore`]: the seam between a model and wherever its routed
//! experts live (device slots, host memory, a file), with the routes of a
//! step ([`Routes`]) as what crosses it.

use crate::backend::BackendError;
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

/// Where a model's routed experts live, and how the ones a step routes to
/// get onto its device: the expert cache implements this.
///
/// A model given a store asks it once, layer by layer, which MoE layers
/// may have experts off the device ([`ExpertStore::needs_routes`]); its
/// plans then stop after each such layer's routing, and the store's
/// [`ExpertStore::prepare`] sees the step's routes before the layer's
/// experts run (a copy into a device slot, a read from host memory or a
/// file, a note of what to prefetch for the next step).
pub trait ExpertStore: MaybeSend {
    /// Whether `layer`'s routed experts may be off the device, so that a
    /// step must stop after its routing for [`ExpertStore::prepare`].
    fn needs_routes(&self, layer: usize) -> bool;

    /// Makes the experts of `routes` resident for `layer` before its
    /// experts run in this step.
    fn prepare<'a>(&'a mut self, layer: usize, routes: &'a Routes) -> SyncFuture<'a>;
}
