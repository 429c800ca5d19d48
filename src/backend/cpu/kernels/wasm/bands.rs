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

/// Rows per band.
const ROWS: usize = 4;

/// Parts of a weight whose bands a one-token matmul runs together, block
/// step by block step. wasm has no prefetch instruction, and behind a loop
/// this dense in arithmetic one stream through memory leaves the hardware
/// prefetchers behind (and stalls at each 4 KiB page, wasm memory having
/// no huge pages); bands from several parts interleaved at each step keep
/// more misses in flight. Node 20 on a Xeon, weights from DRAM, SmolLM2's
/// matrices (91 MB) / Gemma-3's Q8_0 ones (235 MB): one band at a time
/// 5.3 / 6.4 GB/s, three 7.9-8.3 / 8.1, eight 8.7-9.6 / 10.6. From cache
/// eight cost 5-10% (accumulators spill).
///
/// The out-of-order window of a k-quant step (some 800 instructions) holds
/// one band, so [`run`] also touches the next band's step before each
/// step: from DRAM (Node 20, 2048x8192 matrices, 700-800 MB) Q6_K went
/// from 5.8 to 7.8 GB/s, Q4_0 8.9 to 10.4, Q4_K, Q8_0 and IQ4_XS 5-6%
/// faster; no slower from cache.
const PARTS: usize = 8;

/// Bytes of weights the k-quants' one-token pass touches at once, whole
/// rounds of [`PARTS`] block steps ([`Band::TOUCH_ROUND`]). A touch is a
/// load, which retires only when its line arrives: each batch of touches
/// holds the out-of-order window up for about one memory latency however
/// many lines it asks for (as many as the core can have in flight), so
/// fewer, larger batches read faster. Node 20 on AMD Zen 5, 2048x8192
/// weights from DRAM (`examples/stream_speed.rs`), Q4_K / IQ4_XS in GB/s:
/// one round (4.5 / 4.3 KiB) 5.7-7.5 / 5.0-5.9; 16 KiB 8.5-9.1 /
/// 6.0-6.9; 32 KiB 8.3-9.7 / 7.0-7.3; 48 KiB 9.1-9.3 / 7.0-7.1; 64 and
/// 96 KiB 7.7-9.4 / 6.2-7.1. Q6_K (6.6 KiB a round) 6.2-6.4 -> 7.7-7.9
/// at 32 KiB. The 1B models' decode (`examples/decode_speed.rs`, the same
/// machine, tokens/s): Q4_K_M 7.9-9.0 -> 9.4-10.7, Q6_K 6.0-6.8 ->
/// 6.8-7.1, IQ4_XS 7.4-8.0 -> 8.2-9.6. Q4_0, Q8_0 and Q4_1, whose steps
/// are small and quick, read 5-15% slower so than by touching one band
/// ahead.
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

/// One activation block of 32 laid out for the nibble formats (Q4_0,
/// Q4_1: the low nibble of byte `j` is element `j`, its high nibble
/// element `16 + j`): `lo[j] = a[j]` and `hi[j] = a[16 + j] - 16 a[j]` as
/// i16. A weight byte `b = lo + 16 hi`, widened whole, dotted with `lo[j]`
/// and its high nibble with `hi[j]` leaves `lo * a[j] + hi * a[16 + j]`:
/// no mask for the low nibbles. Every term is exact in
/// `i32x4.dot_i16x8_s`: `|a[16 + j] - 16 a[j]| <= 2159`.
#[derive(Clone, Copy)]
struct Nib {
    lo: [i16; 16],
    hi: [i16; 16],
    /// `[d, s]` of the block (`s`: Q8_1's `d * sum(qs)`, 0 for Q8_0).
    scales: [f32; 2],
    /// The sum of the block's quants.
    sum: i32,
}

impl Nib {
    fn new(qs: &[i8; 32], scales: [f32; 2]) -> Self {
        Nib {
            lo: core::array::from_fn(|j| i16::from(qs[j])),
            hi: core::array::from_fn(|j| i16::from(qs[16 + j]) - 16 * i16::from(qs[j])),
            scales,
            sum: qs.iter().map(|&q| i32::from(q)).sum(),
        }
    }
}

