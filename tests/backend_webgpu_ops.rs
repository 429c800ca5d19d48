//! Every non-weight op of the WebGPU backend against the CPU backend's op
//! on the same seeded random inputs (and F32 / F16 weight ops). Runs on
//! any adapter (lavapipe in CI); with `HEARTH_REQUIRE_GPU=1` a missing
//! adapter fails.

mod model_support;
mod webgpu_support;

use hearth::backend::{Backend, BufKind, OpIo};
use hearth::graph::{Activation, KvType};
use hearth::graph::{Op, RopeMode};

use hearth::quant::GgmlType;
use model_support::rng::Rng;
use webgpu_support::*;

const SEED: u64 = 0x5eed_0005;

/// Runs `case` on both backends and checks every read buffer within `tol`
/// (relative to the largest reference value).
fn check(name: &str, case: &Case, tol: f32) {
    let Some(mut g) = gpu() else { return };
    check_with_cpu(&mut g, name, case, tol, SEED);
}

#[test]
fn elementwise_ops_match_cpu() {
    let mut r = Rng::new(SEED);
    let n = 1000;
    check(
        "add",
        &binary_case(Op::Add, r.normals(n, 1.0), r.normals(n, 1.0)),
        1e-6,
    );
    check(
        "mul",
        &binary_case(Op::Mul, r.normals(n, 1.0), r.normals(n, 1.0)),
        1e-6,
    );
    check(
        "bias_add",
        &binary_case(Op::BiasAdd, r.normals(n, 1.0), r.normals(40, 1.0)),
        1e-6,
    );
    check(
        "scale",
        &unary_case(Op::Scale(0.37), r.normals(n, 2.0)),
        1e-6,
    );
    check(
        "softcap",
        &unary_case(Op::LogitSoftcap(5.0), r.normals(n, 8.0)),
        1e-5,
    );
    check(
        "silu_mul",
        &binary_case(Op::SiluMul, r.normals(n, 3.0), r.normals(n, 1.0)),
        1e-5,
    );
    // GELU goes through an f16 rounding both ways: one f16 step apart at most.
    check(
        "gelu_mul",
        &binary_case(Op::GeluTanhMul, r.normals(n, 4.0), r.normals(n, 1.0)),
        2e-3,
    );
}

#[test]
fn in_place_ops_match_cpu() {
    let mut r = Rng::new(SEED + 1);
    let n = 300;
    let case = Case {
        bufs: vec![
            f32_buf(&r.normals(n, 1.0)),
            f32_buf(&r.normals(n, 1.0)),
            f32_buf(&r.normals(30, 1.0)),
        ],
        steps: vec![
            (Op::Add, vec![0, 1], vec![0]),
            (Op::SiluMul, vec![0, 1], vec![0]),
            (
                Op::RmsNorm {
                    width: 30,
                    eps: 1e-6,
                },
                vec![0, 2],
                vec![0],
            ),
        ],
        read: vec![0],
    };
    check("in place add, silu, norm", &case, 1e-5);
}

#[test]
fn row_ops_match_cpu() {
    let mut r = Rng::new(SEED + 2);
    for width in [16, 64, 300, 1024, 2053, 4096] {
        let rows = 7;
        let case = Case {
            bufs: vec![
                f32_buf(&r.normals(rows * width, 2.0)),
                f32_buf(&r.normals(width, 1.0)),
                zeros(rows * width * 4, BufKind::Activations),
            ],
            steps: vec![(Op::RmsNorm { width, eps: 1e-5 }, vec![0, 1], vec![2])],
            read: vec![2],
        };
        check(&format!("rms_norm w{width}"), &case, 1e-5);
        check(
            &format!("softmax w{width}"),
            &unary_case(Op::Softmax { width }, r.normals(rows * width, 3.0)),
            1e-5,
        );
    }
}

#[test]
fn rope_matches_cpu() {
    let mut r = Rng::new(SEED + 3);
    let (tokens, heads, head_dim) = (5, 3, 32);
    for mode in [RopeMode::Norm, RopeMode::Neox] {
        for (n_rot, factors, scale) in [(32, false, 1.0), (16, true, 0.5)] {
            let case = rope_case(
                &mut r,
                mode,
                (tokens, heads, head_dim),
                n_rot,
                factors,
                scale,
            );
            // Angles up to ~600 rad: sin/cos of large arguments differ by a few ulps of the angle.
            check(&format!("rope {mode:?} n_rot {n_rot}"), &case, 2e-4);
        }
    }
}

