//! NEON kernels over an int8 dot primitive: `smull` + `sadalp` (every
//! aarch64 CPU) or `sdot` (the dotprod extension), one source for both.
//!
//! The weights are decoded in registers to signed int8 (offsets subtracted
//! there), so both primitives see the same operands and give the same exact
//! sums.

use std::arch::aarch64::*;
use std::arch::asm;

use half::f16;

use crate::backend::cpu::kernels::kquants::scale_min_k4;
use crate::backend::cpu::kernels::{dot, fp16, quant, DotFn, QuantizeFn};
use crate::quant::blocks::{
    BlockIQ4NL, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K,
    BlockQ8_0, BlockQ8_1, KVALUES_IQ4NL, QK_K,
};
use crate::quant::GgmlType;

pub(super) use plain::vec_dot as vec_dot_plain;
pub(super) use sdot::vec_dot as vec_dot_sdot;

/// `acc` + four i32 lanes whose sum is `sum(a[i] * b[i])` over 16 int8
/// pairs, by widening multiplies (products fit i16: |a * b| <= 2^14).
#[inline(always)]
unsafe fn idot_plain(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let lo = vmull_s8(vget_low_s8(a), vget_low_s8(b));
    let hi = vmull_high_s8(a, b);
    vpadalq_s16(vpadalq_s16(acc, lo), hi)
}

