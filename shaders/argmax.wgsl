// Argmax of each `width`-wide row (ties: the lowest index), in two passes
// so that a decode step's single 100K-wide row is read by many workgroups
// (one workgroup walking it alone waits out the memory latency thousands
// of times: 0.8 ms on an H200).
//
// MODE 0 (partials): workgroup g takes row g / slices, values
// [s * chunk, (s + 1) * chunk) of it (s = g % slices), and writes the pair
// (index, value bits) of its best to part[g] - index 0xffffffff for an
// empty slice, 0xfffffffe for a slice holding a NaN or an infinity (found
// by exponent bits: a compiler may fold `v != v`).
// MODE 1 (merge): workgroup r reduces row r's `slices` pairs into out[r]:
// the index, or 0xffffffff when a slice held a non-finite value, as the
// host reference (`graph::argmax_row`) does.
// x: `[rows, width]` f32; part: `[rows * slices]` (u32, u32); out: `[rows]` u32.

struct Params {
    rows: u32,
    width: u32,
    slices: u32,
    chunk: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> part: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

const EMPTY: u32 = 0xffffffffu;
const BAD: u32 = 0xfffffffeu;

var<workgroup> best_v: array<f32, WG>;
var<workgroup> best_i: array<u32, WG>;
var<workgroup> non_finite: atomic<u32>;

// Whether (ov, oi) beats (bv, bi); EMPTY indices never win.
fn beats(ov: f32, oi: u32, bv: f32, bi: u32) -> bool {
    return oi != EMPTY && (bi == EMPTY || ov > bv || (ov == bv && oi < bi));
}

// The workgroup's best of each invocation's (v, i); every invocation calls.
fn reduce(v: f32, i: u32, lid: u32) {
    best_v[lid] = v;
    best_i[lid] = i;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        if lid < s && beats(best_v[lid + s], best_i[lid + s], best_v[lid], best_i[lid]) {
            best_v[lid] = best_v[lid + s];
            best_i[lid] = best_i[lid + s];
        }
        workgroupBarrier();
    }
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    var bv = 0.0;
    var bi = EMPTY;
    var bad = 0u;
    if MODE == 0u {
        if g >= p.rows * p.slices {
            return;
        }
        let row = g / p.slices;
        let start = (g % p.slices) * p.chunk;
        let end = min(start + p.chunk, p.width);
        for (var i = start + lid; i < end; i = i + WG) {
            let v = x[row * p.width + i];
            if (bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u {
                bad = 1u;
            } else if bi == EMPTY || v > bv {
                bv = v;
                bi = i;
            }
        }
    } else {
        if g >= p.rows {
            return;
        }
        for (var s = lid; s < p.slices; s = s + WG) {
            let q = part[g * p.slices + s];
            let v = bitcast<f32>(q.y);
            if q.x == BAD {
                bad = 1u;
            } else if beats(v, q.x, bv, bi) {
                bv = v;
                bi = q.x;
            }
        }
    }
    if bad != 0u {
        atomicOr(&non_finite, 1u);
    }
    reduce(bv, bi, lid);
    if lid == 0u {
        let is_bad = atomicLoad(&non_finite) != 0u;
        if MODE == 0u {
            part[g] = vec2<u32>(select(best_i[0], BAD, is_bad), bitcast<u32>(best_v[0]));
        } else {
            out[g] = select(best_i[0], EMPTY, is_bad || best_i[0] == EMPTY);
        }
    }
}
