//! What the commands that write models share: a thread count, a progress bar
//! over bytes, and writing beside the destination so a failed run leaves no
//! half file.

use std::path::Path;

use anyhow::{Context, Result};
use indicatif::{ProgressBar, ProgressStyle};

/// Sets rayon's global pool to `threads` workers (all cores when `None`).
pub fn set_threads(threads: Option<usize>) {
    if let Some(n) = threads {
        // Fails only when the pool already exists, which then keeps its size.
        rayon::ThreadPoolBuilder::new()
            .num_threads(n)
            .build_global()
            .ok();
    }
}

/// A progress bar on stderr over `total` bytes, naming the current tensor.
pub fn byte_progress(total: u64) -> ProgressBar {
    ProgressBar::new(total).with_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {bytes_per_sec} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    )
}

/// Runs `write` on `path` + `.partial`, then renames the result to `path`;
/// on failure removes the partial file. Returns the size written.
pub fn write_atomically(path: &Path, write: impl FnOnce(&Path) -> Result<()>) -> Result<u64> {
    let tmp = path.with_extension("gguf.partial");
    if let Err(err) = write(&tmp) {
        std::fs::remove_file(&tmp).ok();
        return Err(err);
    }
    std::fs::rename(&tmp, path)
        .with_context(|| format!("cannot move the result to {}", path.display()))?;
    Ok(std::fs::metadata(path).map(|m| m.len()).unwrap_or(0))
}
