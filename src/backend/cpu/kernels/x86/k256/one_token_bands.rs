//! One-token passes of the k-quants stored in banded groups of 16 rows
//! ([`Layout::Bands`](crate::backend::cpu::kernels::Layout::Bands): Q4_K,
//! Q6_K, IQ4_XS) on AVX-512 VNNI: one 512-bit load is one word of 16 rows,
//! their partial sums land in lanes, their scales convert in one go, and
//! the 16 rows' float operations are those of `tiles16.rs`'s one-row path,
//! lane by lane.

use std::arch::x86_64::*;

use super::super::lanes::store_groups;
use super::super::tuning::bands_ahead;
use crate::backend::cpu::kernels::BAND_ROWS;
use crate::quant::blocks::{BlockIQ4XS, BlockQ4K, BlockQ6K, BlockQ8K, KVALUES_IQ4NL};

/// Prefetches the 64-byte line that holds byte `ahead + 64 * line` of the
/// block step at `at`. The k-quant passes below issue one per word they load
/// rather than a block step's 36-53 at its head (`prefetch_groups`): a
/// burst that long outruns the L1's dozen fill buffers and stalls the loads
/// behind it. The address is the line's first byte (Q6_K's block step of 16
/// rows, 3360 bytes, starts every second time half a line in; prefetching
/// the middles of the lines read DRAM slower on AMD Zen 5). The
/// measurements are in `docs/perf.md` ("x86 one-token passes").
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
/// sums (`vpdpwssd`) `s2`. Then `tiles16.rs`'s float operations:
/// `acc += (s1 * d - s2 * dmin) * d8`.
///
/// # Safety
/// AVX-512 VNNI as in `tiles16::run`; `w` holds `H` whole groups of `nb`
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
/// `vpmulld`. Then `tiles16.rs`'s float operations: `acc += (s1 * d) * d8`.
///
/// # Safety
/// AVX-512 VNNI as in `tiles16::run`; `w` holds `H` whole groups of `nb`
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

/// The least [`q6k_ahead`]: 3072 bytes, a block step of 16 Q6_K rows
/// (3360 bytes; Q4_K's is 2304) being longer than the others'. It read
/// fastest on Intel Ice Lake (four streams); on AMD Zen 5 (one stream)
/// [`bands_ahead`]'s 8192 reads faster, so the floor does not bind there.
/// The measurements are in `docs/perf.md` ("x86 one-token passes").
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
/// `32 * sum(sc * bsum)` from `vpdpwssd`. Then `tiles16.rs`'s float
/// operations: `acc += (s1 * d) * d8`.
///
/// # Safety
/// AVX-512 VNNI as in `tiles16::run`; `w` holds `H` whole groups of `nb`
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
