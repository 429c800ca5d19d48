//! Prefill of the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! IQ4_NL) on AVX-512 VNNI with 16 activation rows per register: the scheme
//! of `gemm16.rs` (activations of 16 tokens transposed once per call, four
//! broadcast weight bytes times 16 tokens per `vpdpbusd`, bands of 8 weight
//! rows decoded once per block to unsigned bytes `u = q + bias`).
//!
//! Per (row, token) pair and block the arithmetic is fixed: the exact
//! `isum = sum(u * q8) - bias * sum(q8)`, then `acc = fma(isum, d * d8, acc)`
//! and, for Q4_1 / Q5_1, `acc = fma(m, s8, acc)`, block by block. The
//! one-row path ([`row_dot`]) does the same operations in the same order, so
//! a token's results are bit for bit independent of the batch it is in.
//!
//! The weights are stored at load in groups of 16 rows transposed block by
//! block ([`Layout::Bands`], [`layout`]), and one token (decode) runs
//! [`one_token_bands`]: one 512-bit load is one 4-byte word of 16 rows, one
//! `vpdpbusd` their 16 partial sums in lanes, the 16 scales one
//! conversion, the same float operations lane by lane. Prefill decodes a
//! group's blocks eight at a time from those words ([`decode_step`]) and
//! sweeps them with register tiles of 4 rows by 32 tokens ([`band16`]):
//! a 32-element block has its float work per block, and in registers it
//! runs beside the `vpdpbusd` (1B-shaped 2048x8192 at 64 tokens, one
//! thread: Q4_0 67 -> 110 GMAC/s, Q8_0 55 -> 95, against 113 for Q4_K).
//! The rows past the last whole group stay plain ([`run`]: [`one_token`]'s
//! bands of eight rows, their exact sums folded into lanes, [`band`]'s
//! eight rows by 64 tokens, or the one-row path).

use std::arch::x86_64::*;
use std::cell::Cell;
use std::ops::Range;

use bytemuck::Pod;
use half::f16;

use super::avx2::{h2f, iq4_levels, nibbles, q5_quants};
use super::decode512::{gather_f16_pairs, prefetch_groups, row_offsets8, row_sums8, store_groups};
use super::gemm::{gemm_shape, prefetch_share};
use super::gemm16;
use super::Lines;
use crate::backend::cpu::kernels::{blocks, GemmFn, Layout, Out, BAND_ROWS};
use crate::quant::blocks::{
    BlockIQ4NL, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0, BlockQ8_1, KVALUES_IQ4NL,
};
use crate::quant::GgmlType;

/// Tokens per zmm register.
const GROUP: usize = 16;
/// Weight rows per band.
const BAND: usize = 8;
/// Groups of tokens per pass over a band's weights (64 tokens).
const GROUPS: usize = 4;
/// 4-byte groups per 32-element block.
const WORDS: usize = 8;

/// Transposed activations of up to `GROUPS * GROUP` tokens (the AVX2
/// kernels of `gemm8.rs` use the same layout with groups of 8).
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

thread_local! {
    /// Transposed activations, reused across calls on each thread.
    static PACKED: Cell<Packed> = Cell::new(Packed::default());
    /// [`bias_init`]'s values for them.
    static INIT: Cell<Lines<i32>> = Cell::new(Lines::default());
    /// [`band16`]'s decoded chunk (5 KiB, off the stack).
    static CHUNK_BUF: Cell<Option<Box<Chunk>>> = const { Cell::new(None) };
}

/// A zeroed [`Chunk`] on the heap.
fn new_chunk() -> Box<Chunk> {
    Box::new(Chunk {
        q: [[[0; BAND_ROWS]; WORDS]; CHUNK],
        d: [[0.0; BAND_ROWS]; CHUNK],
        m: [[0.0; BAND_ROWS]; CHUNK],
    })
}

/// An activation block (Q8_0 or Q8_1): its scales as f16, converted by
/// the kernels with F16C (`half`'s conversion is a call per value that
/// checks the CPU first: 3% of a SmolLM2 decode, two per block step).
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

/// A 32-element weight format of the banded kernels (these and `gemm8.rs`'s).
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

/// The 16-token kernel of weight type `ty`, `None` where there is none:
/// [`run_bands`] over the weight stored in [`layout`]'s bands.
pub(super) fn gemm(ty: GgmlType) -> Option<GemmFn> {
    /// An entry running [`run_bands`] for block type `$W`, with this
    /// CPU's [`super::one_token_groups`].
    macro_rules! bands {
        ($W:ty) => {
            match super::one_token_groups() {
                1 => bands!($W, 1),
                _ => bands!($W, 4),
            }
        };
        ($W:ty, $groups:literal) => {
            |w: &[u8], rb: usize, a: &[u8], ab: usize, out: Out<'_>| {
                // SAFETY: `x86::gemm` hands this entry out only after
                // detecting AVX-512 F/BW/VL + VNNI (and AVX2, FMA, F16C).
                unsafe { run_bands::<$W, $groups>(w, rb, a, ab, out) }
            }
        };
    }
    // Q5_1 stays on `gemm.rs`'s tiles, whose float order is llama.cpp's
    // (eight lanes per pair, the mins summed apart): through this kernel a
    // Q5_1 Mixtral's router picked another expert at one step of the
    // synthetic tests, and its logits moved past their bounds.
    let f: GemmFn = match ty {
        GgmlType::Q4_0 => bands!(BlockQ4_0),
        GgmlType::Q4_1 => bands!(BlockQ4_1),
        GgmlType::Q5_0 => bands!(BlockQ5_0),
        GgmlType::Q8_0 => bands!(BlockQ8_0),
        GgmlType::IQ4_NL => bands!(BlockIQ4NL),
        _ => return None,
    };
    Some(f)
}

