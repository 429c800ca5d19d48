//! [`TuneKey`]: which device and which kernels a measurement belongs to.
//!
//! A winner measured on one device, or with other kernels, says nothing
//! about another: the key holds everything that can change the answer
//! (the backend, the device's identity and geometry, and a build id of the
//! kernels measured), and a stored record is believed only where its key
//! equals the current one.

use serde::{Deserialize, Serialize};

use crate::model::synth::rng::fnv1a;
use crate::platform::{CpuInfo, GpuInfo};

/// The device and kernel build a [`super::Record`] was measured on.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TuneKey {
    /// The backend (`cpu`, `webgpu`, `cuda`).
    pub backend: String,
    /// The device as people know it: the CPU's model name, the adapter's
    /// or device's name.
    pub device: String,
    /// What else changes the answer: architecture, instruction-set tiers
    /// and cores of a CPU; API, driver, compute capability, limits and
    /// features of a GPU.
    pub geometry: String,
    /// The build id of the kernels measured ([`build_id`]).
    pub build: String,
}

impl TuneKey {
    /// The key of the CPU backend on `cpu` (named `model_name` where the
    /// host tells, such as `/proc/cpuinfo`'s "model name"), running the
    /// kernels of build `build`.
    pub fn cpu(cpu: &CpuInfo, model_name: Option<&str>, build: &str) -> Self {
        Self {
            backend: "cpu".to_string(),
            device: model_name.unwrap_or("unknown cpu").trim().to_string(),
            geometry: format!(
                "{} {} x{}",
                cpu.arch,
                cpu.isa_tiers.join("+"),
                cpu.logical_cores
            ),
            build: build.to_string(),
        }
    }

    /// The key of the GPU `gpu` running the kernels of build `build`.
    pub fn gpu(gpu: &GpuInfo, build: &str) -> Self {
        let l = &gpu.limits;
        let f = &gpu.features;
        let geometry = format!(
            "{} {:?} driver={} cc={} buf={} bind={} wgmem={} wginv={} f16={} sg={}-{} int8={} matrix={}",
            gpu.api,
            gpu.device_type,
            gpu.driver.as_deref().unwrap_or("-"),
            gpu.compute_capability.as_deref().unwrap_or("-"),
            l.max_buffer_bytes,
            l.max_storage_binding_bytes,
            l.max_workgroup_storage_bytes,
            l.max_workgroup_invocations,
            f.f16,
            f.subgroup_min_size,
            f.subgroup_max_size,
            f.int8_dot,
            f.matrix_units,
        );
        Self {
            backend: gpu.backend.name().to_string(),
            device: gpu.name.clone(),
            geometry,
            build: build.to_string(),
        }
    }

    /// `cpu "NAME" (x86_64 scalar+avx2 x2), build 1a2b...` for people.
    pub fn label(&self) -> String {
        format!(
            "{} \"{}\" ({}), build {}",
            self.backend, self.device, self.geometry, self.build
        )
    }

    /// Whether `other` is the same device with other kernels.
    pub fn same_device(&self, other: &TuneKey) -> bool {
        self.backend == other.backend
            && self.device == other.device
            && self.geometry == other.geometry
    }
}

/// The build id of kernels described by `parts` (their sources, or a
/// version string the backend supplies): 16 hex digits of the 64-bit
/// FNV-1a hash of the parts, each followed by a zero byte. Stable across
/// targets and runs (no random seed), so a store written by one build is
/// recognised by the same build elsewhere.
pub fn build_id(parts: &[&str]) -> String {
    let bytes: Vec<u8> = parts
        .iter()
        .flat_map(|p| p.bytes().chain(std::iter::once(0)))
        .collect();
    format!("{:016x}", fnv1a(&bytes))
}
