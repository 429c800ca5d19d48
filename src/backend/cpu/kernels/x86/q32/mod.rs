//! The 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, IQ4_NL) against
//! Q8_0 / Q8_1 activations: their decoding for the banded kernels
//! ([`Format`], [`Act`]) and the transposed activations ([`Packed`],
//! [`pack`]); the kernels by kind:
//! - `dots.rs`, `dots_vnni.rs`: per-row dots (AVX2, AVX-512 VNNI), the
//!   table's `vec_dot`;
//! - `tiles16.rs`: AVX-512 VNNI tiles of 16 tokens per register (over
//!   banded or plain rows), which also run one token through `one_token.rs`;
//! - `one_token.rs`: AVX-512 one-token passes over plain rows (bands of
//!   eight) and over banded groups of 16 rows;
//! - `tiles8.rs`: AVX2 tiles of 8 tokens per register;
//! - `lane_tiles.rs`: the eight-lane tile kernel (`x86/lane_tiles.rs`).

pub(super) mod dots;
pub(super) mod dots_vnni;
pub(super) mod lane_tiles;
mod one_token;
pub(super) mod tiles16;
pub(super) mod tiles8;

use std::arch::x86_64::*;

use bytemuck::Pod;
use half::f16;

use super::simd::{h2f, nibbles};
use super::tiling::Lines;
use crate::quant::blocks::{
    BlockIQ4NL, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, KVALUES_IQ4NL,
};
use dots::{iq4_levels, q5_quants};

/// 4-byte groups per 32-element block.
const WORDS: usize = 8;

/// Transposed activations of up to `GROUPS * GROUP` tokens (the AVX2
/// kernels of `tiles8.rs` use the same layout with groups of 8).
#[derive(Default)]
pub(super) struct Packed {
    /// `[g][b][word][16 tokens]`: four quants of each token per u32.
    pub(super) codes: Lines<u32>,
    /// `[g][b][16 tokens]`: block scales (0 for padding tokens).
    pub(super) d: Lines<f32>,
    /// `[g][b][16 tokens]`: Q8_1's `s` (0 for Q8_0).
    pub(super) s: Lines<f32>,
    /// `[g][b][16 tokens]`: sums of the quants.
    pub(super) sums: Lines<i32>,
}

/// An activation block (Q8_0 or Q8_1): its scales as f16, converted by
/// the kernels with F16C (`half`'s conversion is a call per value that
/// checks the CPU first: 3% of a SmolLM2 token, two per block step).
pub(super) trait Act: Pod {
    /// The block's scale.
    fn d(&self) -> f16;
    /// Q8_1's `s`, zero for Q8_0.
    fn s(&self) -> f16;
    /// The block's quants.
    fn qs(&self) -> &[i8; 32];
}

impl Act for BlockQ8_0 {
    #[inline(always)]
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    fn s(&self) -> f16 {
        f16::ZERO
    }
    #[inline(always)]
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
}

impl Act for BlockQ8_1 {
    #[inline(always)]
    fn d(&self) -> f16 {
        self.d
    }
    #[inline(always)]
    fn s(&self) -> f16 {
        self.s
    }
    #[inline(always)]
    fn qs(&self) -> &[i8; 32] {
        &self.qs
    }
}

/// A 32-element weight format of the banded kernels (these and `tiles8.rs`'s).
pub(super) trait Format: Pod {
    /// Its activation blocks.
    type A: Act;
    /// What decoding adds to each quant so that it is unsigned.
    const BIAS: i32;
    /// The largest unsigned byte [`Format::decode`] gives (15, 31 or 255).
    const U_MAX: i32;
    /// Whether the format has a min (`m * s8`).
    const MIN: bool;
    /// The 32 unsigned bytes `q + BIAS`, `d` and `m` (0 without min).
    ///
    /// # Safety
    /// The CPU must have AVX2, FMA and F16C.
    unsafe fn decode(&self) -> (__m256i, f32, f32);
    /// The raw f16 bits of `d` and `m` (0 without min), for gathering the
    /// scales of several rows into one register.
    fn dm_bits(&self) -> (u16, u16);
    /// How the band kernel of one token reads the quants: [`Nibbles::No`]
    /// through [`Format::decode`], else four rows' 16 packed bytes
    /// ([`Format::qs16`]) per register.
    const NIBBLES: Nibbles = Nibbles::No;
    /// The 16 packed bytes of a nibble format (unused for the others).
    fn qs16(&self) -> *const u8 {
        std::ptr::null()
    }
    /// The fifth bits of [`Nibbles::Fifth`] (bit `j`: value `j`).
    fn qh32(&self) -> u32 {
        0
    }
}