/// How [`gemm`]'s kernel of `ty` wants the weight stored: the formats it
/// runs through [`run_bands`] in [`Layout::Bands`] (their `d`, and `m`
/// where they have one, then words of quants), the others plain.
pub(super) fn layout(ty: GgmlType) -> Layout {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => Layout::Bands {
            rows: BAND_ROWS,
            halves: 1,
            at: 0,
        },
        GgmlType::Q4_1 => Layout::Bands {
            rows: BAND_ROWS,
            halves: 2,
            at: 0,
        },
        _ => Layout::Plain,
    }
}

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

/// The [`GemmFn`] of format `W`: bands of 8 rows by groups of 16 tokens,
/// the rest (and one token) through [`row_dot`].
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL + VNNI, AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run<W: Format>(w: &[u8], row_bytes: usize, a: &[u8], act_bytes: usize, out: Out<'_>) {
    let Some((nb, rows, toks)) = gemm_shape::<W, W::A>(w, row_bytes, a, act_bytes, &out) else {
        return;
    };
    let wb = blocks::<W>(&w[..rows * row_bytes]);
    let ab = blocks::<W::A>(&a[..toks * act_bytes]);
    let (rs, ts, op) = (out.row_stride, out.tok_stride, out.out.as_mut_ptr());
    // The one-token bands gather the rows' scales by i32 byte offsets:
    // rows too long for those (none a model has) run row by row.
    let offsets = row_offsets8(row_bytes);
    let banded = if toks == 1 && offsets.is_none() {
        0
    } else {
        rows / BAND * BAND
    };
    if let (1, Some(offsets)) = (toks, offsets) {
        // Several bands per pass: the activations' share of each block
        // step then serves 16 or 32 rows, and the rows' float chains run
        // side by side. Four bands of the 18-22-byte blocks. Q8_0's 34:
        // two on rows of fewer than 32 blocks (a short pass's own costs
        // weigh more), else one: from DRAM at two threads two bands read
        // 37-43 GB/s against one's 45-48 (rows of 1024-4096 values; the
        // same at one thread).
        let most = if size_of::<W>() <= 22 {
            4
        } else if nb < 32 {
            2
        } else {
            1
        };
        let mut r0 = 0;
        while r0 < banded {
            let h = ((banded - r0) / BAND).min(most);
            let h = if h == 3 { 2 } else { h };
            let band_w = &wb[r0 * nb..(r0 + h * BAND) * nb];
            // What a step prefetches: its share of as many rows after
            // these, also past this call's rows (measured: stopping at the
            // call's last row made two-thread decode slower).
            let ahead = h * BAND * size_of::<W>();
            let o = op.add(r0 * rs);
            // SAFETY: rows r0..r0 + 8 h exist; `out.fits(rows, 1)` bounds
            // every index written.
            unsafe {
                match h {
                    4 => one_token::<W, 4>(band_w, nb, &ab, ahead, offsets, o, rs),
                    2 => one_token::<W, 2>(band_w, nb, &ab, ahead, offsets, o, rs),
                    _ => one_token::<W, 1>(band_w, nb, &ab, ahead, offsets, o, rs),
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
                let o = op.add(r0 * rs + t0 * ts);
                unsafe { band(|r, b| band_w[r * nb + b], nb, &p, tn, o, rs, ts) };
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

/// Sum of the eight i32 lanes of `v`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn hsum(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    _mm_cvtsi128_si32(_mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s)))
}

/// One weight row by one activation row, in the banded kernel's arithmetic.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn row_dot<W: Format>(w: &[W], a: &[W::A]) -> f32 {
    let mut acc = 0.0f32;
    let ones = _mm256_set1_epi8(1);
    for (bx, by) in w.iter().zip(a) {
        let (u, d, m) = bx.decode();
        let q8 = _mm256_loadu_si256(by.qs().as_ptr().cast());
        let z = _mm256_setzero_si256();
        let mut isum = hsum(_mm256_dpbusd_epi32(z, u, q8));
        if W::BIAS != 0 {
            isum -= W::BIAS * hsum(_mm256_dpbusd_epi32(z, ones, q8));
        }
        acc = (isum as f32).mul_add(d * h2f(by.d()), acc);
        if W::MIN {
            acc = m.mul_add(h2f(by.s()), acc);
        }
    }
    acc
}

/// `H` bands of eight weight rows (`w`, `8 H` rows of `nb` blocks) by one
/// activation row `a` (decode), results at `out[r * rs]`, each block step
/// prefetching `ahead` bytes of the rows after `w`: [`row_dot`]'s
/// float operations lane by lane, row `8 h + r` in lane `r` of `acc[h]`.
///
/// Per block, the eight exact row sums of a band come from
/// [`nibble_sums8`] (four rows' packed bytes per zmm) or, for the other
/// formats, from rows `p` and `p + 4` sharing one zmm `vpdpbusd` folded by
/// [`row_sums8`]; the rows' f16 scales come in by one hardware gather per
/// band and block ([`gather_f16_pairs`], `offsets`: [`row_offsets8`] of
/// the row length). With `H = 2` each block step's activation work serves
/// 16 rows.
///
/// # Safety
/// AVX-512 VNNI as in [`run`]; `out` is valid for every index written.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn one_token<W: Format, const H: usize>(
    w: &[W],
    nb: usize,
    a: &[W::A],
    ahead: usize,
    offsets: __m256i,
    out: *mut f32,
    rs: usize,
) {
    if w.len() < H * BAND * nb || a.len() < nb {
        return;
    }
    // Raw pointers: a block step reads up to 48 weight blocks, each slice
    // index a bounds check in the hot loop. SAFETY: `w` holds `8 H` rows
    // of `nb` blocks (checked above), so `wp.add(r * nb + b)` for
    // r < 8 H, b < nb stays inside it.
    let wp = w.as_ptr();
    let at = |r: usize, b: usize| unsafe { &*wp.add(r * nb + b) };
    let mut acc = [_mm256_setzero_ps(); H];
    let (z, ones) = (_mm512_setzero_si512(), _mm256_set1_epi8(1));
    for (b, by) in a.iter().enumerate().take(nb) {
        let q8 = _mm256_loadu_si256(by.qs().as_ptr().cast());
        // The next bands in address order, a block step's share per step:
        // eight rows read block by block are eight slow streams the
        // hardware prefetchers do not keep ahead of (measured: Q8_0 decode
        // from DRAM 10 -> 29 GB/s with this, Q4_0 5.6 -> 14.5).
        prefetch_share(wp.add(H * BAND * nb).cast(), ahead, b);
        let bias = if W::BIAS != 0 {
            W::BIAS * hsum(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q8))
        } else {
            0
        };
        let (d8, s8) = (_mm256_set1_ps(h2f(by.d())), _mm256_set1_ps(h2f(by.s())));
        for (h, acc) in acc.iter_mut().enumerate() {
            let row = |r: usize| at(8 * h + r, b);
            let mut isum = if W::NIBBLES == Nibbles::No {
                let q8x2 = _mm512_broadcast_i64x4(q8);
                let mut prods = [z; 4];
                for (p, prod) in prods.iter_mut().enumerate() {
                    let (lo, hi) = (row(p).decode().0, row(p + 4).decode().0);
                    let u = _mm512_inserti64x4::<1>(_mm512_castsi256_si512(lo), hi);
                    *prod = _mm512_dpbusd_epi32(z, u, q8x2);
                }
                row_sums8(prods)
            } else {
                nibble_sums8(|r| row(r).qs16(), |r| row(r).qh32(), by.qs(), W::NIBBLES)
            };
            if W::BIAS != 0 {
                isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(bias));
            }
            // `d` is each block's first two bytes, `m` the next two (`format!`).
            let (dw, mw) = gather_f16_pairs(at(8 * h, b) as *const W as *const u8, offsets);
            *acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(dw, d8), *acc);
            if W::MIN {
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

/// The eight exact row sums `sum(u * q8)` of one block of a nibble format
/// of `kind` (`qs(r)`: row `r`'s 16 packed bytes; with [`Nibbles::Levels`]
/// they index IQ4_NL's levels, taken as `level + 128`), row `r` in lane `r`.
///
/// Four rows' bytes fill one zmm (a row per 128-bit lane), so one mask and
/// one shift give their low and high nibbles, and two `vpdpbusd` against
/// the activations' halves broadcast to every lane give four lanes per row.
/// With [`Nibbles::Fifth`] (Q5_0: `qh(r)` holds row `r`'s fifth bits, bit
/// `j` for value `j`; unused for the other kinds), the four rows' bits
/// become one byte mask per half in vector registers, and one masked add
/// puts 16 in the bytes they select: the 32 bytes built per row by
/// `q5_quants` cost more than the rest of the block step together, and
/// masks assembled in general registers were bound by their shifts.
///
/// # Safety
/// AVX-512 VNNI as in [`run`]; each `qs(r)` points at 16 readable bytes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn nibble_sums8(
    qs: impl Fn(usize) -> *const u8,
    qh: impl Fn(usize) -> u32,
    q8: &[i8; 32],
    kind: Nibbles,
) -> __m256i {
    let m4 = _mm512_set1_epi8(0x0F);
    let alo = _mm512_broadcast_i32x4(_mm_loadu_si128(q8.as_ptr().cast()));
    let ahi = _mm512_broadcast_i32x4(_mm_loadu_si128(q8.as_ptr().add(16).cast()));
    let table = _mm512_broadcast_i32x4(_mm_loadu_si128(KVALUES_IQ4NL.as_ptr().cast()));
    let mut z = [_mm512_setzero_si512(); 2];
    for (h, zh) in z.iter_mut().enumerate() {
        let row = |k: usize| _mm_loadu_si128(qs(4 * h + k).cast());
        let mut v = _mm512_castsi128_si512(row(0));
        v = _mm512_inserti32x4::<1>(v, row(1));
        v = _mm512_inserti32x4::<2>(v, row(2));
        v = _mm512_inserti32x4::<3>(v, row(3));
        let mut lo = _mm512_and_si512(v, m4);
        let mut hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), m4);
        if kind == Nibbles::Fifth {
            // Row 4h + k's bits in every u32 of lane k; byte j of a lane
            // then takes the byte of bit j (lo: 0..16, hi: 16..32), and a
            // test against 1 << (j % 8) selects the bytes to add 16 to.
            let bits = _mm_setr_epi32(
                qh(4 * h) as i32,
                qh(4 * h + 1) as i32,
                qh(4 * h + 2) as i32,
                qh(4 * h + 3) as i32,
            );
            let lanes = _mm512_permutexvar_epi32(
                _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3),
                _mm512_castsi128_si512(bits),
            );
            let spread = |b0: i8| {
                let b1 = b0 + 1;
                _mm512_shuffle_epi8(
                    lanes,
                    _mm512_broadcast_i32x4(_mm_setr_epi8(
                        b0, b0, b0, b0, b0, b0, b0, b0, b1, b1, b1, b1, b1, b1, b1, b1,
                    )),
                )
            };
            let select = _mm512_set1_epi64(0x8040_2010_0804_0201u64 as i64);
            let sixteen = _mm512_set1_epi8(0x10);
            lo = _mm512_mask_add_epi8(lo, _mm512_test_epi8_mask(spread(0), select), lo, sixteen);
            hi = _mm512_mask_add_epi8(hi, _mm512_test_epi8_mask(spread(2), select), hi, sixteen);
        }
        if kind == Nibbles::Levels {
            let flip = _mm512_set1_epi8(i8::MIN);
            lo = _mm512_xor_si512(_mm512_shuffle_epi8(table, lo), flip);
            hi = _mm512_xor_si512(_mm512_shuffle_epi8(table, hi), flip);
        }
        let s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), lo, alo);
        *zh = _mm512_dpbusd_epi32(s, hi, ahi);
    }
    // Per 128-bit lane k: [r_k a+c, r_k+4 a+c, r_k b+d, r_k+4 b+d], then
    // row k's and row k + 4's sums in elements 0 and 1.
    let u = _mm512_add_epi32(
        _mm512_unpacklo_epi32(z[0], z[1]),
        _mm512_unpackhi_epi32(z[0], z[1]),
    );
    let v = _mm512_add_epi32(u, _mm512_shuffle_epi32::<0b01_00_11_10>(u));
    let idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    _mm512_castsi512_si256(_mm512_permutexvar_epi32(idx, v))
}

