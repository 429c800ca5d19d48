//! Prefill of the 256-element formats (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
//! IQ4_XS) on AVX-512 VNNI with 16 activation rows per register.
//!
//! The tiles of `lane_tiles.rs` multiply one weight row by one activation row
//! per `vpdpbusd` (8 lanes of 4 products, summed horizontally at the end).
//! Here the activations of 16 tokens are transposed once per call so that a
//! zmm register holds the same four values of 16 tokens; four weight bytes
//! broadcast to all lanes then make one `vpdpbusd` worth 64 products, each
//! lane a different token, with no horizontal sums. A band of 8 weight rows
//! is decoded once per block to unsigned bytes `u = q + bias` ([`Format`])
//! and shared by every group of 16 tokens.
//!
//! Per (row, token) pair and block the arithmetic is fixed: the exact
//! integers `s1 = sum scale_j * sum(q * q8)` (over sub-blocks `j`, with
//! `sum(q * q8) = sum(u * q8) - bias * sum(q8)`) and, for the formats with
//! mins, `s2 = sum min_j * sum(q8)`; then `(s1 * d - s2 * dmin) * d8` is
//! added to the pair's f32 sum, block by block. The one-row path ([`row_dot`]: one token, or the rows and tokens
//! a band does not cover) does the same operations in the same order, so a
//! token's results are bit for bit independent of the batch it is in.

use std::arch::x86_64::*;
use std::cell::Cell;

use super::super::lanes;
use super::super::tiling::{gemm_shape, prefetch_share};
use super::one_token;
use super::one_token_bands;
use super::unpack::{self, BandDecoded};
use super::{flip, pack, row_dot, signed_dot, Decoded, Format, Packed, PAIRS, WORDS};
use crate::backend::cpu::kernels::{blocks, GemmFn, Layout, Out, BAND_ROWS};
use crate::quant::blocks::{
    BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K, BlockQ8K,
};
use crate::quant::GgmlType;

/// Tokens per zmm register.
const GROUP: usize = 16;
/// Weight rows per band (the one-token kernels' too).
const BAND: usize = lanes::BAND;
/// Groups of tokens per pass over a band's weights (64 tokens).
const GROUPS: usize = 4;

thread_local! {
    /// Transposed activations, reused across calls on each thread.
    static PACKED: Cell<Packed> = Cell::new(Packed::default());
}

/// The 16-token kernel of weight type `ty`, `None` where there is none.
pub(in super::super) fn gemm(ty: GgmlType) -> Option<GemmFn> {
    /// An entry running `$run` ([`run`], or [`run_bands`] for the formats
    /// [`layout`] stores in bands) for block type `$W`.
    macro_rules! entry {
        ($W:ty) => {
            entry!($W, run::<$W>)
        };
        ($W:ty, $($run:tt)+) => {
            |w: &[u8], rb: usize, a: &[u8], ab: usize, out: Out<'_>| {
                // SAFETY: `x86::gemm` hands this entry out only after
                // detecting AVX-512 F/BW/VL + VNNI (and AVX2, FMA, F16C);
                // the weight is laid out as `layout` says for its type.
                unsafe { $($run)+(w, rb, a, ab, out) }
            }
        };
    }
    /// The [`run_bands`] entry of `$W` with this CPU's
    /// [`one_token_groups`](super::super::tuning::one_token_groups).
    macro_rules! banded {
        ($W:ty) => {
            match super::super::tuning::one_token_groups() {
                1 => entry!($W, run_bands::<$W, 1>),
                _ => entry!($W, run_bands::<$W, 4>),
            }
        };
    }
    let f: GemmFn = match ty {
        GgmlType::Q2_K => entry!(BlockQ2K),
        GgmlType::Q3_K => entry!(BlockQ3K),
        GgmlType::Q4_K => banded!(BlockQ4K),
        GgmlType::Q5_K => entry!(BlockQ5K),
        GgmlType::Q6_K => banded!(BlockQ6K),
        GgmlType::IQ4_XS => banded!(BlockIQ4XS),
        _ => return None,
    };
    Some(f)
}

