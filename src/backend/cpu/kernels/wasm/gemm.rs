//! SIMD128 tiles: four weight rows against one activation row per call
//! (decode), or against two (prefill: each weight block decoded and its
//! scales converted once for both tokens; the rows stay in L1 across the
//! batch).
//!
//! The weights come interleaved in groups of four rows (block `b` of row
//! `r` at `4 * b + r`, `kernels::interleave_rows`, done once at load): a
//! tile then reads one stream in address order. wasm has no prefetch
//! instruction, and four streams a row apart left the hardware prefetchers
//! behind: a 640 x 131072 Q8_0 matrix (171 MB) read at 8 GB/s that way
//! (with a line of every row touched ahead), 19.6 GB/s interleaved.
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
//! Q5_0 weights are stored as Q8_0 (`wasm::widen`) and use its tile.
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

use super::simd128::{hi4, ld, ldi, lo4, scaled_bsums};
use crate::backend::cpu::kernels::kquants::scale_min_k4;
use crate::backend::cpu::kernels::{blocks, fp16, GemmFn, Out, GROUP_ROWS};
use crate::quant::blocks::{BlockQ4K, BlockQ4_0, BlockQ4_1, BlockQ8K, BlockQ8_0, BlockQ8_1};
use crate::quant::GgmlType;

/// The tiled kernel of weight type `ty`, `None` where the matmul keeps
/// dotting row by row.
pub(super) fn gemm(ty: GgmlType) -> Option<GemmFn> {
    let f: GemmFn = match ty {
        GgmlType::Q4_0 => tiles::<Q40>,
        GgmlType::Q4_1 => tiles::<Q41>,
        GgmlType::Q8_0 => tiles::<Q80>,
        GgmlType::Q4_K => tiles::<Q4K>,
        _ => return None,
    };
    Some(f)
}

/// A tile kernel: four weight rows (a [`Rows`]) dotted with `T` activation
/// rows, for each activation row the four results as f32 lanes. Rows longer
/// than the shortest are dotted over the common length.
trait Tile {
    /// The weight block.
    type W: Pod;
    /// The activation block.
    type A: ActBlock;
    /// Whether the kernel reads [`Acts::nib`] (laid out once per call).
    const NIB: bool = false;
    /// The four rows `w` by the activation rows `a`.
    fn dot<R: Rows<Self::W>, const T: usize>(w: R, a: [Acts<'_, Self::A>; T]) -> [v128; T];
}

/// The four weight rows of a tile.
trait Rows<W>: Copy {
    /// Blocks per row.
    fn len(&self) -> usize;
    /// Block `b` of each row.
    fn blocks(&self, b: usize) -> [&W; 4];
}

/// Four rows apart: the last group of a weight whose rows are not a
/// multiple of four (its last row repeated), never interleaved.
#[derive(Clone, Copy)]
struct Apart<'a, W>([&'a [W]; 4]);

impl<W: Pod> Rows<W> for Apart<'_, W> {
    fn len(&self) -> usize {
        self.0.iter().map(|r| r.len()).min().unwrap_or(0)
    }
    #[inline(always)]
    fn blocks(&self, b: usize) -> [&W; 4] {
        [&self.0[0][b], &self.0[1][b], &self.0[2][b], &self.0[3][b]]
    }
}

/// A whole group of four rows, interleaved (`kernels::interleave_rows`):
/// block `b` of row `r` at `4 * b + r`, so the tile reads one stream in
/// address order, which the hardware prefetchers follow. Read as four
/// streams a row apart, a tile took 2.3 times as long from memory, and
/// reading a line of each row ahead (wasm has no prefetch) won half of it.
#[derive(Clone, Copy)]
struct Grouped<'a, W>(&'a [W]);

impl<W: Pod> Rows<W> for Grouped<'_, W> {
    fn len(&self) -> usize {
        self.0.len() / GROUP_ROWS
    }
    #[inline(always)]
    fn blocks(&self, b: usize) -> [&W; 4] {
        let g = &self.0[GROUP_ROWS * b..GROUP_ROWS * (b + 1)];
        [&g[0], &g[1], &g[2], &g[3]]
    }
}

/// One activation row: its blocks, and each block's scales as f32
/// ([`ActBlock::scales`]), converted once per call rather than once per
/// group of four weight rows.
#[derive(Clone, Copy)]
struct Acts<'a, A> {
    blocks: &'a [A],
    scales: &'a [[f32; 2]],
    /// The blocks as [`NibAct`] for the kernels with [`Tile::NIB`],
    /// empty for the others.
    nib: &'a [NibAct],
}

