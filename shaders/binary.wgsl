// Element-wise binary ops: MODE 0 `x + y`, 1 `x * y`, 2 `x + bias` per row
// (y is `[width]`). x, y, out: `[n]` f32; out may be x.

struct Params {
    n: u32,
    width: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if i >= p.n {
        return;
    }
    if MODE == 0u {
        out[i] = x[i] + y[i];
    } else if MODE == 1u {
        out[i] = x[i] * y[i];
    } else {
        out[i] = x[i] + y[i % p.width];
    }
}
