//! Golden tests of the k-quant reference against llama.cpp.
//!
//! `tests/fixtures/quant-k/` holds two weight tensors of the synthetic llama
//! model (F32 source and the bytes `llama-quantize --pure` wrote for them in
//! Q2_K .. Q6_K) plus gguf-py's dequantization of their first rows; see the
//! README there. The quantizers must reproduce llama.cpp's bytes exactly.

use bytemuck::Pod;
use hearth::quant::blocks::{cast_blocks, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, QK_K};
use hearth::quant::reference::kquants::*;
use std::path::PathBuf;

const TENSORS: [(&str, usize, usize); 2] = [("blk0_attn_q", 256, 256), ("blk1_ffn_down", 256, 512)];
const DEQ_ROWS: usize = 4;

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/quant-k")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; see tests/fixtures/quant-k/README.md",
            path.display()
        )
    })
}

fn f32s(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Quantizes each tensor with `quantize`, compares with llama.cpp's bytes,
/// then dequantizes llama.cpp's blocks and compares with gguf-py.
fn check_format<B: Pod>(
    suffix: &str,
    quantize: fn(&[f32], &mut [B]),
    dequantize: fn(&[B], &mut [f32]),
) {
    for (stem, rows, cols) in TENSORS {
        let src = f32s(&fixture(&format!("{stem}.f32")));
        assert_eq!(src.len(), rows * cols, "{stem}.f32 size");
        let want = fixture(&format!("{stem}.{suffix}.bin"));
        let mut got = vec![B::zeroed(); src.len() / QK_K];
        // Row by row, as llama-quantize calls it (blocks are independent anyway).
        for (x, y) in src
            .chunks_exact(cols)
            .zip(got.chunks_exact_mut(cols / QK_K))
        {
            quantize(x, y);
        }
        let got_bytes: &[u8] = bytemuck::cast_slice(&got);
        assert_eq!(got_bytes.len(), want.len(), "{stem} {suffix}: size");
        if let Some(first) = got_bytes.iter().zip(&want).position(|(a, b)| a != b) {
            let bs = std::mem::size_of::<B>();
            let n_bad = got_bytes
                .chunks(bs)
                .zip(want.chunks(bs))
                .filter(|(a, b)| a != b)
                .count();
            panic!(
                "{stem} {suffix}: byte {first} (block {}, offset {}) differs from llama.cpp: {n_bad} of {} blocks differ",
                first / bs,
                first % bs,
                got.len()
            );
        }

        let blocks: Vec<B> = cast_blocks(&want).expect("whole blocks");
        let expect = f32s(&fixture(&format!("{stem}.{suffix}.deq.f32")));
        let mut deq = vec![0.0f32; DEQ_ROWS * cols];
        dequantize(&blocks[..DEQ_ROWS * cols / QK_K], &mut deq);
        let mut exact = 0;
        for (i, (&a, &b)) in deq.iter().zip(&expect).enumerate() {
            let tol = 1e-6 * b.abs().max(1e-3);
            assert!(
                (a - b).abs() <= tol,
                "{stem} {suffix}: dequantized [{i}] = {a}, gguf-py {b}"
            );
            exact += usize::from(a == b);
        }
        // gguf-py multiplies in another order, so a few values may differ by an ulp.
        assert!(
            exact * 100 >= deq.len() * 90,
            "{stem} {suffix}: only {exact}/{} exact",
            deq.len()
        );
    }
}

#[test]
fn q2_k_matches_llama_cpp() {
    check_format::<BlockQ2K>("q2_k", quantize_row_q2_k, dequantize_row_q2_k);
}

#[test]
fn q3_k_matches_llama_cpp() {
    check_format::<BlockQ3K>("q3_k", quantize_row_q3_k, dequantize_row_q3_k);
}

#[test]
fn q4_k_matches_llama_cpp() {
    check_format::<BlockQ4K>("q4_k", quantize_row_q4_k, dequantize_row_q4_k);
}

#[test]
fn q5_k_matches_llama_cpp() {
    check_format::<BlockQ5K>("q5_k", quantize_row_q5_k, dequantize_row_q5_k);
}

#[test]
fn q6_k_matches_llama_cpp() {
    check_format::<BlockQ6K>("q6_k", quantize_row_q6_k, dequantize_row_q6_k);
}