/// How [`gemm`]'s kernel of `ty` wants the weight stored: Q4_K, Q6_K and
/// IQ4_XS in [`Layout::Bands`] ([`Banded`]), the others plain.
pub(in super::super) fn layout(ty: GgmlType) -> Layout {
    let bands = |halves, at| Layout::Bands {
        rows: BAND_ROWS,
        halves,
        at,
    };
    match ty {
        GgmlType::Q4_K => bands(BlockQ4K::HALVES, BlockQ4K::AT),
        GgmlType::Q6_K => bands(BlockQ6K::HALVES, BlockQ6K::AT),
        GgmlType::IQ4_XS => bands(BlockIQ4XS::HALVES, BlockIQ4XS::AT),
        _ => Layout::Plain,
    }
}

/// A format stored in [`Layout::Bands`], and its one-token kernel.
trait Banded: Format {
    /// The f16 scales of a block.
    const HALVES: usize;
    /// Their byte offset in the block.
    const AT: usize;
    /// Decodes the block step at `step` of a group into `out`
    /// (`unpack.rs`).
    ///
    /// # Safety
    /// AVX-512 VNNI as in [`run`]; `step` is a whole block step of a
    /// banded group of this format.
    unsafe fn decode_band(step: *const u8, out: &mut BandDecoded);
    /// `H` whole groups of 16 rows (`w`, `nb` block steps each) by the
    /// activation row `a`, results at `out[r * rs]`.
    ///
    /// # Safety
    /// AVX-512 VNNI as in [`run`]; `w` holds `H` whole groups; `out` is
    /// valid for every index written.
    unsafe fn one_token<const H: usize>(
        w: *const u8,
        nb: usize,
        a: &[BlockQ8K],
        out: *mut f32,
        rs: usize,
    );
}

/// `impl Banded for $W`: `$halves` f16-sized scales at byte `$at` of the
/// block, one-token kernel `one_token_bands::$kernel`, block steps decoded by
/// `unpack::$decode`.
macro_rules! banded {
    ($W:ty, halves: $halves:expr, at: $at:expr, $kernel:ident, $decode:ident) => {
        impl Banded for $W {
            const HALVES: usize = $halves;
            const AT: usize = $at;
            #[inline]
            unsafe fn decode_band(step: *const u8, out: &mut BandDecoded) {
                // SAFETY: the caller's contract.
                unsafe { unpack::$decode(step, out) }
            }
            #[inline]
            unsafe fn one_token<const H: usize>(
                w: *const u8,
                nb: usize,
                a: &[BlockQ8K],
                out: *mut f32,
                rs: usize,
            ) {
                // SAFETY: the caller's contract.
                unsafe { one_token_bands::$kernel::<H>(w, nb, a, out, rs) }
            }
        }
    };
}

banded!(BlockQ4K, halves: 2, at: 0, one_token_bands_q4k, q4k);
banded!(BlockQ6K, halves: 1, at: std::mem::offset_of!(BlockQ6K, d), one_token_bands_q6k, q6k);
// IQ4_XS's `d` and `scales_h`, side by side at the head of the block, move
// as two f16-sized halves.
banded!(BlockIQ4XS, halves: 2, at: 0, one_token_bands_iq4xs, iq4xs);

