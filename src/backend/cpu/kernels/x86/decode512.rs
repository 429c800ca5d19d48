//! One-token decode on AVX-512 VNNI in the arithmetic of the 16-token
//! kernels (`gemm16.rs`): a band of eight weight rows against one
//! activation row, each row's exact block integers folded into one lane
//! of a register ([`fold8`], [`row_sums8`]) and then the prefill kernel's
//! float operations applied lane by lane, so that a token's results equal
//! its batch's bit for bit.
//!
//! The per-row dot of `gemm16.rs` (`row_dot`) runs one float chain per
//! row, one block at a time, and its integer part sums each 32-element
//! sub-block horizontally: IQ4_XS decoded at ~11 GB/s from DRAM that way,
//! bound by the arithmetic. Here a row's block stays in vector lanes until
//! eight rows are folded together.
//!
//! IQ4_XS lanes: a zmm load covers four sub-blocks (16 bytes each: values
//! `j` and `16 + j` in the low and high nibble of byte `j`); the levels
//! come from a per-lane table lookup, offset by 128 so that `vpdpbusd`
//! takes them as unsigned, against activations laid out once per call in
//! the same order ([`XsActs`]). The offset's `128 * sum(q8)` is taken out
//! of one lane per sub-block, and each sub-block's lanes are multiplied by
//! its scale: the lanes then sum to the block's exact `s1`.

use std::arch::x86_64::*;

use super::gemm::prefetch_share;
use crate::quant::blocks::{BlockIQ4XS, BlockQ8K, KVALUES_IQ4NL};

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

/// The eight rows' f16 scales `d` of one block as f32, row `r` in lane `r`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn gather_f16(bits: impl Fn(usize) -> u16) -> __m256 {
    let (mut lo, mut hi) = (0u64, 0u64);
    for r in 0..4 {
        lo |= u64::from(bits(r)) << (16 * r);
        hi |= u64::from(bits(r + 4)) << (16 * r);
    }
    _mm256_cvtph_ps(_mm_set_epi64x(hi as i64, lo as i64))
}

/// One activation block laid out for IQ4_XS weights: `q[h][lohi]`, for
/// sub-blocks `4h..4h + 4`, holds in 128-bit lane `k` the 16 quants of
/// sub-block `4h + k` the low (`lohi = 0`) or high nibbles multiply;
/// `corr[h]` holds `128 * sum(q8)` of sub-block `4h + k` in the first
/// i32 of lane `k`, zero elsewhere.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct XsActs {
    q: [[[i8; 64]; 2]; 2],
    corr: [[i32; 16]; 2],
}

impl XsActs {
    /// The layout of `a`.
    pub(super) fn new(a: &BlockQ8K) -> Self {
        let mut out = XsActs {
            q: [[[0; 64]; 2]; 2],
            corr: [[0; 16]; 2],
        };
        for ib in 0..8 {
            let (h, k) = (ib / 4, ib % 4);
            let src = &a.qs[32 * ib..32 * ib + 32];
            out.q[h][0][16 * k..16 * k + 16].copy_from_slice(&src[..16]);
            out.q[h][1][16 * k..16 * k + 16].copy_from_slice(&src[16..]);
            let sum = i32::from(a.bsums[2 * ib]) + i32::from(a.bsums[2 * ib + 1]);
            out.corr[h][4 * k] = 128 * sum;
        }
        out
    }
}