#[test]
fn moe_top_k_and_argmax_match_cpu() {
    let mut r = Rng::new(SEED + 4);
    let (tokens, ne, k) = (6, 8, 2);
    let case = Case {
        bufs: vec![
            f32_buf(&r.normals(tokens * ne, 2.0)),
            zeros(tokens * k * 4, BufKind::Activations),
            zeros(tokens * k * 4, BufKind::Activations),
        ],
        steps: vec![(Op::MoeTopK { n_expert: ne, k }, vec![0], vec![1, 2])],
        read: vec![1, 2],
    };
    let Some(mut g) = gpu() else { return };
    let (cpu, gpu_out) = both(&mut g, &case);
    assert_eq!(cpu[0], gpu_out[0], "expert ids (seed {SEED:#x})");
    assert!(
        rel_err(&as_f32(&gpu_out[1]), &as_f32(&cpu[1])) < 1e-5,
        "weights"
    );
    let mut x = r.normals(5 * 1000, 1.0);
    x[1000 + 17] = 9.0;
    x[1000 + 400] = 9.0; // a tie: the lower index wins
    x[3000 + 999] = f32::NAN; // rows with a non-finite value are refused
    x[4000 + 1] = f32::INFINITY;
    let case = Case {
        bufs: vec![f32_buf(&x), zeros(20, BufKind::Activations)],
        steps: vec![(Op::Argmax { width: 1000 }, vec![0], vec![1])],
        read: vec![1],
    };
    let (cpu, gpu_out) = both(&mut g, &case);
    assert_eq!(cpu[0], gpu_out[0], "argmax");
    let ids: Vec<u32> = as_f32(&gpu_out[0]).iter().map(|v| v.to_bits()).collect();
    let want: Vec<u32> = x
        .chunks(1000)
        .map(hearth::graph::reference::argmax_row)
        .collect();
    assert_eq!(ids, want, "argmax against graph::reference::argmax_row");
    assert_eq!(ids[1], 17);
    assert_eq!(ids[3..], [hearth::graph::NON_FINITE_ROW; 2]);
}

#[test]
fn argmax_of_vocabulary_wide_rows_matches_the_reference() {
    // Rows wider than one slice of the first pass: the best of each slice,
    // then the best of the slices (ties across slices: the lower index).
    let Some(mut g) = gpu() else { return };
    let mut r = Rng::new(SEED + 11);
    let width = 128_256;
    let mut x = r.normals(3 * width, 1.0);
    x[90_001] = 50.0;
    x[width - 7] = 50.0; // a later slice of the same row ties, and loses
    x[width + 100_000] = 60.0;
    x[2 * width + 77_777] = f32::NEG_INFINITY;
    let case = Case {
        bufs: vec![f32_buf(&x), zeros(12, BufKind::Activations)],
        steps: vec![(Op::Argmax { width }, vec![0], vec![1])],
        read: vec![1],
    };
    let (cpu, gpu_out) = both(&mut g, &case);
    assert_eq!(cpu[0], gpu_out[0], "argmax");
    let ids: Vec<u32> = as_f32(&gpu_out[0]).iter().map(|v| v.to_bits()).collect();
    assert_eq!(ids, [90_001, 100_000, hearth::graph::NON_FINITE_ROW]);
}

