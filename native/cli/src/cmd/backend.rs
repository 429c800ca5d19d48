//! The backends this build can run models on.

use hearth::backend::webgpu::{load_webgpu_model, GpuModel, GpuOptions};
use hearth::gguf::{ByteSource, GgufModel};
pub use hearth::model::{load_cpu_model, CpuModel, LoadOptions, LoadProgress};
use hearth::model::{Batch, ForwardModel, ModelConfig};

/// Backends compiled into this build, for `--backend`.
pub const BACKENDS: &[&str] = &["cpu", "webgpu"];

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

/// A model on any backend of this build.
// One value per process: the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum AnyModel {
    /// On the CPU.
    Cpu(CpuModel),
    /// On a GPU through WebGPU (Vulkan, Metal, DX12).
    WebGpu(GpuModel),
}

impl ForwardModel for AnyModel {
    fn config(&self) -> &ModelConfig {
        match self {
            AnyModel::Cpu(m) => m.config(),
            AnyModel::WebGpu(m) => m.config(),
        }
    }

    async fn forward(&mut self, batch: &Batch<'_>) -> hearth::Result<Vec<f32>> {
        match self {
            AnyModel::Cpu(m) => m.forward(batch).await,
            AnyModel::WebGpu(m) => m.forward(batch).await,
        }
    }

    async fn forward_argmax(&mut self, batch: &Batch<'_>) -> hearth::Result<Vec<u32>> {
        match self {
            AnyModel::Cpu(m) => m.forward_argmax(batch).await,
            AnyModel::WebGpu(m) => m.forward_argmax(batch).await,
        }
    }

    async fn forward_top_k(
        &mut self,
        batch: &Batch<'_>,
        k: usize,
    ) -> hearth::Result<Vec<Vec<(u32, f32)>>> {
        match self {
            AnyModel::Cpu(m) => m.forward_top_k(batch, k).await,
            AnyModel::WebGpu(m) => m.forward_top_k(batch, k).await,
        }
    }
}

impl AnyModel {
    /// The device the model runs on, as its backend names it.
    pub fn device_name(&self) -> String {
        use hearth::backend::Backend;
        match self {
            AnyModel::Cpu(m) => m.backend().caps().name.clone(),
            AnyModel::WebGpu(m) => m.backend().caps().name.clone(),
        }
    }
}

/// Loads `model` on the backend named `name` (one of [`BACKENDS`]).
pub async fn load_on<S: ByteSource>(
    name: &str,
    model: &GgufModel,
    sources: &[S],
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> anyhow::Result<AnyModel> {
    check_backend(name)?;
    Ok(match name {
        "webgpu" => AnyModel::WebGpu(
            load_webgpu_model(model, sources, opts, &GpuOptions::from_env(), progress).await?,
        ),
        _ => AnyModel::Cpu(load_cpu_model(model, sources, opts, progress).await?),
    })
}
