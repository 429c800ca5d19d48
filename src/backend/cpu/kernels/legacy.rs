//! Scalar kernels of the 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! and the Q8_0 / Q8_1 activation quantizers.
//!
//! Names follow ggml (`vec_dot_q4_0_q8_0`, `quantize_row_q8_0`). The dots sum
//! integers per block and scale once per block, as ggml's CPU code does. The
//! activation quantizers follow ggml's x86 path (`127 / amax`, round to
//! nearest even), the one llama.cpp's reference logits were made with.

use super::fp16;
use crate::quant::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1};
use half::f16;

/// Largest magnitude of `x` (0 for an empty slice).
#[inline]
fn absmax(x: &[f32]) -> f32 {
    x.iter().fold(0.0f32, |m, v| m.max(v.abs()))
}

/// Quantizes 32 values to int8 with scale `amax / 127`; returns the scale.
#[inline]
fn quantize_32(x: &[f32], qs: &mut [i8; 32]) -> f32 {
    let amax = absmax(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    for (q, &v) in qs.iter_mut().zip(x) {
        *q = (v * id).round_ties_even() as i8;
    }
    d
}

/// Quantizes activations to Q8_0. Preconditions: `x.len() == y.len() * 32`.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (x, y) in x.chunks_exact(32).zip(y.iter_mut()) {
        let d = quantize_32(x, &mut y.qs);
        y.d = f16::from_f32(d);
    }
}

/// Quantizes activations to Q8_1 (Q8_0 plus `s = d * sum(q)`).
/// Preconditions: `x.len() == y.len() * 32`.
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (x, y) in x.chunks_exact(32).zip(y.iter_mut()) {
        let d = quantize_32(x, &mut y.qs);
        let sum: i32 = y.qs.iter().map(|&q| i32::from(q)).sum();
        y.d = f16::from_f32(d);
        y.s = f16::from_f32(d * sum as f32);
    }
}

/// The 32 nibbles of a Q4-style block (element j low nibble of `qs[j]`,
/// element j + 16 high nibble), minus `offset`.
#[inline(always)]
fn nibbles(qs: &[u8; 16], offset: i8) -> [i8; 32] {
    let mut v = [0i8; 32];
    let (lo, hi) = v.split_at_mut(16);
    for (o, &q) in lo.iter_mut().zip(qs) {
        *o = ((q & 0xF) as i8).wrapping_sub(offset);
    }
    for (o, &q) in hi.iter_mut().zip(qs) {
        *o = ((q >> 4) as i8).wrapping_sub(offset);
    }
    v
}

/// For each byte of fifth bits, the eight bytes `0x10` or `0` it expands to
/// (bit j of the byte to byte j), as one little-endian u64.
const HIGH_BITS: [u64; 256] = {
    let mut t = [0u64; 256];
    let mut b = 0;
    while b < 256 {
        let mut j = 0;
        while j < 8 {
            if b & (1 << j) != 0 {
                t[b] |= 0x10 << (8 * j);
            }
            j += 1;
        }
        b += 1;
    }
    t
};

/// The 32 5-bit quants of a Q5 block (low nibbles `qs`, fifth bits `qh`), minus `offset`.
#[inline(always)]
fn q5_values(qs: &[u8; 16], qh: [u8; 4], offset: i8) -> [i8; 32] {
    let mut high = [0u8; 32];
    for (k, &byte) in qh.iter().enumerate() {
        high[8 * k..8 * k + 8].copy_from_slice(&HIGH_BITS[usize::from(byte)].to_le_bytes());
    }
    let mut v = nibbles(qs, 0);
    for (x, &h) in v.iter_mut().zip(&high) {
        *x = (*x | h as i8).wrapping_sub(offset);
    }
    v
}

/// Q5_0 blocks re-encoded as Q8_0 blocks of the same values: the scale
/// kept, each quant `q - 16` as an int8. Every dot of the two encodings
/// computes the same integer sum times the same two scales, so the results
/// are bit-identical; the Q8_0 form takes 34 bytes a block instead of 22 and
/// skips the fifth-bit decode. Extra blocks of either side are left alone.
pub fn q5_0_to_q8_0(x: &[BlockQ5_0], y: &mut [BlockQ8_0]) {
    for (b, o) in x.iter().zip(y) {
        o.d = b.d;
        o.qs = q5_values(&b.qs, b.qh, 16);
    }
}

