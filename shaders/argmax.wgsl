// Argmax of each `width`-wide row (ties: the lowest index): one workgroup
// per row. A row holding a NaN or an infinity yields 0xffffffff, as the host
// reference (`graph::argmax_row`) does: the sampler refuses such rows.
// Non-finite values are found by their exponent bits, not by `v != v`,
// which a shader compiler may fold away. x: `[rows, width]` f32; out: `[rows]` u32.

struct Params {
    rows: u32,
    width: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> non_finite: atomic<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if row >= p.rows {
        return;
    }
    var bv = -3.4028234663852886e38;
    var bi = 0xffffffffu;
    var bad = 0u;
    for (var i = lid; i < p.width; i = i + WG) {
        let v = x[row * p.width + i];
        if (bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u {
            bad = 1u;
        } else if v > bv || bi == 0xffffffffu {
            bv = v;
            bi = i;
        }
    }
    if bad != 0u {
        atomicOr(&non_finite, 1u);
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if lid < s {
            let ov = best_v[lid + s];
            let oi = best_i[lid + s];
            let take = oi != 0xffffffffu && (best_i[lid] == 0xffffffffu || ov > best_v[lid]
                || (ov == best_v[lid] && oi < best_i[lid]));
            if take {
                best_v[lid] = ov;
                best_i[lid] = oi;
            }
        }
        workgroupBarrier();
    }
    if lid == 0u {
        // An empty row keeps 0xffffffff too.
        out[row] = select(best_i[0], 0xffffffffu, atomicLoad(&non_finite) != 0u);
    }
}
