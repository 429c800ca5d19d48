//! SIMD128 kernels: 16 quants per register; int8 dots as sign-extension to
//! i16 then `i32x4.dot_i16x8_s` (exact), or, in a relaxed-SIMD build,
//! `i32x4.relaxed_dot_i8x16_i7x16_add` where the weights are 7-bit unsigned.
//!
//! Formats whose quants carry an offset (Q4_0: nibble minus 8, Q5_0: minus
//! 16, Q3_K: minus 4, Q6_K: minus 32) dot the unsigned quants and subtract `offset * sum(a)`,
//! so the relaxed instruction applies to them too; the sums are exact
//! either way. Q8_0 and IQ4 weights are signed and keep the plain path.
//!
//! Precondition shared with every activation quantizer: int8 activations
//! lie in -127..=127, so the relaxed i16 pair sums cannot saturate.

use core::arch::wasm32::*;

use half::{bf16, f16};

use crate::backend::cpu::kernels::iq4::xs_scale;
use crate::backend::cpu::kernels::kquants::{q3_scales, scale_min_k4};
use crate::backend::cpu::kernels::{dot, float, fp16, quant, DotFn, QuantizeFn};
use crate::quant::blocks::{
    BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K,
    BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1, KVALUES_IQ4NL, QK_K,
};
use crate::quant::GgmlType;

/// The SIMD128 dot of weight type `ty`, `None` where the scalar one stays.
pub(super) fn vec_dot(ty: GgmlType) -> Option<DotFn> {
    use GgmlType as T;
    let f: DotFn = match ty {
        T::F32 => |w, a| dot::<f32, f32>(w, a, vec_dot_f32),
        T::F16 => |w, a| dot::<f16, f16>(w, a, vec_dot_f16),
        T::BF16 => |w, a| dot::<bf16, bf16>(w, a, vec_dot_bf16),
        T::Q4_0 => |w, a| dot::<BlockQ4_0, BlockQ8_0>(w, a, vec_dot_q4_0_q8_0),
        T::Q4_1 => |w, a| dot::<BlockQ4_1, BlockQ8_1>(w, a, vec_dot_q4_1_q8_1),
        T::Q5_0 => |w, a| dot::<BlockQ5_0, BlockQ8_0>(w, a, vec_dot_q5_0_q8_0),
        T::Q5_1 => |w, a| dot::<BlockQ5_1, BlockQ8_1>(w, a, vec_dot_q5_1_q8_1),
        T::Q8_0 => |w, a| dot::<BlockQ8_0, BlockQ8_0>(w, a, vec_dot_q8_0_q8_0),
        T::IQ4_NL => |w, a| dot::<BlockIQ4NL, BlockQ8_0>(w, a, vec_dot_iq4_nl_q8_0),
        T::IQ4_XS => |w, a| dot::<BlockIQ4XS, BlockQ8K>(w, a, vec_dot_iq4_xs_q8_k),
        T::Q2_K => |w, a| dot::<BlockQ2K, BlockQ8K>(w, a, vec_dot_q2_k_q8_k),
        T::Q3_K => |w, a| dot::<BlockQ3K, BlockQ8K>(w, a, vec_dot_q3_k_q8_k),
        T::Q4_K => |w, a| dot::<BlockQ4K, BlockQ8K>(w, a, vec_dot_q4_k_q8_k),
        T::Q5_K => |w, a| dot::<BlockQ5K, BlockQ8K>(w, a, vec_dot_q5_k_q8_k),
        T::Q6_K => |w, a| dot::<BlockQ6K, BlockQ8K>(w, a, vec_dot_q6_k_q8_k),
        _ => return None,
    };
    Some(f)
}

/// The SIMD128 activation quantizer to `ty`, `None` where the scalar one stays.
pub(super) fn quantizer(ty: GgmlType) -> Option<QuantizeFn> {
    let f: QuantizeFn = match ty {
        GgmlType::Q8_0 => |x, o| quant::<BlockQ8_0>(x, o, quantize_row_q8_0),
        GgmlType::Q8_1 => |x, o| quant::<BlockQ8_1>(x, o, quantize_row_q8_1),
        GgmlType::Q8_K => |x, o| quant::<BlockQ8K>(x, o, quantize_row_q8_k),
        _ => return None,
    };
    Some(f)
}

