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

/// What a device is, read without compiling kernels or opening a backend
/// (`hearth info --platform`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceSummary {
    /// Its name (`NVIDIA H100 80GB HBM3`), for people.
    pub name: String,
    /// Its architecture (compute capability).
    pub arch: Arch,
    /// Bytes of device memory.
    pub total_bytes: u64,
    /// Bytes of device memory free now.
    pub free_bytes: u64,
    /// Streaming multiprocessors.
    pub multiprocessors: u32,
    /// Most threads in one block.
    pub max_threads_per_block: u32,
    /// Bytes of shared memory one block may use (opted in).
    pub max_shared_per_block: u32,
    /// The driver's CUDA version (`13.0`), where it says.
    pub driver: Option<String>,
}

/// The [`DeviceSummary`] of device `ordinal`: an error, not a panic,
/// where there is no driver or no such device.
pub fn describe(ordinal: usize) -> Result<DeviceSummary, CudaError> {
    if !driver_present() {
        return Err(CudaError::Missing("the NVIDIA driver (libcuda)"));
    }
    let driver = |e| CudaError::Driver(format!("{e:?}"));
    let count = CudaContext::device_count().map_err(driver)?;
    if ordinal >= count.max(0) as usize {
        return Err(CudaError::NoDevice { ordinal, count });
    }
    let ctx = CudaContext::new(ordinal).map_err(driver)?;
    let (major, minor) = ctx.compute_capability().map_err(driver)?;
    let (free, total) = ctx.mem_get_info().map_err(driver)?;
    let attr = |a| ctx.attribute(a).map(|v| v.max(0) as u32).map_err(driver);
    use cudarc::driver::sys::CUdevice_attribute as A;
    let mut version = 0;
    // SAFETY: one valid out-pointer; the driver library is loaded (above).
    let ok = unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) };
    Ok(DeviceSummary {
        name: ctx.name().map_err(driver)?,
        arch: Arch {
            major: major as u32,
            minor: minor as u32,
        },
        total_bytes: total as u64,
        free_bytes: free as u64,
        multiprocessors: attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
        max_threads_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        max_shared_per_block: attr(A::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        driver: (ok == cudarc::driver::sys::CUresult::CUDA_SUCCESS && version > 0)
            .then(|| format!("CUDA {}.{}", version / 1000, version % 1000 / 10)),
    })
}
