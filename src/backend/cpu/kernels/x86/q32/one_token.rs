//! One-token passes of the 32-element formats on AVX-512 VNNI: bands of
//! eight plain rows ([`one_token`]) and whole banded groups of 16 rows
//! ([`one_token_bands`]), in the float operations of `tiles16.rs`'s
//! one-row path, lane by lane.

use std::arch::x86_64::*;

use super::super::lanes::{gather_f16_pairs, prefetch_groups, row_sums8, store_groups};
use super::super::simd::h2f;
use super::super::tiling::prefetch_share;
use super::super::tuning::bands_ahead;
use super::tiles16::BAND;
use super::{halves, hsum, nibble_word, Act, Format, Nibbles, WORDS};
use crate::backend::cpu::kernels::BAND_ROWS;
use crate::quant::blocks::KVALUES_IQ4NL;

/// `H` bands of eight weight rows (`w`, `8 H` rows of `nb` blocks) by one
/// activation row `a` (one token), results at `out[r * rs]`, each block step
/// prefetching `ahead` bytes of the rows after `w`: [`row_dot`]'s
/// float operations lane by lane, row `8 h + r` in lane `r` of `acc[h]`.
///
/// Per block, the eight exact row sums of a band come from
/// [`nibble_sums8`] (four rows' packed bytes per zmm) or, for the other
/// formats, from rows `p` and `p + 4` sharing one zmm `vpdpbusd` folded by
/// [`row_sums8`]; the rows' f16 scales come in by one hardware gather per
/// band and block ([`gather_f16_pairs`], `offsets`: [`row_offsets8`] of
/// the row length). With `H = 2` each block step's activation work serves
/// 16 rows.
///
/// # Safety
/// AVX-512 VNNI as in [`run`]; `out` is valid for every index written.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn one_token<W: Format, const H: usize>(
    w: &[W],
    nb: usize,
    a: &[W::A],
    ahead: usize,
    offsets: __m256i,
    out: *mut f32,
    rs: usize,
) {
    if w.len() < H * BAND * nb || a.len() < nb {
        return;
    }
    // Raw pointers: a block step reads up to 48 weight blocks, each slice
    // index a bounds check in the hot loop. SAFETY: `w` holds `8 H` rows
    // of `nb` blocks (checked above), so `wp.add(r * nb + b)` for
    // r < 8 H, b < nb stays inside it.
    let wp = w.as_ptr();
    let at = |r: usize, b: usize| unsafe { &*wp.add(r * nb + b) };
    let mut acc = [_mm256_setzero_ps(); H];
    let (z, ones) = (_mm512_setzero_si512(), _mm256_set1_epi8(1));
    for (b, by) in a.iter().enumerate().take(nb) {
        let q8 = _mm256_loadu_si256(by.qs().as_ptr().cast());
        // The next bands in address order, a block step's share per step:
        // eight rows read block by block are eight slow streams the
        // hardware prefetchers do not keep ahead of (measured: Q8_0 one-token passes
        // from DRAM 10 -> 29 GB/s with this, Q4_0 5.6 -> 14.5).
        prefetch_share(wp.add(H * BAND * nb).cast(), ahead, b);
        let bias = if W::BIAS != 0 {
            W::BIAS * hsum(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q8))
        } else {
            0
        };
        let (d8, s8) = (_mm256_set1_ps(h2f(by.d())), _mm256_set1_ps(h2f(by.s())));
        for (h, acc) in acc.iter_mut().enumerate() {
            let row = |r: usize| at(8 * h + r, b);
            let mut isum = if W::NIBBLES == Nibbles::No {
                let q8x2 = _mm512_broadcast_i64x4(q8);
                let mut prods = [z; 4];
                for (p, prod) in prods.iter_mut().enumerate() {
                    let (lo, hi) = (row(p).decode().0, row(p + 4).decode().0);
                    let u = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                    *prod = _mm512_dpbusd_epi32(z, u, q8x2);
                }
                row_sums8(prods)
            } else {
                nibble_sums8(|r| row(r).qs16(), |r| row(r).qh32(), by.qs(), W::NIBBLES)
            };
            if W::BIAS != 0 {
                isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(bias));
            }
            // `d` is each block's first two bytes, `m` the next two (`format!`).
            let (dw, mw) = gather_f16_pairs(at(8 * h, b) as *const W as *const u8, offsets);
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, d8), *acc);
            if W::MIN {
                *acc = _mm256_fmadd_ps(mw, s8, *acc);
            }
        }
    }
    for (h, acc) in acc.iter().enumerate() {
        let mut v = [0.0f32; BAND];
        _mm256_storeu_ps(v.as_mut_ptr(), *acc);
        for (r, &x) in v.iter().enumerate() {
            *out.add((8 * h + r) * rs) = x;
        }
    }
}

