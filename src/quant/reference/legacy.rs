//! The 32-element formats Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and Q8_1.
//!
//! Quantizers are ports of ggml's `quantize_row_*_ref` (ggml-quants.c), which
//! llama-quantize uses when there is no importance matrix; they give the same
//! bytes. Dequantizers follow `dequantize_row_*`, dots the generic
//! `ggml_vec_dot_*_generic` (ggml-cpu/quants.c): integer sums per block, then
//! one float multiply-add per block.
//!
//! Layout shared by the 4- and 5-bit formats: element `j` of a block is the low
//! nibble of `qs[j]`, element `j + 16` the high nibble; the fifth bit of
//! element `j` is bit `j` of the little-endian `qh`.
//!
//! Every row function takes whole blocks; `x.len()` blocks map to
//! `32 * x.len()` floats, and a longer or shorter other side is truncated to
//! the common part (the dispatching API checks the sizes).

use super::float::{fp16_to_fp32, fp32_to_fp16};
use crate::quant::blocks::{
    BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, QK4_0, QK8_0,
};

const QK: usize = QK4_0;
const HALF: usize = QK / 2;

/// `(value with the largest magnitude, that magnitude)`; the first one wins ties.
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &v in x {
        if amax < v.abs() {
            amax = v.abs();
            max = v;
        }
    }
    (max, amax)
}

/// `(min, max)` of a block, starting from `(f32::MAX, -f32::MAX)` as ggml does.
fn min_max(x: &[f32]) -> (f32, f32) {
    let (mut min, mut max) = (f32::MAX, -f32::MAX);
    for &v in x {
        if v < min {
            min = v;
        }
        if v > max {
            max = v;
        }
    }
    (min, max)
}

fn inverse_or_zero(d: f32) -> f32 {
    if d != 0.0 {
        1.0 / d
    } else {
        0.0
    }
}

/// The 5-bit quant of element `j` (0..32) of a Q5 block: low nibble plus bit `j` of `qh`.
fn q5_value(qs: &[u8; HALF], qh: [u8; 4], j: usize) -> i32 {
    let nibble = if j < HALF {
        qs[j] & 0x0F
    } else {
        qs[j - HALF] >> 4
    };
    let high = (u32::from_le_bytes(qh) >> j) & 1;
    i32::from(nibble) | (high as i32) << 4
}

/// The 4-bit quant of element `j` (0..32) of a Q4 / IQ4_NL block.
fn q4_value(qs: &[u8; HALF], j: usize) -> i32 {
    i32::from(if j < HALF {
        qs[j] & 0x0F
    } else {
        qs[j - HALF] >> 4
    })
}

/// Packs 32 quants (each < 16) into nibbles.
fn pack_nibbles(q: &[u8; QK]) -> [u8; HALF] {
    std::array::from_fn(|j| q[j] | (q[j + HALF] << 4))
}

/// Packs the low nibbles and gathers the fifth bits of 32 quants (each < 32).
fn pack_q5(q: &[u8; QK]) -> ([u8; HALF], [u8; 4]) {
    let qs = std::array::from_fn(|j| (q[j] & 0x0F) | ((q[j + HALF] & 0x0F) << 4));
    let qh = q
        .iter()
        .enumerate()
        .fold(0u32, |acc, (j, &v)| acc | (u32::from(v >> 4) & 1) << j);
    (qs, qh.to_le_bytes())
}

/// Q4_0, `quantize_row_q4_0_ref`: `d = max / -8` where `max` is the signed value of
/// largest magnitude, `q = min(15, trunc(x / d + 8.5))`.
pub fn quantize_row_q4_0(x: &[f32], y: &mut [BlockQ4_0]) {
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let (max, _) = signed_absmax(xb);
        let d = max / -8.0;
        let id = inverse_or_zero(d);
        // `as i8` truncates toward zero like C's (int8_t) cast; the value is in 0.5..=16.5.
        let q: [u8; QK] = std::array::from_fn(|j| ((xb[j] * id + 8.5) as i8).min(15) as u8);
        *yb = BlockQ4_0 {
            d: fp32_to_fp16(d),
            qs: pack_nibbles(&q),
        };
    }
}

