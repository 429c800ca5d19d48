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
//!
//! Q4_K, Q5_K and Q6_K lanes: a zmm load of packed quants gives, through one
//! mask and one shift, two registers of 64 values; each 32-bit lane holds
//! four values of one sub-block, so it is multiplied by that sub-block's
//! scale (widened from bytes by one shuffle and one `vpmovzxbd` /
//! `vpmovsxbd`) before the lanes of eight rows are folded. The
//! activations are read in the same order (Q6_K's are already; Q4_K's
//! are laid out once per call, [`K4Acts`]), and the terms of the mins
//! (Q4_K, Q5_K) and of Q6_K's offset of 32 come from `vpmaddwd` of the
//! scales against the activations' sub-block sums. Q5_K's fifth bits are
//! shifted into place from one broadcast of `qh`.
//!
//! Q2_K and Q3_K lanes: one zmm load of the 64 bytes of 2-bit quants gives
//! four registers of 64 values (a shift and a mask each; Q3_K adds its
//! high bit, 4, from a broadcast of `hmask`), against activations laid out
//! in the same order ([`K23Acts`]). Q2_K's mins and Q3_K's offset of 4 are
//! `vpmaddwd` against the 16-value sums, as for Q6_K.

use std::arch::x86_64::*;
use std::cell::Cell;

use super::avx2::{k4_scales_mins_v, q3_scales};
use super::bands_ahead;
use super::gemm::prefetch_share;
use crate::backend::cpu::kernels::BAND_ROWS;
use crate::quant::blocks::{
    BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, KVALUES_IQ4NL,
};

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
/// (F16C only: the AVX2 kernels of `gemm8.rs` use it too).
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

/// One activation block laid out for Q4_K weights: `q[h][lohi]` holds the
/// 64 quants that the low (`lohi = 0`) or high nibbles of `qs[64h..64h +
/// 64]` multiply: values `128h + 32 lohi + l` in bytes `l < 32`, values
/// `128h + 64 + 32 lohi + l` in bytes `32 + l`. `bs32[j]`: the sum of the
/// quants of sub-block `j` (32 values; fits i16).
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct K4Acts {
    q: [[[i8; 64]; 2]; 2],
    bs32: [i16; 8],
}

impl K4Acts {
    /// The layout of `a`.
    pub(super) fn new(a: &BlockQ8K) -> Self {
        let mut out = K4Acts {
            q: [[[0; 64]; 2]; 2],
            bs32: [0; 8],
        };
        for h in 0..2 {
            for lohi in 0..2 {
                let v0 = 128 * h + 32 * lohi;
                out.q[h][lohi][..32].copy_from_slice(&a.qs[v0..v0 + 32]);
                out.q[h][lohi][32..].copy_from_slice(&a.qs[v0 + 64..v0 + 96]);
            }
        }
        for (j, s) in out.bs32.iter_mut().enumerate() {
            *s = a.bsums[2 * j] + a.bsums[2 * j + 1];
        }
        out
    }
}

/// Each 32-bit lane's sub-block scale: byte `idx[4 i]` of `sc` widened to
/// lane `i` (`signed`: as i8, else as u8).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn lane_scales(sc: __m128i, idx: __m128i, signed: bool) -> __m512i {
    let b = _mm_shuffle_epi8(sc, idx);
    if signed {
        _mm512_cvtepi8_epi32(b)
    } else {
        _mm512_cvtepu8_epi32(b)
    }
}

/// A shuffle index of 16 bytes: `a` for the first 8 lanes' bytes, `b` for
/// the last 8 (so that [`lane_scales`] gives 8 lanes of each), as i8.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn halves(a: i8, b: i8) -> __m128i {
    _mm_set_epi8(b, b, b, b, b, b, b, b, a, a, a, a, a, a, a, a)
}

/// Four quarters of a 16-byte shuffle index: bytes `a`, `b`, `c`, `d`,
/// four of each (so that [`lane_scales`] gives 4 lanes of each).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn quarters(a: i8, b: i8, c: i8, d: i8) -> __m128i {
    _mm_set_epi8(d, d, d, d, c, c, c, c, b, b, b, b, a, a, a, a)
}