/// An activation block type: its scale and, for Q8_1, its `d * sum(qs)`,
/// as the scalar kernels convert them.
trait ActBlock: Pod {
    /// `[d, s]` as f32 (`s` is 0 for the formats without it).
    fn scales(&self) -> [f32; 2];
    /// The quants.
    fn qs(&self) -> &[i8];
}

impl ActBlock for BlockQ8_0 {
    fn scales(&self) -> [f32; 2] {
        [fp16(self.d), 0.0]
    }
    fn qs(&self) -> &[i8] {
        &self.qs
    }
}

impl ActBlock for BlockQ8_1 {
    fn scales(&self) -> [f32; 2] {
        [fp16(self.d), fp16(self.s)]
    }
    fn qs(&self) -> &[i8] {
        &self.qs
    }
}

impl ActBlock for BlockQ8K {
    fn scales(&self) -> [f32; 2] {
        [self.d, 0.0]
    }
    fn qs(&self) -> &[i8] {
        &self.qs
    }
}

/// Every weight row of `weights` with every activation row of `acts`, by
/// tile kernel `K`: four weight rows by two activation rows per call (the
/// weight blocks decoded once for both), one for an odd last token. Whole
/// groups of four rows are read interleaved; a last partial group is read
/// plain, repeating its last row and dropping the copies' results.
/// Computes nothing for shapes that do not fit `out`.
fn tiles<K: Tile>(weights: &[u8], row_bytes: usize, acts: &[u8], act_bytes: usize, out: Out<'_>) {
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
    let act = |t: usize| blocks::<K::A>(&acts[t * act_bytes..(t + 1) * act_bytes]);
    let blocks_of: Vec<_> = (0..toks).map(act).collect();
    let scales: Vec<Vec<[f32; 2]>> = blocks_of
        .iter()
        .map(|a| a.iter().map(ActBlock::scales).collect())
        .collect();
    let nibs: Vec<Vec<NibAct>> = blocks_of
        .iter()
        .map(|a| match K::NIB {
            true => a.iter().map(|b| NibAct::new(b.qs())).collect(),
            false => Vec::new(),
        })
        .collect();
    let acts: Vec<Acts<'_, K::A>> = blocks_of
        .iter()
        .zip(&scales)
        .zip(&nibs)
        .map(|((b, s), n)| Acts {
            blocks: b,
            scales: s,
            nib: n,
        })
        .collect();
    let whole = rows / GROUP_ROWS * GROUP_ROWS;
    for r0 in two_streams(rows.div_ceil(GROUP_ROWS)).map(|g| g * GROUP_ROWS) {
        let live = (rows - r0).min(GROUP_ROWS);
        let mut put = |t: usize, v: v128| {
            let lanes = [
                f32x4_extract_lane::<0>(v),
                f32x4_extract_lane::<1>(v),
                f32x4_extract_lane::<2>(v),
                f32x4_extract_lane::<3>(v),
            ];
            for (i, &x) in lanes.iter().enumerate().take(live) {
                out[(r0 + i) * row_stride + t * tok_stride] = x;
            }
        };
        if r0 < whole {
            let g = blocks::<K::W>(&weights[r0 * row_bytes..(r0 + GROUP_ROWS) * row_bytes]);
            by_acts::<K, _>(Grouped(&g), &acts, &mut put);
        } else {
            let row = |i: usize| {
                let r = (r0 + i).min(rows - 1);
                blocks::<K::W>(&weights[r * row_bytes..(r + 1) * row_bytes])
            };
            let ws = [row(0), row(1), row(2), row(3)];
            let w = Apart([&*ws[0], &*ws[1], &*ws[2], &*ws[3]]);
            by_acts::<K, _>(w, &acts, &mut put);
        }
    }
}

/// The indices `0..n` with the first and the second half interleaved
/// (`0, h, 1, h + 1, ..` for `h = n.div_ceil(2)`): the order in which
/// [`tiles`] takes the groups of a weight, so that two streams run through
/// memory instead of one. wasm has no prefetch instruction, and one stream
/// leaves the hardware prefetchers behind: SmolLM2's decode in Node 20 on a
/// Xeon (weights from L3 and memory) went from 38 to 56 tokens/s and
/// Gemma-3's from 13-15 to 22. Four streams measured the same as two;
/// loading a byte a page ahead instead (a demand load stalls where a
/// prefetch would not) lost a fifth.
fn two_streams(n: usize) -> impl Iterator<Item = usize> {
    let half = n.div_ceil(2);
    (0..half)
        .flat_map(move |i| [i, i + half])
        .filter(move |&i| i < n)
}