/// [`idot_plain`] by `sdot` (groups of four products straight into i32).
///
/// Written as inline assembly so that it does not depend on the stability
/// of the `vdotq_s32` intrinsic. Callers must run on a CPU with dotprod.
#[inline]
#[target_feature(enable = "neon,dotprod")]
unsafe fn idot_sdot(acc: int32x4_t, a: int8x16_t, b: int8x16_t) -> int32x4_t {
    let mut acc = acc;
    // SAFETY: register-only instruction (no memory, stack or flags); the
    // function's target features include dotprod, which `sdot` needs.
    asm!(
        "sdot {acc:v}.4s, {a:v}.16b, {b:v}.16b",
        acc = inout(vreg) acc,
        a = in(vreg) a,
        b = in(vreg) b,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

/// The fifth bits of a Q5 block as bytes `0x10` / `0`: elements 0..16, 16..32.
#[inline(always)]
unsafe fn q5_high(qh: [u8; 4]) -> (uint8x16_t, uint8x16_t) {
    const LO: [u8; 16] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1];
    const HI: [u8; 16] = [2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3];
    const BITS: [u8; 16] = [1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128];
    let h = vreinterpretq_u8_u32(vdupq_n_u32(u32::from_le_bytes(qh)));
    let bits = vld1q_u8(BITS.as_ptr());
    let m = vdupq_n_u8(0x10);
    let lo = vqtbl1q_u8(h, vld1q_u8(LO.as_ptr()));
    let hi = vqtbl1q_u8(h, vld1q_u8(HI.as_ptr()));
    (
        vandq_u8(vtstq_u8(lo, bits), m),
        vandq_u8(vtstq_u8(hi, bits), m),
    )
}

/// A table entry for kernel `$f` over weight blocks `$w` and activation
/// blocks `$a`.
macro_rules! entry {
    ($w:ty, $a:ty, $f:ident) => {
        |w: &[u8], a: &[u8]| {
            dot::<$w, $a>(w, a, |x, y| {
                // SAFETY: entries are handed out only by `arm::vec_dot`,
                // which the kernel table calls only for a detected NEON, and
                // which picks the `sdot` kernels only after detecting dotprod.
                unsafe { $f(x, y) }
            })
        }
    };
}

/// The kernels, compiled for target features `$feat` over the int8 dot
/// `$idot`, and their table entries (`vec_dot`).
macro_rules! neon_kernels {
    ($feat:literal, $idot:path) => {
        use super::*;

        /// The dot of weight type `ty`, `None` where the scalar one stays.
        pub(crate) fn vec_dot(ty: GgmlType) -> Option<DotFn> {
            use GgmlType as T;
            let f: DotFn = match ty {
                T::Q4_0 => entry!(BlockQ4_0, BlockQ8_0, vec_dot_q4_0_q8_0),
                T::Q4_1 => entry!(BlockQ4_1, BlockQ8_1, vec_dot_q4_1_q8_1),
                T::Q5_0 => entry!(BlockQ5_0, BlockQ8_0, vec_dot_q5_0_q8_0),
                T::Q5_1 => entry!(BlockQ5_1, BlockQ8_1, vec_dot_q5_1_q8_1),
                T::Q8_0 => entry!(BlockQ8_0, BlockQ8_0, vec_dot_q8_0_q8_0),
                T::IQ4_NL => entry!(BlockIQ4NL, BlockQ8_0, vec_dot_iq4_nl_q8_0),
                T::Q4_K => entry!(BlockQ4K, BlockQ8K, vec_dot_q4_k_q8_k),
                T::Q6_K => entry!(BlockQ6K, BlockQ8K, vec_dot_q6_k_q8_k),
                _ => return None,
            };
            Some(f)
        }

        /// Exact dot of the 32 int8 weights `w0`, `w1` with a block's quants.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn idot32(w0: int8x16_t, w1: int8x16_t, a: &[i8; 32]) -> i32 {
            let (a0, a1) = (vld1q_s8(a.as_ptr()), vld1q_s8(a.as_ptr().add(16)));
            vaddvq_s32($idot($idot(vdupq_n_s32(0), w0, a0), w1, a1))
        }

        /// The 32 nibbles of 16 packed bytes, as unsigned bytes.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn nibbles(qs: &[u8; 16]) -> (uint8x16_t, uint8x16_t) {
            let q = vld1q_u8(qs.as_ptr());
            (vandq_u8(q, vdupq_n_u8(0x0F)), vshrq_n_u8::<4>(q))
        }

        /// `v - off` as signed bytes.
        #[inline]
        #[target_feature(enable = $feat)]
        unsafe fn minus(v: uint8x16_t, off: i8) -> int8x16_t {
            vsubq_s8(vreinterpretq_s8_u8(v), vdupq_n_s8(off))
        }

        /// Dot of a Q4_0 row with a Q8_0 row of the same length.
        #[target_feature(enable = $feat)]
        unsafe fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y) {
                let (lo, hi) = nibbles(&bx.qs);
                let sumi = idot32(minus(lo, 8), minus(hi, 8), &by.qs);
                sumf += sumi as f32 * (fp16(bx.d) * fp16(by.d));
            }
            sumf
        }

        /// Dot of a Q4_1 row with a Q8_1 row of the same length.
        #[target_feature(enable = $feat)]
        unsafe fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y) {
                let (lo, hi) = nibbles(&bx.qs);
                let sumi = idot32(minus(lo, 0), minus(hi, 0), &by.qs);
                sumf += (fp16(bx.d) * fp16(by.d)) * sumi as f32 + fp16(bx.m) * fp16(by.s);
            }
            sumf
        }

        /// Dot of a Q5_0 row with a Q8_0 row of the same length.
        #[target_feature(enable = $feat)]
        unsafe fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y) {
                let (lo, hi) = nibbles(&bx.qs);
                let (h0, h1) = q5_high(bx.qh);
                let w0 = minus(vorrq_u8(lo, h0), 16);
                let w1 = minus(vorrq_u8(hi, h1), 16);
                sumf += (fp16(bx.d) * fp16(by.d)) * idot32(w0, w1, &by.qs) as f32;
            }
            sumf
        }

        /// Dot of a Q5_1 row with a Q8_1 row of the same length.
        #[target_feature(enable = $feat)]
        unsafe fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y) {
                let (lo, hi) = nibbles(&bx.qs);
                let (h0, h1) = q5_high(bx.qh);
                let w0 = minus(vorrq_u8(lo, h0), 0);
                let w1 = minus(vorrq_u8(hi, h1), 0);
                let sumi = idot32(w0, w1, &by.qs);
                sumf += (fp16(bx.d) * fp16(by.d)) * sumi as f32 + fp16(bx.m) * fp16(by.s);
            }
            sumf
        }

        /// Dot of a Q8_0 row with a Q8_0 row of the same length.
        #[target_feature(enable = $feat)]
        unsafe fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y) {
                let w0 = vld1q_s8(bx.qs.as_ptr());
                let w1 = vld1q_s8(bx.qs.as_ptr().add(16));
                sumf += idot32(w0, w1, &by.qs) as f32 * (fp16(bx.d) * fp16(by.d));
            }
            sumf
        }

        /// Dot of an IQ4_NL row with a Q8_0 row of the same length.
        #[target_feature(enable = $feat)]
        unsafe fn vec_dot_iq4_nl_q8_0(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
            let kv = vld1q_s8(KVALUES_IQ4NL.as_ptr());
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y) {
                let (lo, hi) = nibbles(&bx.qs);
                let (w0, w1) = (vqtbl1q_s8(kv, lo), vqtbl1q_s8(kv, hi));
                sumf += (fp16(bx.d) * fp16(by.d)) * idot32(w0, w1, &by.qs) as f32;
            }
            sumf
        }

        /// Dot of a Q4_K row with a Q8_K row of the same length.
        #[target_feature(enable = $feat)]
        unsafe fn vec_dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
            let m4 = vdupq_n_u8(0x0F);
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y) {
                let mut acc = vdupq_n_s32(0);
                let z = vdupq_n_s32(0);
                for c in 0..4 {
                    let q0 = vld1q_u8(bx.qs.as_ptr().add(32 * c));
                    let q1 = vld1q_u8(bx.qs.as_ptr().add(32 * c + 16));
                    let a = by.qs.as_ptr().add(64 * c);
                    let s8 = vreinterpretq_s8_u8;
                    let lo = $idot(z, s8(vandq_u8(q0, m4)), vld1q_s8(a));
                    let lo = $idot(lo, s8(vandq_u8(q1, m4)), vld1q_s8(a.add(16)));
                    let hi = $idot(z, s8(vshrq_n_u8::<4>(q0)), vld1q_s8(a.add(32)));
                    let hi = $idot(hi, s8(vshrq_n_u8::<4>(q1)), vld1q_s8(a.add(48)));
                    let s0 = scale_min_k4(2 * c, &bx.scales).0;
                    let s1 = scale_min_k4(2 * c + 1, &bx.scales).0;
                    acc = vmlaq_n_s32(acc, lo, i32::from(s0));
                    acc = vmlaq_n_s32(acc, hi, i32::from(s1));
                }
                let isum = vaddvq_s32(acc);
                let mins: i32 = (0..16)
                    .map(|j| i32::from(by.bsums[j]) * i32::from(scale_min_k4(j / 2, &bx.scales).1))
                    .sum();
                sumf += fp16(bx.d) * by.d * isum as f32 - fp16(bx.dmin) * by.d * mins as f32;
            }
            sumf
        }

        /// Dot of a Q6_K row with a Q8_K row of the same length.
        #[target_feature(enable = $feat)]
        unsafe fn vec_dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
            let (m4, m3) = (vdupq_n_u8(0x0F), vdupq_n_u8(3));
            let mut sumf = 0.0f32;
            for (bx, by) in x.iter().zip(y) {
                let mut acc = vdupq_n_s32(0);
                for half in 0..2 {
                    let qlp = bx.ql.as_ptr().add(64 * half);
                    let ql = [
                        vld1q_u8(qlp),
                        vld1q_u8(qlp.add(16)),
                        vld1q_u8(qlp.add(32)),
                        vld1q_u8(qlp.add(48)),
                    ];
                    let qhp = bx.qh.as_ptr().add(32 * half);
                    let qh = [vld1q_u8(qhp), vld1q_u8(qhp.add(16))];
                    for g in 0..8 {
                        // Group g of the half: elements 32 k + 16 p, from
                        // ql[2 (k % 2) + p] (low nibbles for k < 2), qh bits 2k.
                        let (k, p) = (g / 2, g % 2);
                        let l = ql[(k % 2) * 2 + p];
                        let low = if k < 2 {
                            vandq_u8(l, m4)
                        } else {
                            vshrq_n_u8::<4>(l)
                        };
                        let sh = vdupq_n_s8(-(2 * k as i8));
                        let high = vandq_u8(vshlq_u8(qh[p], sh), m3);
                        let w = minus(vorrq_u8(low, vshlq_n_u8::<4>(high)), 32);
                        let j = 8 * half + g;
                        let a = vld1q_s8(by.qs.as_ptr().add(16 * j));
                        let d = $idot(vdupq_n_s32(0), w, a);
                        acc = vmlaq_n_s32(acc, d, i32::from(bx.scales[j]));
                    }
                }
                sumf += fp16(bx.d) * by.d * vaddvq_s32(acc) as f32;
            }
            sumf
        }
    };
}

