//! Prefill of the 256-element formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
//! IQ4_XS) on AVX2 with 8 activation rows per register: the scheme of
//! `tiles16.rs` without VNNI (activations of up to 64 tokens transposed once
//! per call, a broadcast weight word times 8 tokens per `maddubs`, bands of
//! 8 weight rows decoded once per block by `tiles16.rs`'s [`Format`]).
//!
//! Integer part per sub-block: the `maddubs` pairs (u8 weight x i8
//! activation, at most `2 * 63 * 128` for Q6_K) add up in i16 for as many
//! words as cannot overflow ([`chunk`]), then one `madd` with the
//! sub-block's scale widens them into the i32 lanes. IQ4_XS, whose
//! decoded bytes `level + 128` would saturate the pairs, moves the levels'
//! signs onto the activations instead. Every lane is exact, and equals
//! `tiles16.rs`'s `s1` (and, for the formats with mins, `s2`).
//!
//! Per (row, token) pair and block the float arithmetic is `tiles16.rs`'s:
//! `m = s1 * d - s2 * dmin` (one fused step), `acc += m * d8`. One token
//! ([`one_token`]: eight rows in the lanes of a register) and the rows past
//! the last band ([`row_dot`]) do the same operations on the same exact
//! integers, so a token's results are bit for
//! bit independent of the batch it is in (and equal to the AVX-512 kernels').

use std::arch::x86_64::*;
use std::cell::Cell;

use super::super::q32::tiles8::{row_sums8, store, BAND, GROUP, GROUPS};
use super::super::tiling::{gemm_shape, prefetch_share};
use super::{pack, row_dot, Decoded, Format, Packed, PAIRS, WORDS};
use crate::backend::cpu::kernels::{blocks, GemmFn, Out};
use crate::quant::blocks::{
    BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K,
};
use crate::quant::GgmlType;

/// Weight rows per register tile of [`band`].
const TILE_ROWS: usize = 4;

thread_local! {
    /// Transposed activations, reused across calls on each thread.
    static PACKED: Cell<Packed> = Cell::new(Packed::default());
}

/// The banded kernel of weight type `ty`, `None` where there is none.
pub(in super::super) fn gemm(ty: GgmlType) -> Option<GemmFn> {
    /// An entry running [`run`] for block type `$W`.
    macro_rules! entry {
        ($W:ty) => {
            |w: &[u8], rb: usize, a: &[u8], ab: usize, out: Out<'_>| {
                // SAFETY: `x86::gemm` hands this entry out only after
                // detecting AVX2, FMA and F16C.
                unsafe { run::<$W>(w, rb, a, ab, out) }
            }
        };
    }
    let f: GemmFn = match ty {
        GgmlType::Q2_K => entry!(BlockQ2K),
        GgmlType::Q3_K => entry!(BlockQ3K),
        GgmlType::Q4_K => entry!(BlockQ4K),
        GgmlType::Q5_K => entry!(BlockQ5K),
        GgmlType::Q6_K => entry!(BlockQ6K),
        GgmlType::IQ4_XS => entry!(BlockIQ4XS),
        _ => return None,
    };
    Some(f)
}

/// Whether `W`'s decoded bytes are `q + 128` of signed quants (IQ4_XS),
/// which the kernel takes back to `q`.
const fn signed<W: Format>() -> bool {
    W::U_MAX > 127
}

/// Words of an unsigned format whose `maddubs` pairs may add up in i16:
/// each word adds at most `2 * U_MAX * 128` to a lane.
const fn chunk<W: Format>() -> usize {
    let most = (i16::MAX as i32 / (2 * W::U_MAX * 128)) as usize;
    if most < W::SUB {
        most
    } else {
        W::SUB
    }
}

/// The [`GemmFn`] of format `W`: one token through [`one_token`], more in
/// bands of 8 rows by groups of 8 tokens, the rows past the last band
/// through [`row_dot`].
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<W: Format>(w: &[u8], row_bytes: usize, a: &[u8], act_bytes: usize, out: Out<'_>) {
    let Some((nb, rows, toks)) = gemm_shape::<W, BlockQ8K>(w, row_bytes, a, act_bytes, &out) else {
        return;
    };
    let wb = blocks::<W>(&w[..rows * row_bytes]);
    let ab = blocks::<BlockQ8K>(&a[..toks * act_bytes]);
    let (rs, ts, op) = (out.row_stride, out.tok_stride, out.out.as_mut_ptr());
    let banded = rows / BAND * BAND;
    if toks == 1 {
        for r0 in (0..banded).step_by(BAND) {
            let band_w = &wb[r0 * nb..(r0 + BAND) * nb];
            // SAFETY: rows r0..r0 + 8 exist; `out.fits(rows, 1)` bounds
            // every index written.
            unsafe { one_token(band_w, nb, &ab, op.add(r0 * rs), rs) };
        }
    } else if banded > 0 {
        let mut p = PACKED.take();
        for t0 in (0..toks).step_by(GROUPS * GROUP) {
            let tn = (toks - t0).min(GROUPS * GROUP);
            pack::<W, GROUP>(&ab, nb, t0, tn, 0, &mut p);
            for r0 in (0..banded).step_by(BAND) {
                let band_w = &wb[r0 * nb..(r0 + BAND) * nb];
                // SAFETY: rows r0..r0 + 8 and tokens t0..t0 + tn exist;
                // `out.fits(rows, toks)` bounds every index written.
                unsafe { band(band_w, nb, &p, tn, op.add(r0 * rs + t0 * ts), rs, ts) };
            }
        }
        PACKED.set(p);
    }
    for r in banded..rows {
        for t in 0..toks {
            let wr = &wb[r * nb..(r + 1) * nb];
            let ar = &ab[t * nb..(t + 1) * nb];
            // SAFETY: `out.fits(rows, toks)` bounds the index.
            unsafe { *op.add(r * rs + t * ts) = row_dot(wr, ar) };
        }
    }
}

