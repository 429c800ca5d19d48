//! The WebGPU backend: WGSL kernels through wgpu, the same code natively
//! (Vulkan, Metal, DX12) and in browsers.
//!
//! - [`caps`]: what the adapter can do ([`GpuCaps`]), read once;
//! - [`context`]: the device and queue ([`GpuContext::new`]);
//! - [`shader`]: shader composition from `shaders/*.wgsl` and the pipeline cache;
//! - [`buffer`]: device buffers and asynchronous readback;
//! - [`backend`]: the [`Backend`](crate::backend::Backend) implementation;
//!   `recorder` (one submission per step, cached bind groups) and `pool`
//!   (activation buffers reused between steps) serve it, and [`counters`]
//!   counts its host-side work; `profile` times each step and, with
//!   timestamp queries, each kernel kind (`HEARTH_PROFILE=gpu`);
//! - `ops`: every non-weight op; `fuse`: the plan's fused ops in as few
//!   dispatches as the kernels allow; `dense`: F32 / F16 weights;
//! - [`quant`]: packed quantized weights, their repack and their kernels.

pub mod backend;
pub mod buffer;
pub mod caps;
pub mod context;
pub mod counters;
mod dense;
mod fuse;
pub mod memory;
mod moe;
mod ops;
mod pool;
mod profile;
pub mod quant;
mod recorder;
pub mod shader;
mod weights;

pub use backend::{WebGpuBackend, DECODE_TOKENS, DEFAULT_SUBMIT_EVERY};
pub use buffer::GpuBuffer;
pub use caps::{GpuCaps, ShaderTarget};
pub use context::{GpuContext, GpuOptions, GpuProfile};
pub use counters::GpuCounters;
pub use shader::{ConstValue, PipelineCache, PipelineKey};

use thiserror::Error;

/// Errors of the WebGPU backend.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum GpuError {
    /// No usable adapter.
    #[error("no WebGPU adapter: {reason}")]
    NoAdapter {
        /// Why, and what to do.
        reason: String,
    },
    /// wgpu reported an error (validation, out of memory, a lost device).
    #[error("the GPU reported an error during {during}: {detail}")]
    Device {
        /// What was being done.
        during: String,
        /// wgpu's message.
        detail: String,
    },
    /// A buffer larger than the adapter allows.
    #[error("a buffer of {bytes} bytes is larger than {adapter} allows ({max}); use a smaller model or context")]
    TooLarge {
        /// Bytes asked for.
        bytes: u64,
        /// The adapter's limit.
        max: u64,
        /// The adapter.
        adapter: String,
    },
    /// The model, its K/V cache and activations do not fit the device.
    #[error("{0}")]
    DoesNotFit(String),
}

impl From<GpuError> for crate::backend::BackendError {
    fn from(e: GpuError) -> Self {
        crate::backend::BackendError::Device(Box::new(e))
    }
}

/// A kernel file and the constants of one of its variants: (kernel name,
/// source, constants).
pub type KernelSource = (&'static str, &'static str, Vec<(&'static str, ConstValue)>);

/// Every kernel file with the constants of one of its variants:
/// (kernel name, source, constants), for validation without a device.
pub fn kernel_sources() -> Vec<KernelSource> {
    let mut v = ops::kernel_sources();
    v.extend(dense::kernel_sources());
    v.extend(fuse::kernel_sources());
    v
}

#[cfg(test)]
mod validate;
