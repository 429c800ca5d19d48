//! The backends of this build, composed with the core: each is opened with
//! its typed options, read here from the `HEARTH_*` environment variables
//! (the library reads no environment), and the model loaded onto it comes
//! back as the core's [`AnyModel`].

use hearth::backend::cpu::kernels::Isa;
use hearth::backend::cpu::{CpuBackend, CpuOptions};
use hearth::backend::webgpu::{GpuContext, GpuOptions, GpuProfile, WebGpuBackend};
use hearth::backend::Backend;
use hearth::gguf::{ByteSource, GgufModel};
use hearth::model::{check_model, load_model, AnyModel, Checked, LoadOptions, LoadProgress};

/// Backends compiled into this build, for `--backend` (`auto` picks one).
#[cfg(not(feature = "cuda"))]
pub const BACKENDS: &[&str] = &["cpu", "webgpu"];
/// Backends compiled into this build, for `--backend` (`auto` picks one).
#[cfg(feature = "cuda")]
pub const BACKENDS: &[&str] = &["cpu", "webgpu", "cuda"];

/// Checks `--backend NAME` names a backend of this build.
pub fn check_backend(name: &str) -> anyhow::Result<()> {
    if BACKENDS.contains(&name) {
        return Ok(());
    }
    anyhow::bail!(
        "backend `{name}` is not in this build; this build has: {} (and auto){}",
        BACKENDS.join(", "),
        if name == "cuda" {
            "; build with `cargo build --release -p hearth-cli --features cuda` for CUDA"
        } else {
            ""
        }
    )
}

/// `--backend`'s value with `auto` resolved from this machine's platform
/// ([`hearth::platform::Defaults::pick_backend`]: a CUDA device where the
/// build has CUDA, else a hardware WebGPU adapter, else the CPU). Other
/// names pass as they are ([`check_backend`] refuses one this build lacks,
/// in one line).
pub fn parse_backend(name: &str) -> Result<String, String> {
    Ok(if name == "auto" {
        super::platform::auto_backend().to_string()
    } else {
        name.to_string()
    })
}

/// The value of environment variable `name`, if set.
fn env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Prints each warning about a setting that was ignored.
fn warn(warnings: Vec<String>) {
    for w in warnings {
        eprintln!("hearth: {w}");
    }
}

/// The CPU backend's options on `threads` threads (0: all cores), with
/// `HEARTH_CPU_ISA`, `HEARTH_FUSE`, `HEARTH_ATTN`, `HEARTH_LARGE_PAGES`,
/// `HEARTH_POOL` and `HEARTH_PROFILE` from the environment.
pub fn cpu_options(threads: usize) -> CpuOptions {
    let (opts, warnings) = CpuOptions::from_settings(threads, env);
    warn(warnings);
    opts
}

/// The WebGPU backend's options, with `HEARTH_GPU_*`, `HEARTH_WEBGPU_KERNELS`
/// and `HEARTH_PROFILE` from the environment.
pub fn gpu_options() -> GpuOptions {
    let (mut opts, warnings) = GpuOptions::from_settings(env);
    warn(warnings);
    if super::trace::on() && opts.profile == GpuProfile::Off {
        opts.profile = GpuProfile::Trace;
    }
    opts
}

/// What [`hearth::model::check_model`] finds of `model` with `opts` on the
/// backend named `name` (the device opened, nothing loaded), and the
/// device's name.
pub async fn check_on(
    name: &str,
    threads: usize,
    model: &GgufModel,
    opts: &LoadOptions,
) -> anyhow::Result<(Checked, String)> {
    check_backend(name)?;
    Ok(match name {
        #[cfg(feature = "cuda")]
        "cuda" => {
            let backend = hearth_cuda::CudaBackend::new(0)?;
            (
                check_model(model, &backend, opts)?,
                backend.caps().name.clone(),
            )
        }
        "webgpu" => {
            let backend = WebGpuBackend::new(GpuContext::new(&gpu_options()).await?);
            (
                check_model(model, &backend, opts)?,
                backend.caps().name.clone(),
            )
        }
        _ => {
            let backend = CpuBackend::with_options(&cpu_options(threads));
            (
                check_model(model, &backend, opts)?,
                backend.caps().name.clone(),
            )
        }
    })
}

