//! The non-linear 4-bit formats IQ4_NL (blocks of 32) and IQ4_XS (super-blocks
//! of 256 with 6-bit sub-block scales).
//!
//! The quantizers port what llama-quantize runs when there is no importance
//! matrix: `quantize_iq4_nl` / `quantize_iq4_xs` calling
//! `quantize_row_iq4_nl_impl` with `quant_weights = NULL` and `ntry = 7`
//! (ggml-quants.c). Note that ggml's `quantize_row_iq4_nl_ref` uses
//! `ntry = -1` instead and gives other bytes; the files are made with the
//! former, so that is the reference here.

use super::float::{fp16_to_fp32, fp32_to_fp16};
use super::kquants::nearest_int;
use crate::quant::blocks::{BlockIQ4NL, BlockIQ4XS, BlockQ8K, BlockQ8_0, KVALUES_IQ4NL, QK_K};

const QK4_NL: usize = 32;
/// Sub-blocks of 32 in an IQ4_XS super-block.
const N_SUB: usize = QK_K / 32;
/// Scale candidates tried each side of the first guess (`ntry` in ggml).
const NTRY: i32 = 7;
/// ggml's `GROUP_MAX_EPS`: blocks with a smaller max magnitude get scale 0.
const GROUP_MAX_EPS: f32 = 1e-15;

/// Index of the level of `values` (sorted ascending) nearest to `x`; ties go
/// to the upper level (ggml's `best_index_int8`).
fn best_index_int8(values: &[i8; 16], x: f32) -> usize {
    if x <= f32::from(values[0]) {
        return 0;
    }
    if x >= f32::from(values[15]) {
        return 15;
    }
    let (mut ml, mut mu) = (0usize, 15usize);
    while mu - ml > 1 {
        let mav = (ml + mu) / 2;
        if x < f32::from(values[mav]) {
            mu = mav;
        } else {
            ml = mav;
        }
    }
    if x - f32::from(values[mu - 1]) < f32::from(values[mu]) - x {
        mu - 1
    } else {
        mu
    }
}

/// `(sum w q x, sum w q^2)` with `w = x^2` (no importance matrix) and `q` the
/// level nearest to `id * x`, accumulated in order in f32 as ggml does.
fn weighted_sums(xb: &[f32], id: f32) -> (f32, f32) {
    let (mut sumqx, mut sumq2) = (0.0f32, 0.0f32);
    for &x in xb {
        let q = f32::from(KVALUES_IQ4NL[best_index_int8(&KVALUES_IQ4NL, id * x)]);
        let w = x * x;
        sumqx += w * q * x;
        sumq2 += w * q * q;
    }
    (sumqx, sumq2)
}

/// The least-squares scale of one 32-element block (the per-block part of
/// `quantize_row_iq4_nl_impl`): start from `max / 127` mapped to the lowest
/// level, then try `2 * NTRY` other inverse scales and keep the best fit.
fn block_scale(xb: &[f32]) -> f32 {
    let (mut amax, mut max) = (0.0f32, 0.0f32);
    for &x in xb {
        if x.abs() > amax {
            amax = x.abs();
            max = x;
        }
    }
    if amax < GROUP_MAX_EPS {
        return 0.0;
    }
    let v0 = KVALUES_IQ4NL[0];
    let (sumqx, sumq2) = weighted_sums(xb, 1.0 / (-max / f32::from(v0)));
    let mut d = if sumq2 > 0.0 { sumqx / sumq2 } else { 0.0 };
    let mut best = d * sumqx;
    for itry in -NTRY..=NTRY {
        let id = (itry + i32::from(v0)) as f32 / max;
        let (sumqx, sumq2) = weighted_sums(xb, id);
        if sumq2 > 0.0 && sumqx * sumqx > best * sumq2 {
            d = sumqx / sumq2;
            best = d * sumqx;
        }
    }
    d
}

/// Level indices of `x` at inverse scale `id`, packed as in Q4_0.
fn pack_levels(x: &[f32], id: f32) -> [u8; 16] {
    let l = |j: usize| best_index_int8(&KVALUES_IQ4NL, id * x[j]) as u8;
    std::array::from_fn(|j| l(j) | (l(j + 16) << 4))
}

/// IQ4_NL: `d` = the block's least-squares scale, `q` = nearest level of `x / d`.
pub fn quantize_row_iq4_nl(x: &[f32], y: &mut [BlockIQ4NL]) {
    for (xb, yb) in x.chunks_exact(QK4_NL).zip(y.iter_mut()) {
        let d = block_scale(xb);
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        *yb = BlockIQ4NL {
            d: fp32_to_fp16(d),
            qs: pack_levels(xb, id),
        };
    }
}

