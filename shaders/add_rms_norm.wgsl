// A residual add and the RMS norm of its result, in one dispatch (one
// workgroup per row): sum = a + b, out = rms_norm(sum) * w. The sum is
// written too (the residual stream goes on). a, b, sum, out: `[rows,
// width]` f32 (sum may be a or b, out may be sum); w: `[width]`.
// Each invocation reads back only the sums it wrote itself.

struct Params {
    rows: u32,
    width: u32,
    eps: f32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> sum: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

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
        let v = a[base + i] + b[base + i];
        sum[base + i] = v;
        s = s + v * v;
    }
    let total = wg_sum(s, lid);
    let scale = 1.0 / sqrt(total / f32(p.width) + p.eps);
    for (var i = lid; i < p.width; i = i + WG) {
        out[base + i] = (sum[base + i] * scale) * w[i];
    }
}
