//! Dots and tiles of the float formats (F32, F16, BF16): `R` weight rows by
//! `T` activation rows per pass.
//!
//! Each (row, token) pair keeps the scalar kernel's eight lanes
//! ([`float::LANES`]) in one ymm register and ends as the scalar kernel
//! ends ([`float::f32_dot_end`], ...), so every result equals the scalar
//! per-pair dot bit for bit, and a token alone equals the same token in a
//! batch. Speed comes from the pairs being independent: a single pair is
//! one chain of dependent adds, `R x T` pairs are as many chains side by
//! side.
//!
//! One token reads four weight rows side by side, widening each
//! vector of eight as it goes. Prefill widens the batch's activations
//! (a call holds up to 64 tokens) and each group of four weight rows to
//! f32 once per call and runs f32 tiles over them (widening inside the
//! tiles had held 64 tokens of a 2048 x 8192 matrix at 25 GMAC/s for F16
//! and 15 for BF16, against 32 and 25). AVX-512's prefill tiles hold two
//! tokens' pairs per zmm register: on the Xeon (Emerald Rapids) this was
//! measured on, a 512-bit FMA does twice the work of a 256-bit one in the
//! same time (85 against 44 GMAC/s in a register-only loop). AVX2's hold
//! one pair per ymm.
//!
//! Rounding: F16 products are exact in f32 (11-bit significands, and the
//! smallest product of two f16 subnormals is a normal f32), so an FMA
//! rounds as the scalar multiply-then-add does. F32 and BF16 products can
//! round (BF16: below f32's normal range or past its largest value), so
//! those tiles multiply and add separately, as the scalar kernels do.

use std::arch::x86_64::*;
use std::cell::Cell;

use half::{bf16, f16};

use super::lane_tiles::{drive, Tiles};
use super::tiling::Lines;
use crate::backend::cpu::kernels::{blocks, dot, float, DotFn, GemmFn, Out};
use crate::quant::GgmlType;

thread_local! {
    /// Prefill's widened activations and weight rows, reused across calls.
    static WIDE: Cell<(Lines<f32>, Lines<f32>)> = Cell::new(Default::default());
}

/// Rows per tile (and per widened group in prefill).
const R: usize = 4;

/// Elements per row, weight rows and tokens of a prefill call over
/// elements `E`, `None` for shapes that do not fit (the [`GemmFn`]
/// contract: nothing is computed then).
fn shape<E>(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    act_bytes: usize,
    out: &Out<'_>,
) -> Option<(usize, usize, usize)> {
    let se = size_of::<E>();
    if row_bytes == 0 || act_bytes != row_bytes || !row_bytes.is_multiple_of(se) {
        return None;
    }
    let (rows, toks) = (w.len() / row_bytes, a.len() / act_bytes);
    out.fits(rows, toks).then_some((row_bytes / se, rows, toks))
}

/// How a prefill tile adds a product into its lanes, and how it ends.
#[derive(Clone, Copy)]
enum Madd {
    /// F32: multiply, then add; [`float::f32_dot_end`].
    F32,
    /// Widened F16: fused; [`float::widened_dot_end`].
    Fused,
    /// Widened BF16: multiply, then add; [`float::widened_dot_end`].
    Separate,
}

