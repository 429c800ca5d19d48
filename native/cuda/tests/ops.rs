//! Every op of the CUDA backend against the CPU backend (and the scalar
//! references) on fresh random inputs: element and row ops, RoPE, the K/V
//! write and paged attention, the MoE router and expert FFNs, argmax and
//! top-k, and the matrix products and embedding lookup of all 15 weight
//! formats (int8 activations and exact mode), apart and fused.
//!
//! Without a CUDA device each test prints why and checks nothing, unless
//! `HEARTH_REQUIRE_CUDA=1` (what `scripts/cuda-test.sh device` sets).

#[allow(dead_code)]
#[path = "../../../tests/model_support"]
mod model_support {
    pub mod rng;
}
#[path = "../../../tests/op_cases/mod.rs"]
mod op_cases;

use hearth::backend::cpu::CpuBackend;
use hearth::backend::{Backend, BufKind};
use hearth::graph::{Activation, KvType, Op, Prologue, RopeMode, NON_FINITE_ROW};
use hearth::quant::{reference, GgmlType, WEIGHT_TYPES};
use hearth_cuda::CudaBackend;
use model_support::rng::Rng;
use op_cases::*;

fn cuda() -> Option<CudaBackend> {
    match CudaBackend::new(0) {
        Ok(b) => Some(b),
        Err(e) if std::env::var("HEARTH_REQUIRE_CUDA").is_ok_and(|v| v == "1") => {
            panic!("HEARTH_REQUIRE_CUDA=1 but {e}")
        }
        Err(e) => {
            eprintln!("CUDA test not run: {e} (set HEARTH_REQUIRE_CUDA=1 to make this fail)");
            None
        }
    }
}

/// A seed fresh for each run, printed with every failure.
fn seed() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64)
}

/// `case` on the CPU and on `g`: (cpu, cuda) outputs.
fn both(g: &mut CudaBackend, case: &Case) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut cpu = CpuBackend::new(1);
    (run(&mut cpu, case), run(g, case))
}

fn check(g: &mut CudaBackend, name: &str, case: &Case, tol: f32, seed: u64) {
    check_with_cpu(g, name, case, tol, seed);
}

#[test]
fn element_and_row_ops_match_cpu() {
    let Some(mut g) = cuda() else { return };
    let s = seed();
    let mut r = Rng::new(s);
    let n = 3001;
    for (name, op) in [
        ("add", Op::Add),
        ("mul", Op::Mul),
        ("silu_mul", Op::SiluMul),
        ("gelu_mul", Op::GeluTanhMul),
    ] {
        let case = binary_case(op, r.normals(n, 3.0), r.normals(n, 1.0));
        check(&mut g, name, &case, 1e-5, s);
    }
    check(
        &mut g,
        "scale",
        &unary_case(Op::Scale(0.37), r.normals(n, 1.0)),
        1e-6,
        s,
    );
    check(
        &mut g,
        "softcap",
        &unary_case(Op::LogitSoftcap(30.0), r.normals(n, 40.0)),
        1e-5,
        s,
    );
    let case = Case {
        bufs: vec![
            f32_buf(&r.normals(7 * 96, 1.0)),
            f32_buf(&r.normals(96, 1.0)),
            zeros(7 * 96 * 4, BufKind::Activations),
        ],
        steps: vec![(Op::BiasAdd, vec![0, 1], vec![2])],
        read: vec![2],
    };
    check(&mut g, "bias_add", &case, 1e-6, s);
    for width in [16, 300, 1024, 2053, 4096] {
        let rows = 5;
        let case = Case {
            bufs: vec![
                f32_buf(&r.normals(rows * width, 2.0)),
                f32_buf(&r.normals(width, 1.0)),
                zeros(rows * width * 4, BufKind::Activations),
            ],
            steps: vec![(Op::RmsNorm { width, eps: 1e-5 }, vec![0, 1], vec![2])],
            read: vec![2],
        };
        check(&mut g, &format!("rms_norm w{width}"), &case, 1e-5, s);
        let case = unary_case(Op::Softmax { width }, r.normals(rows * width, 3.0));
        check(&mut g, &format!("softmax w{width}"), &case, 1e-5, s);
    }
}

