//! [`GpuCaps`]: what an adapter can do, read once from its features and
//! limits, and what kernels pick from (f16 or packed-f16 fallbacks,
//! subgroup or workgroup reductions, how a large weight is split into
//! bindings).

use std::fmt;

/// The WGSL dialect shaders are composed for.
///
/// naga (wgpu natively) rejects `enable subgroups;` while Dawn and Tint
/// (browsers) require it, so the prelude's `enable` lines depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ShaderTarget {
    /// wgpu's own compiler (Vulkan, Metal, DX12).
    Naga,
    /// A browser's WebGPU (Dawn in Chromium).
    Browser,
}

impl ShaderTarget {
    /// The dialect of this build: `Browser` on wasm32, else `Naga`.
    pub fn current() -> Self {
        if cfg!(target_arch = "wasm32") {
            ShaderTarget::Browser
        } else {
            ShaderTarget::Naga
        }
    }
}

/// What the adapter (and the device made from it) can do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuCaps {
    /// `shader-f16`: WGSL `f16` arithmetic and storage.
    pub f16: bool,
    /// Subgroup operations (`subgroupAdd`, `subgroupMax`, ...).
    pub subgroups: bool,
    /// Smallest subgroup size the adapter may use (0 without subgroups).
    pub subgroup_min_size: u32,
    /// Largest subgroup size the adapter may use (0 without subgroups).
    pub subgroup_max_size: u32,
    /// Largest storage buffer binding in bytes (lavapipe: 128 MiB).
    pub max_storage_binding: u64,
    /// Largest buffer in bytes.
    pub max_buffer: u64,
    /// Most invocations in one workgroup.
    pub max_workgroup_invocations: u32,
    /// Largest x dimension of a workgroup.
    pub max_workgroup_size_x: u32,
    /// Bytes of `var<workgroup>` memory.
    pub max_workgroup_storage: u32,
    /// Most workgroups along one dispatch dimension.
    pub max_workgroups_per_dim: u32,
    /// Storage buffers one shader stage may bind.
    pub max_storage_buffers_per_stage: u32,
    /// Alignment of a storage binding's offset in bytes.
    pub storage_offset_alignment: u32,
    /// Alignment of a uniform binding's offset in bytes.
    pub uniform_offset_alignment: u32,
    /// Adapter name (`llvmpipe (LLVM 15.0.6, 256 bits)`, `NVIDIA H200`).
    pub adapter_name: String,
    /// Graphics API under wgpu (`Vulkan`, `Metal`, `BrowserWebGpu`, ...).
    pub api: String,
    /// Whether the adapter is a CPU rasterizer (lavapipe, SwiftShader).
    pub is_cpu: bool,
    /// The WGSL dialect to compose shaders for.
    pub target: ShaderTarget,
}

impl GpuCaps {
    /// Reads the capabilities of `adapter`.
    pub fn from_adapter(adapter: &wgpu::Adapter) -> Self {
        let info = adapter.get_info();
        let f = adapter.features();
        let l = adapter.limits();
        let subgroups = f.contains(wgpu::Features::SUBGROUP);
        Self {
            f16: f.contains(wgpu::Features::SHADER_F16),
            subgroups,
            subgroup_min_size: if subgroups { info.subgroup_min_size } else { 0 },
            subgroup_max_size: if subgroups { info.subgroup_max_size } else { 0 },
            max_storage_binding: l.max_storage_buffer_binding_size,
            max_buffer: l.max_buffer_size,
            max_workgroup_invocations: l.max_compute_invocations_per_workgroup,
            max_workgroup_size_x: l.max_compute_workgroup_size_x,
            max_workgroup_storage: l.max_compute_workgroup_storage_size,
            max_workgroups_per_dim: l.max_compute_workgroups_per_dimension,
            max_storage_buffers_per_stage: l.max_storage_buffers_per_shader_stage,
            storage_offset_alignment: l.min_storage_buffer_offset_alignment,
            uniform_offset_alignment: l.min_uniform_buffer_offset_alignment,
            adapter_name: info.name.clone(),
            api: format!("{:?}", info.backend),
            is_cpu: info.device_type == wgpu::DeviceType::Cpu,
            target: ShaderTarget::current(),
        }
    }

