// Team reduction for the matrix-vector kernels with subgroups: subgroupAdd,
// then one partial per subgroup through workgroup memory. Requires subgroups
// of at least SG_MIN invocations that do not straddle teams (the subgroup size
// divides TEAM; checked on the host) laid out along local_invocation_index.
// Call from uniform control flow; the sum is valid in the team's first lane.

var<workgroup> red: array<vec4<f32>, WG / SG_MIN>;

fn reduce_team(v: vec4<f32>, lid: u32) -> vec4<f32> {
    let sg = subgroupAdd(1u);
    let total = subgroupAdd(v);
    if lid % sg == 0u {
        red[lid / sg] = total;
    }
    workgroupBarrier();
    let per = TEAM / sg;
    let first = (lid / TEAM) * per;
    var s = vec4<f32>(0.0);
    for (var i = 0u; i < per; i++) {
        s += red[first + i];
    }
    return s;
}