/// Loads `model` on the backend named `name` (one of [`BACKENDS`]), the
/// CPU on `threads` threads with the kernel tier `cpu_isa` where
/// `HEARTH_CPU_ISA` names none (`None`: the widest tier); split into
/// `tensor_parallel` shards where that is more than 1 ([`load_on_tp`]).
#[allow(clippy::too_many_arguments)]
pub async fn load_on<S: ByteSource>(
    name: &str,
    threads: usize,
    tensor_parallel: usize,
    cpu_isa: Option<Isa>,
    model: &GgufModel,
    sources: &[S],
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> anyhow::Result<AnyModel> {
    if tensor_parallel > 1 {
        let shards = (tensor_parallel, cpu_isa);
        return load_on_tp(name, shards, threads, model, sources, opts, progress).await;
    }
    check_backend(name)?;
    // The host's share of the work beside a device runs on `threads` too.
    let opts = &LoadOptions {
        host_threads: threads,
        ..*opts
    };
    Ok(match name {
        #[cfg(feature = "cuda")]
        "cuda" => {
            let backend = cuda_backend(0)?;
            AnyModel::new(load_model(backend, model, sources, opts, progress).await?)
        }
        "webgpu" => {
            let ctx = GpuContext::new(&gpu_options()).await?;
            let backend = WebGpuBackend::new(ctx);
            AnyModel::new(load_model(backend, model, sources, opts, progress).await?)
        }
        _ => {
            let mut cpu = cpu_options(threads);
            // An explicit HEARTH_CPU_ISA wins over the measured tier.
            cpu.isa = cpu.isa.or(cpu_isa);
            let backend = CpuBackend::with_options(&cpu);
            // Every weight is in host memory already: a split would only
            // build a second CPU model.
            let opts = &LoadOptions {
                gpu_layers: None,
                ..*opts
            };
            AnyModel::new(load_model(backend, model, sources, opts, progress).await?)
        }
    })
}

/// Loads `model` split into `n` tensor-parallel shards
/// ([`hearth::model::shard`]), shard `i` on its own backend named `name`:
/// CUDA device `i`, or, on one device or the CPU, `n` backends side by
/// side (the partial sums cross the host either way; on the CPU each
/// shard gets `threads / n` threads and the kernel tier `cpu_isa`, as
/// [`load_on`]).
async fn load_on_tp<S: ByteSource>(
    name: &str,
    (n, cpu_isa): (usize, Option<Isa>),
    threads: usize,
    model: &GgufModel,
    sources: &[S],
    opts: &LoadOptions,
    progress: &mut dyn FnMut(&LoadProgress),
) -> anyhow::Result<AnyModel> {
    use hearth::model::shard::load_tensor_parallel;
    check_backend(name)?;
    let opts = &LoadOptions {
        host_threads: threads,
        gpu_layers: None,
        ..*opts
    };
    Ok(match name {
        #[cfg(feature = "cuda")]
        "cuda" => {
            let backends = (0..n)
                .map(cuda_backend)
                .collect::<anyhow::Result<Vec<_>>>()?;
            AnyModel::from(load_tensor_parallel(backends, model, sources, opts, progress).await?)
        }
        "webgpu" => {
            let mut backends = Vec::with_capacity(n);
            for _ in 0..n {
                backends.push(WebGpuBackend::new(GpuContext::new(&gpu_options()).await?));
            }
            AnyModel::from(load_tensor_parallel(backends, model, sources, opts, progress).await?)
        }
        _ => {
            let mut cpu = cpu_options((threads / n).max(1));
            cpu.isa = cpu.isa.or(cpu_isa);
            let backends = (0..n).map(|_| CpuBackend::with_options(&cpu)).collect();
            AnyModel::from(load_tensor_parallel(backends, model, sources, opts, progress).await?)
        }
    })
}

/// The CUDA backend on device `ordinal`, with the `HEARTH_CUDA_*` and
/// `HEARTH_PROFILE` settings of the environment.
#[cfg(feature = "cuda")]
fn cuda_backend(ordinal: usize) -> anyhow::Result<hearth_cuda::CudaBackend> {
    let mut backend = hearth_cuda::CudaBackend::new(ordinal)?;
    // HEARTH_CUDA_GRAPHS=0 records every op of every step instead
    // of replaying plans as CUDA graphs (for comparison).
    if env("HEARTH_CUDA_GRAPHS").as_deref() == Some("0") {
        backend.set_graphs(false);
    }
    // HEARTH_PROFILE=cuda times every kernel (op by op) and prints
    // the table at exit; HEARTH_CUDA_TILE_TOKENS=N moves the point
    // where products switch to the tensor-core tiles.
    if env("HEARTH_PROFILE").as_deref() == Some("cuda") {
        backend.set_profile(true);
    } else if super::trace::on() {
        // --trace: the same events, for the trace's device track
        // alone (nothing printed).
        backend.set_trace_profile();
    }
    if let Some(n) = env("HEARTH_CUDA_TILE_TOKENS").and_then(|v| v.parse().ok()) {
        backend.set_tile_tokens(n);
    }
    // HEARTH_CUDA_DEQUANT_TOKENS=N: from how many tokens a product
    // dequantizes its weight to f16 once (128).
    if let Some(n) = env("HEARTH_CUDA_DEQUANT_TOKENS").and_then(|v| v.parse().ok()) {
        backend.set_dequant_tokens(n);
    }
    // HEARTH_CUDA_ATT_WARPS=4|8|16 runs attention on the kernel of
    // a block per query head; HEARTH_CUDA_MV_ROWS=1|2|4 sets the
    // rows a warp of the decode products sweeps together, 0 the
    // persistent kernels of a row a warp (both for comparison).
    if let Some(n) = env("HEARTH_CUDA_ATT_WARPS").and_then(|v| v.parse().ok()) {
        backend.set_attention_warps(n);
    }
    // HEARTH_CUDA_MQ_TOKENS=N: from how many tokens batched decode
    // multiplies on the int8 tensor cores (9; 0 never).
    if let Some(n) = env("HEARTH_CUDA_MQ_TOKENS").and_then(|v| v.parse().ok()) {
        backend.set_mq_tokens(n);
    }
    // HEARTH_CUDA_MQ_SPLITS=N: splits of its k (0: enough to fill
    // the device).
    if let Some(n) = env("HEARTH_CUDA_MQ_SPLITS").and_then(|v| v.parse().ok()) {
        backend.set_mq_splits(n);
    }
    // HEARTH_CUDA_FLASH_ROWS=N: from how many query rows attention
    // runs on the flash kernel (64; 0 never).
    if let Some(n) = env("HEARTH_CUDA_FLASH_ROWS").and_then(|v| v.parse().ok()) {
        backend.set_flash_rows(n);
    }
    if let Some(n) = env("HEARTH_CUDA_MV_ROWS").and_then(|v| v.parse().ok()) {
        backend.set_mv_rows(n);
    }
    // HEARTH_CUDA_BATCHED_UPLOADS=0 fills the expert cache's slots
    // one run of rows at a time (for comparison).
    if env("HEARTH_CUDA_BATCHED_UPLOADS").as_deref() == Some("0") {
        backend.set_batched_uploads(false);
    }
    // HEARTH_CUDA_PREFILL=int8 multiplies prefill on the int8 tiles.
    if env("HEARTH_CUDA_PREFILL").as_deref() == Some("int8") {
        backend.set_prefill_f16(false);
    }
    Ok(backend)
}
