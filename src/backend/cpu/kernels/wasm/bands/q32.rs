//! The bands of the 32-element formats (Q4_0, Q4_1, Q8_0; Q5_0 as Q8_0):
//! their activations prepared once per call ([`Nib`], [`Wide`]) and each
//! format's block step.

use super::*;

/// One activation block of 32 laid out for the nibble formats (Q4_0,
/// Q4_1: the low nibble of byte `j` is element `j`, its high nibble
/// element `16 + j`): `lo[j] = a[j]` and `hi[j] = a[16 + j] - 16 a[j]` as
/// i16. A weight byte `b = lo + 16 hi`, widened whole, dotted with `lo[j]`
/// and its high nibble with `hi[j]` leaves `lo * a[j] + hi * a[16 + j]`:
/// no mask for the low nibbles. Every term is exact in
/// `i32x4.dot_i16x8_s`: `|a[16 + j] - 16 a[j]| <= 2159`.
#[derive(Clone, Copy)]
pub(super) struct Nib {
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
pub(super) struct Q40;

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
pub(super) struct Q41;

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
pub(super) struct Wide {
    q: [i16; 32],
    d: f32,
}

/// Q8_0 x Q8_0: `sumi * (dx * dy)` per block, as the per-row dot.
pub(super) struct Q80;

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
