//! SIMD128 attention kernels (wasm32 builds with `+simd128`).
//!
//! Decode attention in wasm spent most of its time widening the f16 cache
//! to f32 one value at a time (a branchy conversion per element): the
//! gather here widens eight per step with the exact conversion of the
//! matmul kernels, and the key scores use the SIMD128 f32 dot, whose lane
//! order is the scalar one. Both are bit-identical to the scalar kernels.
//! The exponentials run four lanes at a time with the row ops' `exp4`
//! (each call of the scalar `expf` is a libm call in wasm), as the x86
//! kernels do with theirs; the weighted sums and scaling stay scalar (LLVM
//! vectorizes them).
//!
//! The multi-query kernels ([`MultiKernels`]) score and accumulate the
//! heads of one position that share a K/V head against one tile of keys:
//! each key and value vector loaded serves two queries, and the scores of
//! the transposed key tile come out four keys per vector with no
//! horizontal sums. Pairs of queries by 16 keys (or 16 value dimensions)
//! keep the accumulators within SIMD128's 16 registers.

use core::arch::wasm32::*;

use super::rowops::exp4;
use super::simd128::{h2f, h2f_high, vec_dot_f32};
use crate::backend::cpu::attention::KvRef;
use crate::backend::cpu::attn_kernels::{
    accum_n_scalar, accum_n_shape, gather_scalar, AttnKernels, MultiKernels, EXP_MIN, MULTI_TILE,
};
use crate::backend::cpu::kernels::{fp16, Isa};

/// The kernels of `isa`: SIMD128's, `None` for the others.
pub(in crate::backend::cpu) fn kernels(isa: Isa) -> Option<AttnKernels> {
    match isa {
        Isa::Simd128 => Some(AttnKernels {
            isa,
            gather,
            scores,
            exp_sum,
            multi: Some(MultiKernels {
                max_queries: MAX_QUERIES,
                scores: scores_n,
                softmax: softmax_n,
                accum: accum_n,
                gather_t,
                prefetch: |_, _, _, _, _| {},
            }),
            ..AttnKernels::scalar()
        }),
        _ => None,
    }
}

/// [`super::attn_kernels::GatherFn`]: f16 rows widened eight values at a
/// time (f32 rows are plain copies, as in the scalar kernel).
fn gather(src: KvRef<'_>, slots: &[usize], stride: usize, off: usize, dst: &mut [f32]) {
    let KvRef::F16(v) = src else {
        return gather_scalar(src, slots, stride, off, dst);
    };
    let width = dst.len() / slots.len().max(1);
    for (d, &s) in dst.chunks_exact_mut(width.max(1)).zip(slots) {
        let at = s * stride + off;
        let Some(row) = v.get(at..at + d.len()) else {
            // The caller bounds-checks every row; keep the scalar behaviour.
            return gather_scalar(src, slots, stride, off, dst);
        };
        let n = d.len() / 8 * 8;
        let (bytes, out) = (bytemuck::cast_slice::<_, u8>(&row[..n]), &mut d[..n]);
        let (z, exp) = (i16x8_splat(0), i16x8_splat(0x7C00));
        for (h, o) in bytes.chunks_exact(16).zip(out.chunks_exact_mut(8)) {
            // SAFETY: `h` holds 16 readable bytes and `o` 8 writable f32
            // (32 bytes); `v128` loads and stores need no alignment.
            unsafe {
                let x = v128_load(h.as_ptr().cast());
                // Eight normal halves (the common case) take the short
                // conversion; a zero, subnormal, infinity or NaN among
                // them, the full one.
                let e = v128_and(x, exp);
                let (lo, hi) = if v128_any_true(v128_or(i16x8_eq(e, z), i16x8_eq(e, exp))) {
                    (
                        h2f(u32x4_extend_low_u16x8(x)),
                        h2f(u32x4_extend_high_u16x8(x)),
                    )
                } else {
                    (
                        h2f_high::<false>(i16x8_shuffle::<8, 0, 9, 1, 10, 2, 11, 3>(x, z)),
                        h2f_high::<false>(i16x8_shuffle::<12, 4, 13, 5, 14, 6, 15, 7>(x, z)),
                    )
                };
                v128_store(o.as_mut_ptr().cast(), lo);
                v128_store(o.as_mut_ptr().add(4).cast(), hi);
            }
        }
        for (o, &h) in d[n..].iter_mut().zip(&row[n..]) {
            *o = fp16(h);
        }
    }
}