    /// The features to request from the adapter: those of `self` that
    /// kernels use.
    pub fn features(&self) -> wgpu::Features {
        let mut f = wgpu::Features::empty();
        if self.f16 {
            f |= wgpu::Features::SHADER_F16;
        }
        if self.subgroups {
            f |= wgpu::Features::SUBGROUP;
        }
        f
    }

    /// The limits to request: the adapter's own for what kernels size
    /// themselves by (bindings, buffers, workgroups), defaults elsewhere.
    pub fn limits(&self, adapter: &wgpu::Limits) -> wgpu::Limits {
        wgpu::Limits {
            max_storage_buffer_binding_size: adapter.max_storage_buffer_binding_size,
            max_buffer_size: adapter.max_buffer_size,
            max_compute_invocations_per_workgroup: adapter.max_compute_invocations_per_workgroup,
            max_compute_workgroup_size_x: adapter.max_compute_workgroup_size_x,
            max_compute_workgroup_storage_size: adapter.max_compute_workgroup_storage_size,
            max_storage_buffers_per_shader_stage: adapter.max_storage_buffers_per_shader_stage,
            max_compute_workgroups_per_dimension: adapter.max_compute_workgroups_per_dimension,
            min_storage_buffer_offset_alignment: adapter.min_storage_buffer_offset_alignment,
            min_uniform_buffer_offset_alignment: adapter.min_uniform_buffer_offset_alignment,
            ..wgpu::Limits::downlevel_defaults().using_resolution(adapter.clone())
        }
    }

    /// `self` without shader-f16 (its fallbacks: packed f16 through
    /// `pack2x16float`), as Chromium's SwiftShader adapter.
    pub fn without_f16(mut self) -> Self {
        self.f16 = false;
        self
    }

    /// Whether kernels reducing over quads of invocations
    /// (`quad_max`) may use subgroup shuffles: subgroups of at least 4.
    pub fn quad_subgroups(&self) -> bool {
        self.subgroups && self.subgroup_min_size >= 4
    }

    /// `self` without subgroups (workgroup-memory reductions instead).
    pub fn without_subgroups(mut self) -> Self {
        self.subgroups = false;
        self.subgroup_min_size = 0;
        self.subgroup_max_size = 0;
        self
    }

    /// Caps of a typical small adapter, for composing and validating
    /// shaders without a device (naga tests).
    pub fn for_validation(f16: bool, subgroups: bool) -> Self {
        Self {
            f16,
            subgroups,
            subgroup_min_size: if subgroups { 4 } else { 0 },
            subgroup_max_size: if subgroups { 64 } else { 0 },
            max_storage_binding: 128 << 20,
            max_buffer: 1 << 30,
            max_workgroup_invocations: 256,
            max_workgroup_size_x: 256,
            max_workgroup_storage: 16 << 10,
            max_workgroups_per_dim: 65535,
            max_storage_buffers_per_stage: 8,
            storage_offset_alignment: 256,
            uniform_offset_alignment: 256,
            adapter_name: "validation".into(),
            api: "none".into(),
            is_cpu: true,
            target: ShaderTarget::Naga,
        }
    }
}

impl fmt::Display for GpuCaps {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}{}), f16 {}, subgroups {}, binding {} MiB, buffer {} MiB, {} invocations, {} KiB workgroup memory",
            self.adapter_name,
            self.api,
            if self.is_cpu { ", cpu" } else { "" },
            if self.f16 { "yes" } else { "no" },
            if self.subgroups {
                format!("{}..{}", self.subgroup_min_size, self.subgroup_max_size)
            } else {
                "no".into()
            },
            self.max_storage_binding >> 20,
            self.max_buffer >> 20,
            self.max_workgroup_invocations,
            self.max_workgroup_storage >> 10
        )
    }
}
