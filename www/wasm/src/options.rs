//! Engine options as the worker sends them (JSON), and the engine and load
//! configurations they give for one model. `inspect` and `load` derive the
//! same configuration, so the memory plan checked before the download is
//! the one the load allocates.

use hearth::engine::EngineConfig;
use hearth::graph::KvType;
use hearth::model::{LoadOptions, ModelConfig};
use serde::Deserialize;
use wasm_bindgen::JsError;

use crate::js_err;

/// Where the model should run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// wasm SIMD128 on the CPU (threaded in the threaded build).
    #[default]
    Cpu,
    /// The browser's WebGPU; an error when it is missing or the model does
    /// not fit the adapter.
    Webgpu,
    /// WebGPU when it can run the model, else the CPU.
    Auto,
}

/// Engine options, as the worker sends them.
#[derive(Debug, Deserialize)]
pub struct EngineOptions {
    /// CPU threads (the pool must already have them in the threaded build).
    #[serde(default)]
    pub threads: usize,
    /// Context length; 0: the trained one, at most 4096.
    #[serde(default)]
    pub n_ctx: usize,
    /// `f16` or `f32`.
    #[serde(default)]
    pub kv_type: Option<String>,
    /// Most requests decoded together.
    #[serde(default)]
    pub max_num_seqs: Option<usize>,
    /// A built-in chat template to use instead of the model's.
    #[serde(default)]
    pub chat_template: Option<String>,
    /// Where to run (default `cpu`).
    #[serde(default)]
    pub backend: BackendChoice,
}

impl EngineOptions {
    /// Parses the worker's JSON.
    pub fn parse(json: &str) -> Result<Self, JsError> {
        serde_json::from_str(json).map_err(|e| js_err("bad-request", e))
    }

    /// The engine's limits and the load options (K/V cache) for a model of
    /// `mc`.
    pub fn configs(&self, mc: &ModelConfig) -> Result<(EngineConfig, LoadOptions), JsError> {
        let n_ctx = match self.n_ctx {
            0 => mc.n_ctx_train.min(4096),
            n => n,
        }
        .max(2);
        let kv_type = match self.kv_type.as_deref() {
            None | Some("f16") => KvType::F16,
            Some("f32") => KvType::F32,
            Some(other) => {
                return Err(js_err(
                    "bad-request",
                    format!("kvType {other:?}: use 'f16' or 'f32'"),
                ))
            }
        };
        let config = EngineConfig {
            n_ctx,
            max_num_seqs: self.max_num_seqs.unwrap_or(4).max(1),
            kv_type,
            ..EngineConfig::default()
        };
        let load = LoadOptions {
            max_step_tokens: config.max_num_batched_tokens,
            ..LoadOptions::new(config.kv_cache_config())
        };
        Ok((config, load))
    }

    /// CPU threads to run on (at least one).
    pub fn threads(&self) -> usize {
        self.threads.max(1)
    }
}
