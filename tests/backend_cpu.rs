//! The `Backend` trait on the CPU: buffers, uploads, recorded ops and
//! downloads give what the CPU functions give directly.

mod model_support;

use hearth::backend::cpu::kernels::KernelTable;
use hearth::backend::cpu::matmul::{matmul, Weight};
use hearth::backend::cpu::threads::Threads;
use hearth::backend::cpu::{CpuBackend, CpuBuffer};
use hearth::backend::{Backend, BufKind, OpIo};
use hearth::graph::reference as ops;
use hearth::graph::KvType;
use hearth::graph::Op;
use hearth::graph::RopeMode;

use hearth::quant::{reference, GgmlType};
use model_support::rng::Rng;

fn upload_f32(b: &CpuBackend, x: &[f32]) -> CpuBuffer {
    let buf = b
        .alloc(x.len() as u64 * 4, BufKind::Activations)
        .expect("alloc");
    b.upload(&buf, 0, bytemuck::cast_slice(x)).expect("upload");
    buf
}

fn download_f32(b: &CpuBackend, buf: &CpuBuffer, n: usize) -> Vec<f32> {
    let bytes = pollster::block_on(b.download(buf, 0..n as u64 * 4)).expect("download");
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

#[test]
fn recorded_ops_match_direct_calls() {
    let seed = 5;
    let mut rng = Rng::new(seed);
    let mut b = CpuBackend::new(2);
    assert!(b.caps().name.starts_with("cpu"));
    let (rows, width) = (3, 64);
    let x = rng.normals(rows * width, 1.0);
    let w = rng.normals(width, 1.0);
    let (xb, wb) = (upload_f32(&b, &x), upload_f32(&b, &w));
    let out = b
        .alloc((rows * width * 4) as u64, BufKind::Activations)
        .expect("alloc");
    let op = Op::RmsNorm { width, eps: 1e-5 };
    assert!(b.supports(&op));
    b.record(
        &op,
        &OpIo {
            inputs: &[&xb, &wb],
            outputs: &[&out],
        },
    )
    .expect("rms norm");
    b.submit().expect("submit");
    let mut want = x.clone();
    ops::rms_norm(&mut want, &w, 1e-5);
    assert_eq!(download_f32(&b, &out, rows * width), want, "seed {seed}");
    // RoPE in place on the output buffer.
    let pos: Vec<u32> = vec![0, 5, 9];
    let pb = b.alloc(12, BufKind::Activations).expect("alloc");
    b.upload(&pb, 0, bytemuck::cast_slice(&pos))
        .expect("upload");
    let op = Op::Rope {
        mode: RopeMode::Neox,
        head_dim: 32,
        n_rot: 32,
        base: 1e4,
        scale: 1.0,
    };
    b.record(
        &op,
        &OpIo {
            inputs: &[&out, &pb],
            outputs: &[&out],
        },
    )
    .expect("rope");
    ops::rope(&mut want, &[0, 5, 9], 32, 32, 1e4, RopeMode::Neox);
    assert_eq!(download_f32(&b, &out, rows * width), want, "seed {seed}");
}

#[test]
fn recorded_matmul_and_get_rows_match() {
    let seed = 6;
    let mut rng = Rng::new(seed);
    let mut b = CpuBackend::new(1);
    let (k, n, t) = (256, 8, 3);
    let wf = rng.normals(k * n, 0.5);
    let mut wq = Vec::new();
    reference::quantize(GgmlType::Q4_K, &wf, &mut wq).expect("quantize");
    let wb = b.alloc(wq.len() as u64, BufKind::Weights).expect("alloc");
    b.upload(&wb, 0, &wq).expect("upload");
    let x = rng.normals(t * k, 1.0);
    let xb = upload_f32(&b, &x);
    let yb = b
        .alloc((t * n * 4) as u64, BufKind::Activations)
        .expect("alloc");
    let op = Op::MatMul {
        ty: GgmlType::Q4_K,
        k,
        n,
        exact: false,
    };
    b.record(
        &op,
        &OpIo {
            inputs: &[&xb, &wb],
            outputs: &[&yb],
        },
    )
    .expect("matmul");
    let table = KernelTable::detect(); // the table the backend uses
    let words: Vec<u32> = wq
        .chunks(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let w = Weight::new(&table, "w", GgmlType::Q4_K, k, n, words, wq.len()).expect("weight");
    let mut want = vec![0.0; t * n];
    matmul(&Threads::new(1), &table, &w, 0..n, &x, &mut want, false).expect("matmul");
    assert_eq!(download_f32(&b, &yb, t * n), want, "seed {seed}");
    let ids: Vec<u32> = vec![7, 0, 3];
    let ib = b.alloc(12, BufKind::Activations).expect("alloc");
    b.upload(&ib, 0, bytemuck::cast_slice(&ids))
        .expect("upload");
    let rb = b
        .alloc((3 * k * 4) as u64, BufKind::Activations)
        .expect("alloc");
    let op = Op::GetRows {
        ty: GgmlType::Q4_K,
        width: k,
    };
    b.record(
        &op,
        &OpIo {
            inputs: &[&wb, &ib],
            outputs: &[&rb],
        },
    )
    .expect("get_rows");
    let got = download_f32(&b, &rb, 3 * k);
    let mut row = vec![0.0; k];
    w.dequantize_row(3, &mut row);
    assert_eq!(&got[2 * k..], &row[..]);
}

#[test]
fn unsupported_ops_and_bounds_are_errors() {
    let mut b = CpuBackend::new(1);
    let op = Op::PagedAttention {
        layer: 0,
        n_head: 4,
        n_head_kv: 2,
        head_dim_k: 64,
        head_dim_v: 64,
        scale: 0.125,
        window: None,
        softcap: None,
        block_size: 16,
        dtype: KvType::F16,
    };
    // Paged attention is supported; buffers that do not fit it are an error.
    assert!(b.supports(&op));
    let buf = b.alloc(16, BufKind::Activations).expect("alloc");
    assert!(b
        .record(
            &op,
            &OpIo {
                inputs: &[&buf],
                outputs: &[&buf]
            }
        )
        .is_err());
    assert!(b.upload(&buf, 8, &[0u8; 16]).is_err());
    assert!(pollster::block_on(b.download(&buf, 0..32)).is_err());
    assert!(!b.supports(&Op::MatMul {
        ty: GgmlType::IQ2_XS,
        k: 256,
        n: 1,
        exact: false
    }));
}
