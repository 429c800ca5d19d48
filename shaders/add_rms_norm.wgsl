// A residual add and the RMS norm of its result, in one dispatch (one
// workgroup per row): sum = a + b, out = rms_norm(sum) * w. The sum is
// written too (the residual stream goes on). a, b, sum, out: `[rows,
// width]` f32 (sum may be a or b, out may be sum); w: `[width]`.
// Composed after norm_row.wgsl.
//
// Each invocation reads back only the sums it wrote itself, and keeps
// four loads in flight per pass (as rms_norm.wgsl).

@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> sum: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

// The four sums at `i + j * WG` (j < 4) from `base`, written.
fn add4(base: u32, i: u32) -> vec4<f32> {
    let o = vec4<u32>(base + i) + vec4<u32>(0u, WG, 2u * WG, 3u * WG);
    let v = vec4<f32>(a[o.x], a[o.y], a[o.z], a[o.w]) + vec4<f32>(b[o.x], b[o.y], b[o.z], b[o.w]);
    sum[o.x] = v.x;
    sum[o.y] = v.y;
    sum[o.z] = v.z;
    sum[o.w] = v.w;
    return v;
}

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
        let v = add4(base, i);
        s = s + v * v;
    }
    for (var i = whole + lid; i < p.width; i = i + WG) {
        let v = a[base + i] + b[base + i];
        sum[base + i] = v;
        s.x = s.x + v * v;
    }
    let scale = rms_scale((s.x + s.y) + (s.z + s.w), lid);
    for (var i = lid; i < whole; i = i + 4u * WG) {
        let v = vec4<f32>(sum[base + i], sum[base + i + WG], sum[base + i + 2u * WG],
                          sum[base + i + 3u * WG]);
        let g = vec4<f32>(w[i], w[i + WG], w[i + 2u * WG], w[i + 3u * WG]);
        let o = (v * scale) * g;
        out[base + i] = o.x;
        out[base + i + WG] = o.y;
        out[base + i + 2u * WG] = o.z;
        out[base + i + 3u * WG] = o.w;
    }
    for (var i = whole + lid; i < p.width; i = i + WG) {
        out[base + i] = (sum[base + i] * scale) * w[i];
    }
}