/// [`super::attn_kernels::ScoresFn`] with the SIMD128 f32 dot.
fn scores(q: &[f32], tile: &[f32], out: &mut [f32]) {
    let w = q.len().max(1);
    for (o, k) in out.iter_mut().zip(tile.chunks_exact(w)) {
        *o = vec_dot_f32(k, q);
    }
}

/// [`super::attn_kernels::ExpSumFn`]: `x = exp(x - m)` four lanes at a
/// time (`x - m` clamped to [`EXP_MIN`]), returning the sum.
fn exp_sum(x: &mut [f32], m: f32) -> f32 {
    let (mv, lo) = (f32x4_splat(m), f32x4_splat(EXP_MIN));
    let mut sum = f32x4_splat(0.0);
    let mut chunks = x.chunks_exact_mut(4);
    for c in chunks.by_ref() {
        // SAFETY: `c` holds 4 f32 (16 bytes); `v128` loads and stores
        // need no alignment.
        unsafe {
            // `pmax` (one `maxps` in V8, where `max` is a NaN-propagating
            // sequence) takes `lo` for a NaN, as the x86 kernels' max does.
            let v = f32x4_pmax(lo, f32x4_sub(v128_load(c.as_ptr().cast()), mv));
            let e = exp4(v);
            v128_store(c.as_mut_ptr().cast(), e);
            sum = f32x4_add(sum, e);
        }
    }
    let mut s = f32x4_extract_lane::<0>(sum)
        + f32x4_extract_lane::<1>(sum)
        + f32x4_extract_lane::<2>(sum)
        + f32x4_extract_lane::<3>(sum);
    for v in chunks.into_remainder() {
        *v = (*v - m).exp();
        s += *v;
    }
    s
}

/// Queries per call of the multi-query kernels (run two at a time).
const MAX_QUERIES: usize = 4;

/// Loads four f32 at `p`.
///
/// # Safety
/// `p` points at 4 readable f32.
#[inline(always)]
unsafe fn load4(p: *const f32) -> v128 {
    v128_load(p.cast())
}

/// Stores four f32 at `p`.
///
/// # Safety
/// `p` points at 4 writable f32.
#[inline(always)]
unsafe fn store4(p: *mut f32, v: v128) {
    v128_store(p.cast(), v)
}

/// [`super::attn_kernels::ScoresNFn`]: pairs of queries against 16 keys of
/// the transposed tile at a time.
fn scores_n(q: &[f32], kt: &[f32], out: &mut [f32]) {
    let hk = kt.len() / MULTI_TILE;
    let nq = out.len() / MULTI_TILE;
    if nq == 0 || hk == 0 || q.len() < nq * hk {
        return;
    }
    for (qs, o) in q.chunks(2 * hk).zip(out.chunks_mut(2 * MULTI_TILE)) {
        // SAFETY: `qs` holds the rows of hk of the `o.len() / MULTI_TILE`
        // queries of `o`, `kt` hk rows of MULTI_TILE.
        unsafe {
            match o.len() / MULTI_TILE {
                2 => scores_pair::<2>(qs, kt, hk, o),
                _ => scores_pair::<1>(qs, kt, hk, o),
            }
        }
    }
}

/// `N` (1 or 2) queries by the 32 transposed keys, 16 keys per pass: per
/// dimension, four key vectors and one broadcast per query.
///
/// # Safety
/// `q` holds `N` rows of `hk`, `kt` `hk` rows of [`MULTI_TILE`], `out` `N`
/// rows of [`MULTI_TILE`].
#[inline(always)]
unsafe fn scores_pair<const N: usize>(q: &[f32], kt: &[f32], hk: usize, out: &mut [f32]) {
    let (qp, kp, op) = (q.as_ptr(), kt.as_ptr(), out.as_mut_ptr());
    for half in [0, 16] {
        let mut s = [[f32x4_splat(0.0); 4]; N];
        for d in 0..hk {
            let row = kp.add(d * MULTI_TILE + half);
            let k = [
                load4(row),
                load4(row.add(4)),
                load4(row.add(8)),
                load4(row.add(12)),
            ];
            for (i, si) in s.iter_mut().enumerate() {
                let b = f32x4_splat(*qp.add(i * hk + d));
                for (x, &kc) in si.iter_mut().zip(&k) {
                    *x = f32x4_add(*x, f32x4_mul(b, kc));
                }
            }
        }
        for (i, si) in s.iter().enumerate() {
            for (c, &x) in si.iter().enumerate() {
                store4(op.add(i * MULTI_TILE + half + 4 * c), x);
            }
        }
    }
}

