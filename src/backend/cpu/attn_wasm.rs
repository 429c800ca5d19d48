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

use core::arch::wasm32::*;

use super::attention::KvRef;
use super::attn_kernels::{gather_scalar, AttnKernels, EXP_MIN};
use super::kernels::{fp16, simd128_h2f, simd128_h2f_high, simd128_vec_dot_f32, Isa};
use super::rowops_wasm::exp4;

/// The kernels of `isa`: SIMD128's, `None` for the others.
pub(super) fn kernels(isa: Isa) -> Option<AttnKernels> {
    match isa {
        Isa::Simd128 => Some(AttnKernels {
            isa,
            gather,
            scores,
            exp_sum,
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
                        simd128_h2f(u32x4_extend_low_u16x8(x)),
                        simd128_h2f(u32x4_extend_high_u16x8(x)),
                    )
                } else {
                    (
                        simd128_h2f_high::<false>(i16x8_shuffle::<8, 0, 9, 1, 10, 2, 11, 3>(x, z)),
                        simd128_h2f_high::<false>(i16x8_shuffle::<12, 4, 13, 5, 14, 6, 15, 7>(
                            x, z,
                        )),
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
        *o = simd128_vec_dot_f32(k, q);
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