/// The [`GemmFn`] of format `W`: bands of 8 rows by groups of 16 tokens,
/// the rest (and one token) through [`row_dot`].
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL + VNNI, AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run<W: Format>(w: &[u8], row_bytes: usize, a: &[u8], act_bytes: usize, out: Out<'_>) {
    let Some((nb, rows, toks)) = gemm_shape::<W, BlockQ8K>(w, row_bytes, a, act_bytes, &out) else {
        return;
    };
    let wb = blocks::<W>(&w[..rows * row_bytes]);
    let ab = blocks::<BlockQ8K>(&a[..toks * act_bytes]);
    let (rs, ts, op) = (out.row_stride, out.tok_stride, out.out.as_mut_ptr());
    let banded = rows / BAND * BAND;
    if toks == 1 {
        // Every whole band of eight rows through the format's one-token
        // band kernel (`one_token.rs`), on the activation row laid out once.
        W::with_acts(&ab[..nb.min(ab.len())], |acts| {
            for r0 in (0..banded).step_by(BAND) {
                let band = &wb[r0 * nb..(r0 + BAND) * nb];
                // SAFETY: rows r0..r0 + 8 exist; `out.fits(rows, 1)` bounds
                // every index written.
                unsafe { one_token::one_token(band, nb, &ab, acts, op.add(r0 * rs), rs) };
            }
        });
    } else if banded > 0 {
        let mut p = PACKED.take();
        for t0 in (0..toks).step_by(GROUPS * GROUP) {
            let tn = (toks - t0).min(GROUPS * GROUP);
            pack::<W, GROUP>(&ab, nb, t0, tn, flip::<W>(), &mut p);
            for r0 in (0..banded).step_by(BAND) {
                // SAFETY: rows r0..r0 + 8 and tokens t0..t0 + tn exist;
                // `out.fits(rows, toks)` bounds every index written.
                let mut rows = PlainRows {
                    w: &wb[r0 * nb..(r0 + BAND) * nb],
                    nb,
                    dec: std::array::from_fn(|_| Decoded::zeroed()),
                };
                unsafe {
                    band::<W, BAND>(&mut rows, nb, &p, tn, op.add(r0 * rs + t0 * ts), rs, ts)
                };
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

/// The decoded weight rows [`tile`] reads: word `k`, sub-block scale `s`,
/// correction coefficient `p`, `d` and `dmin` of row `r` (rows counted
/// from the tile's first).
trait TileRows {
    fn q(&self, r: usize, k: usize) -> u32;
    fn sc(&self, r: usize, s: usize) -> i32;
    fn coef(&self, r: usize, p: usize) -> u32;
    fn d(&self, r: usize) -> f32;
    fn dmin(&self, r: usize) -> f32;
}

impl TileRows for &[Decoded] {
    #[inline(always)]
    fn q(&self, r: usize, k: usize) -> u32 {
        self[r].q[k]
    }
    #[inline(always)]
    fn sc(&self, r: usize, s: usize) -> i32 {
        self[r].sc[s]
    }
    #[inline(always)]
    fn coef(&self, r: usize, p: usize) -> u32 {
        self[r].coef[p]
    }
    #[inline(always)]
    fn d(&self, r: usize) -> f32 {
        self[r].d
    }
    #[inline(always)]
    fn dmin(&self, r: usize) -> f32 {
        self[r].dmin
    }
}

/// Rows `r0..` of a decoded band step.
struct BandRows<'a> {
    dec: &'a BandDecoded,
    r0: usize,
}

impl TileRows for BandRows<'_> {
    #[inline(always)]
    fn q(&self, r: usize, k: usize) -> u32 {
        self.dec.q[k][self.r0 + r]
    }
    #[inline(always)]
    fn sc(&self, r: usize, s: usize) -> i32 {
        self.dec.sc[s][self.r0 + r]
    }
    #[inline(always)]
    fn coef(&self, r: usize, p: usize) -> u32 {
        self.dec.coef[p][self.r0 + r]
    }
    #[inline(always)]
    fn d(&self, r: usize) -> f32 {
        self.dec.d[self.r0 + r]
    }
    #[inline(always)]
    fn dmin(&self, r: usize) -> f32 {
        self.dec.dmin[self.r0 + r]
    }
}

/// Where [`band`] takes its `R` weight rows from, block by block.
trait BandSource<const R: usize> {
    /// Decodes block `b` of every row.
    ///
    /// # Safety
    /// AVX-512 VNNI as in [`run`]; `b` is a block of the rows.
    unsafe fn decode(&mut self, b: usize);
    /// Rows `r0..r0 + TILE_ROWS` of the block decoded last.
    fn rows(&self, r0: usize) -> impl TileRows + '_;
    /// Turns the block decoded last into signed quants `q = u - bias`
    /// ([`signed_dot`]) and writes each row's `128 * sum_s sc_s * sum(q)`
    /// (over sub-block `s`'s `sub` words) to `wsum`.
    ///
    /// # Safety
    /// AVX-512 VNNI as in [`run`]; a block was decoded; `sub` is 4 or 8.
    unsafe fn to_signed(&mut self, bias: i8, sub: usize, wsum: &mut [i32; R]);
}

/// Eight plain rows (`w[r * nb + b]`: block `b` of row `r`), each block
/// decoded alone by [`Format::decode`].
struct PlainRows<'a, W> {
    w: &'a [W],
    nb: usize,
    dec: [Decoded; BAND],
}

impl<W: Format> BandSource<BAND> for PlainRows<'_, W> {
    #[inline(always)]
    unsafe fn decode(&mut self, b: usize) {
        for (r, dr) in self.dec.iter_mut().enumerate() {
            // SAFETY: the caller's contract.
            unsafe { self.w[r * self.nb + b].decode(dr) };
        }
    }
    #[inline(always)]
    fn rows(&self, r0: usize) -> impl TileRows + '_ {
        &self.dec[r0..r0 + TILE_ROWS]
    }
    #[inline(always)]
    unsafe fn to_signed(&mut self, bias: i8, sub: usize, wsum: &mut [i32; BAND]) {
        let (bias, ones) = (_mm512_set1_epi8(bias), _mm512_set1_epi8(1));
        for (dr, ws) in self.dec.iter_mut().zip(wsum.iter_mut()) {
            let sc = _mm512_loadu_si512(dr.sc.as_ptr().cast());
            let mut total = _mm512_setzero_si512();
            for c in 0..WORDS / 16 {
                let at = dr.q.as_mut_ptr().add(16 * c).cast::<__m512i>();
                let q = _mm512_sub_epi8(_mm512_loadu_si512(at), bias);
                _mm512_storeu_si512(at, q);
                // Word k of the 16 belongs to sub-block (16c + k) / sub.
                let word = _mm512_add_epi32(
                    _mm512_set1_epi32(16 * c as i32),
                    _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                );
                let at = _mm512_srl_epi32(word, _mm_cvtsi32_si128(sub.trailing_zeros() as i32));
                let sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ones, q);
                let scale = _mm512_permutexvar_epi32(at, sc);
                total = _mm512_add_epi32(total, _mm512_mullo_epi32(sums, scale));
            }
            *ws = _mm512_reduce_add_epi32(total) << 7;
        }
    }
}