// ---------------------------------------------------------------- helpers

/// The 16 bytes at `p[at..at + 16]`; zeros if `p` is shorter (the callers'
/// fixed-size block fields rule that out, and the check folds away).
#[inline(always)]
pub(super) fn ld(p: &[u8], at: usize) -> v128 {
    match p.get(at..at + 16) {
        // SAFETY: the slice holds 16 readable bytes; `v128.load` has no
        // alignment requirement.
        Some(s) => unsafe { v128_load(s.as_ptr().cast()) },
        None => i8x16_splat(0),
    }
}

/// [`ld`] for int8 quants.
#[inline(always)]
pub(super) fn ldi(p: &[i8], at: usize) -> v128 {
    ld(bytemuck::cast_slice(p), at)
}

/// The four f32 at `p[at..at + 4]` (zeros if `p` is shorter).
#[inline(always)]
fn ldf(p: &[f32], at: usize) -> v128 {
    match p.get(at..at + 4) {
        // SAFETY: the slice holds 16 readable bytes; no alignment needed.
        Some(s) => unsafe { v128_load(s.as_ptr().cast()) },
        None => f32x4_splat(0.0),
    }
}

/// Stores `v` into `p[at..at + 16]` (nothing if `p` is shorter).
#[inline(always)]
fn st(p: &mut [i8], at: usize, v: v128) {
    if let Some(s) = p.get_mut(at..at + 16) {
        // SAFETY: the slice holds 16 writable bytes; `v128.store` has no
        // alignment requirement.
        unsafe { v128_store(s.as_mut_ptr().cast(), v) }
    }
}

/// Sum of four i32 lanes (wrapping, as the scalar sums are exact anyway).
#[inline(always)]
pub(super) fn hsum(v: v128) -> i32 {
    i32x4_extract_lane::<0>(v)
        .wrapping_add(i32x4_extract_lane::<1>(v))
        .wrapping_add(i32x4_extract_lane::<2>(v))
        .wrapping_add(i32x4_extract_lane::<3>(v))
}

/// `acc` + four i32 lanes whose sum is `sum(a[i] * b[i])` over 16 int8 pairs.
#[inline(always)]
fn dot_i8(a: v128, b: v128, acc: v128) -> v128 {
    let lo = i32x4_dot_i16x8(i16x8_extend_low_i8x16(a), i16x8_extend_low_i8x16(b));
    let hi = i32x4_dot_i16x8(i16x8_extend_high_i8x16(a), i16x8_extend_high_i8x16(b));
    i32x4_add(acc, i32x4_add(lo, hi))
}

/// [`dot_i8`] for weights `w` in 0..=127 and activations `a` in -127..=127.
#[inline(always)]
fn dot_u7(w: v128, a: v128, acc: v128) -> v128 {
    #[cfg(target_feature = "relaxed-simd")]
    {
        i32x4_relaxed_dot_i8x16_i7x16_add(a, w, acc)
    }
    #[cfg(not(target_feature = "relaxed-simd"))]
    {
        dot_i8(w, a, acc)
    }
}

/// Exact `sum((w0 - off) * a0) + sum((w1 - off) * a1)` for unsigned quants
/// `w0`, `w1` (0..=127) of one 32-element block.
#[inline(always)]
fn dot32_offset(w0: v128, w1: v128, a0: v128, a1: v128, off: i8) -> i32 {
    let z = i32x4_splat(0);
    #[cfg(target_feature = "relaxed-simd")]
    {
        let s = dot_u7(w0, a0, dot_u7(w1, a1, z));
        let o = i8x16_splat(off);
        let c = dot_u7(o, a0, dot_u7(o, a1, z));
        hsum(i32x4_sub(s, c))
    }
    #[cfg(not(target_feature = "relaxed-simd"))]
    {
        let o = i8x16_splat(off);
        hsum(dot_i8(
            i8x16_sub(w0, o),
            a0,
            dot_i8(i8x16_sub(w1, o), a1, z),
        ))
    }
}

