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
// (g = lid + i * WG), issues the loads of its first NQ groups (x, b, w)
// at once and keeps them in registers through the norm to the quantizer;
// it reads back only sums it wrote itself (rows wider than 8 * NQ * WG
// read their further groups twice).

@group(0) @binding(1) var<storage, read_write> a: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> b: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> w: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> sum: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(6) var<storage, read_write> xq: array<u32>;
@group(0) @binding(7) var<storage, read_write> xs: array<vec2<f32>>;

// Groups of 8 values per invocation held in registers.
const NQ: u32 = 4u;

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

fn sq(v: vec4<f32>) -> f32 {
    return dot(v, v);
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
    var xv: array<vec4<f32>, 8>;
    var wv: array<vec4<f32>, 8>;
    for (var i = 0u; i < NQ; i++) {
        let g = lid + i * WG;
        if g < groups {
            xv[2u * i] = load_input(base + 2u * g);
            xv[2u * i + 1u] = load_input(base + 2u * g + 1u);
            wv[2u * i] = w[2u * g];
            wv[2u * i + 1u] = w[2u * g + 1u];
        }
    }
    var s = 0.0;
    for (var i = 0u; i < NQ; i++) {
        let g = lid + i * WG;
        if g < groups {
            if p.add != 0u {
                sum[base + 2u * g] = xv[2u * i];
                sum[base + 2u * g + 1u] = xv[2u * i + 1u];
            }
            s += sq(xv[2u * i]) + sq(xv[2u * i + 1u]);
        }
    }
    for (var g = lid + NQ * WG; g < groups; g += WG) {
        let lo = load_input(base + 2u * g);
        let hi = load_input(base + 2u * g + 1u);
        if p.add != 0u {
            sum[base + 2u * g] = lo;
            sum[base + 2u * g + 1u] = hi;
        }
        s += sq(lo) + sq(hi);
    }
    let scale = rms_scale(s, lid);
    let first = row * groups;
    for (var i = 0u; i < NQ; i++) {
        // i * WG < groups is uniform: the whole workgroup takes part.
        if i * WG < groups {
            let g = lid + i * WG;
            let live = g < groups;
            let lo = (xv[2u * i] * scale) * wv[2u * i];
            let hi = (xv[2u * i + 1u] * scale) * wv[2u * i + 1u];
            if live {
                out[base + 2u * g] = lo;
                out[base + 2u * g + 1u] = hi;
            }
            quantize8(lo, hi, first + g, lid, live);
        }
    }
    for (var g0 = NQ * WG; g0 < groups; g0 += WG) {
        let g = g0 + lid;
        let live = g < groups;
        var lo = vec4<f32>(0.0);
        var hi = vec4<f32>(0.0);
        if live {
            lo = (reload_input(base + 2u * g) * scale) * w[2u * g];
            hi = (reload_input(base + 2u * g + 1u) * scale) * w[2u * g + 1u];
            out[base + 2u * g] = lo;
            out[base + 2u * g + 1u] = hi;
        }
        quantize8(lo, hi, first + g, lid, live);
    }
}
