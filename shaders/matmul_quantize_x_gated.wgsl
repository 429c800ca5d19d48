// The gated activation and the activation quantizer of the down
// projection in one dispatch: x = act(gate) * up (MODE 0 SiLU, 1 GELU-tanh
// with its input and output rounded to f16, as gated.wgsl), written to
// `out` (the op's own result) and quantized as matmul_quantize_x.wgsl
// does. One invocation per block of 32 values.
// gate, up, out: f32 [m, k] (x_off 0, x_stride k; out may be gate);
// xq: [m, k / 4] words of 4 int8; xs: [m, k / 8] of (d, d * sum of the 8
// quants). count = m * k / 32.

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
    let i = flat_index(wid, nwg, lid);
    if i >= p.count {
        return;
    }
    let per_tok = p.k / 32u;
    let tok = i / per_tok;
    let blk = i % per_tok;
    let xo = (tok * p.k) / 4u + blk * 8u;
    var v: array<vec4<f32>, 8>;
    var amax = 0.0;
    for (var j = 0u; j < 8u; j++) {
        v[j] = act4(gate[xo + j], up[xo + j]);
        out[xo + j] = v[j];
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