/// The lanes of one Q4_K (`qh = None`) or Q5_K block against its laid-out
/// activations (they sum to the block's exact `s1`), and the lanes of its
/// exact `s2 = sum_j min_j * bs32_j` (low 128 bits; zero above).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn k45_lanes(
    qs: &[u8; 128],
    qh: Option<&[u8; 32]>,
    scales: &[u8; 12],
    a: &K4Acts,
) -> (__m512i, __m512i) {
    let sm = k4_scales_mins_v(scales);
    let m4 = _mm512_set1_epi8(0x0F);
    let one = _mm512_set1_epi8(1);
    let qh = qh.map(|qh| _mm512_broadcast_i64x4(_mm256_loadu_si256(qh.as_ptr().cast())));
    let mut lanes = _mm512_setzero_si512();
    for h in 0..2 {
        let j = 4 * h as i8;
        let v = _mm512_loadu_si512(qs.as_ptr().add(64 * h).cast());
        let mut lo = _mm512_and_si512(v, m4);
        let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
        if let Some(qh) = qh {
            // The fifth bit of value 64k + 32 lohi + l is bit 2k + lohi of
            // qh[l]; bytes 32.. of this half are k = 2h + 1.
            let fifth = |b: i64| {
                let bits =
                    _mm512_srlv_epi64(qh, _mm512_set_epi64(b + 2, b + 2, b + 2, b + 2, b, b, b, b));
                _mm512_slli_epi16::<4>(_mm512_and_si512(bits, one))
            };
            lo = _mm512_or_si512(lo, fifth(4 * h as i64));
            hi = _mm512_or_si512(hi, fifth(4 * h as i64 + 1));
        }
        let slo = _mm512_dpbusd_epi32(
            _mm512_setzero_si512(),
            lo,
            _mm512_load_si512(a.q[h][0].as_ptr().cast()),
        );
        let shi = _mm512_dpbusd_epi32(
            _mm512_setzero_si512(),
            hi,
            _mm512_load_si512(a.q[h][1].as_ptr().cast()),
        );
        // Low nibbles: sub-blocks 4h, 4h + 2; high: 4h + 1, 4h + 3.
        let clo = lane_scales(sm, halves(j, j + 2), false);
        let chi = lane_scales(sm, halves(j + 1, j + 3), false);
        lanes = _mm512_add_epi32(lanes, _mm512_mullo_epi32(slo, clo));
        lanes = _mm512_add_epi32(lanes, _mm512_mullo_epi32(shi, chi));
    }
    let mins = _mm_cvtepu8_epi16(_mm_srli_si128::<8>(sm));
    let s2 = _mm_madd_epi16(mins, _mm_load_si128(a.bs32.as_ptr().cast()));
    (lanes, _mm512_zextsi128_si512(s2))
}

/// One activation block laid out for Q2_K and Q3_K weights: `q[j]` holds
/// the 64 quants that bits `2j, 2j + 1` of the 64 packed bytes multiply:
/// values `32j + l` in bytes `l < 32`, values `128 + 32j + l` in bytes
/// `32 + l`. `bs16`: the block's sums of 16 values.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(super) struct K23Acts {
    q: [[i8; 64]; 4],
    bs16: [i16; 16],
}

impl K23Acts {
    /// The layout of `a`.
    pub(super) fn new(a: &BlockQ8K) -> Self {
        let mut out = K23Acts {
            q: [[0; 64]; 4],
            bs16: a.bsums,
        };
        for (j, q) in out.q.iter_mut().enumerate() {
            q[..32].copy_from_slice(&a.qs[32 * j..32 * j + 32]);
            q[32..].copy_from_slice(&a.qs[128 + 32 * j..160 + 32 * j]);
        }
        out
    }
}

/// The lanes of the 2-bit quants (plus 4 where the bit of `hmask` is set,
/// Q3_K) of one Q2_K / Q3_K block times its sub-block scales `sc` (16
/// bytes, widened as i8 when `signed`) against `a`: they sum to `sum_s
/// sc_s * sum(u * q8)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn k23_lanes(
    qs: &[u8; 64],
    hmask: Option<&[u8; 32]>,
    sc: __m128i,
    signed: bool,
    a: &K23Acts,
) -> __m512i {
    let v = _mm512_loadu_si512(qs.as_ptr().cast());
    let m3 = _mm512_set1_epi8(3);
    let one = _mm512_set1_epi8(1);
    let hm = hmask.map(|h| _mm512_broadcast_i64x4(_mm256_loadu_si256(h.as_ptr().cast())));
    let mut lanes = _mm512_setzero_si512();
    for j in 0..4 {
        let mut u = _mm512_and_si512(_mm512_srl_epi16(v, _mm_cvtsi32_si128(2 * j)), m3);
        if let Some(hm) = hm {
            // The high bit of value 128n + 32j + l is bit 4n + j of hmask[l].
            let b = i64::from(j);
            let bits =
                _mm512_srlv_epi64(hm, _mm512_set_epi64(b + 4, b + 4, b + 4, b + 4, b, b, b, b));
            u = _mm512_or_si512(u, _mm512_slli_epi16::<2>(_mm512_and_si512(bits, one)));
        }
        let s = _mm512_dpbusd_epi32(
            _mm512_setzero_si512(),
            u,
            _mm512_load_si512(a.q[j as usize].as_ptr().cast()),
        );
        // Lanes of 4 values: sub-blocks 2j, 2j + 1, 8 + 2j, 9 + 2j.
        let k = 2 * j as i8;
        let c = lane_scales(sc, quarters(k, k + 1, k + 8, k + 9), signed);
        lanes = _mm512_add_epi32(lanes, _mm512_mullo_epi32(s, c));
    }
    lanes
}

/// The lanes of one Q2_K block against its laid-out activations (they
/// sum to the block's exact `s1`), and those of its exact `s2 = sum_s
/// min_s * bs16_s` (low 256 bits; zero above).
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q2_lanes(bx: &BlockQ2K, a: &K23Acts) -> (__m512i, __m512i) {
    let packed = _mm_loadu_si128(bx.scales.as_ptr().cast());
    let m4 = _mm_set1_epi8(0x0F);
    let lanes = k23_lanes(&bx.qs, None, _mm_and_si128(packed, m4), false, a);
    let mins = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16::<4>(packed), m4));
    let s2 = _mm256_madd_epi16(mins, _mm256_load_si256(a.bs16.as_ptr().cast()));
    (lanes, _mm512_zextsi256_si512(s2))
}