/// Eight weight rows (`w(r, b)`: block `b` of row `r < 8`, `nb` blocks a
/// row) by the `tn` packed tokens of `p`, results at `out[r * rs + t * ts]`.
///
/// # Safety
/// AVX-512 VNNI as in [`run`]; `out` is valid for every index written.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn band<W: Format>(
    w: impl Fn(usize, usize) -> W,
    nb: usize,
    p: &Packed,
    tn: usize,
    out: *mut f32,
    rs: usize,
    ts: usize,
) {
    let ng = tn.div_ceil(GROUP);
    let mut acc = [[_mm512_setzero_ps(); BAND]; GROUPS];
    let mut q = [[0u32; WORDS]; BAND];
    let mut dw = [0.0f32; BAND];
    let mut mw = [0.0f32; BAND];
    for b in 0..nb {
        for r in 0..BAND {
            let (u, d, m) = w(r, b).decode();
            _mm256_storeu_si256(q[r].as_mut_ptr().cast(), u);
            (dw[r], mw[r]) = (d, m);
        }
        for g in 0..ng {
            let gb = g * nb + b;
            let codes = p.codes.as_ptr().add(gb * WORDS * GROUP);
            let mut lanes = [_mm512_setzero_si512(); BAND];
            for k in 0..WORDS {
                let c = _mm512_loadu_si512(codes.add(k * GROUP).cast());
                for r in 0..BAND {
                    let u = _mm512_set1_epi32(q[r][k] as i32);
                    lanes[r] = _mm512_dpbusd_epi32(lanes[r], u, c);
                }
            }
            if W::BIAS != 0 {
                let sum = _mm512_loadu_si512(p.sums.as_ptr().add(gb * GROUP).cast());
                let bias = _mm512_mullo_epi32(sum, _mm512_set1_epi32(W::BIAS));
                for l in lanes.iter_mut() {
                    *l = _mm512_sub_epi32(*l, bias);
                }
            }
            let d8 = _mm512_loadu_ps(p.d.as_ptr().add(gb * GROUP));
            let s8 = _mm512_loadu_ps(p.s.as_ptr().add(gb * GROUP));
            for r in 0..BAND {
                let scale = _mm512_mul_ps(_mm512_set1_ps(dw[r]), d8);
                acc[g][r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lanes[r]), scale, acc[g][r]);
                if W::MIN {
                    acc[g][r] = _mm512_fmadd_ps(_mm512_set1_ps(mw[r]), s8, acc[g][r]);
                }
            }
        }
    }
    gemm16::store(&acc, tn, out, rs, ts);
}

