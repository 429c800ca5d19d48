//! What the AVX-512 one-token passes of both format families share: the
//! exact sums of eight rows folded into the lanes of one register, the
//! rows' f16 scales gathered into one, the prefetch of the streams of
//! banded groups, and the store of groups of 16 rows' results.

use std::arch::x86_64::*;

use super::tiling::prefetch_share;
use crate::backend::cpu::kernels::BAND_ROWS;

/// Weight rows per band.
pub(super) const BAND: usize = 8;

/// The eight row sums of four products: `v[p]` holds row `p`'s eight
/// lanes in its low half and row `p + 4`'s in its high half; the result
/// holds row `r`'s sum in lane `r` (exact: integer adds).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn row_sums8(v: [__m512i; 4]) -> __m256i {
    // Per 128-bit lane: [v0 a+c, v1 a+c, v0 b+d, v1 b+d] of its [a, b, c, d].
    let s01 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(v[0], v[1]),
        _mm512_unpackhi_epi32(v[0], v[1]),
    );
    let s23 = _mm512_add_epi32(
        _mm512_unpacklo_epi32(v[2], v[3]),
        _mm512_unpackhi_epi32(v[2], v[3]),
    );
    // Per 128-bit lane: the sums of its four values of v0, v1, v2, v3.
    let s = _mm512_add_epi32(
        _mm512_unpacklo_epi64(s01, s23),
        _mm512_unpackhi_epi64(s01, s23),
    );
    // Lanes 0 + 1 are rows 0..4, lanes 2 + 3 rows 4..8.
    let t = _mm512_add_epi32(s, _mm512_shuffle_i32x4::<0b10_11_00_01>(s, s));
    _mm512_castsi512_si256(_mm512_shuffle_i32x4::<0b00_00_10_00>(t, t))
}

/// The sums of eight rows' sixteen lanes, row `r` in lane `r` (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn fold8(z: &[__m512i; BAND]) -> __m256i {
    let half = |r: usize| {
        _mm256_add_epi32(
            _mm512_castsi512_si256(z[r]),
            _mm512_extracti64x4_epi64::<1>(z[r]),
        )
    };
    let pair = |p: usize| _mm512_inserti64x4::<1>(_mm512_castsi256_si512(half(p)), half(p + 4));
    row_sums8([pair(0), pair(1), pair(2), pair(3)])
}

/// The eight rows' f16 scales `d` of one block as f32, row `r` in lane `r`
/// (F16C only: the AVX2 kernels of `q32/tiles8.rs` use it too).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn gather_f16(bits: impl Fn(usize) -> u16) -> __m256 {
    let (mut lo, mut hi) = (0u64, 0u64);
    for r in 0..4 {
        lo |= u64::from(bits(r)) << (16 * r);
        hi |= u64::from(bits(r + 4)) << (16 * r);
    }
    _mm256_cvtph_ps(_mm_set_epi64x(hi as i64, lo as i64))
}

/// Byte offsets `[0, rb, 2 rb, .., 7 rb]` of eight rows of `rb` bytes, the
/// index vector of [`gather_f16_pairs`] (fails for rows too long to index
/// with an i32: none a model has).
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn row_offsets8(rb: usize) -> Option<__m256i> {
    let rb = i32::try_from(rb)
        .ok()
        .filter(|rb| rb.checked_mul(7).is_some())?;
    Some(_mm256_mullo_epi32(
        _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
        _mm256_set1_epi32(rb),
    ))
}

/// The f16 pairs at `first + offsets[r]` for eight rows `r`, as f32: the
/// low halves (`d`) and the high halves (`m`, `dmin`), row `r` in lane `r`.
/// One hardware gather: eight scalar loads shifted together into a
/// register (as [`gather_f16`]) were a third of the one-token band
/// kernels' instructions, the hottest part of their loop on a Xeon.
///
/// # Safety
/// AVX-512 F/VL; the four bytes at each `first + offsets[r]` are readable.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl")]
pub(super) unsafe fn gather_f16_pairs(first: *const u8, offsets: __m256i) -> (__m256, __m256) {
    let pairs = _mm256_i32gather_epi32::<1>(first.cast(), offsets);
    let lo = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(pairs));
    let hi = _mm256_cvtph_ps(_mm256_cvtepi32_epi16(_mm256_srli_epi32::<16>(pairs)));
    (lo, hi)
}

/// Prefetches, for each of `H` streams of [`Layout::Bands`] groups (the
/// current block step `at`, groups `group` bytes apart), the `step` bytes
/// `ahead` bytes further on. A prefetch never faults, so the addresses
/// may lie past the weights.
///
/// [`Layout::Bands`]: crate::backend::cpu::kernels::Layout::Bands
#[inline(always)]
pub(super) unsafe fn prefetch_groups<const H: usize>(
    at: *const u8,
    group: usize,
    step: usize,
    ahead: usize,
) {
    for h in 0..H {
        prefetch_share(at.wrapping_add(h * group + ahead).cast(), step, 0);
    }
}

/// Writes the sums of `H` groups of 16 rows (row `16 h + r` in lane `r` of
/// `acc[h]`) to `out[row * rs]`.
///
/// # Safety
/// AVX-512 F; `out` is valid for every index written.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn store_groups<const H: usize>(acc: &[__m512; H], out: *mut f32, rs: usize) {
    for (h, acc) in acc.iter().enumerate() {
        let mut v = [0.0f32; BAND_ROWS];
        _mm512_storeu_ps(v.as_mut_ptr(), *acc);
        for (r, &x) in v.iter().enumerate() {
            *out.add((BAND_ROWS * h + r) * rs) = x;
        }
    }
}