/// Low nibbles of the 16 bytes of `v`.
#[inline(always)]
pub(super) fn lo4(v: v128) -> v128 {
    v128_and(v, u8x16_splat(0x0F))
}

/// High nibbles of the 16 bytes of `v`.
#[inline(always)]
pub(super) fn hi4(v: v128) -> v128 {
    u8x16_shr(v, 4)
}

/// The fifth bits of a Q5 block as bytes `0x10` / `0`: elements 0..16, 16..32.
#[inline(always)]
pub(super) fn q5_high(qh: [u8; 4]) -> (v128, v128) {
    let h = u32x4_splat(u32::from_le_bytes(qh));
    let bits = u8x16(1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128);
    let spread = |i: u8, j: u8| {
        let b = i8x16_swizzle(h, u8x16(i, i, i, i, i, i, i, i, j, j, j, j, j, j, j, j));
        v128_and(i8x16_eq(v128_and(b, bits), bits), u8x16_splat(0x10))
    };
    (spread(0, 1), spread(2, 3))
}

// ------------------------------------------------------- 32-element formats

/// Dot of a Q4_0 row with a Q8_0 row of the same length.
pub fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let q = ld(&bx.qs, 0);
        let sumi = dot32_offset(lo4(q), hi4(q), ldi(&by.qs, 0), ldi(&by.qs, 16), 8);
        sumf += sumi as f32 * (fp16(bx.d) * fp16(by.d));
    }
    sumf
}

/// Dot of a Q4_1 row with a Q8_1 row of the same length.
pub fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let q = ld(&bx.qs, 0);
        let z = i32x4_splat(0);
        let s = dot_u7(lo4(q), ldi(&by.qs, 0), dot_u7(hi4(q), ldi(&by.qs, 16), z));
        let sumi = hsum(s);
        sumf += (fp16(bx.d) * fp16(by.d)) * sumi as f32 + fp16(bx.m) * fp16(by.s);
    }
    sumf
}

/// Dot of a Q5_0 row with a Q8_0 row of the same length.
pub fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let q = ld(&bx.qs, 0);
        let (h0, h1) = q5_high(bx.qh);
        let (w0, w1) = (v128_or(lo4(q), h0), v128_or(hi4(q), h1));
        let sumi = dot32_offset(w0, w1, ldi(&by.qs, 0), ldi(&by.qs, 16), 16);
        sumf += (fp16(bx.d) * fp16(by.d)) * sumi as f32;
    }
    sumf
}

/// Dot of a Q5_1 row with a Q8_1 row of the same length.
pub fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let q = ld(&bx.qs, 0);
        let (h0, h1) = q5_high(bx.qh);
        let (w0, w1) = (v128_or(lo4(q), h0), v128_or(hi4(q), h1));
        let z = i32x4_splat(0);
        let sumi = hsum(dot_u7(w0, ldi(&by.qs, 0), dot_u7(w1, ldi(&by.qs, 16), z)));
        sumf += (fp16(bx.d) * fp16(by.d)) * sumi as f32 + fp16(bx.m) * fp16(by.s);
    }
    sumf
}

/// Dot of a Q8_0 row with a Q8_0 row of the same length.
pub fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let z = i32x4_splat(0);
        let s = dot_i8(ldi(&bx.qs, 0), ldi(&by.qs, 0), z);
        let sumi = hsum(dot_i8(ldi(&bx.qs, 16), ldi(&by.qs, 16), s));
        sumf += sumi as f32 * (fp16(bx.d) * fp16(by.d));
    }
    sumf
}

/// The IQ4 levels of 16 packed nibbles: elements 0..16 and 16..32.
#[inline(always)]
fn iq4_levels(q: v128) -> (v128, v128) {
    let kv = ldi(&KVALUES_IQ4NL, 0);
    (i8x16_swizzle(kv, lo4(q)), i8x16_swizzle(kv, hi4(q)))
}

