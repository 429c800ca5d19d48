// RMS norm of each `width`-wide row (per head for QK norm), optionally of
// a residual add's sum: one workgroup per row. With ADD (p.add != 0):
// sum = a + b is written (the residual stream goes on; sum may be a or
// b) and normed; otherwise the norm reads a (b and sum are not touched).
// out = rms_norm(.) * w. a, b, sum, out: `[rows, width]` f32 (out may be
// a, or sum); w: `[width]`. Composed after norm_row.wgsl.
//
// A decode step normalises ONE row, so one workgroup does all the work:
// each invocation keeps four loads in flight per pass (a loop of single
// dependent loads waits out the memory latency once per element), and
// reads back only sums it wrote itself.

@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> sum: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

// The norm's inputs at `o`: a + b (written to sum) or a.
fn load4(o: vec4<u32>) -> vec4<f32> {
    var v = vec4<f32>(a[o.x], a[o.y], a[o.z], a[o.w]);
    if p.add != 0u {
        v += vec4<f32>(b[o.x], b[o.y], b[o.z], b[o.w]);
        sum[o.x] = v.x;
        sum[o.y] = v.y;
        sum[o.z] = v.z;
        sum[o.w] = v.w;
    }
    return v;
}

// The norm's inputs at `o` again: the sums this invocation wrote, or a.
fn reload4(o: vec4<u32>) -> vec4<f32> {
    if p.add != 0u {
        return vec4<f32>(sum[o.x], sum[o.y], sum[o.z], sum[o.w]);
    }
    return vec4<f32>(a[o.x], a[o.y], a[o.z], a[o.w]);
}

// One input, as load4.
fn load1(i: u32) -> f32 {
    if p.add != 0u {
        let v = a[i] + b[i];
        sum[i] = v;
        return v;
    }
    return a[i];
}

// One input again, as reload4.
fn reload1(i: u32) -> f32 {
    if p.add != 0u {
        return sum[i];
    }
    return a[i];
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
    let strided = vec4<u32>(0u, WG, 2u * WG, 3u * WG);
    var s = vec4<f32>(0.0);
    for (var i = lid; i < whole; i = i + 4u * WG) {
        let v = load4(vec4<u32>(base + i) + strided);
        s = s + v * v;
    }
    for (var i = whole + lid; i < p.width; i = i + WG) {
        let v = load1(base + i);
        s.x = s.x + v * v;
    }
    let scale = rms_scale((s.x + s.y) + (s.z + s.w), lid);
    for (var i = lid; i < whole; i = i + 4u * WG) {
        let o = vec4<u32>(base + i) + strided;
        let c = vec4<u32>(i) + strided;
        let g = vec4<f32>(w[c.x], w[c.y], w[c.z], w[c.w]);
        let r = (reload4(o) * scale) * g;
        out[o.x] = r.x;
        out[o.y] = r.y;
        out[o.z] = r.z;
        out[o.w] = r.w;
    }
    for (var i = whole + lid; i < p.width; i = i + WG) {
        out[base + i] = (reload1(base + i) * scale) * w[i];
    }
}