/// The lanes of one Q3_K block against its laid-out activations: they sum
/// to the block's exact `s1 = sum_s scale_s * sum((u - 4) * q8)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q3_lanes(bx: &BlockQ3K, a: &K23Acts) -> __m512i {
    let sc = q3_scales(&bx.scales);
    let lanes = k23_lanes(&bx.qs, Some(&bx.hmask), sc, true, a);
    // The offset: 4 * sum_s scale_s * bs16_s, taken out of lanes 0..8.
    let bs = _mm256_load_si256(a.bs16.as_ptr().cast());
    let corr = _mm256_slli_epi32::<2>(_mm256_madd_epi16(_mm256_cvtepi8_epi16(sc), bs));
    _mm512_sub_epi32(lanes, _mm512_zextsi256_si512(corr))
}

/// The lanes of one Q6_K block against an activation block: they sum to
/// the block's exact `s1 = sum_s scale_s * sum((q - 32) * q8)`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn q6_lanes(bx: &BlockQ6K, a: &BlockQ8K) -> __m512i {
    let sc = _mm_loadu_si128(bx.scales.as_ptr().cast());
    let m4 = _mm512_set1_epi8(0x0F);
    let m3 = _mm512_set1_epi8(0x03);
    // qh bits 2c, 2c + 1 of byte l: the high bits of value 32c + l (of the
    // half); shift counts per 256-bit half: c = 0 | 1 and 2 | 3.
    let (sh_lo, sh_hi) = (
        _mm512_set_epi64(2, 2, 2, 2, 0, 0, 0, 0),
        _mm512_set_epi64(6, 6, 6, 6, 4, 4, 4, 4),
    );
    let mut lanes = _mm512_setzero_si512();
    for h in 0..2 {
        let ql = _mm512_loadu_si512(bx.ql.as_ptr().add(64 * h).cast());
        let qh = _mm512_broadcast_i64x4(_mm256_loadu_si256(bx.qh.as_ptr().add(32 * h).cast()));
        let hb_lo = _mm512_and_si512(_mm512_srlv_epi64(qh, sh_lo), m3);
        let hb_hi = _mm512_and_si512(_mm512_srlv_epi64(qh, sh_hi), m3);
        let ulo = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16::<4>(hb_lo));
        let uhi = _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi16::<4>(ql), m4),
            _mm512_slli_epi16::<4>(hb_hi),
        );
        let q = a.qs.as_ptr().add(128 * h);
        let slo = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ulo, _mm512_loadu_si512(q.cast()));
        let shi = _mm512_dpbusd_epi32(
            _mm512_setzero_si512(),
            uhi,
            _mm512_loadu_si512(q.add(64).cast()),
        );
        // Lanes of 4 values: sub-blocks 8h + 0..4 (low nibbles), + 4..8.
        let s = 8 * h as i8;
        let clo = lane_scales(sc, quarters(s, s + 1, s + 2, s + 3), true);
        let chi = lane_scales(sc, quarters(s + 4, s + 5, s + 6, s + 7), true);
        lanes = _mm512_add_epi32(lanes, _mm512_mullo_epi32(slo, clo));
        lanes = _mm512_add_epi32(lanes, _mm512_mullo_epi32(shi, chi));
    }
    // The offset: 32 * sum_s scale_s * bsum_s, taken out of lanes 0..8.
    let sc16 = _mm256_cvtepi8_epi16(sc);
    let bs = _mm256_loadu_si256(a.bsums.as_ptr().cast());
    let corr = _mm256_slli_epi32::<5>(_mm256_madd_epi16(sc16, bs));
    _mm512_sub_epi32(lanes, _mm512_zextsi256_si512(corr))
}

thread_local! {
    /// One token's activations laid out for IQ4_XS, reused across calls.
    static XS_ACTS: Cell<Vec<XsActs>> = const { Cell::new(Vec::new()) };
    /// Likewise for Q4_K and Q5_K.
    static K4_ACTS: Cell<Vec<K4Acts>> = const { Cell::new(Vec::new()) };
    /// Likewise for Q2_K and Q3_K.
    static K23_ACTS: Cell<Vec<K23Acts>> = const { Cell::new(Vec::new()) };
}

/// Runs `f` on the activation blocks `a` laid out by `new`, in the
/// thread's reusable buffer `cell`.
fn laid_out<T, R>(
    cell: &'static std::thread::LocalKey<Cell<Vec<T>>>,
    a: &[BlockQ8K],
    new: fn(&BlockQ8K) -> T,
    f: impl FnOnce(&[T]) -> R,
) -> R {
    let mut acts = cell.take();
    acts.clear();
    acts.extend(a.iter().map(new));
    let r = f(&acts);
    cell.set(acts);
    r
}

/// A format with a one-token band kernel: its block's exact integer lanes
/// against one activation block laid out as [`OneToken::Acts`].
pub(super) trait OneToken: Sized {
    /// The activation layout the lanes read (`BlockQ8K` itself where the
    /// quants come in activation order).
    type Acts;
    /// Whether the format has mins (`s2`, `dmin`).
    const MIN: bool;
    /// Runs `f` on the activation blocks `a` as [`OneToken::Acts`]: laid
    /// out in a buffer of the thread's, reused across calls, or `a`
    /// itself.
    fn with_acts<R>(a: &[BlockQ8K], f: impl FnOnce(&[Self::Acts]) -> R) -> R;
    /// Lanes summing to the block's exact `s1`, and to `s2` (zero without
    /// mins).
    ///
    /// # Safety
    /// The CPU features of `gemm16::run`.
    unsafe fn lanes(&self, a: &Self::Acts) -> (__m512i, __m512i);
    /// The raw f16 bits of `d` and `dmin` (0 without mins).
    fn scale_bits(&self) -> (u16, u16);
}