/// One format's tile kernel `$name::<R, T>` over elements `$E`: `load`
/// widens the eight elements at `p` to f32, `madd` adds `w * x` to `acc` in
/// the scalar kernel's rounding, `end` finishes a pair's lanes with the
/// elements past the last whole chunk of eight.
macro_rules! float_tile {
    ($features:literal, $name:ident, $E:ty,
     load: |$p:ident| $load:expr,
     madd: |$acc:ident, $w:ident, $x:ident| $madd:expr,
     end: $end:path) => {
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        unsafe fn $name<const R: usize, const T: usize>(
            w: *const $E,
            ws: usize,
            a: *const $E,
            as_: usize,
            n: usize,
            out: *mut f32,
            rs: usize,
            ts: usize,
        ) {
            const L: usize = float::LANES;
            let full = n / L * L;
            let mut acc = [[_mm256_setzero_ps(); T]; R];
            let mut i = 0;
            while i < full {
                if T == 1 {
                    // One token: the R rows are R slow streams side by side;
                    // fetch the next group of rows as one stream, the
                    // share of this step's bytes (whole lines).
                    let share = R * L * size_of::<$E>();
                    let at = i * R * size_of::<$E>();
                    let next = w.add(R * ws).cast::<i8>();
                    if share >= 64 {
                        for line in 0..share / 64 {
                            _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(at + 64 * line));
                        }
                    } else if at % 64 == 0 {
                        _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(at));
                    }
                }
                let mut wv = [_mm256_setzero_ps(); R];
                for r in 0..R {
                    let $p = w.add(r * ws + i);
                    wv[r] = $load;
                }
                for t in 0..T {
                    let $p = a.add(t * as_ + i);
                    let $x = $load;
                    for r in 0..R {
                        let ($acc, $w) = (acc[r][t], wv[r]);
                        acc[r][t] = $madd;
                    }
                }
                i += L;
            }
            for r in 0..R {
                for t in 0..T {
                    let mut lanes = [0.0f32; L];
                    _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][t]);
                    let wt = std::slice::from_raw_parts(w.add(r * ws + full), n - full);
                    let at = std::slice::from_raw_parts(a.add(t * as_ + full), n - full);
                    *out.add(r * rs + t * ts) = $end(lanes, wt, at);
                }
            }
        }
    };
}

/// AVX2's prefill (`$features`; `$t` tokens per tile): the activations
/// and each group of [`R`] weight rows widened to f32, then [`drive`] with
/// `float_tile!`'s f32 tiles over them.
macro_rules! ymm_prefill {
    ($features:literal, $t:literal) => {
        float_tile!($features, tile_wide_fma, f32,
            load: |p| _mm256_loadu_ps(p),
            madd: |acc, w, x| _mm256_fmadd_ps(w, x, acc),
            end: float::widened_dot_end);
        float_tile!($features, tile_wide_mul, f32,
            load: |p| _mm256_loadu_ps(p),
            madd: |acc, w, x| _mm256_add_ps(acc, _mm256_mul_ps(w, x)),
            end: float::widened_dot_end);

        /// Prefill (the [`GemmFn`] contract) over elements `E`, widened by
        /// `widen`, adding as `madd` says (F32: `drive` over the rows in place).
        #[target_feature(enable = $features)]
        unsafe fn prefill<E: bytemuck::Pod>(
            w: &[u8],
            row_bytes: usize,
            a: &[u8],
            act_bytes: usize,
            out: Out<'_>,
            widen: unsafe fn(&[E], &mut [f32]),
            madd: Madd,
        ) {
            macro_rules! tiles {
                ($tile:ident) => {
                    Tiles::<f32, f32> {
                        rt: $tile::<R, $t>,
                        r1: $tile::<R, 1>,
                        one_t: $tile::<1, $t>,
                        one: $tile::<1, 1>,
                        r: R,
                        t: $t,
                    }
                };
            }
            let k = match madd {
                // F32 tiles read the rows as they are: nothing to widen.
                Madd::F32 => return drive(w, row_bytes, a, act_bytes, out, &tiles!(tile_f32)),
                Madd::Fused => tiles!(tile_wide_fma),
                Madd::Separate => tiles!(tile_wide_mul),
            };
            let Some((n, rows, toks)) = shape::<E>(w, row_bytes, a, act_bytes, &out) else {
                return;
            };
            let (wb, ab) = (blocks::<E>(&w[..rows * row_bytes]), blocks::<E>(&a[..toks * act_bytes]));
            let (mut wa, mut ww) = WIDE.take();
            wa.zeroed(toks * n);
            ww.zeroed(R * n);
            widen(&ab, &mut wa);
            let (rs, ts) = (out.row_stride, out.tok_stride);
            for (g, group) in wb.chunks(R * n).enumerate() {
                let wide = &mut ww[..group.len()];
                widen(group, wide);
                let at = g * R * rs;
                let o = Out { out: &mut out.out[at..], row_stride: rs, tok_stride: ts };
                drive(bytemuck::cast_slice(wide), 4 * n, bytemuck::cast_slice(&wa), 4 * n, o, &k);
            }
            WIDE.set((wa, ww));
        }
    };
}