/// The eight exact row sums `sum(u * q8)` of one block of a nibble format
/// of `kind` (`qs(r)`: row `r`'s 16 packed bytes; with [`Nibbles::Levels`]
/// they index IQ4_NL's levels, taken as `level + 128`), row `r` in lane `r`.
///
/// Four rows' bytes fill one zmm (a row per 128-bit lane), so one mask and
/// one shift give their low and high nibbles, and two `vpdpbusd` against
/// the activations' halves broadcast to every lane give four lanes per row.
/// With [`Nibbles::Fifth`] (Q5_0: `qh(r)` holds row `r`'s fifth bits, bit
/// `j` for value `j`; unused for the other kinds), the four rows' bits
/// become one byte mask per half in vector registers, and one masked add
/// puts 16 in the bytes they select: the 32 bytes built per row by
/// `q5_quants` cost more than the rest of the block step together, and
/// masks assembled in general registers were bound by their shifts.
///
/// # Safety
/// AVX-512 VNNI as in [`run`]; each `qs(r)` points at 16 readable bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn nibble_sums8(
    qs: impl Fn(usize) -> *const u8,
    qh: impl Fn(usize) -> u32,
    q8: &[i8; 32],
    kind: Nibbles,
) -> __m256i {
    let m4 = _mm512_set1_epi8(0x0F);
    let alo = _mm512_broadcast_i32x4(_mm_loadu_si128(q8.as_ptr().cast()));
    let ahi = _mm512_broadcast_i32x4(_mm_loadu_si128(q8.as_ptr().add(16).cast()));
    let table = _mm512_broadcast_i32x4(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
    let mut z = [_mm512_setzero_si512(); 2];
    for (h, zh) in z.iter_mut().enumerate() {
        let row = |k: usize| _mm_loadu_si128(qs(4 * h + k).cast());
        let mut v = _mm512_castsi128_si512(row(0));
        v = _mm512_inserti32x4::<1>(v, row(1));
        v = _mm512_inserti32x4::<2>(v, row(2));
        v = _mm512_inserti32x4::<3>(v, row(3));
        let mut lo = _mm512_and_si512(v, m4);
        let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
        if kind == Nibbles::Fifth {
            // Row 4h + k's bits in every u32 of lane k; byte j of a lane
            // then takes the byte of bit j (lo: 0..16, hi: 16..32), and a
            // test against 1 << (j % 8) selects the bytes to add 16 to.
            let bits = _mm_setr_epi32(
                qh(4 * h) as i32,
                qh(4 * h + 1) as i32,
                qh(4 * h + 2) as i32,
                qh(4 * h + 3) as i32,
            );
            let lanes = _mm512_permutexvar_epi32(
                _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                _mm512_castsi128_si512(bits),
            );
            let spread = |b0: i8| {
                let b1 = b0 + 1;
                _mm512_shuffle_epi8(
                    lanes,
                    _mm512_broadcast_i32x4(_mm_setr_epi8(
                        b0, b0, b0, b0, b0, b0, b0, b0, b1, b1, b1, b1, b1, b1, b1, b1,
                    )),
                )
            };
            let select = _mm512_set1_epi64(0x8040_2010_0804_0201u64 as i64);
            let sixteen = _mm512_set1_epi8(0x10);
            lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(spread(0), select), lo, sixteen);
            hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(spread(2), select), hi, sixteen);
        }
        if kind == Nibbles::Levels {
            let flip = _mm512_set1_epi8(i8::MIN);
            lo = _mm512_xor_si512(_mm512_shuffle_epi8(table, lo), flip);
            hi = _mm512_xor_si512(_mm512_shuffle_epi8(table, hi), flip);
        }
        let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, alo);
        *zh = _mm512_dpbusd_epi32(s, hi, ahi);
    }
    // Per 128-bit lane k: [r_k a+c, r_k+4 a+c, r_k b+d, r_k+4 b+d], then
    // row k's and row k + 4's sums in elements 0 and 1.
    let u = _mm512_add_epi32(
        _mm512_unpacklo_epi32(z[0], z[1]),
        _mm512_unpackhi_epi32(z[0], z[1]),
    );
    let v = _mm512_add_epi32(u, _mm512_shuffle_epi32::<0b01_00_11_10>(u));
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castsi512_si256(_mm512_permutexvar_epi32(idx, v))
}

