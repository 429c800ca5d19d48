// Combines the partials of split-context attention (attention.wgsl with
// splits > 1): for each (row, head) unit and output value,
// out = sum_s e^(m_s - M) acc_s / sum_s e^(m_s - M) l_s, M = max_s m_s.
// part: `[units * splits, 2 + hv]` (max, sum, values); out: `[units, hv]`
// (units = rows * n_head: the attention output). One invocation per value.

struct Params {
    units: u32,
    splits: u32,
    hv: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> part: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let i = flat_index(wid, nwg, lid);
    if i >= p.units * p.hv {
        return;
    }
    let u = i / p.hv;
    let dv = i % p.hv;
    let stride = p.hv + 2u;
    var mx = -3.4028234663852886e38;
    for (var s = 0u; s < p.splits; s = s + 1u) {
        mx = max(mx, part[(u * p.splits + s) * stride]);
    }
    var l = 0.0;
    var a = 0.0;
    for (var s = 0u; s < p.splits; s = s + 1u) {
        let b = (u * p.splits + s) * stride;
        let c = exp(part[b] - mx);
        l = l + part[b + 1u] * c;
        a = a + part[b + 2u + dv] * c;
    }
    out[i] = a / l;
}
