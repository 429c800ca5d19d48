//! AVX2 building blocks of the x86 kernels (with FMA and F16C): f16
//! conversion, loads, horizontal sums, nibble and bit unpacking, ggml's
//! `maddubs` + `madd` product (u8 x i8 pairs to i16, then i16 pairs to i32),
//! and the macros that make table entries of the per-row dots
//! (`q32/dots.rs`, `k256/dots.rs`).
//!
//! Every block's integer sum is exact; four blocks' lanes are reduced
//! together ([`hsum4`]) and then scaled in the scalar kernel's float order.

use std::arch::x86_64::*;

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
            let s = $crate::backend::cpu::kernels::x86::simd::hsum4(
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
            let $sumi = $crate::backend::cpu::kernels::x86::simd::hsum($lanes($bx, $by));
            $body
        }
    }};
}
pub(super) use blockwise;

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
