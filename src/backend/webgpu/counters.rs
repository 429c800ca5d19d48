//! [`GpuCounters`]: the host-side work of the WebGPU backend, counted so
//! that per-step overhead (buffers and bind groups created, submissions,
//! readbacks) is visible and testable without timing a GPU.
//!
//! With `HEARTH_PROFILE=gpu` the backend prints, after each step, what the
//! step did since the previous one, with its timings (`profile` module).

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

/// Counts of host-side work, since the backend was created.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GpuCounters {
    /// Compute dispatches encoded.
    pub dispatches: u64,
    /// Queue submissions.
    pub submits: u64,
    /// Device buffers created (weights, activations, uniforms, staging).
    pub buffers_created: u64,
    /// Bind groups created.
    pub bind_groups_created: u64,
    /// Host-to-device writes (`queue.write_buffer`).
    pub uploads: u64,
    /// Buffers mapped for reading back.
    pub readbacks: u64,
}

impl GpuCounters {
    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &GpuCounters) -> GpuCounters {
        GpuCounters {
            dispatches: self.dispatches - earlier.dispatches,
            submits: self.submits - earlier.submits,
            buffers_created: self.buffers_created - earlier.buffers_created,
            bind_groups_created: self.bind_groups_created - earlier.bind_groups_created,
            uploads: self.uploads - earlier.uploads,
            readbacks: self.readbacks - earlier.readbacks,
        }
    }
}

impl fmt::Display for GpuCounters {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} dispatches, {} submits, {} buffers created, {} bind groups created, {} uploads, {} readbacks",
            self.dispatches,
            self.submits,
            self.buffers_created,
            self.bind_groups_created,
            self.uploads,
            self.readbacks
        )
    }
}

/// What is counted, shared by the backend and the futures it returns.
#[derive(Debug, Default)]
pub struct Counters {
    dispatches: AtomicU64,
    submits: AtomicU64,
    buffers_created: AtomicU64,
    bind_groups_created: AtomicU64,
    uploads: AtomicU64,
    readbacks: AtomicU64,
    /// The snapshot of the last profile line, when profiling.
    last: std::sync::Mutex<GpuCounters>,
}

/// One counted event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// `n` dispatches encoded.
    Dispatches(u64),
    /// A submission.
    Submit,
    /// A buffer created.
    Buffer,
    /// A bind group created.
    BindGroup,
    /// A write into a buffer.
    Upload,
    /// A buffer mapped for reading.
    Readback,
}

impl Counters {
    /// Counts `e`.
    pub fn add(&self, e: Event) {
        let (cell, n) = match e {
            Event::Dispatches(n) => (&self.dispatches, n),
            Event::Submit => (&self.submits, 1),
            Event::Buffer => (&self.buffers_created, 1),
            Event::BindGroup => (&self.bind_groups_created, 1),
            Event::Upload => (&self.uploads, 1),
            Event::Readback => (&self.readbacks, 1),
        };
        cell.fetch_add(n, Ordering::Relaxed);
    }

    /// The counts so far.
    pub fn snapshot(&self) -> GpuCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        GpuCounters {
            dispatches: get(&self.dispatches),
            submits: get(&self.submits),
            buffers_created: get(&self.buffers_created),
            bind_groups_created: get(&self.bind_groups_created),
            uploads: get(&self.uploads),
            readbacks: get(&self.readbacks),
        }
    }

    /// What happened since the last call, as one line.
    pub fn step_line(&self) -> String {
        let now = self.snapshot();
        let mut last = match self.last.lock() {
            Ok(l) => l,
            Err(p) => p.into_inner(),
        };
        let line = now.since(&last).to_string();
        *last = now;
        line
    }
}