/// `H` whole groups of 16 weight rows in [`Layout::Bands`] (`w`, each of
/// `nb` block steps) by one activation row `a` (one token), results at
/// `out[r * rs]`, each group's stream prefetched [`bands_ahead`] bytes
/// ahead: [`row_dot`]'s float operations lane by lane, row `16 h + r` in
/// lane `r` of `acc[h]`.
///
/// Per block step of a group: its 16 `d` (and `m`) are one conversion, and
/// each 64-byte word of quants one load, whose low (and high) nibbles, or
/// bytes, one `vpdpbusd` against that word of the activations broadcast
/// multiplies, the 16 rows' partial sums landing in their lanes. Nothing
/// is gathered, inserted or folded across lanes.
///
/// # Safety
/// AVX-512 VNNI as in [`run`]; `w` holds `H` whole groups of `nb` block
/// steps; `out` is valid for every index written.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(super) unsafe fn one_token_bands<W: Format, const H: usize>(
    w: *const u8,
    nb: usize,
    a: &[W::A],
    out: *mut f32,
    rs: usize,
) {
    if a.len() < nb {
        return;
    }
    let step = BAND_ROWS * size_of::<W>();
    let group = nb * step;
    let words = 2 * BAND_ROWS * halves::<W>();
    let flip = _mm512_set1_epi8(i8::MIN);
    let ones = _mm256_set1_epi8(1);
    let mut acc = [_mm512_setzero_ps(); H];
    for (b, by) in a.iter().enumerate().take(nb) {
        let q8 = by.qs();
        prefetch_groups::<H>(w.wrapping_add(b * step), group, step, bands_ahead(H));
        let x: [__m512i; WORDS] = std::array::from_fn(|k| {
            _mm512_set1_epi32(i32::from_le_bytes([
                q8[4 * k] as u8,
                q8[4 * k + 1] as u8,
                q8[4 * k + 2] as u8,
                q8[4 * k + 3] as u8,
            ]))
        });
        let bias = if W::BIAS != 0 {
            let q = _mm256_loadu_si256(q8.as_ptr().cast());
            _mm512_set1_epi32(W::BIAS * hsum(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q)))
        } else {
            _mm512_setzero_si512()
        };
        let (d8, s8) = (_mm512_set1_ps(h2f(by.d())), _mm512_set1_ps(h2f(by.s())));
        for (h, acc) in acc.iter_mut().enumerate() {
            let p = w.add(h * group + b * step);
            let q = p.add(words);
            let word = |k: usize| _mm512_loadu_si512(q.add(4 * BAND_ROWS * k).cast());
            let (mut s0, mut s1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            if W::NIBBLES == Nibbles::No {
                // Q8_0: the quants plus 128 as unsigned bytes.
                for k in (0..WORDS).step_by(2) {
                    s0 = _mm512_dpbusd_epi32(s0, _mm512_xor_si512(word(k), flip), x[k]);
                    s1 = _mm512_dpbusd_epi32(s1, _mm512_xor_si512(word(k + 1), flip), x[k + 1]);
                }
            } else {
                // Word c's low nibbles are quants 4c..4c + 4, its high
                // ones 16 + 4c..20 + 4c. Q5_0's words follow its `qh`.
                let fifth = W::NIBBLES == Nibbles::Fifth;
                let qh = if fifth {
                    word(0)
                } else {
                    _mm512_setzero_si512()
                };
                for c in 0..WORDS / 2 {
                    // Q4_0/Q4_1's high nibbles in place, `16 q` (at most
                    // 240): one mask, and `s1` is 16 times the sum.
                    let (lo, hi) = nibble_word::<W>(word(c + usize::from(fifth)), qh, c, true);
                    s0 = _mm512_dpbusd_epi32(s0, lo, x[c]);
                    s1 = _mm512_dpbusd_epi32(s1, hi, x[c + WORDS / 2]);
                }
            }
            if W::NIBBLES == Nibbles::Plain {
                // Exact: each term is `16 q` times an activation.
                s1 = _mm512_srai_epi32::<4>(s1);
            }
            let isum = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), bias);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, d8), *acc);
            if W::MIN {
                let mw = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * BAND_ROWS).cast()));
                *acc = _mm512_fmadd_ps(mw, s8, *acc);
            }
        }
    }
    store_groups(&acc, out, rs);
}
