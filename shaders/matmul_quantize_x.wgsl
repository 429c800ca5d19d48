// Quantizes activations for matmul_vec_i8.wgsl (quantize_q8.wgsl, composed
// before this file): one invocation per 8 values, four per block of 32.
// x: f32 [m, k] at x_off / x_stride; xq: [m, k / 4] words of 4 int8;
// xs: [m, k / 8] of (d, d * sum of the 8 quants). count = m * k / 8.

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
    // No early return: the quad reduction wants every invocation.
    let g = flat_index(wid, nwg, lid);
    let live = g < p.count;
    let per_tok = p.k / 8u;
    let xo = (p.x_off + (g / per_tok) * p.x_stride) / 4u + 2u * (g % per_tok);
    var lo = vec4<f32>(0.0);
    var hi = vec4<f32>(0.0);
    if live {
        lo = x[xo];
        hi = x[xo + 1u];
    }
    quantize8(lo, hi, g, lid, live);
}