/// The f16 scales at the head of a block of `W` in [`Layout::Bands`].
const fn halves<W: Format>() -> usize {
    if W::MIN {
        2
    } else {
        1
    }
}

/// The chunk's first `kb` blocks (from block `b0`) of all 16 rows by the
/// packed groups `groups`, `G` at a time ([`tile16`]), into `acc`
/// (`acc[g][r]`: row `r`, lane `j` token `16 g + j`).
///
/// # Safety
/// As [`tile16`], for every group of `groups`.
#[inline(always)]
#[allow(clippy::too_many_arguments)]
unsafe fn tiles<W: Format, const G: usize>(
    ch: &Chunk,
    kb: usize,
    b0: usize,
    nb: usize,
    p: &Packed,
    init: &[i32],
    acc: &mut [[__m512; BAND_ROWS]; GROUPS],
    groups: Range<usize>,
) {
    for r0 in (0..BAND_ROWS).step_by(TILE_ROWS) {
        for g0 in groups.clone().step_by(G) {
            let mut t: [[__m512; TILE_ROWS]; G] =
                std::array::from_fn(|i| std::array::from_fn(|r| acc[g0 + i][r0 + r]));
            tile16::<W, TILE_ROWS, G>(ch, kb, b0, r0, g0, nb, p, init, &mut t);
            for (i, ti) in t.iter().enumerate() {
                acc[g0 + i][r0..r0 + TILE_ROWS].copy_from_slice(ti);
            }
        }
    }
}

