//! AVX2 (+FMA, F16C) attention kernels, used under AVX-512 too, and the
//! AVX-512 multi-query kernels ([`MultiKernels`]).
//!
//! The safe entries below are only reachable through [`kernels`], which
//! [`AttnKernels::for_isa`] calls only after `Isa::available` confirmed the
//! features: that is the safety argument of every `unsafe` call here. Every
//! slice access is bounds-checked by the safe entry before the unchecked
//! SIMD loads run.

use std::arch::x86_64::*;

use half::f16;

use crate::backend::cpu::attention::KvRef;
use crate::backend::cpu::attn_kernels::{
    accum_n_scalar, accum_n_shape, f16_to_f32_scalar, gather_scalar, AttnKernels, MultiKernels,
    EXP_MIN, MULTI_TILE,
};
use crate::backend::cpu::kernels::Isa;

/// The kernels of `isa` (which the caller has checked this CPU has).
pub(in crate::backend::cpu) fn kernels(isa: Isa) -> Option<AttnKernels> {
    match isa {
        Isa::Scalar => None,
        Isa::Avx2 => Some(AttnKernels {
            isa,
            gather: gather_avx2,
            scores: |q, t, o| checked_scores(q, t, o, scores_avx2),
            accum: |p, t, a| checked_accum(p, t, a, accum_avx2),
            exp_sum: |x, m| {
                // SAFETY: AVX2 and FMA were detected (module doc).
                unsafe { exp_sum_avx2(x, m) }
            },
            scale: |x, s| {
                // SAFETY: AVX2 was detected (module doc).
                unsafe { scale_avx2(x, s) }
            },
            multi: None,
        }),
        // The one-query kernels stay 256-bit; the multi-query ones, which
        // prefill spends its attention time in, are 512-bit.
        Isa::Avx512 => kernels(Isa::Avx2).map(|k| AttnKernels {
            isa,
            multi: Some(MultiKernels {
                max_queries: MAX_QUERIES,
                scores: scores_n,
                softmax: softmax_n,
                accum: accum_n,
                gather_t,
                prefetch,
            }),
            ..k
        }),
        // Other ISAs are not x86: their attention stays scalar.
        _ => None,
    }
}

type RawTile = unsafe fn(&[f32], &[f32], &mut [f32]);

/// Checks that `tile` holds `out.len()` rows of `q.len()`, then runs `f`.
fn checked_scores(q: &[f32], tile: &[f32], out: &mut [f32], f: RawTile) {
    if tile.len() < out.len() * q.len() {
        let rows = tile.len() / q.len().max(1);
        return checked_scores(q, tile, &mut out[..rows], f);
    }
    // SAFETY: the tile covers every row read; features detected (module doc).
    unsafe { f(q, tile, out) }
}

/// Checks that `tile` holds `p.len()` rows of `acc.len()`, then runs `f`.
fn checked_accum(p: &[f32], tile: &[f32], acc: &mut [f32], f: RawTile) {
    if tile.len() < p.len() * acc.len() {
        let rows = tile.len() / acc.len().max(1);
        return checked_accum(&p[..rows], tile, acc, f);
    }
    // SAFETY: the tile covers every row read; features detected (module doc).
    unsafe { f(p, tile, acc) }
}

/// Rows of `slots` from an f16 cache through `cvt` (f32 rows are copies).
fn gather_with(
    src: KvRef<'_>,
    slots: &[usize],
    stride: usize,
    off: usize,
    dst: &mut [f32],
    cvt: unsafe fn(&[f16], &mut [f32]),
) {
    let KvRef::F16(v) = src else {
        return gather_scalar(src, slots, stride, off, dst);
    };
    let width = dst.len() / slots.len().max(1);
    for (d, &s) in dst.chunks_exact_mut(width.max(1)).zip(slots) {
        let at = s * stride + off;
        // Slices are bounds-checked here; the kernel reads only `d.len()` of each.
        let row = &v[at..at + width];
        // SAFETY: features detected (module doc); equal lengths.
        unsafe { cvt(row, d) }
    }
}

