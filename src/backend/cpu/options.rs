//! [`CpuOptions`]: how the CPU backend runs, as typed settings. The library
//! reads no environment: the CLI (and tests, and the examples) build these
//! with [`CpuOptions::from_settings`] from the `HEARTH_*` variables, the
//! browser facade from its load options.

use super::kernels::{Isa, KernelTable};

/// The worker pool the CPU backend runs its kernels on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum PoolKind {
    /// The purpose-built pool (spinning workers; see [`super::threads`]).
    #[default]
    Own,
    /// rayon's (a pool of its own natively; rayon's global pool in the
    /// threaded wasm build).
    Rayon,
}

/// What the CPU backend's profiling times ops with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum CpuProfile {
    /// No profiling.
    #[default]
    Off,
    /// Wall-clock time per op (`HEARTH_PROFILE=1`).
    Wall,
    /// The calling thread's CPU time per op (`HEARTH_PROFILE=cpu`), which a
    /// shared machine disturbs less.
    CpuClock,
}

/// How the CPU backend runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuOptions {
    /// Worker threads (0: one per core).
    pub threads: usize,
    /// The kernels' ISA (`None`: the fastest this CPU has; one it lacks
    /// falls back to that too).
    pub isa: Option<Isa>,
    /// Whether the fused ops of steps of several tokens run fused (natively
    /// the default; results are the same bit for bit either way).
    pub fusion: bool,
    /// The scalar attention instead of the ISA's (for comparisons).
    pub scalar_attention: bool,
    /// Weights, K/V cache and step buffers in large pages where the OS has
    /// them (for comparisons: off).
    pub large_pages: bool,
    /// The worker pool.
    pub pool: PoolKind,
    /// Per-op timings, printed when the backend drops.
    pub profile: CpuProfile,
}

impl Default for CpuOptions {
    fn default() -> Self {
        Self {
            threads: 0,
            isa: None,
            // Off in the browser build, where it was never measured faster.
            fusion: cfg!(not(target_arch = "wasm32")),
            scalar_attention: false,
            large_pages: true,
            pool: PoolKind::Own,
            profile: CpuProfile::Off,
        }
    }
}

impl CpuOptions {
    /// The defaults on `threads` threads (0: one per core).
    pub fn with_threads(threads: usize) -> Self {
        Self {
            threads,
            ..Self::default()
        }
    }

    /// Options from settings named as the environment variables the CLI
    /// reads (`get(name)` is a variable's value), on `threads` threads:
    /// `HEARTH_CPU_ISA=scalar|avx2|avx512|neon|simd128`, `HEARTH_FUSE=0`,
    /// `HEARTH_ATTN=scalar`, `HEARTH_LARGE_PAGES=0`, `HEARTH_POOL=rayon`,
    /// `HEARTH_PROFILE=1|cpu`. Returns the options and a warning for each
    /// setting it could not honour (and ignored), such as an ISA this CPU
    /// lacks.
    pub fn from_settings(
        threads: usize,
        get: impl Fn(&str) -> Option<String>,
    ) -> (Self, Vec<String>) {
        let mut warnings = Vec::new();
        let request = get("HEARTH_CPU_ISA");
        let (table, warning) = KernelTable::for_request(request.as_deref());
        warnings.extend(warning);
        let isa = request
            .filter(|r| !r.trim().is_empty())
            .map(|_| table.isa());
        let is = |k: &str, v: &str| get(k).is_some_and(|x| x == v);
        let profile = match get("HEARTH_PROFILE").as_deref() {
            Some("1") => CpuProfile::Wall,
            Some("cpu") => CpuProfile::CpuClock,
            _ => CpuProfile::Off,
        };
        let defaults = Self::default();
        let opts = Self {
            threads,
            isa,
            fusion: defaults.fusion && !is("HEARTH_FUSE", "0"),
            scalar_attention: is("HEARTH_ATTN", "scalar"),
            large_pages: !is("HEARTH_LARGE_PAGES", "0"),
            pool: if is("HEARTH_POOL", "rayon") {
                PoolKind::Rayon
            } else {
                PoolKind::Own
            },
            profile,
        };
        (opts, warnings)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            pairs
                .iter()
                .find(|(name, _)| *name == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn settings_map_to_options() {
        let (o, w) = CpuOptions::from_settings(3, settings(&[]));
        assert_eq!(o, CpuOptions::with_threads(3));
        assert!(w.is_empty());
        let pairs = [
            ("HEARTH_CPU_ISA", "scalar"),
            ("HEARTH_FUSE", "0"),
            ("HEARTH_ATTN", "scalar"),
            ("HEARTH_LARGE_PAGES", "0"),
            ("HEARTH_POOL", "rayon"),
            ("HEARTH_PROFILE", "cpu"),
        ];
        let (o, w) = CpuOptions::from_settings(1, settings(&pairs));
        assert!(w.is_empty(), "{w:?}");
        assert_eq!(o.isa, Some(Isa::Scalar));
        assert!(!o.fusion && o.scalar_attention && !o.large_pages);
        assert_eq!((o.pool, o.profile), (PoolKind::Rayon, CpuProfile::CpuClock));
    }

    #[test]
    fn an_unknown_isa_warns_and_keeps_the_fastest() {
        let (o, w) = CpuOptions::from_settings(1, settings(&[("HEARTH_CPU_ISA", "sse9")]));
        assert_eq!(o.isa, Some(Isa::best()));
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("sse9"), "{w:?}");
    }
}