#[test]
fn rope_matches_cpu() {
    let Some(mut g) = cuda() else { return };
    let s = seed();
    let mut r = Rng::new(s);
    let (tokens, heads, head_dim) = (5, 3, 64);
    for mode in [RopeMode::Norm, RopeMode::Neox] {
        for (n_rot, factors, scale) in [(64, false, 1.0), (32, true, 0.5)] {
            let case = rope_case(
                &mut r,
                mode,
                (tokens, heads, head_dim),
                n_rot,
                factors,
                scale,
            );
            // Angles up to ~600 rad: sin/cos of large arguments differ by a few ulps.
            check(
                &mut g,
                &format!("rope {mode:?} n_rot {n_rot}"),
                &case,
                2e-4,
                s,
            );
        }
    }
}

#[test]
fn rope_and_kv_write_fused_match_the_ops_apart() {
    let Some(mut g) = cuda() else { return };
    let s = seed();
    let mut r = Rng::new(s);
    let (rows, q_heads, kv_heads, hd, hv, slots_total) = (5, 4, 2, 64, 48, 64);
    for dtype in [KvType::F32, KvType::F16] {
        for (mode, n_rot, factors) in [(RopeMode::Norm, 64, false), (RopeMode::Neox, 32, true)] {
            let (kw, vw) = (kv_heads * hd, kv_heads * hv);
            let elem = if dtype == KvType::F16 { 2 } else { 4 };
            let pos: Vec<u32> = (0..rows).map(|_| r.below(600) as u32).collect();
            // Distinct slots, in no order.
            let mut slots: Vec<u32> = Vec::new();
            while slots.len() < rows {
                let c = r.below(slots_total) as u32;
                if !slots.contains(&c) {
                    slots.push(c);
                }
            }
            let mut bufs = vec![
                f32_buf(&r.normals(rows * q_heads * hd, 1.0)),    // 0 q
                f32_buf(&r.normals(rows * kw, 1.0)),              // 1 k
                f32_buf(&r.normals(rows * vw, 1.0)),              // 2 v
                u32_buf(&pos),                                    // 3
                u32_buf(&slots),                                  // 4
                zeros(slots_total * kw * elem, BufKind::KvCache), // 5 K cache
                zeros(slots_total * vw * elem, BufKind::KvCache), // 6 V cache
            ];
            let (mut qi, mut ki) = (vec![0, 3], vec![1, 3]);
            if factors {
                let f: Vec<f32> = (0..n_rot / 2).map(|_| 1.0 + 3.0 * r.uniform()).collect();
                bufs.push(f32_buf(&f));
                qi.push(7);
                ki.push(7);
            }
            let rope = Op::Rope {
                mode,
                head_dim: hd,
                n_rot,
                base: 10000.0,
                scale: 0.5,
            };
            let write = Op::KvWrite {
                layer: 0,
                k_width: kw,
                v_width: vw,
                dtype,
            };
            let apart = Case {
                bufs,
                // Both ropes in place, as a model's plan has them.
                steps: vec![
                    (rope.clone(), qi, vec![0]),
                    (rope, ki, vec![1]),
                    (write, vec![1, 2, 4], vec![5, 6]),
                ],
                read: vec![0, 1, 5, 6],
            };
            let fused = fused_case(&g, &apart);
            assert!(
                fused.steps.len() == 1 && matches!(fused.steps[0].0, Op::RopeKvWrite { .. }),
                "the steps fuse: {:?}",
                fused.steps.iter().map(|s| s.0.name()).collect::<Vec<_>>()
            );
            let mut cpu = CpuBackend::new(1);
            let want = run(&mut cpu, &apart);
            let got = run(&mut g, &fused);
            let name = format!("rope + kv write {dtype:?} {mode:?} n_rot {n_rot}");
            for (i, (w, gt)) in want.iter().zip(&got).enumerate() {
                let (w, gt) = if i >= 2 && dtype == KvType::F16 {
                    (halves(w), halves(gt))
                } else {
                    (as_f32(w), as_f32(gt))
                };
                let err = rel_err(&gt, &w);
                println!("{name} output {i}: relative error {err:.2e}");
                // Angles up to ~600 rad (as rope_matches_cpu); f16 caches
                // within a rounding of each other.
                let tol = if i >= 2 && dtype == KvType::F16 {
                    2e-3
                } else {
                    2e-4
                };
                assert!(err <= tol, "{name} output {i}: {err} > {tol} (seed {s:#x})");
            }
        }
    }
}

