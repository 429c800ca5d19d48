//! Engine options as the worker sends them (JSON), and the engine and load
//! configurations they give for one model. `inspect` and `load` derive the
//! same configuration, so the memory plan checked before the download is
//! the one the load allocates.

use hearth::engine::EngineConfig;
use hearth::graph::KvType;
use hearth::model::offload::ExpertOffload;
use hearth::model::{LoadOptions, ModelConfig};
use hearth::moe::Policy;
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
    /// Device bytes for the routed experts' slots of an MoE model (the
    /// package's `maxGpuMemory`): when set, the experts stay in the wasm
    /// heap and the WebGPU device holds this many bytes of slots, which the
    /// expert cache fills with the experts in use, by the core's defaults
    /// otherwise ([`ExpertOffload::with_slot_bytes`]: a miss routed to one
    /// token is computed on the CPU). A layer group whose experts all fit
    /// keeps them on the device; below one expert's bytes its layers
    /// compute their experts on the CPU. A number, as
    /// JavaScript has no integers: finite, at least 0, fractions dropped.
    /// No effect on a dense model or on the CPU backend.
    #[serde(default)]
    pub max_gpu_memory: Option<f64>,
    /// Which expert a full pool of slots gives up: `lru`, `lfu` or `lrfu`
    /// (the default, [`Policy::default`]).
    #[serde(default)]
    pub moe_policy: Option<String>,
    /// Blocks on the WebGPU device when the model is split with the CPU
    /// (the package's `gpuLayers`, [`LoadOptions::gpu_layers`]): the last
    /// this many transformer blocks and the output head run on the device,
    /// the blocks before on the wasm CPU path, the residual stream crossing
    /// once per step; more than the model has: all of them. Unset: every
    /// block on the device. A number, as JavaScript has no integers: a
    /// finite integer of at least 0. No effect on the CPU backend
    /// ([`crate::backend::on_cpu`]).
    #[serde(default)]
    pub gpu_layers: Option<f64>,
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
            experts: self.expert_offload()?,
            gpu_layers: self.gpu_layers()?,
            // The CPU's blocks of a split and experts of the cache run on
            // the page's threads (the core's 0, "all cores", is one here).
            host_threads: self.threads(),
            ..LoadOptions::new(config.kv_cache_config())
        };
        Ok((config, load))
    }

    /// The expert offload of `max_gpu_memory` and `moe_policy` (`None`
    /// without a `max_gpu_memory`). Both are checked either way, so a bad
    /// policy fails also where it would have no effect.
    fn expert_offload(&self) -> Result<Option<ExpertOffload>, JsError> {
        let policy = match self.moe_policy.as_deref() {
            None => Policy::default(),
            Some(name) => name
                .parse::<Policy>()
                .map_err(|e| js_err("bad-request", format!("moePolicy: {e}")))?,
        };
        let Some(bytes) = self.max_gpu_memory else {
            return Ok(None);
        };
        if !bytes.is_finite() || bytes < 0.0 {
            return Err(js_err(
                "bad-request",
                format!("maxGpuMemory {bytes}: give the bytes of device memory for the expert slots, a finite number of at least 0"),
            ));
        }
        Ok(Some(ExpertOffload {
            policy,
            // Saturates past u64::MAX (no limit); drops a fraction.
            ..ExpertOffload::with_slot_bytes(bytes as u64)
        }))
    }

    /// `gpu_layers` as a count of blocks, checked: a finite integer of at
    /// least 0 (it saturates past `usize::MAX`, which means every block).
    fn gpu_layers(&self) -> Result<Option<usize>, JsError> {
        let Some(n) = self.gpu_layers else {
            return Ok(None);
        };
        if !n.is_finite() || n < 0.0 || n.fract() != 0.0 {
            return Err(js_err(
                "bad-request",
                format!("gpuLayers {n}: give the number of transformer blocks to run on the GPU (the last ones, with the output head), an integer of at least 0, or leave it unset for all of them"),
            ));
        }
        Ok(Some(n as usize))
    }

    /// CPU threads to run on (at least one).
    pub fn threads(&self) -> usize {
        self.threads.max(1)
    }
}
