// The part the row kernels share (rms_norm, norm_quantize, softmax): one workgroup per `width`-wide row, these parameters at
// binding 0, and the RMS norm's scale. Composed before the kernel file.

struct Params {
    rows: u32,
    width: u32,
    // The norms' epsilon (softmax: unused).
    eps: f32,
    // norm_quantize: the norm is of a residual add's sum a + b (others: 0).
    add: u32,
}

@group(0) @binding(0) var<uniform> p: Params;

// 1 / rms of the row from each invocation's sum of squares over its share
// of the row. Call from uniform control flow with every invocation.
fn rms_scale(partial: f32, lid: u32) -> f32 {
    let total = wg_sum(partial, lid);
    return 1.0 / sqrt(total / f32(p.width) + p.eps);
}
