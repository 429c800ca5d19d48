//! The backends this build can run models on.

pub use hearth::model::{load_cpu_model, CpuModel, LoadOptions, LoadProgress};

/// Backends compiled into this build, for `--backend`.
pub const BACKENDS: &[&str] = &["cpu"];

/// Checks `--backend NAME` names a backend of this build.
pub fn check_backend(name: &str) -> anyhow::Result<()> {
    if BACKENDS.contains(&name) {
        return Ok(());
    }
    anyhow::bail!(
        "backend `{name}` is not in this build; this build has: {}",
        BACKENDS.join(", ")
    )
}
