//! Q6_K (16 sub-blocks of 16 weights, 8-bit scales, 6-bit quants) and Q8_K
//! (the activation format of every k-quant dot).

use super::{
    add_lanes, debug_check_len, make_qx_quants_rmse1, nearest_int, signed_absmax, sum_lanes,
    to_f16, GROUP_MAX_EPS,
};
use crate::quant::blocks::{BlockQ6K, BlockQ8K, QK_K};
use bytemuck::Zeroable;

/// Quantizes `x` to Q6_K exactly as ggml's `quantize_row_q6_K_ref`.
///
/// Preconditions: `x.len() == y.len() * 256`.
pub fn quantize_row_q6_k(x: &[f32], y: &mut [BlockQ6K]) {
    debug_check_len(y.len(), x.len());
    for (x, y) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        quantize_block_q6_k(x, y);
    }
}

/// One block; `x.len() == 256`.
fn quantize_block_q6_k(x: &[f32], y: &mut BlockQ6K) {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    let (mut max_scale, mut max_abs_scale) = (0.0f32, 0.0f32);
    for ib in 0..QK_K / 16 {
        let scale =
            make_qx_quants_rmse1(32, &x[16 * ib..16 * ib + 16], &mut l[16 * ib..16 * ib + 16]);
        scales[ib] = scale;
        if scale.abs() > max_abs_scale {
            max_abs_scale = scale.abs();
            max_scale = scale;
        }
    }
    if max_abs_scale < GROUP_MAX_EPS {
        *y = BlockQ6K::zeroed();
        return;
    }
    let iscale = -128.0 / max_scale;
    y.d = to_f16(1.0 / iscale);
    for (s, &sc) in y.scales.iter_mut().zip(&scales) {
        *s = nearest_int(iscale * sc).min(127) as i8;
    }
    let d = y.d.to_f32();
    for j in 0..QK_K / 16 {
        let dl = d * f32::from(y.scales[j]);
        if dl == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / dl).clamp(-32, 31) + 32) as i8;
        }
    }
    // Per 128 quants: ql byte i holds quants i (low) and i+64 (high) of the
    // first 64, then i+32 and i+96; qh byte i holds the top two bits of quants
    // i, i+32, i+64, i+96.
    for c in 0..QK_K / 128 {
        let lq = |k: usize| l[128 * c + k] as u8;
        for i in 0..32 {
            y.ql[64 * c + i] = (lq(i) & 0xF) | ((lq(i + 64) & 0xF) << 4);
            y.ql[64 * c + 32 + i] = (lq(i + 32) & 0xF) | ((lq(i + 96) & 0xF) << 4);
            y.qh[32 * c + i] = (lq(i) >> 4)
                | ((lq(i + 32) >> 4) << 2)
                | ((lq(i + 64) >> 4) << 4)
                | ((lq(i + 96) >> 4) << 6);
        }
    }
}

/// The signed 6-bit quant of element `i` (0..256) of a Q6_K block, in `-32..32`.
#[inline]
fn quant6(b: &BlockQ6K, i: usize) -> i8 {
    let (c, r) = (i / 128, i % 128);
    let (part, k) = (r / 32, r % 32);
    // part 0: low nibble of ql[k], 1: low of ql[k+32], 2: high of ql[k], 3: high of ql[k+32].
    let byte = b.ql[64 * c + k + 32 * (part % 2)];
    let low = if part < 2 { byte & 0xF } else { byte >> 4 };
    let high = (b.qh[32 * c + k] >> (2 * part)) & 3;
    (low | (high << 4)) as i8 - 32
}

/// The scale of element `i` of a Q6_K block.
#[inline]
fn scale6(b: &BlockQ6K, i: usize) -> i8 {
    b.scales[i / 16]
}

/// Expands Q6_K blocks to `f32`, as ggml's `dequantize_row_q6_K`.
///
/// Preconditions: `y.len() == x.len() * 256`.
pub fn dequantize_row_q6_k(x: &[BlockQ6K], y: &mut [f32]) {
    debug_check_len(x.len(), y.len());
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = b.d.to_f32();
        for (i, out) in y.iter_mut().enumerate() {
            *out = d * f32::from(scale6(b, i)) * f32::from(quant6(b, i));
        }
    }
}

/// Dot product of a Q6_K row with a Q8_K row, as ggml's `ggml_vec_dot_q6_K_q8_K_generic`.
///
/// Eight integer lanes (element `i` in lane `i % 8`), `f32` lane sums
/// `+= d * lane` per block, added in lane order at the end.
/// Preconditions: `x.len() == y.len()`.
pub fn vec_dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(x.len(), y.len(), "vec_dot_q6_k_q8_k: row lengths differ");
    let mut sums = [0.0f32; 8];
    for (bx, by) in x.iter().zip(y) {
        let mut aux32 = [0i32; 8];
        for i in 0..QK_K {
            let prod = i32::from(by.qs[i]) * i32::from(quant6(bx, i));
            aux32[i % 8] += i32::from(scale6(bx, i)) * prod;
        }
        add_lanes(&mut sums, bx.d.to_f32() * by.d, &aux32);
    }
    sum_lanes(&sums, 0.0)
}

/// Quantizes activations to Q8_K exactly as ggml's `quantize_row_q8_K_ref`.
///
/// The scale comes from the signed element of largest magnitude:
/// `iscale = -127 / max`, `d = 1 / iscale`, quants clamped to `..=127`, and
/// `bsums` holds the sum of each group of 16 quants. An all-zero block gets
/// `d = 0` and zero quants and sums (ggml leaves its `bsums` unwritten).
/// Preconditions: `x.len() == y.len() * 256`.
pub fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    debug_check_len(y.len(), x.len());
    for (x, y) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let (amax, max) = signed_absmax(x);
        if amax == 0.0 {
            *y = BlockQ8K::zeroed();
            continue;
        }
        let iscale = -127.0 / max;
        for (q, &v) in y.qs.iter_mut().zip(x) {
            *q = nearest_int(iscale * v).min(127) as i8;
        }
        for (s, g) in y.bsums.iter_mut().zip(y.qs.chunks_exact(16)) {
            *s = g.iter().map(|&q| i16::from(q)).sum();
        }
        y.d = 1.0 / iscale;
    }
}

/// Expands Q8_K blocks to `f32`, as ggml's `dequantize_row_q8_K`.
///
/// Preconditions: `y.len() == x.len() * 256`.
pub fn dequantize_row_q8_k(x: &[BlockQ8K], y: &mut [f32]) {
    debug_check_len(x.len(), y.len());
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        for (out, &q) in y.iter_mut().zip(&b.qs) {
            *out = b.d * f32::from(q);
        }
    }
}