/// `impl OneToken for $W`: activations laid out as `$A` (by `$A::new`,
/// in the thread's buffer `$cell`), lanes `$lanes` of block `$b` against
/// them (`$x`), the raw scales `$bits` of block `$s`.
macro_rules! one_token {
    ($W:ty, $A:ty, $cell:ident, min: $min:expr,
     lanes: |$b:ident, $x:ident| $lanes:expr, bits: |$s:ident| $bits:expr) => {
        impl OneToken for $W {
            type Acts = $A;
            const MIN: bool = $min;
            fn with_acts<R>(a: &[BlockQ8K], f: impl FnOnce(&[$A]) -> R) -> R {
                laid_out(&$cell, a, <$A>::new, f)
            }
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
            unsafe fn lanes(&self, $x: &$A) -> (__m512i, __m512i) {
                let $b = self;
                $lanes
            }
            fn scale_bits(&self) -> (u16, u16) {
                let $s = self;
                $bits
            }
        }
    };
}

one_token!(BlockIQ4XS, XsActs, XS_ACTS, min: false,
    lanes: |b, a| (xs_lanes(b, a), _mm512_setzero_si512()),
    bits: |b| (b.d.to_bits(), 0));
one_token!(BlockQ4K, K4Acts, K4_ACTS, min: true,
    lanes: |b, a| k45_lanes(&b.qs, None, &b.scales, a),
    bits: |b| (b.d.to_bits(), b.dmin.to_bits()));
one_token!(BlockQ5K, K4Acts, K4_ACTS, min: true,
    lanes: |b, a| k45_lanes(&b.qs, Some(&b.qh), &b.scales, a),
    bits: |b| (b.d.to_bits(), b.dmin.to_bits()));
one_token!(BlockQ2K, K23Acts, K23_ACTS, min: true,
    lanes: |b, a| q2_lanes(b, a),
    bits: |b| (b.d.to_bits(), b.dmin.to_bits()));
one_token!(BlockQ3K, K23Acts, K23_ACTS, min: false,
    lanes: |b, a| (q3_lanes(b, a), _mm512_setzero_si512()),
    bits: |b| (b.d.to_bits(), 0));

/// Q6_K's quants come in activation order: its lanes read the blocks as
/// they are.
impl OneToken for BlockQ6K {
    type Acts = BlockQ8K;
    const MIN: bool = false;
    fn with_acts<R>(a: &[BlockQ8K], f: impl FnOnce(&[Self::Acts]) -> R) -> R {
        f(a)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn lanes(&self, a: &BlockQ8K) -> (__m512i, __m512i) {
        (q6_lanes(self, a), _mm512_setzero_si512())
    }
    fn scale_bits(&self) -> (u16, u16) {
        (self.d.to_bits(), 0)
    }
}

/// Eight rows of `W` (`w`, 8 rows of `nb` blocks) by one activation row
/// `a`, laid out as `acts`, results at `out[r * rs]`: per block, the eight
/// rows' lanes folded to one register ([`fold8`]) and `row_dot`'s `acc +=
/// (s1 * d - s2 * dmin) * d8` (`(s1 * d) * d8` without mins) lane by lane,
/// the next band prefetched as one stream.
///
/// # Safety
/// AVX-512 VNNI as in `gemm16::run`; `w` holds 8 rows of `nb` blocks, `a`
/// and `acts` at least `nb`; `out` is valid for every index written.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn one_token<W: OneToken>(
    w: &[W],
    nb: usize,
    a: &[BlockQ8K],
    acts: &[W::Acts],
    out: *mut f32,
    rs: usize,
) {
    let mut acc = _mm256_setzero_ps();
    for (b, (by, ba)) in a.iter().zip(acts).enumerate().take(nb) {
        prefetch_share(w.as_ptr().add(BAND * nb).cast(), BAND * size_of::<W>(), b);
        let mut z1 = [_mm512_setzero_si512(); BAND];
        let mut z2 = [_mm512_setzero_si512(); BAND];
        for r in 0..BAND {
            (z1[r], z2[r]) = w[r * nb + b].lanes(ba);
        }
        let d = gather_f16(|r| w[r * nb + b].scale_bits().0);
        let mut m = _mm256_mul_ps(_mm256_cvtepi32_ps(fold8(&z1)), d);
        if W::MIN {
            let dmin = gather_f16(|r| w[r * nb + b].scale_bits().1);
            m = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(fold8(&z2)), dmin, m);
        }
        acc = _mm256_add_ps(acc, _mm256_mul_ps(m, _mm256_set1_ps(by.d)));
    }
    let mut v = [0.0f32; BAND];
    _mm256_storeu_ps(v.as_mut_ptr(), acc);
    for (r, &x) in v.iter().enumerate() {
        *out.add(r * rs) = x;
    }
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

