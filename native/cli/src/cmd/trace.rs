//! `--trace FILE` (`HEARTH_TRACE`): a Perfetto trace of the whole command.

use std::path::Path;

use anyhow::{Context, Result};
use hearth::engine::Clock;
use hearth::trace;

/// Starts recording, on the system's monotonic clock.
pub fn start() {
    trace::start(Clock::system());
}

/// Whether a trace is being recorded (the WebGPU backend then times its
/// kernels for it).
pub fn on() -> bool {
    trace::on()
}

/// Stops recording and writes the trace to `path`, saying where on stderr.
pub fn finish(path: &Path) -> Result<()> {
    let Some(recorded) = trace::stop() else {
        return Ok(());
    };
    let bytes = recorded.to_perfetto();
    std::fs::write(path, &bytes).with_context(|| {
        format!(
            "cannot write the trace to {}; pass --trace a path in a writable directory",
            path.display()
        )
    })?;
    let dropped = if recorded.dropped > 0 {
        format!(
            " ({} events past the first {} were not kept)",
            recorded.dropped,
            trace::MAX_EVENTS
        )
    } else {
        String::new()
    };
    eprintln!(
        "trace: {} spans, {} KiB in {}{dropped}; open it at https://ui.perfetto.dev",
        recorded.spans.len(),
        bytes.len().div_ceil(1024),
        path.display()
    );
    Ok(())
}
