//! [`GpuContext`]: one wgpu device and queue with the adapter's
//! [`GpuCaps`], and a sink for the errors wgpu reports out of band.

use std::sync::{Arc, Mutex};

use super::caps::GpuCaps;
use super::GpuError;

/// How to pick and set up the adapter.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuOptions {
    /// Use only an adapter whose name contains this (case-insensitive).
    pub adapter: Option<String>,
    /// Act as if the adapter had no shader-f16 (test the fallbacks).
    pub no_f16: bool,
    /// Act as if the adapter had no subgroups (test the fallbacks).
    pub no_subgroups: bool,
    /// Time every step and, where the adapter has timestamp queries inside
    /// passes, every kernel (see [`WebGpuBackend::profile_report`]); never
    /// on wasm32.
    ///
    /// [`WebGpuBackend::profile_report`]: super::WebGpuBackend::profile_report
    pub profile: bool,
    /// Dispatches per submitted piece of a step (0: one submission per
    /// step; `None`: `HEARTH_GPU_SUBMIT_EVERY` or the default, see
    /// [`WebGpuBackend::set_submit_every`]).
    ///
    /// [`WebGpuBackend::set_submit_every`]: super::WebGpuBackend::set_submit_every
    pub submit_every: Option<usize>,
}

impl GpuOptions {
    /// Options from the environment: `HEARTH_GPU_ADAPTER` (name filter),
    /// `HEARTH_GPU_NO_F16=1`, `HEARTH_GPU_NO_SUBGROUPS=1`,
    /// `HEARTH_PROFILE=gpu`.
    pub fn from_env() -> Self {
        let on = |k: &str| std::env::var(k).is_ok_and(|v| v == "1");
        Self {
            adapter: std::env::var("HEARTH_GPU_ADAPTER").ok(),
            no_f16: on("HEARTH_GPU_NO_F16"),
            no_subgroups: on("HEARTH_GPU_NO_SUBGROUPS"),
            profile: super::profile::enabled(),
            submit_every: None,
        }
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
    /// Dispatches per submitted piece of a step ([`GpuOptions::submit_every`]).
    pub submit_every: Option<usize>,
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
        let profile = opts.profile && !cfg!(target_arch = "wasm32");
        let timestamps =
            profile && super::profile::timestamps_wanted() && adapter.features().contains(ts);
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
            submit_every: opts.submit_every,
        })
    }

    /// A context for tests: `Ok(None)` (after printing why) when there is
    /// no adapter, unless `HEARTH_REQUIRE_GPU=1`, which makes that an error.
    pub async fn for_tests() -> Result<Option<Self>, GpuError> {
        match Self::new(&GpuOptions::from_env()).await {
            Ok(c) => Ok(Some(c)),
            Err(e) if std::env::var("HEARTH_REQUIRE_GPU").is_ok_and(|v| v == "1") => Err(e),
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
