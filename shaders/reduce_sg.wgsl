// Workgroup reductions through subgroup operations, then one value per
// subgroup in workgroup memory. Same functions as reduce_wg.wgsl. Call
// from uniform control flow with every invocation of the workgroup.
// Subgroups of a 1-D workgroup are taken as consecutive invocations, as
// Vulkan, Metal and D3D lay them out.

var<workgroup> red_buf: array<f32, WG / SG_MIN>;

fn wg_sum(v: f32, lid: u32) -> f32 {
    let sgs = subgroupAdd(1u);
    let s = subgroupAdd(v);
    if lid % sgs == 0u {
        red_buf[lid / sgs] = s;
    }
    workgroupBarrier();
    var t = 0.0;
    for (var i = 0u; i < WG / sgs; i = i + 1u) {
        t = t + red_buf[i];
    }
    workgroupBarrier();
    return t;
}

fn wg_max(v: f32, lid: u32) -> f32 {
    let sgs = subgroupAdd(1u);
    let s = subgroupMax(v);
    if lid % sgs == 0u {
        red_buf[lid / sgs] = s;
    }
    workgroupBarrier();
    var t = red_buf[0];
    for (var i = 1u; i < WG / sgs; i = i + 1u) {
        t = max(t, red_buf[i]);
    }
    workgroupBarrier();
    return t;
}

// Max over the quad of invocations lid & ~3 .. lid | 3. Requires subgroups
// of at least 4 (checked on the host), laid out along the index.
fn quad_max(v: f32, lid: u32) -> f32 {
    let m = max(v, subgroupShuffleXor(v, 1u));
    return max(m, subgroupShuffleXor(m, 2u));
}
