// RMS norm of each `width`-wide row, optionally of a residual add's sum,
// and the int8 quantization of the normed rows for the next matrix
// product (quantize_q8.wgsl), in one dispatch: one workgroup per row.
// With ADD (p.add != 0): sum = a + b is written (sum may be a or b);
// otherwise the norm reads a (sum is not touched). out = rms_norm(.) * w
// (the op's result) and xq / xs its quantization: xq `[rows, width / 4]`
// words of 4 int8, xs `[rows, width / 8]` of (d, d * sum of the 8 quants)
// per 32 values. width is a multiple of 32. Composed after norm_row.wgsl
// and quantize_q8.wgsl.
//
// A decode step normalises ONE row, so one workgroup does all of it and
// the step waits for its latency: each invocation owns groups of 8 values
// (g = lid + i * WG), issues the loads of its first four groups (x, b, w)
// at once and keeps them in registers through the norm to the quantizer;
// it reads back only sums it wrote itself (rows wider than 32 * WG read
// their further groups twice).

@group(0) @binding(1) var<storage, read_write> a: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> b: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> w: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> sum: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> xq: array<u32>;
@group(0) @binding(7) var<storage, read_write> xs: array<vec2<f32>>;

// One group of 8 values of the row: the norm's input and weights.
struct Group {
    x0: vec4<f32>,
    x1: vec4<f32>,
    w0: vec4<f32>,
    w1: vec4<f32>,
}

// The norm's input at vec4 `i`: the sum a + b (written), or a.
fn load_input(i: u32) -> vec4<f32> {
    if p.add != 0u {
        return a[i] + b[i];
    }
    return a[i];
}

// Reads the input at vec4 `i` again: the sum this invocation wrote, or a.
fn reload_input(i: u32) -> vec4<f32> {
    if p.add != 0u {
        return sum[i];
    }
    return a[i];
}

// Group g of the row from vec4 `base`: zeros past the row's end.
fn load_group(base: u32, g: u32, groups: u32) -> Group {
    var v = Group(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    if g < groups {
        v = Group(load_input(base + 2u * g), load_input(base + 2u * g + 1u), w[2u * g],
                  w[2u * g + 1u]);
    }
    return v;
}

// With ADD, writes the sum of group g (if in the row); returns its sum
// of squares (0 past the row's end).
fn store_sum(base: u32, g: u32, groups: u32, v: Group) -> f32 {
    if p.add != 0u && g < groups {
        sum[base + 2u * g] = v.x0;
        sum[base + 2u * g + 1u] = v.x1;
    }
    return dot(v.x0, v.x0) + dot(v.x1, v.x1);
}

// Writes the normed group g (if in the row) and its quantization. Call
// from uniform control flow (the quantizer's quad reduction).
fn emit(v: Group, scale: f32, base: u32, g: u32, groups: u32, first: u32, lid: u32) {
    let live = g < groups;
    let lo = (v.x0 * scale) * v.w0;
    let hi = (v.x1 * scale) * v.w1;
    if live {
        out[base + 2u * g] = lo;
        out[base + 2u * g + 1u] = hi;
    }
    quantize8(lo, hi, first + g, lid, live);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    // Uniform per workgroup, so the quad reductions stay in uniform flow.
    if row >= p.rows {
        return;
    }
    let groups = p.width / 8u;
    let base = row * (p.width / 4u);
    // Four groups in registers (straight-line code: no local array a
    // compiler might leave in memory), their loads all in flight.
    let v0 = load_group(base, lid, groups);
    let v1 = load_group(base, lid + WG, groups);
    let v2 = load_group(base, lid + 2u * WG, groups);
    let v3 = load_group(base, lid + 3u * WG, groups);
    var s = (store_sum(base, lid, groups, v0) + store_sum(base, lid + WG, groups, v1))
        + (store_sum(base, lid + 2u * WG, groups, v2) + store_sum(base, lid + 3u * WG, groups, v3));
    for (var g = lid + 4u * WG; g < groups; g += WG) {
        s += store_sum(base, g, groups, load_group(base, g, groups));
    }
    let scale = rms_scale(s, lid);
    let first = row * groups;
    // Each condition is uniform: the whole workgroup takes part.
    emit(v0, scale, base, lid, groups, first, lid);
    if WG < groups {
        emit(v1, scale, base, lid + WG, groups, first, lid);
    }
    if 2u * WG < groups {
        emit(v2, scale, base, lid + 2u * WG, groups, first, lid);
    }
    if 3u * WG < groups {
        emit(v3, scale, base, lid + 3u * WG, groups, first, lid);
    }
    for (var g0 = 4u * WG; g0 < groups; g0 += WG) {
        let g = g0 + lid;
        var v = Group(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
        if g < groups {
            v = Group(reload_input(base + 2u * g), reload_input(base + 2u * g + 1u), w[2u * g],
                      w[2u * g + 1u]);
        }
        emit(v, scale, base, g, groups, first, lid);
    }
}
