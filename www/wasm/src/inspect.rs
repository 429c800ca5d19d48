//! `inspect`: what a GGUF file holds, whether this build can run it and
//! where, from its header alone (the package calls it before downloading
//! tensors).

use hearth::gguf::GgufModel;
use hearth::model::arch::spec_for;
use hearth::model::tokenizer::Tokenizer;
use hearth::model::ModelConfig;
use js_sys::Array;
use serde_json::json;
use wasm_bindgen::prelude::*;

use super::backend::choose;
#[cfg(feature = "webgpu")]
use super::backend::Chosen;
use super::options::EngineOptions;
use super::{js_err, sources_of};

/// Reads the headers of `readers` (one per split) and returns JSON:
/// `architecture`, `name`, `tensors`, `tensor_bytes`,
/// `trained_context_length`, `vocab_size`, `has_chat_template`, and where
/// the model would run with `options` (the JSON `load` takes): `backend`
/// (`cpu` or `webgpu`), `adapter`, `webgpu_declined`, `gpu_plan_bytes`,
/// `expert_cache` (where an MoE model's experts go with `max_gpu_memory`).
///
/// Rejects, with an `unsupported-model:` message, a file this build cannot
/// run: not GGUF, an unknown architecture, a tensor type without a kernel
/// on the chosen backend, a tokenizer it cannot build, a model larger than
/// the WebGPU adapter allows (backend `webgpu`); with
/// `unsupported-backend:`, backend `webgpu` without an adapter. A WebGPU
/// device opened here is kept for the `load` that follows.
#[wasm_bindgen]
pub async fn inspect(readers: Array, options: String) -> Result<String, JsError> {
    let opts = EngineOptions::parse(&options)?;
    let sources = sources_of(&readers)?;
    let model = GgufModel::read(&sources)
        .await
        .map_err(|e| js_err("unsupported-model", e))?;
    let md = model.metadata();
    let unsupported = |e: &dyn std::fmt::Display| js_err("unsupported-model", e);
    let mc = ModelConfig::from_metadata_supported(md).map_err(|e| unsupported(&e))?;
    spec_for(&mc, md).map_err(|e| unsupported(&e))?;
    Tokenizer::from_metadata(md).map_err(|e| unsupported(&e))?;
    let (_, load) = opts.configs(&mc)?;
    let decision = choose(&model, opts.backend, opts.threads(), &load).await?;
    #[cfg(feature = "webgpu")]
    if let Chosen::WebGpu(backend) = &decision.chosen {
        crate::gpu::park(backend);
    }
    let mut out = json!({
        "architecture": mc.arch,
        "name": mc.name,
        "tensors": model.tensors.len(),
        "tensor_bytes": model.tensor_bytes(),
        "trained_context_length": mc.n_ctx_train,
        "vocab_size": mc.n_vocab,
        "has_chat_template": md.get_str("tokenizer.chat_template").is_some(),
    });
    if let (Some(o), Some(r)) = (out.as_object_mut(), decision.report.as_object()) {
        o.extend(r.clone());
    }
    Ok(out.to_string())
}