/// The three formats' one-token tiles for `$features`, the widening, and
/// `gemm(ty)` and `vec_dot(ty)` handing them out. `gemm` runs the one-token
/// tiles for one token and the module's own `prefill` for more.
macro_rules! float_formats {
    ($features:literal) => {
        float_tile!($features, tile_f32, f32,
            load: |p| _mm256_loadu_ps(p),
            madd: |acc, w, x| _mm256_add_ps(acc, _mm256_mul_ps(w, x)),
            end: float::f32_dot_end);
        float_tile!($features, tile_f16, f16,
            load: |p| _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
            madd: |acc, w, x| _mm256_fmadd_ps(w, x, acc),
            end: float::f16_dot_end);
        float_tile!($features, tile_bf16, bf16,
            load: |p| _mm256_castsi256_ps(_mm256_slli_epi32::<16>(
                _mm256_cvtepu16_epi32(_mm_loadu_si128(p.cast())),
            )),
            madd: |acc, w, x| _mm256_add_ps(acc, _mm256_mul_ps(w, x)),
            end: float::bf16_dot_end);
        /// Widens `src` to f32 (`dst.len()` values).
        #[target_feature(enable = $features)]
        unsafe fn widen_f16(src: &[f16], dst: &mut [f32]) {
            let full = dst.len() / 8 * 8;
            for i in (0..full).step_by(8) {
                let v = _mm256_cvtph_ps(_mm_loadu_si128(src.as_ptr().add(i).cast()));
                _mm256_storeu_ps(dst.as_mut_ptr().add(i), v);
            }
            for (o, h) in dst[full..].iter_mut().zip(&src[full..]) {
                *o = crate::backend::cpu::kernels::fp16(*h);
            }
        }

        /// Widens `src` to f32 (`dst.len()` values).
        #[target_feature(enable = $features)]
        unsafe fn widen_bf16(src: &[bf16], dst: &mut [f32]) {
            let full = dst.len() / 8 * 8;
            for i in (0..full).step_by(8) {
                let v = _mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(_mm_loadu_si128(
                    src.as_ptr().add(i).cast(),
                )));
                _mm256_storeu_si256(dst.as_mut_ptr().add(i).cast(), v);
            }
            for (o, h) in dst[full..].iter_mut().zip(&src[full..]) {
                *o = h.to_f32();
            }
        }

        /// Copies `src` (F32's "widening").
        #[target_feature(enable = $features)]
        unsafe fn copy_f32(src: &[f32], dst: &mut [f32]) {
            dst.copy_from_slice(&src[..dst.len()]);
        }

        /// The tiled kernel of float type `ty`, `None` for other types.
        pub(in super::super) fn gemm(ty: GgmlType) -> Option<GemmFn> {
            macro_rules! tiles {
                ($E:ty, $tile:ident) => {
                    Tiles::<$E, $E> {
                        rt: $tile::<R, 1>,
                        r1: $tile::<R, 1>,
                        one_t: $tile::<1, 1>,
                        one: $tile::<1, 1>,
                        r: R,
                        t: 1,
                    }
                };
            }
            // SAFETY (all entries): handed out only by `x86::gemm`, which
            // the kernel table calls only after detecting this module's
            // target features.
            let f: GemmFn = match ty {
                GgmlType::F32 => |w, rb, a, ab, out| unsafe {
                    if a.len() > ab {
                        prefill::<f32>(w, rb, a, ab, out, copy_f32, Madd::F32)
                    } else {
                        drive(w, rb, a, ab, out, &tiles!(f32, tile_f32))
                    }
                },
                GgmlType::F16 => |w, rb, a, ab, out| unsafe {
                    if a.len() > ab {
                        prefill::<f16>(w, rb, a, ab, out, widen_f16, Madd::Fused)
                    } else {
                        drive(w, rb, a, ab, out, &tiles!(f16, tile_f16))
                    }
                },
                GgmlType::BF16 => |w, rb, a, ab, out| unsafe {
                    if a.len() > ab {
                        prefill::<bf16>(w, rb, a, ab, out, widen_bf16, Madd::Separate)
                    } else {
                        drive(w, rb, a, ab, out, &tiles!(bf16, tile_bf16))
                    }
                },
                _ => return None,
            };
            Some(f)
        }

        /// The dot of float type `ty` (one pair: the `1 x 1` tile).
        pub(in super::super) fn vec_dot(ty: GgmlType) -> Option<DotFn> {
            macro_rules! entry {
                ($E:ty, $tile:ident) => {
                    |w: &[u8], a: &[u8]| {
                        dot::<$E, $E>(w, a, |x, y| {
                            let n = x.len().min(y.len());
                            let mut out = 0.0f32;
                            // SAFETY: as in `gemm`; both rows hold `n`
                            // elements and `out` is one value.
                            unsafe {
                                $tile::<1, 1>(x.as_ptr(), n, y.as_ptr(), n, n, &mut out, 1, 1)
                            };
                            out
                        })
                    }
                };
            }
            let f: DotFn = match ty {
                GgmlType::F32 => entry!(f32, tile_f32),
                GgmlType::F16 => entry!(f16, tile_f16),
                GgmlType::BF16 => entry!(bf16, tile_bf16),
                _ => return None,
            };
            Some(f)
        }
    };
}

