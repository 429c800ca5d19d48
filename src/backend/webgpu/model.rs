//! [`GpuModel`]: the generic [`Model`] on the [`WebGpuBackend`], and its
//! loader, which plans device memory before reading any tensor data.

use super::context::{GpuContext, GpuOptions};
use super::memory::{budget_from_env, MemoryPlan};
use super::WebGpuBackend;
use crate::backend::{Backend, BackendError};
use crate::gguf::{ByteSource, GgufModel};
use crate::model::generic::Model;
use crate::model::load::{load_model, LoadOptions, LoadProgress};
use crate::model::ModelConfig;

/// A model loaded on the WebGPU backend, with its K/V cache.
pub type GpuModel = Model<WebGpuBackend>;

/// Tokens of the largest step the memory plan allows for.
pub const PLAN_MAX_TOKENS: usize = 512;

/// Opens a device (see [`GpuContext::new`]), checks that `model` with the
/// K/V cache of `opts` fits it ([`MemoryPlan`], budget from
/// `HEARTH_GPU_MEMORY` when set), then streams the weights onto it.
pub async fn load_webgpu_model<S: ByteSource>(
    model: &GgufModel,
    sources: &[S],
    opts: &LoadOptions,
    gpu: &GpuOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> crate::Result<GpuModel> {
    let ctx = GpuContext::new(gpu).await.map_err(BackendError::from)?;
    let backend = WebGpuBackend::new(ctx);
    let cfg = ModelConfig::from_metadata_supported(model.metadata())?;
    let plan = MemoryPlan::estimate(model, &cfg, &opts.kv, PLAN_MAX_TOKENS, |t| {
        let cols = t.shape.first().copied().unwrap_or(0) as usize;
        let rows = (t.n_elements() as usize) / cols.max(1);
        backend.weight_bytes(t.ty, cols, rows).max(t.size)
    });
    plan.check(&backend.context().caps, budget_from_env())
        .map_err(BackendError::from)?;
    load_model(backend, model, sources, opts, progress).await
}