/// The inverse of [`q5_0_to_q8_0`], for Q8_0 blocks whose quants lie in
/// -16..16 (others lose their high bits).
pub fn q8_0_to_q5_0(x: &[BlockQ8_0], y: &mut [BlockQ5_0]) {
    for (b, o) in x.iter().zip(y) {
        let q = b.qs.map(|v| (v.wrapping_add(16) as u8) & 0x1F);
        o.d = b.d;
        let mut qh = 0u32;
        for (j, &v) in q.iter().enumerate() {
            qh |= u32::from(v >> 4) << j;
        }
        o.qh = qh.to_le_bytes();
        for (j, byte) in o.qs.iter_mut().enumerate() {
            *byte = (q[j] & 0x0F) | ((q[j + 16] & 0x0F) << 4);
        }
    }
}

/// Integer dot of 32 int8 pairs (the shape SIMD `maddubs`/`dpbusd` computes).
///
/// Wrapping ops: 32 products of magnitude <= 2^14 cannot overflow an i32,
/// and without overflow checks the loop vectorizes in every profile.
#[inline(always)]
fn idot32(a: &[i8; 32], b: &[i8; 32]) -> i32 {
    let mut s = 0i32;
    for i in 0..32 {
        s = s.wrapping_add(i32::from(a[i]).wrapping_mul(i32::from(b[i])));
    }
    s
}

/// Dot of a Q4_0 row with a Q8_0 row of the same length.
pub fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let sumi = idot32(&nibbles(&bx.qs, 8), &by.qs);
        sumf += sumi as f32 * (fp16(bx.d) * fp16(by.d));
    }
    sumf
}

/// Dot of a Q4_1 row with a Q8_1 row of the same length.
pub fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let sumi = idot32(&nibbles(&bx.qs, 0), &by.qs);
        sumf += (fp16(bx.d) * fp16(by.d)) * sumi as f32 + fp16(bx.m) * fp16(by.s);
    }
    sumf
}

/// Dot of a Q5_0 row with a Q8_0 row of the same length.
pub fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let sumi = idot32(&q5_values(&bx.qs, bx.qh, 16), &by.qs);
        sumf += (fp16(bx.d) * fp16(by.d)) * sumi as f32;
    }
    sumf
}

/// Dot of a Q5_1 row with a Q8_1 row of the same length.
pub fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let sumi = idot32(&q5_values(&bx.qs, bx.qh, 0), &by.qs);
        sumf += (fp16(bx.d) * fp16(by.d)) * sumi as f32 + fp16(bx.m) * fp16(by.s);
    }
    sumf
}

/// Dot of a Q8_0 row with a Q8_0 row of the same length.
pub fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        sumf += idot32(&bx.qs, &by.qs) as f32 * (fp16(bx.d) * fp16(by.d));
    }
    sumf
}

/// Expands Q4_0 blocks to f32. Preconditions: `y.len() == x.len() * 32`.
pub fn dequantize_row_q4_0(x: &[BlockQ4_0], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(32)) {
        let d = fp16(b.d);
        for j in 0..16 {
            y[j] = (i32::from(b.qs[j] & 0xF) - 8) as f32 * d;
            y[j + 16] = (i32::from(b.qs[j] >> 4) - 8) as f32 * d;
        }
    }
}

/// Expands Q4_1 blocks to f32. Preconditions: `y.len() == x.len() * 32`.
pub fn dequantize_row_q4_1(x: &[BlockQ4_1], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(32)) {
        let (d, m) = (fp16(b.d), fp16(b.m));
        for j in 0..16 {
            y[j] = f32::from(b.qs[j] & 0xF) * d + m;
            y[j + 16] = f32::from(b.qs[j] >> 4) * d + m;
        }
    }
}

/// Expands Q5_0 blocks to f32. Preconditions: `y.len() == x.len() * 32`.
pub fn dequantize_row_q5_0(x: &[BlockQ5_0], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(32)) {
        let d = fp16(b.d);
        for (o, v) in y.iter_mut().zip(q5_values(&b.qs, b.qh, 16)) {
            *o = v as f32 * d;
        }
    }
}

/// Expands Q5_1 blocks to f32. Preconditions: `y.len() == x.len() * 32`.
pub fn dequantize_row_q5_1(x: &[BlockQ5_1], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(32)) {
        let (d, m) = (fp16(b.d), fp16(b.m));
        for (o, v) in y.iter_mut().zip(q5_values(&b.qs, b.qh, 0)) {
            *o = v as f32 * d + m;
        }
    }
}

/// Expands Q8_0 blocks to f32. Preconditions: `y.len() == x.len() * 32`.
pub fn dequantize_row_q8_0(x: &[BlockQ8_0], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(32)) {
        let d = fp16(b.d);
        for (o, &q) in y.iter_mut().zip(&b.qs) {
            *o = f32::from(q) * d;
        }
    }
}
