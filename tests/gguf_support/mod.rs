//! Helpers shared by the GGUF integration tests.
#![allow(dead_code)]

use std::path::PathBuf;

/// The crate root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Directory of the synthetic llama.cpp fixtures.
pub fn synthetic_dir() -> PathBuf {
    root().join("tests/fixtures/llamacpp/synthetic")
}

/// Every synthetic model file, sorted by name.
pub fn synthetic_models() -> Vec<PathBuf> {
    let dir = synthetic_dir().join("models");
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "gguf"))
        .collect();
    out.sort();
    assert!(
        out.len() >= 20,
        "expected the synthetic models in {}",
        dir.display()
    );
    out
}

/// A real test model by file name; a missing model fails the test.
pub fn real_model(name: &str) -> PathBuf {
    let dir = std::env::var_os("HEARTH_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| root().join(".cache/models"));
    let path = dir.join(name);
    assert!(
        path.is_file(),
        "real test model {} is missing: run `make setup` (or set HEARTH_MODELS)",
        path.display()
    );
    path
}

/// Reads a whole file.
pub fn read(path: &std::path::Path) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()))
}
