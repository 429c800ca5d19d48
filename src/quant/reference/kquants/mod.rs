//! Scalar reference for the k-quants: Q2_K, Q3_K, Q4_K, Q5_K, Q6_K and the
//! Q8_K activation format.
//!
//! Ported from ggml (`ggml-quants.c` and the generic dots of
//! `ggml-cpu/quants.c`), keeping ggml's names so results can be compared
//! across projects:
//!
//! - `quantize_row_*` are ggml's `quantize_row_*_K_ref`, the quantizers
//!   `llama-quantize` runs when there is no importance matrix. They are
//!   byte-identical to llama.cpp: every float operation is done in `f32`, in
//!   ggml's order, with ggml's rounding (`nearest_int`), and Rust never fuses
//!   a multiply and an add (ggml-base is built without FMA contraction).
//! - `dequantize_row_*` are ggml's `dequantize_row_*`, operation for operation.
//! - `vec_dot_*_q8_k` are ggml's `ggml_vec_dot_*_q8_K_generic`: exact integer
//!   sums, then the same float scaling and summation order, so another
//!   kernel can be checked bit for bit against them where it keeps that order.
//!
//! Shapes: a row of `n` weights is `n / 256` blocks ([`QK_K`]). Every function
//! takes exact lengths: `y.len() == x.len() * 256` (dequantize),
//! `x.len() == y.len() * 256` (quantize), `x.len() == y.len()` (dots). The
//! type-dispatch layer checks lengths before calling; here a mismatch is a
//! debug assertion and, in release builds, only the blocks both sides hold
//! are processed (nothing panics).

mod q2_q3;
mod q4_q5;
mod q6_q8;
#[cfg(test)]
mod tests;

pub use q2_q3::{
    dequantize_row_q2_k, dequantize_row_q3_k, quantize_row_q2_k, quantize_row_q3_k,
    vec_dot_q2_k_q8_k, vec_dot_q3_k_q8_k,
};
pub use q4_q5::{
    dequantize_row_q4_k, dequantize_row_q5_k, quantize_row_q4_k, quantize_row_q5_k,
    vec_dot_q4_k_q8_k, vec_dot_q5_k_q8_k,
};
pub use q6_q8::{
    dequantize_row_q6_k, dequantize_row_q8_k, quantize_row_q6_k, quantize_row_q8_k,
    vec_dot_q6_k_q8_k,
};

use crate::quant::blocks::QK_K;
use half::f16;

/// ggml's `GROUP_MAX_EPS`: a group whose largest magnitude is below this is all zero.
const GROUP_MAX_EPS: f32 = 1e-15;

/// ggml's `nearest_int`: rounds to the nearest integer, ties to even.
///
/// Adding 1.5 * 2^23 puts the integer part in the low mantissa bits, so the
/// FPU's round-to-nearest-even does the rounding. Exact for
/// `|fval| <= 4194303`; outside that range (and for NaN) the result is what
/// ggml's bit trick gives, garbage but never a panic.
#[inline]
pub fn nearest_int(fval: f32) -> i32 {
    let val = fval + 12_582_912.0;
    let i = val.to_bits() as i32;
    (i & 0x007f_ffff) - 0x0040_0000
}

/// `GGML_FP32_TO_FP16`: round to nearest even (overflow to infinity).
#[inline]
fn to_f16(x: f32) -> f16 {
    f16::from_f32(x)
}

/// Asserts, in debug builds, the documented length contract of a block function.
#[inline]
fn debug_check_len(blocks: usize, values: usize) {
    debug_assert_eq!(
        values,
        blocks * QK_K,
        "k-quant reference: {blocks} blocks need {} values, got {values}",
        blocks * QK_K
    );
}

/// The largest magnitude of `x` and the signed element that has it (the first
/// one on ties), as ggml tracks them: `(amax, max)`, both 0 for an empty or
/// all-zero slice.
fn signed_absmax(x: &[f32]) -> (f32, f32) {
    let mut max = 0.0f32;
    let mut amax = 0.0f32;
    for &v in x {
        let ax = v.abs();
        if ax > amax {
            amax = ax;
            max = v;
        }
    }
    (amax, max)
}

