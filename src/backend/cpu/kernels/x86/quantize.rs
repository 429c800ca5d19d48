//! The AVX2 activation quantizers (Q8_0, Q8_1, Q8_K), bit-identical to the
//! scalar ones.

use std::arch::x86_64::*;

use super::simd::hsum;
use crate::backend::cpu::kernels::{quant, QuantizeFn};
use crate::quant::blocks::{BlockQ8K, BlockQ8_0, BlockQ8_1};
use crate::quant::GgmlType;

/// The AVX2 quantizer to activation type `ty`, `None` where the scalar one stays.
pub(super) fn quantizer(ty: GgmlType) -> Option<QuantizeFn> {
    let f: QuantizeFn = match ty {
        GgmlType::Q8_0 => |x, o| {
            quant::<BlockQ8_0>(x, o, |x, y| {
                // SAFETY: handed out only by `x86::quantizer` after the
                // table detected AVX2 + FMA + F16C.
                unsafe { quantize_row_q8_0(x, y) }
            })
        },
        GgmlType::Q8_1 => |x, o| {
            quant::<BlockQ8_1>(x, o, |x, y| {
                // SAFETY: as above.
                unsafe { quantize_row_q8_1(x, y) }
            })
        },
        GgmlType::Q8_K => |x, o| {
            quant::<BlockQ8K>(x, o, |x, y| {
                // SAFETY: as above.
                unsafe { quantize_row_q8_k(x, y) }
            })
        },
        _ => return None,
    };
    Some(f)
}

/// Quantizes 32 values as the scalar `quantize_32` does (scale
/// `127 / amax`, ties to even) and returns `(amax / 127, sum of quants)`.
/// Bit-identical: the max is order-free and each element rounds alone.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_32(x: &[f32], qs: &mut [i8; 32]) -> (f32, i32) {
    let p = x.as_ptr();
    let v = [
        _mm256_loadu_ps(p),
        _mm256_loadu_ps(p.add(8)),
        _mm256_loadu_ps(p.add(16)),
        _mm256_loadu_ps(p.add(24)),
    ];
    let sign = _mm256_set1_ps(-0.0);
    let m = v.iter().fold(_mm256_setzero_ps(), |m, &v| {
        _mm256_max_ps(m, _mm256_andnot_ps(sign, v))
    });
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    let amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    let d = amax / 127.0;
    let id = _mm256_set1_ps(if amax != 0.0 { 127.0 / amax } else { 0.0 });
    let i: [__m256i; 4] = std::array::from_fn(|k| {
        let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(
            _mm256_mul_ps(v[k], id),
        );
        _mm256_cvtps_epi32(r)
    });
    // Packing interleaves 128-bit halves; the permute restores element order.
    let packed = _mm256_packs_epi16(
        _mm256_packs_epi32(i[0], i[1]),
        _mm256_packs_epi32(i[2], i[3]),
    );
    let q = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(qs.as_mut_ptr().cast(), q);
    let sum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    (d, hsum(sum))
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_row_q8_0(x: &[f32], y: &mut [BlockQ8_0]) {
    for (x, y) in x.chunks_exact(32).zip(y.iter_mut()) {
        let (d, _) = quantize_32(x, &mut y.qs);
        y.d = half::f16::from_f32(d);
    }
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_row_q8_1(x: &[f32], y: &mut [BlockQ8_1]) {
    for (x, y) in x.chunks_exact(32).zip(y.iter_mut()) {
        let (d, sum) = quantize_32(x, &mut y.qs);
        y.d = half::f16::from_f32(d);
        y.s = half::f16::from_f32(d * sum as f32);
    }
}

/// Largest of the eight f32 lanes of `m`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn hmax_ps(m: __m256) -> f32 {
    let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)))
}

/// Q8_K activations byte for byte as the scalar `quantize_row_q8_k` (ggml's
/// `quantize_row_q8_K_ref`): the first element of largest magnitude sets
/// `iscale = -127 / max`, each element rounds alone (ties to even, clamped
/// to 127), `d = 1 / iscale`, `bsums` are exact integer sums. NaN inputs
/// are skipped by the max as in the scalar scan; other non-finite inputs
/// give garbage in both.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn quantize_row_q8_k(x: &[f32], y: &mut [BlockQ8K]) {
    let sign = _mm256_set1_ps(-0.0);
    let top = _mm256_set1_epi32(127);
    for (x, y) in x.chunks_exact(256).zip(y.iter_mut()) {
        let p = x.as_ptr();
        let mut m = _mm256_setzero_ps();
        for k in 0..32 {
            // max(|v|, m) returns m where |v| is NaN, as the scalar `>` skips NaN.
            let a = _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * k)));
            m = _mm256_max_ps(a, m);
        }
        let amax = hmax_ps(m);
        if amax == 0.0 {
            y.d = 0.0;
            y.qs = [0; 256];
            y.bsums = [0; 16];
            continue;
        }
        // The sign comes from the first element of magnitude `amax`.
        let am = _mm256_set1_ps(amax);
        let mut max = amax;
        for k in 0..32 {
            let a = _mm256_andnot_ps(sign, _mm256_loadu_ps(p.add(8 * k)));
            let eq = _mm256_movemask_ps(_mm256_cmp_ps::<_CMP_EQ_OQ>(a, am));
            if eq != 0 {
                max = x[8 * k + eq.trailing_zeros() as usize];
                break;
            }
        }
        let iscale = -127.0 / max;
        let is = _mm256_set1_ps(iscale);
        for g in 0..8 {
            let i: [__m256i; 4] = std::array::from_fn(|k| {
                let v = _mm256_mul_ps(_mm256_loadu_ps(p.add(32 * g + 8 * k)), is);
                let r = _mm256_round_ps::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(v);
                _mm256_min_epi32(_mm256_cvtps_epi32(r), top)
            });
            // Packing interleaves 128-bit halves; the permute restores order.
            let packed = _mm256_packs_epi16(
                _mm256_packs_epi32(i[0], i[1]),
                _mm256_packs_epi32(i[2], i[3]),
            );
            let q = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256(y.qs.as_mut_ptr().add(32 * g).cast(), q);
            // Each 16-element group's sum fits i16 (|q| <= 127).
            y.bsums[2 * g] = hsum(_mm256_add_epi32(i[0], i[1])) as i16;
            y.bsums[2 * g + 1] = hsum(_mm256_add_epi32(i[2], i[3])) as i16;
        }
        y.d = 1.0 / iscale;
    }
}
