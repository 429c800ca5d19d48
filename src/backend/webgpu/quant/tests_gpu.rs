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
use super::layout::tests::values;
use super::{
    packed_layout, BufRef, GetRowsArgs, KernelConfig, MatmulArgs, QuantKernels, Repacker,
    WeightPart, SUPPORTED_TYPES,
};
use crate::backend::{Backend, BufKind};
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

/// A random `[N, K]` weight of `ty`: its GGUF bytes and dequantized values.
fn weight(ty: GgmlType, seed: u64) -> (Vec<u8>, Vec<f32>) {
    let w = values(seed, (N * K) as usize);
    let mut gguf = Vec::new();
    reference::quantize(ty, &w, &mut gguf).expect("quantize");
    let mut deq = vec![0.0f32; (N * K) as usize];
    reference::dequantize(ty, &gguf, &mut deq).expect("dequantize");
    (gguf, deq)
}

/// Uploads `gguf` repacked into two parts (rows 0..SPLIT, SPLIT..N).
fn upload_parts(
    be: &WebGpuBackend,
    ty: GgmlType,
    gguf: &[u8],
) -> Vec<(crate::backend::webgpu::GpuBuffer, u64, u64)> {
    let mut rp = Repacker::new(ty, N, K).expect("repacker");
    let rb = rp.gguf_row_bytes();
    let layout = packed_layout(ty, N, K).expect("layout");
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

/// One matmul of `m` tokens; returns the normalized MSE against f64.
fn matmul_case(be: &mut WebGpuBackend, qk: &QuantKernels, ty: GgmlType, m: u64, seed: u64) -> f64 {
    let (gguf, deq) = weight(ty, seed);
    let x = values(seed ^ 0xA5A5, (m * K) as usize);
    let parts = upload_parts(be, ty, &gguf);
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
        k: K,
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
    let mut want = vec![0.0f64; (m * N) as usize];
    for t in 0..m as usize {
        for r in 0..N as usize {
            let row = &deq[r * K as usize..(r + 1) * K as usize];
            let xt = &x[t * K as usize..(t + 1) * K as usize];
            want[t * N as usize + r] = row
                .iter()
                .zip(xt)
                .map(|(&a, &b)| f64::from(a) * f64::from(b))
                .sum();
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

fn check_matmul(ms: &[u64], int8: &[bool], bound: impl Fn(bool, bool, u64) -> f64) {
    let Some(mut be) = backend() else { return };
    let base = be.context().caps.clone();
    println!("adapter: {base}");
    let mut failures = Vec::new();
    let mut worst = std::collections::BTreeMap::new();
    for (name, caps) in caps_variants(&base) {
        for &i8 in int8 {
            let qk = QuantKernels::new(
                &caps,
                KernelConfig {
                    int8: i8,
                    ..KernelConfig::default()
                },
            );
            for (i, ty) in SUPPORTED_TYPES.into_iter().enumerate() {
                for &m in ms {
                    let seed = 0x6E0_0000 + (i as u64) * 16 + m;
                    let e = matmul_case(&mut be, &qk, ty, m, seed);
                    let int8_path = i8 && super::sources::has_int8(ty);
                    let b = bound(int8_path, caps.f16, m);
                    let w = worst.entry((name, int8_path)).or_insert(0.0f64);
                    *w = w.max(e);
                    if e.is_nan() || e > b {
                        failures.push(format!(
                            "{ty} {name} int8={i8} m={m}: nmse {e:.3e} > {b:.0e} (seed {seed:#x})"
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
    // int8: activations quantized per 32 values (~2e-5 measured for uniform data).
    check_matmul(
        &[1, 3],
        &[false, true],
        |int8, _, _| if int8 { 1e-4 } else { 1e-11 },
    );
}

#[test]
fn tiled_matmul_matches_reference_on_gpu() {
    // 70 tokens: two token tiles, the second ragged; f16 tiles round x and w.
    check_matmul(
        &[11, 70],
        &[false],
        |_, f16, _| if f16 { 1e-6 } else { 1e-11 },
    );
}

#[test]
fn get_rows_matches_dequantize_on_gpu() {
    let Some(mut be) = backend() else { return };
    let qk = QuantKernels::new(&be.context().caps.clone(), KernelConfig::default());
    let ids: Vec<u32> = vec![0, 36, 19, 20, 5, 36];
    for (i, ty) in SUPPORTED_TYPES.into_iter().enumerate() {
        let seed = 0x6E7_0000 + i as u64;
        let (gguf, deq) = weight(ty, seed);
        let parts = upload_parts(&be, ty, &gguf);
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
