//! NEON kernels over an int8 dot primitive: `smull` + `sadalp` (every
//! aarch64 CPU) or `sdot` (the dotprod extension), one source for both.
//!
//! The weights are decoded in registers to signed int8 (offsets subtracted
//! there), so both primitives see the same operands and give the same exact
//! sums.

use std::arch::aarch64::*;
use std::arch::asm;

use half::{bf16, f16};

use crate::backend::cpu::kernels::kquants::scale_min_k4;
use crate::backend::cpu::kernels::{dot, float, fp16, quant, DotFn, QuantizeFn};
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
                _ => return float_dot(ty),
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

// ------------------------------------------------------------ float dots

/// Four fp16 (the low 16 bits of each u32 lane) to f32, exactly as
/// [`fp16`]: the half moved to bits 13..28 with its sign at 31 is an f32
/// that times 2^112 is the half's value for every finite input
/// (subnormals too: aarch64 does not flush them by default); infinities
/// and NaNs keep their bits with the exponent all ones.
#[inline]
#[target_feature(enable = "neon")]
unsafe fn h2f4(h: uint32x4_t) -> float32x4_t {
    let sh = vreinterpretq_u32_s32(vshrq_n_s32::<3>(vreinterpretq_s32_u32(vshlq_n_u32::<16>(
        h,
    ))));
    let bits = vandq_u32(sh, vdupq_n_u32(0x8FFF_E000));
    let scaled = vmulq_f32(
        vreinterpretq_f32_u32(bits),
        vdupq_n_f32(f32::from_bits((127 + 112) << 23)),
    );
    let special = vceqq_u32(vandq_u32(h, vdupq_n_u32(0x7C00)), vdupq_n_u32(0x7C00));
    let inf_nan = vreinterpretq_f32_u32(vorrq_u32(bits, vdupq_n_u32(0x7F80_0000)));
    vbslq_f32(special, inf_nan, scaled)
}

/// The eight lanes of `lo` (0..4) and `hi` (4..8).
#[inline]
#[target_feature(enable = "neon")]
unsafe fn lanes8(lo: float32x4_t, hi: float32x4_t) -> [f32; float::LANES] {
    let mut l = [0.0f32; float::LANES];
    vst1q_f32(l.as_mut_ptr(), lo);
    vst1q_f32(l.as_mut_ptr().add(4), hi);
    l
}

/// Dot of two f32 rows in the scalar kernel's eight lanes and rounding
/// (multiply, then add: an FMA would round differently).
#[target_feature(enable = "neon")]
unsafe fn vec_dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let n = x.len().min(y.len());
    let full = n / float::LANES * float::LANES;
    let (mut a0, mut a1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    for i in (0..full).step_by(float::LANES) {
        let (p, q) = (x.as_ptr().add(i), y.as_ptr().add(i));
        a0 = vaddq_f32(a0, vmulq_f32(vld1q_f32(p), vld1q_f32(q)));
        a1 = vaddq_f32(a1, vmulq_f32(vld1q_f32(p.add(4)), vld1q_f32(q.add(4))));
    }
    float::f32_dot_end(lanes8(a0, a1), &x[full..n], &y[full..n])
}

/// Dot of two fp16 rows as [`float::vec_dot_f16`]: the products are exact,
/// so the FMA rounds as the scalar multiply-then-add.
#[target_feature(enable = "neon")]
unsafe fn vec_dot_f16(x: &[f16], y: &[f16]) -> f32 {
    let n = x.len().min(y.len());
    let full = n / float::LANES * float::LANES;
    let (mut a0, mut a1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    for i in (0..full).step_by(float::LANES) {
        let p = vld1q_u16(x.as_ptr().add(i).cast());
        let q = vld1q_u16(y.as_ptr().add(i).cast());
        let (pl, ql) = (
            h2f4(vmovl_u16(vget_low_u16(p))),
            h2f4(vmovl_u16(vget_low_u16(q))),
        );
        let (ph, qh) = (h2f4(vmovl_high_u16(p)), h2f4(vmovl_high_u16(q)));
        a0 = vfmaq_f32(a0, pl, ql);
        a1 = vfmaq_f32(a1, ph, qh);
    }
    float::f16_dot_end(lanes8(a0, a1), &x[full..n], &y[full..n])
}

/// Dot of two bf16 rows as [`float::vec_dot_bf16`] (multiply, then add:
/// bf16 products can round below f32's normal range).
#[target_feature(enable = "neon")]
unsafe fn vec_dot_bf16(x: &[bf16], y: &[bf16]) -> f32 {
    let n = x.len().min(y.len());
    let full = n / float::LANES * float::LANES;
    let (mut a0, mut a1) = (vdupq_n_f32(0.0), vdupq_n_f32(0.0));
    let wide = |v: uint16x4_t| vreinterpretq_f32_u32(vshll_n_u16::<16>(v));
    for i in (0..full).step_by(float::LANES) {
        let p = vld1q_u16(x.as_ptr().add(i).cast());
        let q = vld1q_u16(y.as_ptr().add(i).cast());
        let (pl, ql) = (wide(vget_low_u16(p)), wide(vget_low_u16(q)));
        let (ph, qh) = (wide(vget_high_u16(p)), wide(vget_high_u16(q)));
        a0 = vaddq_f32(a0, vmulq_f32(pl, ql));
        a1 = vaddq_f32(a1, vmulq_f32(ph, qh));
    }
    float::bf16_dot_end(lanes8(a0, a1), &x[full..n], &y[full..n])
}

/// The float dots (plain NEON, no dotprod), `None` for other types.
fn float_dot(ty: GgmlType) -> Option<DotFn> {
    let f: DotFn = match ty {
        GgmlType::F32 => entry!(f32, f32, vec_dot_f32),
        GgmlType::F16 => entry!(f16, f16, vec_dot_f16),
        GgmlType::BF16 => entry!(bf16, bf16, vec_dot_bf16),
        _ => return None,
    };
    Some(f)
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
