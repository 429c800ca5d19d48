// Expert matrix-vector product of a MoE layer, grouped by expert (ggml's
// mul_mat_id): the tokens routed to one expert share each pass over its rows.
// A workgroup owns MV_ROWS rows of one expert and walks that expert's
// entries (moe_route.wgsl, mode 0, listed them) MV_TOKENS at a time:
//   y[i, r] = dot(W[e * n + r, :], x[row(i), :])   for each entry i routed to e,
// where entry i = t * k_used + j is token t's j-th expert, and row(i) is the
// token t (p.n1 == 0: gate and up read the layer's input) or the entry i itself
// (p.n1 == 1: down reads the entry's gated activations).
// W: the stacked weights of every expert, [n_expert * n, k]; x: f32; y: f32
// [entries, n]. Params: k, n (rows per expert), m (entries), nb, row_words,
// x_stride, y_stride (n), groups (row groups per expert), count (k_used),
// n1 (x mode), n2 (experts).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> x: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// counts [n_expert], offsets [n_expert], cursors [n_expert], entries [m].
@group(0) @binding(4) var<storage, read> route: array<u32>;

const TEAM: u32 = WG / MV_ROWS;

var<workgroup> wg_count: u32;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let gi = group_index(wid, nwg);
    let e = gi / p.groups;
    let row = (gi % p.groups) * MV_ROWS + lid / TEAM;
    let t = lid % TEAM;
    if lid == 0u {
        wg_count = select(0u, route[e], e < p.n2);
    }
    let count = workgroupUniformLoad(&wg_count);
    let first = route[p.n2 + min(e, p.n2 - 1u)];
    let base = (e * p.n + row) * p.row_words;
    for (var c = 0u; c < count; c += MV_TOKENS) {
        // The previous chunk's reduction is read before this one's starts.
        workgroupBarrier();
        var xrow: array<u32, MV_TOKENS>;
        for (var j = 0u; j < MV_TOKENS; j++) {
            let i = route[3u * p.n2 + first + min(c + j, count - 1u)];
            xrow[j] = select(i / p.count, i, p.n1 == 1u);
        }
        var acc = vec4<f32>(0.0);
        if row < p.n {
            for (var g = t; g < p.k / 8u; g += TEAM) {
                let v = quant_w8(base, p.nb, g);
                for (var j = 0u; j < MV_TOKENS; j++) {
                    if c + j < count {
                        let xo = xrow[j] * p.x_stride / 4u + 2u * g;
                        acc[j] += dot(v.lo, x[xo]) + dot(v.hi, x[xo + 1u]);
                    }
                }
            }
        }
        let s = reduce_team(acc, lid);
        if t == 0u && row < p.n {
            for (var j = 0u; j < MV_TOKENS; j++) {
                if c + j < count {
                    let i = route[3u * p.n2 + first + c + j];
                    y[i * p.y_stride + row] = s[j];
                }
            }
        }
    }
}