/// A buffer of halves as f32.
fn halves(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(2)
        .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
        .collect()
}

#[test]
fn kv_write_and_paged_attention_match_cpu() {
    let Some(mut g) = cuda() else { return };
    let s = seed();
    let mut r = Rng::new(s);
    let long = |n_head, n_head_kv| AttnShape {
        n_head,
        n_head_kv,
        a_cached: 300,
        a_new: 5,
        b_cached: 700,
    };
    // Two heads a K/V head and short rows; four and eight heads over
    // hundreds of keys (several splits); sixteen (the per-head kernel).
    let shapes = [SMALL_ATTN, long(8, 2), long(8, 1), long(16, 1)];
    for dtype in [KvType::F32, KvType::F16] {
        for (hk, hv, window, softcap) in [
            (64, 64, None, None),
            (128, 128, Some(5), None),
            (256, 256, None, Some(50.0)),
            (32, 80, Some(9), Some(2.0)),
            (128, 128, Some(200), None),
        ] {
            for shape in shapes {
                let case = attention_case_shaped(&mut r, dtype, hk, hv, window, softcap, shape);
                // 0: the split kernel where it fits; 4, 8, 16: the per-head kernel.
                for warps in [0, 4, 8, 16] {
                    g.set_attention_warps(warps);
                    let name = format!(
                        "attention {dtype:?} hk{hk} hv{hv} window {window:?} softcap {softcap:?} \
                         heads {}/{} keys {}+{} (kernel {warps})",
                        shape.n_head, shape.n_head_kv, shape.a_cached, shape.b_cached
                    );
                    let (cpu, gpu) = both(&mut g, &case);
                    assert!(
                        cpu[1] == gpu[1] && cpu[2] == gpu[2],
                        "{name}: caches differ (seed {s:#x})"
                    );
                    let err = rel_err(&as_f32(&gpu[0]), &as_f32(&cpu[0]));
                    println!("{name}: relative error {err:.2e}");
                    assert!(err <= 1e-5, "{name}: error {err} (seed {s:#x})");
                }
            }
        }
    }
    g.set_attention_warps(0);
}

/// The flash kernel (prefill: tiles of query rows and keys on the tensor
/// cores, f16 queries and probabilities) against the CPU's attention, on
/// the query heads a K/V head of 1 to 16, prompts from scratch and after a
/// history, windows that start inside a tile and tanh caps.
#[test]
fn flash_attention_matches_cpu() {
    let Some(mut g) = cuda() else { return };
    let s = seed();
    let mut r = Rng::new(s);
    let shape = |n_head, n_head_kv, a_cached, a_new| AttnShape {
        n_head,
        n_head_kv,
        a_cached,
        a_new,
        b_cached: 90,
    };
    let shapes = [
        shape(8, 2, 0, 150),
        shape(8, 2, 70, 130),
        shape(8, 8, 5, 200),
        shape(6, 2, 33, 77),
        shape(8, 1, 0, 64),
        shape(16, 1, 200, 9),
    ];
    // Every row on the flash kernel, even the decode row of sequence B.
    g.set_flash_rows(1);
    for (hk, window, softcap) in [
        (64, None, None),
        (128, None, None),
        (128, Some(37), None),
        (64, Some(100), Some(30.0)),
    ] {
        for shape in shapes {
            let case = attention_case_shaped(&mut r, KvType::F16, hk, hk, window, softcap, shape);
            let name = format!(
                "flash attention hk{hk} window {window:?} softcap {softcap:?} heads {}/{} \
                 keys {}+{} and {}+1",
                shape.n_head, shape.n_head_kv, shape.a_cached, shape.a_new, shape.b_cached
            );
            let (cpu, gpu) = both(&mut g, &case);
            let err = rel_err(&as_f32(&gpu[0]), &as_f32(&cpu[0]));
            println!("{name}: relative error {err:.2e}");
            // f16 queries and probabilities: a few units of 2^-11.
            assert!(err <= 4e-3, "{name}: error {err} (seed {s:#x})");
        }
    }
    g.set_flash_rows(64);
}

