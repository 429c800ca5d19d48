//! The WebGPU path (feature `webgpu`): opening the browser's adapter, and
//! the checks made from a model's header before any tensor is downloaded:
//! every weight type has kernels, and the weights, K/V cache and
//! activations fit the adapter's limits (the core's [`MemoryPlan`]).
//!
//! `inspect` opens the device for its checks and parks it here; the `load`
//! that follows in the same worker takes it instead of opening another.

use std::cell::RefCell;

use hearth::backend::webgpu::memory::MemoryPlan;
use hearth::backend::webgpu::model::PLAN_MAX_TOKENS;
use hearth::backend::webgpu::{GpuContext, GpuOptions, WebGpuBackend};
use hearth::backend::Backend;
use hearth::gguf::GgufModel;
use hearth::model::{check_types, LoadOptions, ModelConfig};
use wasm_bindgen::{JsError, JsValue};

use crate::backend::unsupported;
use crate::js_err;

thread_local! {
    /// The device `inspect` opened, for the next `load`.
    static PARKED: RefCell<Option<GpuContext>> = const { RefCell::new(None) };
}

/// Whether the global scope has `navigator.gpu`. wgpu's browser backend
/// panics (an abort in wasm) where the scope has no navigator, so this is
/// asked first.
fn has_navigator_gpu() -> bool {
    let get = |obj: &JsValue, key: &str| {
        js_sys::Reflect::get(obj, &JsValue::from_str(key))
            .ok()
            .filter(|v| !v.is_undefined() && !v.is_null())
    };
    get(&js_sys::global(), "navigator").is_some_and(|nav| get(&nav, "gpu").is_some())
}

/// The browser's WebGPU device (the one `inspect` parked, else a new one).
/// Fails with code `unsupported-backend` when there is none.
pub async fn open() -> Result<WebGpuBackend, JsError> {
    if let Some(ctx) = PARKED.with(|p| p.borrow_mut().take()) {
        return Ok(WebGpuBackend::new(ctx));
    }
    if !has_navigator_gpu() {
        return Err(js_err(
            "unsupported-backend",
            "this browser has no WebGPU (navigator.gpu is missing in the worker); use backend 'cpu' or 'auto', or a browser with WebGPU enabled",
        ));
    }
    let ctx = GpuContext::new(&GpuOptions::default()).await.map_err(|e| {
        js_err(
            "unsupported-backend",
            format!("{e}; use backend 'cpu' or 'auto'"),
        )
    })?;
    Ok(WebGpuBackend::new(ctx))
}

/// Keeps `backend`'s device for the next [`open`].
pub fn park(backend: &WebGpuBackend) {
    let ctx = backend.context().clone();
    PARKED.with(|p| *p.borrow_mut() = Some(ctx));
}

/// The adapter's name as the browser reports it (may be empty).
pub fn adapter_name(backend: &WebGpuBackend) -> String {
    backend.context().caps.adapter_name.clone()
}

/// Checks `model` can run on `backend` with the K/V cache of `load`:
/// kernels for every weight type, and a [`MemoryPlan`] within the
/// adapter's buffer and binding limits. Errors have code
/// `unsupported-model` and say to use the CPU.
pub fn check(
    backend: &WebGpuBackend,
    model: &GgufModel,
    mc: &ModelConfig,
    load: &LoadOptions,
) -> Result<MemoryPlan, JsError> {
    let caps = &backend.context().caps;
    check_types(model, backend)
        .map_err(|e| unsupported(e, "WebGPU", "use backend 'cpu' or another quantization"))?;
    let plan = MemoryPlan::estimate(model, mc, &load.kv, PLAN_MAX_TOKENS, |t| {
        let cols = t.shape.first().copied().unwrap_or(0) as usize;
        let rows = (t.n_elements() as usize) / cols.max(1);
        backend.weight_bytes(t.ty, cols, rows).max(t.size)
    });
    // The browser does not say how much memory the device has: the plan
    // is checked against the per-buffer limits only.
    plan.check(caps, None).map_err(|e| {
        js_err(
            "unsupported-model",
            format!("the model does not fit WebGPU here: {e}; use backend 'cpu' or a smaller model or context"),
        )
    })?;
    Ok(plan)
}