fn gather_avx2(src: KvRef<'_>, slots: &[usize], stride: usize, off: usize, dst: &mut [f32]) {
    gather_with(src, slots, stride, off, dst, cvt_avx2);
}

/// f16 to f32, `dst.len()` values (`src` at least as long).
#[target_feature(enable = "avx2,f16c")]
unsafe fn cvt_avx2(src: &[f16], dst: &mut [f32]) {
    let n = dst.len().min(src.len());
    let mut i = 0;
    while i + 8 <= n {
        let h = _mm_loadu_si128(src.as_ptr().add(i).cast());
        _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        i += 8;
    }
    f16_to_f32_scalar(&src[i..n], &mut dst[i..n]);
}

/// Horizontal sum of 8 lanes.
#[target_feature(enable = "avx2")]
unsafe fn hsum256(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// `out[j] = q · tile[j]`; `tile` holds `out.len()` rows of `q.len()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn scores_avx2(q: &[f32], tile: &[f32], out: &mut [f32]) {
    let w = q.len();
    let (qp, tp) = (q.as_ptr(), tile.as_ptr());
    for (j, o) in out.iter_mut().enumerate() {
        let k = tp.add(j * w);
        let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
        let mut i = 0;
        while i + 16 <= w {
            a0 = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(i)), _mm256_loadu_ps(k.add(i)), a0);
            a1 = _mm256_fmadd_ps(
                _mm256_loadu_ps(qp.add(i + 8)),
                _mm256_loadu_ps(k.add(i + 8)),
                a1,
            );
            i += 16;
        }
        let mut s = hsum256(_mm256_add_ps(a0, a1));
        while i < w {
            s += *qp.add(i) * *k.add(i);
            i += 1;
        }
        *o = s;
    }
}

/// `acc += Σ_j p[j] * tile[j]`; `tile` holds `p.len()` rows of `acc.len()`.
#[target_feature(enable = "avx2,fma")]
unsafe fn accum_avx2(p: &[f32], tile: &[f32], acc: &mut [f32]) {
    let w = acc.len();
    let (ap, tp) = (acc.as_mut_ptr(), tile.as_ptr());
    let mut c = 0;
    // Four column blocks at once: each p[j] broadcast feeds four FMAs.
    while c + 32 <= w {
        let mut a = [
            _mm256_loadu_ps(ap.add(c)),
            _mm256_loadu_ps(ap.add(c + 8)),
            _mm256_loadu_ps(ap.add(c + 16)),
            _mm256_loadu_ps(ap.add(c + 24)),
        ];
        for (j, &pj) in p.iter().enumerate() {
            let b = _mm256_set1_ps(pj);
            let r = tp.add(j * w + c);
            for (u, a) in a.iter_mut().enumerate() {
                *a = _mm256_fmadd_ps(b, _mm256_loadu_ps(r.add(8 * u)), *a);
            }
        }
        for (u, a) in a.iter().enumerate() {
            _mm256_storeu_ps(ap.add(c + 8 * u), *a);
        }
        c += 32;
    }
    while c + 8 <= w {
        let mut a = _mm256_loadu_ps(ap.add(c));
        for (j, &pj) in p.iter().enumerate() {
            a = _mm256_fmadd_ps(_mm256_set1_ps(pj), _mm256_loadu_ps(tp.add(j * w + c)), a);
        }
        _mm256_storeu_ps(ap.add(c), a);
        c += 8;
    }
    for c in c..w {
        for (j, &pj) in p.iter().enumerate() {
            *ap.add(c) += pj * *tp.add(j * w + c);
        }
    }
}

