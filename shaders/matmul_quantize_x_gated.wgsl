// The gated activation and the activation quantizer of the down
// projection in one dispatch: x = act(gate) * up (MODE 0 SiLU, 1 GELU-tanh
// with its input and output rounded to f16, as gated.wgsl), written to
// `out` (the op's own result) and quantized as matmul_quantize_x.wgsl
// does (quantize_q8.wgsl, composed before this file): one invocation per
// 8 values, four per block of 32.
// gate, up, out: f32 [m, k] (x_off 0, x_stride k; out may be gate);
// xq: [m, k / 4] words of 4 int8; xs: [m, k / 8] of (d, d * sum of the 8
// quants). count = m * k / 8.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> gate: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> up: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> xq: array<u32>;
@group(0) @binding(5) var<storage, read_write> xs: array<vec2<f32>>;

fn gelu_tanh(x: f32) -> f32 {
    let c = 0.7978846;
    // tanh of a large argument is NaN on some drivers: clamp (tanh(10) = 1 in f32).
    let t = clamp(c * x * (1.0 + 0.044715 * x * x), -10.0, 10.0);
    return 0.5 * x * (1.0 + tanh(t));
}

fn act(g: f32, u: f32) -> f32 {
    if MODE == 0u {
        return g / (1.0 + exp(-g)) * u;
    } else if g <= -10.0 {
        return 0.0;
    } else if g >= 10.0 {
        return g * u;
    }
    return f16_round(gelu_tanh(f16_round(g))) * u;
}

fn act4(g: vec4<f32>, u: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(act(g.x, u.x), act(g.y, u.y), act(g.z, u.z), act(g.w, u.w));
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // No early return: the quad reduction wants every invocation. [m, k]
    // is contiguous, so group g is vec4s 2 g and 2 g + 1.
    let g = flat_index(wid, nwg, lid);
    let live = g < p.count;
    var lo = vec4<f32>(0.0);
    var hi = vec4<f32>(0.0);
    if live {
        let g0 = gate[2u * g];
        let g1 = gate[2u * g + 1u];
        let u0 = up[2u * g];
        let u1 = up[2u * g + 1u];
        lo = act4(g0, u0);
        hi = act4(g1, u1);
        out[2u * g] = lo;
        out[2u * g + 1u] = hi;
    }
    quantize8(lo, hi, g, lid, live);
}
