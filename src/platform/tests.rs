//! The defaults on hand-made platforms, the JSON shape, the summary line.

use super::*;
use crate::graph::KvType;

fn cpu(best: &str, cores: usize) -> CpuInfo {
    CpuInfo {
        arch: "x86_64".into(),
        isa_tiers: vec!["scalar".into(), best.into()],
        best_isa: best.into(),
        logical_cores: cores,
        threads: true,
    }
}

fn webgpu(device_type: DeviceType, f16: bool, name: &str) -> GpuInfo {
    GpuInfo {
        backend: GpuBackend::Webgpu,
        index: 0,
        name: name.into(),
        api: "Vulkan".into(),
        device_type,
        driver: Some("test driver 1.0".into()),
        compute_capability: None,
        memory_bytes: None,
        free_memory_bytes: None,
        limits: GpuLimits {
            max_buffer_bytes: 1 << 31,
            max_storage_binding_bytes: 1 << 27,
            max_workgroup_storage_bytes: 32 << 10,
            max_workgroup_invocations: 256,
        },
        features: GpuFeatures {
            f16,
            subgroups: true,
            subgroup_min_size: 8,
            subgroup_max_size: 8,
            int8_dot: true,
            matrix_units: false,
            timestamp_queries: true,
        },
    }
}

fn cuda(int8_dot: bool) -> GpuInfo {
    GpuInfo {
        backend: GpuBackend::Cuda,
        api: "CUDA".into(),
        device_type: DeviceType::Discrete,
        compute_capability: Some(if int8_dot { "9.0" } else { "5.2" }.into()),
        memory_bytes: Some(80 << 30),
        free_memory_bytes: Some(79 << 30),
        features: GpuFeatures {
            f16: true,
            subgroups: true,
            subgroup_min_size: 32,
            subgroup_max_size: 32,
            int8_dot,
            matrix_units: int8_dot,
            timestamp_queries: true,
        },
        ..webgpu(DeviceType::Discrete, true, "cuda device")
    }
}

fn platform(gpus: Vec<GpuInfo>) -> Platform {
    Platform {
        cpu: cpu("avx512", 2),
        memory: MemoryInfo {
            total_bytes: Some(24 << 30),
            available_bytes: Some(20 << 30),
            read_gbps: Some(21.4),
        },
        gpus,
    }
}

#[test]
fn no_gpu_runs_on_the_cpu_with_every_core() {
    let d = Defaults::choose(&platform(vec![]));
    assert_eq!(d.backend.value, BackendKind::Cpu);
    assert_eq!(d.backend.why, "no GPU adapter");
    assert_eq!(d.gpu, None);
    assert_eq!(d.threads.value, 2);
    assert_eq!(d.kv_type.value, KvType::F16);
    assert_eq!(d.kernels.value, "avx512");
}

#[test]
fn a_software_rasterizer_is_passed_over() {
    let d = Defaults::choose(&platform(vec![webgpu(DeviceType::Cpu, true, "soft")]));
    assert_eq!(d.backend.value, BackendKind::Cpu);
    assert!(
        d.backend.why.contains("software rasterizers"),
        "{}",
        d.backend.why
    );
}

#[test]
fn a_hardware_adapter_runs_webgpu_and_its_f16_decides_the_kv_type() {
    let with = Defaults::choose(&platform(vec![webgpu(DeviceType::Discrete, true, "a")]));
    assert_eq!(with.backend.value, BackendKind::Webgpu);
    assert_eq!(with.gpu, Some(0));
    assert_eq!(with.kv_type.value, KvType::F16);
    assert_eq!(with.kernels.value, "f16+subgroups+int8");
    let without = Defaults::choose(&platform(vec![webgpu(DeviceType::Integrated, false, "a")]));
    assert_eq!(without.backend.value, BackendKind::Webgpu);
    assert_eq!(without.kv_type.value, KvType::F32);
    assert!(
        without.kernels.why.contains("packed-f16"),
        "{}",
        without.kernels.why
    );
}

#[test]
fn discrete_wins_over_integrated_and_software_in_any_order() {
    let gpus = vec![
        webgpu(DeviceType::Cpu, true, "x"),
        webgpu(DeviceType::Integrated, true, "y"),
        webgpu(DeviceType::Discrete, false, "z"),
    ];
    for rotation in 0..gpus.len() {
        let mut g = gpus.clone();
        g.rotate_left(rotation);
        let p = platform(g);
        let d = Defaults::choose(&p);
        let chosen = d.gpu.map(|i| p.gpus[i].device_type);
        assert_eq!(chosen, Some(DeviceType::Discrete), "rotation {rotation}");
    }
}