/// `exp(x)` for `x` in `[EXP_MIN, 0]`: ggml's `ggml_v_expf` (Arm's optimized
/// routine, max error 1.5 ulp) without its overflow branches, which this
/// range never takes.
macro_rules! exp_body {
    ($x:expr, $set1:ident, $fmadd:ident, $fnmadd:ident, $sub:ident, $mul:ident, $cast_i:ident, $cast_f:ident, $slli:ident, $add_i:ident) => {{
        let x = $x;
        let r = $set1(f32::from_bits(0x4b40_0000)); // 0x1.8p23
        let z = $fmadd(x, $set1(f32::from_bits(0x3fb8_aa3b)), r); // log2(e)
        let n = $sub(z, r);
        let b = $fnmadd(
            n,
            $set1(f32::from_bits(0x35bf_be8e)), // 0x1.7f7d1cp-20
            $fnmadd(n, $set1(f32::from_bits(0x3f31_7200)), x), // 0x1.62e4p-1
        );
        let e = $slli::<23>($cast_i(z));
        let k = $cast_f($add_i(e, $cast_i($set1(1.0))));
        let u = $mul(b, b);
        let j = $fmadd(
            $fmadd(
                $fmadd(
                    $set1(f32::from_bits(0x3c07_2010)),
                    b,
                    $set1(f32::from_bits(0x3d2b_9f17)),
                ),
                u,
                $fmadd(
                    $set1(f32::from_bits(0x3e2a_af33)),
                    b,
                    $set1(f32::from_bits(0x3eff_fedb)),
                ),
            ),
            u,
            $mul($set1(f32::from_bits(0x3f7f_fff6)), b),
        );
        $fmadd(k, j, k)
    }};
}

/// Vector exp of 8 lanes in `[EXP_MIN, 0]`.
#[target_feature(enable = "avx2,fma")]
unsafe fn exp8(x: __m256) -> __m256 {
    exp_body!(
        x,
        _mm256_set1_ps,
        _mm256_fmadd_ps,
        _mm256_fnmadd_ps,
        _mm256_sub_ps,
        _mm256_mul_ps,
        _mm256_castps_si256,
        _mm256_castsi256_ps,
        _mm256_slli_epi32,
        _mm256_add_epi32
    )
}

/// `x = exp(x - m)`, returning the sum.
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_sum_avx2(x: &mut [f32], m: f32) -> f32 {
    let n = x.len();
    let p = x.as_mut_ptr();
    let (mv, lo) = (_mm256_set1_ps(m), _mm256_set1_ps(EXP_MIN));
    let mut sum = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_max_ps(_mm256_sub_ps(_mm256_loadu_ps(p.add(i)), mv), lo);
        let e = exp8(v);
        _mm256_storeu_ps(p.add(i), e);
        sum = _mm256_add_ps(sum, e);
        i += 8;
    }
    let mut s = hsum256(sum);
    for v in &mut x[i..] {
        *v = (*v - m).exp();
        s += *v;
    }
    s
}

/// `x *= s`.
#[target_feature(enable = "avx2")]
unsafe fn scale_avx2(x: &mut [f32], s: f32) {
    let n = x.len();
    let p = x.as_mut_ptr();
    let sv = _mm256_set1_ps(s);
    let mut i = 0;
    while i + 8 <= n {
        _mm256_storeu_ps(p.add(i), _mm256_mul_ps(_mm256_loadu_ps(p.add(i)), sv));
        i += 8;
    }
    for v in &mut x[i..] {
        *v *= s;
    }
}

/// Queries per call of the AVX-512 multi-query kernels: four queries by
/// 32 keys are 8 score registers, four by 64 value dimensions 16.
const MAX_QUERIES: usize = 4;

/// [`super::attn_kernels::ScoresNFn`] under AVX-512.
fn scores_n(q: &[f32], kt: &[f32], out: &mut [f32]) {
    let hk = kt.len() / MULTI_TILE;
    let nq = out.len() / MULTI_TILE;
    if nq == 0 || q.len() < nq * hk {
        return;
    }
    // SAFETY: AVX-512F was detected (module doc); `q` holds `nq` rows of
    // `hk`, `kt` `hk` rows of MULTI_TILE and `out` `nq` rows of MULTI_TILE.
    unsafe {
        match nq {
            1 => scores_n_avx512::<1>(q, kt, hk, out),
            2 => scores_n_avx512::<2>(q, kt, hk, out),
            3 => scores_n_avx512::<3>(q, kt, hk, out),
            _ => {
                for (qs, o) in q.chunks(4 * hk).zip(out.chunks_mut(4 * MULTI_TILE)) {
                    match o.len() / MULTI_TILE {
                        4 => scores_n_avx512::<4>(qs, kt, hk, o),
                        n => scores_n(&qs[..n * hk], kt, o),
                    }
                }
            }
        }
    }
}