/// The four rows `w` by every activation row, two at a time; `put(t, v)`
/// takes activation row `t`'s results.
#[inline(always)]
fn by_acts<K: Tile, R: Rows<K::W>>(
    w: R,
    acts: &[Acts<'_, K::A>],
    put: &mut impl FnMut(usize, v128),
) {
    let mut pairs = acts.chunks_exact(2);
    for (i, p) in pairs.by_ref().enumerate() {
        let [v0, v1] = K::dot(w, [p[0], p[1]]);
        put(2 * i, v0);
        put(2 * i + 1, v1);
    }
    if let [a] = pairs.remainder() {
        let [v] = K::dot(w, [*a]);
        put(acts.len() - 1, v);
    }
}

/// The number of blocks every row of `w` and `a` has.
#[inline(always)]
fn common<W, R: Rows<W>, A, const T: usize>(w: &R, a: &[Acts<'_, A>; T]) -> usize {
    let na = a.iter().map(|r| r.blocks.len().min(r.scales.len()));
    na.min().unwrap_or(0).min(w.len())
}

/// A [`Tile`] named `$name` whose kernel `$f` takes every activation row
/// of a call at once.
macro_rules! tile {
    ($name:ident, $w:ty, $a:ty, $f:ident, $doc:literal $(, nib: $nib:literal)?) => {
        #[doc = $doc]
        struct $name;

        impl Tile for $name {
            type W = $w;
            type A = $a;
            $(const NIB: bool = $nib;)?
            fn dot<R: Rows<$w>, const T: usize>(w: R, a: [Acts<'_, $a>; T]) -> [v128; T] {
                $f(w, a)
            }
        }
    };
}

tile!(Q40, BlockQ4_0, BlockQ8_0, q4_0x4, "Q4_0 x Q8_0.", nib: true);
tile!(Q41, BlockQ4_1, BlockQ8_1, q4_1x4, "Q4_1 x Q8_1.", nib: true);
tile!(Q80, BlockQ8_0, BlockQ8_0, q8_0x4, "Q8_0 x Q8_0.");

/// Q4_K x Q8_K (one activation row at a time).
struct Q4K;

impl Tile for Q4K {
    type W = BlockQ4K;
    type A = BlockQ8K;
    fn dot<R: Rows<BlockQ4K>, const T: usize>(w: R, a: [Acts<'_, BlockQ8K>; T]) -> [v128; T] {
        a.map(|a| q4_kx4(w, a))
    }
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

/// The first four bytes of each row's block, one u32 lane per row: the
/// fp16 scale in the low half, and for Q4_1 its fp16 minimum in the high
/// half. Four lane loads, where converting each scale apart cost a dozen
/// instructions a row.
#[inline(always)]
fn heads<W: Pod>(x: [&W; 4]) -> v128 {
    let head = |b: &W| {
        let b = bytemuck::bytes_of(b);
        u32::from_le_bytes([b[0], b[1], b[2], b[3]])
    };
    u32x4(head(x[0]), head(x[1]), head(x[2]), head(x[3]))
}

/// The four f16 in the low halves of `h`'s u32 lanes as f32, for finite
/// values only: [`super::simd128::h2f`] without its infinity / NaN case, which cost a
/// tenth of a Q4_1 tile (the weights' kernels say so,
/// `WeightKernels::gemm_finite_scales`, and a weight with a non-finite
/// scale never reaches the tiles).
#[inline(always)]
fn h2f_lo(h: v128) -> v128 {
    h2f_bits(i32x4_shr(i32x4_shl(h, 16), 3))
}

/// [`h2f_lo`] of the high halves.
#[inline(always)]
fn h2f_hi(h: v128) -> v128 {
    h2f_bits(i32x4_shr(h, 3))
}

/// A half's sign, exponent and mantissa shifted into f32 position (sign at
/// bit 31, the rest at bits 13..28; other bits ignored) times 2^112: its
/// value, subnormals included.
#[inline(always)]
fn h2f_bits(shifted: v128) -> v128 {
    let bits = v128_and(shifted, u32x4_splat(0x8FFF_E000));
    f32x4_mul(bits, f32x4_splat(f32::from_bits((127 + 112) << 23)))
}

/// One scale per lane, each the block's f32 scale times the activation's.
#[inline(always)]
fn scale4(dx: v128, dy: f32) -> v128 {
    f32x4_mul(dx, f32x4_splat(dy))
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

/// One activation block of 32 laid out, once per call, for the dot of 32
/// nibbles packed as in Q4_0 and Q4_1 (the low nibble of byte `j` is
/// element `j`, its high nibble element `16 + j`), and the block's sum.
///
/// With relaxed SIMD, `v[0]` and `v[1]` hold the raw bytes of elements
/// 0..16 and 16..32. Without it, `v[0]` and `v[1]` hold elements 0..16
/// widened to i16 and `v[2]`, `v[3]` hold `a[16 + j] - 16 * a[j]`: the
/// weight bytes, widened, are then dotted whole (`lo + 16 * hi` against
/// `a[j]`) and their high nibbles against the difference, which leaves
/// `lo * a[j] + hi * a[16 + j]` and saves the two masks of the low
/// nibbles (two of thirteen operations a row and block). Every term is
/// exact in `i32x4.dot_i16x8_s`: `|a[16 + j] - 16 * a[j]| <= 2159`.
#[derive(Clone, Copy)]
struct NibAct {
    v: [v128; 4],
    sum: i32,
}

impl NibAct {
    /// The layout of 32 quants `qs`.
    fn new(qs: &[i8]) -> Self {
        let (a0, a1) = (ldi(qs, 0), ldi(qs, 16));
        let sum = qs.iter().take(32).map(|&q| i32::from(q)).sum();
        #[cfg(target_feature = "relaxed-simd")]
        let v = [a0, a1, a0, a1];
        #[cfg(not(target_feature = "relaxed-simd"))]
        let v = {
            let (l0, l1) = (i16x8_extend_low_i8x16(a0), i16x8_extend_high_i8x16(a0));
            let (h0, h1) = (i16x8_extend_low_i8x16(a1), i16x8_extend_high_i8x16(a1));
            [
                l0,
                l1,
                i16x8_sub(h0, i16x8_shl(l0, 4)),
                i16x8_sub(h1, i16x8_shl(l1, 4)),
            ]
        };
        NibAct { v, sum }
    }
}

/// Four i32 lanes summing to `sum(w[i] * a[i])` over the 32 nibbles `q`
/// (packed as in Q4_0) and the activation block `a`.
#[inline(always)]
fn dot32_nib(q: v128, a: &NibAct) -> v128 {
    #[cfg(target_feature = "relaxed-simd")]
    {
        let z = i32x4_splat(0);
        i32x4_relaxed_dot_i8x16_i7x16_add(
            a.v[0],
            lo4(q),
            i32x4_relaxed_dot_i8x16_i7x16_add(a.v[1], hi4(q), z),
        )
    }
    #[cfg(not(target_feature = "relaxed-simd"))]
    {
        let (l, h) = (u16x8_extend_low_u8x16(q), u16x8_extend_high_u8x16(q));
        let s0 = i32x4_dot_i16x8(l, a.v[0]);
        let s1 = i32x4_dot_i16x8(h, a.v[1]);
        let s2 = i32x4_dot_i16x8(u16x8_shr(l, 4), a.v[2]);
        let s3 = i32x4_dot_i16x8(u16x8_shr(h, 4), a.v[3]);
        i32x4_add(i32x4_add(s0, s1), i32x4_add(s2, s3))
    }
}

// ------------------------------------------------------- 32-element formats

/// Q4_0 x Q8_0, four rows by `T` activation rows: the unsigned nibbles
/// dotted, then 8 times the activation sum taken off; `sumi * (dx * dy)`
/// per block, as the scalar kernel.
fn q4_0x4<R: Rows<BlockQ4_0>, const T: usize>(w: R, a: [Acts<'_, BlockQ8_0>; T]) -> [v128; T] {
    let n = common(&w, &a).min(a.iter().map(|r| r.nib.len()).min().unwrap_or(0));
    let a = a.map(|r| (&r.nib[..n], &r.scales[..n]));
    let mut acc = [f32x4_splat(0.0); T];
    for b in 0..n {
        let x = w.blocks(b);
        let q = x.map(|bx| ld(&bx.qs, 0));
        let dx = h2f_lo(heads(x));
        for t in 0..T {
            let (act, sy) = (&a[t].0[b], a[t].1[b]);
            let off = i32x4_splat(8 * act.sum);
            let sumi = i32x4_sub(hsum4(q.map(|q| dot32_nib(q, act))), off);
            let v = f32x4_mul(f32x4_convert_i32x4(sumi), scale4(dx, sy[0]));
            acc[t] = f32x4_add(acc[t], v);
        }
    }
    acc
}

/// Q4_1 x Q8_1, four rows by `T` activation rows: `(dx * dy) * sumi + mx *
/// sy` per block, as the scalar kernel.
fn q4_1x4<R: Rows<BlockQ4_1>, const T: usize>(w: R, a: [Acts<'_, BlockQ8_1>; T]) -> [v128; T] {
    let n = common(&w, &a).min(a.iter().map(|r| r.nib.len()).min().unwrap_or(0));
    let a = a.map(|r| (&r.nib[..n], &r.scales[..n]));
    let mut acc = [f32x4_splat(0.0); T];
    for b in 0..n {
        let x = w.blocks(b);
        let q = x.map(|bx| ld(&bx.qs, 0));
        let dm = heads(x);
        let (dx, mx) = (h2f_lo(dm), h2f_hi(dm));
        for t in 0..T {
            let (act, sy) = (&a[t].0[b], a[t].1[b]);
            let sumi = hsum4(q.map(|q| dot32_nib(q, act)));
            let v = f32x4_add(
                f32x4_mul(scale4(dx, sy[0]), f32x4_convert_i32x4(sumi)),
                scale4(mx, sy[1]),
            );
            acc[t] = f32x4_add(acc[t], v);
        }
    }
    acc
}

/// Q8_0 x Q8_0, four rows by `T` activation rows: `sumi * (dx * dy)` per
/// block, as the scalar kernel.
fn q8_0x4<R: Rows<BlockQ8_0>, const T: usize>(w: R, a: [Acts<'_, BlockQ8_0>; T]) -> [v128; T] {
    let n = common(&w, &a);
    let a = a.map(|r| (&r.blocks[..n], &r.scales[..n]));
    let mut acc = [f32x4_splat(0.0); T];
    for b in 0..n {
        let x = w.blocks(b);
        let dx = h2f_lo(heads(x));
        for t in 0..T {
            let (by, sy) = (&a[t].0[b], a[t].1[b]);
            let act = act32(&by.qs, 0);
            let dot = |q: &[i8; 32]| dot32_s(ldi(q, 0), ldi(q, 16), &act);
            let sumi = hsum4([dot(&x[0].qs), dot(&x[1].qs), dot(&x[2].qs), dot(&x[3].qs)]);
            let v = f32x4_mul(f32x4_convert_i32x4(sumi), scale4(dx, sy[0]));
            acc[t] = f32x4_add(acc[t], v);
        }
    }
    acc
}

// ------------------------------------------------------ 256-element formats

/// Q4_K x Q8_K, four rows: each block's exact `sum_j sc_j * dot_j` and
/// `sum_j min_j * bsum_j`, then `d * dy * isum - dmin * dy * mins` per lane
/// (the SIMD128 per-row kernel's order).
fn q4_kx4<R: Rows<BlockQ4K>>(w: R, a: Acts<'_, BlockQ8K>) -> v128 {
    let n = common(&w, &[a]);
    let mut acc = f32x4_splat(0.0);
    for (b, by) in a.blocks[..n].iter().enumerate() {
        let x = w.blocks(b);
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
        let dm = heads(x);
        let (d, dmin) = (h2f_lo(dm), h2f_hi(dm));
        let dy = f32x4_splat(by.d);
        let t = f32x4_sub(
            f32x4_mul(f32x4_mul(d, dy), isum),
            f32x4_mul(f32x4_mul(dmin, dy), mins),
        );
        acc = f32x4_add(acc, t);
    }
    acc
}

#[cfg(test)]
mod tests {
    use super::two_streams;

    #[test]
    fn two_streams_visits_every_index_once_from_both_halves() {
        for n in 0..40 {
            let order: Vec<usize> = two_streams(n).collect();
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, (0..n).collect::<Vec<_>>(), "n {n}: {order:?}");
            let h = n.div_ceil(2);
            for (k, pair) in order.chunks(2).enumerate() {
                assert_eq!(pair[0], k, "n {n}: {order:?}");
                if let Some(&second) = pair.get(1) {
                    assert_eq!(second, k + h, "n {n}: {order:?}");
                }
            }
        }
    }
}