/// Prefetches the 64-byte line that holds byte `ahead + 64 * line` of the
/// block step at `at`. The k-quant kernels below issue one per word they load
/// rather than a block step's 36-53 at its head ([`prefetch_groups`]): a
/// burst that long outruns the L1's dozen fill buffers and stalls the loads
/// behind it. Measured at one thread (`examples/stream_speed.rs`): Q4_K
/// from L2, one group per pass, 41 -> 53 GB/s; 2048x8192 weights from
/// DRAM, four groups per pass, Q4_K 13.7 -> 15.1, Q6_K 13.2 -> 14.5,
/// IQ4_XS 13.2 -> 14.6, with Q4_0's 15.4-16.0 beside them.
///
/// The address is the line's first byte. Q6_K's block step of 16 rows is
/// 3360 bytes, so every second step starts half a line in, and its
/// prefetches went to the middles of the same lines. On AMD Zen 5 that
/// read DRAM slower; why is not known (no hardware counters in this VM).
/// One thread, one group per pass, 2048x8192 weights from DRAM, GB/s,
/// three rounds: Q6_K 35.6-36.3 -> 40.2-41.6, Q4_K 36.6-37.5 ->
/// 38.4-39.7 (its steps all start on a line), IQ4_XS alike; from cache
/// alike. Whole 1B models decoding at one thread (`hearth bench -p 0 -n 64
/// -r 3`, two rounds, tokens/s): Q6_K 34.4-35.0 -> 38.6-38.8, Q4_K_M
/// 45.2 -> 46.7-46.9, Q4_0 (its Q6_K output) 48.8-49.1 -> 50.4-51.5,
/// IQ4_XS 51.1-51.6 -> 52.4-53.1. (`prefetch_share`'s 32-element steps,
/// Q4_0 and Q8_0 half of them half a line in, read alike either way.)
#[inline(always)]
unsafe fn prefetch_line(at: *const u8, ahead: usize, line: usize) {
    let a = at.wrapping_add(ahead + 64 * line);
    _mm_prefetch::<_MM_HINT_T0>(a.wrapping_sub(a as usize % 64).cast());
}

/// The four activation bytes at `q8 + at` in every 32-bit lane. Each group
/// of a pass takes them anew from memory (`vpdpbusd`'s embedded broadcast)
/// through a pointer the compiler cannot follow: else it hoists a block
/// step's 64 broadcasts out of the loop over groups and spills them to the
/// stack, 4 KiB of stores per step.
#[inline(always)]
unsafe fn act4(q8: *const i8, at: usize) -> __m512i {
    _mm512_set1_epi32(std::ptr::read_unaligned(q8.add(at).cast::<i32>()))
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

/// The 6-bit scales and mins of 16 Q4_K rows from the three words of their
/// packed scales `s0`, `s1`, `s2` (ggml's `get_scale_min_k4` in lanes):
/// `([scales 0..4, scales 4..8], [mins 0..4, mins 4..8])`, a byte each in
/// every row's lane.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn q4k_scales_mins(
    s0: __m512i,
    s1: __m512i,
    s2: __m512i,
) -> ([__m512i; 2], [__m512i; 2]) {
    let (m4, m6, hi2) = (
        _mm512_set1_epi8(0x0F),
        _mm512_set1_epi8(0x3F),
        _mm512_set1_epi8(0x30),
    );
    let sc = [
        _mm512_and_si512(s0, m6),
        _mm512_or_si512(
            _mm512_and_si512(s2, m4),
            _mm512_and_si512(_mm512_srli_epi32::<2>(s0), hi2),
        ),
    ];
    let mn = [
        _mm512_and_si512(s1, m6),
        _mm512_or_si512(
            _mm512_and_si512(_mm512_srli_epi32::<4>(s2), m4),
            _mm512_and_si512(_mm512_srli_epi32::<2>(s1), hi2),
        ),
    ];
    (sc, mn)
}

/// Byte `j` of each 32-bit lane of `v`, zero-extended.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn byte_lane(v: __m512i, j: usize) -> __m512i {
    let shifted = match j {
        0 => v,
        1 => _mm512_srli_epi32::<8>(v),
        2 => _mm512_srli_epi32::<16>(v),
        _ => _mm512_srli_epi32::<24>(v),
    };
    _mm512_and_si512(shifted, _mm512_set1_epi32(0xFF))
}

