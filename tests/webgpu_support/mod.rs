//! Shared helpers of the WebGPU tests: the device (or why there is none)
//! and a runner that executes the same ops on the CPU and the GPU.
#![allow(dead_code)]

use hearth::backend::cpu::CpuBackend;
use hearth::backend::webgpu::{GpuContext, WebGpuBackend};
use hearth::backend::{Backend, BufKind, OpIo};
use hearth::graph::Op;
use hearth::graph::{KvCacheConfig, KvType};

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

/// A buffer of a case: initial bytes (zeroes when `init` is empty and
/// `bytes` > 0) and its kind.
pub struct Buf {
    pub init: Vec<u8>,
    pub bytes: u64,
    pub kind: BufKind,
}

pub fn f32_buf(v: &[f32]) -> Buf {
    Buf {
        init: bytemuck::cast_slice(v).to_vec(),
        bytes: (v.len() * 4) as u64,
        kind: BufKind::Activations,
    }
}

pub fn u32_buf(v: &[u32]) -> Buf {
    Buf {
        init: bytemuck::cast_slice(v).to_vec(),
        bytes: (v.len() * 4) as u64,
        kind: BufKind::Activations,
    }
}

pub fn zeros(bytes: usize, kind: BufKind) -> Buf {
    Buf {
        init: Vec::new(),
        bytes: bytes as u64,
        kind,
    }
}

pub fn bytes_buf(b: &[u8], kind: BufKind) -> Buf {
    Buf {
        init: b.to_vec(),
        bytes: b.len() as u64,
        kind,
    }
}

/// Ops over a table of buffers; `read`: the buffers compared after.
pub struct Case {
    pub bufs: Vec<Buf>,
    pub steps: Vec<(Op, Vec<usize>, Vec<usize>)>,
    pub read: Vec<usize>,
}

/// Runs `case` on `b`, returning the bytes of each `read` buffer.
pub fn run<B: Backend>(b: &mut B, case: &Case) -> Vec<Vec<u8>> {
    let bufs: Vec<B::Buffer> = case
        .bufs
        .iter()
        .map(|d| {
            let buf = b.alloc(d.bytes, d.kind).expect("alloc");
            if !d.init.is_empty() {
                b.upload(&buf, 0, &d.init).expect("upload");
            }
            buf
        })
        .collect();
    for (op, ins, outs) in &case.steps {
        assert!(b.supports(op), "{op:?} unsupported");
        let inputs: Vec<&B::Buffer> = ins.iter().map(|&i| &bufs[i]).collect();
        let outputs: Vec<&B::Buffer> = outs.iter().map(|&i| &bufs[i]).collect();
        b.record(
            op,
            &OpIo {
                inputs: &inputs,
                outputs: &outputs,
            },
        )
        .unwrap_or_else(|e| panic!("{op:?}: {e}"));
    }
    b.submit().expect("submit");
    case.read
        .iter()
        .map(|&i| {
            pollster::block_on(b.download(&bufs[i], 0..case.bufs[i].bytes)).expect("download")
        })
        .collect()
}

/// `steps` over buffers of `bytes` bytes (by index) with the runs `b`
/// has fused ops for fused, as a model's plan fuses them
/// ([`hearth::graph::fuse::fuse`]).
pub fn fuse_steps<B: Backend>(
    b: &B,
    steps: &[(Op, Vec<usize>, Vec<usize>)],
    bytes: &[u64],
) -> Vec<(Op, Vec<usize>, Vec<usize>)> {
    use hearth::graph::plan::{BufId, Plan};
    let mut plan = Plan::default();
    for &n in bytes {
        plan.act(n as usize);
    }
    let ids = |v: &[usize]| v.iter().map(|&i| BufId::Act(i)).collect::<Vec<_>>();
    for (op, ins, outs) in steps {
        plan.push(op.clone(), &ids(ins), &ids(outs));
    }
    hearth::graph::fuse::fuse(&mut plan, &|op| b.supports(op));
    let idx = |v: &[BufId]| {
        v.iter()
            .map(|b| match b {
                BufId::Act(i) => *i,
                other => panic!("{other:?} in a test plan"),
            })
            .collect::<Vec<_>>()
    };
    plan.steps
        .iter()
        .map(|s| (s.op.clone(), idx(&s.inputs), idx(&s.outputs)))
        .collect()
}

/// `case` with its runs fused for `b` ([`fuse_steps`]).
pub fn fused_case<B: Backend>(b: &B, case: &Case) -> Case {
    let bytes: Vec<u64> = case.bufs.iter().map(|d| d.bytes).collect();
    Case {
        bufs: case
            .bufs
            .iter()
            .map(|d| Buf {
                init: d.init.clone(),
                bytes: d.bytes,
                kind: d.kind,
            })
            .collect(),
        steps: fuse_steps(b, &case.steps, &bytes),
        read: case.read.clone(),
    }
}

/// Runs `case` on the CPU and on `gpu`; returns (cpu, gpu) outputs.
pub fn both(gpu: &mut WebGpuBackend, case: &Case) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut cpu = CpuBackend::new(1);
    (run(&mut cpu, case), run(gpu, case))
}

pub fn as_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Largest |a - b| relative to max(1, max |b|).
pub fn rel_err(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1.0f32, |m, v| m.max(v.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0f32, f32::max)
        / scale
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
    gpu()?;
    let (model, sources) = open_model(path).expect("open model");
    let opts = LoadOptions::new(KvCacheConfig {
        num_blocks,
        block_size: BLOCK,
        dtype,
    });
    let mut last = None;
    let m = pollster::block_on(async {
        let ctx = GpuContext::new(gpu_opts)
            .await
            .map_err(hearth::backend::BackendError::from)?;
        load_model(WebGpuBackend::new(ctx), &model, &sources, &opts, &mut |p| {
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
