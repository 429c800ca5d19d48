//! SIMD128 matmul over weights stored in bands of four rows
//! ([`Layout::Bands`] with `rows: 4`): per block index, the four rows' f16
//! scales side by side, then each 4-byte word of their quants, the four
//! rows side by side. One v128 load is then one word of each row.
//!
//! Why this layout: `i32x4.dot_i16x8_s` sums adjacent pairs, so the low
//! half of a word vector widened to i16 (rows 0 and 1) dotted with the
//! activations of the word's elements puts row 0's partial sum in lanes
//! 0..2 and row 1's in lanes 2..4; the high half does rows 2 and 3. The
//! rows stay in lanes through the whole block: one pair of shuffles per
//! block gives the four rows' exact integer sums in four lanes, the four
//! scales convert in one vector, and each lane then takes its row's float
//! steps. The four-row interleave this replaces folded four vectors of
//! partial sums per block and assembled the scales lane by lane: about
//! twice the instructions (in V8 on x86, 5.7 GB/s from cache where this
//! reads 11 for Q4_1).
//!
//! Lane `r` performs exactly the SIMD128 per-row dot's float operations
//! for row `r` in the same order (blocks one after another, no fused
//! multiply-add), on exact integer sums: every result is bit-identical to
//! the per-row dot of the same pair, so a token's results do not depend on
//! its batch, and the 32-element formats stay bit-identical to the scalar
//! kernels.
//!
//! Formats: Q4_0, Q4_1 and Q8_0 (and Q5_0, stored as Q8_0: `wasm::widen`)
//! step block by block; Q4_K, Q5_K, Q6_K and IQ4_XS decode their 256-element
//! blocks' quants for four rows as bytes, widen and dot them, and apply
//! each sub-block's scale once per row pair.
//!
//! wasm has no prefetch instruction: a one-token matmul runs eight bands
//! from eight parts of the weight together ([`PARTS`]), so that eight
//! streams through memory are in flight at every step, and reads a byte of
//! each line of the next band's step before it computes a step
//! ([`touch`]).

use core::arch::wasm32::*;

use bytemuck::{Pod, Zeroable};

use super::simd128::{self, h2f_high};
use crate::backend::cpu::kernels::{blocks, fp16, GemmFn, Layout, Out};
use crate::quant::blocks::{
    BlockIQ4XS, BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ5K, BlockQ6K, BlockQ8K, BlockQ8_0, BlockQ8_1,
    KVALUES_IQ4NL, QK_K,
};
use crate::quant::GgmlType;
use k256::{IQ4XS, Q4K, Q5K, Q6K};
use q32::{Q40, Q41, Q80};

mod k256;
mod q32;

/// Rows per band.
const ROWS: usize = 4;

/// Parts of a weight whose bands a one-token matmul runs together, block
/// step by block step. wasm has no prefetch instruction, and behind a loop
/// this dense in arithmetic one stream through memory leaves the hardware
/// prefetchers behind (and stalls at each 4 KiB page, wasm memory having
/// no huge pages); bands from several parts interleaved at each step keep
/// more misses in flight. Eight read fastest from DRAM, at a small cost
/// from cache (accumulators spill).
///
/// The out-of-order window of a k-quant step (some 800 instructions) holds
/// one band, so [`run`] also touches the next band's step before each
/// step. The measurements are in `docs/perf.md` ("wasm one-token bands").
const PARTS: usize = 8;

/// Bytes of weights the k-quants' one-token pass touches at once, whole
/// rounds of [`PARTS`] block steps ([`Band::TOUCH_ROUND`]). A touch is a
/// load, which retires only when its line arrives: each batch of touches
/// holds the out-of-order window up for about one memory latency however
/// many lines it asks for (as many as the core can have in flight), so
/// fewer, larger batches read faster (32 KiB as fast as any size
/// measured). Q4_0, Q8_0 and Q4_1, whose steps are small and quick, touch
/// one band ahead instead.
/// The measurements are in `docs/perf.md` ("wasm one-token bands").
const TOUCH_BYTES: usize = 32 << 10;

/// The banded kernel of weight type `ty`, `None` where the matmul keeps
/// another one. With `SUBNORMAL`, it takes f16 block scales of every
/// finite value; without, normal ones and zeros only (see [`h2f_high`]),
/// in fewer instructions.
pub(super) fn gemm<const SUBNORMAL: bool>(ty: GgmlType) -> Option<GemmFn> {
    let f: GemmFn = match ty {
        GgmlType::Q4_0 => bands::<Q40, SUBNORMAL>,
        GgmlType::Q4_1 => bands::<Q41, SUBNORMAL>,
        GgmlType::Q8_0 => bands::<Q80, SUBNORMAL>,
        GgmlType::Q4_K => bands::<Q4K, SUBNORMAL>,
        GgmlType::Q5_K => bands::<Q5K, SUBNORMAL>,
        GgmlType::Q6_K => bands::<Q6K, SUBNORMAL>,
        GgmlType::IQ4_XS => bands::<IQ4XS, SUBNORMAL>,
        _ => return None,
    };
    Some(f)
}

