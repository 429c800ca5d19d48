//! Op cases any backend runs: buffers, ops over them, and the buffers
//! compared after, with a runner generic over [`Backend`]; the WebGPU and
//! CUDA tests run the same cases against the CPU backend.
#![allow(dead_code)]

use hearth::backend::{Backend, BufKind, OpIo};
use hearth::graph::{KvType, Op};
use hearth::quant::GgmlType;

use crate::model_support::rng::Rng;

/// A buffer of a case: initial bytes (zeroes when `init` is empty and
/// `bytes` > 0) and its kind.
pub struct Buf {
    pub init: Vec<u8>,
    pub bytes: u64,
    pub kind: BufKind,
    /// A weight's type and row width: `init` holds its GGUF rows, uploaded
    /// through [`Backend::upload_weight_rows`] (a backend may repack them).
    pub weight: Option<(GgmlType, usize)>,
}

pub fn f32_buf(v: &[f32]) -> Buf {
    Buf {
        init: bytemuck::cast_slice(v).to_vec(),
        bytes: (v.len() * 4) as u64,
        kind: BufKind::Activations,
        weight: None,
    }
}

pub fn u32_buf(v: &[u32]) -> Buf {
    Buf {
        init: bytemuck::cast_slice(v).to_vec(),
        bytes: (v.len() * 4) as u64,
        kind: BufKind::Activations,
        weight: None,
    }
}

pub fn zeros(bytes: usize, kind: BufKind) -> Buf {
    Buf {
        init: Vec::new(),
        bytes: bytes as u64,
        kind,
        weight: None,
    }
}

pub fn bytes_buf(b: &[u8], kind: BufKind) -> Buf {
    Buf {
        init: b.to_vec(),
        bytes: b.len() as u64,
        kind,
        weight: None,
    }
}

/// A weight of type `ty` whose GGUF rows of `cols` values are `rows`,
/// uploaded as a model's weights are ([`Backend::upload_weight_rows`]).
pub fn weight_buf<B: Backend>(b: &B, ty: GgmlType, cols: usize, rows: &[u8]) -> Buf {
    let row_bytes = cols / ty.block_elems() * ty.block_bytes();
    Buf {
        init: rows.to_vec(),
        bytes: b.weight_bytes(ty, cols, rows.len() / row_bytes),
        kind: BufKind::Weights,
        weight: Some((ty, cols)),
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
            match d.weight {
                Some((ty, cols)) => b
                    .upload_weight_rows(&buf, ty, cols, 0, &d.init)
                    .expect("upload weight"),
                None if !d.init.is_empty() => b.upload(&buf, 0, &d.init).expect("upload"),
                None => {}
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
                weight: d.weight,
            })
            .collect(),
        steps: fuse_steps(b, &case.steps, &bytes),
        read: case.read.clone(),
    }
}

pub fn as_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// A unary op over `x` into a buffer of its size.
pub fn unary_case(op: Op, x: Vec<f32>) -> Case {
    let n = x.len();
    Case {
        bufs: vec![f32_buf(&x), zeros(n * 4, BufKind::Activations)],
        steps: vec![(op, vec![0], vec![1])],
        read: vec![1],
    }
}

/// A binary op over `x` and `y` into a buffer of their size.
pub fn binary_case(op: Op, x: Vec<f32>, y: Vec<f32>) -> Case {
    let n = x.len();
    Case {
        bufs: vec![f32_buf(&x), f32_buf(&y), zeros(n * 4, BufKind::Activations)],
        steps: vec![(op, vec![0, 1], vec![2])],
        read: vec![2],
    }
}