/// IQ4_XS: per-block least-squares scales, quantized to 6 bits against
/// `d = -max_scale / 32` (`max_scale` the signed scale of largest magnitude),
/// then every block re-quantized with its rounded scale.
pub fn quantize_row_iq4_xs(x: &[f32], y: &mut [BlockIQ4XS]) {
    for (xs, yb) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let scales: [f32; N_SUB] =
            std::array::from_fn(|ib| block_scale(&xs[32 * ib..32 * ib + 32]));
        let (mut amax_scale, mut max_scale) = (0.0f32, 0.0f32);
        for &s in &scales {
            if s.abs() > amax_scale {
                amax_scale = s.abs();
                max_scale = s;
            }
        }
        // With every block zero this is -0.0, stored as the f16 0x8000 as ggml does.
        let d = -max_scale / 32.0;
        let id = if d != 0.0 { 1.0 / d } else { 0.0 };
        let mut out = BlockIQ4XS {
            d: fp32_to_fp16(d),
            scales_h: 0,
            scales_l: [0; 4],
            qs: [0; 128],
        };
        for (ib, &s) in scales.iter().enumerate() {
            let l = nearest_int(id * s).clamp(-32, 31);
            let dl = d * l as f32;
            let idl = if dl != 0.0 { 1.0 / dl } else { 0.0 };
            out.qs[16 * ib..16 * ib + 16]
                .copy_from_slice(&pack_levels(&xs[32 * ib..32 * ib + 32], idl));
            let l = (l + 32) as u8;
            out.scales_l[ib / 2] |= (l & 0xf) << (4 * (ib % 2));
            out.scales_h |= u16::from(l >> 4) << (2 * ib);
        }
        *yb = out;
    }
}

/// The level of element `j` (0..32) of a block's 16 packed bytes.
fn level(qs: &[u8], j: usize) -> i32 {
    let nibble = if j < 16 { qs[j] & 0xf } else { qs[j - 16] >> 4 };
    i32::from(KVALUES_IQ4NL[usize::from(nibble)])
}

/// The 6-bit scale of sub-block `ib` of an IQ4_XS block, minus 32 (-32..=31).
fn xs_scale(b: &BlockIQ4XS, ib: usize) -> i32 {
    let lo = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xf;
    let hi = (b.scales_h >> (2 * ib)) & 3;
    (i32::from(lo) | i32::from(hi) << 4) - 32
}

/// IQ4_NL: `y = d * kvalues[q]`.
pub fn dequantize_row_iq4_nl(x: &[BlockIQ4NL], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK4_NL)) {
        let d = fp16_to_fp32(xb.d);
        for (j, o) in yb.iter_mut().enumerate() {
            *o = d * level(&xb.qs, j) as f32;
        }
    }
}

/// IQ4_XS: `y = (d * (scale - 32)) * kvalues[q]`.
pub fn dequantize_row_iq4_xs(x: &[BlockIQ4XS], y: &mut [f32]) {
    for (xb, yb) in x.iter().zip(y.chunks_exact_mut(QK_K)) {
        let d = fp16_to_fp32(xb.d);
        for (ib, ys) in yb.chunks_exact_mut(32).enumerate() {
            let dl = d * xs_scale(xb, ib) as f32;
            let qs = &xb.qs[16 * ib..16 * ib + 16];
            for (j, o) in ys.iter_mut().enumerate() {
                *o = dl * level(qs, j) as f32;
            }
        }
    }
}

/// IQ4_NL weights . Q8_0 activations: `sum_b (d_a d_w) * isum_b`.
pub fn vec_dot_iq4_nl_q8_0(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (w, a) in x.iter().zip(y) {
        let d = fp16_to_fp32(a.d) * fp16_to_fp32(w.d);
        let isum: i32 =
            a.qs.iter()
                .enumerate()
                .map(|(j, &q)| i32::from(q) * level(&w.qs, j))
                .sum();
        sumf += d * isum as f32;
    }
    sumf
}

/// IQ4_XS weights . Q8_K activations: `sum (d_w d_a (scale - 32)) * isum` per sub-block.
pub fn vec_dot_iq4_xs_q8_k(x: &[BlockIQ4XS], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (w, a) in x.iter().zip(y) {
        let d4d8 = fp16_to_fp32(w.d) * a.d;
        for ib in 0..N_SUB {
            let qs = &w.qs[16 * ib..16 * ib + 16];
            let q8 = &a.qs[32 * ib..32 * ib + 32];
            let isum: i32 = q8
                .iter()
                .enumerate()
                .map(|(j, &q)| i32::from(q) * level(qs, j))
                .sum();
            sumf += (d4d8 * xs_scale(w, ib) as f32) * isum as f32;
        }
    }
    sumf
}

#[cfg(test)]
#[path = "iq4_tests.rs"]
mod tests;
