//! Shared helpers for the tokenizer tests: locating models and fixtures, loading tokenizers.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use hearth::model::tokenizer::Tokenizer;
use serde_json::Value;

/// `tests/fixtures/llamacpp`.
pub fn llamacpp_fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llamacpp")
}

/// Where the real models live: `$HEARTH_MODELS`, else `<repo>/.cache/models`.
pub fn models_dir() -> PathBuf {
    match std::env::var_os("HEARTH_MODELS") {
        Some(d) => PathBuf::from(d),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join(".cache/models"),
    }
}

/// The tokenizer of the GGUF file at `path`; a missing file fails the test with a hint.
pub fn load_tokenizer(path: &Path) -> Tokenizer {
    assert!(
        path.exists(),
        "model {} not found: run `make setup` (or set HEARTH_MODELS)",
        path.display()
    );
    let (file, _src) =
        hearth::gguf::open_path(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_metadata(&file.metadata).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Parses a JSON fixture.
pub fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Lowercase hex of bytes, as the fixtures store them.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Bytes from fixture hex.
pub fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| {
            u8::from_str_radix(&s[i..i + 2], 16).unwrap_or_else(|e| panic!("bad hex {s:?}: {e}"))
        })
        .collect()
}

/// A JSON array of ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap_or_else(|| panic!("expected an id array, got {v}"))
        .iter()
        .map(|x| x.as_u64().unwrap_or_else(|| panic!("bad id {x}")) as u32)
        .collect()
}
