// Quantizes activations for matmul_vec_i8.wgsl, as ggml's q8_1: per block of
// 32 values d = max|x| / 127, q = round(x / d). One invocation per block.
// x: f32 [m, k] at x_off / x_stride; xq: [m, k / 4] words of 4 int8;
// xs: [m, k / 8] of (d, d * sum of the 8 quants). count = m * k / 32.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> xq: array<u32>;
@group(0) @binding(3) var<storage, read_write> xs: array<vec2<f32>>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = flat_index(wid, nwg, lid);
    if i >= p.count {
        return;
    }
    let per_tok = p.k / 32u;
    let tok = i / per_tok;
    let blk = i % per_tok;
    let xo = (p.x_off + tok * p.x_stride) / 4u + blk * 8u;
    var v: array<vec4<f32>, 8>;
    var amax = 0.0;
    for (var j = 0u; j < 8u; j++) {
        v[j] = x[xo + j];
        let a = abs(v[j]);
        amax = max(amax, max(max(a.x, a.y), max(a.z, a.w)));
    }
    let d = amax / 127.0;
    let id = select(0.0, 1.0 / d, d > 0.0);
    let qo = tok * (p.k / 4u) + blk * 8u;
    let so = tok * (p.k / 8u) + blk * 4u;
    for (var j = 0u; j < 8u; j += 2u) {
        let q0 = vec4<i32>(round(v[j] * id));
        let q1 = vec4<i32>(round(v[j + 1u] * id));
        xq[qo + j] = pack4xI8(q0);
        xq[qo + j + 1u] = pack4xI8(q1);
        let s = q0 + q1;
        xs[so + j / 2u] = vec2<f32>(d, d * f32(s.x + s.y + s.z + s.w));
    }
}
