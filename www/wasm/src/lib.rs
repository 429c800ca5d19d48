//! The browser facade of the Hearth engine, compiled with wasm-bindgen.
//!
//! The npm package's Web Worker is the only caller. It passes GGUF files as
//! reader objects ([`source::JsReader`]), requests and options as JSON text,
//! and gets events back as JSON text. Nothing here blocks: the CPU forward
//! pass is synchronous compute inside `step`, and in the threaded build the
//! data-parallel loops run on wasm-bindgen-rayon's Web Workers (the page must
//! be cross-origin isolated; the package calls `initThreadPool` first). With
//! the `webgpu` feature a model can run on the browser's WebGPU instead
//! (`backend` in the options; a step then awaits the GPU's readback).

#![deny(missing_docs)]

mod backend;
#[cfg(feature = "webgpu")]
mod gpu;
mod inspect;
mod options;
mod request;
mod source;

use std::cell::RefCell;
use std::rc::Rc;

use hearth::engine::{Clock, Engine, RequestId};
use hearth::gguf::GgufModel;
use hearth::model::chat::ChatTemplate;
use hearth::model::tokenizer::Tokenizer;
use hearth::model::{load_model, AnyModel, LoadProgress, ModelConfig};
use js_sys::{Array, Function, Promise};
use serde_json::{json, Value};
use wasm_bindgen::prelude::*;

use backend::{choose, on_cpu, Chosen};
use options::EngineOptions;

pub use inspect::inspect;
pub use source::{JsReader, JsSource};

#[cfg(target_feature = "atomics")]
pub use wasm_bindgen_rayon::init_thread_pool;

#[wasm_bindgen]
extern "C" {
    /// `performance.now()` (milliseconds), in windows and workers alike.
    #[wasm_bindgen(js_namespace = performance, js_name = now)]
    fn performance_now() -> f64;

    /// `Date.now()` (milliseconds since the epoch).
    #[wasm_bindgen(js_namespace = Date, js_name = now)]
    fn date_now() -> f64;
}

/// Starts recording a Perfetto trace (see `hearth::trace`) on
/// `performance.now()`: loads, engine steps, requests, ops and, on WebGPU,
/// kernels. A recording in progress is dropped.
#[wasm_bindgen(js_name = traceStart)]
pub fn trace_start() {
    hearth::trace::start(Clock::from_fn(|| performance_now() / 1000.0));
}

/// Stops the recording and returns the trace in Perfetto's format
/// (`undefined`: nothing was recording).
#[wasm_bindgen(js_name = traceStop)]
pub fn trace_stop() -> Option<Vec<u8>> {
    hearth::trace::stop().map(|t| t.to_perfetto())
}

/// `threaded` for the build with atomics and a thread pool, else `single`.
#[wasm_bindgen(js_name = buildKind)]
pub fn build_kind() -> String {
    if cfg!(target_feature = "atomics") {
        "threaded".into()
    } else {
        "single".into()
    }
}

/// An error for JavaScript, its message prefixed with a code the package
/// maps to `HearthError.code` (`unsupported-model: ...`).
pub(crate) fn js_err(code: &str, err: impl std::fmt::Display) -> JsError {
    JsError::new(&format!("{code}: {err}"))
}

/// Reader objects (a JS array) as byte sources, one per split.
fn sources_of(readers: &Array) -> Result<Vec<JsSource>, JsError> {
    readers
        .iter()
        .map(|r| JsSource::new(r.unchecked_into()).map_err(|e| js_err("bad-request", e)))
        .collect()
}

