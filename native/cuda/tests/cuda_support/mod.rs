//! What the CUDA model tests share: where the fixtures are and loading a
//! model on the device (or why not).
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use hearth::gguf::open_model;
use hearth::model::{load_model, LoadOptions, Model};
use hearth_cuda::CudaBackend;

/// `tests/fixtures/llamacpp/`, or `HEARTH_FIXTURES` on a machine where the
/// tree lies elsewhere (the GPU host).
pub fn fixtures() -> PathBuf {
    std::env::var_os("HEARTH_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/llamacpp")
        })
}

/// `path` loaded with `opts` on the CUDA backend, or `None` (after printing
/// why) without a device; with `HEARTH_REQUIRE_CUDA=1` a missing device
/// fails the test.
pub fn load_cuda_with(path: &Path, opts: &LoadOptions) -> Option<Model<CudaBackend>> {
    let backend = match CudaBackend::new(0) {
        Ok(b) => b,
        Err(e) if std::env::var("HEARTH_REQUIRE_CUDA").is_ok_and(|v| v == "1") => {
            panic!("HEARTH_REQUIRE_CUDA=1 but {e}")
        }
        Err(e) => {
            eprintln!("CUDA test not run: {e} (set HEARTH_REQUIRE_CUDA=1 to make this fail)");
            return None;
        }
    };
    let (model, sources) = open_model(path).expect("open model");
    let m = pollster::block_on(load_model(backend, &model, &sources, opts, &mut |_| {}))
        .unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
    Some(m)
}
