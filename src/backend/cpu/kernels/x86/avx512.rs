//! AVX-512 VNNI kernels: the AVX2 kernels with `vpdpbusd` (u8 x i8 groups
//! of four straight into i32 lanes, no i16 saturation) in place of
//! `maddubs` + `madd`, on 256-bit registers (AVX512VL). Formats not listed
//! in [`vec_dot`] keep their AVX2 kernel.

use std::arch::x86_64::*;

use super::avx2::{blockwise, entry, h2f, load32, nibbles, q4_0_quants, q5_quants};
use crate::backend::cpu::kernels::{dot, DotFn};
use crate::quant::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8_0, BlockQ8_1};
use crate::quant::GgmlType;

/// The VNNI dot of weight type `ty`, `None` where the AVX2 one stays.
pub(super) fn vec_dot(ty: GgmlType) -> Option<DotFn> {
    use GgmlType as T;
    let f: DotFn = match ty {
        T::Q4_0 => entry!(BlockQ4_0, BlockQ8_0, vec_dot_q4_0_q8_0),
        T::Q4_1 => entry!(BlockQ4_1, BlockQ8_1, vec_dot_q4_1_q8_1),
        T::Q5_0 => entry!(BlockQ5_0, BlockQ8_0, vec_dot_q5_0_q8_0),
        T::Q8_0 => entry!(BlockQ8_0, BlockQ8_0, vec_dot_q8_0_q8_0),
        _ => return None,
    };
    Some(f)
}

/// u8 x i8 products summed in groups of four into eight i32 lanes (exact).
///
/// `vpdpbusd` is written as inline assembly: its intrinsic
/// (`_mm256_dpbusd_epi32`) is younger than the crate's minimum Rust version.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
    let mut acc = _mm256_setzero_si256();
    // SAFETY: register-only instruction (no memory, no stack, no flags);
    // the caller's target features include AVX512VL + VNNI, which the EVEX
    // form on ymm registers needs.
    std::arch::asm!(
        "{{evex}} vpdpbusd {acc}, {u}, {s}",
        acc = inout(ymm_reg) acc,
        u = in(ymm_reg) u,
        s = in(ymm_reg) s,
        options(pure, nomem, nostack, preserves_flags),
    );
    acc
}

/// i8 x i8 products summed into eight i32 lanes (sign moved onto `y`).
/// Exact unless both operands hold -128 in the same byte.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
    dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn lanes_q4_0(bx: &BlockQ4_0, by: &BlockQ8_0) -> __m256i {
    dot_i8(q4_0_quants(bx), load32(by.qs.as_ptr()))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    blockwise!(x, y, lanes_q4_0, |bx, by, sumi| {
        sumf += sumi as f32 * (h2f(bx.d) * h2f(by.d));
    });
    sumf
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn lanes_q4_1(bx: &BlockQ4_1, by: &BlockQ8_1) -> __m256i {
    dot_u8_i8(nibbles(&bx.qs), load32(by.qs.as_ptr()))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    blockwise!(x, y, lanes_q4_1, |bx, by, sumi| {
        sumf += (h2f(bx.d) * h2f(by.d)) * sumi as f32 + h2f(bx.m) * h2f(by.s);
    });
    sumf
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn lanes_q5_0(bx: &BlockQ5_0, by: &BlockQ8_0) -> __m256i {
    let q = _mm256_sub_epi8(q5_quants(&bx.qs, bx.qh), _mm256_set1_epi8(16));
    dot_i8(q, load32(by.qs.as_ptr()))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    blockwise!(x, y, lanes_q5_0, |bx, by, sumi| {
        sumf += (h2f(bx.d) * h2f(by.d)) * sumi as f32;
    });
    sumf
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn lanes_q8_0(bx: &BlockQ8_0, by: &BlockQ8_0) -> __m256i {
    dot_i8(load32(bx.qs.as_ptr()), load32(by.qs.as_ptr()))
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    blockwise!(x, y, lanes_q8_0, |bx, by, sumi| {
        sumf += sumi as f32 * (h2f(bx.d) * h2f(by.d));
    });
    sumf
}