/// The exact sums of 32 nibbles of each of four rows (`words`: four words
/// of four rows) with the `T` activation blocks `a`, lanes as [`fold`]
/// wants them.
#[inline(always)]
fn nib_sums<const T: usize>(words: &[[u8; 16]; 4], a: [&Nib; T]) -> [v128; T] {
    let z = i32x4_splat(0);
    let mut sums = [[z; 2]; T];
    for (k, w) in words.iter().enumerate() {
        let w = ld(w);
        let (l, h) = (u16x8_extend_low_u8x16(w), u16x8_extend_high_u8x16(w));
        let (l4, h4) = (u16x8_shr(l, 4), u16x8_shr(h, 4));
        for t in 0..T {
            let (lo, hi) = (quad(&a[t].lo, 4 * k), quad(&a[t].hi, 4 * k));
            let s = &mut sums[t];
            s[0] = i32x4_add(
                s[0],
                i32x4_add(i32x4_dot_i16x8(l, lo), i32x4_dot_i16x8(l4, hi)),
            );
            s[1] = i32x4_add(
                s[1],
                i32x4_add(i32x4_dot_i16x8(h, lo), i32x4_dot_i16x8(h4, hi)),
            );
        }
    }
    sums.map(|[a, b]| fold(a, b))
}

// ------------------------------------------------------- 32-element formats

/// Q4_0 x Q8_0: the unsigned nibbles dotted, then 8 times the activation
/// sum taken off; `sumi * (dx * dy)` per block, as the per-row dot.
struct Q40;

impl Band for Q40 {
    type W = BlockQ4_0;
    type A = BlockQ8_0;
    type Step = Step<1, 4>;
    type Prep = Nib;
    fn prep(a: &BlockQ8_0) -> Nib {
        Nib::new(&a.qs, [fp16(a.d), 0.0])
    }
    #[inline(always)]
    fn step<const T: usize, const SUBNORMAL: bool>(
        s: &Step<1, 4>,
        a: [&Nib; T],
        acc: &mut [v128; T],
    ) {
        let [dx] = scales::<1, SUBNORMAL>(&s.scales);
        let sums = nib_sums(&s.words, a);
        for t in 0..T {
            let sumi = i32x4_sub(sums[t], i32x4_splat(8 * a[t].sum));
            let d = f32x4_mul(dx, f32x4_splat(a[t].scales[0]));
            acc[t] = f32x4_add(acc[t], f32x4_mul(f32x4_convert_i32x4(sumi), d));
        }
    }
    fn row(w: &[BlockQ4_0], a: &[BlockQ8_0]) -> f32 {
        simd128::vec_dot_q4_0_q8_0(w, a)
    }
}

/// Q4_1 x Q8_1: `(dx * dy) * sumi + mx * sy` per block, as the per-row dot.
struct Q41;

impl Band for Q41 {
    type W = BlockQ4_1;
    type A = BlockQ8_1;
    type Step = Step<2, 4>;
    type Prep = Nib;
    fn prep(a: &BlockQ8_1) -> Nib {
        Nib::new(&a.qs, [fp16(a.d), fp16(a.s)])
    }
    #[inline(always)]
    fn step<const T: usize, const SUBNORMAL: bool>(
        s: &Step<2, 4>,
        a: [&Nib; T],
        acc: &mut [v128; T],
    ) {
        let [dx, mx] = scales::<2, SUBNORMAL>(&s.scales);
        let sums = nib_sums(&s.words, a);
        for t in 0..T {
            let [dy, sy] = a[t].scales;
            let v = f32x4_add(
                f32x4_mul(f32x4_mul(dx, f32x4_splat(dy)), f32x4_convert_i32x4(sums[t])),
                f32x4_mul(mx, f32x4_splat(sy)),
            );
            acc[t] = f32x4_add(acc[t], v);
        }
    }
    fn row(w: &[BlockQ4_1], a: &[BlockQ8_1]) -> f32 {
        simd128::vec_dot_q4_1_q8_1(w, a)
    }
}

/// A Q8_0 activation block widened to i16, and its scale.
#[derive(Clone, Copy)]
struct Wide {
    q: [i16; 32],
    d: f32,
}

/// Q8_0 x Q8_0: `sumi * (dx * dy)` per block, as the per-row dot.
struct Q80;