/// AVX2 (16 ymm registers): prefill tiles of four rows by two tokens.
pub(super) mod avx2 {
    use super::*;
    float_formats!("avx2,fma,f16c");
    ymm_prefill!("avx2,fma,f16c", 2);
}

/// AVX-512 (32 ymm registers with AVX512VL): four rows by four tokens.
pub(super) mod avx512 {
    use super::*;
    float_formats!("avx2,fma,f16c,avx512f,avx512bw,avx512vl");

    /// Token pairs per prefill tile (eight tokens: 16 zmm accumulators).
    const P: usize = 4;

    /// One prefill tile kernel `$name::<R, P>`: as `float_tile!` over f32
    /// rows, with two tokens' pairs in each zmm register (lanes 0..8 the even token's
    /// eight lanes, 8..16 the odd one's), the weight vector broadcast to
    /// both halves. A 512-bit FMA here does twice the work of a 256-bit
    /// one in the same time. `a` holds the activations pair-interleaved
    /// (see `prefill`); `toks` tokens of the `2P` are real.
    macro_rules! pair_tile {
        ($name:ident, madd: |$acc:ident, $w:ident, $x:ident| $madd:expr, end: $end:path) => {
            #[allow(clippy::too_many_arguments)]
            #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
            unsafe fn $name<const R: usize, const P: usize>(
                w: *const f32,
                ws: usize,
                a: *const f32,
                as_: usize,
                n: usize,
                out: *mut f32,
                (rs, ts, toks): (usize, usize, usize),
            ) {
                const L: usize = float::LANES;
                let full = n / L * L;
                let mut acc = [[_mm512_setzero_ps(); P]; R];
                let mut i = 0;
                while i < full {
                    let mut wv = [_mm512_setzero_ps(); R];
                    for r in 0..R {
                        // (`broadcast_f64x4`: the same 256 bits, AVX512F only.)
                        let v = _mm256_castps_pd(_mm256_loadu_ps(w.add(r * ws + i)));
                        wv[r] = _mm512_castpd_ps(_mm512_broadcast_f64x4(v));
                    }
                    for p in 0..P {
                        _mm_prefetch::<_MM_HINT_T0>(
                            a.wrapping_add(p * as_ + 2 * i + AHEAD).cast::<i8>(),
                        );
                        let $x = _mm512_loadu_ps(a.add(p * as_ + 2 * i));
                        for r in 0..R {
                            let ($acc, $w) = (acc[r][p], wv[r]);
                            acc[r][p] = $madd;
                        }
                    }
                    i += L;
                }
                for r in 0..R {
                    let wt = std::slice::from_raw_parts(w.add(r * ws + full), n - full);
                    for p in 0..P {
                        let mut lanes = [[0.0f32; L]; 2];
                        _mm512_storeu_ps(lanes.as_mut_ptr().cast(), acc[r][p]);
                        for (h, lanes) in lanes.into_iter().enumerate() {
                            let t = 2 * p + h;
                            if t < toks {
                                let at = a.add(p * as_ + 2 * full + L * h);
                                let at = std::slice::from_raw_parts(at, n - full);
                                *out.add(r * rs + t * ts) = $end(lanes, wt, at);
                            }
                        }
                    }
                }
            }
        };
    }

    pair_tile!(pair_f32,
        madd: |acc, w, x| _mm512_add_ps(acc, _mm512_mul_ps(w, x)),
        end: float::f32_dot_end);
    pair_tile!(pair_fma,
        madd: |acc, w, x| _mm512_fmadd_ps(w, x, acc),
        end: float::widened_dot_end);
    pair_tile!(pair_mul,
        madd: |acc, w, x| _mm512_add_ps(acc, _mm512_mul_ps(w, x)),
        end: float::widened_dot_end);

