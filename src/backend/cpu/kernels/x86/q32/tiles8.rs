//! Prefill of the 32-element formats (Q4_0, Q4_1, Q5_0, Q8_0, IQ4_NL) on
//! AVX2 with 8 activation rows per register: the scheme of
//! `tiles16.rs` without VNNI. The activations of up to 64 tokens are
//! transposed once per call so that a ymm register holds the same four
//! values of 8 tokens; four weight bytes broadcast to every lane then make
//! one `maddubs` worth 32 products, each lane a different token, with no
//! horizontal sums. A band of 8 weight rows is decoded once per block and
//! shared by every group of 8 tokens.
//!
//! `maddubs` sums pairs of u8 x i8 products into i16, so how far a sum may
//! stay in i16 depends on the largest weight byte:
//! - the nibble formats (`u <= 15`) add a block's eight words in i16
//!   (at most `8 * 2 * 15 * 128 = 30720`) and widen them once per block;
//!   Q5_0 (`u <= 31`) widens every four words;
//! - the signed formats (Q8_0, IQ4_NL: `q` in -128..=127) move the
//!   weight's sign onto the activations (`|q| <= 128`, pairs within i16)
//!   and widen every word: `q + 128` would saturate the pairs.
//!
//! Per (row, token) pair and block the arithmetic is `tiles16.rs`'s:
//! the exact `isum = sum(q * q8)`, then `acc = fma(isum, d * d8, acc)` and,
//! for Q4_1, `acc = fma(m, s8, acc)`, block by block. The one-token kernel
//! ([`one_token`]) and the one-row path ([`row_dot`]) do the same
//! operations in the same order, so a token's results are bit for bit
//! independent of the batch it is in (and equal to the AVX-512 kernels').

use std::arch::x86_64::*;
use std::cell::Cell;

use super::super::lanes::gather_f16;
use super::super::simd::{h2f, hsum};
use super::super::tiling::{gemm_shape, prefetch_share};
use super::{pack, Act, Format, Packed};
use crate::backend::cpu::kernels::{blocks, GemmFn, Out};
use crate::quant::blocks::{BlockIQ4NL, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8_0};
use crate::quant::GgmlType;

/// Tokens per ymm register.
pub(in super::super) const GROUP: usize = 8;
/// Weight rows per band.
pub(in super::super) const BAND: usize = 8;
/// Groups of tokens per pass over a band's weights (64 tokens).
pub(in super::super) const GROUPS: usize = 8;
/// 4-byte groups per 32-element block.
const WORDS: usize = 8;

thread_local! {
    /// Transposed activations, reused across calls on each thread.
    static PACKED: Cell<Packed> = Cell::new(Packed::default());
}

/// The banded kernel of weight type `ty`, `None` where there is none.
/// Q5_1 stays on the eight-lane tiles (`x86/lane_tiles.rs`), as on AVX-512 (`tiles16.rs` says why).
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
        GgmlType::Q4_0 => entry!(BlockQ4_0),
        GgmlType::Q4_1 => entry!(BlockQ4_1),
        GgmlType::Q5_0 => entry!(BlockQ5_0),
        GgmlType::Q8_0 => entry!(BlockQ8_0),
        GgmlType::IQ4_NL => entry!(BlockIQ4NL),
        _ => return None,
    };
    Some(f)
}

/// Whether `W`'s decoded bytes are `q + 128` of signed quants, which the
/// kernels take back to `q` (see the module notes).
const fn signed<W: Format>() -> bool {
    W::U_MAX > 127
}