/// ggml's `make_qx_quants(n, nmax, x, L, rmse_type = 1, qw = NULL)`: symmetric
/// quants with a scale refined over 19 candidates, weighting each element by `x^2`.
///
/// `l` receives quants in `0..2*nmax` (stored as `q + nmax`). Returns the scale.
fn make_qx_quants_rmse1(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let quant = |iscale: f32, v: f32| nearest_int(iscale * v).clamp(-nmax, nmax - 1);
    let sums = |iscale: f32| {
        let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
        for &v in x {
            let q = quant(iscale, v) as f32;
            let w = v * v;
            sumlx += w * v * q;
            suml2 += w * q * q;
        }
        (sumlx, suml2)
    };
    let iscale = -(nmax as f32) / max;
    for (li, &v) in l.iter_mut().zip(x) {
        *li = (quant(iscale, v) + nmax) as i8;
    }
    let (sumlx, suml2) = sums(iscale);
    let mut scale = if suml2 != 0.0 { sumlx / suml2 } else { 0.0 };
    let mut best = scale * sumlx;
    for is in (-9..=9).filter(|&is| is != 0) {
        let iscale = -(nmax as f32 + 0.1 * is as f32) / max;
        let (sumlx, suml2) = sums(iscale);
        if suml2 > 0.0 && sumlx * sumlx > best * suml2 {
            for (li, &v) in l.iter_mut().zip(x) {
                *li = (quant(iscale, v) + nmax) as i8;
            }
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    scale
}

/// ggml's `make_q3_quants(n, nmax, x, L, do_rmse = true)`: symmetric quants,
/// then up to five passes of coordinate descent on the `x^2`-weighted error.
///
/// `l` receives quants in `0..2*nmax` (stored as `q + nmax`); an all-zero group
/// gets zeros, as in ggml. Returns the scale.
fn make_q3_quants(nmax: i32, x: &[f32], l: &mut [i8]) -> f32 {
    let (amax, max) = signed_absmax(x);
    if amax < GROUP_MAX_EPS {
        l.fill(0);
        return 0.0;
    }
    let iscale = -(nmax as f32) / max;
    let (mut sumlx, mut suml2) = (0.0f32, 0.0f32);
    for (li, &v) in l.iter_mut().zip(x) {
        let q = nearest_int(iscale * v).clamp(-nmax, nmax - 1);
        *li = q as i8;
        let w = v * v;
        sumlx += w * v * q as f32;
        suml2 += w * q as f32 * q as f32;
    }
    for _ in 0..5 {
        let mut n_changed = 0;
        for (li, &v) in l.iter_mut().zip(x) {
            let w = v * v;
            let old = *li as f32;
            let mut slx = sumlx - w * v * old;
            if slx > 0.0 {
                let mut sl2 = suml2 - w * old * old;
                let new_l = nearest_int(v * sl2 / slx).clamp(-nmax, nmax - 1);
                if new_l != i32::from(*li) {
                    slx += w * v * new_l as f32;
                    sl2 += w * new_l as f32 * new_l as f32;
                    if sl2 > 0.0 && slx * slx * suml2 > sumlx * sumlx * sl2 {
                        *li = new_l as i8;
                        sumlx = slx;
                        suml2 = sl2;
                        n_changed += 1;
                    }
                }
            }
        }
        if n_changed == 0 {
            break;
        }
    }
    for li in l.iter_mut() {
        *li += nmax as i8;
    }
    if suml2 > 0.0 {
        sumlx / suml2
    } else {
        0.0
    }
}

/// The search grid and error norm of [`make_qkx2_quants`].
#[derive(Clone, Copy)]
struct Qkx2Params {
    /// Largest quant (`3`, `15` or `31`).
    nmax: i32,
    /// First candidate offset added to `nmax`.
    rmin: f32,
    /// Step between candidates.
    rdelta: f32,
    /// Number of steps (candidates are `0..=nstep`).
    nstep: i32,
    /// Weighted absolute error instead of squared.
    use_mad: bool,
}

/// ggml's `make_qkx2_quants`: asymmetric quants `x ~ scale * q - min` with the
/// scale and min fitted by weighted least squares over a grid of inverse scales.
///
/// `x`, `weights`, `l`: one group (16 or 32 values). `l` receives quants in
/// `0..=nmax`. Returns `(scale, min)` with `min >= 0` meaning `x ~ scale*q - min`.
fn make_qkx2_quants(p: Qkx2Params, x: &[f32], weights: &[f32], l: &mut [u8]) -> (f32, f32) {
    let n = x.len();
    let (mut min, max, sum_w, sum_x) = qkx2_stats(x, weights);
    if min > 0.0 {
        min = 0.0;
    }
    if max == min {
        l.fill(0);
        return (0.0, -min);
    }
    // `min` moves to the best fit found so far, and later candidates are
    // quantized against it (and divide by `max - min` with it), as in ggml.
    let quantize = |iscale: f32, min: f32, out: &mut [u8]| {
        for (q, &v) in out.iter_mut().zip(x) {
            *q = nearest_int(iscale * (v - min)).clamp(0, p.nmax) as u8;
        }
    };
    let nmax = p.nmax as f32;
    let iscale = nmax / (max - min);
    let mut scale = 1.0 / iscale;
    quantize(iscale, min, l);
    let mut best_error = qkx2_error(p.use_mad, scale, min, l, x, weights);
    if p.nstep < 1 {
        return (scale, -min);
    }
    let mut laux = [0u8; 32];
    let laux = &mut laux[..n];
    for is in 0..=p.nstep {
        let iscale = (p.rmin + p.rdelta * is as f32 + nmax) / (max - min);
        quantize(iscale, min, laux);
        let (mut sum_l, mut sum_l2, mut sum_xl) = (0.0f32, 0.0f32, 0.0f32);
        for i in 0..n {
            let q = f32::from(laux[i]);
            let w = weights[i];
            sum_l += w * q;
            sum_l2 += w * q * q;
            sum_xl += w * q * x[i];
        }
        let det = sum_w * sum_l2 - sum_l * sum_l;
        if det > 0.0 {
            let mut this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
            let mut this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
            if this_min > 0.0 {
                this_min = 0.0;
                this_scale = sum_xl / sum_l2;
            }
            let cur_error = qkx2_error(p.use_mad, this_scale, this_min, laux, x, weights);
            if cur_error < best_error {
                l.copy_from_slice(laux);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    (scale, -min)
}

/// `(min, max, sum(w), sum(w * x))` of a group, accumulated in ggml's order.
fn qkx2_stats(x: &[f32], weights: &[f32]) -> (f32, f32, f32, f32) {
    let mut min = x[0];
    let mut max = x[0];
    let mut sum_w = weights[0];
    let mut sum_x = sum_w * x[0];
    for (&v, &w) in x.iter().zip(weights).skip(1) {
        min = if v < min { v } else { min };
        max = if v > max { v } else { max };
        sum_w += w;
        sum_x += w * v;
    }
    (min, max, sum_w, sum_x)
}

/// `sum(w * err(scale * q + min - x))` with `err` = `|.|` or `(.)^2`, in order.
fn qkx2_error(use_mad: bool, scale: f32, min: f32, q: &[u8], x: &[f32], weights: &[f32]) -> f32 {
    let mut error = 0.0f32;
    for ((&q, &v), &w) in q.iter().zip(x).zip(weights) {
        let diff = scale * f32::from(q) + min - v;
        error += w * if use_mad { diff.abs() } else { diff * diff };
    }
    error
}

/// ggml's `get_scale_min_k4`: the `j`-th 6-bit scale and min of a Q4_K / Q5_K block.
#[inline]
fn get_scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        let d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
        let m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        (d, m)
    }
}

/// Packs four 2-bit planes of 128 quants as ggml does for Q2_K / Q3_K:
/// byte `l` of each 32-byte half holds quants `l`, `l+32`, `l+64`, `l+96`.
fn pack_2bit(l: &[u8; QK_K], qs: &mut [u8; QK_K / 4]) {
    for (half, out) in qs.chunks_exact_mut(32).enumerate() {
        let base = half * 128;
        for (i, q) in out.iter_mut().enumerate() {
            let j = base + i;
            *q = l[j] | (l[j + 32] << 2) | (l[j + 64] << 4) | (l[j + 96] << 6);
        }
    }
}

/// `sums[l] += d * aux32[l]`, ggml's per-block lane update.
#[inline]
fn add_lanes(sums: &mut [f32; 8], d: f32, aux32: &[i32; 8]) {
    for (s, &a) in sums.iter_mut().zip(aux32) {
        *s += d * a as f32;
    }
}

/// `start + sums[0] + ... + sums[7]`, in that order.
#[inline]
fn sum_lanes(sums: &[f32; 8], start: f32) -> f32 {
    sums.iter().fold(start, |acc, &s| acc + s)
}
