//! The 256-element formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_XS) against
//! Q8_K activations: their block decoding for the banded tiles ([`Format`],
//! [`Decoded`]), the transposed activations ([`Packed`], [`pack`]) and the
//! one-row dot in the tiles' arithmetic ([`row_dot`]); the kernels by kind:
//! - `dots.rs`: per-row dots (AVX2), the table's `vec_dot`;
//! - `tiles16.rs`: AVX-512 VNNI tiles of 16 tokens per register, and the
//!   one-token passes over banded weights they dispatch to;
//! - `unpack.rs`: unpacking a block step of banded weights for those tiles;
//! - `one_token.rs`, `one_token_bands.rs`: AVX-512 one-token passes over
//!   plain rows (bands of eight) and over banded groups of 16 rows;
//! - `tiles8.rs`: AVX2 tiles of 8 tokens per register;
//! - `lane_tiles.rs`: the eight-lane tiles (`x86/lane_tiles.rs`).

pub(super) mod dots;
pub(super) mod lane_tiles;
mod one_token;
mod one_token_bands;
pub(super) mod tiles16;
pub(super) mod tiles8;
mod unpack;

use std::arch::x86_64::*;

use bytemuck::Pod;

use super::q32::dots::iq4_levels;
use super::simd::{h2f, hsum, load32};
use super::tiling::Lines;
use crate::quant::blocks::{
    BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, QK_K,
};
use dots::{
    k45_lanes, k4_min_lanes, k4_scales_mins, lanes_iq4_xs, q2_k_lanes, q2_k_min_lanes, q3_k_lanes,
    q3_scales_array, q6_k_lanes,
};
use one_token::OneToken;

/// 4-byte groups per 256-element block.
pub(super) const WORDS: usize = 64;

/// Transposed activations of up to `GROUPS * GROUP` tokens.
#[derive(Default)]
pub(super) struct Packed {
    /// `[g][b][word][16 tokens]`: four quants of each token per u32.
    pub(super) codes: Lines<u32>,
    /// `[g][b][16 tokens]`: block scales (0 for padding tokens).
    pub(super) d: Lines<f32>,
    /// `[g][b][p][16 tokens]`, `PAIRS` words `p` per block: the sums of
    /// values `2p` and `2p + 1` of [`Format::PAIR_ELEMS`] each, as i16 pairs.
    pub(super) pairs: Lines<u32>,
}

/// Words of activation-sum pairs per block and token in [`Packed::pairs`].
pub(super) const PAIRS: usize = 8;

/// Decoded weight block: unsigned bytes `u = q + BIAS` (as 64 words),
/// sub-block scales, the coefficients of the block's correction term as
/// i16 pairs, `d` and `dmin`.
///
/// The correction is `sum_p coef_p * sums_p` over the activation sums of
/// [`Format::PAIR_ELEMS`] values: the mins against 32-value sums for the
/// formats with mins (`s2`), the scales against the sub-block sums for
/// those with a bias (`s1 -= BIAS * correction`, which is
/// `sum_s sc_s * (sum(u * q8) - BIAS * sum(q8))` regrouped).
pub(super) struct Decoded {
    pub(super) q: [u32; WORDS],
    pub(super) sc: [i32; 16],
    pub(super) coef: [u32; 8],
    pub(super) d: f32,
    pub(super) dmin: f32,
}

impl Decoded {
    /// All zeros.
    pub(super) fn zeroed() -> Self {
        Decoded {
            q: [0; WORDS],
            sc: [0; 16],
            coef: [0; 8],
            d: 0.0,
            dmin: 0.0,
        }
    }
}

/// `lo` and `hi` (each fitting i16) as one word, the i16 pair `vpdpwssd`
/// reads.
#[inline]
fn i16_pair(lo: i32, hi: i32) -> u32 {
    (lo as u16 as u32) | ((hi as u16 as u32) << 16)
}

/// Packs `v[2p], v[2p + 1]` into one word per pair ([`i16_pair`]).
#[inline]
fn i16_pairs<const N: usize>(v: impl Fn(usize) -> i32, out: &mut [u32; 8]) {
    for (p, o) in out.iter_mut().enumerate().take(N) {
        *o = i16_pair(v(2 * p), v(2 * p + 1));
    }
}

