//! Tiled dots of the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! IQ4_NL; the 256-element formats in `k256/lane_tiles.rs`): `R` weight rows by `T`
//! activation rows per pass. The AVX2 table runs these; AVX-512 runs the
//! 16-token kernels of `k256/tiles16.rs` and `q32/tiles16.rs` ahead of them.
//!
//! Each weight block is decoded once into a register and used for `T`
//! activation rows; each activation block is loaded once and used for `R`
//! weight rows. Every (row, token) pair keeps eight f32 lanes: a block's
//! exact i32 lanes are converted and scaled into them (no horizontal sum per
//! block), and the lanes are summed once at the end of the row. One token uses
//! `T = 1` (four weight rows stream side by side), prefill `R = 4, T = 4`
//! (AVX-512, 32 registers) or `T = 2` (AVX2, 16 registers).
//!
//! Integer part: unsigned weights (nibbles, 5-bit values) times signed
//! activations, with the format's offset folded into the lanes' starting
//! value (`-8 * sum(a)` for Q4_0, ...). With VNNI the signed formats (Q8_0,
//! IQ4_NL) also take that route (`w + 128` unsigned, start `-128 * sum(a)`):
//! `vpdpbusd` adds in i32 and cannot saturate. AVX2's `maddubs` would
//! saturate there, so it moves the weight's sign onto the activation.
//!
//! Results equal the per-pair dot within f32 rounding (the float order
//! differs: lanes are scaled per block and summed at the end).

use std::arch::x86_64::*;

use bytemuck::Pod;

use super::tiling::gemm_shape;
use crate::backend::cpu::kernels::{blocks, Out};

/// How far ahead of the rows in use [`drive`] prefetches weights (bytes).
const PREFETCH_BYTES: usize = 16384;

/// One tile kernel: `R` weight rows (`ws` blocks apart) by `T` activation
/// rows (`as_` blocks apart) over `nb` blocks, results at
/// `out[r * rs + t * ts]`.
pub(super) type Tile<W, A> =
    unsafe fn(*const W, usize, *const A, usize, usize, *mut f32, usize, usize);

/// The instances of one format's tile kernel that [`drive`] needs.
pub(super) struct Tiles<W, A> {
    /// `R x T` (the main tile).
    pub rt: Tile<W, A>,
    /// `R x 1` (the last activation rows).
    pub r1: Tile<W, A>,
    /// `1 x T` (the last weight rows).
    pub one_t: Tile<W, A>,
    /// `1 x 1`.
    pub one: Tile<W, A>,
    /// `R`.
    pub r: usize,
    /// `T`.
    pub t: usize,
}

/// Runs the tiles of `k` over all weight rows of `w` and activation rows of
/// `a` (the [`crate::backend::cpu::kernels::GemmFn`] contract): weight rows
/// outer in steps of `R`, so `R` rows stay in L1 while the activations pass.
///
/// # Safety
/// The CPU must have the target features `k`'s kernels are compiled for.
pub(super) unsafe fn drive<W: Pod, A: Pod>(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    act_bytes: usize,
    out: Out<'_>,
    k: &Tiles<W, A>,
) {
    let Some((nb, rows, toks)) = gemm_shape::<W, A>(w, row_bytes, a, act_bytes, &out) else {
        return;
    };
    let wb = blocks::<W>(&w[..rows * row_bytes]);
    let ab = blocks::<A>(&a[..toks * act_bytes]);
    let (wp, ap) = (wb.as_ptr(), ab.as_ptr());
    let (rs, ts, op) = (out.row_stride, out.tok_stride, out.out.as_mut_ptr());
    // Weight rows stream from memory once (one token) or once per batch of
    // tokens: fetch a group of rows a few KB ahead of the one in use, so
    // the tiles do not wait on memory latency.
    // (One token: the tiles fetch the next group themselves, spread over
    // their blocks, see [`prefetch_share`].)
    let group = k.r * row_bytes;
    let ahead = group.max(PREFETCH_BYTES);
    let mut r = 0;
    while r < rows {
        let from = r * row_bytes + ahead;
        let to = if toks == 1 {
            from
        } else {
            (from + group).min(rows * row_bytes)
        };
        for at in (from..to).step_by(64) {
            // SAFETY: `at` lies inside `w` (`to` is clamped to its rows);
            // a prefetch only hints the cache and never faults.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(w.as_ptr().add(at).cast()) };
        }
        let (rn, f_t, f_1) = if r + k.r <= rows {
            (k.r, k.rt, k.r1)
        } else {
            (1, k.one_t, k.one)
        };
        let mut t = 0;
        while t < toks {
            let (tn, f) = if t + k.t <= toks {
                (k.t, f_t)
            } else {
                (1, f_1)
            };
            // SAFETY: rows r..r + rn and tokens t..t + tn exist (`rn`, `tn`
            // were checked against `rows`, `toks`), each of `nb` blocks;
            // `out.fits(rows, toks)` bounds every output index; the caller
            // guarantees the kernels' target features.
            unsafe {
                f(
                    wp.add(r * nb),
                    nb,
                    ap.add(t * nb),
                    nb,
                    nb,
                    op.add(r * rs + t * ts),
                    rs,
                    ts,
                )
            };
            t += tn;
        }
        r += rn;
    }
}

