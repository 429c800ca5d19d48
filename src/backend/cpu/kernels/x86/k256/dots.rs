//! Per-row dots (one weight row by one activation row) of the 256-element
//! formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) against Q8_K on AVX2,
//! and the scale and lane helpers the k-quant tiles share with them.
//! Integer parts as in `q32/dots.rs` (`maddubs` + `madd`, exact per block).

use std::arch::x86_64::*;

use super::super::q32::dots::{dot_i8, iq4_levels};
use super::super::simd::{entry, h2f, hsum, hsum4, load32};
use crate::backend::cpu::kernels::{dot, DotFn};
use crate::quant::blocks::{
    BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K,
};
use crate::quant::GgmlType;

/// The AVX2 dot of the 256-element weight type `ty`, `None` where the
/// scalar one stays.
pub(in super::super) fn vec_dot(ty: GgmlType) -> Option<DotFn> {
    use GgmlType as T;
    let f: DotFn = match ty {
        T::IQ4_XS => entry!(BlockIQ4XS, BlockQ8K, vec_dot_iq4_xs_q8_k),
        T::Q2_K => entry!(BlockQ2K, BlockQ8K, vec_dot_q2_k_q8_k),
        T::Q3_K => entry!(BlockQ3K, BlockQ8K, vec_dot_q3_k_q8_k),
        T::Q4_K => entry!(BlockQ4K, BlockQ8K, vec_dot_q4_k_q8_k),
        T::Q5_K => entry!(BlockQ5K, BlockQ8K, vec_dot_q5_k_q8_k),
        T::Q6_K => entry!(BlockQ6K, BlockQ8K, vec_dot_q6_k_q8_k),
        _ => return None,
    };
    Some(f)
}

/// Lanes of the 32-element sub-block `ib` of an IQ4_XS block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn lanes_iq4_xs(bx: &BlockIQ4XS, by: &BlockQ8K, ib: usize) -> __m256i {
    let qs: &[u8; 16] = bx.qs[16 * ib..16 * ib + 16].try_into().unwrap_or(&[0; 16]);
    dot_i8(iq4_levels(qs), load32(by.qs.as_ptr().add(32 * ib)))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_iq4_xs_q8_k(x: &[BlockIQ4XS], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let d4d8 = h2f(bx.d) * by.d;
        for half in 0..2 {
            let b = 4 * half;
            let s = hsum4(
                lanes_iq4_xs(bx, by, b),
                lanes_iq4_xs(bx, by, b + 1),
                lanes_iq4_xs(bx, by, b + 2),
                lanes_iq4_xs(bx, by, b + 3),
            );
            for (k, &sumi) in s.iter().enumerate() {
                let ib = b + k;
                let low = (bx.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
                let high = ((bx.scales_h >> (2 * ib)) & 3) as u8;
                let ls = i32::from(low | (high << 4)) - 32;
                sumf += d4d8 * ls as f32 * sumi as f32;
            }
        }
    }
    sumf
}

/// The eight 6-bit scales (bytes 0..8) and mins (bytes 8..16) of a Q4_K /
/// Q5_K block (ggml's `kmask` unpacking), unpacked in a register: with the
/// three packed words `u0, u1, u2`, the scales are `u0 & M1` and `(u2 & M2)
/// | ((u0 >> 6) & M3) << 4`, the mins `u1 & M1` and `((u2 >> 4) & M2) |
/// ((u1 >> 6) & M3) << 4` (M1 = 0x3f.., M2 = 0x0f.., M3 = 0x03..). Bytes
/// written as four words and read back as one vector wait on a failed
/// store forward; [`k4_scales_mins`] stores this register whole instead.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k4_scales_mins_v(packed: &[u8; 12]) -> __m128i {
    let hi = u32::from_le_bytes([packed[8], packed[9], packed[10], packed[11]]);
    // [u0, u1, u2, 0].
    let v = _mm_insert_epi32::<2>(_mm_loadl_epi64(packed.as_ptr().cast()), hi as i32);
    // Low parts: [u0 & M1, u2 & M2, u1 & M1, (u2 >> 4) & M2].
    let a = _mm_shuffle_epi32::<0b10_01_10_00>(v);
    let low = _mm_and_si128(
        _mm_srlv_epi32(a, _mm_set_epi32(4, 0, 0, 0)),
        _mm_set_epi32(0x0f0f_0f0f, 0x3f3f_3f3f, 0x0f0f_0f0f, 0x3f3f_3f3f),
    );
    // High parts of lanes 1 and 3: ((u0, u1) >> 6) & M3, shifted up by 4.
    let b = _mm_shuffle_epi32::<0b01_01_00_00>(v);
    let high = _mm_and_si128(
        _mm_slli_epi32::<4>(_mm_srli_epi32::<6>(b)),
        _mm_set_epi32(0x3030_3030, 0, 0x3030_3030, 0),
    );
    _mm_or_si128(low, high)
}