impl Band for Q80 {
    type W = BlockQ8_0;
    type A = BlockQ8_0;
    type Step = Step<1, 8>;
    type Prep = Wide;
    fn prep(a: &BlockQ8_0) -> Wide {
        Wide {
            q: core::array::from_fn(|j| i16::from(a.qs[j])),
            d: fp16(a.d),
        }
    }
    #[inline(always)]
    fn step<const T: usize, const SUBNORMAL: bool>(
        s: &Step<1, 8>,
        a: [&Wide; T],
        acc: &mut [v128; T],
    ) {
        let [dx] = scales::<1, SUBNORMAL>(&s.scales);
        let z = i32x4_splat(0);
        let mut sums = [[z; 2]; T];
        for (k, w) in s.words.iter().enumerate() {
            let w = ld(w);
            let (l, h) = (i16x8_extend_low_i8x16(w), i16x8_extend_high_i8x16(w));
            for t in 0..T {
                let q = quad(&a[t].q, 4 * k);
                sums[t][0] = i32x4_add(sums[t][0], i32x4_dot_i16x8(l, q));
                sums[t][1] = i32x4_add(sums[t][1], i32x4_dot_i16x8(h, q));
            }
        }
        for t in 0..T {
            let sumi = fold(sums[t][0], sums[t][1]);
            let d = f32x4_mul(dx, f32x4_splat(a[t].d));
            acc[t] = f32x4_add(acc[t], f32x4_mul(f32x4_convert_i32x4(sumi), d));
        }
    }
    fn row(w: &[BlockQ8_0], a: &[BlockQ8_0]) -> f32 {
        simd128::vec_dot_q8_0_q8_0(w, a)
    }
}

// ------------------------------------------------------ 256-element formats

/// A Q8_K activation block widened to i16, its 32-element sums and scale.
#[derive(Clone, Copy)]
struct WideK {
    q: [i16; QK_K],
    /// The sums of each 16 quants.
    bsums: [i16; 16],
    /// `bsums[2j] + bsums[2j + 1]`: the sum of sub-block `j`'s 32 quants.
    sums: [i16; 8],
    d: f32,
}

impl WideK {
    fn new(a: &BlockQ8K) -> Self {
        WideK {
            q: core::array::from_fn(|j| i16::from(a.qs[j])),
            bsums: a.bsums,
            sums: core::array::from_fn(|j| a.bsums[2 * j].wrapping_add(a.bsums[2 * j + 1])),
            d: a.d,
        }
    }
}

/// Byte `k` of each u32 lane of `v` (lanes: rows).
#[inline(always)]
fn byte<const K: u32>(v: v128) -> v128 {
    v128_and(u32x4_shr(v, 8 * K), u32x4_splat(0xFF))
}

