//! Every kernel variant on a real adapter (lavapipe in CI) against
//! `quant::reference`: weights quantized by the reference, dequantized by
//! it, and dotted in f64; the GPU result must match by normalized MSE
//! within the bound of the variant's arithmetic. Shapes are tiny (lavapipe
//! runs at ~0.3 GFLOP/s), ragged, and every weight is split in two parts.
//!
//! Without an adapter the tests print why and pass, unless
//! `HEARTH_REQUIRE_GPU=1`, which makes that a failure.

use super::super::caps::GpuCaps;
use super::super::context::GpuContext;
use super::super::WebGpuBackend;
use super::{
    packed_layout, BufRef, GetRowsArgs, KernelConfig, MatmulArgs, QuantKernels, Repacker,
    WeightPart,
};
use crate::backend::packed::tests::values;
use crate::backend::{Backend, BufKind};
use crate::quant::WEIGHT_TYPES;
use crate::quant::{reference, GgmlType};

const K: u64 = 256;
const N: u64 = 37;
/// Rows of the first part; the rest go to the second.
const SPLIT: u64 = 20;

fn backend() -> Option<WebGpuBackend> {
    match pollster::block_on(GpuContext::for_tests()) {
        Ok(Some(ctx)) => Some(WebGpuBackend::new(ctx)),
        Ok(None) => None,
        Err(e) => panic!("HEARTH_REQUIRE_GPU=1 but: {e}"),
    }
}

/// A random `[N, k]` weight of `ty`: its GGUF bytes and dequantized values.
fn weight(ty: GgmlType, k: u64, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let w = values(seed, (N * k) as usize);
    let mut gguf = Vec::new();
    reference::quantize(ty, &w, &mut gguf).expect("quantize");
    let mut deq = vec![0.0f32; (N * k) as usize];
    reference::dequantize(ty, &gguf, &mut deq).expect("dequantize");
    (gguf, deq)
}

/// Uploads `gguf` repacked into two parts (rows 0..SPLIT, SPLIT..N).
fn upload_parts(
    be: &WebGpuBackend,
    ty: GgmlType,
    k: u64,
    gguf: &[u8],
) -> Vec<(crate::backend::webgpu::GpuBuffer, u64, u64)> {
    let mut rp = Repacker::new(ty, N, k).expect("repacker");
    let rb = rp.gguf_row_bytes();
    let layout = packed_layout(ty, N, k).expect("layout");
    let mut parts = Vec::new();
    for (first, rows) in [(0, SPLIT), (SPLIT, N - SPLIT)] {
        let mut packed = Vec::new();
        let src = &gguf[first as usize * rb..(first + rows) as usize * rb];
        rp.push_rows(src, &mut packed).expect("repack");
        let buf = be
            .alloc(layout.part_bytes(rows), BufKind::Weights)
            .expect("alloc");
        be.upload(&buf, 0, &packed).expect("upload");
        parts.push((buf, first, rows));
    }
    rp.finish().expect("all rows");
    parts
}

fn f32_buffer(be: &WebGpuBackend, v: &[f32]) -> crate::backend::webgpu::GpuBuffer {
    let buf = be
        .alloc(v.len() as u64 * 4, BufKind::Activations)
        .expect("alloc");
    be.upload(&buf, 0, bytemuck::cast_slice(v)).expect("upload");
    buf
}

fn download_f32(be: &WebGpuBackend, b: &crate::backend::webgpu::GpuBuffer) -> Vec<f32> {
    let bytes = pollster::block_on(be.download(b, 0..b.len)).expect("download");
    bytemuck::pod_collect_to_vec(&bytes)
}

/// Normalized MSE of `got` against `want`.
fn nmse(got: &[f32], want: &[f64]) -> f64 {
    let (mut e, mut s) = (0.0, 0.0);
    for (&g, &w) in got.iter().zip(want) {
        e += (f64::from(g) - w).powi(2);
        s += w * w;
    }
    e / s.max(1e-30)
}

