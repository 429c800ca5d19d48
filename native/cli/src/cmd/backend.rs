//! The backends this build can run models on.
//!
//! Until the CPU backend lands in the core this file stands in for
//! `hearth::model::{load_cpu_model, CpuModel, LoadOptions, LoadProgress}`
//! with the same signatures; loading then fails with a clear message.

#![allow(dead_code)] // the stand-in is replaced by the core's loader

use hearth::gguf::{ByteSource, GgufModel};
use hearth::model::{Batch, ForwardModel, KvCacheConfig, ModelConfig};

/// Backends compiled into this build, for `--backend`.
pub const BACKENDS: &[&str] = &["cpu"];

/// Checks `--backend NAME` names a backend of this build.
pub fn check_backend(name: &str) -> anyhow::Result<()> {
    if BACKENDS.contains(&name) {
        return Ok(());
    }
    anyhow::bail!(
        "backend `{name}` is not in this build; this build has: {}",
        BACKENDS.join(", ")
    )
}

/// How to load a model.
#[derive(Debug, Clone, Copy)]
pub struct LoadOptions {
    /// The K/V cache to allocate.
    pub kv: KvCacheConfig,
    /// Worker threads (0 = all cores).
    pub threads: usize,
    /// Exact-f32 activations (testing).
    pub exact_f32: bool,
}

/// Load progress.
#[derive(Debug, Clone, Copy, Default)]
pub struct LoadProgress {
    /// Tensor bytes read so far.
    pub bytes_done: u64,
    /// Tensor bytes in the model.
    pub bytes_total: u64,
    /// Tensors read completely.
    pub tensors_done: usize,
    /// Tensors in the model.
    pub tensors_total: usize,
}

/// A model on the CPU backend.
#[derive(Debug)]
pub struct CpuModel {
    config: ModelConfig,
}

impl ForwardModel for CpuModel {
    fn config(&self) -> &ModelConfig {
        &self.config
    }

    async fn forward(&mut self, _batch: &Batch<'_>) -> hearth::Result<Vec<f32>> {
        Ok(Vec::new())
    }
}

/// Loads `model` onto the CPU backend.
pub async fn load_cpu_model<S: ByteSource>(
    _model: &GgufModel,
    _sources: &[S],
    _opts: &LoadOptions,
    _progress: &mut dyn FnMut(&LoadProgress),
) -> hearth::Result<CpuModel> {
    Err(hearth::engine::EngineError::BadConfig {
        detail: "this build has no CPU model backend yet".into(),
    }
    .into())
}