/// A [`Band`] `$name` of a 256-element format `$W` (block step `$step`,
/// activations as [`WideK`]) whose block step is `$f` and tail rows the
/// SIMD128 per-row dot `$row`. The step is a function of its own, called
/// once per block and band: inlined into the eight bands of a one-token
/// pass, a whole 256-element step's code left the instruction caches (Q6_K
/// from cache 2.8 GB/s instead of 6).
macro_rules! kquant {
    ($(#[$doc:meta])* $name:ident, $W:ty, $step:ty, $f:ident, $row:ident) => {
        $(#[$doc])*
        struct $name;

        impl Band for $name {
            type W = $W;
            type A = BlockQ8K;
            type Step = $step;
            type Prep = WideK;
            const TOUCH_ROUND: bool = true;
            fn prep(a: &BlockQ8K) -> WideK {
                WideK::new(a)
            }
            #[inline(never)]
            fn step<const T: usize, const SUBNORMAL: bool>(
                s: &$step,
                a: [&WideK; T],
                acc: &mut [v128; T],
            ) {
                $f::<T, SUBNORMAL>(s, a, acc)
            }
            fn row(w: &[$W], a: &[BlockQ8K]) -> f32 {
                simd128::$row(w, a)
            }
        }
    };
}

kquant!(
    /// Q4_K x Q8_K: per block and row, the exact `isum = sum_j sc_j *
    /// dot_j` and `mins = sum_j m_j * bsum_j`, then `(d * dy) * isum -
    /// (dmin * dy) * mins`, as the per-row dot. The block step: `d`,
    /// `dmin`, three words of the packed 6-bit scales and mins, then 32
    /// words of nibbles (chunk `c` of 64 elements: words `8c..8c + 8`, low
    /// nibbles sub-block `2c`, high ones `2c + 1`).
    Q4K, BlockQ4K, Step<2, 35>, q4k_step, vec_dot_q4_k_q8_k
);
kquant!(
    /// Q5_K x Q8_K: Q4_K's block with a fifth bit per quant, in the eight
    /// words of `qh` between the scales and the nibbles (bit `2c` of
    /// `qh[l]` for the low nibble of chunk `c`'s byte `l`, `2c + 1` for
    /// the high).
    Q5K, BlockQ5K, Step<2, 43>, q5k_step, vec_dot_q5_k_q8_k
);
kquant!(
    /// Q6_K x Q8_K: per block and row, the exact `isum = sum_j sc_j *
    /// (dot_j - 32 * bsum_j)` over its sixteen 16-element sub-blocks, then
    /// `(d * dy) * isum`, as the per-row dot. The block step: `d`, then 32
    /// words of `ql`, 16 of `qh` and 4 of the signed scales. Element `128 n
    /// + 32 k + l` of half `n` (`l < 32`, `k < 4`) has its low four bits in
    /// `ql[64 n + l]` (`k` = 0, 2: low / high nibble) or `ql[64 n + 32 +
    /// l]` (`k` = 1, 3), its high two in bits `2k` of `qh[32 n + l]`, and
    /// scale `8 n + 2 k + l / 16`. The quants of one `k` and four words of
    /// `l` (one sub-block) are built as bytes, four rows at a time, then
    /// widened and dotted.
    Q6K, BlockQ6K, Step<1, 52>, q6k_step, vec_dot_q6_k_q8_k
);
kquant!(
    /// IQ4_XS x Q8_K: per 32-element sub-block and row, the exact dot of
    /// the non-linear levels, then `((d * dy) * scale) * sumi` added
    /// sub-block by sub-block, as the per-row dot. The block step: `d`,
    /// `scales_h`, one word of `scales_l`, then 32 words of nibbles
    /// (sub-block `ib`: words `4ib..4ib + 4`, low nibbles its first 16
    /// elements, high ones the next 16).
    IQ4XS, BlockIQ4XS, Step<2, 33>, iq4xs_step, vec_dot_iq4_xs_q8_k
);

/// [`Q4K`]'s block step.
#[inline(always)]
fn q4k_step<const T: usize, const SUBNORMAL: bool>(
    s: &Step<2, 35>,
    a: [&WideK; T],
    acc: &mut [v128; T],
) {
    k45::<T, false, SUBNORMAL>(&s.scales, &s.words[..3], &[], &s.words[3..], a, acc);
}

/// [`Q5K`]'s block step.
#[inline(always)]
fn q5k_step<const T: usize, const SUBNORMAL: bool>(
    s: &Step<2, 43>,
    a: [&WideK; T],
    acc: &mut [v128; T],
) {
    k45::<T, true, SUBNORMAL>(
        &s.scales,
        &s.words[..3],
        &s.words[3..11],
        &s.words[11..],
        a,
        acc,
    );
}

/// A Q4_K (`FIFTH` false) or Q5_K block step of four rows by `T`
/// activation blocks `a`, added to `acc`: `d` and `dmin` in `halves`, the
/// packed scales in `sc`, the fifth bits in `qh` (Q5_K), the nibbles in
/// `qs`.
#[inline(always)]
fn k45<const T: usize, const FIFTH: bool, const SUBNORMAL: bool>(
    halves: &[[u8; 8]; 2],
    sc: &[[u8; 16]],
    qh: &[[u8; 16]],
    qs: &[[u8; 16]],
    a: [&WideK; T],
    acc: &mut [v128; T],
) {
    let z = i32x4_splat(0);
    let word = |w: &[[u8; 16]], at: usize| w.get(at).map_or(z, ld);
    let [d, dmin] = scales::<2, SUBNORMAL>(halves);
    let (s0, s1, s2) = (word(sc, 0), word(sc, 1), word(sc, 2));
    // Bytes j of each lane: scale j and min j (j < 4), then 4 + j.
    let m6 = u32x4_splat(0x3F3F_3F3F);
    let (m4, top) = (u32x4_splat(0x0F0F_0F0F), u32x4_splat(0x3030_3030));
    let sc_lo = v128_and(s0, m6);
    let mn_lo = v128_and(s1, m6);
    let sc_hi = v128_or(v128_and(s2, m4), v128_and(u32x4_shr(s0, 2), top));
    let mn_hi = v128_or(
        v128_and(u32x4_shr(s2, 4), m4),
        v128_and(u32x4_shr(s1, 2), top),
    );
    let sc = [
        byte::<0>(sc_lo),
        byte::<1>(sc_lo),
        byte::<2>(sc_lo),
        byte::<3>(sc_lo),
        byte::<0>(sc_hi),
        byte::<1>(sc_hi),
        byte::<2>(sc_hi),
        byte::<3>(sc_hi),
    ];
    let (nib, bit4) = (u16x8_splat(0x0F), u32x4_splat(0x1010_1010));
    for t in 0..T {
        let a = a[t];
        let mut isum = z;
        for c in 0..4 {
            let (mut l01, mut l23, mut h01, mut h23) = (z, z, z, z);
            for m in 0..8 {
                let w = word(qs, 8 * c + m);
                // The low and high quants of the word's bytes, widened:
                // rows 0-1 and 2-3.
                let [lo01, lo23, hi01, hi23] = if FIFTH {
                    // Bit 2c (2c + 1) of each qh byte to bit 4.
                    let h = word(qh, m);
                    let (hl, hh) = match c {
                        0 => (u32x4_shl(h, 4), u32x4_shl(h, 3)),
                        1 => (u32x4_shl(h, 2), u32x4_shl(h, 1)),
                        2 => (h, u32x4_shr(h, 1)),
                        _ => (u32x4_shr(h, 2), u32x4_shr(h, 3)),
                    };
                    let lo = v128_or(v128_and(w, m4), v128_and(hl, bit4));
                    let hi = v128_or(v128_and(u32x4_shr(w, 4), m4), v128_and(hh, bit4));
                    [
                        u16x8_extend_low_u8x16(lo),
                        u16x8_extend_high_u8x16(lo),
                        u16x8_extend_low_u8x16(hi),
                        u16x8_extend_high_u8x16(hi),
                    ]
                } else {
                    let (l, h) = (u16x8_extend_low_u8x16(w), u16x8_extend_high_u8x16(w));
                    [
                        v128_and(l, nib),
                        v128_and(h, nib),
                        u16x8_shr(l, 4),
                        u16x8_shr(h, 4),
                    ]
                };
                let lo = quad(&a.q, 64 * c + 4 * m);
                let hi = quad(&a.q, 64 * c + 32 + 4 * m);
                l01 = i32x4_add(l01, i32x4_dot_i16x8(lo01, lo));
                l23 = i32x4_add(l23, i32x4_dot_i16x8(lo23, lo));
                h01 = i32x4_add(h01, i32x4_dot_i16x8(hi01, hi));
                h23 = i32x4_add(h23, i32x4_dot_i16x8(hi23, hi));
            }
            isum = i32x4_add(isum, i32x4_mul(fold(l01, l23), sc[2 * c]));
            isum = i32x4_add(isum, i32x4_mul(fold(h01, h23), sc[2 * c + 1]));
        }
        // sum_j m_j * bsum_j: the mins widened, by the sums in pairs.
        let (b0, b1) = (quad(&a.sums, 0), quad(&a.sums, 4));
        let pairs = |m: v128, b: v128| {
            let lo = i32x4_dot_i16x8(u16x8_extend_low_u8x16(m), b);
            (lo, i32x4_dot_i16x8(u16x8_extend_high_u8x16(m), b))
        };
        let ((p01, p23), (q01, q23)) = (pairs(mn_lo, b0), pairs(mn_hi, b1));
        let mins = fold(i32x4_add(p01, q01), i32x4_add(p23, q23));
        let dy = f32x4_splat(a.d);
        let v = f32x4_sub(
            f32x4_mul(f32x4_mul(d, dy), f32x4_convert_i32x4(isum)),
            f32x4_mul(f32x4_mul(dmin, dy), f32x4_convert_i32x4(mins)),
        );
        acc[t] = f32x4_add(acc[t], v);
    }
}

/// [`Q6K`]'s block step.
#[inline(always)]
fn q6k_step<const T: usize, const SUBNORMAL: bool>(
    s: &Step<1, 52>,
    a: [&WideK; T],
    acc: &mut [v128; T],
) {
    let [d] = scales::<1, SUBNORMAL>(&s.scales);
    let sc = &s.words[48..];
    for t in 0..T {
        let a = a[t];
        // The four quarters (half `n`, then `half`) with constant indices
        // throughout: a loop over them left LLVM a scale's shift that
        // varied with `half`, which it made a per-lane shift that V8 does
        // lane by lane in scalar registers.
        let isum = q6_quarter::<0, 0>(s, a, i32x4_splat(0));
        let isum = q6_quarter::<0, 1>(s, a, isum);
        let isum = q6_quarter::<1, 0>(s, a, isum);
        let isum = q6_quarter::<1, 1>(s, a, isum);
        // 32 * sum_j sc_j * bsum_j: the signed scales widened, by the
        // 16-element sums.
        let mut o01 = i32x4_splat(0);
        let mut o23 = o01;
        for (w, sc) in sc.iter().enumerate() {
            let v = ld(sc);
            let b = quad(&a.bsums, 4 * w);
            o01 = i32x4_add(o01, i32x4_dot_i16x8(i16x8_extend_low_i8x16(v), b));
            o23 = i32x4_add(o23, i32x4_dot_i16x8(i16x8_extend_high_i8x16(v), b));
        }
        let isum = i32x4_sub(isum, i32x4_shl(fold(o01, o23), 5));
        let dy = f32x4_splat(a.d);
        acc[t] = f32x4_add(
            acc[t],
            f32x4_mul(f32x4_mul(d, dy), f32x4_convert_i32x4(isum)),
        );
    }
}

/// `isum` plus the four sub-blocks of quarter (`N`, `HALF`) of a Q6_K
/// block step, each by its scale `8 N + 2 k + HALF`. A function of its
/// own: the four quarters inlined into one step left V8 spilling a third
/// of its vector registers' traffic (8.9 GB/s from cache; 10.4 so).
#[inline(never)]
fn q6_quarter<const N: usize, const HALF: usize>(s: &Step<1, 52>, a: &WideK, isum: v128) -> v128 {
    let sums = q6_subs(s, a, N, HALF);
    let sc = &s.words[48..];
    let mut isum = isum;
    for (k, sums) in sums.into_iter().enumerate() {
        isum = i32x4_add(isum, i32x4_mul(sums, q6_scale(sc, 8 * N + 2 * k + HALF)));
    }
    isum
}

/// The exact dots of four 16-element sub-blocks of four rows, one per kind
/// `k` of quant: elements `128 n + 32 k + 16 half ..` of the block step
/// `s` (kind `k`: the low (`k` < 2) or high nibbles of the `ql` words `16
/// n + 8 (k % 2) + 4 half ..`, bits `2k` of the `qh` words `8 n + 4 half
/// ..`), with their activations in `a`. Lane `r`: row `r`. Each word is
/// loaded once for the four kinds: loading it per kind let the compiler
/// merge the loads and keep their values live across the block (V8 then
/// spilled most of them).
#[inline(always)]
fn q6_subs(s: &Step<1, 52>, a: &WideK, n: usize, half: usize) -> [v128; 4] {
    let (m4, top) = (u32x4_splat(0x0F0F_0F0F), u32x4_splat(0x3030_3030));
    let z = i32x4_splat(0);
    let mut sums = [[z; 2]; 4];
    let word = |at: usize| s.words.get(at).map_or(z, ld);
    for i in 0..4 {
        let (qa, qb) = (word(16 * n + 4 * half + i), word(16 * n + 8 + 4 * half + i));
        let qh = word(32 + 8 * n + 4 * half + i);
        let q = [
            v128_or(v128_and(qa, m4), v128_and(u32x4_shl(qh, 4), top)),
            v128_or(v128_and(qb, m4), v128_and(u32x4_shl(qh, 2), top)),
            v128_or(v128_and(u32x4_shr(qa, 4), m4), v128_and(qh, top)),
            v128_or(
                v128_and(u32x4_shr(qb, 4), m4),
                v128_and(u32x4_shr(qh, 2), top),
            ),
        ];
        for (k, (q, s)) in q.into_iter().zip(&mut sums).enumerate() {
            let act = quad(&a.q, 128 * n + 32 * k + 16 * half + 4 * i);
            s[0] = i32x4_add(s[0], i32x4_dot_i16x8(u16x8_extend_low_u8x16(q), act));
            s[1] = i32x4_add(s[1], i32x4_dot_i16x8(u16x8_extend_high_u8x16(q), act));
        }
    }
    sums.map(|[a, b]| fold(a, b))
}

/// Signed scale `j` (of 16) of each row: byte `j % 4` of word `j / 4`.
#[inline(always)]
fn q6_scale(sc: &[[u8; 16]], j: usize) -> v128 {
    let w = ld(&sc[j / 4]);
    let up = match j % 4 {
        0 => i32x4_shl(w, 24),
        1 => i32x4_shl(w, 16),
        2 => i32x4_shl(w, 8),
        _ => w,
    };
    i32x4_shr(up, 24)
}

/// IQ4_NL's levels plus 128, as bytes 1..=241: unsigned, they widen to
/// i16 in one instruction each (the signed high half takes two in V8,
/// both on the ports of `pmaddwd`); `128 * sum(a)` comes back per
/// sub-block.
const KVALUES_UP: [u8; 16] = {
    let mut up = [0u8; 16];
    let mut j = 0;
    while j < 16 {
        up[j] = (KVALUES_IQ4NL[j] as u8) ^ 0x80;
        j += 1;
    }
    up
};

/// [`IQ4XS`]'s block step.
#[inline(always)]
fn iq4xs_step<const T: usize, const SUBNORMAL: bool>(
    s: &Step<2, 33>,
    a: [&WideK; T],
    acc: &mut [v128; T],
) {
    let [d] = scales::<1, SUBNORMAL>(&[s.scales[0]]);
    // SAFETY: `s.scales[1]` holds 8 readable bytes; no alignment needed.
    let high = u32x4_extend_low_u16x8(unsafe { v128_load64_zero(s.scales[1].as_ptr().cast()) });
    let low = ld(&s.words[0]);
    let kv = ld(&KVALUES_UP);
    let m4 = u32x4_splat(0x0F0F_0F0F);
    for t in 0..T {
        let a = a[t];
        let dd = f32x4_mul(d, f32x4_splat(a.d));
        for ib in 0..8 {
            // The four words of sub-block `ib`, each: its four rows' low
            // nibbles (elements `4i..4i + 4` of the sub-block) and high
            // ones (`16 + 4i..`), dotted as levels + 128. One array map,
            // which LLVM unrolls whole (a loop here kept V8's per-iteration
            // stack check).
            let words: [&[u8; 16]; 4] = core::array::from_fn(|i| &s.words[1 + 4 * ib + i]);
            let parts = core::array::from_fn::<_, 4, _>(|i| {
                let w = ld(words[i]);
                let lo = i8x16_swizzle(kv, v128_and(w, m4));
                let hi = i8x16_swizzle(kv, v128_and(u32x4_shr(w, 4), m4));
                let (alo, ahi) = (
                    quad(&a.q, 32 * ib + 4 * i),
                    quad(&a.q, 32 * ib + 16 + 4 * i),
                );
                let s01 = i32x4_add(
                    i32x4_dot_i16x8(u16x8_extend_low_u8x16(lo), alo),
                    i32x4_dot_i16x8(u16x8_extend_low_u8x16(hi), ahi),
                );
                let s23 = i32x4_add(
                    i32x4_dot_i16x8(u16x8_extend_high_u8x16(lo), alo),
                    i32x4_dot_i16x8(u16x8_extend_high_u8x16(hi), ahi),
                );
                (s01, s23)
            });
            let s01 = i32x4_add(
                i32x4_add(parts[0].0, parts[1].0),
                i32x4_add(parts[2].0, parts[3].0),
            );
            let s23 = i32x4_add(
                i32x4_add(parts[0].1, parts[1].1),
                i32x4_add(parts[2].1, parts[3].1),
            );
            let sumi = i32x4_sub(fold(s01, s23), i32x4_splat(i32::from(a.sums[ib]) << 7));
            // Scale `ib`: four bits of `scales_l`, two of `scales_h`, minus 32.
            let l4 = v128_and(u32x4_shr(low, 4 * ib as u32), u32x4_splat(0xF));
            let h2 = v128_and(u32x4_shr(high, 2 * ib as u32), u32x4_splat(3));
            let scale = i32x4_sub(v128_or(l4, i32x4_shl(h2, 4)), i32x4_splat(32));
            let v = f32x4_mul(
                f32x4_mul(dd, f32x4_convert_i32x4(scale)),
                f32x4_convert_i32x4(sumi),
            );
            acc[t] = f32x4_add(acc[t], v);
        }
    }
}