/// [`k4_scales_mins_v`] as bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn k4_scales_mins(packed: &[u8; 12]) -> [u8; 16] {
    let mut out = [0u8; 16];
    _mm_storeu_si128(out.as_mut_ptr().cast(), k4_scales_mins_v(packed));
    out
}

/// Eight i32 lanes summing to `sum_j bsums[j] * mins[j / 2]` of a Q4_K / Q5_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k4_min_lanes(sm: &[u8; 16], by: &BlockQ8K) -> __m256i {
    let mins = _mm_loadl_epi64(sm.as_ptr().add(8).cast());
    let pairs = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins));
    _mm256_madd_epi16(load32(by.bsums.as_ptr()), pairs)
}

/// The sum of [`k4_min_lanes`]'s lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k4_min_sum(sm: &[u8; 16], by: &BlockQ8K) -> i32 {
    hsum(k4_min_lanes(sm, by))
}

/// Eight i32 lanes summing to the exact `sum scale * q * q8` of a Q4_K (`qh = None`) or Q5_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k45_lanes(
    qs: &[u8; 128],
    qh: Option<&[u8; 32]>,
    sm: &[u8; 16],
    by: &BlockQ8K,
) -> __m256i {
    let m4 = _mm256_set1_epi8(0x0F);
    let mut acc = _mm256_setzero_si256();
    for j in 0..4 {
        let q4 = load32(qs.as_ptr().add(32 * j));
        let mut lo = _mm256_and_si256(q4, m4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(q4), m4);
        if let Some(qh) = qh {
            // Bit 2j of qh[l] is the fifth bit of element 64j + l, bit 2j + 1 of 64j + 32 + l.
            let bits = load32(qh.as_ptr());
            let fifth = |m: i8| {
                let mask = _mm256_set1_epi8(m);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(bits, mask), mask);
                _mm256_and_si256(set, _mm256_set1_epi8(0x10))
            };
            lo = _mm256_or_si256(lo, fifth((1u8 << (2 * j)) as i8));
            hi = _mm256_or_si256(hi, fifth((1u8 << (2 * j + 1)) as i8));
        }
        let q8l = load32(by.qs.as_ptr().add(64 * j));
        let q8h = load32(by.qs.as_ptr().add(64 * j + 32));
        let pl = _mm256_maddubs_epi16(lo, q8l);
        let ph = _mm256_maddubs_epi16(hi, q8h);
        let sl = _mm256_set1_epi16(i16::from(sm[2 * j]));
        let sh = _mm256_set1_epi16(i16::from(sm[2 * j + 1]));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(pl, sl));
        acc = _mm256_add_epi32(acc, _mm256_madd_epi16(ph, sh));
    }
    acc
}