mod plain {
    neon_kernels!("neon", idot_plain);
}

mod sdot {
    neon_kernels!("neon,dotprod", idot_sdot);
}

/// The NEON activation quantizer to `ty`, `None` where the scalar one stays.
pub(super) fn quantizer(ty: GgmlType) -> Option<QuantizeFn> {
    // SAFETY (all three): handed out only by `arm::quantizer` after the
    // table detected NEON.
    let f: QuantizeFn = match ty {
        GgmlType::Q8_0 => {
            |x, o| quant::<BlockQ8_0>(x, o, |x, y| unsafe { quantize_row_q8_0(x, y) })
        }
        GgmlType::Q8_1 => {
            |x, o| quant::<BlockQ8_1>(x, o, |x, y| unsafe { quantize_row_q8_1(x, y) })
        }
        GgmlType::Q8_K => |x, o| quant::<BlockQ8K>(x, o, |x, y| unsafe { quantize_row_q8_k(x, y) }),
        _ => return None,
    };
    Some(f)
}

/// `x[0..16] * s` rounded to nearest even, as 16 saturated int8.
/// Precondition: `x` holds at least 16 values.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn round16(x: *const f32, s: f32) -> int8x16_t {
    let q = |i: usize| vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x.add(4 * i)), s));
    let lo = vcombine_s16(vqmovn_s32(q(0)), vqmovn_s32(q(1)));
    let hi = vcombine_s16(vqmovn_s32(q(2)), vqmovn_s32(q(3)));
    vcombine_s8(vqmovn_s16(lo), vqmovn_s16(hi))
}

