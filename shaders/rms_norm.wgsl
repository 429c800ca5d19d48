// RMS norm of each `width`-wide row (per head for QK norm): one workgroup
// per row. x, out: `[rows, width]` f32 (out may be x); w: `[width]`.
// Composed after norm_row.wgsl.
//
// A decode step normalises ONE row, so one workgroup does all the work:
// each invocation keeps four loads in flight per pass (a loop of single
// dependent loads waits out the memory latency once per element).

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
    let whole = p.width - p.width % (4u * WG);
    var s = vec4<f32>(0.0);
    for (var i = lid; i < whole; i = i + 4u * WG) {
        let v = vec4<f32>(x[base + i], x[base + i + WG], x[base + i + 2u * WG],
                          x[base + i + 3u * WG]);
        s = s + v * v;
    }
    for (var i = whole + lid; i < p.width; i = i + WG) {
        let v = x[base + i];
        s.x = s.x + v * v;
    }
    let scale = rms_scale((s.x + s.y) + (s.z + s.w), lid);
    for (var i = lid; i < whole; i = i + 4u * WG) {
        let v = vec4<f32>(x[base + i], x[base + i + WG], x[base + i + 2u * WG],
                          x[base + i + 3u * WG]);
        let g = vec4<f32>(w[i], w[i + WG], w[i + 2u * WG], w[i + 3u * WG]);
        let o = (v * scale) * g;
        out[base + i] = o.x;
        out[base + i + WG] = o.y;
        out[base + i + 2u * WG] = o.z;
        out[base + i + 3u * WG] = o.w;
    }
    for (var i = whole + lid; i < p.width; i = i + WG) {
        out[base + i] = (x[base + i] * scale) * w[i];
    }
}
