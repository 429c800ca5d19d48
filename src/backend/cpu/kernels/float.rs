//! Scalar kernels of the float formats: F32, F16 and BF16 dots, and the
//! conversions of activations to fp16 / bf16 (ggml's `vec_dot_type` of F16
//! and BF16 weights).

use half::{bf16, f16};

/// Dot of two f32 rows, in eight lanes (the order a SIMD kernel keeps).
pub fn vec_dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 8];
    let (xc, yc) = (x.chunks_exact(8), y.chunks_exact(8));
    let (xr, yr) = (xc.remainder(), yc.remainder());
    for (a, b) in xc.zip(yc) {
        for l in 0..8 {
            lanes[l] += a[l] * b[l];
        }
    }
    let tail: f32 = xr.iter().zip(yr).map(|(a, b)| a * b).sum();
    lanes.iter().sum::<f32>() + tail
}

/// Dot of two fp16 rows (products exact in f32, summed in eight lanes).
pub fn vec_dot_f16(x: &[f16], y: &[f16]) -> f32 {
    let mut lanes = [0.0f32; 8];
    for (a, b) in x.chunks(8).zip(y.chunks(8)) {
        for (l, (p, q)) in a.iter().zip(b).enumerate() {
            lanes[l] += super::fp16(*p) * super::fp16(*q);
        }
    }
    lanes.iter().sum()
}

/// Dot of two bf16 rows (products exact in f32, summed in eight lanes).
pub fn vec_dot_bf16(x: &[bf16], y: &[bf16]) -> f32 {
    let mut lanes = [0.0f32; 8];
    for (a, b) in x.chunks(8).zip(y.chunks(8)) {
        for (l, (p, q)) in a.iter().zip(b).enumerate() {
            lanes[l] += p.to_f32() * q.to_f32();
        }
    }
    lanes.iter().sum()
}

/// Rounds activations to fp16 (nearest even).
pub fn quantize_row_f16(x: &[f32], y: &mut [f16]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = f16::from_f32(v);
    }
}

/// Rounds activations to bf16 (nearest even, NaN kept quiet), as ggml's `GGML_FP32_TO_BF16`.
pub fn quantize_row_bf16(x: &[f32], y: &mut [bf16]) {
    for (o, &v) in y.iter_mut().zip(x) {
        *o = bf16::from_f32(v);
    }
}

/// Expands fp16 values to f32.
pub fn dequantize_row_f16(x: &[f16], y: &mut [f32]) {
    for (o, v) in y.iter_mut().zip(x) {
        *o = v.to_f32();
    }
}

/// Expands bf16 values to f32.
pub fn dequantize_row_bf16(x: &[bf16], y: &mut [f32]) {
    for (o, v) in y.iter_mut().zip(x) {
        *o = v.to_f32();
    }
}
