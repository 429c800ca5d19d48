//! AVX2 kernels (with FMA and F16C): ggml's x86 scheme of `maddubs` (u8 x
//! i8 pairs to i16) and `madd` (i16 pairs to i32), 32 quants per register.
//!
//! Every block's integer sum is exact; four blocks' lanes are reduced
//! together ([`hsum4`]) and then scaled in the scalar kernel's float order.

use std::arch::x86_64::*;

use crate::backend::cpu::kernels::{dot, quant, DotFn, QuantizeFn};
use crate::quant::blocks::{
    BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K,
    BlockQ5_0, BlockQ5_1, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1, KVALUES_IQ4NL,
};
use crate::quant::GgmlType;

/// A table entry for kernel `$f` over weight blocks `$w` and activation
/// blocks `$a`.
macro_rules! entry {
    ($w:ty, $a:ty, $f:ident) => {
        |w: &[u8], a: &[u8]| {
            dot::<$w, $a>(w, a, |x, y| {
                // SAFETY: entries are handed out only by `x86::vec_dot`,
                // which the kernel table calls only after detecting the
                // features `$f` is compiled for.
                unsafe { $f(x, y) }
            })
        }
    };
}
pub(super) use entry;

/// Runs `$lanes(bx, by) -> __m256i` (eight i32 lanes whose sum is the
/// block's integer dot) over the blocks of `$x` and `$y`, and `$body` with
/// each block and its exact sum, in block order.
macro_rules! blockwise {
    ($x:expr, $y:expr, $lanes:ident, |$bx:ident, $by:ident, $sumi:ident| $body:block) => {{
        let n = $x.len().min($y.len());
        let (x, y) = (&$x[..n], &$y[..n]);
        let (x4, y4) = (x.chunks_exact(4), y.chunks_exact(4));
        let (xr, yr) = (x4.remainder(), y4.remainder());
        for (bx4, by4) in x4.zip(y4) {
            let s = $crate::backend::cpu::kernels::x86::avx2::hsum4(
                $lanes(&bx4[0], &by4[0]),
                $lanes(&bx4[1], &by4[1]),
                $lanes(&bx4[2], &by4[2]),
                $lanes(&bx4[3], &by4[3]),
            );
            for k in 0..4 {
                let ($bx, $by, $sumi) = (&bx4[k], &by4[k], s[k]);
                $body
            }
        }
        for ($bx, $by) in xr.iter().zip(yr) {
            let $sumi = $crate::backend::cpu::kernels::x86::avx2::hsum($lanes($bx, $by));
            $body
        }
    }};
}
pub(super) use blockwise;

/// The AVX2 dot of weight type `ty`, `None` where the scalar one stays.
pub(super) fn vec_dot(ty: GgmlType) -> Option<DotFn> {
    use GgmlType as T;
    let f: DotFn = match ty {
        T::Q4_0 => entry!(BlockQ4_0, BlockQ8_0, vec_dot_q4_0_q8_0),
        T::Q4_1 => entry!(BlockQ4_1, BlockQ8_1, vec_dot_q4_1_q8_1),
        T::Q5_0 => entry!(BlockQ5_0, BlockQ8_0, vec_dot_q5_0_q8_0),
        T::Q5_1 => entry!(BlockQ5_1, BlockQ8_1, vec_dot_q5_1_q8_1),
        T::Q8_0 => entry!(BlockQ8_0, BlockQ8_0, vec_dot_q8_0_q8_0),
        T::IQ4_NL => entry!(BlockIQ4NL, BlockQ8_0, vec_dot_iq4_nl_q8_0),
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

// ---- helpers ---------------------------------------------------------------

/// fp16 to f32 with F16C (exact, as the scalar `fp16`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn h2f(h: half::f16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h.to_bits()))))
}

/// 32 bytes from `p` (unaligned). Precondition: 32 readable bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load32<T>(p: *const T) -> __m256i {
    _mm256_loadu_si256(p.cast())
}

/// Sum of the eight i32 lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01>(s));
    _mm_cvtsi128_si32(s)
}

/// The lane sums of four vectors at once: `[hsum(a), hsum(b), hsum(c), hsum(d)]`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum4(a: __m256i, b: __m256i, c: __m256i, d: __m256i) -> [i32; 4] {
    // hadd pairs within each 128-bit half: [a, b, c, d] partial sums per half.
    let abcd = _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
    let s = _mm_add_epi32(
        _mm256_castsi256_si128(abcd),
        _mm256_extracti128_si256::<1>(abcd),
    );
    let mut out = [0i32; 4];
    _mm_storeu_si128(out.as_mut_ptr().cast(), s);
    out
}

/// The 32 nibbles of 16 packed bytes: low nibbles in bytes 0..16, high in 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibbles(qs: &[u8; 16]) -> __m256i {
    let t = _mm_loadu_si128(qs.as_ptr().cast());
    let both = _mm256_set_m128i(_mm_srli_epi16::<4>(t), t);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Byte j of the result is 0xFF where bit j of `bits` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bytes_from_bits(bits: u32) -> __m256i {
    let spread = _mm256_shuffle_epi8(
        _mm256_set1_epi32(bits as i32),
        _mm256_setr_epi64x(
            0,
            0x0101_0101_0101_0101,
            0x0202_0202_0202_0202,
            0x0303_0303_0303_0303,
        ),
    );
    // All bits but bit j in byte j: OR gives 0xFF exactly where bit j is set.
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(spread, others), _mm256_set1_epi8(-1))
}

/// u8 x i8 products summed in groups of four into eight i32 lanes.
/// Exact while each adjacent pair sums within i16 (|u| * |i| * 2 <= 32767).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_u8_i8(u: __m256i, s: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1))
}

// ---- 32-element formats ------------------------------------------------------

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
        pub(super) unsafe fn dot_i8(x: __m256i, y: __m256i) -> __m256i {
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
pub(super) unsafe fn q5_quants(qs: &[u8; 16], qh: [u8; 4]) -> __m256i {
    let high = _mm256_and_si256(
        bytes_from_bits(u32::from_le_bytes(qh)),
        _mm256_set1_epi8(0x10),
    );
    _mm256_or_si256(nibbles(qs), high)
}

/// IQ4_NL levels of 16 packed bytes, in element order.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn iq4_levels(qs: &[u8; 16]) -> __m256i {
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
pub(super) unsafe fn k4_scales_mins(packed: &[u8; 12]) -> [u8; 16] {
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