/// `x` through the int8 matrix-vector path's activation quantizer, in its
/// f32 arithmetic (per 32 values d = max|x| / 127, q = round(x * (1 / d)),
/// ties to even), back to values q * d.
fn q8_round_trip(x: &[f32]) -> Vec<f64> {
    x.chunks(32)
        .flat_map(|b| {
            let d = b.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0;
            let id = if d > 0.0 { 1.0 / d } else { 0.0 };
            b.iter()
                .map(move |&v| f64::from((v * id).round_ties_even()) * f64::from(d))
        })
        .collect()
}

/// One matmul of `m` tokens and rows of `k`; returns the normalized MSE
/// against f64, of x as it is or (`int8_x`) through the int8 path's
/// activation quantizer.
fn matmul_case(
    be: &mut WebGpuBackend,
    qk: &QuantKernels,
    ty: GgmlType,
    (m, k): (u64, u64),
    (seed, int8_x): (u64, bool),
) -> f64 {
    let (gguf, deq) = weight(ty, k, seed);
    let x = values(seed ^ 0xA5A5, (m * k) as usize);
    let parts = upload_parts(be, ty, k, &gguf);
    let xb = f32_buffer(be, &x);
    let yb = f32_buffer(be, &vec![f32::NAN; (m * N) as usize]);
    let w: Vec<WeightPart> = parts
        .iter()
        .map(|(b, first, rows)| WeightPart {
            buffer: &b.raw,
            offset: 0,
            first_row: *first,
            rows: *rows,
        })
        .collect();
    let args = MatmulArgs {
        ty,
        k,
        n: N,
        m,
        x: BufRef {
            buffer: &xb.raw,
            offset: 0,
        },
        w: &w,
        y: BufRef {
            buffer: &yb.raw,
            offset: 0,
        },
    };
    qk.encode_matmul(be, &args).expect("encode");
    be.submit().expect("submit");
    let y = download_f32(be, &yb);
    let xr: Vec<f64> = if int8_x {
        q8_round_trip(&x)
    } else {
        x.iter().map(|&v| f64::from(v)).collect()
    };
    let mut want = vec![0.0f64; (m * N) as usize];
    for t in 0..m as usize {
        for r in 0..N as usize {
            let k = k as usize;
            let row = &deq[r * k..(r + 1) * k];
            let xt = &xr[t * k..(t + 1) * k];
            want[t * N as usize + r] = row.iter().zip(xt).map(|(&a, &b)| f64::from(a) * b).sum();
        }
    }
    nmse(&y, &want)
}

/// The adapter's caps with and without its f16 and subgroups, so both the
/// fast paths and the fallbacks run.
fn caps_variants(caps: &GpuCaps) -> Vec<(&'static str, GpuCaps)> {
    vec![
        ("native", caps.clone()),
        ("fallback", caps.clone().without_f16().without_subgroups()),
    ]
}