/// Dot of an IQ4_NL row with a Q8_0 row of the same length.
pub fn vec_dot_iq4_nl_q8_0(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let (w0, w1) = iq4_levels(ld(&bx.qs, 0));
        let z = i32x4_splat(0);
        let sumi = hsum(dot_i8(w0, ldi(&by.qs, 0), dot_i8(w1, ldi(&by.qs, 16), z)));
        sumf += (fp16(bx.d) * fp16(by.d)) * sumi as f32;
    }
    sumf
}

// ------------------------------------------------------ 256-element formats

/// Dot of an IQ4_XS row with a Q8_K row of the same length.
pub fn vec_dot_iq4_xs_q8_k(x: &[BlockIQ4XS], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let d4d8 = fp16(bx.d) * by.d;
        for ib in 0..QK_K / 32 {
            let (w0, w1) = iq4_levels(ld(&bx.qs, 16 * ib));
            let z = i32x4_splat(0);
            let a = &by.qs[32 * ib..];
            let sumi = hsum(dot_i8(w0, ldi(a, 0), dot_i8(w1, ldi(a, 16), z)));
            sumf += d4d8 * xs_scale(bx, ib) as f32 * sumi as f32;
        }
    }
    sumf
}

/// Dot of a Q2_K row with a Q8_K row of the same length.
pub fn vec_dot_q2_k_q8_k(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let summs: i32 = (0..16)
            .map(|j| i32::from(by.bsums[j]) * i32::from(bx.scales[j] >> 4))
            .sum();
        let mut acc = i32x4_splat(0);
        for j in 0..16 {
            // Group j: elements 16j.. = 128 h + 32 s + 16 p.
            let (h, s, p) = (j / 8, (j / 2) % 4, j % 2);
            let q = ld(&bx.qs, 32 * h + 16 * p);
            let w = v128_and(u8x16_shr(q, 2 * s as u32), u8x16_splat(3));
            let d = dot_u7(w, ldi(&by.qs, 16 * j), i32x4_splat(0));
            acc = i32x4_add(
                acc,
                i32x4_mul(d, i32x4_splat(i32::from(bx.scales[j] & 0xF))),
            );
        }
        let isum = hsum(acc);
        let dall = by.d * fp16(bx.d);
        let dmin = by.d * fp16(bx.dmin);
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// `sum_j scale[j] * bsums[j]` over a block's sixteen 16-element groups.
#[inline(always)]
pub(super) fn scaled_bsums(by: &BlockQ8K, scale: impl Fn(usize) -> i32) -> i32 {
    (0..16).map(|j| i32::from(by.bsums[j]) * scale(j)).sum()
}

/// Dot of a Q3_K row with a Q8_K row of the same length.
pub fn vec_dot_q3_k_q8_k(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let scales = q3_scales(&bx.scales);
        let mut acc = i32x4_splat(0);
        for j in 0..16 {
            // Unsigned quants 0..8 (the stored value plus 4).
            let (h, s, p) = (j / 8, (j / 2) % 4, j % 2);
            let q = ld(&bx.qs, 32 * h + 16 * p);
            let low = v128_and(u8x16_shr(q, 2 * s as u32), u8x16_splat(3));
            let hm = ld(&bx.hmask, 16 * p);
            let high = v128_and(u8x16_shr(hm, (4 * h + s) as u32), u8x16_splat(1));
            let w = v128_or(low, u8x16_shl(high, 2));
            let d = dot_u7(w, ldi(&by.qs, 16 * j), i32x4_splat(0));
            acc = i32x4_add(acc, i32x4_mul(d, i32x4_splat(i32::from(scales[j]))));
        }
        let isum = hsum(acc) - 4 * scaled_bsums(by, |j| i32::from(scales[j]));
        sumf += fp16(bx.d) * by.d * isum as f32;
    }
    sumf
}

