//! AVX-512 VNNI kernels: the AVX2 kernels with `vpdpbusd` (u8 x i8 groups
//! of four straight into i32 lanes, no i16 saturation) in place of
//! `maddubs` + `madd`, on 256-bit registers (AVX512VL). Formats not listed
//! in [`vec_dot`] keep their AVX2 kernel.

use std::arch::x86_64::*;

use super::super::simd::{blockwise, entry, h2f, load32, nibbles};
use super::dots::{int8_dots, q4_0_quants, q5_quants};
use crate::backend::cpu::kernels::{dot, DotFn};
use crate::quant::blocks::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8_0, BlockQ8_1};
use crate::quant::GgmlType;

/// The VNNI dot of weight type `ty`, `None` where the AVX2 one stays.
pub(in super::super) fn vec_dot(ty: GgmlType) -> Option<DotFn> {
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

int8_dots!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni");