/// What the 16 packed bytes of a nibble format hold.
#[derive(PartialEq, Eq)]
pub(super) enum Nibbles {
    /// Not a nibble format.
    No,
    /// The quants themselves (`q + BIAS` already unsigned).
    Plain,
    /// Indices of IQ4_NL's levels (decoded as `level + 128`).
    Levels,
    /// The low four bits of quants whose fifth bits are [`Format::qh32`]
    /// (Q5_0).
    Fifth,
}

/// `impl Format` for `$W`: decoded by `$u`, with `$bias` and `$min` (the
/// min's f16 bits `$mb`, 0 without one).
macro_rules! format {
    ($W:ty, $A:ty, $bias:expr, $umax:expr, $min:expr, |$b:ident| $u:expr, $mb:expr
     $(, nibbles: $nib:expr)? $(, fifth: $qh:expr)?) => {
        // `one_token` gathers `d` (and `m`, see below) as the block's first four bytes.
        const _: () = assert!(std::mem::offset_of!($W, d) == 0 && size_of::<$W>() >= 4);
        impl Format for $W {
            type A = $A;
            const BIAS: i32 = $bias;
            const U_MAX: i32 = $umax;
            const MIN: bool = $min;
            $(
                const NIBBLES: Nibbles = $nib;
                fn qs16(&self) -> *const u8 {
                    self.qs.as_ptr()
                }
            )?
            $(
                #[inline]
                fn qh32(&self) -> u32 {
                    let $b = self;
                    $qh
                }
            )?
            #[inline]
            #[target_feature(enable = "avx2,fma,f16c")]
            unsafe fn decode(&self) -> (__m256i, f32, f32) {
                let $b = self;
                let m = if $min { h2f(half::f16::from_bits($mb)) } else { 0.0 };
                ($u, h2f($b.d), m)
            }
            #[inline]
            fn dm_bits(&self) -> (u16, u16) {
                let $b = self;
                ($b.d.to_bits(), $mb)
            }
        }
    };
}

// The formats with a min keep it right after `d` (`one_token`'s gather).
const _: () =
    assert!(std::mem::offset_of!(BlockQ4_1, m) == 2 && std::mem::offset_of!(BlockQ5_1, m) == 2);

format!(
    BlockQ4_0,
    BlockQ8_0,
    8,
    15,
    false,
    |b| nibbles(&b.qs),
    0,
    nibbles: Nibbles::Plain
);
format!(
    BlockQ4_1,
    BlockQ8_1,
    0,
    15,
    true,
    |b| nibbles(&b.qs),
    b.m.to_bits(),
    nibbles: Nibbles::Plain
);
format!(
    BlockQ5_0,
    BlockQ8_0,
    16,
    31,
    false,
    |b| q5_quants(&b.qs, b.qh),
    0,
    nibbles: Nibbles::Fifth,
    fifth: u32::from_le_bytes(b.qh)
);
format!(
    BlockQ5_1,
    BlockQ8_1,
    0,
    31,
    true,
    |b| q5_quants(&b.qs, b.qh),
    b.m.to_bits()
);
format!(
    BlockQ8_0,
    BlockQ8_0,
    128,
    255,
    false,
    |b| _mm256_xor_si256(
        _mm256_loadu_si256(b.qs.as_ptr().cast()),
        _mm256_set1_epi8(i8::MIN)
    ),
    0
);
format!(
    BlockIQ4NL,
    BlockQ8_0,
    128,
    255,
    false,
    |b| _mm256_xor_si256(iq4_levels(&b.qs), _mm256_set1_epi8(i8::MIN)),
    0,
    nibbles: Nibbles::Levels
);