/// [`super::attn_kernels::GatherTFn`]: four rows at a time widened (by
/// [`gather`]) into scratch, then transposed in 4 x 4 blocks by shuffles.
fn gather_t(src: KvRef<'_>, slots: &[usize], stride: usize, off: usize, kt: &mut [f32]) {
    /// The widest rows transposed in registers (wider: one value at a time).
    const MAX_HK: usize = 256;
    let hk = kt.len() / MULTI_TILE;
    let slots = &slots[..slots.len().min(MULTI_TILE)];
    if hk == 0 {
        return;
    }
    if hk > MAX_HK || !hk.is_multiple_of(4) {
        kt.fill(0.0);
        let mut row = vec![0.0f32; hk];
        for (j, &s) in slots.iter().enumerate() {
            gather(src, &[s], stride, off, &mut row);
            for (d, &x) in row.iter().enumerate() {
                kt[d * MULTI_TILE + j] = x;
            }
        }
        return;
    }
    let mut rows = [0.0f32; 4 * MAX_HK];
    for j0 in (0..MULTI_TILE).step_by(4) {
        let n = slots.len().saturating_sub(j0).min(4);
        let rows = &mut rows[..4 * hk];
        rows[n * hk..].fill(0.0);
        if n > 0 {
            gather(src, &slots[j0..j0 + n], stride, off, &mut rows[..n * hk]);
        }
        let rp = rows.as_ptr();
        for d0 in (0..hk).step_by(4) {
            // SAFETY: `rows` holds 4 rows of hk (a multiple of 4), `kt` hk
            // rows of MULTI_TILE, so every 4-value load and store is inside.
            unsafe {
                let r: [v128; 4] = std::array::from_fn(|i| load4(rp.add(i * hk + d0)));
                let a = i32x4_shuffle::<0, 4, 1, 5>(r[0], r[1]);
                let b = i32x4_shuffle::<0, 4, 1, 5>(r[2], r[3]);
                let c = i32x4_shuffle::<2, 6, 3, 7>(r[0], r[1]);
                let e = i32x4_shuffle::<2, 6, 3, 7>(r[2], r[3]);
                let out = kt.as_mut_ptr().add(d0 * MULTI_TILE + j0);
                store4(out, i64x2_shuffle::<0, 2>(a, b));
                store4(out.add(MULTI_TILE), i64x2_shuffle::<1, 3>(a, b));
                store4(out.add(2 * MULTI_TILE), i64x2_shuffle::<0, 2>(c, e));
                store4(out.add(3 * MULTI_TILE), i64x2_shuffle::<1, 3>(c, e));
            }
        }
    }
}