/// Q4_1, `quantize_row_q4_1_ref`: `d = (max - min) / 15`, `m = min`,
/// `q = min(15, trunc((x - min) / d + 0.5))`.
pub fn quantize_row_q4_1(x: &[f32], y: &mut [BlockQ4_1]) {
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 15.0;
        let id = inverse_or_zero(d);
        let q: [u8; QK] = std::array::from_fn(|j| (((xb[j] - min) * id + 0.5) as i8).min(15) as u8);
        *yb = BlockQ4_1 {
            d: fp32_to_fp16(d),
            m: fp32_to_fp16(min),
            qs: pack_nibbles(&q),
        };
    }
}

/// Q5_0, `quantize_row_q5_0_ref`: `d = max / -16`, `q = min(31, trunc(x / d + 16.5))`.
pub fn quantize_row_q5_0(x: &[f32], y: &mut [BlockQ5_0]) {
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let (max, _) = signed_absmax(xb);
        let d = max / -16.0;
        let id = inverse_or_zero(d);
        let q: [u8; QK] = std::array::from_fn(|j| ((xb[j] * id + 16.5) as i8).min(31) as u8);
        let (qs, qh) = pack_q5(&q);
        *yb = BlockQ5_0 {
            d: fp32_to_fp16(d),
            qh,
            qs,
        };
    }
}

/// Q5_1, `quantize_row_q5_1_ref`: `d = (max - min) / 31`, `m = min`,
/// `q = trunc((x - min) / d + 0.5)` (at most 31 without clamping).
pub fn quantize_row_q5_1(x: &[f32], y: &mut [BlockQ5_1]) {
    for (xb, yb) in x.chunks_exact(QK).zip(y.iter_mut()) {
        let (min, max) = min_max(xb);
        let d = (max - min) / 31.0;
        let id = inverse_or_zero(d);
        let q: [u8; QK] = std::array::from_fn(|j| ((xb[j] - min) * id + 0.5) as u8);
        let (qs, qh) = pack_q5(&q);
        *yb = BlockQ5_1 {
            d: fp32_to_fp16(d),
            m: fp32_to_fp16(min),
            qh,
            qs,
        };
    }
}

/// The Q8 quants of a block and its unrounded scale: `d = amax / 127`, `q = round(x / d)`
/// (`roundf`: half away from zero, as `f32::round`).
fn q8_block(xb: &[f32]) -> (f32, [i8; QK8_0]) {
    let amax = xb.iter().fold(0.0f32, |a, &v| a.max(v.abs()));
    let d = amax / 127.0;
    let id = inverse_or_zero(d);
    (d, std::array::from_fn(|j| (xb[j] * id).round() as i8))
}

/// Q8_0, `quantize_row_q8_0_ref`.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        let (d, qs) = q8_block(xb);
        *yb = BlockQ8_0 {
            d: fp32_to_fp16(d),
            qs,
        };
    }
}

/// Q8_1, `quantize_row_q8_1_ref`: Q8_0 plus `s = fp16(sum(q) * d)` with the unrounded `d`.
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (xb, yb) in x.chunks_exact(QK8_0).zip(y.iter_mut()) {
        let (d, qs) = q8_block(xb);
        let sum: i32 = qs.iter().map(|&q| i32::from(q)).sum();
        *yb = BlockQ8_1 {
            d: fp32_to_fp16(d),
            s: fp32_to_fp16(sum as f32 * d),
            qs,
        };
    }
}

/// Q4_0: `y = (q - 8) * d`.
pub fn dequantize_row_q4_0(x: &[BlockQ4_0], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = fp16_to_fp32(xb.d);
        for (j, o) in yb.iter_mut().enumerate() {
            *o = (q4_value(&xb.qs, j) - 8) as f32 * d;
        }
    }
}

