//! SIMD128 tiles: four weight rows against one activation row per call,
//! for decode (one token) and prefill (each token of the batch in turn,
//! the four rows staying in L1).
//!
//! Why four rows: the per-row dot spends most of a block on scalar work
//! (the horizontal sum of the integer lanes, two fp16 conversions, the
//! float update). Four rows share the activation block's loads and
//! widening, reduce their four integer sums with one transpose, convert
//! their scales in one vector, and keep one f32 accumulator lane per row.
//!
//! Lane `r` performs exactly the scalar kernel's float operations for row
//! `r`, in the same order (blocks one after another, no fused multiply-add
//! in SIMD128), on integer sums that are exact: every tile result is
//! bit-identical to the SIMD128 per-row dot of the same pair, so a token's
//! results do not depend on its batch, and the 32-element formats stay
//! bit-identical to the scalar kernels.
//!
//! Q6_K keeps the per-row dot: its four-row form measured slower (the
//! decode of six-bit quants leaves no registers for four rows).
//!
//! In a relaxed-SIMD build the unsigned quants (4 and 5 bits) are dotted
//! with `i32x4.relaxed_dot_i8x16_i7x16_add` (exact for a 7-bit unsigned
//! operand); offsets are taken off through the activation sums, as in the
//! per-row kernels.

use core::arch::wasm32::*;

use bytemuck::Pod;
use half::f16;

use super::simd128::{h2f, hi4, ld, ldi, lo4, q5_high, scaled_bsums};
use crate::backend::cpu::kernels::kquants::scale_min_k4;
use crate::backend::cpu::kernels::{blocks, GemmFn, Out};
use crate::quant::blocks::{BlockQ4K, BlockQ4_1, BlockQ5_0, BlockQ8K, BlockQ8_0, BlockQ8_1};
use crate::quant::GgmlType;

/// The tiled kernel of weight type `ty`, `None` where the matmul keeps
/// dotting row by row.
pub(super) fn gemm(ty: GgmlType) -> Option<GemmFn> {
    let f: GemmFn = match ty {
        GgmlType::Q4_1 => |w, rb, a, ab, o| tiles::<BlockQ4_1, BlockQ8_1>(w, rb, a, ab, o, q4_1x4),
        GgmlType::Q5_0 => |w, rb, a, ab, o| tiles::<BlockQ5_0, BlockQ8_0>(w, rb, a, ab, o, q5_0x4),
        GgmlType::Q8_0 => |w, rb, a, ab, o| tiles::<BlockQ8_0, BlockQ8_0>(w, rb, a, ab, o, q8_0x4),
        GgmlType::Q4_K => |w, rb, a, ab, o| tiles::<BlockQ4K, BlockQ8K>(w, rb, a, ab, o, q4_kx4),
        _ => return None,
    };
    Some(f)
}

/// Four weight rows (the blocks of each) dotted with one activation row:
/// the four results as f32 lanes. Rows shorter than the activation row are
/// dotted over their common length.
type Kernel4<W, A> = fn(w: [&[W]; 4], a: &[A]) -> v128;

/// Every weight row of `weights` with every activation row of `acts`, four
/// rows at a time (a last partial group repeats its last row and drops the
/// copies' results). Computes nothing for shapes that do not fit `out`.
fn tiles<W: Pod, A: Pod>(
    weights: &[u8],
    row_bytes: usize,
    acts: &[u8],
    act_bytes: usize,
    out: Out<'_>,
    k4: Kernel4<W, A>,
) {
    if row_bytes == 0 || act_bytes == 0 {
        return;
    }
    let (rows, toks) = (weights.len() / row_bytes, acts.len() / act_bytes);
    if rows == 0 || toks == 0 || !out.fits(rows, toks) {
        return;
    }
    let Out {
        out,
        row_stride,
        tok_stride,
    } = out;
    let mut sink = 0u8;
    for r0 in (0..rows).step_by(4) {
        sink ^= touch_ahead(weights, r0 * row_bytes, 4 * row_bytes);
        let row = |i: usize| {
            let r = (r0 + i).min(rows - 1);
            blocks::<W>(&weights[r * row_bytes..(r + 1) * row_bytes])
        };
        let ws = [row(0), row(1), row(2), row(3)];
        let wr = [&*ws[0], &*ws[1], &*ws[2], &*ws[3]];
        let live = (rows - r0).min(4);
        for (t, arow) in acts.chunks_exact(act_bytes).enumerate() {
            let v = k4(wr, &blocks::<A>(arow));
            let lanes = [
                f32x4_extract_lane::<0>(v),
                f32x4_extract_lane::<1>(v),
                f32x4_extract_lane::<2>(v),
                f32x4_extract_lane::<3>(v),
            ];
            for (i, &x) in lanes.iter().enumerate().take(live) {
                out[(r0 + i) * row_stride + t * tok_stride] = x;
            }
        }
    }
    core::hint::black_box(sink);
}