#[test]
fn top_k_matches_the_reference() {
    let Some(mut g) = gpu() else { return };
    let mut r = Rng::new(SEED + 9);
    // Widths over one slice of the first pass (4096) merge slices; the
    // ties at the top of row 1 fall in different slices.
    for (width, k) in [(1000, 40), (5003, 64), (70, 1), (64, 64), (128_256, 40)] {
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
        let (cpu, gpu_out) = both(&mut g, &case);
        let want: Vec<u32> = x
            .chunks(width)
            .flat_map(|row| hearth::graph::reference::top_k_row(row, k))
            .flat_map(|(i, v)| [i, v.to_bits()])
            .collect();
        let got: Vec<u32> = as_f32(&gpu_out[0]).iter().map(|v| v.to_bits()).collect();
        assert_eq!(
            got,
            want,
            "top-{k} of {width}-wide rows (seed {:#x})",
            SEED + 9
        );
        assert_eq!(cpu[0], gpu_out[0], "top-{k} of {width}: CPU backend");
        assert_eq!(got[4 * k], hearth::graph::NON_FINITE_ROW, "the NaN row");
    }
}

#[test]
fn dense_weight_ops_match_cpu() {
    let mut r = Rng::new(SEED + 5);
    let (k, n) = (64, 48);
    for ty in [GgmlType::F32, GgmlType::F16] {
        let w = r.normals(n * k, 0.5);
        let bytes: Vec<u8> = match ty {
            GgmlType::F16 => w
                .iter()
                .flat_map(|&v| half::f16::from_f32(v).to_le_bytes())
                .collect(),
            _ => w.iter().flat_map(|v| v.to_le_bytes()).collect(),
        };
        for (tokens, exact) in [(1, false), (5, false), (5, true)] {
            let case = Case {
                bufs: vec![
                    f32_buf(&r.normals(tokens * k, 1.0)),
                    bytes_buf(&bytes, BufKind::Weights),
                    zeros(tokens * n * 4, BufKind::Activations),
                ],
                steps: vec![(Op::MatMul { ty, k, n, exact }, vec![0, 1], vec![2])],
                read: vec![2],
            };
            check(&format!("matmul {ty} t{tokens} exact {exact}"), &case, 1e-5);
        }
        let ids = [3u32, 0, 47, 3];
        let case = Case {
            bufs: vec![
                bytes_buf(&bytes, BufKind::Weights),
                u32_buf(&ids),
                zeros(4 * k * 4, BufKind::Activations),
            ],
            steps: vec![(Op::GetRows { ty, width: k }, vec![0, 1], vec![2])],
            read: vec![2],
        };
        check(&format!("get_rows {ty}"), &case, 0.0);
    }
}

/// Split-context attention (spans of 16 positions: 3 spans over these
/// tables, one of them past every row's keys) gives what one pass gives.
#[test]
fn split_context_attention_matches_cpu() {
    let mut r = Rng::new(SEED + 7);
    for dtype in [KvType::F32, KvType::F16] {
        for (hk, hv, window) in [(16, 16, None), (32, 80, Some(9))] {
            let case = attention_case(&mut r, dtype, hk, hv, window, None);
            let Some(mut g) = gpu() else { return };
            g.set_attention_split(16);
            let (cpu, gpu_out) = both(&mut g, &case);
            let err = rel_err(&as_f32(&gpu_out[0]), &as_f32(&cpu[0]));
            println!("split attention {dtype:?} hk{hk} hv{hv} window {window:?}: relative error {err:.2e}");
            assert!(
                err <= 1e-5,
                "split attention {dtype:?} hk{hk}: error {err} (seed {SEED:#x})"
            );
            let before = g.counters();
            both(&mut g, &case);
            let d = g.counters().since(&before);
            // K and V written by one dispatch per K/V write op.
            assert_eq!(d.dispatches, 4, "K/V writes 2 x 1, attention, merge: {d}");
        }
    }
}

#[test]
fn kv_write_and_paged_attention_match_cpu() {
    let mut r = Rng::new(SEED + 6);
    for dtype in [KvType::F32, KvType::F16] {
        for (hk, hv, window, softcap) in [
            (16, 16, None, None),
            (32, 8, Some(5), None),
            (16, 80, None, Some(2.0)),
        ] {
            let case = attention_case(&mut r, dtype, hk, hv, window, softcap);
            let name =
                format!("attention {dtype:?} hk{hk} hv{hv} window {window:?} softcap {softcap:?}");
            let Some(mut g) = gpu() else { return };
            let (cpu, gpu_out) = both(&mut g, &case);
            // The caches are bit-identical (f16 rounds to nearest even both ways).
            assert!(
                cpu[1] == gpu_out[1] && cpu[2] == gpu_out[2],
                "{name}: caches differ (seed {SEED:#x})"
            );
            let err = rel_err(&as_f32(&gpu_out[0]), &as_f32(&cpu[0]));
            println!("{name}: relative error {err:.2e}");
            assert!(err <= 1e-5, "{name}: error {err} (seed {SEED:#x})");
        }
    }
}

