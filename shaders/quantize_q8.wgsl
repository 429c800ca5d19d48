// The int8 activation quantizer the matrix-vector kernels read
// (matmul_vec_i8.wgsl), as ggml's q8_1: per block of 32 values
// d = max|x| / 127, q = round(x / d). Shared by matmul_quantize_x,
// matmul_quantize_x_gated and norm_quantize, which declare
//   xq: array<u32>          words of 4 int8, value i in byte i % 4 of word i / 4;
//   xs: array<vec2<f32>>    per 8 values (d, d * sum of the 8 quants).
// Four consecutive invocations quantize a block, 8 values each: one
// latency of loads, not 32 values walked by one invocation.

// Quantizes the 8 values `lo`, `hi` of group `g` (values 8 g .. 8 g + 7
// of xq's flat order); group g's block is shared with the invocations
// lid ^ 1, lid ^ 2 (g = 4 * block + lid % 4). Call from uniform control
// flow with every invocation of the workgroup (a quad reduction); only
// `live` invocations write, and a quad is live or not as a whole.
fn quantize8(lo: vec4<f32>, hi: vec4<f32>, g: u32, lid: u32, live: bool) {
    let m = max(abs(lo), abs(hi));
    let amax = quad_max(max(max(m.x, m.y), max(m.z, m.w)), lid);
    let d = amax / 127.0;
    let id = select(0.0, 1.0 / d, d > 0.0);
    let q0 = vec4<i32>(round(lo * id));
    let q1 = vec4<i32>(round(hi * id));
    if live {
        xq[2u * g] = pack4xI8(q0);
        xq[2u * g + 1u] = pack4xI8(q1);
        let s = q0 + q1;
        xs[g] = vec2<f32>(d, d * f32(s.x + s.y + s.z + s.w));
    }
}