/// `N` queries against the 32 transposed keys: per dimension, two key
/// vectors and one broadcast per query, 2N independent FMA chains.
#[target_feature(enable = "avx512f,fma")]
unsafe fn scores_n_avx512<const N: usize>(q: &[f32], kt: &[f32], hk: usize, out: &mut [f32]) {
    let (qp, kp) = (q.as_ptr(), kt.as_ptr());
    let mut s = [[_mm512_setzero_ps(); 2]; N];
    for d in 0..hk {
        let k0 = _mm512_loadu_ps(kp.add(d * MULTI_TILE));
        let k1 = _mm512_loadu_ps(kp.add(d * MULTI_TILE + 16));
        for (i, si) in s.iter_mut().enumerate() {
            let b = _mm512_set1_ps(*qp.add(i * hk + d));
            si[0] = _mm512_fmadd_ps(b, k0, si[0]);
            si[1] = _mm512_fmadd_ps(b, k1, si[1]);
        }
    }
    for (i, si) in s.iter().enumerate() {
        let o = out.as_mut_ptr().add(i * MULTI_TILE);
        _mm512_storeu_ps(o, si[0]);
        _mm512_storeu_ps(o.add(16), si[1]);
    }
}

/// [`super::attn_kernels::GatherTFn`] under AVX-512: blocks of 16 keys by
/// 16 values loaded (f16 rows widened by `vcvtph2ps`), transposed in
/// registers by four butterfly stages of `vpermt2ps`, and stored as 16
/// values of 16 keys; the last values and the keys past the tile masked.
fn gather_t(src: KvRef<'_>, slots: &[usize], stride: usize, off: usize, kt: &mut [f32]) {
    let hk = kt.len() / MULTI_TILE;
    let slots = &slots[..slots.len().min(MULTI_TILE)];
    let len = match src {
        KvRef::F16(v) => v.len(),
        KvRef::F32(v) => v.len(),
    };
    let fits = slots.iter().all(|&s| {
        s.checked_mul(stride)
            .and_then(|x| x.checked_add(off + hk))
            .is_some_and(|end| end <= len)
    });
    if hk == 0 || !fits {
        // Never for a checked call: the scalar path indexes (and panics).
        return gather_t_scalar(src, slots, stride, off, kt);
    }
    // SAFETY: AVX-512F/BW/VL and F16C were detected (module doc); every
    // row `slots[j] * stride + off .. + hk` lies in `src` (checked above),
    // `kt` holds hk rows of MULTI_TILE, and the loads and stores are
    // masked to those bounds.
    unsafe { gather_t_avx512(src, slots, stride, off, hk, kt) }
}

/// The portable [`super::attn_kernels::GatherTFn`].
fn gather_t_scalar(src: KvRef<'_>, slots: &[usize], stride: usize, off: usize, kt: &mut [f32]) {
    let hk = kt.len() / MULTI_TILE;
    kt.fill(0.0);
    let mut row = vec![0.0f32; hk];
    for (j, &s) in slots.iter().enumerate() {
        gather_scalar(src, &[s], stride, off, &mut row);
        for (d, &x) in row.iter().enumerate() {
            kt[d * MULTI_TILE + j] = x;
        }
    }
}

/// The `vpermt2ps` indices of the four stages of a 16 x 16 transpose.
/// Stage `i` swaps bit `b = 1 << i` between row and column: row `r` (bit
/// `b` clear) keeps its columns `p` with bit `b` clear and takes row
/// `r | b`'s column `p ^ b` for the others (`[0]`); row `r | b` the
/// converse (`[1]`). Indices `16..` pick from the second register.
const BUTTERFLY: [[[i32; 16]; 2]; 4] = {
    let mut t = [[[0i32; 16]; 2]; 4];
    let mut i = 0;
    while i < 4 {
        let b = 1 << i;
        let mut p = 0;
        while p < 16 {
            let (own, other) = (p as i32, (p ^ b) as i32);
            if p & b == 0 {
                t[i][0][p] = own;
                t[i][1][p] = other;
            } else {
                t[i][0][p] = 16 + other;
                t[i][1][p] = 16 + own;
            }
            p += 1;
        }
        i += 1;
    }
    t
};