#[test]
fn a_cuda_device_with_int8_dots_wins_and_an_old_one_does_not() {
    let p = platform(vec![webgpu(DeviceType::Discrete, true, "a"), cuda(true)]);
    let d = Defaults::choose(&p);
    assert_eq!(d.backend.value, BackendKind::Cuda);
    assert_eq!(d.gpu, Some(1));
    assert_eq!(d.kv_type.value, KvType::F16);
    assert!(
        d.kernels.value.contains("tensor-cores"),
        "{}",
        d.kernels.value
    );
    let old = Defaults::choose(&platform(vec![cuda(false)]));
    assert_eq!(old.backend.value, BackendKind::Cpu);
    assert!(old.backend.why.contains("int8"), "{}", old.backend.why);
}

#[test]
fn a_given_backend_keeps_its_own_kv_type_and_kernels() {
    let p = platform(vec![webgpu(DeviceType::Discrete, false, "a")]);
    let cpu = Defaults::for_backend(&p, BackendKind::Cpu);
    assert_eq!(cpu.backend.value, BackendKind::Cpu);
    assert_eq!(cpu.kv_type.value, KvType::F16);
    assert_eq!(cpu.kernels.value, "avx512");
    let gpu = Defaults::for_backend(&p, BackendKind::Webgpu);
    assert_eq!(gpu.gpu, Some(0));
    assert_eq!(gpu.kv_type.value, KvType::F32);
}

#[test]
fn no_threads_means_one_thread() {
    let mut p = platform(vec![]);
    p.cpu.threads = false;
    p.cpu.logical_cores = 8;
    assert_eq!(Defaults::choose(&p).threads.value, 1);
}

#[test]
fn renaming_an_adapter_changes_no_default() {
    let names = [
        "NVIDIA GeForce RTX 4090",
        "AMD Radeon",
        "Apple M3",
        "llvmpipe",
        "",
    ];
    for ty in [
        DeviceType::Discrete,
        DeviceType::Integrated,
        DeviceType::Cpu,
    ] {
        for f16 in [false, true] {
            let base = Defaults::choose(&platform(vec![webgpu(ty, f16, "adapter")]));
            for name in names {
                let mut renamed = platform(vec![webgpu(ty, f16, name), cuda(false)]);
                renamed.gpus[1].name = name.to_string();
                let mut plain = renamed.clone();
                plain.gpus[1].name = "device".into();
                assert_eq!(
                    Defaults::choose(&renamed),
                    Defaults::choose(&plain),
                    "{name}"
                );
                let one = Defaults::choose(&platform(vec![webgpu(ty, f16, name)]));
                assert_eq!(one, base, "{name} ({ty:?}, f16 {f16})");
            }
        }
    }
}

#[test]
fn platform_and_defaults_round_trip_through_json() {
    let p = platform(vec![webgpu(DeviceType::Discrete, true, "a"), cuda(true)]);
    let text = serde_json::to_string(&p).expect("serialize");
    let back: Platform = serde_json::from_str(&text).expect("deserialize");
    assert_eq!(back, p);
    let d = Defaults::choose(&p);
    let back: Defaults =
        serde_json::from_str(&serde_json::to_string(&d).expect("serialize")).expect("parse");
    assert_eq!(back, d);
}

#[test]
fn the_json_shape_is_the_one_the_package_mirrors() {
    let v = serde_json::to_value(platform(vec![cuda(true)])).expect("serialize");
    assert_eq!(v["cpu"]["best_isa"], "avx512");
    assert_eq!(v["cpu"]["logical_cores"], 2);
    assert_eq!(v["memory"]["total_bytes"], 24u64 << 30);
    assert_eq!(v["gpus"][0]["backend"], "cuda");
    assert_eq!(v["gpus"][0]["device_type"], "discrete");
    assert_eq!(v["gpus"][0]["features"]["subgroup_max_size"], 32);
    let d = serde_json::to_value(Defaults::choose(&platform(vec![]))).expect("serialize");
    assert_eq!(d["backend"]["value"], "cpu");
    assert_eq!(d["kv_type"]["value"], "f16");
}

#[test]
fn the_summary_is_one_line_with_the_facts() {
    let line = platform(vec![]).summary();
    assert_eq!(
        line,
        "x86_64 avx512+vnni, 2 cores, 24 GiB, ~21 GB/s; gpus: none"
    );
    let line = platform(vec![webgpu(DeviceType::Discrete, true, "Card")]).summary();
    assert!(
        line.ends_with("gpus: webgpu discrete \"Card\" f16 sg8 int8"),
        "{line}"
    );
}

#[test]
fn detection_agrees_with_the_kernel_table() {
    let c = CpuInfo::detect();
    let table = crate::backend::cpu::kernels::KernelTable::detect();
    assert_eq!(c.best_isa, table.isa().name());
    assert!(c.isa_tiers.contains(&"scalar".to_string()));
    assert!(c.isa_tiers.contains(&c.best_isa));
    assert!(c.logical_cores >= 1);
}
