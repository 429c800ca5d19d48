//! The CUDA backend of Hearth, being built: the device opened through a
//! driver loaded at run time, and kernels compiled from `shaders/cuda/*.cu`
//! with NVRTC to a cubin for the device, cached on disk.
//!
//! The crate builds and its binaries run on machines without CUDA: every
//! entry point checks that the libraries load and returns a
//! [`CudaError`] that says what is missing.
//!
//! Implemented so far: [`CudaDevice`], [`compile()`], and the row kernels of
//! `shaders/cuda/rowops.cu`. The [`hearth::backend::Backend`]
//! implementation is not here yet.

#![deny(missing_docs)]

pub mod backend;
pub mod compile;
pub mod device;
pub mod graphs;
pub mod sources;

pub use backend::{CudaBackend, CudaBuffer};
pub use compile::{compile, Arch};
pub use device::CudaDevice;

use thiserror::Error;

/// Errors of the CUDA backend.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum CudaError {
    /// A library the backend loads at run time is not on this machine.
    #[error("{0} is not installed here; install the NVIDIA driver and CUDA 13, or run on another backend (--backend cpu or webgpu)")]
    Missing(&'static str),
    /// The driver has fewer devices than asked for.
    #[error("CUDA device {ordinal} asked for, {count} present")]
    NoDevice {
        /// The device asked for.
        ordinal: usize,
        /// Devices present.
        count: i32,
    },
    /// The driver refused a call.
    #[error("CUDA driver: {0}")]
    Driver(String),
    /// NVRTC failed to compile a kernel (the message holds its log).
    #[error("NVRTC: {0}")]
    Nvrtc(String),
}
