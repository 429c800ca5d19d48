//! Q2_K and Q3_K: 16 sub-blocks of 16 weights, 2-bit quants (Q3_K adds a high
//! bit in `hmask`).

use super::{
    add_lanes, debug_check_len, make_q3_quants, make_qkx2_quants, nearest_int, pack_2bit,
    sum_lanes, to_f16, Qkx2Params,
};
use crate::quant::blocks::{BlockQ2K, BlockQ3K, BlockQ8K, QK_K};

/// Grid of `quantize_row_q2_K_ref`'s `make_qkx2_quants(16, 3, ..., -0.5, 0.1, 15, true)`.
const Q2K_GRID: Qkx2Params = Qkx2Params {
    nmax: 3,
    rmin: -0.5,
    rdelta: 0.1,
    nstep: 15,
    use_mad: true,
};

/// Quantizes `x` to Q2_K exactly as ggml's `quantize_row_q2_K_ref`.
///
/// Preconditions: `x.len() == y.len() * 256`.
pub fn quantize_row_q2_k(x: &[f32], y: &mut [BlockQ2K]) {
    debug_check_len(y.len(), x.len());
    for (x, y) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        quantize_block_q2_k(x, y);
    }
}

/// One block; `x.len() == 256`.
fn quantize_block_q2_k(x: &[f32], y: &mut BlockQ2K) {
    const Q4SCALE: f32 = 15.0;
    let mut l = [0u8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    let mut mins = [0.0f32; QK_K / 16];
    let mut weights = [0.0f32; 16];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..QK_K / 16 {
        let xs = &x[16 * j..16 * j + 16];
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = v.abs();
        }
        (scales[j], mins[j]) =
            make_qkx2_quants(Q2K_GRID, xs, &weights, &mut l[16 * j..16 * j + 16]);
        max_scale = if scales[j] > max_scale {
            scales[j]
        } else {
            max_scale
        };
        max_min = if mins[j] > max_min { mins[j] } else { max_min };
    }
    if max_scale > 0.0 {
        let iscale = Q4SCALE / max_scale;
        for (s, &sc) in y.scales.iter_mut().zip(&scales) {
            *s = nearest_int(iscale * sc) as u8;
        }
        y.d = to_f16(max_scale / Q4SCALE);
    } else {
        y.scales = [0; QK_K / 16];
        y.d = to_f16(0.0);
    }
    if max_min > 0.0 {
        let iscale = Q4SCALE / max_min;
        for (s, &m) in y.scales.iter_mut().zip(&mins) {
            *s |= (nearest_int(iscale * m) << 4) as u8;
        }
        y.dmin = to_f16(max_min / Q4SCALE);
    } else {
        y.dmin = to_f16(0.0);
    }
    let (d, dmin) = (y.d.to_f32(), y.dmin.to_f32());
    for j in 0..QK_K / 16 {
        let dl = d * f32::from(y.scales[j] & 0xF);
        if dl == 0.0 {
            continue;
        }
        let dm = dmin * f32::from(y.scales[j] >> 4);
        for ii in 0..16 {
            l[16 * j + ii] = nearest_int((x[16 * j + ii] + dm) / dl).clamp(0, 3) as u8;
        }
    }
    pack_2bit(&l, &mut y.qs);
}

/// The 2-bit quant of element `i` (0..256) of a Q2_K / Q3_K `qs` array.
#[inline]
fn quant2(qs: &[u8; QK_K / 4], i: usize) -> u8 {
    let (half, r) = (i / 128, i % 128);
    (qs[half * 32 + r % 32] >> (2 * (r / 32))) & 3
}

/// Expands Q2_K blocks to `f32`, as ggml's `dequantize_row_q2_K`.
///
/// Preconditions: `y.len() == x.len() * 256`.
pub fn dequantize_row_q2_k(x: &[BlockQ2K], y: &mut [f32]) {
    debug_check_len(x.len(), y.len());
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, min) = (b.d.to_f32(), b.dmin.to_f32());
        for (i, out) in y.iter_mut().enumerate() {
            let sc = b.scales[i / 16];
            let dl = d * f32::from(sc & 0xF);
            let ml = min * f32::from(sc >> 4);
            *out = dl * f32::from(quant2(&b.qs, i)) - ml;
        }
    }
}

/// Dot product of a Q2_K row with a Q8_K row, as ggml's `ggml_vec_dot_q2_K_q8_K_generic`.
///
/// Per block: `dall * isum - dmin * summs`, with `isum` the exact integer sum
/// of `scale_j * q2 * q8` and `summs = sum_j bsums_j * min_j`, accumulated in
/// `f32` block by block. Preconditions: `x.len() == y.len()`.
pub fn vec_dot_q2_k_q8_k(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(x.len(), y.len(), "vec_dot_q2_k_q8_k: row lengths differ");
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let summs: i32 = by
            .bsums
            .iter()
            .zip(&bx.scales)
            .map(|(&s, &sc)| i32::from(s) * i32::from(sc >> 4))
            .sum();
        let dall = by.d * bx.d.to_f32();
        let dmin = by.d * bx.dmin.to_f32();
        let mut isum = 0i32;
        for (j, &sc) in bx.scales.iter().enumerate() {
            let isuml: i32 = (16 * j..16 * j + 16)
                .map(|i| i32::from(by.qs[i]) * i32::from(quant2(&bx.qs, i)))
                .sum();
            isum += i32::from(sc & 0xF) * isuml;
        }
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// Quantizes `x` to Q3_K exactly as ggml's `quantize_row_q3_K_ref`.
///
/// Preconditions: `x.len() == y.len() * 256`.
pub fn quantize_row_q3_k(x: &[f32], y: &mut [BlockQ3K]) {
    debug_check_len(y.len(), x.len());
    for (x, y) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        quantize_block_q3_k(x, y);
    }
}

