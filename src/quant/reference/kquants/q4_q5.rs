//! Q4_K and Q5_K: 8 sub-blocks of 32 weights with 6-bit scales and mins,
//! 4-bit quants (Q5_K adds a fifth bit in `qh`).

use super::{
    add_lanes, debug_check_len, get_scale_min_k4, make_qkx2_quants, nearest_int, sum_lanes, to_f16,
    Qkx2Params,
};
use crate::quant::blocks::{BlockQ4K, BlockQ5K, BlockQ8K, K_SCALE_SIZE, QK_K};
use half::f16;

/// `quantize_row_q4_K_ref`'s `make_qkx2_quants(32, 15, ..., -1, 0.1, 20, false)`.
const Q4K_GRID: Qkx2Params = Qkx2Params {
    nmax: 15,
    rmin: -1.0,
    rdelta: 0.1,
    nstep: 20,
    use_mad: false,
};
/// `quantize_row_q5_K_ref`'s `make_qkx2_quants(32, 31, ..., -0.5, 0.1, 15, false)`.
const Q5K_GRID: Qkx2Params = Qkx2Params {
    nmax: 31,
    rmin: -0.5,
    rdelta: 0.1,
    nstep: 15,
    use_mad: false,
};

/// The header shared by Q4_K and Q5_K blocks.
struct ScaleMin {
    d: f16,
    dmin: f16,
    scales: [u8; K_SCALE_SIZE],
}

/// The part of `quantize_row_q{4,5}_K_ref` common to both formats: fits each
/// 32-weight group, packs the 6-bit scales and mins, and requantizes every
/// group against the packed values.
///
/// `x.len() == 256`; `l` receives the quants in `0..=grid.nmax`.
fn quantize_k4_header(x: &[f32], grid: Qkx2Params, l: &mut [u8; QK_K]) -> ScaleMin {
    let mut scales = [0.0f32; QK_K / 32];
    let mut mins = [0.0f32; QK_K / 32];
    let mut weights = [0.0f32; 32];
    let (mut max_scale, mut max_min) = (0.0f32, 0.0f32);
    for j in 0..QK_K / 32 {
        let xs = &x[32 * j..32 * j + 32];
        let sum_x2 = xs.iter().fold(0.0f32, |acc, &v| acc + v * v);
        let av_x = (sum_x2 / 32.0).sqrt();
        for (w, v) in weights.iter_mut().zip(xs) {
            *w = av_x + v.abs();
        }
        (scales[j], mins[j]) = make_qkx2_quants(grid, xs, &weights, &mut l[32 * j..32 * j + 32]);
        max_scale = if scales[j] > max_scale {
            scales[j]
        } else {
            max_scale
        };
        max_min = if mins[j] > max_min { mins[j] } else { max_min };
    }
    let inv_scale = if max_scale > 0.0 {
        63.0 / max_scale
    } else {
        0.0
    };
    let inv_min = if max_min > 0.0 { 63.0 / max_min } else { 0.0 };
    let mut packed = [0u8; K_SCALE_SIZE];
    for j in 0..QK_K / 32 {
        // ggml stores nearest_int into a uint8_t before clamping.
        let ls = (nearest_int(inv_scale * scales[j]) as u8).min(63);
        let lm = (nearest_int(inv_min * mins[j]) as u8).min(63);
        if j < 4 {
            packed[j] = ls;
            packed[j + 4] = lm;
        } else {
            packed[j + 4] = (ls & 0xF) | ((lm & 0xF) << 4);
            packed[j - 4] |= (ls >> 4) << 6;
            packed[j] |= (lm >> 4) << 6;
        }
    }
    let h = ScaleMin {
        d: to_f16(max_scale / 63.0),
        dmin: to_f16(max_min / 63.0),
        scales: packed,
    };
    let nmax = grid.nmax;
    for j in 0..QK_K / 32 {
        let (sc, m) = get_scale_min_k4(j, &h.scales);
        let d = h.d.to_f32() * f32::from(sc);
        if d == 0.0 {
            continue;
        }
        let dm = h.dmin.to_f32() * f32::from(m);
        for ii in 0..32 {
            l[32 * j + ii] = nearest_int((x[32 * j + ii] + dm) / d).clamp(0, nmax) as u8;
        }
    }
    h
}

/// Quantizes `x` to Q4_K exactly as ggml's `quantize_row_q4_K_ref`.
///
/// Preconditions: `x.len() == y.len() * 256`.
pub fn quantize_row_q4_k(x: &[f32], y: &mut [BlockQ4K]) {
    debug_check_len(y.len(), x.len());
    for (x, y) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut l = [0u8; QK_K];
        let h = quantize_k4_header(x, Q4K_GRID, &mut l);
        (y.d, y.dmin, y.scales) = (h.d, h.dmin, h.scales);
        // Byte i of each 32-byte chunk c: quant 64c+i low, 64c+32+i high.
        for (c, q) in y.qs.chunks_exact_mut(32).enumerate() {
            for (i, q) in q.iter_mut().enumerate() {
                *q = l[64 * c + i] | (l[64 * c + 32 + i] << 4);
            }
        }
    }
}

/// The 4-bit quant of element `i` (0..256) of a Q4_K / Q5_K `qs` array.
#[inline]
fn quant4(qs: &[u8; QK_K / 2], i: usize) -> u8 {
    let byte = qs[32 * (i / 64) + i % 32];
    if i % 64 < 32 {
        byte & 0xF
    } else {
        byte >> 4
    }
}