#[test]
fn router_argmax_and_top_k_match_the_reference() {
    let Some(mut g) = cuda() else { return };
    let s = seed();
    let mut r = Rng::new(s);
    let (tokens, ne, k) = (9, 64, 8);
    let case = Case {
        bufs: vec![
            f32_buf(&r.normals(tokens * ne, 2.0)),
            zeros(tokens * k * 4, BufKind::Activations),
            zeros(tokens * k * 4, BufKind::Activations),
        ],
        steps: vec![(Op::MoeTopK { n_expert: ne, k }, vec![0], vec![1, 2])],
        read: vec![1, 2],
    };
    let (cpu, gpu) = both(&mut g, &case);
    assert_eq!(cpu[0], gpu[0], "expert ids (seed {s:#x})");
    assert!(
        rel_err(&as_f32(&gpu[1]), &as_f32(&cpu[1])) < 1e-5,
        "weights (seed {s:#x})"
    );

    // One block a row (1000), and rows cut into slices (9000, a vocabulary).
    for width in [1000, 9000, 128_256] {
        let mut x = r.normals(5 * width, 1.0);
        x[width + 17] = 9.0;
        // A tie (in another slice of the wide rows): the lower index wins.
        x[width + (width - 1).min(4500)] = 9.0;
        x[3 * width + 999] = f32::NAN;
        x[4 * width + 1] = f32::INFINITY;
        let case = Case {
            bufs: vec![f32_buf(&x), zeros(20, BufKind::Activations)],
            steps: vec![(Op::Argmax { width }, vec![0], vec![1])],
            read: vec![1],
        };
        let (_, gpu) = both(&mut g, &case);
        let ids: Vec<u32> = as_f32(&gpu[0]).iter().map(|v| v.to_bits()).collect();
        let want: Vec<u32> = x
            .chunks(width)
            .map(hearth::graph::reference::argmax_row)
            .collect();
        assert_eq!(ids, want, "argmax of {width} (seed {s:#x})");
        assert_eq!(ids[1], 17);
        assert_eq!(ids[3..], [NON_FINITE_ROW; 2]);
    }

    // One block a row (up to 8191), then slices of 4096: 8200 leaves a
    // slice of fewer values than k.
    let cases = [
        (1000, 40),
        (5003, 64),
        (70, 1),
        (64, 64),
        (8200, 64),
        (128_256, 40),
    ];
    for (width, k) in cases {
        let mut x = r.normals(4 * width, 1.0);
        x[width + width / 2] = 10.0; // ties keep index order
        x[width + 5] = 10.0;
        x[width + 9] = 10.0;
        x[2 * width + 3] = f32::NAN;
        let case = Case {
            bufs: vec![f32_buf(&x), zeros(4 * k * 8, BufKind::Activations)],
            steps: vec![(Op::TopK { width, k }, vec![0], vec![1])],
            read: vec![1],
        };
        let (_, gpu) = both(&mut g, &case);
        let want: Vec<u32> = x
            .chunks(width)
            .flat_map(|row| hearth::graph::reference::top_k_row(row, k))
            .flat_map(|(i, v)| [i, v.to_bits()])
            .collect();
        let got: Vec<u32> = as_f32(&gpu[0]).iter().map(|v| v.to_bits()).collect();
        assert_eq!(got, want, "top-{k} of {width}-wide rows (seed {s:#x})");
    }
}

/// The kernels of a product test: the defaults, or a comparison variant.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Variant {
    Default,
    /// The decode products with this many rows a warp (0: the persistent
    /// kernels), the few-token tensor-core kernel off.
    MvRows(u32),
    /// The few-token tensor-core kernel from this many tokens.
    MqFrom(usize),
    Int8Tiles,
}

/// Random rows quantized to `ty`, as GGUF blocks.
fn quantized(ty: GgmlType, cols: usize, rows: usize, r: &mut Rng) -> Vec<u8> {
    let x = r.normals(cols * rows, 1.0);
    let mut out = Vec::new();
    reference::quantize(ty, &x, &mut out).expect("quantize");
    out
}

/// `x · Wᵀ` in f64 over the dequantized weights: what the int8 path approximates.
fn exact_product(ty: GgmlType, w: &[u8], x: &[f32], k: usize, n: usize) -> Vec<f64> {
    let mut wf = vec![0.0f32; n * k];
    reference::dequantize(ty, w, &mut wf).expect("dequantize");
    x.chunks(k)
        .flat_map(|xr| {
            wf.chunks(k)
                .map(|wr| {
                    wr.iter()
                        .zip(xr)
                        .map(|(&a, &b)| f64::from(a) * f64::from(b))
                        .sum()
                })
                .collect::<Vec<f64>>()
        })
        .collect()
}