/// One block; `x.len() == 256`.
fn quantize_block_q3_k(x: &[f32], y: &mut BlockQ3K) {
    let mut l = [0i8; QK_K];
    let mut scales = [0.0f32; QK_K / 16];
    let (mut max_scale, mut amax) = (0.0f32, 0.0f32);
    for j in 0..QK_K / 16 {
        scales[j] = make_q3_quants(4, &x[16 * j..16 * j + 16], &mut l[16 * j..16 * j + 16]);
        let scale = scales[j].abs();
        if scale > amax {
            amax = scale;
            max_scale = scales[j];
        }
    }
    y.scales = [0; 12];
    if max_scale != 0.0 {
        let iscale = -32.0 / max_scale;
        for (j, &sc) in scales.iter().enumerate() {
            // ggml stores nearest_int into an int8_t before clamping.
            let ls = (i32::from(nearest_int(iscale * sc) as i8).clamp(-32, 31) + 32) as u8;
            if j < 8 {
                y.scales[j] = ls & 0xF;
            } else {
                y.scales[j - 8] |= (ls & 0xF) << 4;
            }
            y.scales[j % 4 + 8] |= (ls >> 4) << (2 * (j / 4));
        }
        y.d = to_f16(1.0 / iscale);
    } else {
        y.d = to_f16(0.0);
    }
    let d_all = y.d.to_f32();
    for j in 0..QK_K / 16 {
        let dl = d_all * f32::from(q3_scale(&y.scales, j));
        if dl == 0.0 {
            continue;
        }
        for ii in 0..16 {
            l[16 * j + ii] = (nearest_int(x[16 * j + ii] / dl).clamp(-4, 3) + 4) as i8;
        }
    }
    // High bit of quant j goes to bit j / 32 of hmask[j % 32].
    y.hmask = [0; QK_K / 8];
    let mut low = [0u8; QK_K];
    for (j, (&q, lo)) in l.iter().zip(low.iter_mut()).enumerate() {
        let mut q = q;
        if q > 3 {
            y.hmask[j % 32] |= 1 << (j / 32);
            q -= 4;
        }
        *lo = q as u8;
    }
    pack_2bit(&low, &mut y.qs);
}

/// The `j`-th (0..16) signed 6-bit scale of a Q3_K block, in `-32..32`.
#[inline]
fn q3_scale(scales: &[u8; 12], j: usize) -> i8 {
    let low = if j < 8 {
        scales[j] & 0xF
    } else {
        scales[j - 8] >> 4
    };
    let high = (scales[8 + j % 4] >> (2 * (j / 4))) & 3;
    (low | (high << 4)) as i8 - 32
}

/// The signed 3-bit quant of element `i` of a Q3_K block, in `-4..4`.
#[inline]
fn quant3(b: &BlockQ3K, i: usize) -> i8 {
    let high = b.hmask[i % 32] & (1 << (i / 32)) != 0;
    quant2(&b.qs, i) as i8 - if high { 0 } else { 4 }
}

/// Expands Q3_K blocks to `f32`, as ggml's `dequantize_row_q3_K`.
///
/// Preconditions: `y.len() == x.len() * 256`.
pub fn dequantize_row_q3_k(x: &[BlockQ3K], y: &mut [f32]) {
    debug_check_len(x.len(), y.len());
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d_all = b.d.to_f32();
        for (i, out) in y.iter_mut().enumerate() {
            let dl = d_all * f32::from(q3_scale(&b.scales, i / 16));
            *out = dl * f32::from(quant3(b, i));
        }
    }
}

/// Dot product of a Q3_K row with a Q8_K row, as ggml's `ggml_vec_dot_q3_K_q8_K_generic`.
///
/// Integer sums go to eight lanes (element `i` to lane `i % 8`); each block
/// adds `d * lane` to eight `f32` lane sums, which are added in lane order at
/// the end. Preconditions: `x.len() == y.len()`.
pub fn vec_dot_q3_k_q8_k(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(x.len(), y.len(), "vec_dot_q3_k_q8_k: row lengths differ");
    let mut sums = [0.0f32; 8];
    for (bx, by) in x.iter().zip(y) {
        let mut aux32 = [0i32; 8];
        for i in 0..QK_K {
            let prod = i32::from(by.qs[i]) * i32::from(quant3(bx, i));
            aux32[i % 8] += i32::from(q3_scale(&bx.scales, i / 16)) * prod;
        }
        let d = bx.d.to_f32() * by.d;
        add_lanes(&mut sums, d, &aux32);
    }
    sum_lanes(&sums, 0.0)
}