/// How far ahead of the tile [`touch_ahead`] reads: past the next 4 KiB
/// page, whose first lines the hardware prefetcher does not fetch.
const AHEAD: usize = 4096 + 2048;

/// Reads one byte of every 64-byte line of `weights[at + AHEAD..][..len]`
/// (what exists of it), so the page walk and the memory reads of the rows
/// a few tiles on start while this tile computes: wasm has no prefetch
/// instruction, and a wasm heap lies on 4 KiB pages.
#[inline(always)]
fn touch_ahead(weights: &[u8], at: usize, len: usize) -> u8 {
    let end = (at + AHEAD + len).min(weights.len());
    let mut x = 0u8;
    let mut i = at + AHEAD;
    while i < end {
        x ^= weights[i];
        i += 64;
    }
    x
}

// ---------------------------------------------------------------- helpers

/// Lane `r` = the sum of the four lanes of `s[r]` (exact i32 sums).
#[inline(always)]
fn hsum4(s: [v128; 4]) -> v128 {
    let t0 = i32x4_add(
        i32x4_shuffle::<0, 4, 1, 5>(s[0], s[1]),
        i32x4_shuffle::<2, 6, 3, 7>(s[0], s[1]),
    );
    let t1 = i32x4_add(
        i32x4_shuffle::<0, 4, 1, 5>(s[2], s[3]),
        i32x4_shuffle::<2, 6, 3, 7>(s[2], s[3]),
    );
    i32x4_add(
        i32x4_shuffle::<0, 1, 4, 5>(t0, t1),
        i32x4_shuffle::<2, 3, 6, 7>(t0, t1),
    )
}

/// Four fp16 as f32 lanes, exactly as `fp16` converts each.
#[inline(always)]
fn h4(h: [f16; 4]) -> v128 {
    h2f(u32x4(
        u32::from(h[0].to_bits()),
        u32::from(h[1].to_bits()),
        u32::from(h[2].to_bits()),
        u32::from(h[3].to_bits()),
    ))
}

/// 32 int8 activations, raw (elements 0..16, 16..32) and widened to i16
/// (0..8, 8..16, 16..24, 24..32). Each kernel uses the form its dot wants;
/// the other folds away.
#[derive(Clone, Copy)]
struct Act32 {
    raw: [v128; 2],
    wide: [v128; 4],
}

/// The activation block `qs[at..at + 32]`.
#[inline(always)]
fn act32(qs: &[i8], at: usize) -> Act32 {
    let (a0, a1) = (ldi(qs, at), ldi(qs, at + 16));
    Act32 {
        raw: [a0, a1],
        wide: [
            i16x8_extend_low_i8x16(a0),
            i16x8_extend_high_i8x16(a0),
            i16x8_extend_low_i8x16(a1),
            i16x8_extend_high_i8x16(a1),
        ],
    }
}