/// [`super::attn_kernels::SoftmaxNFn`]: a query's tile of scores is eight
/// vectors; the lanes outside `lo..hi` come out zero.
fn softmax_n(sc: &mut [f32], lo: usize, hi: usize, ml: &mut [f32], acc: &mut [f32]) {
    let nq = ml.len() / 2;
    if nq == 0 || lo >= hi || hi > MULTI_TILE || sc.len() < nq * MULTI_TILE {
        return;
    }
    let hv = acc.len() / nq;
    let lo_v = f32x4_splat(EXP_MIN);
    for i in 0..nq {
        let row = &mut sc[i * MULTI_TILE..][..MULTI_TILE];
        let m = row[lo..hi].iter().fold(ml[2 * i], |a, &b| a.max(b));
        let mv = f32x4_splat(m);
        let mut sum = f32x4_splat(0.0);
        for (c, v) in row.chunks_exact_mut(4).enumerate() {
            // SAFETY: `v` holds 4 f32.
            unsafe {
                let x = f32x4_pmax(lo_v, f32x4_sub(load4(v.as_ptr()), mv));
                let e = exp4(x);
                // Lanes of keys outside lo..hi become zero.
                let key = u32x4(
                    4 * c as u32,
                    4 * c as u32 + 1,
                    4 * c as u32 + 2,
                    4 * c as u32 + 3,
                );
                let inside = v128_and(
                    u32x4_ge(key, u32x4_splat(lo as u32)),
                    u32x4_lt(key, u32x4_splat(hi as u32)),
                );
                let e = v128_and(e, inside);
                store4(v.as_mut_ptr(), e);
                sum = f32x4_add(sum, e);
            }
        }
        let sum = f32x4_extract_lane::<0>(sum)
            + f32x4_extract_lane::<1>(sum)
            + f32x4_extract_lane::<2>(sum)
            + f32x4_extract_lane::<3>(sum);
        let corr = (ml[2 * i] - m).exp();
        if corr != 1.0 {
            acc[i * hv..(i + 1) * hv]
                .iter_mut()
                .for_each(|a| *a *= corr);
        }
        ml[2 * i + 1] = ml[2 * i + 1] * corr + sum;
        ml[2 * i] = m;
    }
}

/// [`super::attn_kernels::AccumNFn`]: pairs of queries, 16 value
/// dimensions at a time (widths not multiples of 4 run the scalar loop).
fn accum_n(p: &[f32], v: &[f32], hv: usize, acc: &mut [f32]) {
    let Some((_, n)) = accum_n_shape(p, v, hv, acc) else {
        return;
    };
    if !hv.is_multiple_of(4) {
        return accum_n_scalar(p, v, hv, n, acc);
    }
    for (c, a) in p.chunks(2 * MULTI_TILE).zip(acc.chunks_mut(2 * hv)) {
        // SAFETY: `c` holds the scores of the `a.len() / hv` queries (n
        // each, row stride MULTI_TILE), `v` n rows of hv, hv a multiple of 4.
        unsafe {
            match a.len() / hv {
                2 => accum_pair::<2>(c, v, n, hv, a),
                _ => accum_pair::<1>(c, v, n, hv, a),
            }
        }
    }
}

/// `N` (1 or 2) queries' weighted sums of `n` value rows, up to 16
/// dimensions (four vectors per query) at a time.
///
/// # Safety
/// `p` holds `N` rows of scores (stride [`MULTI_TILE`], `n` used), `v` `n`
/// rows of `hv` (a multiple of 4), `acc` `N` rows of `hv`.
#[inline(always)]
unsafe fn accum_pair<const N: usize>(p: &[f32], v: &[f32], n: usize, hv: usize, acc: &mut [f32]) {
    let (pp, vp, ap) = (p.as_ptr(), v.as_ptr(), acc.as_mut_ptr());
    let mut c0 = 0;
    while c0 < hv {
        let w = ((hv - c0) / 4).min(4);
        let mut a = [[f32x4_splat(0.0); 4]; N];
        for (i, ai) in a.iter_mut().enumerate() {
            for (k, x) in ai.iter_mut().enumerate().take(w) {
                *x = load4(ap.add(i * hv + c0 + 4 * k));
            }
        }
        for j in 0..n {
            let row = vp.add(j * hv + c0);
            let vv: [v128; 4] = std::array::from_fn(|k| {
                if k < w {
                    load4(row.add(4 * k))
                } else {
                    f32x4_splat(0.0)
                }
            });
            for (i, ai) in a.iter_mut().enumerate() {
                let b = f32x4_splat(*pp.add(i * MULTI_TILE + j));
                for (x, &y) in ai.iter_mut().zip(&vv).take(w) {
                    *x = f32x4_add(*x, f32x4_mul(b, y));
                }
            }
        }
        for (i, ai) in a.iter().enumerate() {
            for (k, x) in ai.iter().enumerate().take(w) {
                store4(ap.add(i * hv + c0 + 4 * k), *x);
            }
        }
        c0 += 4 * w;
    }
}