/// Root-mean-square error relative to the reference's RMS.
fn nrmse(got: &[f32], want: &[f64]) -> f64 {
    let (mut e, mut s) = (0.0, 0.0);
    for (&g, &w) in got.iter().zip(want) {
        e += (f64::from(g) - w).powi(2);
        s += w * w;
    }
    (e / s.max(1e-30)).sqrt()
}

#[test]
fn products_and_lookups_of_every_format_match_the_reference() {
    let Some(mut g) = cuda() else { return };
    let s = seed();
    let mut r = Rng::new(s);
    let n = 72;
    // 768: rows of a whole number of the wide items (Q4_K's 64 values,
    // Q6_K's 128) but not of 32 items a warp.
    for (ty, k) in WEIGHT_TYPES
        .into_iter()
        .flat_map(|ty| [(ty, 512), (ty, 768)])
    {
        let w = quantized(ty, k, n, &mut r);
        // 32 and more run on the tensor-core tiles (from 128 on weights
        // dequantized once); 70 and 130 leave partial tiles; 13 and 16
        // take two passes of the 8-token matrix-vector kernels.
        // The decode products also with 1 and 4 rows a warp (72 rows: the
        // last warps' groups run past the end) and on the persistent
        // kernels, 70 tokens also on the int8 tiles (the comparison kernels).
        // 13 and 16 take the few-token tensor-core kernel by default (its
        // k split over several blocks here), 1, 4 and 20 (two token tiles)
        // when it is asked for.
        let runs = [1, 2, 3, 8, 13, 16, 32, 70, 130].map(|t| (t, Variant::Default));
        let others = [
            (1, Variant::MvRows(0)),
            (8, Variant::MvRows(0)),
            (1, Variant::MvRows(1)),
            (13, Variant::MvRows(1)),
            (1, Variant::MvRows(4)),
            (3, Variant::MvRows(4)),
            (16, Variant::MvRows(2)),
            (1, Variant::MqFrom(1)),
            (4, Variant::MqFrom(1)),
            (20, Variant::MqFrom(1)),
            (70, Variant::Int8Tiles),
        ];
        for (tokens, variant) in others.into_iter().chain(runs) {
            for exact in [false, true] {
                match variant {
                    Variant::MvRows(r) => {
                        g.set_mv_rows(r);
                        g.set_mq_tokens(0);
                    }
                    Variant::MqFrom(t) => g.set_mq_tokens(t),
                    _ => {}
                }
                g.set_prefill_f16(variant != Variant::Int8Tiles);
                let x = r.normals(tokens * k, 1.0);
                let case = Case {
                    bufs: vec![
                        f32_buf(&x),
                        weight_buf(&g, ty, k, &w),
                        zeros(tokens * n * 4, BufKind::Activations),
                    ],
                    steps: vec![(Op::MatMul { ty, k, n, exact }, vec![0, 1], vec![2])],
                    read: vec![2],
                };
                let got = as_f32(&run(&mut g, &case)[0]);
                let want = exact_product(ty, &w, &x, k, n);
                let err = nrmse(&got, &want);
                // int8 activations: ~0.4% of each value (ggml's q8 errs alike).
                // f16 tiles (32 tokens and more): f16 activations and
                // weights, ~1e-3 of each value.
                let tiles = tokens >= 32 && !exact && ty == GgmlType::F16;
                let tol = if tiles {
                    2e-3
                } else if exact || !ty.is_quantized() {
                    1e-5
                } else {
                    1.5e-2
                };
                g.set_mv_rows(hearth_cuda::backend::DEFAULT_MV_ROWS);
                g.set_mq_tokens(hearth_cuda::backend::DEFAULT_MQ_TOKENS);
                g.set_prefill_f16(true);
                println!("matmul {ty} k{k} t{tokens} exact {exact} {variant:?}: nrmse {err:.2e}");
                assert!(
                    err <= tol,
                    "matmul {ty} k{k} t{tokens} exact {exact} {variant:?}: nrmse {err} > {tol} (seed {s:#x})"
                );
            }
        }
        let ids = [3u32, 0, 71, 3, 40];
        let case = Case {
            bufs: vec![
                weight_buf(&g, ty, k, &w),
                u32_buf(&ids),
                zeros(ids.len() * k * 4, BufKind::Activations),
            ],
            steps: vec![(Op::GetRows { ty, width: k }, vec![0, 1], vec![2])],
            read: vec![2],
        };
        let got = as_f32(&run(&mut g, &case)[0]);
        let mut table = vec![0.0f32; n * k];
        reference::dequantize(ty, &w, &mut table).expect("dequantize");
        // Float formats bit for bit; quantized ones as a * q + b (fused),
        // within rounding of the reference's (q - z) * d.
        let tol = if ty.is_quantized() { 1e-6 } else { 0.0 };
        for (t, &id) in ids.iter().enumerate() {
            let want = &table[id as usize * k..][..k];
            let err = rel_err(&got[t * k..][..k], want);
            assert!(
                err <= tol,
                "get_rows {ty} row {id}: error {err} (seed {s:#x})"
            );
        }
    }
}

