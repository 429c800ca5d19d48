//! This machine's [`Platform`], filled with what only the host can tell
//! (memory from the OS, a short bandwidth probe, CUDA devices), probed once
//! per process, and the [`Defaults`] chosen from it for options left unset.

use std::sync::OnceLock;

use hearth::platform::{BackendKind, Defaults, Platform};

/// Bytes the bandwidth probe reads: larger than the last-level caches of
/// the machines measured (32 MiB per CCD on Zen 4), small enough to stay
/// near 50 ms on one slow core.
const PROBE_BYTES: usize = 64 << 20;

/// The platform as probed (GPUs included, bandwidth not), once.
static MACHINE: OnceLock<Platform> = OnceLock::new();
/// The defaults `--backend auto` resolved to, when it was asked.
static AUTO: OnceLock<Defaults> = OnceLock::new();

/// This machine: the CPU as the kernels detect it, the OS's memory
/// figures, every WebGPU adapter and (in CUDA builds) every CUDA device.
/// Probed on first use.
pub fn machine() -> &'static Platform {
    MACHINE.get_or_init(|| {
        let mut p = Platform::detect_cpu();
        p.memory.total_bytes = meminfo("MemTotal:");
        p.memory.available_bytes = meminfo("MemAvailable:");
        p.gpus = without_stderr(|| pollster::block_on(hearth::platform::probe_webgpu()));
        cuda::add_devices(&mut p);
        p
    })
}

/// [`machine`] with the memory read bandwidth measured (about 50 ms).
pub fn machine_measured() -> Platform {
    let mut p = machine().clone();
    let threads = p.cpu.logical_cores.max(1);
    if let Ok(bw) = super::bench::membw::measure(PROBE_BYTES, threads, 1) {
        p.memory.read_gbps = Some(bw.best());
    }
    p
}

/// The backend `--backend auto` runs on here, remembered for the
/// reason [`platform_line`] prints.
pub fn auto_backend() -> &'static str {
    AUTO.get_or_init(|| Defaults::choose(machine()))
        .backend
        .value
        .name()
}

/// The defaults for a run on the backend named `backend`: those `auto`
/// chose when it chose this backend, else that backend's own. The CPU's
/// need no GPU probe.
pub fn defaults_for(backend: &str) -> Defaults {
    if let Some(d) = AUTO.get().filter(|d| d.backend.value.name() == backend) {
        return d.clone();
    }
    match BackendKind::parse(backend) {
        Some(BackendKind::Cpu) | None => {
            Defaults::for_backend(&Platform::detect_cpu(), BackendKind::Cpu)
        }
        Some(kind) => Defaults::for_backend(machine(), kind),
    }
}

/// `platform: x86_64 avx512+vnni, 2 cores, 24 GiB, ~20 GB/s; gpus: none;
/// backend cpu (no GPU adapter)`: what `hearth run` prints first.
pub fn platform_line(backend: &str) -> String {
    let p = machine_measured();
    let d = defaults_for(backend);
    format!(
        "platform: {}; backend {backend} ({})",
        p.summary(),
        d.backend.why
    )
}

/// `hearth info --platform`: the machine and the defaults chosen from it,
/// as a table or (`json`) as one object: the platform's fields (`cpu`,
/// `memory`, `gpus`, the npm package's `Hearth.capabilities()` shape) and
/// `defaults`.
pub fn print(json: bool) -> anyhow::Result<()> {
    let p = machine_measured();
    let d = Defaults::choose(&p);
    if json {
        let mut out = serde_json::to_value(&p)?;
        if let Some(obj) = out.as_object_mut() {
            obj.insert("defaults".into(), serde_json::to_value(&d)?);
        }
        println!("{out}");
        return Ok(());
    }
    for line in table(&p, &d) {
        println!("{line}");
    }
    Ok(())
}

/// The lines of `hearth info --platform`.
fn table(p: &Platform, d: &Defaults) -> Vec<String> {
    let c = &p.cpu;
    let m = &p.memory;
    let bytes = |b: Option<u64>| b.map_or("unknown".to_string(), super::human_bytes);
    let mut lines = vec![
        format!(
            "cpu           {} {} (tiers {}), {} logical cores, threads {}",
            c.arch,
            c.isa_label(),
            c.isa_tiers.join(", "),
            c.logical_cores,
            if c.threads { "yes" } else { "no" }
        ),
        format!(
            "memory        {} total, {} available, read {}",
            bytes(m.total_bytes),
            bytes(m.available_bytes),
            m.read_gbps
                .map_or("not measured".to_string(), |g| format!("~{g:.1} GB/s")),
        ),
    ];
    if p.gpus.is_empty() {
        lines.push("gpus          none".into());
    }
    for g in &p.gpus {
        lines.extend(gpu_lines(g));
    }
    lines.push(String::new());
    lines.push("defaults (each overridden by its option):".into());
    let row = |name: &str, value: String, why: &str| format!("  {name:<14} {value:<18} {why}");
    lines.push(row(
        "backend",
        d.backend.value.name().into(),
        &d.backend.why,
    ));
    lines.push(row("threads", d.threads.value.to_string(), &d.threads.why));
    lines.push(row(
        "batch tokens",
        d.batch_tokens.value.to_string(),
        &d.batch_tokens.why,
    ));
    lines.push(row(
        "prefill chunk",
        d.prefill_chunk.value.to_string(),
        &d.prefill_chunk.why,
    ));
    let kv = format!("{:?}", d.kv_type.value).to_lowercase();
    lines.push(row("kv type", kv, &d.kv_type.why));
    lines.push(row("kernels", d.kernels.value.clone(), &d.kernels.why));
    lines
}