/// The lanes of one IQ4_XS block against its laid-out activations: they
/// sum to the block's exact `s1 = sum scale_ib * sum(level * q8)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn xs_lanes(bx: &BlockIQ4XS, a: &XsActs) -> __m512i {
    let table = _mm512_broadcast_i32x4(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
    let (m4, flip) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(i8::MIN));
    // Sub-block ib's scale: low 4 bits at bit 4 ib of scales_l, high 2 at
    // bit 2 ib of scales_h, minus 32; lane i of half h is sub-block 4h + i / 4.
    let sl = _mm512_set1_epi32(u32::from_le_bytes(bx.scales_l) as i32);
    let sh = _mm512_set1_epi32(i32::from(bx.scales_h));
    let mut lanes = _mm512_setzero_si512();
    for h in 0..2 {
        let ib = |i: i32| 4 * h as i32 + i / 4;
        let shift_l = _mm512_set_epi32(
            4 * ib(15),
            4 * ib(14),
            4 * ib(13),
            4 * ib(12),
            4 * ib(11),
            4 * ib(10),
            4 * ib(9),
            4 * ib(8),
            4 * ib(7),
            4 * ib(6),
            4 * ib(5),
            4 * ib(4),
            4 * ib(3),
            4 * ib(2),
            4 * ib(1),
            4 * ib(0),
        );
        let shift_h = _mm512_srli_epi32::<1>(shift_l);
        let low = _mm512_and_si512(_mm512_srlv_epi32(sl, shift_l), _mm512_set1_epi32(0xF));
        let high = _mm512_and_si512(_mm512_srlv_epi32(sh, shift_h), _mm512_set1_epi32(3));
        let scale = _mm512_sub_epi32(
            _mm512_or_si512(low, _mm512_slli_epi32::<4>(high)),
            _mm512_set1_epi32(32),
        );
        let v = _mm512_loadu_si512(bx.qs.as_ptr().add(64 * h).cast());
        let lo = _mm512_and_si512(v, m4);
        let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
        let ulo = _mm512_xor_si512(_mm512_shuffle_epi8(table, lo), flip);
        let uhi = _mm512_xor_si512(_mm512_shuffle_epi8(table, hi), flip);
        let qlo = _mm512_load_si512(a.q[h][0].as_ptr().cast());
        let qhi = _mm512_load_si512(a.q[h][1].as_ptr().cast());
        let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ulo, qlo);
        let s = _mm512_dpbusd_epi32(s, uhi, qhi);
        let s = _mm512_sub_epi32(s, _mm512_load_si512(a.corr[h].as_ptr().cast()));
        lanes = _mm512_add_epi32(lanes, _mm512_mullo_epi32(s, scale));
    }
    lanes
}

/// Eight IQ4_XS rows (`w`, 8 rows of `nb` blocks) by one activation row
/// laid out as `acts`, results at `out[r * rs]`: per block, `row_dot`'s
/// `acc += (s1 * d) * d8` lane by lane.
///
/// # Safety
/// AVX-512 VNNI as in `gemm16::run`; `w` holds 8 rows of `nb` blocks,
/// `acts` at least `nb`; `out` is valid for every index written.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn one_token_iq4_xs(
    w: &[BlockIQ4XS],
    nb: usize,
    a: &[BlockQ8K],
    acts: &[XsActs],
    out: *mut f32,
    rs: usize,
) {
    let mut acc = _mm256_setzero_ps();
    for (b, (by, ba)) in a.iter().zip(acts).enumerate().take(nb) {
        prefetch_share(
            w.as_ptr().add(BAND * nb).cast(),
            BAND * size_of::<BlockIQ4XS>(),
            b,
        );
        let mut z = [_mm512_setzero_si512(); BAND];
        for (r, zr) in z.iter_mut().enumerate() {
            *zr = xs_lanes(&w[r * nb + b], ba);
        }
        let s1 = fold8(&z);
        let d = gather_f16(|r| w[r * nb + b].d.to_bits());
        let m = _mm256_mul_ps(_mm256_cvtepi32_ps(s1), d);
        acc = _mm256_add_ps(acc, _mm256_mul_ps(m, _mm256_set1_ps(by.d)));
    }
    let mut v = [0.0f32; BAND];
    _mm256_storeu_ps(v.as_mut_ptr(), acc);
    for (r, &x) in v.iter().enumerate() {
        *out.add(r * rs) = x;
    }
}
