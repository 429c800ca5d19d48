// `y = x · Wᵀ` for F32 or F16 (F16_WEIGHT: two values per u32) weights:
// one workgroup per output column n and block of TB tokens, the k sum
// split across the workgroup. With ROUND_X the activations are rounded to
// f16 first (ggml's vec_dot_type of F16).
// x: `[tokens, k]` f32; w: `[n, k]`; y: `[tokens, n]` f32.

struct Params {
    tokens: u32,
    k: u32,
    n: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> w: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

fn weight_at(i: u32) -> f32 {
    if F16_WEIGHT {
        return packed_f16_at(w[i / 2u], i);
    }
    return bitcast<f32>(w[i]);
}

fn act_at(i: u32) -> f32 {
    if ROUND_X {
        return f16_round(x[i]);
    }
    return x[i];
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let blocks = (p.tokens + TB - 1u) / TB;
    if g >= p.n * blocks {
        return;
    }
    let col = g % p.n;
    let t0 = (g / p.n) * TB;
    var acc: array<f32, TB>;
    for (var j = 0u; j < TB; j = j + 1u) {
        acc[j] = 0.0;
    }
    for (var i = lid; i < p.k; i = i + WG) {
        let wv = weight_at(col * p.k + i);
        for (var j = 0u; j < TB; j = j + 1u) {
            if t0 + j < p.tokens {
                acc[j] = acc[j] + wv * act_at((t0 + j) * p.k + i);
            }
        }
    }
    for (var j = 0u; j < TB; j = j + 1u) {
        let s = wg_sum(acc[j], lid);
        if lid == 0u && t0 + j < p.tokens {
            y[(t0 + j) * p.n + col] = s;
        }
    }
}