/// Q4_1: `y = q * d + m`.
pub fn dequantize_row_q4_1(x: &[BlockQ4_1], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let (d, m) = (fp16_to_fp32(xb.d), fp16_to_fp32(xb.m));
        for (j, o) in yb.iter_mut().enumerate() {
            *o = q4_value(&xb.qs, j) as f32 * d + m;
        }
    }
}

/// Q5_0: `y = (q - 16) * d`.
pub fn dequantize_row_q5_0(x: &[BlockQ5_0], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let d = fp16_to_fp32(xb.d);
        for (j, o) in yb.iter_mut().enumerate() {
            *o = (q5_value(&xb.qs, xb.qh, j) - 16) as f32 * d;
        }
    }
}

/// Q5_1: `y = q * d + m`.
pub fn dequantize_row_q5_1(x: &[BlockQ5_1], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK)) {
        let (d, m) = (fp16_to_fp32(xb.d), fp16_to_fp32(xb.m));
        for (j, o) in yb.iter_mut().enumerate() {
            *o = q5_value(&xb.qs, xb.qh, j) as f32 * d + m;
        }
    }
}

/// Q8_0: `y = q * d`.
pub fn dequantize_row_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK8_0)) {
        let d = fp16_to_fp32(xb.d);
        for (o, &q) in yb.iter_mut().zip(&xb.qs) {
            *o = f32::from(q) * d;
        }
    }
}

/// Q8_1: `y = q * d` (`s` is only a cache for the dots).
pub fn dequantize_row_q8_1(x: &[BlockQ8_1], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK8_0)) {
        let d = fp16_to_fp32(xb.d);
        for (o, &q) in yb.iter_mut().zip(&xb.qs) {
            *o = f32::from(q) * d;
        }
    }
}

/// Integer dot of one block's weight quants (given by `wq(j)`) with Q8 quants.
fn block_isum(wq: impl Fn(usize) -> i32, q8: &[i8; QK8_0]) -> i32 {
    q8.iter()
        .enumerate()
        .map(|(j, &a)| wq(j) * i32::from(a))
        .sum()
}

/// Q4_0 weights . Q8_0 activations: `sum_b isum_b * d_w * d_a`.
pub fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (w, a) in x.iter().zip(y) {
        let isum = block_isum(|j| q4_value(&w.qs, j) - 8, &a.qs);
        sumf += isum as f32 * fp16_to_fp32(w.d) * fp16_to_fp32(a.d);
    }
    sumf
}

/// Q4_1 weights . Q8_1 activations: `sum_b d_w d_a isum_b + m_w s_a`
/// (`s_a = d_a * sum(q_a)` carries the min's contribution).
pub fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    for (w, a) in x.iter().zip(y) {
        let isum = block_isum(|j| q4_value(&w.qs, j), &a.qs);
        sumf += (fp16_to_fp32(w.d) * fp16_to_fp32(a.d)) * isum as f32
            + fp16_to_fp32(w.m) * fp16_to_fp32(a.s);
    }
    sumf
}

/// Q5_0 weights . Q8_0 activations.
pub fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (w, a) in x.iter().zip(y) {
        let isum = block_isum(|j| q5_value(&w.qs, w.qh, j) - 16, &a.qs);
        sumf += (fp16_to_fp32(w.d) * fp16_to_fp32(a.d)) * isum as f32;
    }
    sumf
}

/// Q5_1 weights . Q8_1 activations.
pub fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    for (w, a) in x.iter().zip(y) {
        let isum = block_isum(|j| q5_value(&w.qs, w.qh, j), &a.qs);
        sumf += (fp16_to_fp32(w.d) * fp16_to_fp32(a.d)) * isum as f32
            + fp16_to_fp32(w.m) * fp16_to_fp32(a.s);
    }
    sumf
}

/// Q8_0 weights . Q8_0 activations.
pub fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (w, a) in x.iter().zip(y) {
        let isum = block_isum(|j| i32::from(w.qs[j]), &a.qs);
        sumf += isum as f32 * (fp16_to_fp32(w.d) * fp16_to_fp32(a.d));
    }
    sumf
}

#[cfg(test)]
#[path = "legacy_tests.rs"]
mod tests;