/// Sum of the eight f32 lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)))
}

/// The tile kernels of all 32-element formats for `$features`, over the
/// primitives in scope (`dpbusd`, `offset_start`, `signed_w`,
/// `signed_start`, `signed_pair`), and `gemm(ty)` handing them out.
macro_rules! gemm_formats {
    ($features:literal, $t:literal) => {
        tile!($features, tile_q4_0, BlockQ4_0, BlockQ8_0,
            w: |bx| nibbles(&bx.qs), wd: h2f(bx.d),
            a: |by, aq| offset_start(aq, 8),
            pair: |s, w, x| dpbusd(s, w, x));
        tile!($features, tile_q4_1, BlockQ4_1, BlockQ8_1,
            w: |bx| nibbles(&bx.qs), wd: h2f(bx.d),
            a: |by, aq| _mm256_setzero_si256(),
            pair: |s, w, x| dpbusd(s, w, x),
            min: h2f(bx.m), h2f(by.s));
        tile!($features, tile_q5_0, BlockQ5_0, BlockQ8_0,
            w: |bx| q5_quants(&bx.qs, bx.qh), wd: h2f(bx.d),
            a: |by, aq| offset_start(aq, 16),
            pair: |s, w, x| dpbusd(s, w, x));
        tile!($features, tile_q5_1, BlockQ5_1, BlockQ8_1,
            w: |bx| q5_quants(&bx.qs, bx.qh), wd: h2f(bx.d),
            a: |by, aq| _mm256_setzero_si256(),
            pair: |s, w, x| dpbusd(s, w, x),
            min: h2f(bx.m), h2f(by.s));
        tile!($features, tile_q8_0, BlockQ8_0, BlockQ8_0,
            w: |bx| signed_w(load32(bx.qs.as_ptr())), wd: h2f(bx.d),
            a: |by, aq| signed_start(aq),
            pair: |s, w, x| signed_pair(s, w, x));
        tile!($features, tile_iq4_nl, BlockIQ4NL, BlockQ8_0,
            w: |bx| signed_w(iq4_levels(&bx.qs)), wd: h2f(bx.d),
            a: |by, aq| signed_start(aq),
            pair: |s, w, x| signed_pair(s, w, x));
        kquant_tiles!($features);

        /// The tiled kernel of weight type `ty`, `None` where there is none.
        pub(in super::super) fn gemm(ty: GgmlType) -> Option<GemmFn> {
            /// A table entry running `$tile` through `drive`.
            macro_rules! entry {
                ($W:ty, $A:ty, $tile:ident) => {
                    entry!($W, $A, $tile, $t)
                };
                ($W:ty, $A:ty, $tile:ident, $tt:expr) => {
                    |w: &[u8], rb: usize, a: &[u8], ab: usize, out: Out<'_>| {
                        let k = Tiles::<$W, $A> {
                            rt: $tile::<4, { $tt }>,
                            r1: $tile::<4, 1>,
                            one_t: $tile::<1, { $tt }>,
                            one: $tile::<1, 1>,
                            r: 4,
                            t: $tt,
                        };
                        // SAFETY: entries are handed out only by
                        // `x86::gemm`, which the kernel table calls only
                        // after detecting this module's target features.
                        unsafe { drive(w, rb, a, ab, out, &k) }
                    }
                };
            }
            use GgmlType as T;
            let f: GemmFn = match ty {
                T::Q4_0 => entry!(BlockQ4_0, BlockQ8_0, tile_q4_0),
                T::Q4_1 => entry!(BlockQ4_1, BlockQ8_1, tile_q4_1),
                T::Q5_0 => entry!(BlockQ5_0, BlockQ8_0, tile_q5_0),
                T::Q5_1 => entry!(BlockQ5_1, BlockQ8_1, tile_q5_1),
                T::Q8_0 => entry!(BlockQ8_0, BlockQ8_0, tile_q8_0),
                T::IQ4_NL => entry!(BlockIQ4NL, BlockQ8_0, tile_iq4_nl),
                T::Q4_K => entry!(BlockQ4K, BlockQ8K, tile_q4_k),
                T::Q5_K => entry!(BlockQ5K, BlockQ8K, tile_q5_k),
                T::Q6_K => entry!(BlockQ6K, BlockQ8K, tile_q6_k),
                T::IQ4_XS => entry!(BlockIQ4XS, BlockQ8K, tile_iq4_xs),
                _ => return None,
            };
            Some(f)
        }
    };
}

