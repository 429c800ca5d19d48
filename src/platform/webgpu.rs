//! [`GpuInfo`] of WebGPU adapters, read from wgpu's adapter info, features
//! and limits without opening a device.

use super::{DeviceType, GpuBackend, GpuFeatures, GpuInfo, GpuLimits};

/// Every WebGPU adapter wgpu finds: natively all of them (Vulkan, Metal,
/// DX12; `WGPU_BACKEND` is honoured as [`GpuContext`] honours it), in a
/// browser the one `navigator.gpu` gives. None is an empty list.
///
/// In a browser, call it only where `navigator.gpu` exists (wgpu's
/// instance panics without it, under Node.js for instance).
///
/// [`GpuContext`]: crate::backend::webgpu::GpuContext
pub async fn probe_webgpu() -> Vec<GpuInfo> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all()),
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    let int8_dot = instance
        .wgsl_language_features()
        .contains(wgpu::WgslLanguageFeatures::Packed4x8IntegerDotProduct);
    let adapters = if cfg!(target_arch = "wasm32") {
        let opts = wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            apply_limit_buckets: false,
        };
        instance.request_adapter(&opts).await.into_iter().collect()
    } else {
        instance.enumerate_adapters(wgpu::Backends::all()).await
    };
    adapters
        .iter()
        .enumerate()
        .map(|(i, a)| gpu_info_from_adapter(i, a, int8_dot))
        .collect()
}

/// The [`GpuInfo`] of `adapter`, number `index` of its instance;
/// `int8_dot`: whether the instance's WGSL has `dot4I8Packed`.
pub fn gpu_info_from_adapter(index: usize, adapter: &wgpu::Adapter, int8_dot: bool) -> GpuInfo {
    let info = adapter.get_info();
    let f = adapter.features();
    let l = adapter.limits();
    let subgroups = f.contains(wgpu::Features::SUBGROUP);
    let driver = [info.driver.as_str(), info.driver_info.as_str()]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join(" ");
    GpuInfo {
        backend: GpuBackend::Webgpu,
        index,
        name: info.name.clone(),
        api: format!("{:?}", info.backend),
        device_type: match info.device_type {
            wgpu::DeviceType::DiscreteGpu => DeviceType::Discrete,
            wgpu::DeviceType::IntegratedGpu => DeviceType::Integrated,
            wgpu::DeviceType::VirtualGpu => DeviceType::Virtual,
            wgpu::DeviceType::Cpu => DeviceType::Cpu,
            wgpu::DeviceType::Other => DeviceType::Other,
        },
        driver: (!driver.is_empty()).then_some(driver),
        compute_capability: None,
        memory_bytes: None,
        free_memory_bytes: None,
        limits: GpuLimits {
            max_buffer_bytes: l.max_buffer_size,
            max_storage_binding_bytes: l.max_storage_buffer_binding_size,
            max_workgroup_storage_bytes: l.max_compute_workgroup_storage_size,
            max_workgroup_invocations: l.max_compute_invocations_per_workgroup,
        },
        features: GpuFeatures {
            f16: f.contains(wgpu::Features::SHADER_F16),
            subgroups,
            subgroup_min_size: if subgroups { info.subgroup_min_size } else { 0 },
            subgroup_max_size: if subgroups { info.subgroup_max_size } else { 0 },
            int8_dot,
            matrix_units: f.contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX),
            timestamp_queries: f.contains(wgpu::Features::TIMESTAMP_QUERY),
        },
    }
}
