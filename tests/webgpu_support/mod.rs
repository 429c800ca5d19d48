//! Shared helpers of the WebGPU tests: the device (or why there is none)
//! and a runner that executes the same ops on the CPU and the GPU.
#![allow(dead_code)]

use hearth::backend::cpu::CpuBackend;
use hearth::backend::webgpu::{GpuContext, WebGpuBackend};
use hearth::graph::{KvCacheConfig, KvType};

// The backend-neutral op cases, shared with the CUDA backend's tests.
#[path = "../op_cases/mod.rs"]
mod op_cases;
pub use op_cases::*;

/// The WebGPU backend, or `None` (after printing why) when there is no
/// adapter; with `HEARTH_REQUIRE_GPU=1` a missing adapter fails the test.
pub fn gpu() -> Option<WebGpuBackend> {
    let ctx = pollster::block_on(GpuContext::for_tests())
        .unwrap_or_else(|e| panic!("HEARTH_REQUIRE_GPU=1 but {e}"));
    ctx.map(|c| {
        println!("adapter: {}", c.caps);
        WebGpuBackend::new(c)
    })
}

/// Runs `case` on the CPU and on `gpu`; returns (cpu, gpu) outputs.
pub fn both(gpu: &mut WebGpuBackend, case: &Case) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut cpu = CpuBackend::new(1);
    (run(&mut cpu, case), run(gpu, case))
}

use std::path::Path;

use hearth::backend::webgpu::GpuOptions;
use hearth::gguf::open_model;
use hearth::model::{load_model, Batch, LoadOptions, LogitsWanted, Model, SeqInput};

/// A model on the WebGPU backend.
pub type GpuModel = Model<WebGpuBackend>;

/// The WebGPU options of the `HEARTH_GPU_*` environment, as the CLI reads them.
pub fn gpu_options() -> GpuOptions {
    let (opts, warnings) = GpuOptions::from_settings(|k| std::env::var(k).ok());
    for w in warnings {
        eprintln!("{w}");
    }
    opts
}

/// The block size and block tables of the CPU model tests, shared.
pub use crate::model_support::{slots, table, BLOCK};

/// Loads `path` on the WebGPU backend, or `None` when there is no adapter
/// (an error with `HEARTH_REQUIRE_GPU=1`).
pub fn load_gpu(path: &Path, dtype: KvType, num_blocks: usize) -> Option<GpuModel> {
    load_gpu_with(path, dtype, num_blocks, &gpu_options())
}

/// [`load_gpu`] with device options `gpu_opts`.
pub fn load_gpu_with(
    path: &Path,
    dtype: KvType,
    num_blocks: usize,
    gpu_opts: &GpuOptions,
) -> Option<GpuModel> {
    let opts = LoadOptions::new(KvCacheConfig {
        num_blocks,
        block_size: BLOCK,
        dtype,
    });
    load_gpu_opts(path, &opts, gpu_opts)
}

/// [`load_gpu`] with load options `opts` and device options `gpu_opts`.
pub fn load_gpu_opts(path: &Path, opts: &LoadOptions, gpu_opts: &GpuOptions) -> Option<GpuModel> {
    gpu()?;
    let (model, sources) = open_model(path).expect("open model");
    let mut last = None;
    let m = pollster::block_on(async {
        let ctx = GpuContext::new(gpu_opts)
            .await
            .map_err(hearth::backend::BackendError::from)?;
        load_model(WebGpuBackend::new(ctx), &model, &sources, opts, &mut |p| {
            last = Some(*p)
        })
        .await
    })
    .unwrap_or_else(|e| panic!("load {}: {e}", path.display()));
    let p = last.expect("progress reported");
    assert_eq!(
        (p.bytes_done, p.tensors_done),
        (p.bytes_total, p.tensors_total)
    );
    Some(m)
}

/// Runs `ids` as one sequence from position 0 in blocks 1.. and returns the logits.
pub fn run_all_gpu(m: &mut GpuModel, ids: &[u32], wanted: LogitsWanted) -> Vec<f32> {
    let t = table(1, ids.len());
    let s = slots(&t, 0, ids.len());
    let seqs = [SeqInput {
        tokens: ids,
        start: 0,
        slots: &s,
        block_table: &t,
        logits: wanted,
    }];
    pollster::block_on(m.run(&Batch { seqs: &seqs })).expect("forward")
}

/// Prefills `prompt` as one sequence (blocks 1..), then decodes `next` one
/// token per step; returns each decode step's logits, concatenated.
pub fn decode<M: hearth::model::ForwardModel>(m: &mut M, prompt: &[u32], next: &[u32]) -> Vec<f32> {
    let total = prompt.len() + next.len();
    let tbl = table(1, total);
    let mut out = Vec::new();
    let mut run = |tokens: &[u32], start: usize, logits| {
        let sl = slots(&tbl, start, tokens.len());
        let seq = [SeqInput {
            tokens,
            start,
            slots: &sl,
            block_table: &tbl,
            logits,
        }];
        pollster::block_on(m.forward(&Batch { seqs: &seq })).expect("forward")
    };
    run(prompt, 0, LogitsWanted::None);
    for (i, &t) in next.iter().enumerate() {
        out.extend(run(&[t], prompt.len() + i, LogitsWanted::Last));
    }
    out
}
