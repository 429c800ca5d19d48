//! [`Defaults`]: the backend, threads, step sizes, K/V type and kernels
//! chosen from a [`Platform`], each with the reason, by pure functions
//! (no probing here, so hand-made platforms test every rule).
//!
//! Choices look at features, limits, device types and counts only; an
//! adapter's name never enters, and no reason quotes it, so renaming an
//! adapter changes nothing here.

use serde::{Deserialize, Serialize};

use super::{DeviceType, GpuBackend, GpuInfo, Platform};
use crate::backend::cpu::kernels::Isa;
use crate::graph::KvType;

/// Tokens one step computes at most (`EngineConfig::max_num_batched_tokens`).
const BATCH_TOKENS: usize = 512;
/// Prompt tokens a step computes beside each four running decodes.
const PREFILL_CHUNK: usize = 16;

/// A backend `--backend` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The CPU kernels.
    Cpu,
    /// WebGPU (wgpu natively, the browser's WebGPU in a page).
    Webgpu,
    /// Hearth's CUDA backend.
    Cuda,
}

impl BackendKind {
    /// The `--backend` name.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Webgpu => "webgpu",
            BackendKind::Cuda => "cuda",
        }
    }

    /// The backend called `name` (`cpu`, `webgpu`, `cuda`), `None` otherwise.
    pub fn parse(name: &str) -> Option<Self> {
        [BackendKind::Cpu, BackendKind::Webgpu, BackendKind::Cuda]
            .into_iter()
            .find(|b| b.name() == name)
    }
}

/// One default and why it was chosen.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Choice<T> {
    /// The value used where no option says otherwise.
    pub value: T,
    /// Why, in a short phrase for people.
    pub why: String,
}

impl<T> Choice<T> {
    fn new(value: T, why: impl Into<String>) -> Self {
        Self {
            value,
            why: why.into(),
        }
    }
}

/// What Hearth uses on a platform where no option says otherwise.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Defaults {
    /// Where models run (`--backend auto`).
    pub backend: Choice<BackendKind>,
    /// Index into [`Platform::gpus`] of the device the backend runs on
    /// (`None` on the CPU).
    pub gpu: Option<usize>,
    /// CPU worker threads (`--threads`).
    pub threads: Choice<usize>,
    /// Most tokens one step computes (the prompt's chunk when it runs alone).
    pub batch_tokens: Choice<usize>,
    /// Prompt tokens a step computes beside each four running decodes
    /// (`hearth serve --prefill-chunk`).
    pub prefill_chunk: Choice<usize>,
    /// Element type of the K/V cache (`--kv`).
    pub kv_type: Choice<KvType>,
    /// Which kernels run (`HEARTH_CPU_ISA`, `HEARTH_GPU_NO_F16`, ... force others).
    pub kernels: Choice<String>,
}

impl Defaults {
    /// The defaults of `platform`: the backend [`Defaults::pick_backend`]
    /// chooses, and everything else for it.
    pub fn choose(platform: &Platform) -> Self {
        let (backend, gpu) = Self::pick_backend(platform);
        Self::with_backend(platform, backend, gpu)
    }

    /// The defaults of `platform` when the backend is given (`--backend
    /// cuda`): the K/V type and kernels follow that backend; its device is
    /// the best one of that backend in `platform.gpus`, if any.
    pub fn for_backend(platform: &Platform, backend: BackendKind) -> Self {
        let gpu = match backend {
            BackendKind::Cpu => None,
            BackendKind::Webgpu => best_gpu(platform, GpuBackend::Webgpu, |_| true),
            BackendKind::Cuda => best_gpu(platform, GpuBackend::Cuda, |_| true),
        };
        let why = format!("--backend {}", backend.name());
        Self::with_backend(platform, Choice::new(backend, why), gpu)
    }

    /// The backend of `--backend auto`: a CUDA device with int8 dot
    /// products, else a WebGPU adapter that is not a software rasterizer
    /// (discrete before integrated), else the CPU. Returns the choice and
    /// the index of its device in `platform.gpus`.
    pub fn pick_backend(platform: &Platform) -> (Choice<BackendKind>, Option<usize>) {
        if let Some(i) = best_gpu(platform, GpuBackend::Cuda, |g| g.features.int8_dot) {
            let g = &platform.gpus[i];
            let why = format!(
                "CUDA device {} (compute {}{}): int8 dot products{}",
                g.index,
                g.compute_capability.as_deref().unwrap_or("?"),
                g.memory_bytes
                    .map_or(String::new(), |b| format!(", {}", super::gib(b))),
                if g.features.matrix_units {
                    " and matrix units"
                } else {
                    ""
                }
            );
            return (Choice::new(BackendKind::Cuda, why), Some(i));
        }
        let hardware = |g: &GpuInfo| g.device_type != DeviceType::Cpu;
        if let Some(i) = best_gpu(platform, GpuBackend::Webgpu, hardware) {
            let g = &platform.gpus[i];
            let why = format!(
                "WebGPU adapter {} is a {} GPU ({})",
                g.index,
                format!("{:?}", g.device_type).to_lowercase(),
                g.api
            );
            return (Choice::new(BackendKind::Webgpu, why), Some(i));
        }
        let why = if platform.gpus.is_empty() {
            "no GPU adapter".to_string()
        } else if platform.gpus.iter().any(|g| g.backend == GpuBackend::Cuda) {
            "the CUDA device lacks int8 dot products (compute 6.1 or later)".to_string()
        } else {
            "the only GPU adapters are software rasterizers, slower than the CPU kernels"
                .to_string()
        };
        (Choice::new(BackendKind::Cpu, why), None)
    }