/// `H` whole groups of 16 Q4_K rows in [`Layout::Bands`](crate::backend::cpu::kernels::Layout::Bands) (`w`, each of
/// `nb` block steps; two f16 scales, `d` and `dmin`, then 35 words: the
/// three of the packed scales, the 32 of quants) by one activation row `a`,
/// results at `out[r * rs]`, row `16 h + r` in lane `r` of `acc[h]`, each
/// group's stream prefetched [`bands_ahead`] bytes ahead.
///
/// Per block step and group, in lanes: the 16 rows' eight 6-bit scales and
/// mins are unpacked from their three scale words by shifts and masks
/// (ggml's `get_scale_min_k4`, four bytes per lane at once); each 64-byte
/// word of quants is one load whose low and high nibbles go to two
/// sub-blocks' `vpdpbusd` chains; a sub-block's exact sums times its scale
/// (`vpmulld`) make `s1`, and the mins against the activation's sub-block
/// sums (`vpdpwssd`) `s2`. Then `gemm16.rs`'s float operations:
/// `acc += (s1 * d - s2 * dmin) * d8`.
///
/// # Safety
/// AVX-512 VNNI as in `gemm16::run`; `w` holds `H` whole groups of `nb`
/// block steps; `out` is valid for every index written.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn one_token_bands_q4k<const H: usize>(
    w: *const u8,
    nb: usize,
    a: &[BlockQ8K],
    out: *mut f32,
    rs: usize,
) {
    const ROWS: usize = BAND_ROWS;
    let step = ROWS * size_of::<BlockQ4K>();
    let group = nb * step;
    let (m4, m4_hi) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0xF0_u8 as i8));
    let mut acc = [_mm512_setzero_ps(); H];
    for (b, by) in a.iter().enumerate().take(nb) {
        // The activation's eight sub-block sums, as the i16 pairs the
        // mins' bytes (0, 2) and (1, 3) of each lane meet.
        let bs = |j: usize| i32::from(by.bsums[2 * j]) + i32::from(by.bsums[2 * j + 1]);
        let pair = |lo: usize, hi: usize| _mm512_set1_epi32((bs(lo) & 0xFFFF) | (bs(hi) << 16));
        let sums = [pair(0, 2), pair(1, 3), pair(4, 6), pair(5, 7)];
        let d8 = _mm512_set1_ps(by.d);
        for (h, acc) in acc.iter_mut().enumerate() {
            let q8 = std::hint::black_box(by.qs.as_ptr());
            let act = |at: usize| act4(q8, at);
            let p = w.add(h * group + b * step);
            // Lines 0..4 here, 4..36 one per word of quants.
            let pf = |line: usize| prefetch_line(p, bands_ahead(H), line);
            (0..4).for_each(&pf);
            let word = |k: usize| _mm512_loadu_si512(p.add(4 * ROWS * (1 + k)).cast());
            let (sc, mn) = q4k_scales_mins(word(0), word(1), word(2));
            let mut t2 = _mm512_setzero_si512();
            for (half, m) in mn.iter().enumerate() {
                let even = _mm512_and_si512(*m, _mm512_set1_epi32(0x00FF_00FF));
                let odd =
                    _mm512_and_si512(_mm512_srli_epi32::<8>(*m), _mm512_set1_epi32(0x00FF_00FF));
                t2 = _mm512_dpwssd_epi32(t2, even, sums[2 * half]);
                t2 = _mm512_dpwssd_epi32(t2, odd, sums[2 * half + 1]);
            }
            // `t1` gathers the low nibbles' sub-blocks, `t16` the high
            // ones' at 16 times their value (see below).
            let (mut t1, mut t16) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            for i in 0..4 {
                // Words 8i..8i + 8: sub-block 2i in the low nibbles,
                // 2i + 1 in the high ones, which stay where they are:
                // `vpdpbusd` takes `16 q` (at most 240) as unsigned, one
                // mask instead of a shift and a mask.
                let (mut lo, mut hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for k in 0..8 {
                    pf(4 + 8 * i + k);
                    let v = word(3 + 8 * i + k);
                    let vl = _mm512_and_si512(v, m4);
                    let vh = _mm512_and_si512(v, m4_hi);
                    lo = _mm512_dpbusd_epi32(lo, vl, act(64 * i + 4 * k));
                    hi = _mm512_dpbusd_epi32(hi, vh, act(64 * i + 32 + 4 * k));
                }
                let scale = |j: usize| byte_lane(sc[j / 4], j % 4);
                t1 = _mm512_add_epi32(t1, _mm512_mullo_epi32(lo, scale(2 * i)));
                t16 = _mm512_add_epi32(t16, _mm512_mullo_epi32(hi, scale(2 * i + 1)));
            }
            // `t16` is 16 times the exact sum, so the shift is exact (and
            // nothing overflows: 32 * 240 * 128 * 63 * 4 < 2^31).
            let t1 = _mm512_add_epi32(t1, _mm512_srai_epi32::<4>(t16));
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
            let dmin = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * ROWS).cast()));
            let m = _mm512_mul_ps(_mm512_cvtepi32_ps(t1), d);
            let m = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(t2), dmin, m);
            *acc = _mm512_add_ps(*acc, _mm512_mul_ps(m, d8));
        }
    }
    store_groups(&acc, out, rs);
}