/// How [`gemm`]'s kernel of `ty` wants the weight stored.
pub(super) fn layout(ty: GgmlType) -> Option<Layout> {
    let bands = |halves, at| Layout::Bands {
        rows: ROWS,
        halves,
        at,
    };
    match ty {
        GgmlType::Q4_0 | GgmlType::Q8_0 => Some(bands(1, 0)),
        GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::IQ4_XS => Some(bands(2, 0)),
        // Q6_K's `d` is the last two bytes of its block.
        GgmlType::Q6_K => Some(bands(1, 208)),
        _ => None,
    }
}

/// One block step of a band: `H` sets of four f16 scales (`d`, then `m`
/// where the format has one), then `N` words of the four rows.
#[repr(C)]
#[derive(Clone, Copy)]
struct Step<const H: usize, const N: usize> {
    scales: [[u8; 8]; H],
    words: [[u8; 16]; N],
}

// SAFETY: only byte arrays, so no padding, any bit pattern valid, align 1.
unsafe impl<const H: usize, const N: usize> Zeroable for Step<H, N> {}
// SAFETY: as above; `Copy` and `'static`.
unsafe impl<const H: usize, const N: usize> Pod for Step<H, N> {}

/// A weight format's banded kernel.
trait Band {
    /// The weight block (rows past the last whole band stay plain).
    type W: Pod;
    /// The activation block.
    type A: Pod;
    /// A block step of four rows.
    type Step: Pod;
    /// How a one-token pass reads ahead ([`touch`]): `false`, each band's
    /// step touches the next band's step; `true`, the first band's step
    /// of every few rounds (a round: the [`PARTS`] bands at one block
    /// index) touches the next rounds, [`TOUCH_BYTES`] of them. A k-quant
    /// step is some 800 instructions, about the out-of-order window: one
    /// step's misses at a time leave most of the latency exposed, a
    /// round's (eight steps', 100-110 lines) overlap, and more rounds'
    /// more. Node 20 on AMD Zen 5, 2048x8192 weights from DRAM
    /// (`examples/stream_speed.rs`): Q4_K 4.7 -> 7.0-7.3 GB/s, Q6_K 4.0 ->
    /// 7.0-7.3, IQ4_XS 3.8 -> 5.8-5.9 with one round; Q4_0 and Q8_0 read
    /// alike both ways (from cache: 13.8, 12.8, 9.2). Touching half a
    /// round at a time, a round two ahead, or each band's own next step
    /// (one round ahead, spread out) read slower.
    const TOUCH_ROUND: bool = false;
    /// An activation block laid out for [`Band::step`], once per call.
    type Prep: Copy;
    /// Lays out one activation block.
    fn prep(a: &Self::A) -> Self::Prep;
    /// Adds block step `s` of four rows dotted with block `a[t]` of each
    /// activation row `t` to `acc[t]` (lane `r`: row `r`); `SUBNORMAL`:
    /// whether its f16 scales may be subnormal ([`scales`]).
    fn step<const T: usize, const SUBNORMAL: bool>(
        s: &Self::Step,
        a: [&Self::Prep; T],
        acc: &mut [v128; T],
    );
    /// The SIMD128 per-row dot (the rows past the last whole band).
    fn row(w: &[Self::W], a: &[Self::A]) -> f32;
}