    fn with_backend(platform: &Platform, backend: Choice<BackendKind>, gpu: Option<usize>) -> Self {
        let device = gpu.and_then(|i| platform.gpus.get(i));
        Self {
            threads: threads(platform),
            batch_tokens: Choice::new(
                BATCH_TOKENS,
                "llama.cpp's n_ubatch: the prefill tiles of every backend run full at it",
            ),
            prefill_chunk: Choice::new(
                PREFILL_CHUNK,
                "bounds the time between a running stream's tokens while a new prompt arrives",
            ),
            kv_type: kv_type(platform, backend.value, device),
            kernels: kernels(platform, backend.value, device),
            backend,
            gpu,
        }
    }
}

/// The index of the best device of `backend` that passes `keep`: the
/// highest [`DeviceType::rank`], then the most memory, then the first.
fn best_gpu(
    platform: &Platform,
    backend: GpuBackend,
    keep: impl Fn(&GpuInfo) -> bool,
) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, g) in platform.gpus.iter().enumerate() {
        if g.backend != backend || !keep(g) {
            continue;
        }
        let better = best.is_none_or(|b| {
            let b = &platform.gpus[b];
            (g.device_type.rank(), g.memory_bytes.unwrap_or(0))
                > (b.device_type.rank(), b.memory_bytes.unwrap_or(0))
        });
        if better {
            best = Some(i);
        }
    }
    best
}

fn threads(platform: &Platform) -> Choice<usize> {
    let cpu = &platform.cpu;
    if !cpu.threads {
        return Choice::new(
            1,
            "no worker threads here (a threaded build on a cross-origin isolated page has them)",
        );
    }
    let n = cpu.logical_cores.max(1);
    Choice::new(n, format!("one per logical core ({n})"))
}

fn kv_type(platform: &Platform, backend: BackendKind, device: Option<&GpuInfo>) -> Choice<KvType> {
    match (backend, device) {
        (BackendKind::Cuda, _) => Choice::new(KvType::F16, "half the memory of f32; CUDA reads halves natively"),
        (BackendKind::Webgpu, Some(g)) if !g.features.f16 => Choice::new(
            KvType::F32,
            "the adapter lacks shader-f16, so f16 K/V would be unpacked on every read (--kv f16 halves the memory)",
        ),
        (BackendKind::Webgpu, _) => Choice::new(KvType::F16, "half the memory of f32; the adapter has shader-f16"),
        (BackendKind::Cpu, _) => {
            let how = match platform.cpu.best() {
                Isa::Avx2 | Isa::Avx512 => "converted in hardware (F16C)",
                Isa::Neon => "converted in hardware (NEON)",
                Isa::Scalar | Isa::Simd128 => "converted in software, still half the bytes read",
            };
            Choice::new(KvType::F16, format!("half the memory of f32; {how}"))
        }
    }
}

fn kernels(platform: &Platform, backend: BackendKind, device: Option<&GpuInfo>) -> Choice<String> {
    if let Some(g) = device.filter(|_| backend != BackendKind::Cpu) {
        return gpu_kernels(g);
    }
    let why = match platform.cpu.best() {
        Isa::Avx512 => "AVX-512 VNNI int8 dots and 16-token prefill tiles",
        Isa::Avx2 => "AVX2 int8 dots (no AVX-512 VNNI)",
        Isa::Neon => "NEON int8 dots (sdot where the CPU has dotprod)",
        Isa::Simd128 => "wasm SIMD128 int8 dots over 4-row bands",
        Isa::Scalar => "no SIMD tier detected: portable scalar kernels",
    };
    Choice::new(platform.cpu.best_isa.clone(), why)
}

fn gpu_kernels(g: &GpuInfo) -> Choice<String> {
    let f = &g.features;
    let mut parts = Vec::new();
    let mut why = Vec::new();
    if f.f16 {
        parts.push("f16");
    } else {
        why.push("packed-f16 fallbacks (no shader-f16)");
    }
    if f.subgroups {
        parts.push("subgroups");
    } else if g.backend == GpuBackend::Webgpu {
        why.push("workgroup reductions (no subgroups)");
    }
    if f.int8_dot {
        parts.push("int8");
    }
    if f.matrix_units && g.backend == GpuBackend::Cuda {
        parts.push("tensor-cores");
    }
    if parts.is_empty() {
        parts.push("fallbacks");
    }
    let why = if why.is_empty() {
        "every feature the kernels use is present".to_string()
    } else {
        why.join(", ")
    };
    Choice::new(parts.join("+"), why)
}
