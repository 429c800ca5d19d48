// Matrix-vector product for decode with packed int8 dot products:
// y[t, first_row + r] = dot(W[r, :], x[t, :]) for the MV_TOKENS tokens t and
// MV_ROWS weight rows r of this workgroup. x comes quantized by
// matmul_quantize_x.wgsl: xq holds int8 quants (k / 4 words per token), xs
// per 8 values (scale d, d * sum of the 8 quants), d shared by each block
// of 32. With value_j = a * q_j + b:
//   sum_j value_j * x_j = d * (a * dot(q, xq) + b * sum(xq)).
// A team of TEAM = WG / MV_ROWS invocations owns a row, read in items of
// 32 weights (quant_item: an item file after the format file);
// neighbouring invocations take neighbouring items, so a team sweeps its
// row front to back, and each invocation loads four items before it uses
// any (the loads in flight are what hides the memory latency).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// Two (d, d * sum) pairs per element: xs[i] covers values 16 i .. 16 i + 15.
@group(0) @binding(4) var<storage, read> xs: array<vec4<f32>>;

const TEAM: u32 = WG / MV_ROWS;

// Dot product of 16 int8 weights with 16 int8 activations.
fn dot16(q: vec4<u32>, x: vec4<u32>) -> i32 {
    return dot4I8Packed(q.x, x.x) + dot4I8Packed(q.y, x.y)
        + dot4I8Packed(q.z, x.z) + dot4I8Packed(q.w, x.w);
}

// One item against the activations of the token at 16-value position
// `o` of xq / xs.
fn item_dot(v: QItem, o: u32) -> f32 {
    let s0 = xs[o + v.at.x];
    let s1 = xs[o + v.at.y];
    let i0 = f32(dot16(v.q0, xq[o + v.at.x]));
    let i1 = f32(dot16(v.q1, xq[o + v.at.y]));
    return v.a.x * s0.x * i0 + v.a.y * s1.x * i1
        + v.b.x * (s0.y + s0.w) + v.b.y * (s1.y + s1.w);
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // The grid is 1-D over (row group, token group), row groups fastest;
    // groups past the end (a 2-D grid rounds up) do nothing but the reduction.
    let gi = group_index(wid, nwg);
    let row = (gi % p.groups) * MV_ROWS + lid / TEAM;
    let t = lid % TEAM;
    let tok0 = (gi / p.groups) * MV_TOKENS;
    let items = p.k / 32u;
    let per_tok = p.k / 16u;
    var acc = vec4<f32>(0.0);
    if row < p.n {
        let base = row * p.row_words;
        var c = t;
        // Four items loaded before any is used (straight-line code, no
        // local array a compiler might leave in memory), then the rest.
        for (; c + 3u * TEAM < items; c += 4u * TEAM) {
            let v0 = quant_item(base, p.nb, c);
            let v1 = quant_item(base, p.nb, c + TEAM);
            let v2 = quant_item(base, p.nb, c + 2u * TEAM);
            let v3 = quant_item(base, p.nb, c + 3u * TEAM);
            for (var j = 0u; j < MV_TOKENS; j++) {
                if tok0 + j < p.m {
                    let o = (tok0 + j) * per_tok;
                    acc[j] += (item_dot(v0, o) + item_dot(v1, o))
                        + (item_dot(v2, o) + item_dot(v3, o));
                }
            }
        }
        for (; c < items; c += TEAM) {
            let v = quant_item(base, p.nb, c);
            for (var j = 0u; j < MV_TOKENS; j++) {
                if tok0 + j < p.m {
                    acc[j] += item_dot(v, (tok0 + j) * per_tok);
                }
            }
        }
    }
    let s = reduce_team(acc, lid);
    if t == 0u && row < p.n {
        for (var j = 0u; j < MV_TOKENS; j++) {
            if tok0 + j < p.m {
                y[p.y_off + (tok0 + j) * p.y_stride + p.first_row + row] = s[j];
            }
        }
    }
}
