//! Per-row dots (one weight row by one activation row) of the 32-element
//! formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) on AVX2: ggml's x86
//! scheme of `maddubs` (u8 x i8 pairs to i16) and `madd` (i16 pairs to
//! i32), 32 quants per register. The VNNI versions of the int8 dots are in
//! `dots_vnni.rs`, from the same source ([`int8_dots`]).

use std::arch::x86_64::*;

use super::super::simd::{blockwise, bytes_from_bits, dot_u8_i8, entry, h2f, load32, nibbles};
use crate::backend::cpu::kernels::{dot, DotFn};
use crate::quant::blocks::{
    BlockIQ4NL, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, KVALUES_IQ4NL,
};
use crate::quant::GgmlType;

/// The AVX2 dot of the 32-element weight type `ty`, `None` where the
/// scalar one stays.
pub(in super::super) fn vec_dot(ty: GgmlType) -> Option<DotFn> {
    use GgmlType as T;
    let f: DotFn = match ty {
        T::Q4_0 => entry!(BlockQ4_0, BlockQ8_0, vec_dot_q4_0_q8_0),
        T::Q4_1 => entry!(BlockQ4_1, BlockQ8_1, vec_dot_q4_1_q8_1),
        T::Q5_0 => entry!(BlockQ5_0, BlockQ8_0, vec_dot_q5_0_q8_0),
        T::Q5_1 => entry!(BlockQ5_1, BlockQ8_1, vec_dot_q5_1_q8_1),
        T::Q8_0 => entry!(BlockQ8_0, BlockQ8_0, vec_dot_q8_0_q8_0),
        T::IQ4_NL => entry!(BlockIQ4NL, BlockQ8_0, vec_dot_iq4_nl_q8_0),
        _ => return None,
    };
    Some(f)
}

/// The int8 dot primitive `dot_i8` and the dots of the 32-element formats
/// whose integer part is one u8 x i8 / i8 x i8 product (Q4_0, Q4_1, Q5_0,
/// Q8_0), compiled for `$features` over the `dot_u8_i8` in scope: AVX2's
/// `maddubs` + `madd` here, `vpdpbusd` in the AVX-512 VNNI file. One source,
/// two instruction sets.
macro_rules! int8_dots {
    ($features:literal) => {
        /// i8 x i8 products summed into eight i32 lanes (sign moved onto `y`).
        /// Exact unless both operands hold -128 in the same byte.
        #[inline]
        #[target_feature(enable = $features)]
        pub(in super::super) unsafe fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
            dot_u8_i8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn lanes_q4_0(bx: &BlockQ4_0, by: &BlockQ8_0) -> __m256i {
            dot_i8(q4_0_quants(bx), load32(by.qs.as_ptr()))
        }

        #[target_feature(enable = $features)]
        unsafe fn vec_dot_q4_0_q8_0(x: &[BlockQ4_0], y: &[BlockQ8_0]) -> f32 {
            let mut sumf = 0.0f32;
            blockwise!(x, y, lanes_q4_0, |bx, by, sumi| {
                sumf += sumi as f32 * (h2f(bx.d) * h2f(by.d));
            });
            sumf
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn lanes_q4_1(bx: &BlockQ4_1, by: &BlockQ8_1) -> __m256i {
            dot_u8_i8(nibbles(&bx.qs), load32(by.qs.as_ptr()))
        }

        #[target_feature(enable = $features)]
        unsafe fn vec_dot_q4_1_q8_1(x: &[BlockQ4_1], y: &[BlockQ8_1]) -> f32 {
            let mut sumf = 0.0f32;
            blockwise!(x, y, lanes_q4_1, |bx, by, sumi| {
                sumf += (h2f(bx.d) * h2f(by.d)) * sumi as f32 + h2f(bx.m) * h2f(by.s);
            });
            sumf
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn lanes_q5_0(bx: &BlockQ5_0, by: &BlockQ8_0) -> __m256i {
            let q = _mm256_sub_epi8(q5_quants(&bx.qs, bx.qh), _mm256_set1_epi8(16));
            dot_i8(q, load32(by.qs.as_ptr()))
        }

        #[target_feature(enable = $features)]
        unsafe fn vec_dot_q5_0_q8_0(x: &[BlockQ5_0], y: &[BlockQ8_0]) -> f32 {
            let mut sumf = 0.0f32;
            blockwise!(x, y, lanes_q5_0, |bx, by, sumi| {
                sumf += (h2f(bx.d) * h2f(by.d)) * sumi as f32;
            });
            sumf
        }

        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn lanes_q8_0(bx: &BlockQ8_0, by: &BlockQ8_0) -> __m256i {
            dot_i8(load32(bx.qs.as_ptr()), load32(by.qs.as_ptr()))
        }

        #[target_feature(enable = $features)]
        unsafe fn vec_dot_q8_0_q8_0(x: &[BlockQ8_0], y: &[BlockQ8_0]) -> f32 {
            let mut sumf = 0.0f32;
            blockwise!(x, y, lanes_q8_0, |bx, by, sumi| {
                sumf += sumi as f32 * (h2f(bx.d) * h2f(by.d));
            });
            sumf
        }
    };
}
pub(super) use int8_dots;

int8_dots!("avx2,fma,f16c");

/// Q4_0 quants (-8..8) of a block as 32 signed bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4_0_quants(b: &BlockQ4_0) -> __m256i {
    _mm256_sub_epi8(nibbles(&b.qs), _mm256_set1_epi8(8))
}

/// Q5 quants (0..32) of a block as 32 unsigned bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn q5_quants(qs: &[u8; 16], qh: [u8; 4]) -> __m256i {
    let high = _mm256_and_si256(
        bytes_from_bits(u32::from_le_bytes(qh)),
        _mm256_set1_epi8(0x10),
    );
    _mm256_or_si256(nibbles(qs), high)
}

/// IQ4_NL levels of 16 packed bytes, in element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn iq4_levels(qs: &[u8; 16]) -> __m256i {
    let table = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
    _mm256_shuffle_epi8(_mm256_set_m128i(table, table), nibbles(qs))
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes_q5_1(bx: &BlockQ5_1, by: &BlockQ8_1) -> __m256i {
    dot_u8_i8(q5_quants(&bx.qs, bx.qh), load32(by.qs.as_ptr()))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q5_1_q8_1(x: &[BlockQ5_1], y: &[BlockQ8_1]) -> f32 {
    let mut sumf = 0.0f32;
    blockwise!(x, y, lanes_q5_1, |bx, by, sumi| {
        sumf += (h2f(bx.d) * h2f(by.d)) * sumi as f32 + h2f(bx.m) * h2f(by.s);
    });
    sumf
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes_iq4_nl(bx: &BlockIQ4NL, by: &BlockQ8_0) -> __m256i {
    dot_i8(iq4_levels(&bx.qs), load32(by.qs.as_ptr()))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_iq4_nl_q8_0(x: &[BlockIQ4NL], y: &[BlockQ8_0]) -> f32 {
    let mut sumf = 0.0f32;
    blockwise!(x, y, lanes_iq4_nl, |bx, by, sumi| {
        sumf += (h2f(bx.d) * h2f(by.d)) * sumi as f32;
    });
    sumf
}

// ---- 256-element formats -----------------------------------------------------
