//! One module per subcommand.

pub mod backend;
pub mod bench;
pub mod chat;
pub mod info;
pub mod load;
pub mod logits;
pub mod output;
pub mod platform;
pub mod quantize;
pub mod run;
pub mod serve;
pub mod synth;
pub mod tokenize;
pub mod trace;
pub mod tune;
pub mod tune_gpu;

use std::path::Path;

use anyhow::{Context, Result};
use hearth::gguf::{self, GgufModel, MmapSource};

/// Opens a GGUF model (every split when given one of a split model's files),
/// with a message that says what to check when it fails.
pub fn open_model(path: &Path) -> Result<(GgufModel, Vec<MmapSource>)> {
    if !path.exists() {
        anyhow::bail!(
            "{} does not exist; pass the path of a .gguf model file",
            path.display()
        );
    }
    gguf::open_model(path).with_context(|| format!("cannot read {}", path.display()))
}

/// `1234567` -> `1.18 MiB`.
pub fn human_bytes(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.2} {}", UNITS[unit])
    }
}
