//! The per-device tune store: where a choice depends on the device (the
//! CPU's kernel tier, a GPU kernel's rows per workgroup, a tile size), a
//! [`Probe`] at load times the candidates, after checking each one's
//! output against the reference, and records the winner in a
//! [`TuneStore`]; the next load on the same machine reads it back and runs
//! no probe.
//!
//! Records are keyed by the device and the build of the kernels they
//! measured ([`TuneKey`]), so a store copied to another machine, or kept
//! across an upgrade, is ignored rather than believed. The core owns no
//! files and no clock: the bytes live behind [`Store`] (a file under the
//! user's cache directory in the CLI) and times come from a [`Clock`].
//!
//! [`cpu`] holds the CPU backend's probe: which kernel tier runs the
//! model's matrix products.

pub mod cpu;
mod key;
mod probe;
mod store;

pub use key::{build_id, TuneKey};
pub use probe::{Candidate, Clock, Probe, RunResult};
pub use store::{Measured, MemoryStore, Record, Store, Stored, TuneStore, STORE_FORMAT};

use thiserror::Error;

/// What can go wrong tuning.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TuneError {
    /// The stored document could not be read as a store.
    #[error(
        "the tune store is not readable ({0}); delete it or run `hearth tune` to write a new one"
    )]
    Corrupt(String),
    /// Reading or writing the store's bytes failed.
    #[error("the tune store at {place} could not be {action}: {detail}; check its permissions, pass --tune-dir DIR, or set HEARTH_TUNE_DIR=off")]
    Io {
        /// Where the store is.
        place: String,
        /// `read` or `written`.
        action: &'static str,
        /// The cause.
        detail: String,
    },
    /// Every candidate of a probe was excluded.
    #[error(
        "tune probe {probe}: no candidate matched the reference ({reasons}); the defaults are used"
    )]
    NoValidCandidate {
        /// The probe.
        probe: String,
        /// Each candidate's reason.
        reasons: String,
    },
    /// The probe could not build its work.
    #[error("tune probe {probe}: {detail}")]
    Setup {
        /// The probe.
        probe: String,
        /// What failed.
        detail: String,
    },
}

#[cfg(test)]
mod tests;