/// A weight format of the banded kernel; its one-token band kernel, and
/// whether it has mins, come from [`OneToken`].
pub(super) trait Format: Pod + OneToken {
    /// Words (4 values) per sub-block: 8 (32 values) or 4 (16 values).
    const SUB: usize;
    /// What decoding adds to each quant so that it is unsigned.
    const BIAS: i32;
    /// The largest unsigned byte [`Format::decode`] gives.
    const U_MAX: i32;
    /// Values per activation sum of the correction term: 32 (four i16
    /// pairs per block) or 16 (eight pairs: Q2_K, Q3_K, Q6_K).
    const PAIR_ELEMS: usize;
    /// Words of i16 pairs of those sums per block.
    const PAIR_WORDS: usize = QK_K / Self::PAIR_ELEMS / 2;
    /// Decodes the block into `out`.
    ///
    /// # Safety
    /// The CPU features of [`run`].
    unsafe fn decode(&self, out: &mut Decoded);
    /// The exact `(s1, s2)` of this block and `a` (`s2 = 0` without mins),
    /// and `(d, dmin)`.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn ints(&self, a: &BlockQ8K) -> ((i32, i32), (f32, f32)) {
        let (l1, l2) = self.sum_lanes(a);
        ((hsum(l1), hsum(l2)), self.scales())
    }
    /// Eight i32 lanes each of `s1` and `s2` (zeros without mins): their
    /// sums are [`Format::ints`]'s.
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    unsafe fn sum_lanes(&self, a: &BlockQ8K) -> (__m256i, __m256i);
    /// `(d, dmin)` as f32 (`dmin = 0` without mins).
    ///
    /// # Safety
    /// The CPU must have F16C.
    unsafe fn scales(&self) -> (f32, f32);
}

/// Unsigned nibbles of a Q4_K / Q5_K block in value order (values 64j..
/// are the low nibbles of qs[32j..], 64j + 32.. the high ones), with the
/// fifth bits of `qh` where given.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k45_bytes(qs: &[u8; 128], qh: Option<&[u8; 32]>, q: &mut [u32; WORDS]) {
    let m4 = _mm256_set1_epi8(0x0F);
    for j in 0..4 {
        let v = _mm256_loadu_si256(qs.as_ptr().add(32 * j).cast());
        let mut lo = _mm256_and_si256(v, m4);
        let mut hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), m4);
        if let Some(qh) = qh {
            let bits = _mm256_loadu_si256(qh.as_ptr().cast());
            let fifth = |m: u8| {
                let mask = _mm256_set1_epi8(m as i8);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(bits, mask), mask);
                _mm256_and_si256(set, _mm256_set1_epi8(0x10))
            };
            lo = _mm256_or_si256(lo, fifth(1 << (2 * j)));
            hi = _mm256_or_si256(hi, fifth(1 << (2 * j + 1)));
        }
        let dst = q.as_mut_ptr().add(16 * j).cast::<__m256i>();
        _mm256_storeu_si256(dst, lo);
        _mm256_storeu_si256(dst.add(1), hi);
    }
}

/// Scales and mins of a Q4_K / Q5_K block into `out`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k45_scales(packed: &[u8; 12], out: &mut Decoded) {
    let sm = k4_scales_mins(packed);
    for s in 0..8 {
        out.sc[s] = i32::from(sm[s]);
    }
    i16_pairs::<4>(|j| i32::from(sm[8 + j]), &mut out.coef);
}

impl Format for BlockQ4K {
    const SUB: usize = 8;
    const BIAS: i32 = 0;
    const U_MAX: i32 = 15;
    const PAIR_ELEMS: usize = 32;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(&self, out: &mut Decoded) {
        k45_scales(&self.scales, out);
        (out.d, out.dmin) = (h2f(self.d), h2f(self.dmin));
        k45_bytes(&self.qs, None, &mut out.q);
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sum_lanes(&self, a: &BlockQ8K) -> (__m256i, __m256i) {
        let sm = k4_scales_mins(&self.scales);
        (k45_lanes(&self.qs, None, &sm, a), k4_min_lanes(&sm, a))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(&self) -> (f32, f32) {
        (h2f(self.d), h2f(self.dmin))
    }
}

impl Format for BlockQ5K {
    const SUB: usize = 8;
    const BIAS: i32 = 0;
    const U_MAX: i32 = 31;
    const PAIR_ELEMS: usize = 32;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(&self, out: &mut Decoded) {
        k45_scales(&self.scales, out);
        (out.d, out.dmin) = (h2f(self.d), h2f(self.dmin));
        k45_bytes(&self.qs, Some(&self.qh), &mut out.q);
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sum_lanes(&self, a: &BlockQ8K) -> (__m256i, __m256i) {
        let sm = k4_scales_mins(&self.scales);
        (
            k45_lanes(&self.qs, Some(&self.qh), &sm, a),
            k4_min_lanes(&sm, a),
        )
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(&self) -> (f32, f32) {
        (h2f(self.d), h2f(self.dmin))
    }
}

/// Unsigned 2-bit quants of a Q2_K / Q3_K block in value order (value
/// `128n + 32j + l` is bits `2j, 2j + 1` of `qs[32n + l]`), plus 4 where
/// bit `4n + j` of `hmask[l]` is set (Q3_K).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k23_bytes(qs: &[u8; 64], hmask: Option<&[u8; 32]>, q: &mut [u32; WORDS]) {
    let m3 = _mm256_set1_epi8(3);
    let hm = hmask.map(|h| load32(h.as_ptr()));
    for n in 0..2 {
        let v = load32(qs.as_ptr().add(32 * n));
        for j in 0..4 {
            let mut u = _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * j as i32)), m3);
            if let Some(hm) = hm {
                let bit = _mm256_set1_epi8((1u8 << (4 * n + j)) as i8);
                let set = _mm256_cmpeq_epi8(_mm256_and_si256(hm, bit), bit);
                u = _mm256_or_si256(u, _mm256_and_si256(set, _mm256_set1_epi8(4)));
            }
            let dst = q.as_mut_ptr().add(32 * n + 8 * j).cast::<__m256i>();
            _mm256_storeu_si256(dst, u);
        }
    }
}