/// Blocks of a group decoded per pass of [`band16`]'s tiles.
const CHUNK: usize = 8;
/// Weight rows per register tile of [`band16`].
const TILE_ROWS: usize = 4;

/// A chunk of [`CHUNK`] block steps of a [`Layout::Bands`] group, decoded:
/// per block, word `k` of the unsigned quants `u = q + BIAS` of its 16
/// rows (a row per u32), their `d`, and `m` (0 without a min).
#[repr(C, align(64))]
struct Chunk {
    q: [[[u32; BAND_ROWS]; WORDS]; CHUNK],
    d: [[f32; BAND_ROWS]; CHUNK],
    m: [[f32; BAND_ROWS]; CHUNK],
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

/// Decodes the block step at `step` (16 rows of `W` in [`Layout::Bands`])
/// into block `b` of `ch`: each 64-byte word of the step holds one 4-byte
/// word of all 16 rows, so a few vector operations decode 16 rows at once
/// (the words are those [`one_token_bands`] reads, the nibbles here
/// unpacked to bytes as [`Format::decode`] gives them).
///
/// # Safety
/// AVX-512 VNNI as in [`run`]; `step` points at a whole block step.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn decode_step<W: Format>(step: *const u8, ch: &mut Chunk, b: usize) {
    let q = step.add(2 * BAND_ROWS * halves::<W>());
    let word = |k: usize| _mm512_loadu_si512(q.add(4 * BAND_ROWS * k).cast());
    let put = |out: *mut [u32; BAND_ROWS], v: __m512i| _mm512_storeu_si512(out.cast(), v);
    let out = ch.q[b].as_mut_ptr();
    let flip = _mm512_set1_epi8(i8::MIN);
    _mm512_storeu_ps(
        ch.d[b].as_mut_ptr(),
        _mm512_cvtph_ps(_mm256_loadu_si256(step.cast())),
    );
    if W::MIN {
        let m = _mm256_loadu_si256(step.add(2 * BAND_ROWS).cast());
        _mm512_storeu_ps(ch.m[b].as_mut_ptr(), _mm512_cvtph_ps(m));
    }
    if W::NIBBLES == Nibbles::No {
        // Q8_0: the quants plus 128 as unsigned bytes.
        for k in 0..WORDS {
            put(out.add(k), _mm512_xor_si512(word(k), flip));
        }
        return;
    }
    let fifth = W::NIBBLES == Nibbles::Fifth;
    let qh = if fifth {
        word(0)
    } else {
        _mm512_setzero_si512()
    };
    for c in 0..WORDS / 2 {
        let (lo, hi) = nibble_word::<W>(word(c + usize::from(fifth)), qh, c, false);
        put(out.add(c), lo);
        put(out.add(c + WORDS / 2), hi);
    }
}

