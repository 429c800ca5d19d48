//! Scalar kernels of the float formats: F32, F16 and BF16 dots, and the
//! conversions of activations to fp16 / bf16 (ggml's `vec_dot_type` of F16
//! and BF16 weights).

use half::{bf16, f16};

/// Lanes of the float dots: element `i` of a row's whole chunks of eight
/// adds into lane `i % 8`. Every ISA keeps these eight sums, so its dots
/// equal the scalar ones bit for bit; a tile gets its speed from
/// independent (row, token) pairs, not from more lanes per pair.
pub const LANES: usize = 8;

/// The lanes of `x` · `y` over their whole chunks of [`LANES`] (products
/// by `mul`), where the chunks end, and the rows' common length.
#[inline(always)]
fn chunk_lanes<T: Copy>(
    x: &[T],
    y: &[T],
    mul: impl Fn(T, T) -> f32,
) -> ([f32; LANES], usize, usize) {
    let n = x.len().min(y.len());
    let full = n / LANES * LANES;
    let mut lanes = [0.0f32; LANES];
    for (a, b) in x[..full]
        .chunks_exact(LANES)
        .zip(y[..full].chunks_exact(LANES))
    {
        for l in 0..LANES {
            lanes[l] += mul(a[l], b[l]);
        }
    }
    (lanes, full, n)
}

/// Dot of two f32 rows, in eight lanes (the order a SIMD kernel keeps).
pub fn vec_dot_f32(x: &[f32], y: &[f32]) -> f32 {
    let (lanes, full, n) = chunk_lanes(x, y, |a, b| a * b);
    f32_dot_end(lanes, &x[full..n], &y[full..n])
}

/// The end of [`vec_dot_f32`] after its whole chunks: the lanes summed in
/// order, plus the products of the last partial chunk (`x`, `y`) summed in order.
#[inline]
pub fn f32_dot_end(lanes: [f32; LANES], x: &[f32], y: &[f32]) -> f32 {
    let tail: f32 = x.iter().zip(y).map(|(a, b)| a * b).sum();
    lanes.iter().sum::<f32>() + tail
}

/// Dot of two fp16 rows (products exact in f32, summed in eight lanes).
pub fn vec_dot_f16(x: &[f16], y: &[f16]) -> f32 {
    let (lanes, full, n) = chunk_lanes(x, y, |a, b| super::fp16(a) * super::fp16(b));
    f16_dot_end(lanes, &x[full..n], &y[full..n])
}

/// The end of [`vec_dot_f16`] after its whole chunks: the last partial
/// chunk (`x`, `y`) adds into the first lanes, then the lanes are summed in order.
#[inline]
pub fn f16_dot_end(mut lanes: [f32; LANES], x: &[f16], y: &[f16]) -> f32 {
    for (l, (p, q)) in x.iter().zip(y).enumerate() {
        lanes[l] += super::fp16(*p) * super::fp16(*q);
    }
    lanes.iter().sum()
}

/// The end of the 16-bit dots ([`vec_dot_f16`], [`vec_dot_bf16`]) on rows
/// already widened to f32: the last partial chunk adds into the first
/// lanes, then the lanes are summed in order. Widening is exact, so this
/// equals [`f16_dot_end`] / [`bf16_dot_end`] on the 16-bit values.
#[inline]
pub fn widened_dot_end(mut lanes: [f32; LANES], x: &[f32], y: &[f32]) -> f32 {
    for (l, (p, q)) in x.iter().zip(y).enumerate() {
        lanes[l] += p * q;
    }
    lanes.iter().sum()
}

/// Dot of two bf16 rows (summed in eight lanes; a product is exact in f32
/// unless it overflows or falls below the normal range).
pub fn vec_dot_bf16(x: &[bf16], y: &[bf16]) -> f32 {
    let (lanes, full, n) = chunk_lanes(x, y, |a, b| a.to_f32() * b.to_f32());
    bf16_dot_end(lanes, &x[full..n], &y[full..n])
}

/// The end of [`vec_dot_bf16`], as [`f16_dot_end`].
#[inline]
pub fn bf16_dot_end(mut lanes: [f32; LANES], x: &[bf16], y: &[bf16]) -> f32 {
    for (l, (p, q)) in x.iter().zip(y).enumerate() {
        lanes[l] += p.to_f32() * q.to_f32();
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