/// Eight weight rows (`w`, 8 rows of `nb` blocks) by the `tn` packed tokens
/// of `p`, results at `out[r * rs + t * ts]`: each block decoded once, then
/// tiles of [`TILE_ROWS`] rows by one group of 8 tokens.
///
/// # Safety
/// AVX2, FMA and F16C; `out` is valid for every index written.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn band<W: Format>(
    w: &[W],
    nb: usize,
    p: &Packed,
    tn: usize,
    out: *mut f32,
    rs: usize,
    ts: usize,
) {
    let ng = tn.div_ceil(GROUP);
    let mut acc = [[_mm256_setzero_ps(); BAND]; GROUPS];
    let mut dec: [Decoded; BAND] = std::array::from_fn(|_| Decoded::zeroed());
    // The signed format's magnitudes, per row and word.
    let mut mag = [[0u32; WORDS]; BAND];
    for b in 0..nb {
        for (r, dr) in dec.iter_mut().enumerate() {
            w[r * nb + b].decode(dr);
            if signed::<W>() {
                for k in (0..WORDS).step_by(8) {
                    let at = dr.q.as_mut_ptr().add(k).cast::<__m256i>();
                    let q = _mm256_xor_si256(_mm256_loadu_si256(at), _mm256_set1_epi8(i8::MIN));
                    _mm256_storeu_si256(at, q);
                    let m = mag[r].as_mut_ptr().add(k).cast::<__m256i>();
                    _mm256_storeu_si256(m, _mm256_abs_epi8(q));
                }
            }
        }
        for g in 0..ng {
            let gb = g * nb + b;
            let codes = p.codes.as_ptr().add(gb * WORDS * GROUP);
            let pairs = p.pairs.as_ptr().add(gb * PAIRS * GROUP);
            let d8 = _mm256_loadu_ps(p.d.as_ptr().add(gb * GROUP));
            for r0 in (0..BAND).step_by(TILE_ROWS) {
                let rows: &[Decoded; TILE_ROWS] = &*dec.as_ptr().add(r0).cast();
                let s1 = if signed::<W>() {
                    let mags: &[[u32; WORDS]; TILE_ROWS] = &*mag.as_ptr().add(r0).cast();
                    signed_sums::<W>(rows, mags, codes)
                } else {
                    unsigned_sums::<W>(rows, codes)
                };
                for (r, dr) in rows.iter().enumerate() {
                    let mut s1 = s1[r];
                    let mut corr = _mm256_setzero_si256();
                    if !signed::<W>() && (W::BIAS != 0 || W::MIN) {
                        for q in 0..W::PAIR_WORDS {
                            let sums = _mm256_loadu_si256(pairs.add(q * GROUP).cast());
                            let coef = _mm256_set1_epi32(dr.coef[q] as i32);
                            corr = _mm256_add_epi32(corr, _mm256_madd_epi16(coef, sums));
                        }
                    }
                    if !signed::<W>() && W::BIAS != 0 {
                        let bias = _mm256_mullo_epi32(corr, _mm256_set1_epi32(W::BIAS));
                        s1 = _mm256_sub_epi32(s1, bias);
                    }
                    let mut m = _mm256_mul_ps(_mm256_cvtepi32_ps(s1), _mm256_set1_ps(dr.d));
                    if W::MIN {
                        m = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(corr), _mm256_set1_ps(dr.dmin), m);
                    }
                    let a = &mut acc[g][r0 + r];
                    *a = _mm256_add_ps(*a, _mm256_mul_ps(m, d8));
                }
            }
        }
    }
    store(&acc, tn, out, rs, ts);
}

