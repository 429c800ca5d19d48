//! What the machine is: a [`Platform`] (the CPU's instruction-set tiers,
//! cores, memory and its read bandwidth, each GPU adapter or CUDA device
//! with its memory, limits and features), and the [`Defaults`] chosen
//! from it.
//!
//! Everything here is read from what the hardware reports (run-time
//! feature detection, adapter features and limits, device attributes),
//! never from a vendor or product name: names are kept for people to
//! read, and [`Defaults::choose`] does not look at them.
//!
//! The core fills what it can see on every target: [`CpuInfo::detect`]
//! (the same detection the CPU kernel table uses) and, with the `webgpu`
//! feature, [`probe_webgpu`]. What only the host can tell (total and
//! available memory, a timed bandwidth probe, CUDA devices) is filled in
//! by the front ends, which own files, threads and clocks: the CLI natively,
//! the npm package in a browser (`Hearth.capabilities()` returns the same
//! JSON shape).

mod defaults;
#[cfg(feature = "webgpu")]
mod webgpu;

pub use defaults::{BackendKind, Choice, Defaults};
#[cfg(feature = "webgpu")]
pub use webgpu::{gpu_info_from_adapter, probe_webgpu};

use serde::{Deserialize, Serialize};

use crate::backend::cpu::kernels::Isa;

/// The machine as Hearth sees it. Serializes to the JSON of
/// `hearth info --platform --json` and of the npm package's
/// `Hearth.capabilities()` (`cpu`, `memory`, `gpus`).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Platform {
    /// The host CPU.
    pub cpu: CpuInfo,
    /// The host's memory.
    pub memory: MemoryInfo,
    /// Every GPU adapter and CUDA device this build can use, in the order
    /// they were found (none is an empty list, not an error).
    pub gpus: Vec<GpuInfo>,
}

/// The host CPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CpuInfo {
    /// The architecture this build runs on (`x86_64`, `aarch64`, `wasm32`).
    pub arch: String,
    /// Every instruction-set tier of the CPU kernels this CPU runs, slowest
    /// first (`scalar`, `avx2`, `avx512`, `neon`, `simd128`: the names
    /// `HEARTH_CPU_ISA` takes). `avx512` includes VNNI, `avx2` FMA and F16C.
    pub isa_tiers: Vec<String>,
    /// The fastest of [`CpuInfo::isa_tiers`]: the kernels used unless one is forced.
    pub best_isa: String,
    /// Logical cores (hardware threads); 1 where the host does not say.
    pub logical_cores: usize,
    /// Whether worker threads can run: always natively; in a browser only
    /// in a threaded build on a cross-origin isolated page.
    pub threads: bool,
}

impl Default for CpuInfo {
    fn default() -> Self {
        Self {
            arch: std::env::consts::ARCH.to_string(),
            isa_tiers: vec![Isa::Scalar.name().to_string()],
            best_isa: Isa::Scalar.name().to_string(),
            logical_cores: 1,
            threads: false,
        }
    }
}

impl CpuInfo {
    /// The CPU of this process, from the run-time detection the CPU
    /// kernel table chooses its kernels by ([`Isa::available`]).
    ///
    /// In wasm32 the cores are unknown to the module (1 here; the page
    /// knows `navigator.hardwareConcurrency`) and `threads` is whether
    /// the build has atomics; the page must still be cross-origin isolated.
    pub fn detect() -> Self {
        let isa_tiers = Isa::ALL
            .into_iter()
            .filter(|isa| isa.available())
            .map(|isa| isa.name().to_string())
            .collect();
        Self {
            arch: std::env::consts::ARCH.to_string(),
            isa_tiers,
            best_isa: Isa::best().name().to_string(),
            logical_cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            threads: !cfg!(target_arch = "wasm32") || cfg!(target_feature = "atomics"),
        }
    }

    /// The best tier as the platform line shows it (`avx512+vnni`).
    pub fn isa_label(&self) -> String {
        match Isa::parse(&self.best_isa) {
            Some(Isa::Avx512) => "avx512+vnni".to_string(),
            Some(Isa::Avx2) => "avx2+fma".to_string(),
            _ => self.best_isa.clone(),
        }
    }

    /// The best tier, parsed (scalar for a name this build does not know).
    pub fn best(&self) -> Isa {
        Isa::parse(&self.best_isa).unwrap_or(Isa::Scalar)
    }
}

/// The host's memory, where the host can tell.
#[derive(Debug, Clone, Copy, PartialEq, Default, Serialize, Deserialize)]
pub struct MemoryInfo {
    /// Bytes of memory in all (`None`: unknown).
    pub total_bytes: Option<u64>,
    /// Bytes available to a new allocation now (`None`: unknown).
    pub available_bytes: Option<u64>,
    /// Measured read bandwidth in GB/s (1e9 bytes), all cores reading a
    /// buffer far larger than the caches (`None`: not measured).
    pub read_gbps: Option<f64>,
}

/// Which backend a GPU is reached through.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum GpuBackend {
    /// WebGPU: wgpu natively (Vulkan, Metal, DX12) or the browser's.
    Webgpu,
    /// Hearth's CUDA backend.
    Cuda,
}

impl GpuBackend {
    /// The `--backend` name (`webgpu`, `cuda`).
    pub fn name(self) -> &'static str {
        match self {
            GpuBackend::Webgpu => "webgpu",
            GpuBackend::Cuda => "cuda",
        }
    }
}

/// What kind of device an adapter is, as the driver reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceType {
    /// A GPU with memory of its own.
    Discrete,
    /// A GPU sharing the host's memory.
    Integrated,
    /// A virtualised GPU.
    Virtual,
    /// A software rasterizer running on the CPU (lavapipe, SwiftShader).
    Cpu,
    /// The driver does not say.
    Other,
}

