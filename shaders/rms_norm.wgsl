// RMS norm of each `width`-wide row (per head for QK norm): one workgroup
// per row. x, out: `[rows, width]` f32 (out may be x); w: `[width]`.

struct Params {
    rows: u32,
    width: u32,
    eps: f32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    // Uniform per workgroup, so the barriers below stay in uniform flow.
    if row >= p.rows {
        return;
    }
    let base = row * p.width;
    var s = 0.0;
    for (var i = lid; i < p.width; i = i + WG) {
        let v = x[base + i];
        s = s + v * v;
    }
    let total = wg_sum(s, lid);
    let scale = 1.0 / sqrt(total / f32(p.width) + p.eps);
    for (var i = lid; i < p.width; i = i + WG) {
        out[base + i] = (x[base + i] * scale) * w[i];
    }
}
