// RMS norm of each `width`-wide row, optionally of a residual add's sum,
// and the int8 quantization of the normed rows for the next matrix
// product (as matmul_quantize_x.wgsl), in one dispatch: one workgroup per
// row. With ADD (p.add != 0): sum = a + b is written (sum may be a or b);
// otherwise the norm reads a (sum is not touched). out = rms_norm(.) * w
// (the op's result) and xq / xs its quantization: xq `[rows, width / 4]`
// words of 4 int8, xs `[rows, width / 8]` of (d, d * sum of the 8 quants)
// per 32 values. width is a multiple of 32.

struct Params {
    rows: u32,
    width: u32,
    eps: f32,
    add: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> a: array<f32>;
@group(0) @binding(2) var<storage, read_write> b: array<f32>;
@group(0) @binding(3) var<storage, read_write> w: array<f32>;
@group(0) @binding(4) var<storage, read_write> sum: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;
@group(0) @binding(6) var<storage, read_write> xq: array<u32>;
@group(0) @binding(7) var<storage, read_write> xs: array<vec2<f32>>;

// The norm's input at `i`: the sum (written before the barrier) or a.
fn input(i: u32) -> f32 {
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
    var s = 0.0;
    for (var i = lid; i < p.width; i = i + WG) {
        var v = a[base + i];
        if p.add != 0u {
            v = v + b[base + i];
            sum[base + i] = v;
        }
        s = s + v * v;
    }
    // The blocks below read sums other invocations wrote.
    storageBarrier();
    let total = wg_sum(s, lid);
    let scale = 1.0 / sqrt(total / f32(p.width) + p.eps);
    let blocks = p.width / 32u;
    for (var blk = lid; blk < blocks; blk = blk + WG) {
        var v: array<vec4<f32>, 8>;
        var amax = 0.0;
        for (var j = 0u; j < 8u; j++) {
            let at = base + blk * 32u + 4u * j;
            let c = blk * 32u + 4u * j;
            var q = vec4<f32>(0.0);
            for (var t = 0u; t < 4u; t++) {
                let o = (input(at + t) * scale) * w[c + t];
                out[at + t] = o;
                q[t] = o;
            }
            v[j] = q;
            let m = abs(q);
            amax = max(amax, max(max(m.x, m.y), max(m.z, m.w)));
        }
        let d = amax / 127.0;
        let id = select(0.0, 1.0 / d, d > 0.0);
        let qo = row * (p.width / 4u) + blk * 8u;
        let so = row * (p.width / 8u) + blk * 4u;
        for (var j = 0u; j < 8u; j += 2u) {
            let q0 = vec4<i32>(round(v[j] * id));
            let q1 = vec4<i32>(round(v[j + 1u] * id));
            xq[qo + j] = pack4xI8(q0);
            xq[qo + j + 1u] = pack4xI8(q1);
            let t = q0 + q1;
            xs[so + j / 2u] = vec2<f32>(d, d * f32(t.x + t.y + t.z + t.w));
        }
    }
}