impl DeviceType {
    /// Preference when several adapters are present: discrete first, a
    /// CPU rasterizer last.
    pub fn rank(self) -> u8 {
        match self {
            DeviceType::Discrete => 4,
            DeviceType::Integrated => 3,
            DeviceType::Virtual => 2,
            DeviceType::Other => 1,
            DeviceType::Cpu => 0,
        }
    }
}

/// The limits of a GPU that decide how kernels and buffers are sized.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GpuLimits {
    /// Largest buffer in bytes.
    pub max_buffer_bytes: u64,
    /// Largest storage binding in bytes (a weight larger than this is split).
    pub max_storage_binding_bytes: u64,
    /// Bytes of workgroup (shared) memory one workgroup or block may use.
    pub max_workgroup_storage_bytes: u32,
    /// Most invocations (threads) in one workgroup or block.
    pub max_workgroup_invocations: u32,
}

/// The features of a GPU that kernels choose by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GpuFeatures {
    /// Half-precision arithmetic and storage in shaders (WebGPU `shader-f16`).
    pub f16: bool,
    /// Subgroup (warp) operations.
    pub subgroups: bool,
    /// Smallest subgroup size (0 without subgroups).
    pub subgroup_min_size: u32,
    /// Largest subgroup size (0 without subgroups).
    pub subgroup_max_size: u32,
    /// Packed int8 dot products (WGSL `dot4I8Packed`, CUDA `__dp4a`).
    pub int8_dot: bool,
    /// Matrix units (tensor cores; WebGPU's cooperative matrix).
    pub matrix_units: bool,
    /// GPU timestamp queries (per-kernel profiling).
    pub timestamp_queries: bool,
}

/// One GPU adapter (WebGPU) or device (CUDA).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// The backend it is reached through.
    pub backend: GpuBackend,
    /// Index among the devices of its backend (`HEARTH_GPU_ADAPTER` picks
    /// WebGPU adapters by name, CUDA uses device 0).
    pub index: usize,
    /// The adapter's or device's name, for people (never chosen from).
    pub name: String,
    /// The graphics API under it (`Vulkan`, `Metal`, `Dx12`,
    /// `BrowserWebGpu`, `CUDA`).
    pub api: String,
    /// What kind of device it is.
    pub device_type: DeviceType,
    /// The driver and its version, where reported.
    pub driver: Option<String>,
    /// CUDA compute capability (`9.0`); `None` on WebGPU.
    pub compute_capability: Option<String>,
    /// Bytes of device memory (`None`: WebGPU does not report it).
    pub memory_bytes: Option<u64>,
    /// Bytes of device memory free now (`None`: unknown).
    pub free_memory_bytes: Option<u64>,
    /// Limits that size kernels and buffers.
    pub limits: GpuLimits,
    /// Features kernels choose by.
    pub features: GpuFeatures,
}

impl GpuInfo {
    /// `webgpu Vulkan discrete "NAME" f16 sg32 int8` for the platform line.
    pub fn label(&self) -> String {
        let f = &self.features;
        let mut parts = vec![
            self.backend.name().to_string(),
            format!("{:?}", self.device_type).to_lowercase(),
            format!("\"{}\"", self.name),
        ];
        if let Some(bytes) = self.memory_bytes {
            parts.push(gib(bytes));
        }
        if f.f16 {
            parts.push("f16".into());
        }
        if f.subgroups {
            parts.push(match f.subgroup_min_size == f.subgroup_max_size {
                true => format!("sg{}", f.subgroup_max_size),
                false => format!("sg{}-{}", f.subgroup_min_size, f.subgroup_max_size),
            });
        }
        if f.int8_dot {
            parts.push("int8".into());
        }
        if f.matrix_units {
            parts.push("matrix".into());
        }
        parts.join(" ")
    }
}

impl Platform {
    /// What the core can see of this process's machine: the CPU
    /// ([`CpuInfo::detect`]); memory and GPUs are left for the front end
    /// to fill ([`probe_webgpu`], the host's memory, CUDA devices).
    pub fn detect_cpu() -> Self {
        Self {
            cpu: CpuInfo::detect(),
            ..Self::default()
        }
    }

    /// The one-line summary `hearth run` prints first:
    /// `x86_64 avx512+vnni, 2 cores, 24 GiB, ~20 GB/s; gpus: none`.
    pub fn summary(&self) -> String {
        let mut host = vec![
            format!("{} {}", self.cpu.arch, self.cpu.isa_label()),
            format!(
                "{} core{}",
                self.cpu.logical_cores,
                if self.cpu.logical_cores == 1 { "" } else { "s" }
            ),
        ];
        if let Some(total) = self.memory.total_bytes {
            host.push(gib(total));
        }
        if let Some(gbps) = self.memory.read_gbps {
            host.push(format!("~{gbps:.0} GB/s"));
        }
        let gpus = if self.gpus.is_empty() {
            "none".to_string()
        } else {
            let labels: Vec<String> = self.gpus.iter().map(GpuInfo::label).collect();
            labels.join(", ")
        };
        format!("{}; gpus: {gpus}", host.join(", "))
    }
}

/// `25769803776` -> `24 GiB` (one decimal below 10 GiB).
fn gib(bytes: u64) -> String {
    let g = bytes as f64 / (1u64 << 30) as f64;
    if g < 10.0 {
        format!("{g:.1} GiB")
    } else {
        format!("{g:.0} GiB")
    }
}

#[cfg(test)]
mod tests;