/// Loads a model read through `readers` (one per split, in order) into an
/// engine. `options` is JSON (`threads`, `n_ctx`, `kv_type`,
/// `max_num_seqs`, `chat_template`, `backend`: `cpu`, `webgpu` or `auto`,
/// see [`inspect`]; `max_gpu_memory` and `moe_policy`, the expert cache of
/// an MoE model, and `gpu_layers`, the layer split, see `options.rs`);
/// `on_progress(bytesDone, bytesTotal, tensorsDone, tensorsTotal)` is
/// called after every chunk. The engine's `info` says, besides the
/// decision's report, `host_blocks` and `gpu_blocks`: the transformer
/// blocks the CPU runs (all of them on the CPU backend, the first ones of
/// a layer split on WebGPU) and those the device runs.
///
/// On WebGPU the tensors go from the readers to device buffers a chunk at a
/// time: the wasm heap holds a chunk and a row, never the model (except the
/// routed experts an expert cache keeps there, and the CPU's blocks of a
/// layer split).
#[wasm_bindgen]
pub async fn load(
    readers: Array,
    options: String,
    on_progress: Function,
) -> Result<WasmEngine, JsError> {
    let opts = EngineOptions::parse(&options)?;
    let sources = sources_of(&readers)?;
    let model = GgufModel::read(&sources)
        .await
        .map_err(|e| js_err("unsupported-model", e))?;
    let md = model.metadata();
    let mc =
        ModelConfig::from_metadata_supported(md).map_err(|e| js_err("unsupported-model", e))?;
    let tokenizer = Tokenizer::from_metadata(md).map_err(|e| js_err("unsupported-model", e))?;
    let now = (date_now() / 1000.0) as i64;
    let template = ChatTemplate::from_metadata(md, opts.chat_template.as_deref())
        .ok()
        .map(|t| t.with_now(now));
    let (config, load_opts) = opts.configs(&mc)?;
    let decision = choose(&model, opts.backend, opts.threads(), &load_opts).await?;
    let mut report = progress_fn(on_progress);
    // Blocks on the CPU and on the device: a CPU model runs them all, a
    // WebGPU one the last ones, after the CPU's of a layer split.
    let (host_blocks, gpu_blocks, loaded) = match decision.chosen {
        Chosen::Cpu(backend) => {
            load_model(*backend, &model, &sources, &on_cpu(&load_opts), &mut report)
                .await
                .map(|m| (m.blocks().len(), 0, AnyModel::new(m)))
        }
        #[cfg(feature = "webgpu")]
        Chosen::WebGpu(backend) => load_model(*backend, &model, &sources, &load_opts, &mut report)
            .await
            .map(|m| (m.host_blocks().len(), m.blocks().len(), AnyModel::new(m))),
    }
    .map_err(|e| js_err("unsupported-model", e))?;
    let mut info = json!({
        "architecture": mc.arch,
        "name": mc.name,
        "tensors": model.tensors.len(),
        "trained_context_length": mc.n_ctx_train,
        "context_length": config.n_ctx,
        "vocab_size": mc.n_vocab,
        "has_chat_template": template.is_some(),
        "threads": opts.threads(),
        "build": build_kind(),
        "wasm_memory_bytes": wasm_memory_bytes(),
        "host_blocks": host_blocks,
        "gpu_blocks": gpu_blocks,
    });
    if let (Some(o), Some(r)) = (info.as_object_mut(), decision.report.as_object()) {
        o.extend(r.clone());
    }
    let mut engine =
        Engine::new(loaded, tokenizer, template, config).map_err(|e| js_err("internal", e))?;
    engine.set_clock(Clock::from_fn(|| performance_now() / 1000.0));
    Ok(WasmEngine {
        inner: Rc::new(RefCell::new(engine)),
        info,
    })
}

/// `on_progress(bytesDone, bytesTotal, tensorsDone, tensorsTotal)` as the
/// loader's progress callback.
fn progress_fn(on_progress: Function) -> impl FnMut(&LoadProgress) {
    move |p: &LoadProgress| {
        let args = Array::of4(
            &JsValue::from(p.bytes_done as f64),
            &JsValue::from(p.bytes_total as f64),
            &JsValue::from(p.tensors_done as f64),
            &JsValue::from(p.tensors_total as f64),
        );
        // A throwing progress callback must not abort the load.
        let _ = on_progress.apply(&JsValue::NULL, &args);
    }
}

/// Bytes of this module's linear memory now (it never shrinks: the peak).
fn wasm_memory_bytes() -> f64 {
    let memory = wasm_bindgen::memory();
    js_sys::Reflect::get(&memory, &JsValue::from_str("buffer"))
        .and_then(|b| js_sys::Reflect::get(&b, &JsValue::from_str("byteLength")))
        .ok()
        .and_then(|n| n.as_f64())
        .unwrap_or(0.0)
}

