// Embedding lookup from a quantized table: y[t, :] = W[ids[t], :] as f32.
// W: one part of a packed weight holding rows first_row .. first_row + n;
// tokens whose id falls in another part are left to that part's dispatch.
// ids: u32 at x_off; y: f32 [count, k] at y_off / y_stride.
// One invocation per (token, 8 values).

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let groups = p.k / 8u;
    let i = flat_index(wid, nwg, lid);
    if i >= p.count * groups {
        return;
    }
    let t = i / groups;
    let g = i % groups;
    let id = ids[p.x_off + t];
    if id < p.first_row || id - p.first_row >= p.n {
        return;
    }
    let v = quant_w8((id - p.first_row) * p.row_words, p.nb, g);
    let o = p.y_off + t * p.y_stride + g * 8u;
    for (var j = 0u; j < 4u; j++) {
        y[o + j] = v.lo[j];
        y[o + 4u + j] = v.hi[j];
    }
}