#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn gather_t_avx512(
    src: KvRef<'_>,
    slots: &[usize],
    stride: usize,
    off: usize,
    hk: usize,
    kt: &mut [f32],
) {
    let tp = kt.as_mut_ptr();
    let stages: [(usize, __m512i, __m512i); 4] = std::array::from_fn(|i| {
        let [lo, hi] = &BUTTERFLY[i];
        let load = |v: &[i32; 16]| _mm512_loadu_si512(v.as_ptr().cast());
        (1 << i, load(lo), load(hi))
    });
    let n = slots.len();
    for j0 in (0..MULTI_TILE).step_by(16) {
        for d0 in (0..hk).step_by(16) {
            let cols = (hk - d0).min(16);
            let mask: __mmask16 = if cols == 16 { !0 } else { (1u16 << cols) - 1 };
            let mut r = [_mm512_setzero_ps(); 16];
            for (i, ri) in r.iter_mut().enumerate() {
                if j0 + i < n {
                    let at = slots[j0 + i] * stride + off + d0;
                    *ri = match src {
                        KvRef::F16(v) => _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                            mask,
                            v.as_ptr().add(at).cast(),
                        )),
                        KvRef::F32(v) => _mm512_maskz_loadu_ps(mask, v.as_ptr().add(at)),
                    };
                }
            }
            for &(b, lo, hi) in &stages {
                for i in (0..16).filter(|i| i & b == 0) {
                    let (a, c) = (r[i], r[i | b]);
                    r[i] = _mm512_permutex2var_ps(a, lo, c);
                    r[i | b] = _mm512_permutex2var_ps(a, hi, c);
                }
            }
            for (i, ri) in r.iter().enumerate().take(cols) {
                _mm512_storeu_ps(tp.add((d0 + i) * MULTI_TILE + j0), *ri);
            }
        }
    }
}

/// [`super::attn_kernels::PrefetchFn`]: one `prefetcht0` per cache line.
fn prefetch(src: KvRef<'_>, slots: &[usize], stride: usize, off: usize, width: usize) {
    let (base, size) = match src {
        KvRef::F16(v) => (v.as_ptr().cast::<i8>(), 2),
        KvRef::F32(v) => (v.as_ptr().cast::<i8>(), 4),
    };
    for &s in slots {
        let row = base.wrapping_add((s * stride + off) * size);
        // From the start of the row's first line to its last byte.
        let lead = row as usize & 63;
        let line0 = row.wrapping_sub(lead);
        for at in (0..lead + width * size).step_by(64) {
            // SAFETY: a prefetch never faults, whatever the address;
            // `wrapping_add` keeps the pointer arithmetic defined.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(line0.wrapping_add(at)) };
        }
    }
}

/// [`super::attn_kernels::SoftmaxNFn`] under AVX-512: a query's tile of
/// scores is two registers, masked to `lo..hi`.
fn softmax_n(sc: &mut [f32], lo: usize, hi: usize, ml: &mut [f32], acc: &mut [f32]) {
    let nq = ml.len() / 2;
    if nq == 0 || lo >= hi || hi > MULTI_TILE || sc.len() < nq * MULTI_TILE {
        return;
    }
    let hv = acc.len() / nq;
    // Lanes lo..hi of the 32 (bit j: key j).
    let keys = (u32::MAX >> (32 - (hi - lo))) << lo;
    for i in 0..nq {
        let row = &mut sc[i * MULTI_TILE..][..MULTI_TILE];
        // SAFETY: AVX-512F and FMA were detected (module doc); `row` holds
        // MULTI_TILE (32) values.
        let (m, sum) = unsafe { softmax_row_avx512(row, keys, ml[2 * i]) };
        let corr = (ml[2 * i] - m).exp();
        if corr != 1.0 {
            // SAFETY: AVX2 was detected (module doc).
            unsafe { scale_avx2(&mut acc[i * hv..(i + 1) * hv], corr) };
        }
        ml[2 * i + 1] = ml[2 * i + 1] * corr + sum;
        ml[2 * i] = m;
    }
}