/// RoPE of `tokens` rows of `heads` heads at random positions below 600,
/// with per-pair frequency divisors when `factors`, into buffer 2.
#[allow(clippy::too_many_arguments)]
pub fn rope_case(
    r: &mut Rng,
    mode: hearth::graph::RopeMode,
    (tokens, heads, head_dim): (usize, usize, usize),
    n_rot: usize,
    factors: bool,
    scale: f32,
) -> Case {
    let pos: Vec<u32> = (0..tokens).map(|_| r.below(600) as u32).collect();
    let mut bufs = vec![
        f32_buf(&r.normals(tokens * heads * head_dim, 1.0)),
        u32_buf(&pos),
        zeros(tokens * heads * head_dim * 4, BufKind::Activations),
    ];
    let mut ins = vec![0, 1];
    if factors {
        let f: Vec<f32> = (0..n_rot / 2).map(|_| 1.0 + 3.0 * r.uniform()).collect();
        bufs.push(f32_buf(&f));
        ins.push(3);
    }
    let op = Op::Rope {
        mode,
        head_dim,
        n_rot,
        base: 10000.0,
        scale,
    };
    Case {
        bufs,
        steps: vec![(op, ins, vec![2])],
        read: vec![2],
    }
}

/// Runs `case` on the CPU backend and on `b`, and checks every read buffer
/// within `tol` relative to the largest CPU value (`seed`: for the message).
pub fn check_with_cpu<B: Backend>(b: &mut B, name: &str, case: &Case, tol: f32, seed: u64) {
    let mut cpu = hearth::backend::cpu::CpuBackend::new(1);
    let want = run(&mut cpu, case);
    let got = run(b, case);
    for (i, (c, w)) in want.iter().zip(&got).enumerate() {
        let err = rel_err(&as_f32(w), &as_f32(c));
        println!("{name} output {i}: relative error {err:.2e}");
        assert!(
            err <= tol,
            "{name} output {i}: error {err} > {tol} (seed {seed:#x})"
        );
    }
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

/// The heads and lengths of an [`attention_case_shaped`]: sequence A has
/// `a_cached` keys in the cache and `a_new` new rows, sequence B
/// `b_cached` and one new row.
#[derive(Debug, Clone, Copy)]
pub struct AttnShape {
    pub n_head: usize,
    pub n_head_kv: usize,
    pub a_cached: usize,
    pub a_new: usize,
    pub b_cached: usize,
}

/// Two query heads a K/V head, 20 + 3 and 7 + 1 keys.
pub const SMALL_ATTN: AttnShape = AttnShape {
    n_head: 4,
    n_head_kv: 2,
    a_cached: 20,
    a_new: 3,
    b_cached: 7,
};

/// K/V history and new tokens written through slots, then paged attention
/// of two sequences (a prefill chunk and a decode) through block tables.
pub fn attention_case(
    r: &mut Rng,
    dtype: KvType,
    hk: usize,
    hv: usize,
    window: Option<usize>,
    softcap: Option<f32>,
) -> Case {
    attention_case_shaped(r, dtype, hk, hv, window, softcap, SMALL_ATTN)
}

/// [`attention_case`] of other heads and lengths. The blocks of each
/// sequence are laid out in the cache in reverse, so tables matter.
pub fn attention_case_shaped(
    r: &mut Rng,
    dtype: KvType,
    hk: usize,
    hv: usize,
    window: Option<usize>,
    softcap: Option<f32>,
    shape: AttnShape,
) -> Case {
    let AttnShape {
        n_head,
        n_head_kv,
        a_cached,
        a_new,
        b_cached,
    } = shape;
    let bs = 16;
    let (a_len, b_len) = (a_cached + a_new, b_cached + 1);
    let (a_blocks, b_blocks) = (a_len.div_ceil(bs), b_len.div_ceil(bs));
    // One spare block at the front: no table points at block 0.
    let blocks = 1 + a_blocks + b_blocks;
    let slots_total = bs * blocks;
    let elem = if dtype == KvType::F16 { 2 } else { 4 };
    let (kw, vw) = (n_head_kv * hk, n_head_kv * hv);
    let table: Vec<u32> = (0..a_blocks)
        .rev()
        .map(|b| (1 + b_blocks + b) as u32)
        .chain((0..b_blocks).rev().map(|b| (1 + b) as u32))
        .collect();
    let slot = |t: &[u32], p: usize| t[p / bs] * bs as u32 + (p % bs) as u32;
    let (ta, tb) = table.split_at(a_blocks);
    let hist: Vec<u32> = (0..a_cached)
        .map(|p| slot(ta, p))
        .chain((0..b_cached).map(|p| slot(tb, p)))
        .collect();
    let new: Vec<u32> = (a_cached..a_len)
        .map(|p| slot(ta, p))
        .chain([slot(tb, b_cached)])
        .collect();
    let seqs = [
        0u32,
        a_new as u32,
        a_cached as u32,
        0,
        a_new as u32,
        1,
        b_cached as u32,
        a_blocks as u32,
    ];
    let (nh, nn) = (hist.len(), new.len());
    let write = Op::KvWrite {
        layer: 0,
        k_width: kw,
        v_width: vw,
        dtype,
    };
    let attn = Op::PagedAttention {
        layer: 0,
        n_head,
        n_head_kv,
        head_dim_k: hk,
        head_dim_v: hv,
        scale: 1.0 / (hk as f32).sqrt(),
        window,
        softcap,
        block_size: bs,
        dtype,
    };
    Case {
        bufs: vec![
            zeros(slots_total * kw * elem, BufKind::KvCache), // 0 K cache
            zeros(slots_total * vw * elem, BufKind::KvCache), // 1 V cache
            f32_buf(&r.normals(nh * kw, 1.0)),                // 2 history K
            f32_buf(&r.normals(nh * vw, 1.0)),                // 3 history V
            u32_buf(&hist),                                   // 4
            f32_buf(&r.normals(nn * kw, 1.0)),                // 5 new K
            f32_buf(&r.normals(nn * vw, 1.0)),                // 6 new V
            u32_buf(&new),                                    // 7
            f32_buf(&r.normals(nn * n_head * hk, 1.0)),       // 8 q
            u32_buf(&seqs),                                   // 9
            u32_buf(&table),                                  // 10
            zeros(nn * n_head * hv * 4, BufKind::Activations), // 11 out
        ],
        steps: vec![
            (write.clone(), vec![2, 3, 4], vec![0, 1]),
            (write, vec![5, 6, 7], vec![0, 1]),
            (attn, vec![8, 0, 1, 9, 10], vec![11]),
        ],
        read: vec![11, 0, 1],
    }
}

/// Makes a weight buffer of a backend: type, row width, GGUF rows.
pub type WeightMaker<'a> = &'a dyn Fn(GgmlType, usize, &[u8]) -> Buf;

/// A MoE layer whose routes name experts past the layer's (ids 9 and
/// `u32::MAX` of 4 experts): those entries contribute nothing, as where an
/// expert cache computes them elsewhere. Returns the case for a backend's
/// weight buffers (`weight_buf` of that backend): random data drawn once.
pub fn moe_ids_past_the_experts(r: &mut Rng) -> impl Fn(WeightMaker<'_>) -> Case {
    use hearth::graph::Activation;
    let (tokens, ne, k, n_embd, n_ff) = (3, 4, 2, 64, 32);
    let ty = GgmlType::F32;
    let mut w = |n: usize| bytemuck::cast_slice::<f32, u8>(&r.normals(n, 0.5)).to_vec();
    let (gate, up, down) = (
        w(ne * n_ff * n_embd),
        w(ne * n_ff * n_embd),
        w(ne * n_embd * n_ff),
    );
    let x = r.normals(tokens * n_embd, 1.0);
    // Token 0 uses experts 1 and (left out) 9; token 1 only 3; token 2 0 and 2.
    let ids: Vec<u32> = vec![1, 9, u32::MAX, 3, 0, 2];
    let wts: Vec<f32> = vec![0.7, 0.3, 0.5, 0.5, 0.6, 0.4];
    let moe = Op::MoeExperts {
        layer: 0,
        n_expert: ne,
        k,
        n_embd,
        n_ff,
        act: Activation::Silu,
        tys: [ty; 3],
        exact: true,
    };
    move |b: WeightMaker<'_>| Case {
        bufs: vec![
            f32_buf(&x),
            f32_buf(bytemuck::cast_slice(&ids)),
            f32_buf(&wts),
            b(ty, n_embd, &gate),
            b(ty, n_embd, &up),
            b(ty, n_ff, &down),
            zeros(tokens * n_embd * 4, BufKind::Activations),
        ],
        steps: vec![(moe.clone(), vec![0, 1, 2, 3, 4, 5], vec![6])],
        read: vec![6],
    }
}
