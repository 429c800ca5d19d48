// Tiled matrix-matrix product for prefill: y[t, first_row + r] = dot(W[r, :], x[t, :]).
// A workgroup computes a TILE_M x TILE_N tile (tokens x rows) stepping k by
// 32: it dequantizes a TILE_N x 32 weight tile and loads a TILE_M x 32 x
// tile into workgroup memory (as tile_t: f16 where the adapter has it), then
// each invocation accumulates THREAD_M x THREAD_N outputs in f32, reading its
// THREAD_N weight rows and THREAD_M tokens 4 values of k at a time (vec4
// loads: THREAD_N + THREAD_M loads per 4 * THREAD_M * THREAD_N multiply-adds).
// An invocation's rows are COLS apart, not adjacent: neighbouring invocations
// then read neighbouring rows, which the padding puts in different banks
// (adjacent rows per invocation put a warp's reads 4 rows apart, 8 of them
// on the same banks).
// W: one part of a packed weight, [n, k]; x: f32 [m, k]; y: f32 [m, *].

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

const BK: u32 = 32u;
const COLS: u32 = TILE_N / THREAD_N; // invocations along a tile's rows
// Tiles are row-major in vec4s of k; a row takes BK / 4 of them plus one of
// padding, so that invocations reading neighbouring rows hit different banks.
const RS: u32 = BK / 4u + 1u;

var<workgroup> wt: array<vec4<tile_t>, TILE_N * RS>;
var<workgroup> xt: array<vec4<tile_t>, TILE_M * RS>;

fn load_tiles(n0: u32, m0: u32, k0: u32, lid: u32) {
    let groups = p.k / 8u;
    for (var i = lid; i < TILE_N * 4u; i += WG) {
        let r = i / 4u;
        let g = k0 / 8u + i % 4u;
        var v = W8(vec4<f32>(0.0), vec4<f32>(0.0));
        if n0 + r < p.n && g < groups {
            v = quant_w8((n0 + r) * p.row_words, p.nb, g);
        }
        let o = r * RS + (i % 4u) * 2u;
        wt[o] = vec4<tile_t>(v.lo);
        wt[o + 1u] = vec4<tile_t>(v.hi);
    }
    for (var i = lid; i < TILE_M * 8u; i += WG) {
        let r = i / 8u;
        let c4 = k0 / 4u + i % 8u;
        var v = vec4<f32>(0.0);
        if m0 + r < p.m && c4 < p.k / 4u {
            v = x[(p.x_off + (m0 + r) * p.x_stride) / 4u + c4];
        }
        xt[r * RS + i % 8u] = vec4<tile_t>(v);
    }
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // 1-D grid over (row tile, token tile), row tiles fastest.
    let gi = group_index(wid, nwg);
    let n0 = (gi % p.groups) * TILE_N;
    let m0 = (gi / p.groups) * TILE_M;
    if m0 >= p.m {
        return;
    }
    let tn = lid % COLS;
    let tm = (lid / COLS) * THREAD_M;
    var acc: array<array<f32, THREAD_N>, THREAD_M>;
    for (var k0 = 0u; k0 < p.k; k0 += BK) {
        load_tiles(n0, m0, k0, lid);
        workgroupBarrier();
        for (var kk = 0u; kk < BK / 4u; kk++) {
            var wv: array<vec4<f32>, THREAD_N>;
            for (var j = 0u; j < THREAD_N; j++) {
                wv[j] = vec4<f32>(wt[(tn + j * COLS) * RS + kk]);
            }
            for (var i = 0u; i < THREAD_M; i++) {
                let xv = vec4<f32>(xt[(tm + i) * RS + kk]);
                // A chain of fma into the accumulator: 4 instructions per
                // 4 products, where `+= dot` takes a multiply, 3 fma and an add.
                for (var j = 0u; j < THREAD_N; j++) {
                    let wj = wv[j];
                    acc[i][j] = fma(xv.w, wj.w, fma(xv.z, wj.z, fma(xv.y, wj.y, fma(xv.x, wj.x, acc[i][j]))));
                }
            }
        }
        workgroupBarrier();
    }
    for (var i = 0u; i < THREAD_M; i++) {
        let t = m0 + tm + i;
        for (var j = 0u; j < THREAD_N; j++) {
            let r = n0 + tn + j * COLS;
            if t < p.m && r < p.n {
                y[p.y_off + t * p.y_stride + p.first_row + r] = acc[i][j];
            }
        }
    }
}