/// `-BIAS * sum(q8)` of each packed token and block (`[g][b][16 tokens]`,
/// as [`Packed::sums`]): the value [`band16`]'s integer sums start from, so
/// that `sum(u * q8)` ends as the exact `sum(q * q8)`.
fn bias_init<W: Format>(p: &Packed, init: &mut Lines<i32>) {
    init.zeroed(p.sums.len());
    for (i, &s) in init.iter_mut().zip(p.sums.iter()) {
        *i = -W::BIAS * s;
    }
}

/// Rows `r0..r0 + 4` of the chunk's first `kb` blocks (block `b0 + b` of
/// the row) by `G` groups of packed tokens from group `g0`, into `acc`
/// (`acc[g][r]`: row `r0 + r`, lane `j` token `16 (g0 + g) + j`), each
/// block in [`row_dot`]'s arithmetic: the exact integer sum, then
/// `fma(isum, d * d8, acc)` and for a min `fma(m, s8, acc)`.
///
/// Per block and word: `G` code loads, four broadcast weight words, `4 G`
/// `vpdpbusd`; the float work once per block and pair of (row, group).
///
/// # Safety
/// AVX-512 VNNI as in [`run`]; `p` holds groups `g0..g0 + G` of `nb`
/// blocks, `init` their [`bias_init`] when `W::BIAS != 0`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn tile16<W: Format, const R: usize, const G: usize>(
    ch: &Chunk,
    kb: usize,
    b0: usize,
    r0: usize,
    g0: usize,
    nb: usize,
    p: &Packed,
    init: &[i32],
    acc: &mut [[__m512; R]; G],
) {
    for b in 0..kb {
        let gb: [usize; G] = std::array::from_fn(|g| (g0 + g) * nb + b0 + b);
        let mut lanes = [[_mm512_setzero_si512(); G]; R];
        if W::BIAS != 0 {
            for lr in lanes.iter_mut() {
                for (l, &gb) in lr.iter_mut().zip(&gb) {
                    *l = _mm512_loadu_si512(init.as_ptr().add(gb * GROUP).cast());
                }
            }
        }
        for k in 0..WORDS {
            let c: [__m512i; G] = std::array::from_fn(|g| {
                _mm512_loadu_si512(p.codes.as_ptr().add((gb[g] * WORDS + k) * GROUP).cast())
            });
            for (r, lr) in lanes.iter_mut().enumerate() {
                let u = _mm512_set1_epi32(ch.q[b][k][r0 + r] as i32);
                for (l, &cg) in lr.iter_mut().zip(&c) {
                    *l = _mm512_dpbusd_epi32(*l, u, cg);
                }
            }
        }
        for (g, &gb) in gb.iter().enumerate() {
            let d8 = _mm512_loadu_ps(p.d.as_ptr().add(gb * GROUP));
            let s8 = _mm512_loadu_ps(p.s.as_ptr().add(gb * GROUP));
            for (r, lr) in lanes.iter().enumerate() {
                let a = &mut acc[g][r];
                let scale = _mm512_mul_ps(_mm512_set1_ps(ch.d[b][r0 + r]), d8);
                *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(lr[g]), scale, *a);
                if W::MIN {
                    *a = _mm512_fmadd_ps(_mm512_set1_ps(ch.m[b][r0 + r]), s8, *a);
                }
            }
        }
    }
}

/// The 16 rows of a [`Layout::Bands`] group (`g`, `nb` block steps of
/// `step` bytes) by the `tn` packed tokens of `p`, results at
/// `out[r * rs + t * ts]`.
///
/// Chunks of [`CHUNK`] block steps are decoded at once ([`decode_step`]),
/// then swept by register tiles of 4 rows by two groups of 16 tokens
/// ([`tile16`]), whose sums stay in registers for the chunk. The 32-element
/// blocks need their float work per block, a fifth of the `vpdpbusd`
/// count: kept in registers it runs beside them.
///
/// # Safety
/// AVX-512 VNNI as in [`run`]; `g` holds `nb` whole block steps; `out` is
/// valid for every index written.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
#[allow(clippy::too_many_arguments)]
unsafe fn band16<W: Format>(
    g: *const u8,
    nb: usize,
    p: &Packed,
    init: &[i32],
    ch: &mut Chunk,
    tn: usize,
    out: *mut f32,
    rs: usize,
    ts: usize,
) {
    let step = BAND_ROWS * size_of::<W>();
    let ng = tn.div_ceil(GROUP);
    let mut acc = [[_mm512_setzero_ps(); BAND_ROWS]; GROUPS];
    for b0 in (0..nb).step_by(CHUNK) {
        let kb = (nb - b0).min(CHUNK);
        for b in 0..kb {
            decode_step::<W>(g.add((b0 + b) * step), ch, b);
        }
        // The next chunk is read while this one's tiles run.
        if b0 + CHUNK < nb {
            let next = (nb - b0 - CHUNK).min(CHUNK) * step;
            prefetch_share(g.add((b0 + CHUNK) * step).cast(), next, 0);
        }
        tiles::<W, 2>(ch, kb, b0, nb, p, init, &mut acc, 0..ng / 2 * 2);
        tiles::<W, 1>(ch, kb, b0, nb, p, init, &mut acc, ng / 2 * 2..ng);
    }
    for half in [0, BAND] {
        let eight: [[__m512; BAND]; GROUPS] =
            std::array::from_fn(|g| std::array::from_fn(|i| acc[g][half + i]));
        gemm16::store(&eight, tn, out.add(half * rs), rs, ts);
    }
}