impl Format for BlockQ2K {
    const SUB: usize = 4;
    const BIAS: i32 = 0;
    const U_MAX: i32 = 3;
    const PAIR_ELEMS: usize = 16;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(&self, out: &mut Decoded) {
        for (s, &v) in out.sc.iter_mut().zip(&self.scales) {
            *s = i32::from(v & 0xF);
        }
        i16_pairs::<8>(|j| i32::from(self.scales[j] >> 4), &mut out.coef);
        (out.d, out.dmin) = (h2f(self.d), h2f(self.dmin));
        k23_bytes(&self.qs, None, &mut out.q);
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sum_lanes(&self, a: &BlockQ8K) -> (__m256i, __m256i) {
        (q2_k_lanes(self, a), q2_k_min_lanes(self, a))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(&self) -> (f32, f32) {
        (h2f(self.d), h2f(self.dmin))
    }
}

impl Format for BlockQ3K {
    const SUB: usize = 4;
    const BIAS: i32 = 4;
    const U_MAX: i32 = 7;
    const PAIR_ELEMS: usize = 16;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(&self, out: &mut Decoded) {
        let sc = q3_scales_array(&self.scales);
        for (s, &v) in out.sc.iter_mut().zip(&sc) {
            *s = i32::from(v);
        }
        i16_pairs::<8>(|j| i32::from(sc[j]), &mut out.coef);
        out.d = h2f(self.d);
        k23_bytes(&self.qs, Some(&self.hmask), &mut out.q);
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sum_lanes(&self, a: &BlockQ8K) -> (__m256i, __m256i) {
        (q3_k_lanes(self, a), _mm256_setzero_si256())
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(&self) -> (f32, f32) {
        (h2f(self.d), 0.0)
    }
}

impl Format for BlockQ6K {
    const SUB: usize = 4;
    const BIAS: i32 = 32;
    const U_MAX: i32 = 63;
    const PAIR_ELEMS: usize = 16;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(&self, out: &mut Decoded) {
        for (s, &v) in out.sc.iter_mut().zip(&self.scales) {
            *s = i32::from(v);
        }
        i16_pairs::<8>(|j| i32::from(self.scales[j]), &mut out.coef);
        out.d = h2f(self.d);
        let m4 = _mm256_set1_epi8(0x0F);
        for h in 0..2 {
            let qh = _mm256_loadu_si256(self.qh.as_ptr().add(32 * h).cast());
            for c in 0..4 {
                // Values 128h + 32c..: low 4 bits from ql, high 2 from qh.
                let ql = _mm256_loadu_si256(self.ql.as_ptr().add(64 * h + 32 * (c % 2)).cast());
                let ql = if c < 2 {
                    _mm256_and_si256(ql, m4)
                } else {
                    _mm256_and_si256(_mm256_srli_epi16::<4>(ql), m4)
                };
                let hb = match c {
                    0 => _mm256_slli_epi16::<4>(qh),
                    1 => _mm256_slli_epi16::<2>(qh),
                    2 => qh,
                    _ => _mm256_srli_epi16::<2>(qh),
                };
                let hb = _mm256_and_si256(hb, _mm256_set1_epi8(0x30));
                let dst = out.q.as_mut_ptr().add(32 * h + 8 * c).cast::<__m256i>();
                _mm256_storeu_si256(dst, _mm256_or_si256(ql, hb));
            }
        }
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sum_lanes(&self, a: &BlockQ8K) -> (__m256i, __m256i) {
        (q6_k_lanes(self, a), _mm256_setzero_si256())
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(&self) -> (f32, f32) {
        (h2f(self.d), 0.0)
    }
}

impl Format for BlockIQ4XS {
    const SUB: usize = 8;
    const BIAS: i32 = 128;
    const U_MAX: i32 = 255;
    const PAIR_ELEMS: usize = 32;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn decode(&self, out: &mut Decoded) {
        for ib in 0..8 {
            out.sc[ib] = xs_scale(self, ib);
            let qs = &*self.qs.as_ptr().add(16 * ib).cast::<[u8; 16]>();
            // Signed levels + 128: the sign bit flipped.
            let u = _mm256_xor_si256(iq4_levels(qs), _mm256_set1_epi8(i8::MIN));
            _mm256_storeu_si256(out.q.as_mut_ptr().add(8 * ib).cast(), u);
        }
        i16_pairs::<4>(|j| out.sc[j], &mut out.coef);
        out.d = h2f(self.d);
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn sum_lanes(&self, a: &BlockQ8K) -> (__m256i, __m256i) {
        let mut s1 = _mm256_setzero_si256();
        for ib in 0..8 {
            let sc = _mm256_set1_epi32(xs_scale(self, ib));
            s1 = _mm256_add_epi32(s1, _mm256_mullo_epi32(lanes_iq4_xs(self, a, ib), sc));
        }
        (s1, _mm256_setzero_si256())
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn scales(&self) -> (f32, f32) {
        (h2f(self.d), 0.0)
    }
}

/// The signed 6-bit scale of sub-block `ib` of an IQ4_XS block.
#[inline]
fn xs_scale(b: &BlockIQ4XS, ib: usize) -> i32 {
    let low = (b.scales_l[ib / 2] >> (4 * (ib % 2))) & 0xF;
    let high = ((b.scales_h >> (2 * ib)) & 3) as u8;
    i32::from(low | (high << 4)) - 32
}

/// Whether the AVX-512 tiles dot `W`'s quants as signed bytes `q = u -
/// BIAS` against the activations plus 128 (unsigned): the formats with a
/// bias and no mins (Q3_K, Q6_K, IQ4_XS). `sum(q * (a + 128)) - 128 *
/// sum(q)` is `sum(q * a)`, and `128 * sum_s sc_s * sum(q)` is a term of
/// the row alone, so the bias leaves the tile as one subtraction per row
/// and token group instead of the correction's `vpdpwssd` over the
/// activation sums (eight per row and group for the 16-element formats)
/// and its multiply. The integer sums, so the results, do not change.
pub(super) const fn signed_dot<W: Format>() -> bool {
    W::BIAS != 0 && !W::MIN
}

/// What [`pack`] XORs into `W`'s activation codes for these tiles.
pub(super) const fn flip<W: Format>() -> u32 {
    if signed_dot::<W>() {
        0x8080_8080
    } else {
        0
    }
}

/// Transposes tokens `t0..t0 + tn` of `a` (rows of `nb` blocks) into `p`
/// in groups of `G` tokens, padding the last group with zero tokens; each
/// code word XORed with `flip` (`0x8080_8080`: the activations plus 128 as
/// unsigned bytes, [`signed_dot`]).
pub(super) fn pack<W: Format, const G: usize>(
    a: &[BlockQ8K],
    nb: usize,
    t0: usize,
    tn: usize,
    flip: u32,
    p: &mut Packed,
) {
    let ng = tn.div_ceil(G);
    p.codes.zeroed(ng * nb * WORDS * G);
    p.d.zeroed(ng * nb * G);
    p.pairs.zeroed(ng * nb * PAIRS * G);
    // bsums per sum of the correction term: 1 (16 values) or 2 (32).
    let per = W::PAIR_ELEMS / 16;
    for t in 0..tn {
        let (g, j) = (t / G, t % G);
        let row = &a[(t0 + t) * nb..(t0 + t + 1) * nb];
        for (b, by) in row.iter().enumerate() {
            let gb = g * nb + b;
            p.d[gb * G + j] = by.d;
            let sum = |i: usize| -> i32 {
                by.bsums[per * i..per * (i + 1)]
                    .iter()
                    .map(|&v| i32::from(v))
                    .sum()
            };
            for q in 0..W::PAIR_WORDS {
                // |sum| <= 32 * 127: each fits i16.
                p.pairs[(gb * PAIRS + q) * G + j] = i16_pair(sum(2 * q), sum(2 * q + 1));
            }
            for (k, q) in by.qs.chunks_exact(4).enumerate() {
                let word = u32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]);
                p.codes[(gb * WORDS + k) * G + j] = word ^ flip;
            }
        }
    }
}

/// One weight row by one activation row, in the banded kernels' arithmetic
/// (these and `tiles8.rs`'s).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn row_dot<W: Format>(w: &[W], a: &[BlockQ8K]) -> f32 {
    let mut acc = 0.0f32;
    for (bx, by) in w.iter().zip(a) {
        let ((s1, s2), (d, dmin)) = bx.ints(by);
        let m = if W::MIN {
            (-(s2 as f32)).mul_add(dmin, s1 as f32 * d)
        } else {
            s1 as f32 * d
        };
        acc += m * by.d;
    }
    acc
}
