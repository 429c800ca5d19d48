//! F32, F16 and BF16: ggml's scalar conversions, rows and dot products.
//!
//! The conversions are ports of `ggml_compute_fp32_to_fp16` and
//! `ggml_compute_fp32_to_bf16` (ggml-impl.h), so quantized scales and
//! converted tensors match llama.cpp's files bit for bit, NaNs included.
//! Both round to nearest, ties to even.

use half::{bf16, f16};

/// f32 to f16 as ggml's `ggml_compute_fp32_to_fp16`: round to nearest even,
/// overflow to infinity, any NaN to the quiet NaN `0x7E00` with the input's sign.
///
/// Agrees with `half::f16::from_f32` on every non-NaN input (checked by a test);
/// `half` keeps NaN payload bits, ggml does not.
pub fn fp32_to_fp16(f: f32) -> f16 {
    // The float trick: scaling by 2^112 then 2^-110 lets the FPU do the
    // rounding of the mantissa into the 10 bits that survive.
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;

    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);

    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let exp_bits = (bits >> 13) & 0x0000_7C00;
    let mantissa_bits = bits & 0x0000_0FFF;
    let nonsign = exp_bits + mantissa_bits;
    let h = (sign >> 16)
        | if shl1_w > 0xFF00_0000 {
            0x7E00
        } else {
            nonsign
        };
    // Truncation to 16 bits is what the C function's `uint16_t` return does.
    f16::from_bits(h as u16)
}

/// f16 to f32 (exact).
pub fn fp16_to_fp32(h: f16) -> f32 {
    h.to_f32()
}

/// f32 to bf16 as ggml's `ggml_compute_fp32_to_bf16`: round to nearest even,
/// NaN made quiet by setting bit 6 of the truncated pattern (sign and payload kept).
pub fn fp32_to_bf16(s: f32) -> bf16 {
    let u = s.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        return bf16::from_bits(((u >> 16) | 64) as u16);
    }
    // Cannot overflow: the largest pattern, -NaN excluded, is 0xFF80_0000.
    bf16::from_bits((u.wrapping_add(0x7fff + ((u >> 16) & 1)) >> 16) as u16)
}

/// bf16 to f32 (exact: the bf16 bits are the high half of the f32).
pub fn bf16_to_fp32(h: bf16) -> f32 {
    f32::from_bits(u32::from(h.to_bits()) << 16)
}

/// Copies `x` into `y`. Precondition: `y.len() == x.len()` (extra elements are left alone).
pub fn dequantize_row_f32(x: &[f32], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = v;
    }
}

/// Copies `x` into `y`. Precondition: `y.len() == x.len()`.
pub fn quantize_row_f32(x: &[f32], y: &mut [f32]) {
    dequantize_row_f32(x, y);
}

/// `y[i] = x[i]` widened to f32. Precondition: `y.len() == x.len()`.
pub fn dequantize_row_f16(x: &[f16], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = fp16_to_fp32(v);
    }
}

/// `y[i] = fp32_to_fp16(x[i])` (ggml's `ggml_fp32_to_fp16_row`). Precondition: `y.len() == x.len()`.
pub fn quantize_row_f16(x: &[f32], y: &mut [f16]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = fp32_to_fp16(v);
    }
}

/// `y[i] = x[i]` widened to f32. Precondition: `y.len() == x.len()`.
pub fn dequantize_row_bf16(x: &[bf16], y: &mut [f32]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = bf16_to_fp32(v);
    }
}

/// `y[i] = fp32_to_bf16(x[i])` (ggml's `ggml_fp32_to_bf16_row_ref`). Precondition: `y.len() == x.len()`.
pub fn quantize_row_bf16(x: &[f32], y: &mut [bf16]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = fp32_to_bf16(v);
    }
}

/// Dot product of two f32 rows as ggml's scalar `ggml_vec_dot_f32`: each
/// product rounded to f32, the sum kept in f64, the result rounded to f32.
/// Precondition: equal lengths (the shorter one bounds the sum).
pub fn vec_dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let sum: f64 = x.iter().zip(y).map(|(&a, &b)| f64::from(a * b)).sum();
    sum as f32
}

/// Dot product of two f16 rows as ggml's `ggml_vec_dot_f16` (f16 activations):
/// products in f32 (exact: 11-bit by 11-bit mantissas), sum in f64.
pub fn vec_dot_f16(x: &[f16], y: &[f16]) -> f32 {
    let sum: f64 = x
        .iter()
        .zip(y)
        .map(|(&a, &b)| f64::from(fp16_to_fp32(a) * fp16_to_fp32(b)))
        .sum();
    sum as f32
}