/// The 16 rows of a [`Layout::Bands`] group (`g`, `nb` block steps `step`
/// bytes apart), a block step decoded at once ([`Banded::decode_band`]).
struct BandedRows<W> {
    g: *const u8,
    nb: usize,
    step: usize,
    dec: Box<BandDecoded>,
    format: std::marker::PhantomData<W>,
}

impl<W: Banded> BandSource<BAND_ROWS> for BandedRows<W> {
    #[inline(always)]
    unsafe fn decode(&mut self, b: usize) {
        // The next block step (2-3 KiB) is read while this one's tiles
        // run, thousands of cycles: without it the decode waited on each
        // step's first loads (a fifth of Q6_K's prefill in a profile).
        if b + 1 < self.nb {
            // SAFETY: block step `b + 1` lies in the group.
            unsafe { prefetch_share(self.g.add((b + 1) * self.step).cast(), self.step, 0) };
        }
        // SAFETY: the caller's contract: block step `b` lies in the group.
        unsafe { W::decode_band(self.g.add(b * self.step), &mut self.dec) }
    }
    #[inline(always)]
    fn rows(&self, r0: usize) -> impl TileRows + '_ {
        BandRows { dec: &self.dec, r0 }
    }
    #[inline(always)]
    unsafe fn to_signed(&mut self, bias: i8, sub: usize, wsum: &mut [i32; BAND_ROWS]) {
        // Word k of 16 rows per register, a row per lane.
        let (bias, ones) = (_mm512_set1_epi8(bias), _mm512_set1_epi8(1));
        let mut total = _mm512_setzero_si512();
        for s in 0..WORDS / sub {
            let mut sums = _mm512_setzero_si512();
            for k in sub * s..sub * (s + 1) {
                let at = self.dec.q[k].as_mut_ptr().cast::<__m512i>();
                let q = _mm512_sub_epi8(_mm512_loadu_si512(at), bias);
                _mm512_storeu_si512(at, q);
                sums = _mm512_dpbusd_epi32(sums, ones, q);
            }
            let sc = _mm512_loadu_si512(self.dec.sc[s].as_ptr().cast());
            total = _mm512_add_epi32(total, _mm512_mullo_epi32(sums, sc));
        }
        _mm512_storeu_si512(wsum.as_mut_ptr().cast(), _mm512_slli_epi32::<7>(total));
    }
}