/// Four i32 lanes summing to `sum(w[i] * a[i])` over 32 pairs, for unsigned
/// quants `w0` (elements 0..16) and `w1` (16..32) in 0..=127.
#[inline(always)]
fn dot32_u(w0: v128, w1: v128, a: &Act32) -> v128 {
    #[cfg(target_feature = "relaxed-simd")]
    {
        let z = i32x4_splat(0);
        i32x4_relaxed_dot_i8x16_i7x16_add(
            a.raw[0],
            w0,
            i32x4_relaxed_dot_i8x16_i7x16_add(a.raw[1], w1, z),
        )
    }
    #[cfg(not(target_feature = "relaxed-simd"))]
    {
        let _ = a.raw;
        let s0 = i32x4_dot_i16x8(u16x8_extend_low_u8x16(w0), a.wide[0]);
        let s1 = i32x4_dot_i16x8(u16x8_extend_high_u8x16(w0), a.wide[1]);
        let s2 = i32x4_dot_i16x8(u16x8_extend_low_u8x16(w1), a.wide[2]);
        let s3 = i32x4_dot_i16x8(u16x8_extend_high_u8x16(w1), a.wide[3]);
        i32x4_add(i32x4_add(s0, s1), i32x4_add(s2, s3))
    }
}

/// [`dot32_u`] for signed int8 quants.
#[inline(always)]
fn dot32_s(w0: v128, w1: v128, a: &Act32) -> v128 {
    let s0 = i32x4_dot_i16x8(i16x8_extend_low_i8x16(w0), a.wide[0]);
    let s1 = i32x4_dot_i16x8(i16x8_extend_high_i8x16(w0), a.wide[1]);
    let s2 = i32x4_dot_i16x8(i16x8_extend_low_i8x16(w1), a.wide[2]);
    let s3 = i32x4_dot_i16x8(i16x8_extend_high_i8x16(w1), a.wide[3]);
    i32x4_add(i32x4_add(s0, s1), i32x4_add(s2, s3))
}

// ------------------------------------------------------- 32-element formats

/// Q4_1 x Q8_1, four rows: `(dx * dy) * sumi + mx * sy` per block, as the
/// scalar kernel.
fn q4_1x4(w: [&[BlockQ4_1]; 4], a: &[BlockQ8_1]) -> v128 {
    let n = a.len().min(w.iter().map(|r| r.len()).min().unwrap_or(0));
    let (w0, w1, w2, w3) = (&w[0][..n], &w[1][..n], &w[2][..n], &w[3][..n]);
    let mut acc = f32x4_splat(0.0);
    for (b, by) in a[..n].iter().enumerate() {
        let act = act32(&by.qs, 0);
        let dot = |q: &[u8; 16]| {
            let q = ld(q, 0);
            dot32_u(lo4(q), hi4(q), &act)
        };
        let sumi = hsum4([
            dot(&w0[b].qs),
            dot(&w1[b].qs),
            dot(&w2[b].qs),
            dot(&w3[b].qs),
        ]);
        let dx = h4([w0[b].d, w1[b].d, w2[b].d, w3[b].d]);
        let mx = h4([w0[b].m, w1[b].m, w2[b].m, w3[b].m]);
        let dy = f32x4_splat(by.d.to_f32());
        let sy = f32x4_splat(by.s.to_f32());
        let t = f32x4_add(
            f32x4_mul(f32x4_mul(dx, dy), f32x4_convert_i32x4(sumi)),
            f32x4_mul(mx, sy),
        );
        acc = f32x4_add(acc, t);
    }
    acc
}

/// Q5_0 x Q8_0, four rows: the unsigned quants (0..32) dotted, then 16
/// times the activation sum taken off; `(dx * dy) * sumi` per block.
fn q5_0x4(w: [&[BlockQ5_0]; 4], a: &[BlockQ8_0]) -> v128 {
    let n = a.len().min(w.iter().map(|r| r.len()).min().unwrap_or(0));
    let (w0, w1, w2, w3) = (&w[0][..n], &w[1][..n], &w[2][..n], &w[3][..n]);
    let mut acc = f32x4_splat(0.0);
    let sixteen = u8x16_splat(16);
    for (b, by) in a[..n].iter().enumerate() {
        let act = act32(&by.qs, 0);
        let off = dot32_u(sixteen, sixteen, &act);
        let dot = |x: &BlockQ5_0| {
            let q = ld(&x.qs, 0);
            let (h0, h1) = q5_high(x.qh);
            i32x4_sub(dot32_u(v128_or(lo4(q), h0), v128_or(hi4(q), h1), &act), off)
        };
        let sumi = hsum4([dot(&w0[b]), dot(&w1[b]), dot(&w2[b]), dot(&w3[b])]);
        let dx = h4([w0[b].d, w1[b].d, w2[b].d, w3[b].d]);
        let dy = f32x4_splat(by.d.to_f32());
        acc = f32x4_add(acc, f32x4_mul(f32x4_mul(dx, dy), f32x4_convert_i32x4(sumi)));
    }
    acc
}

