//! Every CUDA kernel file compiles with NVRTC for the architectures the
//! backend targets (A100 sm_80, L4/Ada sm_89, H100/H200 sm_90): this needs
//! NVRTC, not a GPU, so CI runs it (`make setup` fetches NVRTC from PyPI
//! and `make test` sets `LD_LIBRARY_PATH` and `HEARTH_REQUIRE_NVRTC=1`).
//! Without NVRTC the test prints why and checks nothing, unless
//! `HEARTH_REQUIRE_NVRTC=1`.

use hearth_cuda::compile::{compile, compile_verbose, nvrtc_present, nvrtc_version, spills, Arch};
use hearth_cuda::sources::MODULES;

/// Every `.cu` file under `shaders/cuda/` is one of the backend's modules
/// (a new file that is not would never be compiled or loaded).
#[test]
fn every_kernel_file_is_a_module() {
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../shaders/cuda");
    let mut files: Vec<String> = std::fs::read_dir(dir)
        .expect("shaders/cuda")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "cu"))
        .map(|p| p.file_stem().expect("stem").to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut modules: Vec<String> = MODULES.iter().map(|m| m.name.to_string()).collect();
    modules.sort();
    assert_eq!(files, modules, "shaders/cuda/*.cu against sources::MODULES");
}

#[test]
fn every_kernel_compiles_for_each_target_architecture() {
    if !nvrtc_present() {
        let why = "NVRTC (libnvrtc.so) is not on the library path";
        assert!(
            !std::env::var("HEARTH_REQUIRE_NVRTC").is_ok_and(|v| v == "1"),
            "HEARTH_REQUIRE_NVRTC=1 but {why}"
        );
        eprintln!("CUDA compile test not run: {why} (run `make setup`; HEARTH_REQUIRE_NVRTC=1 makes this fail)");
        return;
    }
    let version = nvrtc_version().expect("version");
    let mut spilled = Vec::new();
    for m in MODULES {
        let (name, source) = (m.name, m.source);
        for (major, minor) in [(8, 0), (8, 9), (9, 0)] {
            let arch = Arch { major, minor };
            let (cubin, log) = compile_verbose(name, source, arch)
                .unwrap_or_else(|e| panic!("{name}.cu for {}: {e}", arch.sm()));
            // An ELF image: what the driver loads.
            assert_eq!(&cubin[..4], b"\x7fELF", "{name}.cu for {}", arch.sm());
            // ptxas's report on every kernel: one that spills registers to
            // local memory fails (it would read and write memory in its
            // inner loop).
            assert!(
                log.contains("spill stores"),
                "{name}.cu: no ptxas report in\n{log}"
            );
            spilled.extend(
                spills(&log)
                    .into_iter()
                    .map(|(k, st, ld)| format!("{name}.cu {} {k}: {st} / {ld} bytes", arch.sm())),
            );
        }
        println!("{name}.cu compiles for sm_80, sm_89, sm_90 (NVRTC {version:?})");
    }
    assert!(
        spilled.is_empty(),
        "kernels that spill (stores / loads):\n{}",
        spilled.join("\n")
    );
}

#[test]
fn a_kernel_that_does_not_compile_gives_its_log() {
    if !nvrtc_present() {
        eprintln!("CUDA compile test not run: no NVRTC");
        return;
    }
    let err = compile(
        "broken",
        "extern \"C\" __global__ void k() { undefined_thing(); }",
        Arch { major: 9, minor: 0 },
        None,
    )
    .expect_err("does not compile")
    .to_string();
    assert!(
        err.contains("broken.cu") && err.contains("undefined_thing"),
        "{err}"
    );
}
