// Matrix-vector product for decode: y[t, first_row + r] = dot(W[r, :], x[t, :])
// for the MV_TOKENS tokens t of this workgroup and the MV_ROWS weight rows r of
// this workgroup.
// W: one part of a packed quantized weight, [n, k]; x: f32 [m, k]; y: f32 [m, *].
// A team of TEAM = WG / MV_ROWS invocations owns a row and strides it
// 8 values at a time, so neighbouring invocations read neighbouring words.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

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
    var acc = vec4<f32>(0.0);
    if row < p.n {
        let base = row * p.row_words;
        for (var g = t; g < p.k / 8u; g += TEAM) {
            let v = quant_w8(base, p.nb, g);
            for (var j = 0u; j < MV_TOKENS; j++) {
                if tok0 + j < p.m {
                    let xo = (p.x_off + (tok0 + j) * p.x_stride) / 4u + 2u * g;
                    acc[j] += dot(v.lo, x[xo]) + dot(v.hi, x[xo + 1u]);
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
