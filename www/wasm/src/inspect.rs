//! `inspect`: what a GGUF file holds and whether this build can run it,
//! from its header alone (the package calls it before downloading tensors).

use hearth::backend::cpu::CpuBackend;
use hearth::backend::Backend;
use hearth::gguf::GgufModel;
use hearth::graph::Op;
use hearth::model::arch::spec_for;
use hearth::model::tokenizer::Tokenizer;
use hearth::model::ModelConfig;
use js_sys::Array;
use serde_json::json;
use wasm_bindgen::prelude::*;

use super::{js_err, sources_of};

/// Reads the headers of `readers` (one per split) and returns JSON:
/// `architecture`, `name`, `tensors`, `tensor_bytes`,
/// `trained_context_length`, `vocab_size`, `has_chat_template`. Rejects,
/// with an `unsupported-model:` message, a file this build cannot run:
/// not GGUF, an unknown architecture, a tensor type without a CPU kernel,
/// a tokenizer it cannot build.
#[wasm_bindgen]
pub async fn inspect(readers: Array) -> Result<String, JsError> {
    let sources = sources_of(&readers)?;
    let model = GgufModel::read(&sources)
        .await
        .map_err(|e| js_err("unsupported-model", e))?;
    let md = model.metadata();
    let unsupported = |e: &dyn std::fmt::Display| js_err("unsupported-model", e);
    let mc = ModelConfig::from_metadata_supported(md).map_err(|e| unsupported(&e))?;
    spec_for(&mc, md).map_err(|e| unsupported(&e))?;
    Tokenizer::from_metadata(md).map_err(|e| unsupported(&e))?;
    let backend = CpuBackend::new(1);
    for t in &model.tensors {
        let op = Op::MatMul {
            ty: t.ty,
            k: t.shape.first().copied().unwrap_or(0) as usize,
            n: 1,
            exact: false,
        };
        if t.shape.len() >= 2 && !backend.supports(&op) {
            return Err(unsupported(&format!(
                "tensor '{}' is {:?}, which the CPU backend cannot run yet; pick another quantization",
                t.name, t.ty
            )));
        }
    }
    Ok(json!({
        "architecture": mc.arch,
        "name": mc.name,
        "tensors": model.tensors.len(),
        "tensor_bytes": model.tensor_bytes(),
        "trained_context_length": mc.n_ctx_train,
        "vocab_size": mc.n_vocab,
        "has_chat_template": md.get_str("tokenizer.chat_template").is_some(),
    })
    .to_string())
}
