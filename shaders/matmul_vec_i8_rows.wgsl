// The int8 matrix-vector kernel of matmul_vec_i8.wgsl with MV_LR weight
// rows per team: y[t, first_row + r] = dot(W[r, :], x[t, :]) for the
// MV_TOKENS tokens t and MV_ROWS * MV_LR rows r of this workgroup, the
// activations quantized as there (xq int8 quants, xs (d, d * sum) pairs).
//
// Why several rows per team: a team reads, for each item of 32 weights, 64
// bytes of activations per token (32 of quants, 32 of scales) against 16 to
// 26 bytes of weights, so at one row per team the activations, not the
// weights, are most of the traffic through the load units (four times more
// at four tokens). Here each invocation loads the activations of an item
// once and dots them with the same item of its team's MV_LR consecutive
// rows, whose loads are issued together (MV_LR * MV_LU items in flight:
// MV_LU = 2 loads two items of each row at once).
//
// Rows past the part's end read its last row (and write nothing), so that
// every load stays in the binding without a branch around it.
//
// Up to three weights of one shape over the same activations (q, k and v;
// gate and up) run as one dispatch: rows 0..n1 are the first weight's (at
// word 0 of `w`, output y), n1..n2 the second's (word base1, y2), n2..n the
// third's (base2, y3), each output `[tokens, its rows]`. A lone weight has
// n1 = n2 = n, and y2, y3 bound to a spare buffer.

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> xq: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// Two (d, d * sum) pairs per element: xs[i] covers values 16 i .. 16 i + 15.
@group(0) @binding(4) var<storage, read> xs: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> y2: array<f32>;
@group(0) @binding(6) var<storage, read_write> y3: array<f32>;

// The first word of row `row` (of all the joined weights' rows).
fn row_base(row: u32) -> u32 {
    if row < p.n1 {
        return row * p.row_words;
    }
    if row < p.n2 {
        return p.base1 + (row - p.n1) * p.row_words;
    }
    return p.base2 + (row - p.n2) * p.row_words;
}

// Writes token `tok`'s dot with row `row` to its weight's output.
fn store(row: u32, tok: u32, v: f32) {
    if row < p.n1 {
        y[p.y_off + tok * p.y_stride + p.first_row + row] = v;
    } else if row < p.n2 {
        y2[tok * (p.n2 - p.n1) + row - p.n1] = v;
    } else {
        y3[tok * (p.n - p.n2) + row - p.n2] = v;
    }
}

const TEAM: u32 = WG / MV_ROWS;

// Dot product of 16 int8 weights with 16 int8 activations.
fn dot16(q: vec4<u32>, x: vec4<u32>) -> i32 {
    return dot4I8Packed(q.x, x.x) + dot4I8Packed(q.y, x.y)
        + dot4I8Packed(q.z, x.z) + dot4I8Packed(q.w, x.w);
}

// An item's activations for one token: the quants and scales of its two
// runs of 16 values.
struct XItem {
    q0: vec4<u32>,
    q1: vec4<u32>,
    s0: vec4<f32>,
    s1: vec4<f32>,
}

// The activations of item positions `at` for the token at 16-value
// position `o` of xq / xs.
fn x_item(at: vec2<u32>, o: u32) -> XItem {
    return XItem(xq[o + at.x], xq[o + at.y], xs[o + at.x], xs[o + at.y]);
}

fn item_dot(v: QItem, x: XItem) -> f32 {
    let i0 = f32(dot16(v.q0, x.q0));
    let i1 = f32(dot16(v.q1, x.q1));
    return v.a.x * x.s0.x * i0 + v.a.y * x.s1.x * i1
        + v.b.x * (x.s0.y + x.s0.w) + v.b.y * (x.s1.y + x.s1.w);
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
    let row0 = (gi % p.groups) * (MV_ROWS * MV_LR) + (lid / TEAM) * MV_LR;
    let t = lid % TEAM;
    let tok0 = (gi / p.groups) * MV_TOKENS;
    let items = p.k / 32u;
    let per_tok = p.k / 16u;
    var acc: array<vec4<f32>, MV_LR>;
    for (var r = 0u; r < MV_LR; r++) {
        acc[r] = vec4<f32>(0.0);
    }
    if row0 < p.n && gi / p.groups < (p.m + MV_TOKENS - 1u) / MV_TOKENS {
        var base: array<u32, MV_LR>;
        for (var r = 0u; r < MV_LR; r++) {
            base[r] = row_base(min(row0 + r, p.n - 1u));
        }
        var c = t;
        // With MV_LU = 2, two items of each row loaded before any is used.
        if MV_LU == 2u {
            for (; c + TEAM < items; c += 2u * TEAM) {
                var v: array<QItem, MV_LR>;
                var u: array<QItem, MV_LR>;
                for (var r = 0u; r < MV_LR; r++) {
                    v[r] = quant_item(base[r], p.nb, c);
                    u[r] = quant_item(base[r], p.nb, c + TEAM);
                }
                for (var j = 0u; j < MV_TOKENS; j++) {
                    if tok0 + j < p.m {
                        let o = (tok0 + j) * per_tok;
                        let xv = x_item(v[0].at, o);
                        let xu = x_item(u[0].at, o);
                        for (var r = 0u; r < MV_LR; r++) {
                            acc[r][j] += item_dot(v[r], xv) + item_dot(u[r], xu);
                        }
                    }
                }
            }
        }
        for (; c < items; c += TEAM) {
            var v: array<QItem, MV_LR>;
            for (var r = 0u; r < MV_LR; r++) {
                v[r] = quant_item(base[r], p.nb, c);
            }
            for (var j = 0u; j < MV_TOKENS; j++) {
                if tok0 + j < p.m {
                    let x = x_item(v[0].at, (tok0 + j) * per_tok);
                    for (var r = 0u; r < MV_LR; r++) {
                        acc[r][j] += item_dot(v[r], x);
                    }
                }
            }
        }
    }
    for (var r = 0u; r < MV_LR; r++) {
        let s = reduce_team(acc[r], lid);
        // reduce_team's workgroup memory is read by every team before the
        // next row's sums overwrite it.
        workgroupBarrier();
        let row = row0 + r;
        if t == 0u && row < p.n {
            for (var j = 0u; j < MV_TOKENS; j++) {
                if tok0 + j < p.m {
                    store(row, tok0 + j, s[j]);
                }
            }
        }
    }
}