/// The new maximum of one query (`m_old` and the scores of the lanes in
/// `keys`), the scores replaced by `exp(score - max)`, and their sum.
#[target_feature(enable = "avx512f,fma")]
unsafe fn softmax_row_avx512(row: &mut [f32], keys: u32, m_old: f32) -> (f32, f32) {
    let p = row.as_mut_ptr();
    let (k0, k1) = (keys as __mmask16, (keys >> 16) as __mmask16);
    let ninf = _mm512_set1_ps(f32::NEG_INFINITY);
    let v0 = _mm512_mask_loadu_ps(ninf, k0, p);
    let v1 = _mm512_mask_loadu_ps(ninf, k1, p.add(16));
    let m = _mm512_reduce_max_ps(_mm512_max_ps(v0, v1)).max(m_old);
    let (mv, lo) = (_mm512_set1_ps(m), _mm512_set1_ps(EXP_MIN));
    let e0 = _mm512_maskz_mov_ps(k0, exp16(_mm512_max_ps(_mm512_sub_ps(v0, mv), lo)));
    let e1 = _mm512_maskz_mov_ps(k1, exp16(_mm512_max_ps(_mm512_sub_ps(v1, mv), lo)));
    _mm512_storeu_ps(p, e0);
    _mm512_storeu_ps(p.add(16), e1);
    (m, _mm512_reduce_add_ps(_mm512_add_ps(e0, e1)))
}

/// Vector exp of 16 lanes in `[EXP_MIN, 0]` ([`exp8`]'s arithmetic).
#[inline]
#[target_feature(enable = "avx512f,fma")]
unsafe fn exp16(x: __m512) -> __m512 {
    exp_body!(
        x,
        _mm512_set1_ps,
        _mm512_fmadd_ps,
        _mm512_fnmadd_ps,
        _mm512_sub_ps,
        _mm512_mul_ps,
        _mm512_castps_si512,
        _mm512_castsi512_ps,
        _mm512_slli_epi32,
        _mm512_add_epi32
    )
}

/// [`super::attn_kernels::AccumNFn`] under AVX-512 (value widths that are
/// not multiples of 16 run the scalar loop).
fn accum_n(p: &[f32], v: &[f32], hv: usize, acc: &mut [f32]) {
    let Some((_, n)) = accum_n_shape(p, v, hv, acc) else {
        return;
    };
    if !hv.is_multiple_of(16) {
        return accum_n_scalar(p, v, hv, n, acc);
    }
    for (c, a) in p.chunks(4 * MULTI_TILE).zip(acc.chunks_mut(4 * hv)) {
        // SAFETY: AVX-512F was detected (module doc); `c` holds the scores
        // of `a.len() / hv` queries (n each, row stride MULTI_TILE), `v` n
        // rows of hv, and hv is a multiple of 16.
        unsafe {
            match a.len() / hv {
                1 => accum_n_avx512::<1>(c, v, n, hv, a),
                2 => accum_n_avx512::<2>(c, v, n, hv, a),
                3 => accum_n_avx512::<3>(c, v, n, hv, a),
                _ => accum_n_avx512::<4>(c, v, n, hv, a),
            }
        }
    }
}