/// Dot product of two bf16 rows as ggml's `ggml_vec_dot_bf16` (bf16 activations):
/// products in f32 (exact), sum in f64.
pub fn vec_dot_bf16(x: &[bf16], y: &[bf16]) -> f32 {
    let sum: f64 = x
        .iter()
        .zip(y)
        .map(|(&a, &b)| f64::from(bf16_to_fp32(a) * bf16_to_fp32(b)))
        .sum();
    sum as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quant::reference::testutil::Rng;

    #[test]
    fn fp16_matches_half_on_every_non_nan() {
        // Every f16 neighbourhood: the exact values, the midpoints (ties) and
        // one ulp of f32 on each side of the midpoints.
        for h in 0..=u16::MAX {
            let v = f16::from_bits(h).to_f32();
            if v.is_nan() {
                continue;
            }
            let next = f16::from_bits(h.wrapping_add(1)).to_f32();
            let mut probes = vec![v];
            if next.is_finite() && (next > v) == (v >= 0.0) {
                let mid = ((f64::from(v) + f64::from(next)) / 2.0) as f32;
                probes.extend([
                    mid,
                    f32::from_bits(mid.to_bits() + 1),
                    f32::from_bits(mid.to_bits() - 1),
                ]);
            }
            for p in probes {
                assert_eq!(
                    fp32_to_fp16(p).to_bits(),
                    f16::from_f32(p).to_bits(),
                    "{p:e} ({:#x})",
                    p.to_bits()
                );
            }
        }
        let seed = 7;
        let mut rng = Rng::new(seed);
        for _ in 0..1_000_000 {
            let p = f32::from_bits(rng.next_u32());
            if !p.is_nan() {
                assert_eq!(
                    fp32_to_fp16(p).to_bits(),
                    f16::from_f32(p).to_bits(),
                    "seed {seed}: {p:e}"
                );
            }
        }
    }

    #[test]
    fn fp16_nan_and_overflow_as_ggml() {
        assert_eq!(fp32_to_fp16(f32::NAN).to_bits(), 0x7E00);
        assert_eq!(fp32_to_fp16(f32::from_bits(0xFF80_0001)).to_bits(), 0xFE00);
        assert_eq!(fp32_to_fp16(65520.0).to_bits(), 0x7C00); // ties to even: rounds up to inf
        assert_eq!(fp32_to_fp16(65519.0).to_bits(), 0x7BFF);
        assert_eq!(fp32_to_fp16(-1e9).to_bits(), 0xFC00);
        assert_eq!(fp32_to_fp16(-0.0).to_bits(), 0x8000);
        assert_eq!(fp32_to_fp16(f32::from_bits(1)).to_bits(), 0); // far below the smallest subnormal
    }

    #[test]
    fn bf16_rounds_to_nearest_even_and_quiets_nan() {
        let cases: [(u32, u16); 8] = [
            (0x3F80_0000, 0x3F80),
            (0x3F80_8000, 0x3F80), // tie, even stays
            (0x3F81_8000, 0x3F82), // tie, odd rounds up
            (0x3F80_8001, 0x3F81),
            (0x7F7F_FFFF, 0x7F80), // largest finite rounds to inf
            (0xFF80_0000, 0xFF80),
            (0x7F80_0001, 0x7FC0), // signalling NaN made quiet
            (0xFFC1_2345, 0xFFC1),
        ];
        for (f, b) in cases {
            assert_eq!(fp32_to_bf16(f32::from_bits(f)).to_bits(), b, "{f:#x}");
        }
        let seed = 11;
        let mut rng = Rng::new(seed);
        for _ in 0..1_000_000 {
            let p = f32::from_bits(rng.next_u32());
            if !p.is_nan() {
                assert_eq!(
                    fp32_to_bf16(p).to_bits(),
                    bf16::from_f32(p).to_bits(),
                    "seed {seed}: {p:e}"
                );
                assert_eq!(bf16_to_fp32(fp32_to_bf16(p)), bf16::from_f32(p).to_f32());
            }
        }
    }

    #[test]
    fn float_dots_match_f64_sums() {
        let seed = 3;
        let mut rng = Rng::new(seed);
        let n = 1000;
        let a: Vec<f32> = (0..n).map(|_| rng.normal() * 3.0).collect();
        let b: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
        let (mut ah, mut bh) = (vec![f16::ZERO; n], vec![f16::ZERO; n]);
        quantize_row_f16(&a, &mut ah);
        quantize_row_f16(&b, &mut bh);
        let (mut af, mut bf) = (vec![0.0; n], vec![0.0; n]);
        dequantize_row_f16(&ah, &mut af);
        dequantize_row_f16(&bh, &mut bf);
        // f16 values multiply exactly in f64, so the f64 sum is the exact reference.
        let exact: f64 = af
            .iter()
            .zip(&bf)
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum();
        assert_eq!(vec_dot_f16(&ah, &bh), exact as f32, "seed {seed}");

        let (mut ab, mut bb) = (vec![bf16::ZERO; n], vec![bf16::ZERO; n]);
        quantize_row_bf16(&a, &mut ab);
        quantize_row_bf16(&b, &mut bb);
        dequantize_row_bf16(&ab, &mut af);
        dequantize_row_bf16(&bb, &mut bf);
        let exact: f64 = af
            .iter()
            .zip(&bf)
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum();
        assert_eq!(vec_dot_bf16(&ab, &bb), exact as f32, "seed {seed}");

        let exact: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| f64::from(x) * f64::from(y))
            .sum();
        let scale: f64 = a
            .iter()
            .zip(&b)
            .map(|(&x, &y)| f64::from(x * y).abs())
            .sum();
        let got = f64::from(vec_dot_f32(&a, &b));
        assert!(
            (got - exact).abs() <= scale * 1e-7,
            "seed {seed}: {got} vs {exact}"
        );
        // Narrowing changes the values, so the f16 dot is not the f32 dot.
        assert_ne!(vec_dot_f16(&ah, &bh), vec_dot_f32(&a, &b));
    }
}