/// The sum of [`k45_lanes`]'s lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k45_isum(
    qs: &[u8; 128],
    qh: Option<&[u8; 32]>,
    sm: &[u8; 16],
    by: &BlockQ8K,
) -> i32 {
    hsum(k45_lanes(qs, qh, sm, by))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q4_k_q8_k(x: &[BlockQ4K], y: &[BlockQ8K]) -> f32 {
    let (mut sumd, mut summ) = (0.0f32, 0.0f32);
    for (bx, by) in x.iter().zip(y) {
        let sm = k4_scales_mins(&bx.scales);
        sumd += h2f(bx.d) * by.d * k45_isum(&bx.qs, None, &sm, by) as f32;
        summ -= h2f(bx.dmin) * by.d * k4_min_sum(&sm, by) as f32;
    }
    sumd + summ
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q5_k_q8_k(x: &[BlockQ5K], y: &[BlockQ8K]) -> f32 {
    let (mut sumd, mut summ) = (0.0f32, 0.0f32);
    for (bx, by) in x.iter().zip(y) {
        let sm = k4_scales_mins(&bx.scales);
        sumd += h2f(bx.d) * by.d * k45_isum(&bx.qs, Some(&bx.qh), &sm, by) as f32;
        summ -= h2f(bx.dmin) * by.d * k4_min_sum(&sm, by) as f32;
    }
    sumd + summ
}

/// Eight i32 lanes summing to the exact `sum scale * (q - 32) * q8` of a Q6_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k_lanes(bx: &BlockQ6K, by: &BlockQ8K) -> __m256i {
    let m4 = _mm256_set1_epi8(0x0F);
    // The sixteen scales as i16, those of each half in both 128-bit lanes:
    // one byte shuffle per 32 values then gives a chunk's two scales.
    let sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(bx.scales.as_ptr().cast()));
    let halves = [
        _mm256_permute2x128_si256::<0x00>(sc16, sc16),
        _mm256_permute2x128_si256::<0x11>(sc16, sc16),
    ];
    let mut acc = _mm256_setzero_si256();
    for (h, &scales) in halves.iter().enumerate() {
        let ql0 = load32(bx.ql.as_ptr().add(64 * h));
        let ql1 = load32(bx.ql.as_ptr().add(64 * h + 32));
        let qh = load32(bx.qh.as_ptr().add(32 * h));
        // The four 32-element chunks of this half (values 0..64).
        let quants = [
            _mm256_or_si256(
                _mm256_and_si256(ql0, m4),
                _mm256_slli_epi16::<4>(_mm256_and_si256(qh, _mm256_set1_epi8(0x03))),
            ),
            _mm256_or_si256(
                _mm256_and_si256(ql1, m4),
                _mm256_slli_epi16::<2>(_mm256_and_si256(qh, _mm256_set1_epi8(0x0C))),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql0), m4),
                _mm256_and_si256(qh, _mm256_set1_epi8(0x30)),
            ),
            _mm256_or_si256(
                _mm256_and_si256(_mm256_srli_epi16::<4>(ql1), m4),
                _mm256_and_si256(_mm256_srli_epi16::<2>(qh), _mm256_set1_epi8(0x30)),
            ),
        ];
        for (c, &q) in quants.iter().enumerate() {
            let q8 = load32(by.qs.as_ptr().add(128 * h + 32 * c));
            // q * q8 (q < 64: pairs within i16), scaled per 16 values:
            // scale 8h + 2c in the low lane, 8h + 2c + 1 in the high one.
            let p = _mm256_maddubs_epi16(q, q8);
            let (lo, hi) = (4 * c as i8, 4 * c as i8 + 2);
            #[rustfmt::skip]
            let pick = _mm256_setr_epi8(
                lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1,
                lo, lo + 1, lo, lo + 1, lo, lo + 1, lo, lo + 1,
                hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1,
                hi, hi + 1, hi, hi + 1, hi, hi + 1, hi, hi + 1,
            );
            let sc = _mm256_shuffle_epi8(scales, pick);
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
        }
    }
    // The offset: 32 * sum scale * bsum, once per block.
    let corr = _mm256_madd_epi16(load32(by.bsums.as_ptr()), sc16);
    _mm256_sub_epi32(acc, _mm256_slli_epi32::<5>(corr))
}

/// The sum of [`q6_k_lanes`]'s lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q6_k_isum(bx: &BlockQ6K, by: &BlockQ8K) -> i32 {
    hsum(q6_k_lanes(bx, by))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q6_k_q8_k(x: &[BlockQ6K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        sumf += h2f(bx.d) * by.d * q6_k_isum(bx, by) as f32;
    }
    sumf
}

/// Eight i32 lanes summing to the exact `sum scale * q * q8` of a Q2_K block (scales in the low nibbles).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q2_k_lanes(bx: &BlockQ2K, by: &BlockQ8K) -> __m256i {
    let m3 = _mm256_set1_epi8(3);
    let mut acc = _mm256_setzero_si256();
    for h in 0..2 {
        let q2 = load32(bx.qs.as_ptr().add(32 * h));
        // Bits 2s..2s+2 of q2[l] are element 128h + 32s + l (values 0..4).
        let quants = [
            _mm256_and_si256(q2, m3),
            _mm256_and_si256(_mm256_srli_epi16::<2>(q2), m3),
            _mm256_and_si256(_mm256_srli_epi16::<4>(q2), m3),
            _mm256_and_si256(_mm256_srli_epi16::<6>(q2), m3),
        ];
        for (s, &q) in quants.iter().enumerate() {
            let q8 = load32(by.qs.as_ptr().add(128 * h + 32 * s));
            let p = _mm256_maddubs_epi16(q, q8);
            let g = 8 * h + 2 * s;
            let sc = _mm256_set_m128i(
                _mm_set1_epi16(i16::from(bx.scales[g + 1] & 0xF)),
                _mm_set1_epi16(i16::from(bx.scales[g] & 0xF)),
            );
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
        }
    }
    acc
}

/// The sum of [`q2_k_lanes`]'s lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q2_k_isum(bx: &BlockQ2K, by: &BlockQ8K) -> i32 {
    hsum(q2_k_lanes(bx, by))
}

/// Eight i32 lanes summing to the exact `sum_j min_j * bsums[j]` of a Q2_K block (mins in the high nibbles).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q2_k_min_lanes(bx: &BlockQ2K, by: &BlockQ8K) -> __m256i {
    let mins = _mm256_cvtepu8_epi16(_mm_srli_epi16::<4>(_mm_and_si128(
        _mm_loadu_si128(bx.scales.as_ptr().cast()),
        _mm_set1_epi8(0xF0u8 as i8),
    )));
    _mm256_madd_epi16(load32(by.bsums.as_ptr()), mins)
}