/// The experts of a MoE layer against the CPU backend's exact-f32 mode,
/// on fresh random data (the seed is printed): quantized and float weights,
/// both activations, a decode-sized and a prompt-sized step (one entry per
/// expert, and several sharing each pass over an expert's rows).
#[test]
fn moe_experts_match_cpu() {
    use hearth::quant::reference;
    let Some(mut g) = gpu() else { return };
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(1, |d| d.as_nanos() as u64);
    let mut r = Rng::new(seed);
    let quantized = |ty: GgmlType, cols: usize, rows: usize, r: &mut Rng| {
        let x = r.normals(cols * rows, 1.0);
        let mut out = Vec::new();
        reference::quantize(ty, &x, &mut out).expect("quantize");
        out
    };
    let (ne, k, n_embd, n_ff) = (8, 2, 256, 256);
    for (ty, act, tokens) in [
        (GgmlType::Q4_K, Activation::Silu, 1),
        (GgmlType::Q4_K, Activation::Silu, 13),
        (GgmlType::Q8_0, Activation::GeluTanh, 5),
        (GgmlType::Q5_1, Activation::Silu, 3),
        (GgmlType::F16, Activation::Silu, 4),
    ] {
        let gate = quantized(ty, n_embd, ne * n_ff, &mut r);
        let up = quantized(ty, n_embd, ne * n_ff, &mut r);
        let down = quantized(ty, n_ff, ne * n_embd, &mut r);
        let logits = r.normals(tokens * ne, 2.0);
        let x = r.normals(tokens * n_embd, 1.0);
        let moe = Op::MoeExperts {
            layer: 0,
            n_expert: ne,
            k,
            n_embd,
            n_ff,
            act,
            tys: [ty; 3],
            exact: true,
        };
        assert!(g.supports(&moe), "{moe:?}");
        let steps = vec![
            (Op::MoeTopK { n_expert: ne, k }, vec![1], vec![2, 3]),
            (moe, vec![0, 2, 3, 4, 5, 6], vec![7]),
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
        let mut cpu = hearth::backend::cpu::CpuBackend::new(1);
        let on_cpu = case_for(&|t, c, w| weight_buf(&cpu, t, c, w));
        let want = run(&mut cpu, &on_cpu);
        let on_gpu = case_for(&|t, c, w| weight_buf(&g, t, c, w));
        let got = run(&mut g, &on_gpu);
        assert_eq!(want[1], got[1], "routed experts (seed {seed:#x})");
        let err = rel_err(&as_f32(&got[0]), &as_f32(&want[0]));
        println!("moe {ty} {act:?} x{tokens}: relative error {err:.2e}");
        // The CPU rounds F16 products' activations to f16; the GPU keeps f32.
        let tol = if ty == GgmlType::F16 { 2e-3 } else { 1e-4 };
        assert!(
            err <= tol,
            "moe {ty} {act:?} x{tokens}: {err} (seed {seed:#x})"
        );
    }
}

/// An id at or past the layer's experts contributes nothing (an expert the
/// expert cache computes elsewhere), on the GPU as on the CPU.
#[test]
fn moe_experts_leave_out_ids_past_the_experts() {
    let Some(mut g) = gpu() else { return };
    let case_for = moe_ids_past_the_experts(&mut Rng::new(SEED + 9));
    let mut cpu = hearth::backend::cpu::CpuBackend::new(1);
    let on_cpu = case_for(&|t, c, w| weight_buf(&cpu, t, c, w));
    let want = run(&mut cpu, &on_cpu);
    let on_gpu = case_for(&|t, c, w| weight_buf(&g, t, c, w));
    let got = run(&mut g, &on_gpu);
    let err = rel_err(&as_f32(&got[0]), &as_f32(&want[0]));
    assert!(err <= 1e-5, "relative error {err}");
    assert!(as_f32(&want[0]).iter().all(|v| v.is_finite()));
}

/// Stacked expert weights past one binding are refused (the load check
/// names them), not miscomputed.
#[test]
fn oversized_experts_are_refused_not_miscomputed() {
    let Some(g) = gpu() else { return };
    use hearth::backend::Backend;
    let moe = |n_expert| Op::MoeExperts {
        layer: 0,
        n_expert,
        k: 2,
        n_embd: 4096,
        n_ff: 16384,
        act: Activation::Silu,
        tys: [GgmlType::F32; 3],
        exact: false,
    };
    assert!(!g.supports(&moe(1 << 12)));
    assert!(g.supports(&moe(1)) || g.context().caps.max_storage_binding < 256 << 20);
}

/// The fused ops of a plan compute on the GPU what the ops apart compute
/// on the CPU: the ropes of q and k at the same positions (in place) with
/// the K/V write (one rope dispatch and the write), then a residual add
/// (in place) whose sum is RMS-normed and multiplied by an f32 weight
/// (the add and norm in one dispatch, then the product; the int8
/// quantizing the norm takes on for quantized weights is the next test's).
/// 6 ops, 4 dispatches.
#[test]
fn fused_rope_pair_and_add_norm_match_cpu() {
    let mut r = Rng::new(SEED + 11);
    let (rows, head_dim, n_head, n_kv, width) = (3usize, 8usize, 4usize, 2usize, 64usize);
    let pos: Vec<u32> = (0..rows as u32).map(|i| 5 + 7 * i).collect();
    let slots: Vec<u32> = (0..rows as u32).map(|i| 16 + 3 * i).collect();
    let rope = Op::Rope {
        mode: RopeMode::Neox,
        head_dim,
        n_rot: head_dim,
        base: 10000.0,
        scale: 1.0,
    };
    let (kw, ty, n) = (n_kv * head_dim, GgmlType::F32, 8usize);
    let write = Op::KvWrite {
        layer: 0,
        k_width: kw,
        v_width: kw,
        dtype: KvType::F32,
    };
    let norm = Op::RmsNorm { width, eps: 1e-5 };
    let weight = r.normals(n * width, 0.5);
    let cache = 32 * kw * 4;
    let plain = Case {
        bufs: vec![
            f32_buf(&r.normals(rows * n_head * head_dim, 1.0)), // 0 q
            f32_buf(&r.normals(rows * kw, 1.0)),                // 1 k
            f32_buf(&r.normals(rows * kw, 1.0)),                // 2 v
            u32_buf(&pos),                                      // 3 positions
            u32_buf(&slots),                                    // 4 slots
            zeros(cache, BufKind::KvCache),                     // 5 K cache
            zeros(cache, BufKind::KvCache),                     // 6 V cache
            f32_buf(&r.normals(rows * width, 1.0)),             // 7 residual
            f32_buf(&r.normals(rows * width, 1.0)),             // 8 branch
            f32_buf(&r.normals(width, 0.5)),                    // 9 norm weight
            zeros(rows * width * 4, BufKind::Activations),      // 10 normed
            f32_buf(&weight),                                   // 11 weight
            zeros(rows * n * 4, BufKind::Activations),          // 12 product
        ],
        steps: vec![
            (rope.clone(), vec![0, 3], vec![0]),
            (rope, vec![1, 3], vec![1]),
            (write, vec![1, 2, 4], vec![5, 6]),
            (Op::Add, vec![7, 8], vec![7]),
            (norm, vec![7, 9], vec![10]),
            (
                Op::MatMul {
                    ty,
                    k: width,
                    n,
                    exact: false,
                },
                vec![10, 11],
                vec![12],
            ),
        ],
        read: vec![0, 1, 5, 6, 7, 10, 12],
    };
    let Some(mut g) = gpu() else { return };
    let case = fused_case(&g, &plain);
    let kinds: Vec<&str> = case.steps.iter().map(|(op, ..)| op.name()).collect();
    assert_eq!(kinds, ["RopeKvWrite", "FusedMatMul"]);
    let mut cpu = hearth::backend::cpu::CpuBackend::new(1);
    let (want, got) = (run(&mut cpu, &plain), run(&mut g, &case));
    for (i, (c, w)) in want.iter().zip(&got).enumerate() {
        let tol = 2e-5;
        let err = rel_err(&as_f32(w), &as_f32(c));
        println!("fused output {i}: relative error {err:.2e}");
        assert!(
            err <= tol,
            "fused output {i}: error {err} > {tol} (seed {SEED:#x})"
        );
    }
    let before = g.counters();
    run(&mut g, &case);
    let d = g.counters().since(&before);
    assert_eq!(
        d.dispatches, 4,
        "ropes, K/V write, add + norm, product: {d}"
    );
}

/// `[rows, width]` rows RMS-normed in f64: `x / rms(x) * w`.
fn rms_norm_f64(x: &[f32], w: &[f32], eps: f64) -> Vec<f64> {
    x.chunks(w.len())
        .flat_map(|r| {
            let ms = r.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / r.len() as f64;
            let s = 1.0 / (ms + eps).sqrt();
            r.iter()
                .zip(w)
                .map(move |(&v, &g)| f64::from(v) * s * f64::from(g))
        })
        .collect()
}

/// `y[t, r] = x[t, :] · W[r, :]` in f64 over a dequantized `[n, k]` weight.
fn matmul_f64(x: &[f64], w: &[f32], k: usize) -> Vec<f64> {
    x.chunks(k)
        .flat_map(|xt| {
            w.chunks(k)
                .map(move |r| r.iter().zip(xt).map(|(&a, &b)| f64::from(a) * b).sum())
        })
        .collect()
}

/// `x` through the int8 activation quantizer of the matrix-vector kernels
/// (ggml's q8_1: per 32 values d = max|x| / 127, q = round(x / d)), back.
fn q8_round_trip(x: &[f64]) -> Vec<f64> {
    x.chunks(32)
        .flat_map(|b| {
            let d = b.iter().fold(0.0f64, |m, v| m.max(v.abs())) / 127.0;
            b.iter().map(move |v| {
                if d > 0.0 {
                    (v / d).round_ties_even() * d
                } else {
                    0.0
                }
            })
        })
        .collect()
}

/// Normalized MSE of `got` against `want`.
fn nmse(got: &[f32], want: &[f64]) -> f64 {
    let e: f64 = got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).powi(2))
        .sum();
    e / want.iter().map(|w| w * w).sum::<f64>().max(1e-30)
}