/// `N` queries' weighted sums of `n` value rows, 64 dimensions (4 registers
/// per query) at a time: per key, four value vectors and one broadcast per
/// query.
#[target_feature(enable = "avx512f,fma")]
unsafe fn accum_n_avx512<const N: usize>(
    p: &[f32],
    v: &[f32],
    n: usize,
    hv: usize,
    acc: &mut [f32],
) {
    let (pp, vp, ap) = (p.as_ptr(), v.as_ptr(), acc.as_mut_ptr());
    let mut c0 = 0;
    while c0 < hv {
        let w = ((hv - c0) / 16).min(4);
        let mut a = [[_mm512_setzero_ps(); 4]; N];
        for (i, ai) in a.iter_mut().enumerate() {
            for (k, x) in ai.iter_mut().enumerate().take(w) {
                *x = _mm512_loadu_ps(ap.add(i * hv + c0 + 16 * k));
            }
        }
        if w == 4 {
            for j in 0..n {
                let row = vp.add(j * hv + c0);
                let vv = [
                    _mm512_loadu_ps(row),
                    _mm512_loadu_ps(row.add(16)),
                    _mm512_loadu_ps(row.add(32)),
                    _mm512_loadu_ps(row.add(48)),
                ];
                for (i, ai) in a.iter_mut().enumerate() {
                    let b = _mm512_set1_ps(*pp.add(i * MULTI_TILE + j));
                    for (x, &y) in ai.iter_mut().zip(&vv) {
                        *x = _mm512_fmadd_ps(b, y, *x);
                    }
                }
            }
        } else {
            for j in 0..n {
                let row = vp.add(j * hv + c0);
                for (i, ai) in a.iter_mut().enumerate() {
                    let b = _mm512_set1_ps(*pp.add(i * MULTI_TILE + j));
                    for (k, x) in ai.iter_mut().enumerate().take(w) {
                        *x = _mm512_fmadd_ps(b, _mm512_loadu_ps(row.add(16 * k)), *x);
                    }
                }
            }
        }
        for (i, ai) in a.iter().enumerate() {
            for (k, x) in ai.iter().enumerate().take(w) {
                _mm512_storeu_ps(ap.add(i * hv + c0 + 16 * k), *x);
            }
        }
        c0 += 16 * w;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vector_exp_matches_libm() {
        for isa in [Isa::Avx2] {
            let Some(k) = AttnKernels::for_isa(isa) else {
                continue;
            };
            let xs: Vec<f32> = (0..2000)
                .map(|i| -90.0 + i as f32 * 0.045 + 0.001)
                .collect();
            let mut y = xs.clone();
            let sum = (k.exp_sum)(&mut y, 0.0);
            let mut want_sum = 0.0f64;
            for (&x, &y) in xs.iter().zip(&y) {
                let w = f64::from(x).exp();
                want_sum += w;
                if x >= EXP_MIN {
                    assert!(
                        ((f64::from(y) - w) / w).abs() < 4e-7,
                        "{isa}: exp({x}) = {y}, want {w}"
                    );
                } else {
                    assert!(f64::from(y) < 2e-38, "{isa}: exp({x}) = {y}");
                }
            }
            assert!(
                ((f64::from(sum) - want_sum) / want_sum).abs() < 1e-5,
                "{isa}"
            );
        }
    }

    #[test]
    fn multi_query_softmax_matches_libm() {
        if !Isa::Avx512.available() {
            println!("skipped: this CPU has no AVX-512");
            return;
        }
        // One query, keys 3..29 of a tile, from an empty state.
        let xs: Vec<f32> = (0..MULTI_TILE).map(|j| -40.0 + 1.7 * j as f32).collect();
        let mut sc = xs.clone();
        let (mut ml, mut acc) = ([f32::NEG_INFINITY, 0.0], [1.0f32; 16]);
        softmax_n(&mut sc, 3, 29, &mut ml, &mut acc);
        let m = xs[28];
        assert_eq!(ml[0], m);
        let mut want = 0.0f64;
        for j in 3..29 {
            let w = f64::from(xs[j] - m).exp();
            want += w;
            assert!(
                ((f64::from(sc[j]) - w) / w).abs() < 4e-7,
                "key {j}: {} vs {w}",
                sc[j]
            );
        }
        assert!(((f64::from(ml[1]) - want) / want).abs() < 1e-6);
        // The old state rescaled: exp(-inf - m) = 0.
        assert!(acc.iter().all(|&a| a == 0.0));
    }
}