/// The 5-bit quant of element `i` of a Q5_K block.
#[inline]
fn quant5(b: &BlockQ5K, i: usize) -> u8 {
    let high = b.qh[i % 32] & (1 << (i / 32)) != 0;
    quant4(&b.qs, i) + if high { 16 } else { 0 }
}

/// Expands Q4_K blocks to `f32`, as ggml's `dequantize_row_q4_K`.
///
/// Preconditions: `y.len() == x.len() * 256`.
pub fn dequantize_row_q4_k(x: &[BlockQ4K], y: &mut [f32]) {
    debug_check_len(x.len(), y.len());
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, min) = (b.d.to_f32(), b.dmin.to_f32());
        for (i, out) in y.iter_mut().enumerate() {
            let (sc, m) = get_scale_min_k4(i / 32, &b.scales);
            *out = d * f32::from(sc) * f32::from(quant4(&b.qs, i)) - min * f32::from(m);
        }
    }
}

/// Expands Q5_K blocks to `f32`, as ggml's `dequantize_row_q5_K`.
///
/// Preconditions: `y.len() == x.len() * 256`.
pub fn dequantize_row_q5_k(x: &[BlockQ5K], y: &mut [f32]) {
    debug_check_len(x.len(), y.len());
    for (b, y) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let (d, min) = (b.d.to_f32(), b.dmin.to_f32());
        for (i, out) in y.iter_mut().enumerate() {
            let (sc, m) = get_scale_min_k4(i / 32, &b.scales);
            *out = d * f32::from(sc) * f32::from(quant5(b, i)) - min * f32::from(m);
        }
    }
}

/// Quantizes `x` to Q5_K exactly as ggml's `quantize_row_q5_K_ref`.
///
/// Preconditions: `x.len() == y.len() * 256`.
pub fn quantize_row_q5_k(x: &[f32], y: &mut [BlockQ5K]) {
    debug_check_len(y.len(), x.len());
    for (x, y) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let mut l = [0u8; QK_K];
        let h = quantize_k4_header(x, Q5K_GRID, &mut l);
        (y.d, y.dmin, y.scales) = (h.d, h.dmin, h.scales);
        // Low nibbles as in Q4_K; the fifth bit of quant i is bit i / 32 of qh[i % 32].
        y.qh = [0; QK_K / 8];
        for (i, &q) in l.iter().enumerate() {
            if q > 15 {
                y.qh[i % 32] |= 1 << (i / 32);
            }
        }
        for (c, q) in y.qs.chunks_exact_mut(32).enumerate() {
            for (i, q) in q.iter_mut().enumerate() {
                *q = (l[64 * c + i] & 0xF) | ((l[64 * c + 32 + i] & 0xF) << 4);
            }
        }
    }
}

/// The integer part of ggml's Q4_K / Q5_K dot for one block: eight lanes of
/// `scale * q * q8` (element `i` in lane `i % 8`) and `sum_j bsums_j * min_{j/2}`.
fn k4_block_isums(
    scales: &[u8; K_SCALE_SIZE],
    q8: &BlockQ8K,
    quant: impl Fn(usize) -> u8,
) -> ([i32; 8], i32) {
    let mut aux32 = [0i32; 8];
    for i in 0..QK_K {
        let (sc, _) = get_scale_min_k4(i / 32, scales);
        aux32[i % 8] += i32::from(sc) * (i32::from(q8.qs[i]) * i32::from(quant(i)));
    }
    let sumi = (0..QK_K / 16)
        .map(|j| i32::from(q8.bsums[j]) * i32::from(get_scale_min_k4(j / 2, scales).1))
        .sum();
    (aux32, sumi)
}

/// Dot product of a Q4_K row with a Q8_K row, as ggml's `ggml_vec_dot_q4_K_q8_K_generic`.
///
/// Per block: lane sums `+= d * aux32[l]` and `sumf -= dmin * sumi`; the eight
/// lane sums are added to `sumf` at the end. Preconditions: `x.len() == y.len()`.
pub fn vec_dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(x.len(), y.len(), "vec_dot_q4_k_q8_k: row lengths differ");
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let (aux32, sumi) = k4_block_isums(&bx.scales, by, |i| quant4(&bx.qs, i));
        add_lanes(&mut sums, bx.d.to_f32() * by.d, &aux32);
        sumf -= bx.dmin.to_f32() * by.d * sumi as f32;
    }
    sum_lanes(&sums, sumf)
}

/// Dot product of a Q5_K row with a Q8_K row, as ggml's `ggml_vec_dot_q5_K_q8_K_generic`.
///
/// Same arithmetic as [`vec_dot_q4_k_q8_k`] with 5-bit quants.
/// Preconditions: `x.len() == y.len()`.
pub fn vec_dot_q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    debug_assert_eq!(x.len(), y.len(), "vec_dot_q5_k_q8_k: row lengths differ");
    let mut sums = [0.0f32; 8];
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let (aux32, sumi) = k4_block_isums(&bx.scales, by, |i| quant5(bx, i));
        add_lanes(&mut sums, bx.d.to_f32() * by.d, &aux32);
        sumf -= bx.dmin.to_f32() * by.d * sumi as f32;
    }
    sum_lanes(&sums, sumf)
}