/// `R` weight rows (from `src`, `nb` blocks a row) by the `tn` packed
/// tokens of `p`, results at `out[r * rs + t * ts]`: each block decoded
/// once, then tiles of [`TILE_ROWS`] rows by up to [`TILE_GROUPS`] groups.
///
/// # Safety
/// AVX-512 VNNI as in [`run`]; `src` holds `nb` blocks of each row; `out`
/// is valid for every index written.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn band<W: Format, const R: usize>(
    src: &mut impl BandSource<R>,
    nb: usize,
    p: &Packed,
    tn: usize,
    out: *mut f32,
    rs: usize,
    ts: usize,
) {
    let ng = tn.div_ceil(GROUP);
    let mut acc = [[_mm512_setzero_ps(); R]; GROUPS];
    let mut wsum = [0i32; R];
    for b in 0..nb {
        src.decode(b);
        if signed_dot::<W>() {
            src.to_signed(W::BIAS as i8, W::SUB, &mut wsum);
        }
        for r0 in (0..R).step_by(TILE_ROWS) {
            let rows = src.rows(r0);
            let wsum = &wsum[r0..r0 + TILE_ROWS];
            let mut g0 = 0;
            while g0 < ng {
                let at = Tokens {
                    codes: p.codes.as_ptr().add((g0 * nb + b) * WORDS * GROUP),
                    pairs: p.pairs.as_ptr().add((g0 * nb + b) * PAIRS * GROUP),
                    d: p.d.as_ptr().add((g0 * nb + b) * GROUP),
                    stride: nb,
                };
                if ng - g0 >= TILE_GROUPS {
                    tile::<W, _, TILE_GROUPS, R>(&rows, wsum, &at, &mut acc[g0..], r0);
                    g0 += TILE_GROUPS;
                } else {
                    tile::<W, _, 1, R>(&rows, wsum, &at, &mut acc[g0..], r0);
                    g0 += 1;
                }
            }
        }
    }
    for (h, r) in (0..R).step_by(BAND).enumerate() {
        let eight: [[__m512; BAND]; GROUPS] =
            std::array::from_fn(|g| std::array::from_fn(|i| acc[g][r + i]));
        store(&eight, tn, out.add(BAND * h * rs), rs, ts);
    }
}

/// Writes the band's sums `acc[g][r]` (lane `j`: token `16g + j`) of `tn`
/// tokens to `out[r * rs + t * ts]`: with adjacent rows (`rs == 1`, the
/// matmul's layout) as eight contiguous floats per token, one store each
/// rather than eight stores to eight places a token row apart.
///
/// # Safety
/// AVX-512 as in [`run`]; `out` is valid for every index written.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
pub(in super::super) unsafe fn store(
    acc: &[[__m512; BAND]; GROUPS],
    tn: usize,
    out: *mut f32,
    rs: usize,
    ts: usize,
) {
    let mut lanes = [[0.0f32; GROUP]; BAND];
    for (g, accg) in acc.iter().enumerate().take(tn.div_ceil(GROUP)) {
        for (l, v) in lanes.iter_mut().zip(accg) {
            _mm512_storeu_ps(l.as_mut_ptr(), *v);
        }
        let n = (tn - g * GROUP).min(GROUP);
        if rs == 1 {
            let rows = _mm256_setr_epi32(0, 16, 32, 48, 64, 80, 96, 112);
            for j in 0..n {
                let v = _mm256_i32gather_ps::<4>(lanes.as_ptr().cast::<f32>().add(j), rows);
                _mm256_storeu_ps(out.add((g * GROUP + j) * ts), v);
            }
        } else {
            for (r, l) in lanes.iter().enumerate() {
                for (j, &x) in l.iter().enumerate().take(n) {
                    *out.add(r * rs + (g * GROUP + j) * ts) = x;
                }
            }
        }
    }
}

/// Weight rows per register tile of [`band`].
const TILE_ROWS: usize = 4;
/// Groups of 16 tokens per register tile of [`band`] (a last odd group
/// runs alone).
const TILE_GROUPS: usize = 2;