#[test]
fn fused_products_match_the_ops_apart() {
    let Some(mut g) = cuda() else { return };
    let s = seed();
    let mut r = Rng::new(s);
    let (k, rows) = (256, 3);
    use GgmlType::*;
    // Three products of a type share a launch; a mix of types with one
    // rounding shares the quantizing prologue; Q6_K with Q8_0 takes two.
    for tys in [
        [Q4_K, Q4_K, Q4_K],
        [Q8_0, Q8_0, Q8_0],
        [F16, F16, F16],
        [Q4_K, Q4_K, Q6_K],
        [Q6_K, Q8_0, Q6_K],
    ] {
        let ns = [64, 96, 32];
        let ws: Vec<Vec<u8>> = tys
            .iter()
            .zip(ns)
            .map(|(&ty, n)| quantized(ty, k, n, &mut r))
            .collect();
        let ty = tys[0];
        for pre in [
            Prologue::None,
            Prologue::RmsNorm { eps: 1e-6 },
            Prologue::AddRmsNorm { eps: 1e-6 },
            Prologue::Glu(Activation::Silu),
            Prologue::Glu(Activation::GeluTanh),
        ] {
            let (n_in, n_out) = pre.arity();
            let mut bufs = vec![f32_buf(&r.normals(rows * k, 1.0))];
            match pre {
                Prologue::None => {}
                Prologue::RmsNorm { .. } => bufs.push(f32_buf(&r.normals(k, 1.0))),
                Prologue::AddRmsNorm { .. } => {
                    bufs.push(f32_buf(&r.normals(rows * k, 1.0)));
                    bufs.push(f32_buf(&r.normals(k, 1.0)));
                }
                Prologue::Glu(_) => bufs.push(f32_buf(&r.normals(rows * k, 1.0))),
            }
            for (&t, w) in tys.iter().zip(&ws) {
                bufs.push(weight_buf(&g, t, k, w));
            }
            for _ in 0..n_out {
                bufs.push(zeros(rows * k * 4, BufKind::Activations));
            }
            for n in ns {
                bufs.push(zeros(rows * n * 4, BufKind::Activations));
            }
            let op = Op::FusedMatMul {
                pre,
                k,
                parts: tys.iter().copied().zip(ns).collect(),
                exact: false,
                rows,
            };
            let ins: Vec<usize> = (0..n_in + 3).collect();
            let outs: Vec<usize> = (n_in + 3..n_in + 6 + n_out).collect();
            let fused = Case {
                bufs,
                steps: vec![(op.clone(), ins.clone(), outs.clone())],
                read: outs.clone(),
            };
            // The same op expanded into the ops it stands for, on the CPU.
            let mut cpu = CpuBackend::new(1);
            let apart = Case {
                bufs: fused
                    .bufs
                    .iter()
                    .map(|b| Buf {
                        init: b.init.clone(),
                        bytes: match b.weight {
                            Some((ty, cols)) => cpu.weight_bytes(
                                ty,
                                cols,
                                b.init.len() / (cols / ty.block_elems() * ty.block_bytes()),
                            ),
                            None => b.bytes,
                        },
                        kind: b.kind,
                        weight: b.weight,
                    })
                    .collect(),
                steps: hearth::graph::fuse::expand(&op)
                    .expect("a fused op")
                    .into_iter()
                    .map(|p| {
                        let idx = |a: &hearth::graph::fuse::Arg| match *a {
                            hearth::graph::fuse::Arg::In(i) => ins[i],
                            hearth::graph::fuse::Arg::Out(i) => outs[i],
                        };
                        (
                            p.op.clone(),
                            p.inputs.iter().map(idx).collect(),
                            p.outputs.iter().map(idx).collect(),
                        )
                    })
                    .collect(),
                read: outs.clone(),
            };
            let want = run(&mut cpu, &apart);
            let got = run(&mut g, &fused);
            for (i, (w, gt)) in want.iter().zip(&got).enumerate() {
                let err = rel_err(&as_f32(gt), &as_f32(w));
                // The CPU rounds F16 products' activations to f16; CUDA keeps f32.
                let tol = if ty.is_quantized() { 3e-2 } else { 1e-3 };
                println!("fused {pre:?} {tys:?} output {i}: relative error {err:.2e}");
                assert!(
                    err <= tol,
                    "fused {pre:?} {tys:?} output {i}: {err} > {tol} (seed {s:#x})"
                );
            }
        }
    }
}

