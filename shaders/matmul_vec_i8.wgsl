// Matrix-vector product for decode with packed int8 dot products: as
// matmul_vec.wgsl, but x comes quantized by matmul_quantize_x.wgsl: xq holds
// int8 quants (k / 4 words per token), xs per 8 values (scale d, d * sum of
// the 8 quants). With a weight group value_j = a * q_j + b:
//   sum_j value_j * x_j = d * (a * dot(q, xq) + b * sum(xq)).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> xq: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read> xs: array<vec2<f32>>;

const TEAM: u32 = WG / MV_ROWS;

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
    let groups = p.k / 8u;
    var acc = vec4<f32>(0.0);
    if row < p.n {
        let base = row * p.row_words;
        for (var g = t; g < groups; g += TEAM) {
            let v = quant_q8(base, p.nb, g);
            for (var j = 0u; j < MV_TOKENS; j++) {
                if tok0 + j < p.m {
                    let xo = (tok0 + j) * (p.k / 4u) + 2u * g;
                    let d = xs[(tok0 + j) * groups + g];
                    let iq = dot4I8Packed(v.q.x, xq[xo]) + dot4I8Packed(v.q.y, xq[xo + 1u]);
                    acc[j] += fma(d.x * v.a, f32(iq), v.b * d.y);
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
