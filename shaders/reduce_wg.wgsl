// Workgroup reductions through workgroup memory (adapters without
// subgroups). Same functions as reduce_sg.wgsl. Call from uniform control
// flow with every invocation of the workgroup; WG is a power of two.

var<workgroup> red_buf: array<f32, WG>;

fn wg_sum(v: f32, lid: u32) -> f32 {
    red_buf[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if lid < s {
            red_buf[lid] = red_buf[lid] + red_buf[lid + s];
        }
        workgroupBarrier();
    }
    let r = red_buf[0];
    workgroupBarrier();
    return r;
}

fn wg_max(v: f32, lid: u32) -> f32 {
    red_buf[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if lid < s {
            red_buf[lid] = max(red_buf[lid], red_buf[lid + s]);
        }
        workgroupBarrier();
    }
    let r = red_buf[0];
    workgroupBarrier();
    return r;
}

// Max over the quad of invocations lid & ~3 .. lid | 3.
fn quad_max(v: f32, lid: u32) -> f32 {
    red_buf[lid] = v;
    workgroupBarrier();
    let q = lid & ~3u;
    let m = max(max(red_buf[q], red_buf[q + 1u]), max(red_buf[q + 2u], red_buf[q + 3u]));
    workgroupBarrier();
    return m;
}
