//! The row kernels on a CUDA device against `hearth::graph::reference`,
//! on fresh random data. Without a device the test prints why and checks
//! nothing, unless `HEARTH_REQUIRE_CUDA=1` (what the device script sets),
//! which makes a missing device fail. (`HEARTH_REQUIRE_GPU=1` is CI's,
//! for WebGPU on lavapipe, where no CUDA device exists.)

// The core's test data generator (SplitMix64), shared rather than copied.
#[path = "../../../tests/model_support/rng.rs"]
#[allow(dead_code)]
mod rng;

use cudarc::driver::{LaunchConfig, PushKernelArg};
use cudarc::nvrtc::Ptx;
use hearth_cuda::{compile, sources::ROWOPS, CudaDevice};

fn device() -> Option<CudaDevice> {
    match CudaDevice::open(0) {
        Ok(d) => Some(d),
        Err(e) if std::env::var("HEARTH_REQUIRE_CUDA").is_ok_and(|v| v == "1") => {
            panic!("HEARTH_REQUIRE_CUDA=1 but {e}")
        }
        Err(e) => {
            eprintln!("CUDA test not run: {e} (set HEARTH_REQUIRE_CUDA=1 to make this fail)");
            None
        }
    }
}

/// Values in -2..2, fresh for each seed.
fn random(n: usize, seed: u64) -> Vec<f32> {
    let mut rng = rng::Rng::new(seed);
    (0..n).map(|_| rng.uniform() * 4.0 - 2.0).collect()
}

#[test]
fn rms_norm_matches_the_reference() {
    let Some(dev) = device() else {
        return;
    };
    let cache = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("cuda-cache");
    let started = std::time::Instant::now();
    let cubin = compile(ROWOPS.name, ROWOPS.source, dev.arch, Some(&cache)).expect("compile");
    let first = started.elapsed();
    let again = std::time::Instant::now();
    let cached = compile(ROWOPS.name, ROWOPS.source, dev.arch, Some(&cache)).expect("cached");
    assert_eq!(cubin, cached, "the cache gave another cubin");
    println!(
        "{}: rowops.cu compiled for {} in {first:?}, from the cache in {:?}",
        dev.name,
        dev.arch.sm(),
        again.elapsed()
    );
    let module = dev.ctx.load_module(Ptx::from_binary(cubin)).expect("load");
    let f = module.load_function("rms_norm_f32").expect("function");
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    for (rows, width) in [(1, 576), (7, 2048), (3, 100), (2, 4096)] {
        let x = random(rows * width, seed ^ width as u64);
        let w = random(width, seed ^ 0x5eed ^ rows as u64);
        let eps = 1e-6f32;
        let mut want = x.clone();
        hearth::graph::reference::rms_norm(&mut want, &w, eps);
        let dx = dev.stream.clone_htod(&x).expect("x");
        let dw = dev.stream.clone_htod(&w).expect("w");
        let mut dy = dev.stream.alloc_zeros::<f32>(x.len()).expect("y");
        let cfg = LaunchConfig {
            grid_dim: (rows as u32, 1, 1),
            block_dim: (256, 1, 1),
            shared_mem_bytes: 0,
        };
        let width_arg = width as u32;
        let mut launch = dev.stream.launch_builder(&f);
        launch
            .arg(&dx)
            .arg(&dw)
            .arg(&mut dy)
            .arg(&width_arg)
            .arg(&eps);
        // SAFETY: the arguments are those of rms_norm_f32, and the buffers
        // hold rows x width values.
        unsafe { launch.launch(cfg) }.expect("launch");
        let got = dev.stream.clone_dtoh(&dy).expect("y back");
        for (i, (g, r)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - r).abs() <= 1e-5 * (1.0 + r.abs()),
                "seed {seed} rows {rows} width {width} at {i}: {g} against {r}"
            );
        }
    }
}