/// A loaded model and its scheduler. Calls must not overlap: the worker
/// awaits each `step` before the next call.
#[wasm_bindgen]
pub struct WasmEngine {
    inner: Rc<RefCell<Engine<AnyModel>>>,
    info: Value,
}

impl WasmEngine {
    /// The engine, or an error when a step is in flight.
    fn engine(&self) -> Result<std::cell::RefMut<'_, Engine<AnyModel>>, JsError> {
        self.inner
            .try_borrow_mut()
            .map_err(|_| js_err("internal", "the engine is busy with a step; await it first"))
    }
}

#[wasm_bindgen]
impl WasmEngine {
    /// What was loaded, as JSON.
    pub fn info(&self) -> String {
        self.info.to_string()
    }

    /// Queues a request (JSON, see `request.rs`); returns its id.
    #[wasm_bindgen(js_name = addRequest)]
    pub fn add_request(&self, request: &str) -> Result<f64, JsError> {
        let req: request::RequestJson =
            serde_json::from_str(request).map_err(|e| js_err("bad-request", e))?;
        let id = self
            .engine()?
            .add_request(req.into_request())
            .map_err(|e| js_err("bad-request", e))?;
        Ok(id.0 as f64)
    }

    /// Ends request `id` now and frees its K/V blocks; returns its
    /// `finished` event as JSON (reason `abort`).
    pub fn cancel(&self, id: f64) -> Result<String, JsError> {
        let mut engine = self.engine()?;
        let event = engine
            .cancel(RequestId(id as u64))
            .map_err(|e| js_err("bad-request", e))?;
        Ok(request::event_json(&event, engine.tokenizer()).to_string())
    }

    /// Whether any request is waiting or running.
    #[wasm_bindgen(js_name = hasUnfinished)]
    pub fn has_unfinished(&self) -> Result<bool, JsError> {
        Ok(self.engine()?.has_unfinished())
    }

    /// Runs one scheduler step; resolves to the events as a JSON array.
    // The borrow is held across the await on purpose: it is the guard that
    // makes a call overlapping a step fail with "busy" (every method takes
    // it with `try_borrow_mut`, so nothing can panic on it).
    #[allow(clippy::await_holding_refcell_ref)]
    pub fn step(&self) -> Promise {
        let inner = Rc::clone(&self.inner);
        wasm_bindgen_futures::future_to_promise(async move {
            let mut engine = inner
                .try_borrow_mut()
                .map_err(|_| JsValue::from(js_err("internal", "a step is already running")))?;
            let events = engine
                .step()
                .await
                .map_err(|e| JsValue::from(js_err("internal", e)))?;
            let tok = engine.tokenizer();
            let out: Vec<Value> = events.iter().map(|e| request::event_json(e, tok)).collect();
            Ok(JsValue::from(Value::Array(out).to_string()))
        })
    }

    /// Token ids of `text` (`add_special`: BOS where the model adds one;
    /// special-token text parsed when `parse_special`).
    pub fn tokenize(
        &self,
        text: &str,
        add_special: bool,
        parse_special: bool,
    ) -> Result<Vec<u32>, JsError> {
        let engine = self.engine()?;
        engine
            .tokenizer()
            .encode(text, add_special, parse_special)
            .map_err(|e| js_err("bad-request", e))
    }

    /// The text of `ids` (special tokens rendered).
    pub fn detokenize(&self, ids: Vec<u32>) -> Result<String, JsError> {
        Ok(self.engine()?.tokenizer().decode(&ids, false, false))
    }

    /// Counters since the load as JSON: `steps`, `prefill_tokens_per_s`,
    /// `decode_tokens_per_s`, and `expert_cache` (what an MoE model's
    /// expert cache did: its counters, rates and one-line `summary`; null
    /// without one).
    pub fn stats(&self) -> Result<String, JsError> {
        let engine = self.engine()?;
        let s = engine.stats();
        Ok(json!({
            "steps": s.steps,
            "prefill_tokens_per_s": s.prefill_tps(),
            "decode_tokens_per_s": s.decode_tps(),
            "expert_cache": backend::expert_stats_json(engine.model()),
        })
        .to_string())
    }
}
