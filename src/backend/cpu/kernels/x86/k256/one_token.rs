//! One-token passes on AVX-512 VNNI in the arithmetic of the 16-token
//! kernels (`tiles16.rs`): a band of eight weight rows against one
//! activation row, each row's exact block integers folded into one lane
//! of a register ([`fold8`], [`row_sums8`](super::super::lanes::row_sums8)) and then the prefill kernel's
//! float operations applied lane by lane, so that a token's results equal
//! its batch's bit for bit.
//!
//! The one-row dot of the 16-token tiles (`row_dot`, in `mod.rs`) runs one float chain per
//! row, one block at a time, and its integer part sums each 32-element
//! sub-block horizontally: one token of IQ4_XS read ~11 GB/s from DRAM that way,
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

use super::super::lanes::{fold8, gather_f16, BAND};
use super::super::tiling::prefetch_share;
use super::dots::{k4_scales_mins_v, q3_scales};
use crate::quant::blocks::{
    BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K, KVALUES_IQ4NL,
};

/// One activation block laid out for IQ4_XS weights: `q[h][lohi]`, for
/// sub-blocks `4h..4h + 4`, holds in 128-bit lane `k` the 16 quants of
/// sub-block `4h + k` the low (`lohi = 0`) or high nibbles multiply;
/// `corr[h]` holds `128 * sum(q8)` of sub-block `4h + k` in the first
/// i32 of lane `k`, zero elsewhere.
#[repr(C, align(64))]
#[derive(Clone, Copy)]
pub(in super::super) struct XsActs {
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
pub(in super::super) struct K4Acts {
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
pub(in super::super) struct K23Acts {
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
pub(in super::super) trait OneToken: Sized {
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
    /// The CPU features of `tiles16::run`.
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
/// AVX-512 VNNI as in `tiles16::run`; `w` holds 8 rows of `nb` blocks, `a`
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
