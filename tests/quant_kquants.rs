//! Golden tests of the k-quant reference against llama.cpp.
//!
//! `tests/fixtures/quant-k/` holds two weight tensors of the synthetic llama
//! model (F32 source and the bytes `llama-quantize --pure` wrote for them in
//! Q2_K .. Q6_K) plus gguf-py's dequantization of their first rows; see the
//! README there. The quantizers must reproduce llama.cpp's bytes exactly.
//!
//! `ggml/` holds what ggml's own reference code (compiled from llama.cpp's
//! source) gives on seeded rows with edge cases: quantized bytes of all six
//! formats including Q8_K, dequantized values and dot products, all compared
//! bit for bit.

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

/// Outputs of ggml's own code on seeded rows (`ggml/` fixtures, see the README):
/// 10 rows of 1024 weights and activations.
mod ggml_random {
    use super::*;
    use bytemuck::Zeroable;
    use hearth::quant::blocks::BlockQ8K;

    /// A k-quant dot with Q8_K activations.
    type DotFn<B> = fn(&[B], &[BlockQ8K]) -> f32;

    const ROW: usize = 1024;
    const ROWS: usize = 10;

    fn file(name: &str) -> Vec<u8> {
        fixture(&format!("ggml/{name}"))
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    fn acts_q8k() -> Vec<BlockQ8K> {
        let a = f32s(&file("acts.f32"));
        let mut q = vec![BlockQ8K::zeroed(); a.len() / QK_K];
        for (x, y) in a.chunks_exact(ROW).zip(q.chunks_exact_mut(ROW / QK_K)) {
            quantize_row_q8_k(x, y);
        }
        q
    }

    /// The first differing block of two byte strings of `B` blocks, for messages.
    fn first_bad_block<B>(got: &[u8], want: &[u8]) -> Option<usize> {
        let bs = std::mem::size_of::<B>();
        got.chunks(bs)
            .zip(want.chunks(bs))
            .position(|(a, b)| a != b)
    }

    fn check<B: Pod>(
        suffix: &str,
        quantize: fn(&[f32], &mut [B]),
        dequantize: fn(&[B], &mut [f32]),
        dot: Option<DotFn<B>>,
    ) {
        let input = if dot.is_some() {
            "weights.f32"
        } else {
            "acts.f32"
        };
        let x = f32s(&file(input));
        assert_eq!(x.len(), ROW * ROWS, "{input} size");
        let mut q = vec![B::zeroed(); x.len() / QK_K];
        for (xr, yr) in x.chunks_exact(ROW).zip(q.chunks_exact_mut(ROW / QK_K)) {
            quantize(xr, yr);
        }
        let want = file(&format!("{suffix}.bin"));
        let got: &[u8] = bytemuck::cast_slice(&q);
        if let Some(b) = first_bad_block::<B>(got, &want) {
            panic!(
                "{suffix}: block {b} (row {}, see gen_ggml.py for its kind) differs from ggml",
                b * QK_K / ROW
            );
        }

        let mut deq = vec![0.0f32; x.len()];
        dequantize(&q, &mut deq);
        let want_deq = f32s(&file(&format!("{suffix}.deq.f32")));
        assert!(
            bits(&deq) == bits(&want_deq),
            "{suffix}: dequantized values differ from ggml's bits"
        );

        let Some(dot) = dot else { return };
        let a = acts_q8k();
        let want_dots = f32s(&file(&format!("{suffix}.dot.f32")));
        let n = ROW / QK_K;
        for r in 0..ROWS {
            for c in 0..ROWS {
                let got = dot(&q[r * n..(r + 1) * n], &a[c * n..(c + 1) * n]);
                let want = want_dots[r * ROWS + c];
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{suffix}: dot of weight row {r} and act row {c}: {got} vs ggml {want}"
                );
            }
        }
    }

    #[test]
    fn q2_k_is_bit_identical_to_ggml() {
        check::<BlockQ2K>(
            "q2_k",
            quantize_row_q2_k,
            dequantize_row_q2_k,
            Some(vec_dot_q2_k_q8_k),
        );
    }

    #[test]
    fn q3_k_is_bit_identical_to_ggml() {
        check::<BlockQ3K>(
            "q3_k",
            quantize_row_q3_k,
            dequantize_row_q3_k,
            Some(vec_dot_q3_k_q8_k),
        );
    }

    #[test]
    fn q4_k_is_bit_identical_to_ggml() {
        check::<BlockQ4K>(
            "q4_k",
            quantize_row_q4_k,
            dequantize_row_q4_k,
            Some(vec_dot_q4_k_q8_k),
        );
    }

    #[test]
    fn q5_k_is_bit_identical_to_ggml() {
        check::<BlockQ5K>(
            "q5_k",
            quantize_row_q5_k,
            dequantize_row_q5_k,
            Some(vec_dot_q5_k_q8_k),
        );
    }

    #[test]
    fn q6_k_is_bit_identical_to_ggml() {
        check::<BlockQ6K>(
            "q6_k",
            quantize_row_q6_k,
            dequantize_row_q6_k,
            Some(vec_dot_q6_k_q8_k),
        );
    }

    #[test]
    fn q8_k_is_bit_identical_to_ggml() {
        check::<BlockQ8K>("q8_k", quantize_row_q8_k, dequantize_row_q8_k, None);
    }
}
