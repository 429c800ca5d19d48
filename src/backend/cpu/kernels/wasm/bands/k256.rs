//! The bands of the 256-element formats (Q4_K, Q5_K, Q6_K, IQ4_XS): their
//! activations widened once per call ([`WideK`]) and each format's block
//! step, a function of its own.

use super::*;

/// A Q8_K activation block widened to i16, its 32-element sums and scale.
#[derive(Clone, Copy)]
pub(super) struct WideK {
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
        pub(super) struct $name;

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
