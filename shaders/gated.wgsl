// Gated activations: MODE 0 `silu(gate) * up`, 1 `gelu_tanh(gate) * up`
// with the GELU input and output rounded to f16 as ggml's CPU table.
// gate, up, out: `[n]` f32; out may be gate.

struct Params {
    n: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> gate: array<f32>;
@group(0) @binding(2) var<storage, read_write> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

fn gelu_tanh(x: f32) -> f32 {
    let c = 0.7978846;
    // tanh of a large argument is NaN on some drivers: clamp (tanh(10) = 1 in f32).
    let t = clamp(c * x * (1.0 + 0.044715 * x * x), -10.0, 10.0);
    return 0.5 * x * (1.0 + tanh(t));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if i >= p.n {
        return;
    }
    let g = gate[i];
    let u = up[i];
    if MODE == 0u {
        out[i] = g / (1.0 + exp(-g)) * u;
    } else if g <= -10.0 {
        out[i] = 0.0;
    } else if g >= 10.0 {
        out[i] = g * u;
    } else {
        out[i] = f16_round(gelu_tanh(f16_round(g))) * u;
    }
}