/// The sum of [`q2_k_min_lanes`]'s lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q2_k_min_sum(bx: &BlockQ2K, by: &BlockQ8K) -> i32 {
    hsum(q2_k_min_lanes(bx, by))
}

/// Bit-identical to the scalar kernel: both integer sums are exact and the
/// float formula is the same.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q2_k_q8_k(x: &[BlockQ2K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        let summs = q2_k_min_sum(bx, by);
        let isum = q2_k_isum(bx, by);
        let dall = by.d * h2f(bx.d);
        let dmin = by.d * h2f(bx.dmin);
        sumf += dall * isum as f32 - dmin * summs as f32;
    }
    sumf
}

/// The sixteen signed 6-bit scales of a Q3_K block (stored minus 32), as
/// bytes: the low nibbles of bytes 0..8, then their high nibbles, each with
/// two high bits from byte `8 + j % 4` (bits `2 (j / 4)..`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q3_scales(packed: &[u8; 12]) -> __m128i {
    let m4 = _mm_set1_epi8(0x0F);
    let low = _mm_loadl_epi64(packed.as_ptr().cast());
    let low = _mm_unpacklo_epi64(
        _mm_and_si128(low, m4),
        _mm_and_si128(_mm_srli_epi16::<4>(low), m4),
    );
    let hi = u32::from_le_bytes([packed[8], packed[9], packed[10], packed[11]]);
    // 32-bit lane k: the four bytes shifted by 2k; their low two bits are
    // the high bits of scales 4k..4k + 4.
    let high = _mm_srlv_epi32(_mm_set1_epi32(hi as i32), _mm_set_epi32(6, 4, 2, 0));
    let high = _mm_slli_epi16::<4>(_mm_and_si128(high, _mm_set1_epi8(3)));
    _mm_sub_epi8(_mm_or_si128(low, high), _mm_set1_epi8(32))
}

/// [`q3_scales`] as an array.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q3_scales_array(packed: &[u8; 12]) -> [i8; 16] {
    let mut out = [0i8; 16];
    _mm_storeu_si128(out.as_mut_ptr().cast(), q3_scales(packed));
    out
}

/// Eight i32 lanes summing to the exact `sum scale * q * q8` of a Q3_K block.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q3_k_lanes(bx: &BlockQ3K, by: &BlockQ8K) -> __m256i {
    let scales = q3_scales_array(&bx.scales);
    let m3 = _mm256_set1_epi8(3);
    let four = _mm256_set1_epi8(4);
    let hm = load32(bx.hmask.as_ptr());
    let mut acc = _mm256_setzero_si256();
    for h in 0..2 {
        let q3 = load32(bx.qs.as_ptr().add(32 * h));
        let low = [
            _mm256_and_si256(q3, m3),
            _mm256_and_si256(_mm256_srli_epi16::<2>(q3), m3),
            _mm256_and_si256(_mm256_srli_epi16::<4>(q3), m3),
            _mm256_and_si256(_mm256_srli_epi16::<6>(q3), m3),
        ];
        for (s, &lo) in low.iter().enumerate() {
            // Element 128h + 32s + l is low - 4 unless bit 4h + s of hmask[l] is set.
            let bit = _mm256_set1_epi8((1u8 << (4 * h + s)) as i8);
            let set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
            let minus = _mm256_andnot_si256(set, four);
            let q8 = load32(by.qs.as_ptr().add(128 * h + 32 * s));
            // (lo - minus) * q8 as two unsigned x signed products.
            let p = _mm256_sub_epi16(
                _mm256_maddubs_epi16(lo, q8),
                _mm256_maddubs_epi16(minus, q8),
            );
            let g = 8 * h + 2 * s;
            let sc = _mm256_set_m128i(
                _mm_set1_epi16(i16::from(scales[g + 1])),
                _mm_set1_epi16(i16::from(scales[g])),
            );
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, sc));
        }
    }
    acc
}

/// The sum of [`q3_k_lanes`]'s lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q3_k_isum(bx: &BlockQ3K, by: &BlockQ8K) -> i32 {
    hsum(q3_k_lanes(bx, by))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn vec_dot_q3_k_q8_k(x: &[BlockQ3K], y: &[BlockQ8K]) -> f32 {
    let mut sumf = 0.0f32;
    for (bx, by) in x.iter().zip(y) {
        sumf += h2f(bx.d) * by.d * q3_k_isum(bx, by) as f32;
    }
    sumf
}

// ---- activation quantizers -------------------------------------------------