/// `sum_s sc_s * sum(u * q8)` of each of four rows over one block, for the
/// eight tokens whose transposed codes start at `codes` (unsigned formats).
///
/// # Safety
/// AVX2, FMA and F16C; `codes` holds a block's `WORDS * GROUP` words.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn unsigned_sums<W: Format>(
    rows: &[Decoded; TILE_ROWS],
    codes: *const u32,
) -> [__m256i; TILE_ROWS] {
    let mut s1 = [_mm256_setzero_si256(); TILE_ROWS];
    for s in 0..WORDS / W::SUB {
        let sc: [__m256i; TILE_ROWS] =
            std::array::from_fn(|r| _mm256_set1_epi16(rows[r].sc[s] as i16));
        for k0 in (W::SUB * s..W::SUB * (s + 1)).step_by(chunk::<W>()) {
            let mut s16 = [_mm256_setzero_si256(); TILE_ROWS];
            for k in k0..k0 + chunk::<W>() {
                let c = _mm256_loadu_si256(codes.add(k * GROUP).cast());
                for (x, dr) in s16.iter_mut().zip(rows) {
                    let u = _mm256_set1_epi32(dr.q[k] as i32);
                    *x = _mm256_add_epi16(*x, _mm256_maddubs_epi16(u, c));
                }
            }
            for r in 0..TILE_ROWS {
                s1[r] = _mm256_add_epi32(s1[r], _mm256_madd_epi16(s16[r], sc[r]));
            }
        }
    }
    s1
}

/// `sum_s sc_s * sum(q * q8)` of each of four rows over one block of the
/// signed format (`rows[r].q` holds the signed quants, `mags[r]` their
/// magnitudes), for the eight tokens at `codes`.
///
/// # Safety
/// AVX2, FMA and F16C; `codes` holds a block's `WORDS * GROUP` words.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn signed_sums<W: Format>(
    rows: &[Decoded; TILE_ROWS],
    mags: &[[u32; WORDS]; TILE_ROWS],
    codes: *const u32,
) -> [__m256i; TILE_ROWS] {
    let mut s1 = [_mm256_setzero_si256(); TILE_ROWS];
    for s in 0..WORDS / W::SUB {
        let sc: [__m256i; TILE_ROWS] =
            std::array::from_fn(|r| _mm256_set1_epi16(rows[r].sc[s] as i16));
        for k in W::SUB * s..W::SUB * (s + 1) {
            let c = _mm256_loadu_si256(codes.add(k * GROUP).cast());
            for r in 0..TILE_ROWS {
                let sign = _mm256_sign_epi8(c, _mm256_set1_epi32(rows[r].q[k] as i32));
                let pr = _mm256_maddubs_epi16(_mm256_set1_epi32(mags[r][k] as i32), sign);
                s1[r] = _mm256_add_epi32(s1[r], _mm256_madd_epi16(pr, sc[r]));
            }
        }
    }
    s1
}

/// Eight weight rows (`w`, 8 rows of `nb` blocks) by one activation row `a`
/// (one token), results at `out[r * rs]`: [`row_dot`]'s operations lane by
/// lane, row `r` in lane `r`, each block step prefetching its share of the
/// next eight rows.
///
/// # Safety
/// AVX2, FMA and F16C; `out` is valid for every index written.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn one_token<W: Format>(w: &[W], nb: usize, a: &[BlockQ8K], out: *mut f32, rs: usize) {
    if w.len() < BAND * nb || a.len() < nb {
        return;
    }
    // SAFETY: `w` holds 8 rows of `nb` blocks (checked above).
    let wp = w.as_ptr();
    let row = |r: usize, b: usize| unsafe { &*wp.add(r * nb + b) };
    let mut acc = _mm256_setzero_ps();
    for (b, by) in a.iter().enumerate().take(nb) {
        prefetch_share(wp.add(BAND * nb).cast(), BAND * size_of::<W>(), b);
        let mut l1 = [_mm256_setzero_si256(); BAND];
        let mut l2 = [_mm256_setzero_si256(); BAND];
        let mut d = [0.0f32; BAND];
        let mut dmin = [0.0f32; BAND];
        for r in 0..BAND {
            (l1[r], l2[r]) = row(r, b).sum_lanes(by);
            (d[r], dmin[r]) = row(r, b).scales();
        }
        let d = _mm256_loadu_ps(d.as_ptr());
        let mut m = _mm256_mul_ps(_mm256_cvtepi32_ps(row_sums8(l1)), d);
        if W::MIN {
            let dmin = _mm256_loadu_ps(dmin.as_ptr());
            m = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(row_sums8(l2)), dmin, m);
        }
        acc = _mm256_add_ps(acc, _mm256_mul_ps(m, _mm256_set1_ps(by.d)));
    }
    let mut v = [0.0f32; BAND];
    _mm256_storeu_ps(v.as_mut_ptr(), acc);
    for (r, &x) in v.iter().enumerate() {
        *out.add(r * rs) = x;
    }
}
