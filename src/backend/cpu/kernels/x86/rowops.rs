//! AVX2 kernels of [`RowOps`]: 8 lanes with FMA and F16C (the AVX-512
//! table uses them too: these ops are bound by memory and the GELU gather).
//!
//! The entries are reachable only through [`kernels`], which
//! [`RowOps::for_isa`] calls only for an ISA whose features it has
//! detected: that is the safety argument of every `unsafe` call below.

use std::arch::x86_64::*;

use crate::backend::cpu::kernels::Isa;
use crate::backend::cpu::rowops::RowOps;
use crate::graph::reference;

/// The kernels for `isa` (AVX2 or AVX-512; the caller checked it is available).
pub(in crate::backend::cpu) fn kernels(isa: Isa) -> RowOps {
    RowOps::with(isa, gelu_mul, silu_mul, reference::add, rms_norm)
}

fn gelu_mul(x: &mut [f32], y: &[f32]) {
    let table = reference::gelu_table();
    // SAFETY: features detected (module doc); the table has 65536 entries.
    unsafe { gelu_mul_avx2(x, y, table) }
}

fn silu_mul(x: &mut [f32], y: &[f32]) {
    // SAFETY: features detected (module doc).
    unsafe { silu_mul_avx2(x, y) }
}

fn rms_norm(x: &mut [f32], w: &[f32], eps: f32) {
    let width = w.len();
    if width == 0 {
        return;
    }
    for row in x.chunks_exact_mut(width) {
        // SAFETY: features detected (module doc); `row` and `w` of one length.
        let sum = unsafe { sum_sq_avx2(row) };
        let scale = reference::rms_scale(sum, width, eps);
        // SAFETY: as above.
        unsafe { scale_mul_avx2(row, w, scale) };
    }
}

/// `x = table[f16(x)] * y` for `x` in (-10, 10), `0` at or below -10, `x *
/// y` at or above 10: [`reference::gelu_mul`] lane for lane.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn gelu_mul_avx2(x: &mut [f32], y: &[f32], table: &[f32]) {
    let n = x.len().min(y.len());
    if table.len() < 1 << 16 {
        return reference::gelu_mul(&mut x[..n], &y[..n]);
    }
    let (xp, yp, tp) = (x.as_mut_ptr(), y.as_ptr(), table.as_ptr());
    let (lo, hi) = (_mm256_set1_ps(-10.0), _mm256_set1_ps(10.0));
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_loadu_ps(xp.add(i));
        let u = _mm256_loadu_ps(yp.add(i));
        let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
        // Indices are 16-bit, so every gathered address is inside the table.
        let g = _mm256_i32gather_ps::<4>(tp, _mm256_cvtepu16_epi32(h));
        let r = _mm256_blendv_ps(
            _mm256_mul_ps(g, u),
            _mm256_mul_ps(v, u),
            _mm256_cmp_ps::<_CMP_GE_OQ>(v, hi),
        );
        let r = _mm256_andnot_ps(_mm256_cmp_ps::<_CMP_LE_OQ>(v, lo), r);
        _mm256_storeu_ps(xp.add(i), r);
        i += 8;
    }
    reference::gelu_mul(&mut x[i..n], &y[i..n]);
}

/// `x = x / (1 + exp(-x)) * y` with ggml's `ggml_v_expf` (Arm's optimized
/// routine, max error 1.5 ulp). The exponent is clamped to +-87, where
/// the routine needs none of ggml's overflow branches: below -87 SiLU is
/// within 1e-36 of 0 either way, above 87 it is `x` either way.
#[target_feature(enable = "avx2,fma")]
unsafe fn silu_mul_avx2(x: &mut [f32], y: &[f32]) {
    let n = x.len().min(y.len());
    let (xp, yp) = (x.as_mut_ptr(), y.as_ptr());
    let one = _mm256_set1_ps(1.0);
    let (lo, hi) = (_mm256_set1_ps(-87.0), _mm256_set1_ps(87.0));
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_loadu_ps(xp.add(i));
        let neg = _mm256_min_ps(_mm256_max_ps(_mm256_sub_ps(_mm256_setzero_ps(), v), lo), hi);
        let s = _mm256_div_ps(v, _mm256_add_ps(one, exp8(neg)));
        _mm256_storeu_ps(xp.add(i), _mm256_mul_ps(s, _mm256_loadu_ps(yp.add(i))));
        i += 8;
    }
    reference::silu_mul(&mut x[i..n], &y[i..n]);
}