/// The exact `sum_j sc_j * dot_j` of a Q4_K / Q5_K block, given the fifth
/// bits' planes `qh` (Q5_K) or `None`.
#[inline(always)]
fn k45_isum(qs: &[u8; QK_K / 2], qh: Option<&[u8; QK_K / 8]>, sc: &[u8; 12], by: &BlockQ8K) -> i32 {
    let mut acc = i32x4_splat(0);
    let z = i32x4_splat(0);
    for c in 0..4 {
        let (q0, q1) = (ld(qs, 32 * c), ld(qs, 32 * c + 16));
        let (mut l0, mut l1, mut h0, mut h1) = (lo4(q0), lo4(q1), hi4(q0), hi4(q1));
        if let Some(qh) = qh {
            let plane =
                |v: v128, b: usize| u8x16_shl(v128_and(u8x16_shr(v, b as u32), u8x16_splat(1)), 4);
            let (b0, b1) = (ld(qh, 0), ld(qh, 16));
            l0 = v128_or(l0, plane(b0, 2 * c));
            l1 = v128_or(l1, plane(b1, 2 * c));
            h0 = v128_or(h0, plane(b0, 2 * c + 1));
            h1 = v128_or(h1, plane(b1, 2 * c + 1));
        }
        let a = &by.qs[64 * c..];
        let lo = dot_u7(l0, ldi(a, 0), dot_u7(l1, ldi(a, 16), z));
        let hi = dot_u7(h0, ldi(a, 32), dot_u7(h1, ldi(a, 48), z));
        let (s0, s1) = (scale_min_k4(2 * c, sc).0, scale_min_k4(2 * c + 1, sc).0);
        acc = i32x4_add(acc, i32x4_mul(lo, i32x4_splat(i32::from(s0))));
        acc = i32x4_add(acc, i32x4_mul(hi, i32x4_splat(i32::from(s1))));
    }
    hsum(acc)
}

/// `sum_j bsums[j] * min(j / 2)` of a Q4_K / Q5_K block.
#[inline(always)]
fn k45_mins(sc: &[u8; 12], by: &BlockQ8K) -> i32 {
    scaled_bsums(by, |j| i32::from(scale_min_k4(j / 2, sc).1))
}

/// Dot of a Q4_K row with a Q8_K row of the same length.
pub fn vec_dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let isum = k45_isum(&bx.qs, None, &bx.scales, by);
        let mins = k45_mins(&bx.scales, by);
        sumf += fp16(bx.d) * by.d * isum as f32 - fp16(bx.dmin) * by.d * mins as f32;
    }
    sumf
}

/// Dot of a Q5_K row with a Q8_K row of the same length.
pub fn vec_dot_q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let isum = k45_isum(&bx.qs, Some(&bx.qh), &bx.scales, by);
        let mins = k45_mins(&bx.scales, by);
        sumf += fp16(bx.d) * by.d * isum as f32 - fp16(bx.dmin) * by.d * mins as f32;
    }
    sumf
}

/// Dot of a Q6_K row with a Q8_K row of the same length.
pub fn vec_dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let mut acc = i32x4_splat(0);
        for half in 0..2 {
            let ql: [v128; 4] = core::array::from_fn(|i| ld(&bx.ql, 64 * half + 16 * i));
            let qh = [ld(&bx.qh, 32 * half), ld(&bx.qh, 32 * half + 16)];
            for g in 0..8 {
                // Group g of the half: elements 16 g.. = 32 k + 16 p, from
                // ql[k % 2 * 2 + p] (low nibble for k < 2) and qh bits 2k.
                let (k, p) = (g / 2, g % 2);
                let l = ql[(k % 2) * 2 + p];
                let low = if k < 2 { lo4(l) } else { hi4(l) };
                let high = v128_and(u8x16_shr(qh[p], 2 * k as u32), u8x16_splat(3));
                let w = v128_or(low, u8x16_shl(high, 4));
                let j = 8 * half + g;
                let d = dot_u7(w, ldi(&by.qs, 16 * j), i32x4_splat(0));
                acc = i32x4_add(acc, i32x4_mul(d, i32x4_splat(i32::from(bx.scales[j]))));
            }
        }
        let isum = hsum(acc) - 32 * scaled_bsums(by, |j| i32::from(bx.scales[j]));
        sumf += fp16(bx.d) * by.d * isum as f32;
    }
    sumf
}

