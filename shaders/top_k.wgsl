// The k best (index, value) pairs of each `width`-wide row, best first
// (value descending, then index ascending), as `graph::top_k_row` defines
// them: one workgroup per row. Each invocation keeps the k best of its
// strided share of the row in a sorted private list (values arrive in index
// order, so equal values keep index order); then k rounds each take the
// best list head across the workgroup. A row holding a NaN or an infinity
// (found by exponent bits: a compiler may fold `v != v`) yields k pairs
// (0xffffffff, NaN). x: `[rows, width]` f32; out: `[rows, k]` pairs of u32
// (index, f32 bits). k <= MAX_K and k <= width (the host checks).

const MAX_K: u32 = 64u;

struct Params {
    rows: u32,
    width: u32,
    k: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;

var<workgroup> head_v: array<f32, WG>;
var<workgroup> head_i: array<u32, WG>;
var<workgroup> head_t: array<u32, WG>;
var<workgroup> non_finite: atomic<u32>;

// Whether (av, ai) comes before (bv, bi); index 0xffffffff is an empty slot.
fn before(av: f32, ai: u32, bv: f32, bi: u32) -> bool {
    return ai != 0xffffffffu && (bi == 0xffffffffu || av > bv || (av == bv && ai < bi));
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let row = group_index(wid, nwg);
    if row >= p.rows {
        return;
    }
    let k = p.k;
    var lv: array<f32, MAX_K>;
    var li: array<u32, MAX_K>;
    var n = 0u;
    var bad = 0u;
    for (var i = lid; i < p.width; i = i + WG) {
        let v = x[row * p.width + i];
        if (bitcast<u32>(v) & 0x7f800000u) == 0x7f800000u {
            bad = 1u;
            continue;
        }
        if n == k && !(v > lv[k - 1u]) {
            continue;
        }
        // Insertion from the end of the sorted list (the last entry drops
        // out when the list is full).
        var j = select(n, k - 1u, n == k);
        n = min(n + 1u, k);
        loop {
            if j == 0u || !(v > lv[j - 1u]) {
                break;
            }
            lv[j] = lv[j - 1u];
            li[j] = li[j - 1u];
            j = j - 1u;
        }
        lv[j] = v;
        li[j] = i;
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
            head_i[lid] = 0xffffffffu;
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
            let o = (row * k + r) * 2u;
            if atomicLoad(&non_finite) != 0u {
                out[o] = 0xffffffffu;
                out[o + 1u] = 0x7fc00000u;
            } else {
                out[o] = head_i[0];
                out[o + 1u] = bitcast<u32>(head_v[0]);
            }
        }
        if lid == head_t[0] {
            h = h + 1u;
        }
        workgroupBarrier();
    }
}