/// The [`GemmFn`] of format `W` stored in [`Layout::Bands`]: whole groups
/// of 16 rows through [`one_token_bands`] (one token) or [`band`] (its
/// blocks gathered back, once per block and 64 tokens), the plain rows
/// past the last whole group through [`run`].
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL + VNNI, AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run_bands<W: Format, const GROUPS_MAX: usize>(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    act_bytes: usize,
    out: Out<'_>,
) {
    let Some((nb, rows, toks)) = gemm_shape::<W, W::A>(w, row_bytes, a, act_bytes, &out) else {
        return;
    };
    let ab = blocks::<W::A>(&a[..toks * act_bytes]);
    let Out {
        out: buf,
        row_stride: rs,
        tok_stride: ts,
    } = out;
    let op = buf.as_mut_ptr();
    let grouped = rows / BAND_ROWS * BAND_ROWS;
    let wp = w.as_ptr();
    if toks == 1 {
        // Up to `GROUPS_MAX` groups per pass ([`super::one_token_groups`]).
        let mut r0 = 0;
        while r0 < grouped {
            let h = ((grouped - r0) / BAND_ROWS).min(GROUPS_MAX);
            let (g, o) = (wp.add(r0 * row_bytes), op.add(r0 * rs));
            // SAFETY: rows r0..r0 + 16 h are whole groups of `w`;
            // `out.fits(rows, 1)` (checked by `gemm_shape`) bounds every
            // index written.
            unsafe {
                match h {
                    4 => one_token_bands::<W, 4>(g, nb, &ab, o, rs),
                    3 => one_token_bands::<W, 3>(g, nb, &ab, o, rs),
                    2 => one_token_bands::<W, 2>(g, nb, &ab, o, rs),
                    _ => one_token_bands::<W, 1>(g, nb, &ab, o, rs),
                }
            };
            r0 += h * BAND_ROWS;
        }
    } else if grouped > 0 {
        let mut p = PACKED.take();
        let mut init = INIT.take();
        let mut ch = CHUNK_BUF.take().unwrap_or_else(new_chunk);
        for t0 in (0..toks).step_by(GROUPS * GROUP) {
            let tn = (toks - t0).min(GROUPS * GROUP);
            pack::<_, GROUP>(&ab, nb, t0, tn, &mut p);
            if W::BIAS != 0 {
                bias_init::<W>(&p, &mut init);
            }
            for g0 in (0..grouped).step_by(BAND_ROWS) {
                let g = wp.add(g0 * row_bytes);
                let o = op.add(g0 * rs + t0 * ts);
                // SAFETY: rows g0..g0 + 16 are a whole group, so each block
                // step `b < nb` is in `w`; `out.fits(rows, toks)` bounds
                // every index written.
                unsafe { band16::<W>(g, nb, &p, &init, &mut ch, tn, o, rs, ts) };
            }
        }
        CHUNK_BUF.set(Some(ch));
        INIT.set(init);
        PACKED.set(p);
    }
    if grouped < rows {
        // The rows past the last whole group are plain.
        let tail = Out {
            out: &mut buf[grouped * rs..],
            row_stride: rs,
            tok_stride: ts,
        };
        run::<W>(
            &w[grouped * row_bytes..rows * row_bytes],
            row_bytes,
            a,
            act_bytes,
            tail,
        );
    }
}