// ---------------------------------------------------------------- floats

/// The eight lanes `l0..l3`, `l4..l7` summed in order, as the scalar dots end.
#[inline(always)]
fn lanes8(a: v128, b: v128) -> [f32; 8] {
    [
        f32x4_extract_lane::<0>(a),
        f32x4_extract_lane::<1>(a),
        f32x4_extract_lane::<2>(a),
        f32x4_extract_lane::<3>(a),
        f32x4_extract_lane::<0>(b),
        f32x4_extract_lane::<1>(b),
        f32x4_extract_lane::<2>(b),
        f32x4_extract_lane::<3>(b),
    ]
}

/// Dot of two f32 rows in eight lanes (the scalar kernel's order).
pub fn vec_dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len()) / 8 * 8;
    let (mut a0, mut a1) = (f32x4_splat(0.0), f32x4_splat(0.0));
    for i in (0..n).step_by(8) {
        a0 = f32x4_add(a0, f32x4_mul(ldf(x, i), ldf(y, i)));
        a1 = f32x4_add(a1, f32x4_mul(ldf(x, i + 4), ldf(y, i + 4)));
    }
    let m = x.len().min(y.len());
    float::f32_dot_end(lanes8(a0, a1), &x[n..m], &y[n..m])
}

/// The f16 in the high half of each u32 lane of `h` as f32, for finite
/// values: sign, exponent and mantissa shifted into f32 position (the
/// exponent field then holds the half's), then rebased.
///
/// Without `SUBNORMAL`, for normal halves and zeros: times 2^112. A
/// subnormal half would make that f32 subnormal, and x86 takes an f32
/// operation on a subnormal operand through a microcode assist of about a
/// hundred cycles (wasm does not flush them): Q8_0 weights with subnormal
/// scales ran at a sixth of the speed, Llama-3.2-1B-shaped Q6_K, most of
/// whose `d` are subnormal, at 0.7 (Node 20 on a Xeon).
///
/// With `SUBNORMAL`, for every finite half: normal ones rebased by an
/// integer add; subnormal ones and zeros (no implicit leading one) as the
/// difference of two normal f32, `±2^-14 (1 + m / 1024) - ±2^-14`, exact;
/// each lane picks its case, and no f32 operation sees a subnormal. The
/// five more instructions cost the 32-element formats 14-22% from cache,
/// so weights without subnormal scales take the other variant.
#[inline(always)]
pub(crate) fn h2f_high<const SUBNORMAL: bool>(h: v128) -> v128 {
    let bits = v128_and(i32x4_shr(h, 3), u32x4_splat(0x8FFF_E000));
    if !SUBNORMAL {
        return f32x4_mul(bits, f32x4_splat(f32::from_bits((127 + 112) << 23)));
    }
    let normal = i32x4_add(bits, u32x4_splat(112 << 23));
    let low = i32x4_add(normal, u32x4_splat(1 << 23));
    let sub = v128_or(
        f32x4_sub(low, v128_and(low, u32x4_splat(0xFF80_0000))),
        v128_and(bits, u32x4_splat(0x8000_0000)),
    );
    let tiny = i32x4_eq(v128_and(bits, u32x4_splat(0x0F80_0000)), i32x4_splat(0));
    v128_bitselect(sub, normal, tiny)
}

/// Four fp16 (the low 16 bits of each u32 lane; the high bits are ignored)
/// to f32, exactly as [`fp16`]: the finite ones by [`h2f_high`] (no f32
/// operation on a subnormal), infinities and NaNs with their bits kept and
/// the f32 exponent all ones.
#[inline(always)]
pub(crate) fn h2f(h: v128) -> v128 {
    let high = i32x4_shl(h, 16);
    let bits = v128_and(i32x4_shr(high, 3), u32x4_splat(0x8FFF_E000));
    let special = i32x4_eq(v128_and(h, u32x4_splat(0x7C00)), u32x4_splat(0x7C00));
    v128_bitselect(
        v128_or(bits, u32x4_splat(0x7F80_0000)),
        h2f_high::<true>(high),
        special,
    )
}