    /// How far ahead of its loads a pair tile prefetches each token pair's
    /// activations (values: four cache lines). The activations of a call
    /// come from L2, and without it the FMAs waited on them: 64 tokens of a
    /// 2048 x 8192 F16 matrix ran at 33.7-34.4 GMAC/s, with it at 37.3-37.9.
    const AHEAD: usize = 64;

    /// One pair tile kernel.
    type Pair =
        unsafe fn(*const f32, usize, *const f32, usize, usize, *mut f32, (usize, usize, usize));

    /// Prefill (the [`GemmFn`] contract) over elements `E`, as AVX2's but
    /// with `pair_tile!`'s tiles: the activations widened into pairs of
    /// tokens, each chunk of eight values of the even token followed by
    /// the odd token's (zeros past a row's end and for a missing odd
    /// token), then tiles of [`R`] rows by `2P` tokens.
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl")]
    unsafe fn prefill<E: bytemuck::Pod>(
        w: &[u8],
        row_bytes: usize,
        a: &[u8],
        act_bytes: usize,
        out: Out<'_>,
        widen: unsafe fn(&[E], &mut [f32]),
        madd: Madd,
    ) {
        const L: usize = float::LANES;
        let (rt, r1, one_t, one): (Pair, Pair, Pair, Pair) = match madd {
            Madd::F32 => (
                pair_f32::<R, P>,
                pair_f32::<R, 1>,
                pair_f32::<1, P>,
                pair_f32::<1, 1>,
            ),
            Madd::Fused => (
                pair_fma::<R, P>,
                pair_fma::<R, 1>,
                pair_fma::<1, P>,
                pair_fma::<1, 1>,
            ),
            Madd::Separate => (
                pair_mul::<R, P>,
                pair_mul::<R, 1>,
                pair_mul::<1, P>,
                pair_mul::<1, 1>,
            ),
        };
        let Some((n, rows, toks)) = shape::<E>(w, row_bytes, a, act_bytes, &out) else {
            return;
        };
        let chunks = n.div_ceil(L);
        let (pairs, pld) = (toks.div_ceil(2), 2 * L * chunks);
        let (wb, ab) = (
            blocks::<E>(&w[..rows * row_bytes]),
            blocks::<E>(&a[..toks * act_bytes]),
        );
        let (mut wa, mut ww) = WIDE.take();
        wa.zeroed(pairs * pld);
        ww.zeroed(R * n);
        for (t, src) in ab.chunks_exact(n).enumerate() {
            widen(src, &mut ww[..n]);
            let dst = &mut wa[t / 2 * pld..][..2 * L * chunks];
            for (c, v) in ww[..n].chunks(L).enumerate() {
                dst[2 * L * c + L * (t % 2)..][..v.len()].copy_from_slice(v);
            }
        }
        let (rs, ts, op) = (out.row_stride, out.tok_stride, out.out.as_mut_ptr());
        let mut r = 0;
        while r < rows {
            let (rn, f_t, f_1) = if r + R <= rows {
                (R, rt, r1)
            } else {
                (1, one_t, one)
            };
            // F32 rows are read in place (a copy cost a pass over memory).
            let wp = if let Madd::F32 = madd {
                bytemuck::cast_slice::<E, f32>(&wb[r * n..]).as_ptr()
            } else {
                widen(&wb[r * n..(r + rn) * n], &mut ww[..rn * n]);
                ww.as_ptr()
            };
            let mut p = 0;
            while p < pairs {
                let (pn, f) = if p + P <= pairs { (P, f_t) } else { (1, f_1) };
                let real = (toks - 2 * p).min(2 * pn);
                // SAFETY: `wp` holds rows r..r + rn, `n` values each, and
                // `wa` every pair, `pld` apart, with `chunks` chunks of both
                // tokens; `out.fits(rows, toks)` bounds every output index
                // written (`real` tokens); the caller guarantees the target
                // features.
                f(
                    wp,
                    n,
                    wa.as_ptr().add(p * pld),
                    pld,
                    n,
                    op.add(r * rs + 2 * p * ts),
                    (rs, ts, real),
                );
                p += pn;
            }
            r += rn;
        }
        WIDE.set((wa, ww));
    }
}