/// Largest magnitude of `x` (a multiple of 4 values long).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn absmax(x: &[f32]) -> f32 {
    // maxNum, not max: a NaN is skipped as the scalar `f32::max` skips it
    // (`fmax` would carry it into the scale).
    let mut m = vdupq_n_f32(0.0);
    for c in x.chunks_exact(4) {
        m = vmaxnmq_f32(m, vabsq_f32(vld1q_f32(c.as_ptr())));
    }
    vmaxnmvq_f32(m)
}

/// Quantizes 32 values as the scalar `quantize_32` does (scale `127 /
/// amax`, ties to even); returns `(amax / 127, sum of quants)`.
/// Precondition: `x.len() == 32`.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn quantize_32(x: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
    let amax = absmax(x);
    let d = amax / 127.0;
    let id = if amax != 0.0 { 127.0 / amax } else { 0.0 };
    let (q0, q1) = (round16(x.as_ptr(), id), round16(x.as_ptr().add(16), id));
    vst1q_s8(qs.as_mut_ptr(), q0);
    vst1q_s8(qs.as_mut_ptr().add(16), q1);
    (d, i32::from(vaddlvq_s8(q0)) + i32::from(vaddlvq_s8(q1)))
}

/// Quantizes activations to Q8_0. Preconditions: `x.len() == y.len() * 32`.
#[target_feature(enable = "neon")]
unsafe fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (x, y) in x.chunks_exact(32).zip(y.iter_mut()) {
        let (d, _) = quantize_32(x, &mut y.qs);
        y.d = f16::from_f32(d);
    }
}

/// Quantizes activations to Q8_1 (Q8_0 plus `s = d * sum(q)`).
/// Preconditions: `x.len() == y.len() * 32`.
#[target_feature(enable = "neon")]
unsafe fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (x, y) in x.chunks_exact(32).zip(y.iter_mut()) {
        let (d, sum) = quantize_32(x, &mut y.qs);
        y.d = f16::from_f32(d);
        y.s = f16::from_f32(d * sum as f32);
    }
}

/// Quantizes activations to Q8_K as the scalar kernel does (scale from the
/// first element of largest magnitude, ties to even, sums of 16).
/// Preconditions: `x.len() == y.len() * 256`.
#[target_feature(enable = "neon")]
unsafe fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
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
        for j in 0..QK_K / 16 {
            // |iscale * v| <= 127: the scalar `min(127)` never bites.
            let q = round16(x.as_ptr().add(16 * j), iscale);
            vst1q_s8(y.qs.as_mut_ptr().add(16 * j), q);
            y.bsums[j] = vaddlvq_s8(q);
        }
        y.d = 1.0 / iscale;
    }
}