/// Every format at each (tokens, row length) of `shapes`, under each
/// `(int8, mv_w4, tiles)` kernel setting of `configs` (`tiles`: comma-separated
/// overrides of [`KernelConfig::set`], or empty), within `bound(int8 path,
/// f16 tiles, tokens)`.
fn check_matmul(
    shapes: &[(u64, u64)],
    configs: &[(bool, bool, &str)],
    bound: impl Fn(bool, bool, u64) -> f64,
) {
    let Some(mut be) = backend() else { return };
    let base = be.context().caps.clone();
    println!("adapter: {base}");
    let mut failures = Vec::new();
    let mut worst = std::collections::BTreeMap::new();
    for (name, caps) in caps_variants(&base) {
        for &(i8, w4, tile) in configs {
            let mut cfg = KernelConfig {
                int8: i8,
                mv_w4: w4,
                ..KernelConfig::default()
            };
            for o in tile.split(',').filter(|o| !o.is_empty()) {
                cfg.set(o).expect("a valid override");
            }
            let f16_tiles = cfg.f16_tiles(&caps);
            let qk = QuantKernels::new(&caps, cfg);
            for (i, ty) in WEIGHT_TYPES.into_iter().enumerate() {
                for &(m, k) in shapes {
                    let seed = 0x6E0_0000 + (i as u64) * 16 + m + k;
                    let int8_path = i8 && super::sources::has_int8(ty);
                    let e = matmul_case(&mut be, &qk, ty, (m, k), (seed, int8_path));
                    let b = bound(int8_path, f16_tiles, m);
                    let w = worst.entry((name, int8_path)).or_insert(0.0f64);
                    *w = w.max(e);
                    if e.is_nan() || e > b {
                        failures.push(format!(
                            "{ty} {name} int8={i8} w4={w4} {tile} m={m} k={k}: nmse {e:.3e} > {b:.0e} (seed {seed:#x})"
                        ));
                    }
                }
            }
        }
    }
    for ((caps, int8), e) in &worst {
        println!("worst nmse, {caps} caps, int8 path {int8}: {e:.2e}");
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn matvec_matches_reference_on_gpu() {
    // int8: against the activations through the same quantizer, so only
    // f32 summation (and a quant rounded the other way where the GPU's
    // 1 / d differs in its last bit) remains; an item read with the wrong
    // scale or position is > 1e-4. Rows of one block and of eight (the
    // 16-byte item files need rows at multiples of 16 bytes: Q6_K's of 8
    // blocks are, of 1 are not). The 16-byte loads are off by default
    // (slower on the H200) and checked here all the same.
    // Several rows per team (min groups 1, so that the 37 rows keep them):
    // 4 and 8 rows, ragged at the parts' ends.
    check_matmul(
        &[(1, K), (3, K), (1, 8 * K), (3, 8 * K)],
        &[
            (false, false, ""),
            (true, false, ""),
            (true, true, ""),
            (true, false, "mv_lane_rows=4,mv_min_groups=1"),
            (true, true, "mv_lane_rows=8,mv_min_groups=1"),
            (
                true,
                false,
                "mv_lane_rows=2,mv_lane_items=2,mv_min_groups=1",
            ),
        ],
        |int8, _, _| if int8 { 1e-8 } else { 1e-11 },
    );
}

#[test]
fn tiled_matmul_matches_reference_on_gpu() {
    // 70 tokens: one ragged token tile of 8 x 8 outputs per invocation, or
    // two of 4 x 4 (the second ragged); f16 tiles round x and w.
    let configs = [
        (false, false, ""),
        (false, false, "tile=64x64x4,tile_f16=1"),
    ];
    check_matmul(&[(11, K), (70, K)], &configs, |_, f16, _| {
        if f16 {
            1e-6
        } else {
            1e-11
        }
    });
}

#[test]
fn get_rows_matches_dequantize_on_gpu() {
    let Some(mut be) = backend() else { return };
    let qk = QuantKernels::new(&be.context().caps.clone(), KernelConfig::default());
    let ids: Vec<u32> = vec![0, 36, 19, 20, 5, 36];
    for (i, ty) in WEIGHT_TYPES.into_iter().enumerate() {
        let seed = 0x6E7_0000 + i as u64;
        let (gguf, deq) = weight(ty, K, seed);
        let parts = upload_parts(&be, ty, K, &gguf);
        let idb = be
            .alloc(ids.len() as u64 * 4, BufKind::Activations)
            .expect("alloc");
        be.upload(&idb, 0, bytemuck::cast_slice(&ids))
            .expect("upload");
        let yb = f32_buffer(&be, &vec![f32::NAN; ids.len() * K as usize]);
        let w: Vec<WeightPart> = parts
            .iter()
            .map(|(b, first, rows)| WeightPart {
                buffer: &b.raw,
                offset: 0,
                first_row: *first,
                rows: *rows,
            })
            .collect();
        let args = GetRowsArgs {
            ty,
            k: K,
            n: N,
            ids: BufRef {
                buffer: &idb.raw,
                offset: 0,
            },
            count: ids.len() as u64,
            w: &w,
            y: BufRef {
                buffer: &yb.raw,
                offset: 0,
            },
        };
        qk.encode_get_rows(&mut be, &args).expect("encode");
        be.submit().expect("submit");
        let y = download_f32(&be, &yb);
        for (t, &id) in ids.iter().enumerate() {
            let got = &y[t * K as usize..(t + 1) * K as usize];
            let want = &deq[id as usize * K as usize..(id as usize + 1) * K as usize];
            for (j, (&g, &w)) in got.iter().zip(want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
                    "{ty} id {id} value {j}: {g} vs {w} (seed {seed:#x})"
                );
            }
        }
    }
}

/// Three weights side by side in one buffer ([`Backend::alloc_weights`])
/// over the same activations, as q, k and v: their matvecs join into one
/// dispatch at one token (one row per team, and four), each output as its
/// own matvec's; three tokens run them apart.
#[test]
fn joined_matvecs_match_reference_on_gpu() {
    let Some(mut be) = backend() else { return };
    let caps = be.context().caps.clone();
    for cfg in ["", "mv_min_groups=1"] {
        let mut c = KernelConfig::default();
        for o in cfg.split(',').filter(|o| !o.is_empty()) {
            c.set(o).expect("a valid override");
        }
        let qk = QuantKernels::new(&caps, c);
        for (i, ty) in [GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0]
            .into_iter()
            .enumerate()
        {
            for m in [1u64, 3] {
                let k = 8 * K;
                let seed = 0x6E8_0000 + (i as u64) * 16 + m;
                let weights: Vec<_> = (0..3).map(|j| weight(ty, k, seed + 100 * j)).collect();
                let bytes = packed_layout(ty, N, k).expect("layout").part_bytes(N);
                let bufs = be.alloc_weights(&[bytes; 3]).expect("alloc");
                assert!(
                    bufs.iter().all(|b| b.raw == bufs[0].raw),
                    "one shared buffer"
                );
                for (b, (gguf, _)) in bufs.iter().zip(&weights) {
                    be.upload_weight_rows(b, ty, k as usize, 0, gguf)
                        .expect("upload");
                }
                let x = values(seed ^ 0xA5A5, (m * k) as usize);
                let xb = f32_buffer(&be, &x);
                let ys: Vec<_> = (0..3)
                    .map(|_| f32_buffer(&be, &vec![f32::NAN; (m * N) as usize]))
                    .collect();
                let before = be.counters().dispatches;
                for (b, y) in bufs.iter().zip(&ys) {
                    let w = [WeightPart {
                        buffer: &b.raw,
                        offset: b.offset,
                        first_row: 0,
                        rows: N,
                    }];
                    let args = MatmulArgs {
                        ty,
                        k,
                        n: N,
                        m,
                        x: BufRef {
                            buffer: &xb.raw,
                            offset: 0,
                        },
                        w: &w,
                        y: BufRef {
                            buffer: &y.raw,
                            offset: 0,
                        },
                    };
                    qk.encode_matmul(&mut be, &args).expect("encode");
                }
                qk.flush_join(&mut be).expect("flush");
                be.submit().expect("submit");
                // Joined at one token per workgroup only.
                let want = if m == 1 { 2 } else { 4 };
                assert_eq!(
                    be.counters().dispatches - before,
                    want,
                    "{ty} {cfg} m={m}: the quantizer and the matvecs"
                );
                let xr = q8_round_trip(&x);
                for (j, ((_, deq), y)) in weights.iter().zip(&ys).enumerate() {
                    let mut want = vec![0.0f64; (m * N) as usize];
                    for t in 0..m as usize {
                        for r in 0..N as usize {
                            let row = &deq[r * k as usize..(r + 1) * k as usize];
                            let xt = &xr[t * k as usize..(t + 1) * k as usize];
                            want[t * N as usize + r] =
                                row.iter().zip(xt).map(|(&a, &b)| f64::from(a) * b).sum();
                        }
                    }
                    let e = nmse(&download_f32(&be, y), &want);
                    assert!(
                        e < 1e-8,
                        "{ty} {cfg} m={m} weight {j}: nmse {e:.3e} (seed {seed:#x})"
                    );
                }
            }
        }
    }
}