#[test]
fn moe_experts_match_cpu() {
    let Some(mut g) = cuda() else { return };
    let s = seed();
    let mut r = Rng::new(s);
    let (tokens, ne, k, n_embd, n_ff) = (5, 8, 2, 256, 256);
    for (ty, act) in [
        (GgmlType::Q4_K, Activation::Silu),
        (GgmlType::Q8_0, Activation::GeluTanh),
    ] {
        let gate = quantized(ty, n_embd, ne * n_ff, &mut r);
        let up = quantized(ty, n_embd, ne * n_ff, &mut r);
        let down = quantized(ty, n_ff, ne * n_embd, &mut r);
        let logits = r.normals(tokens * ne, 2.0);
        let x = r.normals(tokens * n_embd, 1.0);
        let steps = vec![
            (Op::MoeTopK { n_expert: ne, k }, vec![1], vec![2, 3]),
            (
                Op::MoeExperts {
                    layer: 0,
                    n_expert: ne,
                    k,
                    n_embd,
                    n_ff,
                    act,
                    tys: [ty; 3],
                    exact: true,
                },
                vec![0, 2, 3, 4, 5, 6],
                vec![7],
            ),
        ];
        let case_for = |b: &dyn Fn(GgmlType, usize, &[u8]) -> Buf| Case {
            bufs: vec![
                f32_buf(&x),
                f32_buf(&logits),
                zeros(tokens * k * 4, BufKind::Activations),
                zeros(tokens * k * 4, BufKind::Activations),
                b(ty, n_embd, &gate),
                b(ty, n_embd, &up),
                b(ty, n_ff, &down),
                zeros(tokens * n_embd * 4, BufKind::Activations),
            ],
            steps: steps.clone(),
            read: vec![7, 2],
        };
        let mut cpu = CpuBackend::new(1);
        let on_cpu = case_for(&|t, c, w| weight_buf(&cpu, t, c, w));
        let want = run(&mut cpu, &on_cpu);
        let on_cuda = case_for(&|t, c, w| weight_buf(&g, t, c, w));
        let got = run(&mut g, &on_cuda);
        assert_eq!(want[1], got[1], "routed experts (seed {s:#x})");
        let err = rel_err(&as_f32(&got[0]), &as_f32(&want[0]));
        println!("moe {ty} {act:?}: relative error {err:.2e}");
        assert!(err <= 1e-4, "moe {ty} {act:?}: {err} (seed {s:#x})");
    }
}

/// An id at or past the layer's experts contributes nothing (an expert the
/// expert cache computes elsewhere), on CUDA as on the CPU.
#[test]
fn moe_experts_leave_out_ids_past_the_experts() {
    let Some(mut g) = cuda() else { return };
    let case_for = moe_ids_past_the_experts(&mut Rng::new(seed()));
    let mut cpu = CpuBackend::new(1);
    let on_cpu = case_for(&|t, c, w| weight_buf(&cpu, t, c, w));
    let want = run(&mut cpu, &on_cpu);
    let on_cuda = case_for(&|t, c, w| weight_buf(&g, t, c, w));
    let got = run(&mut g, &on_cuda);
    let err = rel_err(&as_f32(&got[0]), &as_f32(&want[0]));
    println!("moe with ids past the experts: relative error {err:.2e}");
    assert!(err <= 1e-5, "relative error {err}");
}