/// Dot of two rows of 16-bit floats widened by `wide` (four u32 lanes of
/// raw bits to f32), in the eight lanes of the scalar kernels, with the
/// scalar kernel's `end` for a last partial chunk of eight.
#[inline(always)]
fn dot16<T: bytemuck::Pod>(
    x: &[T],
    y: &[T],
    wide: impl Fn(v128) -> v128,
    end: fn([f32; float::LANES], &[T], &[T]) -> f32,
) -> f32 {
    let n = x.len().min(y.len()) / 8 * 8;
    let (xb, yb): (&[u8], &[u8]) = (bytemuck::cast_slice(x), bytemuck::cast_slice(y));
    let (mut a0, mut a1) = (f32x4_splat(0.0), f32x4_splat(0.0));
    for i in (0..n).step_by(8) {
        let (p, q) = (ld(xb, 2 * i), ld(yb, 2 * i));
        let (pl, ql) = (
            wide(u32x4_extend_low_u16x8(p)),
            wide(u32x4_extend_low_u16x8(q)),
        );
        let (ph, qh) = (
            wide(u32x4_extend_high_u16x8(p)),
            wide(u32x4_extend_high_u16x8(q)),
        );
        a0 = f32x4_add(a0, f32x4_mul(pl, ql));
        a1 = f32x4_add(a1, f32x4_mul(ph, qh));
    }
    let m = x.len().min(y.len());
    end(lanes8(a0, a1), &x[n..m], &y[n..m])
}

/// Dot of two fp16 rows (products exact in f32, summed in eight lanes).
pub fn vec_dot_f16(x: &[f16], y: &[f16]) -> f32 {
    dot16(x, y, h2f, float::f16_dot_end)
}

/// Dot of two bf16 rows (products exact in f32, summed in eight lanes).
pub fn vec_dot_bf16(x: &[bf16], y: &[bf16]) -> f32 {
    dot16(x, y, |v| i32x4_shl(v, 16), float::bf16_dot_end)
}

// ------------------------------------------------------------ quantizers

/// Largest of four f32 lanes.
#[inline(always)]
fn hmax(v: v128) -> f32 {
    f32x4_extract_lane::<0>(v)
        .max(f32x4_extract_lane::<1>(v))
        .max(f32x4_extract_lane::<2>(v))
        .max(f32x4_extract_lane::<3>(v))
}

/// `x[at..at + 16] * s` rounded to nearest even, as 16 int8 (saturating).
#[inline(always)]
fn round16(x: &[f32], at: usize, s: v128) -> v128 {
    let q: [v128; 4] = core::array::from_fn(|i| {
        i32x4_trunc_sat_f32x4(f32x4_nearest(f32x4_mul(ldf(x, at + 4 * i), s)))
    });
    i8x16_narrow_i16x8(
        i16x8_narrow_i32x4(q[0], q[1]),
        i16x8_narrow_i32x4(q[2], q[3]),
    )
}

/// Exact sum of 16 int8 lanes.
#[inline(always)]
fn sum_i8(v: v128) -> i32 {
    hsum(i32x4_extadd_pairwise_i16x8(i16x8_extadd_pairwise_i8x16(v)))
}

/// Largest magnitude of `x` (a multiple of 16 elements long).
#[inline(always)]
fn absmax(x: &[f32]) -> f32 {
    let mut m = f32x4_splat(0.0);
    for i in (0..x.len()).step_by(4) {
        m = f32x4_max(m, f32x4_abs(ldf(x, i)));
    }
    hmax(m)
}

/// Quantizes 32 values as the scalar `quantize_32` does (scale `127 /
/// amax`, ties to even); returns `(amax / 127, sum of quants)`.
#[inline(always)]
fn quantize_32(x: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
    let amax = absmax(&x[..32]);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let s = f32x4_splat(id);
    let (q0, q1) = (round16(x, 0, s), round16(x, 16, s));
    st(qs, 0, q0);
    st(qs, 16, q1);
    (d, sum_i8(q0) + sum_i8(q1))
}

