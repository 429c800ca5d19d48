//! The backends of this build: [`AnyModel`] (a model on either) and
//! [`choose`], which decides from a model's header where it runs, with
//! every check that can fail before the tensors are downloaded.

use hearth::backend::cpu::CpuBackend;
use hearth::backend::BackendError;
use hearth::gguf::GgufModel;
use hearth::model::{check_types, Batch, CpuModel, ForwardModel, LoadOptions, ModelConfig};
use serde_json::{json, Value};
use wasm_bindgen::{JsError, JsValue};

use crate::js_err;
use crate::options::BackendChoice;

#[cfg(feature = "webgpu")]
use hearth::backend::webgpu::{GpuModel, WebGpuBackend};

/// A model on any backend of this build.
// One value per worker: the size difference of the variants costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
pub enum AnyModel {
    /// On the CPU (wasm SIMD128).
    Cpu(CpuModel),
    /// On the browser's WebGPU.
    #[cfg(feature = "webgpu")]
    WebGpu(GpuModel),
}

impl ForwardModel for AnyModel {
    fn config(&self) -> &ModelConfig {
        match self {
            AnyModel::Cpu(m) => m.config(),
            #[cfg(feature = "webgpu")]
            AnyModel::WebGpu(m) => m.config(),
        }
    }

    async fn forward(&mut self, batch: &Batch<'_>) -> hearth::Result<Vec<f32>> {
        match self {
            AnyModel::Cpu(m) => m.forward(batch).await,
            #[cfg(feature = "webgpu")]
            AnyModel::WebGpu(m) => m.forward(batch).await,
        }
    }

    async fn forward_argmax(&mut self, batch: &Batch<'_>) -> hearth::Result<Vec<u32>> {
        match self {
            AnyModel::Cpu(m) => m.forward_argmax(batch).await,
            #[cfg(feature = "webgpu")]
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
            #[cfg(feature = "webgpu")]
            AnyModel::WebGpu(m) => m.forward_top_k(batch, k).await,
        }
    }
}

/// Where a model will run: the CPU, or a WebGPU device already open.
pub enum Chosen {
    /// The CPU.
    Cpu,
    /// A WebGPU device the model was checked against (boxed: the backend
    /// holds its pipeline and buffer caches inline).
    #[cfg(feature = "webgpu")]
    WebGpu(Box<WebGpuBackend>),
}

/// The decision and what the page reports of it: `backend` (`cpu` or
/// `webgpu`), `adapter` (the WebGPU adapter's name), `webgpu_declined`
/// (why `auto` did not take WebGPU), `gpu_plan_bytes` (device memory the
/// model needs).
pub struct Decision {
    /// Where the model runs.
    pub chosen: Chosen,
    /// The report, as JSON fields.
    pub report: Value,
}

/// Checks `model` can run on the CPU backend: every weight type has a
/// kernel. Errors have code `unsupported-model`.
pub fn check_cpu(model: &GgufModel) -> Result<(), JsError> {
    check_types(model, &CpuBackend::new(1))
        .map_err(|e| unsupported(e, "CPU", "pick another quantization"))
}

/// The `unsupported-model` error of a failed [`check_types`] on `backend`,
/// ending with what to do (`hint`).
pub fn unsupported(e: BackendError, backend: &str, hint: &str) -> JsError {
    let msg = match e {
        BackendError::UnsupportedType { tensor, ty } => {
            format!(
                "tensor '{tensor}' is {ty:?}, which the {backend} backend cannot run yet; {hint}"
            )
        }
        other => format!("{other}; {hint}"),
    };
    js_err("unsupported-model", msg)
}

/// Decides where `model` runs for `want`, with the K/V cache of `load`.
/// `webgpu` fails when there is no adapter (`unsupported-backend`) or the
/// model cannot run on it (`unsupported-model`); `auto` then takes the CPU.
pub async fn choose(
    model: &GgufModel,
    mc: &ModelConfig,
    want: BackendChoice,
    load: &LoadOptions,
) -> Result<Decision, JsError> {
    let mut declined = None;
    if want != BackendChoice::Cpu {
        match webgpu(model, mc, load).await {
            Ok(d) => return Ok(d),
            Err(e) if want == BackendChoice::Webgpu => return Err(e),
            Err(e) => declined = Some(crate::source::js_error_text(&JsValue::from(e))),
        }
    }
    check_cpu(model)?;
    Ok(Decision {
        chosen: Chosen::Cpu,
        report: json!({"backend": "cpu", "adapter": null, "webgpu_declined": declined}),
    })
}

/// The WebGPU decision: open the device and check the model against it.
#[cfg(feature = "webgpu")]
async fn webgpu(
    model: &GgufModel,
    mc: &ModelConfig,
    load: &LoadOptions,
) -> Result<Decision, JsError> {
    let backend = crate::gpu::open().await?;
    let plan = crate::gpu::check(&backend, model, mc, load)?;
    let report = json!({
        "backend": "webgpu",
        "adapter": crate::gpu::adapter_name(&backend),
        "webgpu_declined": null,
        "gpu_plan_bytes": plan.total(),
    });
    Ok(Decision {
        chosen: Chosen::WebGpu(Box::new(backend)),
        report,
    })
}

/// Without the feature: WebGPU is not in this build.
#[cfg(not(feature = "webgpu"))]
async fn webgpu(_: &GgufModel, _: &ModelConfig, _: &LoadOptions) -> Result<Decision, JsError> {
    Err(js_err(
        "unsupported-backend",
        "this build of the engine has no WebGPU backend; use backend 'cpu' or 'auto'",
    ))
}
