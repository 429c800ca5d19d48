// Team reduction for the matrix-vector kernels, without subgroups: a tree in
// workgroup memory. A team is TEAM consecutive invocations (one weight row).
// Call from uniform control flow; the sum is valid in the team's first lane.

var<workgroup> red: array<vec4<f32>, WG>;

fn reduce_team(v: vec4<f32>, lid: u32) -> vec4<f32> {
    red[lid] = v;
    workgroupBarrier();
    for (var s = TEAM / 2u; s > 0u; s >>= 1u) {
        if (lid % TEAM) < s {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    return red[lid];
}