/// One block of the packed tokens of group `g0` (and the next groups, a
/// stride of `stride` blocks apart).
struct Tokens {
    codes: *const u32,
    pairs: *const u32,
    d: *const f32,
    stride: usize,
}

/// Rows `rows` (decoded, rows `r0..` of the band) by `G` groups of 16
/// tokens over one block, added to `acc[g][r0 + r]`: `TILE_ROWS * G`
/// accumulators per sub-block, each code load shared by the tile's rows and
/// each broadcast weight word by its groups.
///
/// # Safety
/// AVX-512 VNNI as in [`run`]; `at` points at `G` whole groups.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn tile<W: Format, T: TileRows + ?Sized, const G: usize, const R: usize>(
    rows: &T,
    wsum: &[i32],
    at: &Tokens,
    acc: &mut [[__m512; R]],
    r0: usize,
) {
    let codes: [*const u32; G] =
        std::array::from_fn(|g| at.codes.add(g * at.stride * WORDS * GROUP));
    let mut s1 = [[_mm512_setzero_si512(); G]; TILE_ROWS];
    for s in 0..WORDS / W::SUB {
        let mut lanes = [[_mm512_setzero_si512(); G]; TILE_ROWS];
        for k in W::SUB * s..W::SUB * (s + 1) {
            let c: [__m512i; G] =
                std::array::from_fn(|g| _mm512_loadu_si512(codes[g].add(k * GROUP).cast()));
            for (r, lr) in lanes.iter_mut().enumerate() {
                let u = _mm512_set1_epi32(rows.q(r, k) as i32);
                for (l, &cg) in lr.iter_mut().zip(&c) {
                    *l = if signed_dot::<W>() {
                        // Activations + 128 (unsigned) by signed quants.
                        _mm512_dpbusd_epi32(*l, cg, u)
                    } else {
                        _mm512_dpbusd_epi32(*l, u, cg)
                    };
                }
            }
        }
        for (r, (sr, lr)) in s1.iter_mut().zip(&lanes).enumerate() {
            let sc = _mm512_set1_epi32(rows.sc(r, s));
            for (x, &l) in sr.iter_mut().zip(lr) {
                *x = _mm512_add_epi32(*x, _mm512_mullo_epi32(l, sc));
            }
        }
    }
    for (g, accg) in acc.iter_mut().enumerate().take(G) {
        let pairs = at.pairs.add(g * at.stride * PAIRS * GROUP);
        let d8 = _mm512_loadu_ps(at.d.add(g * at.stride * GROUP));
        for r in 0..TILE_ROWS {
            let mut s1 = s1[r][g];
            let mut corr = _mm512_setzero_si512();
            if signed_dot::<W>() {
                // sum(q * (a + 128)) = sum(q * a) + 128 * sum(q), per
                // sub-block: the row's term, the same for every token.
                s1 = _mm512_sub_epi32(s1, _mm512_set1_epi32(wsum.get(r).copied().unwrap_or(0)));
            } else {
                for q in 0..W::PAIR_WORDS {
                    let sums = _mm512_loadu_si512(pairs.add(q * GROUP).cast());
                    let coef = _mm512_set1_epi32(rows.coef(r, q) as i32);
                    corr = _mm512_dpwssd_epi32(corr, coef, sums);
                }
                if W::BIAS != 0 {
                    let bias = _mm512_mullo_epi32(corr, _mm512_set1_epi32(W::BIAS));
                    s1 = _mm512_sub_epi32(s1, bias);
                }
            }
            let mut m = _mm512_mul_ps(_mm512_cvtepi32_ps(s1), _mm512_set1_ps(rows.d(r)));
            if W::MIN {
                m = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(corr), _mm512_set1_ps(rows.dmin(r)), m);
            }
            let a = &mut accg[r0 + r];
            *a = _mm512_add_ps(*a, _mm512_mul_ps(m, d8));
        }
    }
}