/// Every weight row of `weights` (whole bands in [`Layout::Bands`], the
/// rows past them plain) with every activation row of `acts`. One
/// activation row (decode) runs [`PARTS`] bands at once, one from each
/// part of the weight; more run one band at a time by two activation rows
/// (its blocks decoded once for both). Computes nothing for shapes that do
/// not fit `out`.
fn bands<K: Band, const SUBNORMAL: bool>(
    weights: &[u8],
    row_bytes: usize,
    acts: &[u8],
    act_bytes: usize,
    out: Out<'_>,
) {
    let (wb, step_bytes) = (size_of::<K::W>(), size_of::<K::Step>());
    if row_bytes == 0 || act_bytes == 0 || !row_bytes.is_multiple_of(wb) {
        return;
    }
    let (rows, toks) = (weights.len() / row_bytes, acts.len() / act_bytes);
    if rows == 0 || toks == 0 || !out.fits(rows, toks) || ROWS * wb != step_bytes {
        return;
    }
    let nb = row_bytes / wb;
    let preps: Vec<Vec<K::Prep>> = acts
        .chunks_exact(act_bytes)
        .map(|a| blocks::<K::A>(a).iter().map(K::prep).collect())
        .collect();
    if preps.iter().any(|p| p.len() < nb) {
        return;
    }
    let Out {
        out,
        row_stride,
        tok_stride,
    } = out;
    let mut put = |g: usize, t: usize, v: v128| {
        let lanes = [
            f32x4_extract_lane::<0>(v),
            f32x4_extract_lane::<1>(v),
            f32x4_extract_lane::<2>(v),
            f32x4_extract_lane::<3>(v),
        ];
        for (r, x) in lanes.into_iter().enumerate() {
            out[(g * ROWS + r) * row_stride + t * tok_stride] = x;
        }
    };
    let steps = |g: usize| blocks::<K::Step>(&weights[g * ROWS * row_bytes..][..ROWS * row_bytes]);
    let bands = rows / ROWS;
    if let [p] = &preps[..] {
        // PARTS parts of `q` or `q + 1` bands: the first `r` have one more.
        let (q, r) = (bands / PARTS, bands % PARTS);
        let starts: [usize; PARTS] = core::array::from_fn(|j| j * q + j.min(r));
        for i in 0..q {
            let g = starts.map(|s| s + i);
            let s = g.map(steps);
            let v = run::<K, 1, PARTS, SUBNORMAL>(core::array::from_fn(|j| &s[j][..]), [p]);
            g.into_iter().zip(v).for_each(|(g, [v])| put(g, 0, v));
        }
        for g in starts.into_iter().take(r).map(|s| s + q) {
            let [[v]] = run::<K, 1, 1, SUBNORMAL>([&steps(g)], [p]);
            put(g, 0, v);
        }
    } else {
        for g in 0..bands {
            let s = steps(g);
            let mut pairs = preps.chunks_exact(2);
            for (i, p) in pairs.by_ref().enumerate() {
                let [[v0, v1]] = run::<K, 2, 1, SUBNORMAL>([&s], [&p[0], &p[1]]);
                put(g, 2 * i, v0);
                put(g, 2 * i + 1, v1);
            }
            if let [p] = pairs.remainder() {
                let [[v]] = run::<K, 1, 1, SUBNORMAL>([&s], [p]);
                put(g, toks - 1, v);
            }
        }
    }
    for r in bands * ROWS..rows {
        let w = blocks::<K::W>(&weights[r * row_bytes..(r + 1) * row_bytes]);
        for (t, a) in acts.chunks_exact(act_bytes).enumerate() {
            out[r * row_stride + t * tok_stride] = K::row(&w, &blocks::<K::A>(a));
        }
    }
}

/// `$body` once for each band `$J` of [`PARTS`], `$J` a constant.
macro_rules! bands_unrolled {
    ($J:ident => $body:block) => {
        bands_unrolled!(@ $J $body 0 1 2 3 4 5 6 7)
    };
    (@ $J:ident $body:block $($j:literal)*) => {
        $({
            const $J: usize = $j;
            $body
        })*
    };
}
const _: () = assert!(PARTS == 8, "bands_unrolled! writes out eight bands");

/// The bands `steps` (`B` of them, their block steps) by `T` activation
/// rows, block step by block step: the bands' loads are in flight
/// together.
#[inline(always)]
fn run<K: Band, const T: usize, const B: usize, const SUBNORMAL: bool>(
    steps: [&[K::Step]; B],
    preps: [&[K::Prep]; T],
) -> [[v128; T]; B] {
    let n = steps.iter().map(|s| s.len()).min().unwrap_or(0);
    let steps = steps.map(|s| &s[..n]);
    let mut acc = [[f32x4_splat(0.0); T]; B];
    if preps.iter().any(|p| p.len() < n) {
        return acc;
    }
    let preps = preps.map(|p| &p[..n]);
    if B == PARTS {
        // The one-token pass. Before each step, the next band's step (the
        // first band's next one after the last), or before every
        // `rounds` rounds the next `rounds` ([`Band::TOUCH_ROUND`]): their
        // misses start now, beside this step's arithmetic.
        let rounds = TOUCH_BYTES.div_ceil(B * size_of::<K::Step>()).max(1);
        let next = |j: usize, b: usize| match steps.get(j + 1) {
            Some(t) => t.get(b),
            None => steps.first().and_then(|t| t.get(b + 1)),
        };
        // Written out band by band: as a loop over the bands LLVM kept
        // the accumulators and the bands' slices in the shadow stack in
        // linear memory, and checked bounds at every step.
        let mut fences = [[f32x4_splat(0.0); T]; B];
        for b in 0..n {
            bands_unrolled!(J => {
                if K::TOUCH_ROUND {
                    if J == 0 && b % rounds == 0 {
                        for r in b + 1..=b + rounds {
                            for t in steps.iter().filter_map(|s| s.get(r)) {
                                touch(t);
                            }
                        }
                    }
                } else if let Some(t) = next(J, b) {
                    touch(t);
                }
                K::step::<T, SUBNORMAL>(&steps[J][b], preps.map(|p| &p[b]), &mut acc[J]);
                fence(&mut fences[J], acc[J]);
            });
        }
        return acc;
    }
    for b in 0..n {
        for (s, acc) in steps.iter().zip(&mut acc) {
            K::step::<T, SUBNORMAL>(&s[b], preps.map(|p| &p[b]), acc);
        }
    }
    acc
}