/// The [`GemmFn`] of format `W`: one token through [`one_token`], more in
/// bands of 8 rows by groups of 8 tokens, the rows past the last band
/// through [`row_dot`].
///
/// # Safety
/// The CPU must have AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<W: Format>(w: &[u8], row_bytes: usize, a: &[u8], act_bytes: usize, out: Out<'_>) {
    let Some((nb, rows, toks)) = gemm_shape::<W, W::A>(w, row_bytes, a, act_bytes, &out) else {
        return;
    };
    let wb = blocks::<W>(&w[..rows * row_bytes]);
    let ab = blocks::<W::A>(&a[..toks * act_bytes]);
    let (rs, ts, op) = (out.row_stride, out.tok_stride, out.out.as_mut_ptr());
    let banded = rows / BAND * BAND;
    if toks == 1 {
        // Two bands per pass: the activations' share of a block step
        // serves 16 rows, and two rows' float chains run side by side.
        let mut r0 = 0;
        while r0 < banded {
            let h = ((banded - r0) / BAND).min(2);
            let band_w = &wb[r0 * nb..(r0 + h * BAND) * nb];
            let ahead = h * BAND * size_of::<W>();
            let o = op.add(r0 * rs);
            // SAFETY: rows r0..r0 + 8 h exist; `out.fits(rows, 1)` bounds
            // every index written.
            unsafe {
                if h == 2 {
                    one_token::<W, 2>(band_w, nb, &ab, ahead, o, rs)
                } else {
                    one_token::<W, 1>(band_w, nb, &ab, ahead, o, rs)
                }
            };
            r0 += h * BAND;
        }
    } else if banded > 0 {
        let mut p = PACKED.take();
        for t0 in (0..toks).step_by(GROUPS * GROUP) {
            let tn = (toks - t0).min(GROUPS * GROUP);
            pack::<_, GROUP>(&ab, nb, t0, tn, &mut p);
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

/// Eight i32 lanes summing to `sum(q * q8)` of one block, `u` decoded by
/// [`Format::decode`] (for the unsigned formats, before the bias).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn lanes<W: Format>(u: __m256i, q8: __m256i) -> __m256i {
    let ones = _mm256_set1_epi16(1);
    let pairs = if signed::<W>() {
        let q = _mm256_xor_si256(u, _mm256_set1_epi8(i8::MIN));
        _mm256_maddubs_epi16(_mm256_abs_epi8(q), _mm256_sign_epi8(q8, q))
    } else {
        _mm256_maddubs_epi16(u, q8)
    };
    _mm256_madd_epi16(pairs, ones)
}

/// `BIAS * sum(q8)`: what an unsigned format's `sum(u * q8)` exceeds
/// `sum(q * q8)` by (0 for the signed formats, whose lanes are `q`'s).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn bias<W: Format>(q8: __m256i) -> i32 {
    if signed::<W>() || W::BIAS == 0 {
        return 0;
    }
    let sums = _mm256_maddubs_epi16(_mm256_set1_epi8(1), q8);
    W::BIAS * hsum(_mm256_madd_epi16(sums, _mm256_set1_epi16(1)))
}

/// One weight row by one activation row, in the banded kernel's arithmetic.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn row_dot<W: Format>(w: &[W], a: &[W::A]) -> f32 {
    let mut acc = 0.0f32;
    for (bx, by) in w.iter().zip(a) {
        let (u, d, m) = bx.decode();
        let q8 = _mm256_loadu_si256(by.qs().as_ptr().cast());
        let isum = hsum(lanes::<W>(u, q8)) - bias::<W>(q8);
        acc = (isum as f32).mul_add(d * h2f(by.d()), acc);
        if W::MIN {
            acc = m.mul_add(h2f(by.s()), acc);
        }
    }
    acc
}

/// The lane sums of eight vectors: lane `r` of the result is the sum of
/// the eight lanes of `v[r]` (exact: integer adds).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn row_sums8(v: [__m256i; 8]) -> __m256i {
    // Per 128-bit half: [v0, v1, v2, v3] (then v4..v8) summed over its four lanes.
    let h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[0], v[1]), _mm256_hadd_epi32(v[2], v[3]));
    let h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(v[4], v[5]), _mm256_hadd_epi32(v[6], v[7]));
    _mm256_add_epi32(
        _mm256_permute2x128_si256::<0x20>(h0, h1),
        _mm256_permute2x128_si256::<0x31>(h0, h1),
    )
}

