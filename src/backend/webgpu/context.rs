//! [`GpuContext`]: one wgpu device and queue with the adapter's
//! [`GpuCaps`], and a sink for the errors wgpu reports out of band.

use std::sync::{Arc, Mutex};

use super::caps::GpuCaps;
use super::quant::KernelConfig;
use super::GpuError;

/// What profiling of the WebGPU backend records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum GpuProfile {
    /// None.
    #[default]
    Off,
    /// Every step and, where the adapter has timestamp queries inside
    /// passes, every kernel (`HEARTH_PROFILE=gpu`).
    Full,
    /// The host and the wait alone, with the steps' command buffers
    /// exactly as unprofiled (`HEARTH_PROFILE=gpu-host`).
    HostOnly,
    /// Every kernel's timestamps, for the [`trace`](crate::trace) alone:
    /// nothing printed (the CLI's `--trace`).
    Trace,
}

/// How to pick and set up the adapter, and how the backend runs on it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuOptions {
    /// Use only an adapter whose name contains this (case-insensitive).
    pub adapter: Option<String>,
    /// Act as if the adapter had no shader-f16 (test the fallbacks).
    pub no_f16: bool,
    /// Act as if the adapter had no subgroups (test the fallbacks).
    pub no_subgroups: bool,
    /// Profiling (see [`WebGpuBackend::profile_report`]); never on wasm32.
    ///
    /// [`WebGpuBackend::profile_report`]: super::WebGpuBackend::profile_report
    pub profile: GpuProfile,
    /// Dispatches per submitted piece of a step (0: one submission per
    /// step; `None`: [`DEFAULT_SUBMIT_EVERY`](super::backend::DEFAULT_SUBMIT_EVERY),
    /// see [`WebGpuBackend::set_submit_every`]).
    ///
    /// [`WebGpuBackend::set_submit_every`]: super::WebGpuBackend::set_submit_every
    pub submit_every: Option<usize>,
    /// Keys per span of split-context decode attention (`None`: the
    /// default; see [`WebGpuBackend::set_attention_split`]).
    ///
    /// [`WebGpuBackend::set_attention_split`]: super::WebGpuBackend::set_attention_split
    pub attention_split: Option<u32>,
    /// The weight kernels' tuning (adjusted to the adapter's limits).
    pub kernels: KernelConfig,
    /// The device's memory in bytes, which WebGPU does not report: a model
    /// that needs more fails before it loads (`None`: only the adapter's
    /// per-buffer limits are checked).
    pub memory_budget: Option<u64>,
}

impl GpuOptions {
    /// Options from settings named as the environment variables the CLI
    /// reads (`get(name)` is a variable's value): `HEARTH_GPU_ADAPTER`
    /// (name filter), `HEARTH_GPU_NO_F16=1`, `HEARTH_GPU_NO_SUBGROUPS=1`,
    /// `HEARTH_PROFILE=gpu|gpu-host`, `HEARTH_GPU_SUBMIT_EVERY=N`,
    /// `HEARTH_GPU_ATTN_SPLIT=KEYS`, `HEARTH_WEBGPU_KERNELS=key=value,...`
    /// ([`KernelConfig::with_overrides`]) and `HEARTH_GPU_MEMORY=BYTES`
    /// (or `24G`, `512M`). Returns the options and a warning for each
    /// setting it could not read (and ignored).
    pub fn from_settings(get: impl Fn(&str) -> Option<String>) -> (Self, Vec<String>) {
        let mut warnings = Vec::new();
        let on = |k: &str| get(k).is_some_and(|v| v == "1");
        let profile = match get("HEARTH_PROFILE").as_deref() {
            Some("gpu") => GpuProfile::Full,
            Some("gpu-host") => GpuProfile::HostOnly,
            _ => GpuProfile::Off,
        };
        let mut number = |k: &str| -> Option<u64> {
            let v = get(k)?;
            let n = v.trim().parse().ok();
            if n.is_none() {
                warnings.push(format!("{k}={v} is not a whole number; ignored"));
            }
            n
        };
        let submit_every = number("HEARTH_GPU_SUBMIT_EVERY").map(|n| n as usize);
        let attention_split = number("HEARTH_GPU_ATTN_SPLIT").map(|n| n as u32);
        let kernels = match get("HEARTH_WEBGPU_KERNELS") {
            Some(spec) => {
                let (k, w) = KernelConfig::with_overrides(&spec);
                warnings.extend(w.into_iter().map(|w| format!("HEARTH_WEBGPU_KERNELS: {w}")));
                k
            }
            None => KernelConfig::default(),
        };
        let memory_budget = get("HEARTH_GPU_MEMORY").and_then(|v| {
            let b = super::memory::parse_bytes(&v);
            if b.is_none() {
                warnings.push(format!(
                    "HEARTH_GPU_MEMORY={v} is not a size (bytes, or 24G, 512M); ignored"
                ));
            }
            b
        });
        let opts = Self {
            adapter: get("HEARTH_GPU_ADAPTER"),
            no_f16: on("HEARTH_GPU_NO_F16"),
            no_subgroups: on("HEARTH_GPU_NO_SUBGROUPS"),
            profile,
            submit_every,
            attention_split,
            kernels,
            memory_budget,
        };
        (opts, warnings)
    }
}

/// Validation and out-of-memory errors wgpu reports through the device's
/// callback rather than a return value; checked after each submission.
#[derive(Debug, Clone, Default)]
pub struct ErrorSink(Arc<Mutex<Vec<String>>>);

