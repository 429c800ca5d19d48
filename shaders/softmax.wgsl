// Softmax of each `width`-wide row: one workgroup per row.
// x, out: `[rows, width]` f32; out may be x. Composed after norm_row.wgsl.

@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if row >= p.rows {
        return;
    }
    let base = row * p.width;
    var m = -3.4028234663852886e38;
    for (var i = lid; i < p.width; i = i + WG) {
        m = max(m, x[base + i]);
    }
    m = wg_max(m, lid);
    var s = 0.0;
    for (var i = lid; i < p.width; i = i + WG) {
        s = s + exp(x[base + i] - m);
    }
    let inv = 1.0 / wg_sum(s, lid);
    for (var i = lid; i < p.width; i = i + WG) {
        out[base + i] = exp(x[base + i] - m) * inv;
    }
}