/// Imports shared by the two instruction-set modules.
macro_rules! gemm_imports {
    () => {
        use std::arch::x86_64::*;

        use super::super::k256::dots::k4_scales_mins;
        use super::super::k256::lane_tiles::{iq4_xs_tile, kquant_tiles, q45_tile};
        use super::super::q32::dots::{iq4_levels, q5_quants};
        use super::super::q32::lane_tiles::tile;
        use super::super::simd::{h2f, load32, nibbles};
        use super::super::tiling::prefetch_share;
        use super::{drive, hsum_ps, Tiles};
        use crate::backend::cpu::kernels::{GemmFn, Out};
        use crate::quant::blocks::{
            BlockIQ4NL, BlockIQ4XS, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ5_0, BlockQ5_1,
            BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
        };
        use crate::quant::GgmlType;
    };
}

/// AVX2: `maddubs` + `madd`; the signed formats move the sign.
pub(super) mod avx2 {
    gemm_imports!();

    /// `acc` plus the u8 x i8 products of `u` and `s` in groups of four.
    /// Exact while adjacent pairs stay within i16 (`u <= 31` here).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        let p = _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
        _mm256_add_epi32(acc, p)
    }

    /// `acc` plus the i16 x i16 products of `a` and `b` in pairs.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        _mm256_add_epi32(acc, _mm256_madd_epi16(a, b))
    }

    /// Lanes holding `-k * sum(aq)` (the offset of `k`-centred weights).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn offset_start(aq: __m256i, k: i8) -> __m256i {
        let z = _mm256_setzero_si256();
        _mm256_sub_epi32(z, dpbusd(z, _mm256_set1_epi8(k), aq))
    }

    /// Signed weights stay signed.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn signed_w(w: __m256i) -> __m256i {
        w
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn signed_start(_aq: __m256i) -> __m256i {
        _mm256_setzero_si256()
    }

    /// `acc` plus the i8 x i8 products (sign of `w` moved onto `x`).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn signed_pair(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        dpbusd(acc, _mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w))
    }

    gemm_formats!("avx2,fma,f16c", 2);
}

/// AVX-512 VNNI: `vpdpbusd` on 256-bit registers (32 of them with AVX512VL).
pub(super) mod avx512 {
    gemm_imports!();

    /// `acc` plus the u8 x i8 products of `u` and `s` in groups of four
    /// (exact: i32 sums, no saturation). Inline assembly because the
    /// intrinsic is younger than the crate's minimum Rust version.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn dpbusd(acc: __m256i, u: __m256i, s: __m256i) -> __m256i {
        let mut acc = acc;
        // SAFETY: register-only instruction (no memory, no stack, no
        // flags); the target features include AVX512VL + VNNI, which the
        // EVEX form on ymm registers needs.
        std::arch::asm!(
            "{{evex}} vpdpbusd {acc}, {u}, {s}",
            acc = inout(ymm_reg) acc,
            u = in(ymm_reg) u,
            s = in(ymm_reg) s,
            options(pure, nomem, nostack, preserves_flags),
        );
        acc
    }

    /// `acc` plus the i16 x i16 products of `a` and `b` in pairs (exact
    /// while the sums fit i32).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn dpwssd(acc: __m256i, a: __m256i, b: __m256i) -> __m256i {
        let mut acc = acc;
        // SAFETY: as in `dpbusd`.
        std::arch::asm!(
            "{{evex}} vpdpwssd {acc}, {a}, {b}",
            acc = inout(ymm_reg) acc,
            a = in(ymm_reg) a,
            b = in(ymm_reg) b,
            options(pure, nomem, nostack, preserves_flags),
        );
        acc
    }

    /// Lanes holding `-k * sum(aq)` (`k` read as unsigned).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn offset_start(aq: __m256i, k: i8) -> __m256i {
        let z = _mm256_setzero_si256();
        _mm256_sub_epi32(z, dpbusd(z, _mm256_set1_epi8(k), aq))
    }

    /// Signed weights as `w + 128` (unsigned).
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn signed_w(w: __m256i) -> __m256i {
        _mm256_xor_si256(w, _mm256_set1_epi8(i8::MIN))
    }

    /// `-128 * sum(aq)`: undoes the `+ 128` of [`signed_w`].
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn signed_start(aq: __m256i) -> __m256i {
        offset_start(aq, i8::MIN)
    }

    #[inline]
    #[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
    unsafe fn signed_pair(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
        dpbusd(acc, w, x)
    }

    gemm_formats!("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni", 4);
}