/// `exp(x)` for `x` in [-87, 87]: ggml's AVX2 `ggml_v_expf` without the
/// branches for `|n| > 126`, which this range never takes.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn exp8(x: __m256) -> __m256 {
    let c = |bits: u32| _mm256_set1_ps(f32::from_bits(bits));
    let r = c(0x4b40_0000); // 0x1.8p23
    let z = _mm256_fmadd_ps(x, c(0x3fb8_aa3b), r); // log2(e)
    let n = _mm256_sub_ps(z, r);
    let b = _mm256_fnmadd_ps(
        n,
        c(0x35bf_be8e),                         // 0x1.7f7d1cp-20
        _mm256_fnmadd_ps(n, c(0x3f31_7200), x), // 0x1.62e4p-1
    );
    let e = _mm256_slli_epi32::<23>(_mm256_castps_si256(z));
    let k = _mm256_castsi256_ps(_mm256_add_epi32(
        e,
        _mm256_castps_si256(_mm256_set1_ps(1.0)),
    ));
    let u = _mm256_mul_ps(b, b);
    let j = _mm256_fmadd_ps(
        _mm256_fmadd_ps(
            _mm256_fmadd_ps(c(0x3c07_2010), b, c(0x3d2b_9f17)),
            u,
            _mm256_fmadd_ps(c(0x3e2a_af33), b, c(0x3eff_fedb)),
        ),
        u,
        _mm256_mul_ps(c(0x3f7f_fff6), b),
    );
    _mm256_fmadd_ps(j, k, k)
}

/// Σ x² in [`reference::rms_norm`]'s order: squares in f32, eight f64 partial
/// sums (lane `j` takes elements `8i + j`), combined by
/// [`reference::combine8`], then the tail in order.
#[target_feature(enable = "avx2")]
unsafe fn sum_sq_avx2(x: &[f32]) -> f64 {
    let n = x.len();
    let p = x.as_ptr();
    let (mut a, mut b) = (_mm256_setzero_pd(), _mm256_setzero_pd());
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_loadu_ps(p.add(i));
        let sq = _mm256_mul_ps(v, v);
        a = _mm256_add_pd(a, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
        b = _mm256_add_pd(b, _mm256_cvtps_pd(_mm256_extractf128_ps::<1>(sq)));
        i += 8;
    }
    let mut lanes = [0.0f64; 8];
    _mm256_storeu_pd(lanes.as_mut_ptr(), a);
    _mm256_storeu_pd(lanes.as_mut_ptr().add(4), b);
    let mut sum = reference::combine8(lanes);
    for &v in &x[i..] {
        sum += f64::from(v * v);
    }
    sum
}

/// `x = (x * scale) * w` (two roundings, as the scalar form).
#[target_feature(enable = "avx2")]
unsafe fn scale_mul_avx2(x: &mut [f32], w: &[f32], scale: f32) {
    let n = x.len().min(w.len());
    let (xp, wp) = (x.as_mut_ptr(), w.as_ptr());
    let s = _mm256_set1_ps(scale);
    let mut i = 0;
    while i + 8 <= n {
        let v = _mm256_mul_ps(_mm256_loadu_ps(xp.add(i)), s);
        _mm256_storeu_ps(xp.add(i), _mm256_mul_ps(v, _mm256_loadu_ps(wp.add(i))));
        i += 8;
    }
    for (v, &g) in x[i..n].iter_mut().zip(&w[i..n]) {
        *v = (*v * scale) * g;
    }
}