/// The int8 activation quantizers fused into the ops before a quantized
/// matrix product (a residual add and its RMS norm: norm_quantize; a
/// SwiGLU: quantize_x_gated) against f64 on `quant::reference`'s
/// dequantized weight: the add exact, the norm and the activation to f32
/// rounding, the products as the f64 product of the activations through
/// the int8 quantizer (a quant rounded the other way at a tie of f32
/// rounding stays far below the bound) and near the exact product.
/// Widths: 12 groups of 8 for a workgroup of 64, 100 (a second, partial
/// group per invocation), 132 for one of 256 (partial), and 1056 (past
/// the four groups an invocation holds in registers); 1 and 3 tokens.
#[test]
fn fused_int8_quantizers_match_the_reference() {
    let Some(mut g) = gpu() else { return };
    let ty = GgmlType::Q8_0;
    let n = 8;
    for (case, width) in [96usize, 800, 1056, 8448].into_iter().enumerate() {
        for m in [1usize, 3] {
            let seed = SEED + 40 + 4 * case as u64 + m as u64;
            let mut r = Rng::new(seed);
            let (res, branch) = (r.normals(m * width, 1.0), r.normals(m * width, 1.0));
            let (nw, gate, up) = (
                r.normals(width, 0.5),
                r.normals(m * width, 2.0),
                r.normals(m * width, 1.0),
            );
            let wv = r.normals(n * width, 0.5);
            let mut wq = Vec::new();
            hearth::quant::reference::quantize(ty, &wv, &mut wq).expect("quantize");
            let mut deq = vec![0.0f32; n * width];
            hearth::quant::reference::dequantize(ty, &wq, &mut deq).expect("dequantize");
            let f32s = |g: &mut hearth::backend::webgpu::WebGpuBackend, v: &[f32]| {
                let b = g
                    .alloc(v.len() as u64 * 4, BufKind::Activations)
                    .expect("alloc");
                g.upload(&b, 0, bytemuck::cast_slice(v)).expect("upload");
                b
            };
            let bufs = [&res, &branch, &nw, &gate, &up].map(|v| f32s(&mut g, v));
            let outs =
                [m * width, m * n, m * width, m * n].map(|len| f32s(&mut g, &vec![f32::NAN; len]));
            let wbuf = g
                .alloc(g.weight_bytes(ty, width, n), BufKind::Weights)
                .expect("alloc");
            g.upload_weight_rows(&wbuf, ty, width, 0, &wq)
                .expect("upload weight");
            let mm = Op::MatMul {
                ty,
                k: width,
                n,
                exact: false,
            };
            // Buffers by index: res, branch, norm weight, gate, up, the
            // four outputs, the weight.
            let all: Vec<&hearth::backend::webgpu::GpuBuffer> =
                bufs.iter().chain(&outs).chain([&wbuf]).collect();
            let steps = [
                (Op::Add, vec![0, 1], vec![0]),
                (Op::RmsNorm { width, eps: 1e-5 }, vec![0, 2], vec![5]),
                (mm.clone(), vec![5, 9], vec![6]),
                (Op::SiluMul, vec![3, 4], vec![7]),
                (mm, vec![7, 9], vec![8]),
            ];
            let sizes: Vec<u64> = all.iter().map(|b| b.len).collect();
            let fused = fuse_steps(&g, &steps, &sizes);
            assert_eq!(fused.len(), 2, "{fused:?}");
            let before = g.counters();
            for (op, ins, outs) in &fused {
                let inputs: Vec<_> = ins.iter().map(|&i| all[i]).collect();
                let outputs: Vec<_> = outs.iter().map(|&i| all[i]).collect();
                let io = OpIo {
                    inputs: &inputs,
                    outputs: &outputs,
                };
                g.record(op, &io).unwrap_or_else(|e| panic!("{op:?}: {e}"));
            }
            g.submit().expect("submit");
            let d = g.counters().since(&before);
            assert_eq!(
                d.dispatches, 4,
                "norm_quantize, matvec, quantize_x_gated, matvec: {d}"
            );
            let read = |g: &hearth::backend::webgpu::WebGpuBackend, b| {
                as_f32(&pollster::block_on(g.download(b, 0..b.len)).expect("download"))
            };
            let sum: Vec<f32> = res.iter().zip(&branch).map(|(a, b)| a + b).collect();
            assert_eq!(
                read(&g, &bufs[0]),
                sum,
                "width {width} m {m}: the residual sum"
            );
            let normed = rms_norm_f64(&sum, &nw, 1e-5);
            let act: Vec<f64> = gate
                .iter()
                .zip(&up)
                .map(|(&g, &u)| f64::from(g) / (1.0 + (-f64::from(g)).exp()) * f64::from(u))
                .collect();
            let what = format!("width {width} m {m} (seed {seed:#x})");
            let (y_norm, y_act) = (read(&g, &outs[1]), read(&g, &outs[3]));
            let int8 = |x: &[f64]| matmul_f64(&q8_round_trip(x), &deq, width);
            for (name, got, want, bound) in [
                ("norm", read(&g, &outs[0]), normed.clone(), 1e-11),
                ("SwiGLU", read(&g, &outs[2]), act.clone(), 1e-11),
                ("normed product", y_norm.clone(), int8(&normed), 1e-7),
                ("SwiGLU product", y_act.clone(), int8(&act), 1e-7),
                (
                    "normed product, exact",
                    y_norm,
                    matmul_f64(&normed, &deq, width),
                    1e-3,
                ),
                (
                    "SwiGLU product, exact",
                    y_act,
                    matmul_f64(&act, &deq, width),
                    1e-3,
                ),
            ] {
                let e = nmse(&got, &want);
                println!("{what}: {name} nmse {e:.2e}");
                assert!(e <= bound, "{what}: {name} nmse {e:.3e} > {bound:.0e}");
            }
        }
    }
}
