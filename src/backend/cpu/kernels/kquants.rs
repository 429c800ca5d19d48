//! Scalar kernels of the k-quants (Q2_K .. Q6_K) and the Q8_K activation
//! quantizer, following ggml's generic CPU code: each weight block is
//! unpacked into 256 small integers, multiplied with the int8 activations in
//! eight integer lanes, and scaled once per block.

use super::fp16;
use crate::quant::blocks::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K};

/// ggml's `nearest_int` (round to nearest, ties to even) for `|x| < 2^22`.
#[inline]
fn nearest_int(x: f32) -> i32 {
    let val = x + 12_582_912.0;
    (val.to_bits() as i32 & 0x007f_ffff) - 0x0040_0000
}

/// Quantizes activations to Q8_K (ggml's `quantize_row_q8_K`: scale from the
/// signed element of largest magnitude, sums of 16).
/// Preconditions: `x.len() == y.len() * 256`.
pub fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    for (x, y) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let (mut amax, mut max) = (0.0f32, 0.0f32);
        for &v in x {
            if v.abs() > amax {
                amax = v.abs();
                max = v;
            }
        }
        if amax == 0.0 {
            y.d = 0.0;
            y.qs = [0; QK_K];
            y.bsums = [0; QK_K / 16];
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

/// Adds `scale * sum(a[i] * q8[i])` over 8-element groups into eight lanes.
#[inline]
fn lanes_add(aux32: &mut [i32; 8], scale: i32, a: &[i8], q8: &[i8]) {
    for (ga, gq) in a.chunks_exact(8).zip(q8.chunks_exact(8)) {
        for l in 0..8 {
            // Wrapping: |scale * q * q8| < 2^21 summed 32 times cannot
            // overflow, and unchecked ops vectorize in every profile.
            let p = i32::from(ga[l]).wrapping_mul(i32::from(gq[l]));
            aux32[l] = aux32[l].wrapping_add(scale.wrapping_mul(p));
        }
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) of a Q4_K / Q5_K block.
#[inline]
pub(super) fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}

/// The sixteen signed 6-bit scales of a Q3_K block (stored minus 32).
#[inline]
pub(super) fn q3_scales(packed: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = if j < 8 {
            packed[j] & 0xF
        } else {
            packed[j - 8] >> 4
        };
        let high = (packed[8 + j % 4] >> (2 * (j / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// Q2_K quants (0..4) of one block, in element order.
#[inline]
fn unpack_q2(b: &BlockQ2K) -> [i8; QK_K] {
    let mut a = [0i8; QK_K];
    for (half, q2) in b.qs.chunks_exact(32).enumerate() {
        for s in 0..4 {
            for l in 0..32 {
                a[128 * half + 32 * s + l] = ((q2[l] >> (2 * s)) & 3) as i8;
            }
        }
    }
    a
}

/// Q3_K quants (-4..4) of one block, in element order.
#[inline]
fn unpack_q3(b: &BlockQ3K) -> [i8; QK_K] {
    let mut a = [0i8; QK_K];
    for (half, q3) in b.qs.chunks_exact(32).enumerate() {
        for s in 0..4 {
            let m = 1u8 << (4 * half + s);
            for l in 0..32 {
                let low = ((q3[l] >> (2 * s)) & 3) as i8;
                a[128 * half + 32 * s + l] = low - if b.hmask[l] & m != 0 { 0 } else { 4 };
            }
        }
    }
    a
}

/// Q4_K / Q5_K quants (0..16 / 0..32) of one block, in element order.
#[inline]
fn unpack_q45(qs: &[u8; QK_K / 2], qh: Option<&[u8; QK_K / 8]>) -> [i8; QK_K] {
    let mut a = [0i8; QK_K];
    for (c, q4) in qs.chunks_exact(32).enumerate() {
        for l in 0..32 {
            a[64 * c + l] = (q4[l] & 0xF) as i8;
            a[64 * c + 32 + l] = (q4[l] >> 4) as i8;
        }
    }
    if let Some(qh) = qh {
        // Bit plane b of qh holds the fifth bits of elements 32b .. 32b + 32.
        for (b, plane) in a.chunks_exact_mut(32).enumerate() {
            for (v, &h) in plane.iter_mut().zip(qh) {
                *v |= (((h >> b) & 1) << 4) as i8;
            }
        }
    }
    a
}

/// Q6_K quants (-32..32) of one block, in element order.
#[inline]
fn unpack_q6(b: &BlockQ6K) -> [i8; QK_K] {
    let mut a = [0i8; QK_K];
    for half in 0..2 {
        let (ql, qh) = (&b.ql[64 * half..], &b.qh[32 * half..]);
        let a = &mut a[128 * half..];
        for l in 0..32 {
            a[l] = (((ql[l] & 0xF) | ((qh[l] & 3) << 4)) as i8).wrapping_sub(32);
            a[l + 32] = (((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) as i8).wrapping_sub(32);
            a[l + 64] = (((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) as i8).wrapping_sub(32);
            a[l + 96] = (((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) as i8).wrapping_sub(32);
        }
    }
    a
}

/// Sum of eight float lanes into `sumf`, as ggml's generic dots end.
#[inline]
fn finish(sums: &[f32; 8], sumf: f32) -> f32 {
    sums.iter().fold(sumf, |acc, &s| acc + s)
}

/// Dot of a Q2_K row with a Q8_K row of the same length.
pub fn vec_dot_q2_k_q8_k(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let summs: i32 = (0..16)
            .map(|j| i32::from(by.bsums[j]) * i32::from(bx.scales[j] >> 4))
            .sum();
        let a = unpack_q2(bx);
        let mut isum = 0i32;
        for (j, (ga, gq)) in a.chunks_exact(16).zip(by.qs.chunks_exact(16)).enumerate() {
            let s = ga.iter().zip(gq).fold(0i32, |acc, (&p, &q)| {
                acc.wrapping_add(i32::from(p).wrapping_mul(i32::from(q)))
            });
            isum += i32::from(bx.scales[j] & 0xF) * s;
        }
        let dall = by.d * fp16(bx.d);
        let dmin = by.d * fp16(bx.dmin);
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// Dot of a Q3_K row with a Q8_K row of the same length.
pub fn vec_dot_q3_k_q8_k(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    let mut sums = [0.0f32; 8];
    for (bx, by) in x.iter().zip(y) {
        let a = unpack_q3(bx);
        let scales = q3_scales(&bx.scales);
        let mut aux32 = [0i32; 8];
        for j in 0..16 {
            let r = 16 * j..16 * j + 16;
            lanes_add(&mut aux32, i32::from(scales[j]), &a[r.clone()], &by.qs[r]);
        }
        let d = fp16(bx.d) * by.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    finish(&sums, 0.0)
}

/// The shared tail of the Q4_K and Q5_K dots for one block.
#[inline]
fn k45_block(a: &[i8; QK_K], scales: &[u8; 12], by: &BlockQ8K, sums: &mut [f32; 8], d: f32) -> i32 {
    let mut aux32 = [0i32; 8];
    for j in 0..8 {
        let (sc, _) = scale_min_k4(j, scales);
        let r = 32 * j..32 * j + 32;
        lanes_add(&mut aux32, i32::from(sc), &a[r.clone()], &by.qs[r]);
    }
    for l in 0..8 {
        sums[l] += d * aux32[l] as f32;
    }
    (0..16)
        .map(|j| i32::from(by.bsums[j]) * i32::from(scale_min_k4(j / 2, scales).1))
        .sum()
}

/// Dot of a Q4_K row with a Q8_K row of the same length.
pub fn vec_dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let a = unpack_q45(&bx.qs, None);
        let sumi = k45_block(&a, &bx.scales, by, &mut sums, fp16(bx.d) * by.d);
        sumf -= fp16(bx.dmin) * by.d * sumi as f32;
    }
    finish(&sums, sumf)
}

/// Dot of a Q5_K row with a Q8_K row of the same length.
pub fn vec_dot_q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let a = unpack_q45(&bx.qs, Some(&bx.qh));
        let sumi = k45_block(&a, &bx.scales, by, &mut sums, fp16(bx.d) * by.d);
        sumf -= fp16(bx.dmin) * by.d * sumi as f32;
    }
    finish(&sums, sumf)
}

/// Dot of a Q6_K row with a Q8_K row of the same length.
pub fn vec_dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let mut sums = [0.0f32; 8];
    for (bx, by) in x.iter().zip(y) {
        let a = unpack_q6(bx);
        let mut aux32 = [0i32; 8];
        for j in 0..16 {
            let r = 16 * j..16 * j + 16;
            lanes_add(
                &mut aux32,
                i32::from(bx.scales[j]),
                &a[r.clone()],
                &by.qs[r],
            );
        }
        let d = fp16(bx.d) * by.d;
        for l in 0..8 {
            sums[l] += d * aux32[l] as f32;
        }
    }
    finish(&sums, 0.0)
}

/// Expands Q2_K blocks to f32. Preconditions: `y.len() == x.len() * 256`.
pub fn dequantize_row_q2_k(x: &[BlockQ2K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, min) = (fp16(b.d), fp16(b.dmin));
        let a = unpack_q2(b);
        for (i, o) in y.iter_mut().enumerate() {
            let sc = b.scales[i / 16];
            *o = d * f32::from(sc & 0xF) * f32::from(a[i]) - min * f32::from(sc >> 4);
        }
    }
}

/// Expands Q3_K blocks to f32. Preconditions: `y.len() == x.len() * 256`.
pub fn dequantize_row_q3_k(x: &[BlockQ3K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = fp16(b.d);
        let (a, scales) = (unpack_q3(b), q3_scales(&b.scales));
        for (i, o) in y.iter_mut().enumerate() {
            *o = d * f32::from(scales[i / 16]) * f32::from(a[i]);
        }
    }
}

/// Expands Q4_K / Q5_K blocks given their unpacked quants.
#[inline]
fn dequant_k45(a: &[i8; QK_K], d: f32, min: f32, scales: &[u8; 12], y: &mut [f32]) {
    for (i, o) in y.iter_mut().enumerate() {
        let (sc, m) = scale_min_k4(i / 32, scales);
        *o = d * f32::from(sc) * f32::from(a[i]) - min * f32::from(m);
    }
}

/// Expands Q4_K blocks to f32. Preconditions: `y.len() == x.len() * 256`.
pub fn dequantize_row_q4_k(x: &[BlockQ4K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let a = unpack_q45(&b.qs, None);
        dequant_k45(&a, fp16(b.d), fp16(b.dmin), &b.scales, y);
    }
}

/// Expands Q5_K blocks to f32. Preconditions: `y.len() == x.len() * 256`.
pub fn dequantize_row_q5_k(x: &[BlockQ5K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let a = unpack_q45(&b.qs, Some(&b.qh));
        dequant_k45(&a, fp16(b.d), fp16(b.dmin), &b.scales, y);
    }
}

/// Expands Q6_K blocks to f32. Preconditions: `y.len() == x.len() * 256`.
pub fn dequantize_row_q6_k(x: &[BlockQ6K], y: &mut [f32]) {
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = fp16(b.d);
        let a = unpack_q6(b);
        for (i, o) in y.iter_mut().enumerate() {
            *o = d * f32::from(b.scales[i / 16]) * f32::from(a[i]);
        }
    }
}