/// Q8_0 x Q8_0, four rows: `sumi * (dx * dy)` per block, as the scalar kernel.
fn q8_0x4(w: [&[BlockQ8_0]; 4], a: &[BlockQ8_0]) -> v128 {
    let n = a.len().min(w.iter().map(|r| r.len()).min().unwrap_or(0));
    let (w0, w1, w2, w3) = (&w[0][..n], &w[1][..n], &w[2][..n], &w[3][..n]);
    let mut acc = f32x4_splat(0.0);
    for (b, by) in a[..n].iter().enumerate() {
        let act = act32(&by.qs, 0);
        let dot = |q: &[i8; 32]| dot32_s(ldi(q, 0), ldi(q, 16), &act);
        let sumi = hsum4([
            dot(&w0[b].qs),
            dot(&w1[b].qs),
            dot(&w2[b].qs),
            dot(&w3[b].qs),
        ]);
        let dx = h4([w0[b].d, w1[b].d, w2[b].d, w3[b].d]);
        let dy = f32x4_splat(by.d.to_f32());
        acc = f32x4_add(acc, f32x4_mul(f32x4_convert_i32x4(sumi), f32x4_mul(dx, dy)));
    }
    acc
}

// ------------------------------------------------------ 256-element formats

/// Q4_K x Q8_K, four rows: each block's exact `sum_j sc_j * dot_j` and
/// `sum_j min_j * bsum_j`, then `d * dy * isum - dmin * dy * mins` per lane
/// (the SIMD128 per-row kernel's order).
fn q4_kx4(w: [&[BlockQ4K]; 4], a: &[BlockQ8K]) -> v128 {
    let n = a.len().min(w.iter().map(|r| r.len()).min().unwrap_or(0));
    let (w0, w1, w2, w3) = (&w[0][..n], &w[1][..n], &w[2][..n], &w[3][..n]);
    let mut acc = f32x4_splat(0.0);
    for (b, by) in a[..n].iter().enumerate() {
        let x = [&w0[b], &w1[b], &w2[b], &w3[b]];
        let mut s = [i32x4_splat(0); 4];
        for c in 0..4 {
            let (lo, hi) = (act32(&by.qs, 64 * c), act32(&by.qs, 64 * c + 32));
            for (r, bx) in x.iter().enumerate() {
                let (q0, q1) = (ld(&bx.qs, 32 * c), ld(&bx.qs, 32 * c + 16));
                let dl = dot32_u(lo4(q0), lo4(q1), &lo);
                let dh = dot32_u(hi4(q0), hi4(q1), &hi);
                let (s0, s1) = (
                    scale_min_k4(2 * c, &bx.scales).0,
                    scale_min_k4(2 * c + 1, &bx.scales).0,
                );
                s[r] = i32x4_add(s[r], i32x4_mul(dl, i32x4_splat(i32::from(s0))));
                s[r] = i32x4_add(s[r], i32x4_mul(dh, i32x4_splat(i32::from(s1))));
            }
        }
        let isum = f32x4_convert_i32x4(hsum4(s));
        let mins = x.map(|bx| scaled_bsums(by, |j| i32::from(scale_min_k4(j / 2, &bx.scales).1)));
        let mins = f32x4_convert_i32x4(i32x4(mins[0], mins[1], mins[2], mins[3]));
        let d = h4(x.map(|bx| bx.d));
        let dmin = h4(x.map(|bx| bx.dmin));
        let dy = f32x4_splat(by.d);
        let t = f32x4_sub(
            f32x4_mul(f32x4_mul(d, dy), isum),
            f32x4_mul(f32x4_mul(dmin, dy), mins),
        );
        acc = f32x4_add(acc, t);
    }
    acc
}