/// `H` bands of eight weight rows (`w`, `8 H` rows of `nb` blocks) by one
/// activation row `a` (one token), results at `out[r * rs]`, each block step
/// prefetching `ahead` bytes of the rows after `w`: [`row_dot`]'s float
/// operations lane by lane, row `8 h + r` in lane `r` of `acc[h]`.
///
/// # Safety
/// AVX2, FMA and F16C; `out` is valid for every index written.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn one_token<W: Format, const H: usize>(
    w: &[W],
    nb: usize,
    a: &[W::A],
    ahead: usize,
    out: *mut f32,
    rs: usize,
) {
    if w.len() < H * BAND * nb || a.len() < nb {
        return;
    }
    // Raw pointers: a block step reads 8 H weight blocks, each slice index
    // a bounds check in the hot loop. SAFETY: `w` holds `8 H` rows of `nb`
    // blocks (checked above), so `wp.add(r * nb + b)` for r < 8 H, b < nb
    // stays inside it.
    let wp = w.as_ptr();
    let at = |r: usize, b: usize| unsafe { &*wp.add(r * nb + b) };
    let mut acc = [_mm256_setzero_ps(); H];
    for (b, by) in a.iter().enumerate().take(nb) {
        let q8 = _mm256_loadu_si256(by.qs().as_ptr().cast());
        // The next bands in address order, a block step's share per step
        // (eight rows read side by side are slow streams the hardware
        // prefetchers do not keep ahead of; see `prefetch_share`).
        prefetch_share(wp.add(H * BAND * nb).cast(), ahead, b);
        let bias = _mm256_set1_epi32(bias::<W>(q8));
        let (d8, s8) = (_mm256_set1_ps(h2f(by.d())), _mm256_set1_ps(h2f(by.s())));
        for (h, acc) in acc.iter_mut().enumerate() {
            let row = |r: usize| at(8 * h + r, b);
            let v: [__m256i; BAND] = std::array::from_fn(|r| lanes::<W>(row(r).decode().0, q8));
            let isum = _mm256_sub_epi32(row_sums8(v), bias);
            let dw = gather_f16(|r| row(r).dm_bits().0);
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, d8), *acc);
            if W::MIN {
                let mw = gather_f16(|r| row(r).dm_bits().1);
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

/// Eight weight rows (`w`, 8 rows of `nb` blocks) by the `tn` packed tokens
/// of `p`, results at `out[r * rs + t * ts]`.
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
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); BAND]; GROUPS];
    // Per row and word: the unsigned bytes, or for the signed formats
    // the quants' magnitudes (`mag`) and the quants (`q`, their signs).
    let mut q = [[0u32; WORDS]; BAND];
    let mut mag = [[0u32; WORDS]; BAND];
    let mut dw = [0.0f32; BAND];
    let mut mw = [0.0f32; BAND];
    // Words per i16 sum of the unsigned formats (see the module notes).
    let chunk = if W::U_MAX <= 15 { WORDS } else { 4 };
    for b in 0..nb {
        for r in 0..BAND {
            let (u, d, m) = w[r * nb + b].decode();
            if signed::<W>() {
                let s = _mm256_xor_si256(u, _mm256_set1_epi8(i8::MIN));
                _mm256_storeu_si256(q[r].as_mut_ptr().cast(), s);
                _mm256_storeu_si256(mag[r].as_mut_ptr().cast(), _mm256_abs_epi8(s));
            } else {
                _mm256_storeu_si256(q[r].as_mut_ptr().cast(), u);
            }
            (dw[r], mw[r]) = (d, m);
        }
        for g in 0..ng {
            let gb = g * nb + b;
            let codes = p.codes.as_ptr().add(gb * WORDS * GROUP);
            let code = |k: usize| _mm256_loadu_si256(codes.add(k * GROUP).cast());
            let mut lanes = [_mm256_setzero_si256(); BAND];
            if signed::<W>() {
                for k in 0..WORDS {
                    let c = code(k);
                    for r in 0..BAND {
                        let s = _mm256_sign_epi8(c, _mm256_set1_epi32(q[r][k] as i32));
                        let pr = _mm256_maddubs_epi16(_mm256_set1_epi32(mag[r][k] as i32), s);
                        lanes[r] = _mm256_add_epi32(lanes[r], _mm256_madd_epi16(pr, ones));
                    }
                }
            } else {
                for k0 in (0..WORDS).step_by(chunk) {
                    let mut s16 = [_mm256_setzero_si256(); BAND];
                    for k in k0..k0 + chunk {
                        let c = code(k);
                        for r in 0..BAND {
                            let u = _mm256_set1_epi32(q[r][k] as i32);
                            s16[r] = _mm256_add_epi16(s16[r], _mm256_maddubs_epi16(u, c));
                        }
                    }
                    for r in 0..BAND {
                        lanes[r] = _mm256_add_epi32(lanes[r], _mm256_madd_epi16(s16[r], ones));
                    }
                }
                if W::BIAS != 0 {
                    let sum = _mm256_loadu_si256(p.sums.as_ptr().add(gb * GROUP).cast());
                    let bias = _mm256_mullo_epi32(sum, _mm256_set1_epi32(W::BIAS));
                    for l in lanes.iter_mut() {
                        *l = _mm256_sub_epi32(*l, bias);
                    }
                }
            }
            let d8 = _mm256_loadu_ps(p.d.as_ptr().add(gb * GROUP));
            let s8 = _mm256_loadu_ps(p.s.as_ptr().add(gb * GROUP));
            for r in 0..BAND {
                let scale = _mm256_mul_ps(_mm256_set1_ps(dw[r]), d8);
                acc[g][r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(lanes[r]), scale, acc[g][r]);
                if W::MIN {
                    acc[g][r] = _mm256_fmadd_ps(_mm256_set1_ps(mw[r]), s8, acc[g][r]);
                }
            }
        }
    }
    store(&acc, tn, out, rs, ts);
}

/// Writes a band's sums `acc[g][r]` (lane `j`: token `8g + j`) of `tn`
/// tokens to `out[r * rs + t * ts]` (this file's and `k256/tiles8.rs`'s bands).
///
/// # Safety
/// AVX2; `out` is valid for every index written.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(in super::super) unsafe fn store(
    acc: &[[__m256; BAND]; GROUPS],
    tn: usize,
    out: *mut f32,
    rs: usize,
    ts: usize,
) {
    let mut lanes = [[0.0f32; GROUP]; BAND];
    for (g, accg) in acc.iter().enumerate().take(tn.div_ceil(GROUP)) {
        for (l, v) in lanes.iter_mut().zip(accg) {
            _mm256_storeu_ps(l.as_mut_ptr(), *v);
        }
        let n = (tn - g * GROUP).min(GROUP);
        for (r, l) in lanes.iter().enumerate() {
            for (j, &x) in l.iter().enumerate().take(n) {
                *out.add(r * rs + (g * GROUP + j) * ts) = x;
            }
        }
    }
}
