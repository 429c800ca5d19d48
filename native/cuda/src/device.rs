//! The CUDA device: the driver loaded at run time, a context and a stream.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaStream};

use crate::compile::Arch;
use crate::CudaError;

/// One CUDA device, opened.
pub struct CudaDevice {
    /// The device's context.
    pub ctx: Arc<CudaContext>,
    /// The stream every op of the backend is queued on.
    pub stream: Arc<CudaStream>,
    /// Its architecture.
    pub arch: Arch,
    /// Its name (`NVIDIA H100 80GB HBM3`).
    pub name: String,
}

impl std::fmt::Debug for CudaDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaDevice")
            .field("name", &self.name)
            .field("arch", &self.arch.sm())
            .finish()
    }
}

/// Whether the CUDA driver library can be loaded here.
pub fn driver_present() -> bool {
    // SAFETY: only tries to open the library.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

/// CUDA devices present (0 where the driver is missing or fails).
pub fn device_count() -> usize {
    if !driver_present() {
        return 0;
    }
    CudaContext::device_count().map_or(0, |n| n.max(0) as usize)
}

impl CudaDevice {
    /// Opens device `ordinal`: an error, not a panic, where there is no
    /// driver, no device or no NVRTC, saying what is missing.
    pub fn open(ordinal: usize) -> Result<Self, CudaError> {
        if !driver_present() {
            return Err(CudaError::Missing("the NVIDIA driver (libcuda)"));
        }
        let count = CudaContext::device_count().map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        if ordinal >= count.max(0) as usize {
            return Err(CudaError::NoDevice { ordinal, count });
        }
        let ctx = CudaContext::new(ordinal).map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        let (major, minor) = ctx
            .compute_capability()
            .map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        let name = ctx
            .name()
            .map_err(|e| CudaError::Driver(format!("{e:?}")))?;
        let stream = ctx.default_stream();
        Ok(CudaDevice {
            ctx,
            stream,
            arch: Arch {
                major: major as u32,
                minor: minor as u32,
            },
            name,
        })
    }
}
