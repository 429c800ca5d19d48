// Element-wise unary ops: MODE 0 `x * s`, 1 `s * tanh(x / s)` (softcap).
// x, out: `[n]` f32; out may be x.

struct Params {
    n: u32,
    s: f32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if i >= p.n {
        return;
    }
    if MODE == 0u {
        out[i] = x[i] * p.s;
    } else {
        out[i] = p.s * tanh(x[i] / p.s);
    }
}