/// `H` whole groups of 16 IQ4_XS rows in [`Layout::Bands`](crate::backend::cpu::kernels::Layout::Bands) (`w`, each of
/// `nb` block steps; the 16 rows' `d`, then their `scales_h`, then 33
/// words: `scales_l`, the 32 of quants) by one activation row `a`, results
/// at `out[r * rs]`, row `16 h + r` in lane `r` of `acc[h]`, each group's
/// stream prefetched [`bands_ahead`] bytes ahead.
///
/// Per block step and group: each word of quants is one load whose low and
/// high nibbles index IQ4_NL's levels plus 128 (one `vpshufb` each) for
/// two `vpdpbusd` chains, a sub-block's values 0..16 and 16..32; the bias
/// comes back as `128 * sum(q8)` from the activation's sums, and a
/// sub-block's exact sum meets its 6-bit scale, unpacked in lanes, in
/// `vpmulld`. Then `gemm16.rs`'s float operations: `acc += (s1 * d) * d8`.
///
/// # Safety
/// AVX-512 VNNI as in `gemm16::run`; `w` holds `H` whole groups of `nb`
/// block steps; `out` is valid for every index written.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn one_token_bands_iq4xs<const H: usize>(
    w: *const u8,
    nb: usize,
    a: &[BlockQ8K],
    out: *mut f32,
    rs: usize,
) {
    const ROWS: usize = BAND_ROWS;
    let step = ROWS * size_of::<BlockIQ4XS>();
    let group = nb * step;
    let m4 = _mm512_set1_epi8(0x0F);
    let levels = _mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast());
    let table = _mm512_broadcast_i32x4(_mm_xor_si128(levels, _mm_set1_epi8(i8::MIN)));
    let (nibble, two_bits, offset) = (
        _mm512_set1_epi32(0xF),
        _mm512_set1_epi32(3),
        _mm512_set1_epi32(32),
    );
    let mut acc = [_mm512_setzero_ps(); H];
    for (b, by) in a.iter().enumerate().take(nb) {
        // What the levels' +128 adds to sub-block `ib`'s sum.
        let bias = |ib: usize| {
            let sum = i32::from(by.bsums[2 * ib]) + i32::from(by.bsums[2 * ib + 1]);
            _mm512_set1_epi32(128 * sum)
        };
        let d8 = _mm512_set1_ps(by.d);
        for (h, acc) in acc.iter_mut().enumerate() {
            let q8 = std::hint::black_box(by.qs.as_ptr());
            let act = |at: usize| act4(q8, at);
            let p = w.add(h * group + b * step);
            // Lines 0..2 here, 2..34 one per word of quants.
            let pf = |line: usize| prefetch_line(p, bands_ahead(H), line);
            (0..2).for_each(&pf);
            let word = |k: usize| _mm512_loadu_si512(p.add(4 * ROWS * (1 + k)).cast());
            let low_bits = word(0);
            let high_bits = _mm512_cvtepu16_epi32(_mm256_loadu_si256(p.add(2 * ROWS).cast()));
            let mut t1 = _mm512_setzero_si512();
            for ib in 0..8 {
                // Words 4ib + 1..4ib + 5: the sub-block's values 0..16 in
                // the low nibbles, 16..32 in the high ones.
                let (mut lo, mut hi) = (_mm512_setzero_si512(), _mm512_setzero_si512());
                for k in 0..4 {
                    pf(2 + 4 * ib + k);
                    let v = word(1 + 4 * ib + k);
                    let vl = _mm512_shuffle_epi8(table, _mm512_and_si512(v, m4));
                    let vh =
                        _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4));
                    lo = _mm512_dpbusd_epi32(lo, vl, act(32 * ib + 4 * k));
                    hi = _mm512_dpbusd_epi32(hi, vh, act(32 * ib + 16 + 4 * k));
                }
                // The scale: nibble ib of `scales_l`, bits 2ib..2ib + 2 of
                // `scales_h` above it, less 32.
                let count = |n: usize| _mm_cvtsi32_si128(n as i32);
                let low = _mm512_and_si512(_mm512_srl_epi32(low_bits, count(4 * ib)), nibble);
                let high = _mm512_and_si512(_mm512_srl_epi32(high_bits, count(2 * ib)), two_bits);
                let sc =
                    _mm512_sub_epi32(_mm512_or_si512(low, _mm512_slli_epi32::<4>(high)), offset);
                let sum = _mm512_sub_epi32(_mm512_add_epi32(lo, hi), bias(ib));
                t1 = _mm512_add_epi32(t1, _mm512_mullo_epi32(sum, sc));
            }
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
            let m = _mm512_mul_ps(_mm512_cvtepi32_ps(t1), d);
            *acc = _mm512_add_ps(*acc, _mm512_mul_ps(m, d8));
        }
    }
    store_groups(&acc, out, rs);
}

/// How far ahead each of the `groups` streams of [`one_token_bands_q6k`]
/// prefetches: [`bands_ahead`], but never less than [`Q6K_AHEAD`].
fn q6k_ahead(groups: usize) -> usize {
    bands_ahead(groups).max(Q6K_AHEAD)
}

/// The least [`q6k_ahead`]. Its block step is 3360 bytes (Q4_K's 2304).
/// On Intel Ice Lake, four streams, with the prefetches spread over the
/// loads ([`prefetch_line`]), 2048x8192 from DRAM read 13.0 GB/s at 1024
/// bytes ahead, 13.9 at 2048, 14.5 at 3072 and 4096, 14.1 at 6144 (one
/// thread); at two threads 2048 and 3072 alike (27.5), 4096 and more
/// worse. On AMD Zen 5, one stream, one thread, whole 1B Q6_K model
/// decoding (`hearth bench -p 0 -n 64 -r 3`, two rounds, tokens/s): 3072
/// bytes ahead 24.8-24.9, 6144 32.8-33.6, 8192 32.7-33.4, 12288
/// 30.9-31.3 (two streams of 3072: 28.9-29.2).
const Q6K_AHEAD: usize = 3072;

