// Matrix-vector product for decode with packed int8 dot products:
// y[t, first_row + r] = dot(W[r, :], x[t, :]) for the MV_TOKENS tokens t and
// MV_ROWS weight rows r of this workgroup. x comes quantized by
// matmul_quantize_x.wgsl: xq holds int8 quants (k / 4 words per token), xs
// per 8 values (scale d, d * sum of the 8 quants), d shared by each block
// of 32. With value_j = a * q_j + b:
//   sum_j value_j * x_j = d * (a * dot(q, xq) + b * sum(xq)).
// A team of TEAM = WG / MV_ROWS invocations owns a row; each invocation
// takes whole 32-value chunks (quant_q32: the chunk's quants and scales
// read once), neighbouring invocations neighbouring chunks, so a team
// reads its row front to back in one sweep.

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
    let chunks = p.k / 32u;
    let per_tok = p.k / 16u;
    var acc = vec4<f32>(0.0);
    if row < p.n {
        let base = row * p.row_words;
        for (var c = t; c < chunks; c += TEAM) {
            let v = quant_q32(base, p.nb, c);
            for (var j = 0u; j < MV_TOKENS; j++) {
                if tok0 + j < p.m {
                    let o = (tok0 + j) * per_tok + 2u * c;
                    let s0 = xs[o];
                    let s1 = xs[o + 1u];
                    let i0 = f32(dot16(v.q0, xq[o]));
                    let i1 = f32(dot16(v.q1, xq[o + 1u]));
                    let sums = vec2<f32>(s0.y + s0.w, s1.y + s1.w);
                    acc[j] += s0.x * (v.a.x * i0 + v.a.y * i1) + dot(v.b, sums);
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
