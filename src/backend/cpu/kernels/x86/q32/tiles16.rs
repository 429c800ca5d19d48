//! Prefill of the 32-element formats (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0,
//! IQ4_NL) on AVX-512 VNNI with 16 activation rows per register: the scheme
//! of `k256/tiles16.rs` (activations of 16 tokens transposed once per call, four
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
//! block ([`Layout::Bands`], [`layout`]), and one token runs
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

use super::super::k256::tiles16::store;
use super::super::lanes::row_offsets8;
use super::super::simd::h2f;
use super::super::tiling::{gemm_shape, prefetch_share, Lines};
use super::one_token::{one_token, one_token_bands};
use super::{halves, hsum, nibble_word, pack, Act, Format, Nibbles, Packed, WORDS};
use crate::backend::cpu::kernels::{blocks, GemmFn, Layout, Out, BAND_ROWS};
use crate::quant::blocks::{BlockIQ4NL, BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ8_0};
use crate::quant::GgmlType;

/// Tokens per zmm register.
const GROUP: usize = 16;
/// Weight rows per band.
pub(super) const BAND: usize = 8;
/// Groups of tokens per pass over a band's weights (64 tokens).
const GROUPS: usize = 4;

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

/// The 16-token kernel of weight type `ty`, `None` where there is none:
/// [`run_bands`] over the weight stored in [`layout`]'s bands.
pub(in super::super) fn gemm(ty: GgmlType) -> Option<GemmFn> {
    /// An entry running [`run_bands`] for block type `$W`, with this
    /// CPU's [`one_token_groups`](super::super::tuning::one_token_groups).
    macro_rules! bands {
        ($W:ty) => {
            match super::super::tuning::one_token_groups() {
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
    // Q5_1 stays on the eight-lane tiles (`x86/lane_tiles.rs`), whose float order is llama.cpp's
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
pub(in super::super) fn layout(ty: GgmlType) -> Layout {
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
            // call's last row made two-thread token generation slower).
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
    store(&acc, tn, out, rs, ts);
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
        store(&eight, tn, out.add(half * rs), rs, ts);
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
        // Up to `GROUPS_MAX` groups per pass ([`one_token_groups`](super::super::tuning::one_token_groups)).
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::reference::testutil::Rng;
    use half::f16;

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

    /// [`run_bands`] of `W` at every width [`one_token_groups`](super::super::super::tuning::one_token_groups)
    /// may pick.
    fn widths<W: Format>() -> [(usize, super::super::super::tuning::PassFn); 3] {
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
            super::super::super::tuning::assert_passes_agree(
                GgmlType::Q4_0,
                &[0],
                seed,
                q8_0_acts,
                &q4,
            );
            let q8 = widths::<BlockQ8_0>();
            super::super::super::tuning::assert_passes_agree(
                GgmlType::Q8_0,
                &[0],
                seed,
                q8_0_acts,
                &q8,
            );
        }
    }
}