/// `H` whole groups of 16 weight rows in [`Layout::Bands`] (`w`, each of
/// `nb` block steps) by one activation row `a` (decode), results at
/// `out[r * rs]`, each group's stream prefetched [`super::bands_ahead`] bytes
/// ahead: [`row_dot`]'s float operations lane by lane, row `16 h + r` in
/// lane `r` of `acc[h]`.
///
/// Per block step of a group: its 16 `d` (and `m`) are one conversion, and
/// each 64-byte word of quants one load, whose low (and high) nibbles, or
/// bytes, one `vpdpbusd` against that word of the activations broadcast
/// multiplies, the 16 rows' partial sums landing in their lanes. Nothing
/// is gathered, inserted or folded across lanes.
///
/// # Safety
/// AVX-512 VNNI as in [`run`]; `w` holds `H` whole groups of `nb` block
/// steps; `out` is valid for every index written.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn one_token_bands<W: Format, const H: usize>(
    w: *const u8,
    nb: usize,
    a: &[W::A],
    out: *mut f32,
    rs: usize,
) {
    if a.len() < nb {
        return;
    }
    let step = BAND_ROWS * size_of::<W>();
    let group = nb * step;
    let words = 2 * BAND_ROWS * halves::<W>();
    let flip = _mm512_set1_epi8(i8::MIN);
    let ones = _mm256_set1_epi8(1);
    let mut acc = [_mm512_setzero_ps(); H];
    for (b, by) in a.iter().enumerate().take(nb) {
        let q8 = by.qs();
        prefetch_groups::<H>(w.wrapping_add(b * step), group, step, super::bands_ahead(H));
        let x: [__m512i; WORDS] = std::array::from_fn(|k| {
            _mm512_set1_epi32(i32::from_le_bytes([
                q8[4 * k] as u8,
                q8[4 * k + 1] as u8,
                q8[4 * k + 2] as u8,
                q8[4 * k + 3] as u8,
            ]))
        });
        let bias = if W::BIAS != 0 {
            let q = _mm256_loadu_si256(q8.as_ptr().cast());
            _mm512_set1_epi32(W::BIAS * hsum(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ones, q)))
        } else {
            _mm512_setzero_si512()
        };
        let (d8, s8) = (_mm512_set1_ps(h2f(by.d())), _mm512_set1_ps(h2f(by.s())));
        for (h, acc) in acc.iter_mut().enumerate() {
            let p = w.add(h * group + b * step);
            let q = p.add(words);
            let word = |k: usize| _mm512_loadu_si512(q.add(4 * BAND_ROWS * k).cast());
            let (mut s0, mut s1) = (_mm512_setzero_si512(), _mm512_setzero_si512());
            if W::NIBBLES == Nibbles::No {
                // Q8_0: the quants plus 128 as unsigned bytes.
                for k in (0..WORDS).step_by(2) {
                    s0 = _mm512_dpbusd_epi32(s0, _mm512_xor_si512(word(k), flip), x[k]);
                    s1 = _mm512_dpbusd_epi32(s1, _mm512_xor_si512(word(k + 1), flip), x[k + 1]);
                }
            } else {
                // Word c's low nibbles are quants 4c..4c + 4, its high
                // ones 16 + 4c..20 + 4c. Q5_0's words follow its `qh`.
                let fifth = W::NIBBLES == Nibbles::Fifth;
                let qh = if fifth {
                    word(0)
                } else {
                    _mm512_setzero_si512()
                };
                for c in 0..WORDS / 2 {
                    // Q4_0/Q4_1's high nibbles in place, `16 q` (at most
                    // 240): one mask, and `s1` is 16 times the sum.
                    let (lo, hi) = nibble_word::<W>(word(c + usize::from(fifth)), qh, c, true);
                    s0 = _mm512_dpbusd_epi32(s0, lo, x[c]);
                    s1 = _mm512_dpbusd_epi32(s1, hi, x[c + WORDS / 2]);
                }
            }
            if W::NIBBLES == Nibbles::Plain {
                // Exact: each term is `16 q` times an activation.
                s1 = _mm512_srai_epi32::<4>(s1);
            }
            let isum = _mm512_sub_epi32(_mm512_add_epi32(s0, s1), bias);
            let dw = _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()));
            *acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(dw, d8), *acc);
            if W::MIN {
                let mw = _mm512_cvtph_ps(_mm256_loadu_si256(p.add(2 * BAND_ROWS).cast()));
                *acc = _mm512_fmadd_ps(mw, s8, *acc);
            }
        }
    }
    store_groups(&acc, out, rs);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::reference::testutil::Rng;

    /// `nb` random Q8_0 activation blocks (quants in -127..=127), as bytes.
    fn q8_0_acts(rng: &mut Rng, nb: usize) -> Vec<u8> {
        let acts: Vec<BlockQ8_0> = (0..nb)
            .map(|_| BlockQ8_0 {
                d: f16::from_f32(0.01),
                qs: std::array::from_fn(|_| ((rng.next_u32() % 255) as i32 - 127) as i8),
            })
            .collect();
        bytemuck::cast_slice(&acts).to_vec()
    }

    /// [`run_bands`] of `W` at every width [`super::super::one_token_groups`]
    /// may pick.
    fn widths<W: Format>() -> [(usize, super::super::PassFn); 3] {
        [
            (4, run_bands::<W, 4>),
            (1, run_bands::<W, 1>),
            (2, run_bands::<W, 2>),
        ]
    }

    #[test]
    fn one_token_passes_agree_for_any_number_of_groups() {
        // Q4_0 and Q8_0: `d` first in the block, activations Q8_0.
        for seed in [7, 99] {
            let q4 = widths::<BlockQ4_0>();
            super::super::assert_passes_agree(GgmlType::Q4_0, &[0], seed, q8_0_acts, &q4);
            let q8 = widths::<BlockQ8_0>();
            super::super::assert_passes_agree(GgmlType::Q8_0, &[0], seed, q8_0_acts, &q8);
        }
    }
}
