//! The WebGPU path (feature `webgpu`): opening the browser's adapter, and
//! the checks made from a model's header before any tensor is downloaded:
//! every weight type has kernels, and the weights, K/V cache and
//! activations fit the adapter's limits (the core's [`MemoryNeed`]).
//!
//! `inspect` opens the device for its checks and parks it here; the `load`
//! that follows in the same worker takes it instead of opening another.

use std::cell::RefCell;

use hearth::backend::webgpu::{GpuContext, GpuOptions, WebGpuBackend};
use hearth::backend::BackendError;
use hearth::gguf::GgufModel;
use hearth::model::{check_model, Checked, LoadOptions};
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

/// Checks `model` can run on `backend` with the K/V cache and expert
/// offload of `load`: kernels for every op and weight type, and a memory
/// need within the adapter's buffer and binding limits (the browser does
/// not say how much memory the device has). Returns the memory need and
/// where the experts go. Errors have code `unsupported-model` and say to
/// use the CPU.
pub fn check(
    backend: &WebGpuBackend,
    model: &GgufModel,
    load: &LoadOptions,
) -> Result<Checked, JsError> {
    match check_model(model, backend, load) {
        Ok(checked) => Ok(checked),
        Err(e @ hearth::Error::Backend(BackendError::Device(_))) => Err(js_err(
            "unsupported-model",
            format!("the model does not fit WebGPU here: {e}; use backend 'cpu' or a smaller model or context"),
        )),
        Err(e) => Err(unsupported(&e, "use backend 'cpu' or another quantization")),
    }
}
