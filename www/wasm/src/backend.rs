//! The backends of this build: [`choose`] decides from a model's header
//! where it runs, with every check that can fail before the tensors are
//! downloaded; the model loaded there is the core's
//! [`AnyModel`](hearth::model::AnyModel).

use hearth::backend::cpu::{CpuBackend, CpuOptions};
use hearth::backend::BackendError;
use hearth::gguf::GgufModel;
use hearth::model::{check_model, AnyModel, LoadOptions};
use serde_json::{json, Value};
use wasm_bindgen::{JsError, JsValue};

use crate::js_err;
use crate::options::BackendChoice;

#[cfg(feature = "webgpu")]
use hearth::backend::webgpu::WebGpuBackend;

/// Where a model will run: the CPU, or a WebGPU device already open
/// (boxed: the backends hold their kernel tables and caches inline).
pub enum Chosen {
    /// The CPU (wasm SIMD128), on the threads of the load options.
    Cpu(Box<CpuBackend>),
    /// A WebGPU device the model was checked against (boxed: the backend
    /// holds its pipeline and buffer caches inline).
    #[cfg(feature = "webgpu")]
    WebGpu(Box<WebGpuBackend>),
}

/// The decision and what the page reports of it: `backend` (`cpu` or
/// `webgpu`), `adapter` (the WebGPU adapter's name), `webgpu_declined`
/// (why `auto` did not take WebGPU), `gpu_plan_bytes` (device memory the
/// model needs), `expert_cache` (where an offloaded MoE model's experts
/// go, see [`expert_cache_report`]; null when they are all on the device).
pub struct Decision {
    /// Where the model runs.
    pub chosen: Chosen,
    /// The report, as JSON fields.
    pub report: Value,
}

/// `load` for the CPU backend: without the layer split (`gpu_layers`),
/// which only means something with a device beside the CPU; on the CPU it
/// would split the model into two CPU models for nothing.
pub fn on_cpu(load: &LoadOptions) -> LoadOptions {
    LoadOptions {
        gpu_layers: None,
        ..*load
    }
}

/// The CPU backend on `threads` threads, checked to run `model` with the
/// K/V cache of `load` ([`on_cpu`]). Errors have code `unsupported-model`.
pub fn check_cpu(
    model: &GgufModel,
    threads: usize,
    load: &LoadOptions,
) -> Result<CpuBackend, JsError> {
    let backend = CpuBackend::with_options(&CpuOptions::with_threads(threads));
    check_model(model, &backend, &on_cpu(load))
        .map_err(|e| unsupported(&e, "pick another quantization"))?;
    Ok(backend)
}

/// The `unsupported-model` error of a model a backend cannot run, ending
/// with what to do in the browser (`hint`).
pub fn unsupported(e: &hearth::Error, hint: &str) -> JsError {
    let msg = match e {
        hearth::Error::Backend(BackendError::UnsupportedType {
            tensor,
            ty,
            backend,
        }) => format!(
            "tensor '{tensor}' is {ty:?}, which the {backend} backend cannot run yet; {hint}"
        ),
        hearth::Error::Backend(BackendError::UnsupportedOp { backend, op }) => {
            format!("the {backend} backend cannot run {op} yet; {hint}")
        }
        other => format!("{other}; {hint}"),
    };
    js_err("unsupported-model", msg)
}

/// Decides where `model` runs for `want`, with the K/V cache of `load`
/// (the CPU on `threads` threads). `webgpu` fails when there is no adapter
/// (`unsupported-backend`) or the model cannot run on it
/// (`unsupported-model`); `auto` then takes the CPU.
pub async fn choose(
    model: &GgufModel,
    want: BackendChoice,
    threads: usize,
    load: &LoadOptions,
) -> Result<Decision, JsError> {
    let mut declined = None;
    if want != BackendChoice::Cpu {
        match webgpu(model, load).await {
            Ok(d) => return Ok(d),
            Err(e) if want == BackendChoice::Webgpu => return Err(e),
            Err(e) => declined = Some(crate::source::js_error_text(&JsValue::from(e))),
        }
    }
    let cpu = check_cpu(model, threads, load)?;
    Ok(Decision {
        chosen: Chosen::Cpu(Box::new(cpu)),
        report: json!({
            "backend": "cpu",
            "adapter": null,
            "webgpu_declined": declined,
            "expert_cache": null,
        }),
    })
}

/// What the expert cache of `model` did so far, as JSON: the counters of
/// [`hearth::moe::ExpertStats`], its rates (`hit_rate`,
/// `bytes_copied_per_token`, `host_experts_per_token`) and its one-line
/// `summary`; null for a model without the cache.
pub fn expert_stats_json(model: &AnyModel) -> Value {
    match model.expert_stats() {
        Some(s) => json!({
            "steps": s.steps,
            "tokens": s.tokens,
            "hits": s.hits,
            "misses": s.misses,
            "copies": s.copies,
            "bytes_copied": s.bytes_copied,
            "host_experts": s.host_experts,
            "host_seconds": s.host_seconds,
            "hit_rate": s.hit_rate(),
            "bytes_copied_per_token": s.bytes_per_token(),
            "host_experts_per_token": s.host_experts_per_token(),
            "summary": s.to_string(),
        }),
        None => Value::Null,
    }
}

/// What the page reports of an expert offload: `policy`, `slots` (experts
/// the device's slots hold, all pools together), `slot_bytes` (their
/// device memory), `offloaded_bytes` (the offloaded experts' bytes, which
/// the wasm heap holds instead of the device), `host_only_layers` (MoE
/// layers without slots, whose experts the CPU computes). Null without an
/// offload plan (a dense model, no `max_gpu_memory`, or every expert fits).
#[cfg(feature = "webgpu")]
pub fn expert_cache_report(
    plan: Option<&hearth::model::offload::OffloadPlan>,
    load: &LoadOptions,
) -> Value {
    match (plan, load.experts) {
        (Some(p), Some(o)) => json!({
            "policy": o.policy.name(),
            "slots": p.pools.iter().map(|pool| pool.slots).sum::<usize>(),
            "slot_bytes": p.pool_bytes,
            "offloaded_bytes": p.offloaded_bytes,
            "host_only_layers": p
                .layers
                .iter()
                .filter(|l| l.placement == hearth::moe::ExpertPlacement::Host)
                .count(),
        }),
        _ => Value::Null,
    }
}

/// The WebGPU decision: open the device and check the model against it.
#[cfg(feature = "webgpu")]
async fn webgpu(model: &GgufModel, load: &LoadOptions) -> Result<Decision, JsError> {
    let backend = crate::gpu::open().await?;
    let checked = crate::gpu::check(&backend, model, load)?;
    let report = json!({
        "backend": "webgpu",
        "adapter": crate::gpu::adapter_name(&backend),
        "webgpu_declined": null,
        "gpu_plan_bytes": checked.memory.total(),
        "expert_cache": expert_cache_report(checked.offload.as_ref(), load),
    });
    Ok(Decision {
        chosen: Chosen::WebGpu(Box::new(backend)),
        report,
    })
}

/// Without the feature: WebGPU is not in this build.
#[cfg(not(feature = "webgpu"))]
async fn webgpu(_: &GgufModel, _: &LoadOptions) -> Result<Decision, JsError> {
    Err(js_err(
        "unsupported-backend",
        "this build of the engine has no WebGPU backend; use backend 'cpu' or 'auto'",
    ))
}