/// Transposes tokens `t0..t0 + tn` of `a` (rows of `nb` blocks) into `p`
/// in groups of `G` tokens, padding the last group with zero tokens.
pub(super) fn pack<A: Act, const G: usize>(
    a: &[A],
    nb: usize,
    t0: usize,
    tn: usize,
    p: &mut Packed,
) {
    let ng = tn.div_ceil(G);
    p.d.zeroed(ng * nb * G);
    p.s.zeroed(ng * nb * G);
    p.sums.zeroed(ng * nb * G);
    p.codes.zeroed(ng * nb * WORDS * G);
    for t in 0..tn {
        let (g, j) = (t / G, t % G);
        let row = &a[(t0 + t) * nb..(t0 + t + 1) * nb];
        for (b, by) in row.iter().enumerate() {
            let gb = g * nb + b;
            p.d[gb * G + j] = by.d().to_f32();
            p.s[gb * G + j] = by.s().to_f32();
            p.sums[gb * G + j] = by.qs().iter().map(|&q| i32::from(q)).sum();
            for (k, q) in by.qs().chunks_exact(4).enumerate() {
                let word = u32::from_le_bytes([q[0] as u8, q[1] as u8, q[2] as u8, q[3] as u8]);
                p.codes[(gb * WORDS + k) * G + j] = word;
            }
        }
    }
}

/// Sum of the eight i32 lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)))
}

/// The f16 scales at the head of a block of `W` in [`Layout::Bands`].
const fn halves<W: Format>() -> usize {
    if W::MIN {
        2
    } else {
        1
    }
}

/// Word `c` of the quants of 16 banded rows of a nibble format (`v`; `qh`:
/// Q5_0's word of fifth bits): each row's unsigned quants `4c..4c + 4`
/// (low) and `16 + 4c..20 + 4c` (high), IQ4_NL's as their levels plus 128,
/// Q5_0's with the 16 of their fifth bits added. With `in_place`, Q4_0's
/// and Q4_1's high nibbles stay where they are, as `16 q`.
///
/// # Safety
/// AVX-512 VNNI as in [`run`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn nibble_word<W: Format>(
    v: __m512i,
    qh: __m512i,
    c: usize,
    in_place: bool,
) -> (__m512i, __m512i) {
    let (m4, flip) = (_mm512_set1_epi8(0x0F), _mm512_set1_epi8(i8::MIN));
    let mut lo = _mm512_and_si512(v, m4);
    let mut hi = if in_place && W::NIBBLES == Nibbles::Plain {
        _mm512_andnot_si512(m4, v)
    } else {
        _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4)
    };
    if W::NIBBLES == Nibbles::Levels {
        let table = _mm512_broadcast_i32x4(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
        lo = _mm512_xor_si512(_mm512_shuffle_epi8(table, lo), flip);
        hi = _mm512_xor_si512(_mm512_shuffle_epi8(table, hi), flip);
    }
    if W::NIBBLES == Nibbles::Fifth {
        // Quant j's fifth bit is bit j of its row's `qh`: byte j / 8 of
        // the lane copied to the lane's four bytes (`vpshufb`), each tested
        // against its own bit.
        let lanes =
            _mm512_broadcast_i32x4(_mm_setr_epi32(0, 0x0404_0404, 0x0808_0808, 0x0C0C_0C0C));
        let bits = _mm512_set1_epi32(if c.is_multiple_of(2) {
            0x0804_0201
        } else {
            0x8040_2010_u32 as i32
        });
        let set = |byte: usize| {
            let spread = _mm512_add_epi8(lanes, _mm512_set1_epi8(byte as i8));
            _mm512_test_epi8_mask(_mm512_shuffle_epi8(qh, spread), bits)
        };
        let sixteen = _mm512_set1_epi8(0x10);
        lo = _mm512_mask_add_epi8(lo, set(c / 2), lo, sixteen);
        hi = _mm512_mask_add_epi8(hi, set(2 + c / 2), hi, sixteen);
    }
    (lo, hi)
}