// ---------------------------------------------------------------- helpers

/// Reads one byte of each 64 of `step`: wasm's stand-in for a prefetch.
/// Unlike a prefetch the loads retire only when their lines arrive, so
/// they go where those lines are about to be needed anyway.
#[inline(always)]
fn touch<S: Pod>(step: &S) {
    for b in bytemuck::bytes_of(step).iter().step_by(64) {
        // SAFETY: `b` is a reference to one readable byte. The read is
        // volatile so that the compilers keep a load whose value is unused.
        unsafe { core::ptr::read_volatile(b) };
    }
}

/// Stores `v` to `slot` for V8 to see: a store to linear memory that
/// the loads after it in the wasm code stay after. Without one between the
/// bands of a step, TurboFan (Node 20) moved all eight bands' weight loads
/// of a step (40 vectors for Q4_1) to its top, where they outnumber the 16
/// xmm registers: each was loaded, spilled to the stack and reloaded (139
/// stack moves in a step of 822 instructions). With a fence after each
/// band it keeps them in the band's code: 48 stack moves, and one-token
/// matmuls from cache run faster (Node 20, Xeon at 2.6 GHz, best of eight
/// processes: 2048x2048 Q4_0 8.5 to 9.2 GB/s, 576x1536 Q4_1 9.1 to 9.4;
/// Q8_0's loads did not spill, 12.6 to 12.8). The k-quants' steps are
/// calls of their own, and V8 moves no load out of a call. Costs one
/// store per band step.
#[inline(always)]
fn fence<V: Copy>(slot: &mut V, v: V) {
    // SAFETY: `slot` is a valid, aligned, exclusive reference. The store is
    // volatile so that LLVM keeps it although nothing reads `slot`.
    unsafe { core::ptr::write_volatile(slot, v) };
}

/// The 16 bytes of `p`.
#[inline(always)]
fn ld(p: &[u8; 16]) -> v128 {
    // SAFETY: `p` holds 16 readable bytes; `v128.load` has no alignment
    // requirement.
    unsafe { v128_load(p.as_ptr().cast()) }
}

/// The four i16 at `p[at..at + 4]` in both halves of a vector (zeros if
/// `p` is shorter; the callers' constant offsets rule that out).
#[inline(always)]
fn quad(p: &[i16], at: usize) -> v128 {
    match p.get(at..at + 4) {
        // SAFETY: the slice holds 8 readable bytes; no alignment needed.
        Some(s) => unsafe { v128_load64_splat(s.as_ptr().cast()) },
        None => i16x8_splat(0),
    }
}

/// The four rows' f16 scales of a block step as f32 lanes: `scales[0]`
/// (and `scales[1]` for `H = 2`), finite values only (the weights' kernels
/// say so, `WeightKernels::gemm_finite_scales`); `SUBNORMAL`: whether they
/// may be subnormal ([`h2f_high`]).
#[inline(always)]
fn scales<const H: usize, const SUBNORMAL: bool>(s: &[[u8; 8]; H]) -> [v128; H] {
    let z = i16x8_splat(0);
    // SAFETY: `s` holds `8 * H` readable bytes, 8 or 16; no alignment needed.
    let v = unsafe {
        match H {
            1 => v128_load64_zero(s.as_ptr().cast()),
            _ => v128_load(s.as_ptr().cast()),
        }
    };
    // Each f16 into the high half of a u32 lane (sign at bit 31).
    let lo = i16x8_shuffle::<0, 8, 1, 9, 2, 10, 3, 11>(z, v);
    let hi = i16x8_shuffle::<4, 12, 5, 13, 6, 14, 7, 15>(z, v);
    core::array::from_fn(|f| h2f_high::<SUBNORMAL>(if f == 0 { lo } else { hi }))
}

/// Lane `r` = row `r`'s sum, from `a` = rows 0, 0, 1, 1 and `b` = rows 2,
/// 2, 3, 3 (exact i32 sums).
#[inline(always)]
fn fold(a: v128, b: v128) -> v128 {
    i32x4_add(
        i32x4_shuffle::<0, 2, 4, 6>(a, b),
        i32x4_shuffle::<1, 3, 5, 7>(a, b),
    )
}
