// The k best (index, value) pairs of each `width`-wide row, best first
// (value descending, then index ascending), as `graph::top_k_row` defines
// them, in two passes so that a vocabulary-wide row is read by many
// workgroups (one workgroup walking a 128K row alone waits out the memory
// latency thousands of times).
//
// Each invocation keeps the k best of its strided share in a sorted private
// list; then k rounds each take the best list head across the workgroup.
// MODE 0 (partials): workgroup g takes row g / slices, values
// [s * chunk, (s + 1) * chunk) of it (s = g % slices), and writes its k best
// as (index, value bits) to part[g * k ..]: index 0xffffffff for an empty
// place, 0xfffffffe when the slice holds a NaN or an infinity (found by
// exponent bits: a compiler may fold `v != v`).
// MODE 1 (merge): workgroup r takes row r's slices * k pairs and writes its
// k best to out; a row with a non-finite value yields k pairs (0xffffffff,
// NaN). x: `[rows, width]` f32; part: `[rows * slices * k]` (u32, u32);
// out: `[rows, k]` (u32, u32). k <= MAX_K and k <= width (the host checks).

const MAX_K: u32 = 64u;
const EMPTY: u32 = 0xffffffffu;
const BAD: u32 = 0xfffffffeu;

struct Params {
    rows: u32,
    width: u32,
    k: u32,
    slices: u32,
    chunk: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> part: array<vec2<u32>>;
@group(0) @binding(3) var<storage, read_write> out: array<u32>;

var<workgroup> head_v: array<f32, WG>;
var<workgroup> head_i: array<u32, WG>;
var<workgroup> head_t: array<u32, WG>;
var<workgroup> non_finite: atomic<u32>;

// Whether (av, ai) comes before (bv, bi); EMPTY is an empty slot.
fn before(av: f32, ai: u32, bv: f32, bi: u32) -> bool {
    return ai != EMPTY && (bi == EMPTY || av > bv || (av == bv && ai < bi));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    let k = p.k;
    var row = g;
    var lo = 0u;
    var hi = p.slices * k;
    if MODE == 0u {
        if g >= p.rows * p.slices {
            return;
        }
        row = g / p.slices;
        lo = (g % p.slices) * p.chunk;
        hi = min(lo + p.chunk, p.width);
    } else if g >= p.rows {
        return;
    }
    var lv: array<f32, MAX_K>;
    var li: array<u32, MAX_K>;
    var n = 0u;
    var bad = 0u;
    for (var i = lo + lid; i < hi; i = i + WG) {
        var v = 0.0;
        var id = i;
        if MODE == 0u {
            v = x[row * p.width + i];
            if (bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u {
                bad = 1u;
                continue;
            }
        } else {
            let q = part[row * p.slices * k + i];
            if q.x == BAD {
                bad = 1u;
                continue;
            }
            if q.x == EMPTY {
                continue;
            }
            v = bitcast<f32>(q.y);
            id = q.x;
        }
        if n == k && !before(v, id, lv[k - 1u], li[k - 1u]) {
            continue;
        }
        // Insertion from the end of the sorted list (the last entry drops
        // out when the list is full).
        var j = select(n, k - 1u, n == k);
        n = min(n + 1u, k);
        loop {
            if j == 0u || !before(v, id, lv[j - 1u], li[j - 1u]) {
                break;
            }
            lv[j] = lv[j - 1u];
            li[j] = li[j - 1u];
            j = j - 1u;
        }
        lv[j] = v;
        li[j] = id;
    }
    if bad != 0u {
        atomicOr(&non_finite, 1u);
    }
    var h = 0u;
    for (var r = 0u; r < k; r = r + 1u) {
        if h < n {
            head_v[lid] = lv[h];
            head_i[lid] = li[h];
        } else {
            head_v[lid] = 0.0;
            head_i[lid] = EMPTY;
        }
        head_t[lid] = lid;
        workgroupBarrier();
        for (var s = WG / 2u; s > 0u; s = s / 2u) {
            if lid < s && before(head_v[lid + s], head_i[lid + s], head_v[lid], head_i[lid]) {
                head_v[lid] = head_v[lid + s];
                head_i[lid] = head_i[lid + s];
                head_t[lid] = head_t[lid + s];
            }
            workgroupBarrier();
        }
        if lid == 0u {
            let is_bad = atomicLoad(&non_finite) != 0u;
            if MODE == 0u {
                part[g * k + r] = vec2<u32>(select(head_i[0], BAD, is_bad), bitcast<u32>(head_v[0]));
            } else {
                let o = (row * k + r) * 2u;
                out[o] = select(head_i[0], EMPTY, is_bad);
                out[o + 1u] = select(bitcast<u32>(head_v[0]), 0x7fc00000u, is_bad);
            }
        }
        if lid == head_t[0] {
            h = h + 1u;
        }
        workgroupBarrier();
    }
}