/// The [`GemmFn`] of `W` stored in [`Layout::Bands`]: whole groups of 16
/// rows through [`Banded::one_token`] (one token) or [`band`] (each block
/// step of a group decoded at once, [`Banded::decode_band`], once per 64 tokens),
/// the plain rows past the last whole group through [`run`].
///
/// # Safety
/// The CPU must have AVX-512 F/BW/VL + VNNI, AVX2, FMA and F16C.
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run_bands<W: Banded, const GROUPS_MAX: usize>(
    w: &[u8],
    row_bytes: usize,
    a: &[u8],
    act_bytes: usize,
    out: Out<'_>,
) {
    let Some((nb, rows, toks)) = gemm_shape::<W, BlockQ8K>(w, row_bytes, a, act_bytes, &out) else {
        return;
    };
    let ab = blocks::<BlockQ8K>(&a[..toks * act_bytes]);
    let Out {
        out: buf,
        row_stride: rs,
        tok_stride: ts,
    } = out;
    let op = buf.as_mut_ptr();
    let grouped = rows / BAND_ROWS * BAND_ROWS;
    let step = BAND_ROWS * size_of::<W>();
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
                    4 => W::one_token::<4>(g, nb, &ab, o, rs),
                    3 => W::one_token::<3>(g, nb, &ab, o, rs),
                    2 => W::one_token::<2>(g, nb, &ab, o, rs),
                    _ => W::one_token::<1>(g, nb, &ab, o, rs),
                }
            };
            r0 += h * BAND_ROWS;
        }
    } else if grouped > 0 {
        let mut p = PACKED.take();
        let mut dec = BandedRows::<W> {
            g: wp,
            nb,
            step,
            dec: BandDecoded::new(),
            format: std::marker::PhantomData,
        };
        for t0 in (0..toks).step_by(GROUPS * GROUP) {
            let tn = (toks - t0).min(GROUPS * GROUP);
            pack::<W, GROUP>(&ab, nb, t0, tn, flip::<W>(), &mut p);
            for g0 in (0..grouped).step_by(BAND_ROWS) {
                dec.g = wp.add(g0 * row_bytes);
                let o = op.add(g0 * rs + t0 * ts);
                // SAFETY: rows g0..g0 + 16 are a whole group, so each block
                // step `b < nb` is in `w`; `out.fits(rows, toks)` bounds
                // every index written.
                unsafe { band::<W, BAND_ROWS>(&mut dec, nb, &p, tn, o, rs, ts) };
            }
        }
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

    /// `nb` random Q8_K activation blocks (quants in -127..=127, their
    /// sums), as bytes.
    fn q8k_acts(rng: &mut Rng, nb: usize) -> Vec<u8> {
        let acts: Vec<BlockQ8K> = (0..nb)
            .map(|_| {
                let mut a = <BlockQ8K as bytemuck::Zeroable>::zeroed();
                a.d = 0.01;
                for q in a.qs.iter_mut() {
                    *q = ((rng.next_u32() % 255) as i32 - 127) as i8;
                }
                for (j, s) in a.bsums.iter_mut().enumerate() {
                    *s = a.qs[16 * j..16 * (j + 1)]
                        .iter()
                        .map(|&q| i16::from(q))
                        .sum();
                }
                a
            })
            .collect();
        bytemuck::cast_slice(&acts).to_vec()
    }

    /// [`run_bands`] of `W` at every width [`one_token_groups`](super::super::super::tuning::one_token_groups)
    /// may pick gives the same results.
    fn widths_agree<W: Banded>(ty: GgmlType, f16_at: &[usize], seed: u64) {
        let widths: [(usize, super::super::super::tuning::PassFn); 3] = [
            (4, run_bands::<W, 4>),
            (1, run_bands::<W, 1>),
            (2, run_bands::<W, 2>),
        ];
        super::super::super::tuning::assert_passes_agree(ty, f16_at, seed, q8k_acts, &widths);
    }

    #[test]
    fn one_token_passes_agree_for_any_number_of_groups() {
        for seed in [5, 77] {
            widths_agree::<BlockQ4K>(GgmlType::Q4_K, &[0, 2], seed);
            widths_agree::<BlockQ6K>(GgmlType::Q6_K, &[std::mem::offset_of!(BlockQ6K, d)], seed);
            widths_agree::<BlockIQ4XS>(GgmlType::IQ4_XS, &[0], seed);
        }
    }
}