/// The two lines of one GPU.
fn gpu_lines(g: &hearth::platform::GpuInfo) -> [String; 2] {
    let f = &g.features;
    let l = &g.limits;
    let mut have = Vec::new();
    for (on, name) in [
        (f.f16, "f16".to_string()),
        (
            f.subgroups,
            format!("subgroups {}-{}", f.subgroup_min_size, f.subgroup_max_size),
        ),
        (f.int8_dot, "int8 dot".into()),
        (f.matrix_units, "matrix units".into()),
        (f.timestamp_queries, "timestamps".into()),
    ] {
        if on {
            have.push(name);
        }
    }
    let memory = match (g.memory_bytes, g.free_memory_bytes) {
        (Some(t), Some(f)) => format!(
            ", {} ({} free)",
            super::human_bytes(t),
            super::human_bytes(f)
        ),
        (Some(t), None) => format!(", {}", super::human_bytes(t)),
        _ => String::new(),
    };
    [
        format!(
            "gpu {:<9} {} {} {:?} \"{}\"{}{}{memory}",
            g.index,
            g.backend.name(),
            g.api,
            g.device_type,
            g.name,
            g.compute_capability
                .as_deref()
                .map_or(String::new(), |cc| format!(", compute {cc}")),
            g.driver
                .as_deref()
                .map_or(String::new(), |d| format!(", driver {d}")),
        ),
        format!(
            "              max buffer {}, max binding {}, workgroup storage {}, {} invocations; {}",
            super::human_bytes(l.max_buffer_bytes),
            super::human_bytes(l.max_storage_binding_bytes),
            super::human_bytes(u64::from(l.max_workgroup_storage_bytes)),
            l.max_workgroup_invocations,
            if have.is_empty() {
                "no optional features".to_string()
            } else {
                have.join(", ")
            }
        ),
    ]
}

/// `f()` with file descriptor 2 pointed at `/dev/null`: Vulkan layers
/// print to it while adapters are enumerated (Mesa's device-select layer
/// says `XDG_RUNTIME_DIR is invalid` on a machine without a desktop
/// session), and a probe the user did not ask for must not add lines to
/// a command's output.
#[cfg(unix)]
fn without_stderr<T>(f: impl FnOnce() -> T) -> T {
    use std::os::fd::AsRawFd;
    let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null") else {
        return f();
    };
    // SAFETY: dup of the process's own stderr; the result is checked.
    let saved = unsafe { libc::dup(2) };
    // SAFETY: both descriptors are open (null above, 2 while `saved` was made).
    if saved < 0 || unsafe { libc::dup2(null.as_raw_fd(), 2) } < 0 {
        if saved >= 0 {
            // SAFETY: `saved` is ours, from dup above.
            unsafe { libc::close(saved) };
        }
        return f();
    }
    let out = f();
    // SAFETY: `saved` is the original stderr, open until closed here.
    unsafe {
        libc::dup2(saved, 2);
        libc::close(saved);
    }
    out
}

#[cfg(not(unix))]
fn without_stderr<T>(f: impl FnOnce() -> T) -> T {
    f()
}

/// A field of `/proc/meminfo` in bytes (`None` where there is none).
fn meminfo(key: &str) -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line[key.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

#[cfg(feature = "cuda")]
mod cuda {
    use hearth::platform::{DeviceType, GpuBackend, GpuFeatures, GpuInfo, GpuLimits, Platform};
    use hearth_cuda::device::{describe, device_count};

    /// Appends every CUDA device `describe` can read.
    pub fn add_devices(p: &mut Platform) {
        for ordinal in 0..device_count() {
            let Ok(d) = describe(ordinal) else { continue };
            let cc = d.arch.major * 10 + d.arch.minor;
            p.gpus.push(GpuInfo {
                backend: GpuBackend::Cuda,
                index: ordinal,
                name: d.name,
                api: "CUDA".into(),
                device_type: DeviceType::Discrete,
                driver: d.driver,
                compute_capability: Some(format!("{}.{}", d.arch.major, d.arch.minor)),
                memory_bytes: Some(d.total_bytes),
                free_memory_bytes: Some(d.free_bytes),
                limits: GpuLimits {
                    max_buffer_bytes: d.total_bytes,
                    max_storage_binding_bytes: d.total_bytes,
                    max_workgroup_storage_bytes: d.max_shared_per_block,
                    max_workgroup_invocations: d.max_threads_per_block,
                },
                features: GpuFeatures {
                    // Half arithmetic from 5.3, `__dp4a` from 6.1, tensor
                    // cores (mma) from 7.0; warps are 32 threads on all.
                    f16: cc >= 53,
                    subgroups: true,
                    subgroup_min_size: 32,
                    subgroup_max_size: 32,
                    int8_dot: cc >= 61,
                    matrix_units: cc >= 70,
                    timestamp_queries: true,
                },
            });
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod cuda {
    use hearth::platform::Platform;

    /// This build has no CUDA backend: nothing to add.
    pub fn add_devices(_: &mut Platform) {}
}