impl ErrorSink {
    /// Adds an error found outside wgpu's callback.
    pub fn push(&self, e: String) {
        match self.0.lock() {
            Ok(mut v) => v.push(e),
            Err(p) => p.into_inner().push(e),
        }
    }

    /// Takes the errors reported so far.
    pub fn take(&self) -> Vec<String> {
        match self.0.lock() {
            Ok(mut v) => std::mem::take(&mut *v),
            Err(p) => std::mem::take(&mut *p.into_inner()),
        }
    }

    /// The errors so far as one [`GpuError`], if any.
    pub fn check(&self, during: &str) -> Result<(), GpuError> {
        let errs = self.take();
        if errs.is_empty() {
            return Ok(());
        }
        Err(GpuError::Device {
            during: during.to_string(),
            detail: errs.join("; "),
        })
    }
}

/// A device, its queue and what it can do.
#[derive(Debug, Clone)]
pub struct GpuContext {
    /// The device.
    pub device: wgpu::Device,
    /// Its queue.
    pub queue: wgpu::Queue,
    /// What kernels may use.
    pub caps: GpuCaps,
    /// Errors wgpu reported out of band.
    pub errors: ErrorSink,
    /// Profiling asked for ([`GpuOptions::profile`]; never on wasm32).
    pub profile: bool,
    /// Timestamp queries inside passes are enabled (only when profiling
    /// and the adapter has them).
    pub timestamps: bool,
    /// The options the context was opened with.
    pub options: GpuOptions,
}

impl GpuContext {
    /// Opens the best adapter (a discrete GPU over an integrated one over a
    /// CPU rasterizer), requesting shader-f16 and subgroups when present.
    ///
    /// Fails with [`GpuError::NoAdapter`] saying why when there is none.
    pub async fn new(opts: &GpuOptions) -> Result<Self, GpuError> {
        let adapter = pick_adapter(opts).await?;
        let mut caps = GpuCaps::from_adapter(&adapter);
        if opts.no_f16 {
            caps = caps.without_f16();
        }
        if opts.no_subgroups {
            caps = caps.without_subgroups();
        }
        let ts = super::profile::timestamp_features();
        let profile = opts.profile != GpuProfile::Off && !cfg!(target_arch = "wasm32");
        let timestamps = matches!(opts.profile, GpuProfile::Full | GpuProfile::Trace)
            && profile
            && adapter.features().contains(ts);
        let mut features = caps.features();
        if timestamps {
            features |= ts;
        }
        let desc = wgpu::DeviceDescriptor {
            label: Some("hearth"),
            required_features: features,
            required_limits: caps.limits(&adapter.limits()),
            experimental_features: wgpu::ExperimentalFeatures::disabled(),
            memory_hints: wgpu::MemoryHints::Performance,
            trace: wgpu::Trace::Off,
        };
        let (device, queue) =
            adapter
                .request_device(&desc)
                .await
                .map_err(|e| GpuError::NoAdapter {
                    reason: format!("{} refused a device: {e}", caps.adapter_name),
                })?;
        let errors = ErrorSink::default();
        let sink = errors.clone();
        device.on_uncaptured_error(Arc::new(move |e: wgpu::Error| {
            if let Ok(mut v) = sink.0.lock() {
                v.push(e.to_string());
            }
        }));
        Ok(Self {
            device,
            queue,
            caps,
            errors,
            profile,
            timestamps,
            options: opts.clone(),
        })
    }

    /// A context for tests, with the options of `HEARTH_GPU_*` as
    /// [`GpuOptions::from_settings`] reads them: `Ok(None)` (after printing
    /// why) when there is no adapter, unless `HEARTH_REQUIRE_GPU=1`, which
    /// makes that an error. Tests only: the library itself reads no
    /// environment.
    #[doc(hidden)]
    pub async fn for_tests() -> Result<Option<Self>, GpuError> {
        let env = |k: &str| std::env::var(k).ok();
        let (opts, warnings) = GpuOptions::from_settings(env);
        for w in warnings {
            eprintln!("{w}");
        }
        match Self::new(&opts).await {
            Ok(c) => Ok(Some(c)),
            Err(e) if env("HEARTH_REQUIRE_GPU").is_some_and(|v| v == "1") => Err(e),
            Err(e) => {
                eprintln!("WebGPU test not run: {e} (set HEARTH_REQUIRE_GPU=1 to make this fail)");
                Ok(None)
            }
        }
    }
}

/// The adapter to use: the first match of `opts.adapter`, else the
/// instance's high-performance choice.
async fn pick_adapter(opts: &GpuOptions) -> Result<wgpu::Adapter, GpuError> {
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor {
        backends: wgpu::Backends::from_env().unwrap_or(wgpu::Backends::all()),
        ..wgpu::InstanceDescriptor::new_without_display_handle()
    });
    if let Some(want) = &opts.adapter {
        let want = want.to_lowercase();
        let all = instance.enumerate_adapters(wgpu::Backends::all()).await;
        let names: Vec<String> = all.iter().map(|a| a.get_info().name).collect();
        return all
            .into_iter()
            .find(|a| a.get_info().name.to_lowercase().contains(&want))
            .ok_or_else(|| GpuError::NoAdapter {
                reason: format!("no adapter named like '{want}' among {names:?}"),
            });
    }
    instance
        .request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            force_fallback_adapter: false,
            compatible_surface: None,
            apply_limit_buckets: false,
        })
        .await
        .map_err(|e| GpuError::NoAdapter {
            reason: format!(
                "{e}; natively install a Vulkan driver (Debian: `apt-get install mesa-vulkan-drivers libvulkan1`, or `make setup`), in a browser enable WebGPU"
            ),
        })
}