/// Quantizes activations to Q8_0. Preconditions: `x.len() == y.len() * 32`.
pub fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (x, y) in x.chunks_exact(32).zip(y.iter_mut()) {
        let (d, _) = quantize_32(x, &mut y.qs);
        y.d = f16::from_f32(d);
    }
}

/// Quantizes activations to Q8_1 (Q8_0 plus `s = d * sum(q)`).
/// Preconditions: `x.len() == y.len() * 32`.
pub fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (x, y) in x.chunks_exact(32).zip(y.iter_mut()) {
        let (d, sum) = quantize_32(x, &mut y.qs);
        y.d = f16::from_f32(d);
        y.s = f16::from_f32(d * sum as f32);
    }
}

/// Quantizes activations to Q8_K as the scalar kernel does (scale from the
/// first element of largest magnitude, ties to even, sums of 16).
/// Preconditions: `x.len() == y.len() * 256`.
pub fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    for (x, y) in x.chunks_exact(QK_K).zip(y.iter_mut()) {
        let amax = absmax(x);
        if amax == 0.0 {
            y.d = 0.0;
            y.qs = [0; QK_K];
            y.bsums = [0; QK_K / 16];
            continue;
        }
        let max = x.iter().copied().find(|v| v.abs() == amax).unwrap_or(amax);
        let iscale = -127.0 / max;
        let s = f32x4_splat(iscale);
        for j in 0..QK_K / 16 {
            // |iscale * v| <= 127: the scalar `min(127)` never bites.
            let q = round16(x, 16 * j, s);
            st(&mut y.qs, 16 * j, q);
            y.bsums[j] = sum_i8(q) as i16;
        }
        y.d = 1.0 / iscale;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn h2f_converts_every_half_as_fp16() {
        for base in (0..=u16::MAX).step_by(4) {
            let h: [u16; 4] = core::array::from_fn(|i| base + i as u16);
            // The high halves of the lanes hold garbage, which h2f ignores.
            let lanes = h.map(|x| u32::from(x) | 0xA5A5_0000);
            // SAFETY: 16 readable bytes; no alignment needed.
            let v = h2f(unsafe { v128_load(lanes.as_ptr().cast()) });
            let got = [
                f32x4_extract_lane::<0>(v),
                f32x4_extract_lane::<1>(v),
                f32x4_extract_lane::<2>(v),
                f32x4_extract_lane::<3>(v),
            ];
            for (x, g) in h.into_iter().zip(got) {
                let want = fp16(half::f16::from_bits(x));
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "{x:#06x}: {g} vs {want}"
                );
            }
        }
    }

    /// Four halves through [`h2f_high`], as f32.
    fn convert<const SUBNORMAL: bool>(h: [u16; 4]) -> [f32; 4] {
        let lanes = h.map(|x| u32::from(x) << 16);
        // SAFETY: 16 readable bytes; no alignment needed.
        let v = h2f_high::<SUBNORMAL>(unsafe { v128_load(lanes.as_ptr().cast()) });
        [
            f32x4_extract_lane::<0>(v),
            f32x4_extract_lane::<1>(v),
            f32x4_extract_lane::<2>(v),
            f32x4_extract_lane::<3>(v),
        ]
    }

    #[test]
    fn scales_convert_every_finite_half_as_fp16() {
        // With SUBNORMAL every finite half; without, the normal ones and
        // the zeros.
        for base in (0..=u16::MAX).step_by(4) {
            let h: [u16; 4] = core::array::from_fn(|i| base + i as u16);
            let (any, normal) = (convert::<true>(h), convert::<false>(h));
            for (i, x) in h.into_iter().enumerate() {
                let (exp, man) = (x & 0x7C00, x & 0x03FF);
                if exp == 0x7C00 {
                    continue;
                }
                let want = fp16(half::f16::from_bits(x)).to_bits();
                assert_eq!(
                    any[i].to_bits(),
                    want,
                    "{x:#06x}: {} (subnormal variant)",
                    any[i]
                );
                if exp != 0 || man == 0 {
                    assert_eq!(normal[i].to_bits(), want, "{x:#06x}: {}", normal[i]);
                }
            }
        }
    }
}