/// `H` whole groups of 16 Q6_K rows in [`Layout::Bands`](crate::backend::cpu::kernels::Layout::Bands) (`w`, each of
/// `nb` block steps; the 16 rows' `d`, then 52 words: 32 of `ql`, 16 of
/// `qh`, 4 of the i8 sub-block scales) by one activation row `a`, results
/// at `out[r * rs]`, row `16 h + r` in lane `r` of `acc[h]`, each group's
/// stream prefetched [`q6k_ahead`] bytes ahead.
///
/// Per block step and group: each word of `ql` and its word of `qh` give
/// four registers of 6-bit quants plus 32 (a shift and two masks each),
/// and their `vpdpbusd` chains the 16 sub-blocks' exact sums, which meet
/// their sign-extended scales in `vpmulld`; the offset of 32 comes back as
/// `32 * sum(sc * bsum)` from `vpdpwssd`. Then `gemm16.rs`'s float
/// operations: `acc += (s1 * d) * d8`.
///
/// # Safety
/// AVX-512 VNNI as in `gemm16::run`; `w` holds `H` whole groups of `nb`
/// block steps; `out` is valid for every index written.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn one_token_bands_q6k<const H: usize>(
    w: *const u8,
    nb: usize,
    a: &[BlockQ8K],
    out: *mut f32,
    rs: usize,
) {
    const ROWS: usize = BAND_ROWS;
    let step = ROWS * size_of::<BlockQ6K>();
    let group = nb * step;
    let (m4, m33) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(0x33));
    let mut acc = [_mm512_setzero_ps(); H];
    for (b, by) in a.iter().enumerate().take(nb) {
        let bs = |j: usize| i32::from(by.bsums[j]);
        let pair = |lo: usize, hi: usize| _mm512_set1_epi32((bs(lo) & 0xFFFF) | (bs(hi) << 16));
        let d8 = _mm512_set1_ps(by.d);
        for (h, acc) in acc.iter_mut().enumerate() {
            let q8 = std::hint::black_box(by.qs.as_ptr());
            let act = |at: usize| act4(q8, at);
            let p = w.add(h * group + b * step);
            // Lines 0..5 here, 5..53 three per step of `k` below.
            let pf = |line: usize| prefetch_line(p, q6k_ahead(H), line);
            (0..5).for_each(&pf);
            let word = |k: usize| _mm512_loadu_si512(p.add(2 * ROWS + 4 * ROWS * k).cast());
            let scales: [__m512i; 4] = std::array::from_fn(|k| word(48 + k));
            // Sub-block j's scale, sign-extended, in every row's lane.
            let scale = |j: usize| {
                let v = scales[j / 4];
                let top = match j % 4 {
                    0 => _mm512_slli_epi32::<24>(v),
                    1 => _mm512_slli_epi32::<16>(v),
                    2 => _mm512_slli_epi32::<8>(v),
                    _ => v,
                };
                _mm512_srai_epi32::<24>(top)
            };
            let mut t1 = _mm512_setzero_si512();
            for n in 0..2 {
                // Half n: ggml's `ql[l]`, `ql[l + 32]` and `qh[l]` for
                // l = 4k..4k + 4 give values l, l + 32, l + 64 and l + 96
                // of the half, in sub-blocks k / 4 + 0, 2, 4 and 6.
                let mut s = [_mm512_setzero_si512(); 8];
                for k in 0..8 {
                    (0..3).for_each(|l| pf(5 + 24 * n + 3 * k + l));
                    let (lo, hi, qh) =
                        (word(16 * n + k), word(16 * n + 8 + k), word(32 + 8 * n + k));
                    // Each byte of `qh` holds four 2-bit fields. `a` keeps
                    // fields 0 and 2 (bits 0-1, 4-5), `b` fields 1 and 3
                    // moved down to the same places; shifting either left
                    // by 4 brings its low field to bits 4-5 with zeros above
                    // (what spills into the next byte lands in the nibble
                    // the select takes from the quants).
                    let a = _mm512_and_si512(qh, m33);
                    let b = _mm512_and_si512(_mm512_srli_epi16::<2>(qh), m33);
                    // Bits 0-3 from `q`, 4-7 from `bits`.
                    let six =
                        |q: __m512i, bits: __m512i| _mm512_ternarylogic_epi32::<0xE4>(q, bits, m4);
                    let u = [
                        six(lo, _mm512_slli_epi16::<4>(a)),
                        six(hi, _mm512_slli_epi16::<4>(b)),
                        six(_mm512_srli_epi16::<4>(lo), a),
                        six(_mm512_srli_epi16::<4>(hi), b),
                    ];
                    let y = 128 * n + 4 * k;
                    for (i, u) in u.iter().enumerate() {
                        let j = k / 4 + 2 * i;
                        s[j] = _mm512_dpbusd_epi32(s[j], *u, act(y + 32 * i));
                    }
                }
                for (j, sj) in s.iter().enumerate() {
                    t1 = _mm512_add_epi32(t1, _mm512_mullo_epi32(*sj, scale(8 * n + j)));
                }
            }
            // The offset: 32 * sum(sc_j * bsums_j), scales as i16 pairs.
            let mut t2 = _mm512_setzero_si512();
            for (k, v) in scales.iter().enumerate() {
                let even = _mm512_srai_epi16::<8>(_mm512_slli_epi16::<8>(*v));
                let odd = _mm512_srai_epi16::<8>(*v);
                t2 = _mm512_dpwssd_epi32(t2, even, pair(4 * k, 4 * k + 2));
                t2 = _mm512_dpwssd_epi32(t2, odd, pair(4 * k + 1, 4 * k + 3));
            }
            let s1 = _mm512_sub_epi32(t1, _mm512_slli_epi32::<5>(t2));
            let d = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
            let m = _mm512_mul_ps(_mm512_cvtepi32_ps(s1), d);
            *acc = _mm512_add_ps(*acc, _mm512_mul_ps(m, d8));
        }
    }
    store_groups(&acc, out, rs);
}
