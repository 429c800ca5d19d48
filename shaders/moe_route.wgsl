// The two ends of a MoE layer's expert products (moe_matvec.wgsl between).
// MODE 0, one workgroup: lists the entries routed to each expert (entry
// i = t * k_used + j, token t's j-th expert ids[i]) into `route`:
//   counts [n_expert], offsets [n_expert], cursors [n_expert], entries [m],
// entries grouped by expert (in no set order within an expert: each entry's
// result is computed alone, so the order changes nothing). Ids at or past
// n_expert are left out: an expert computed elsewhere.
// MODE 1, one invocation per output value: out[t, c] = sum over j of
// weights[t, j] * d[t * k_used + j, c], over the entries that were listed.

struct Params {
    entries: u32,  // tokens * k_used
    n_expert: u32,
    k_used: u32,
    width: u32,    // n_embd (MODE 1)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ids: array<u32>;
@group(0) @binding(2) var<storage, read_write> route: array<atomic<u32>>;
@group(0) @binding(3) var<storage, read> weights: array<f32>;
@group(0) @binding(4) var<storage, read> d: array<f32>;
@group(0) @binding(5) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let ne = p.n_expert;
    if MODE == 0u {
        for (var e = lid; e < ne; e += WG) {
            atomicStore(&route[e], 0u);
            atomicStore(&route[2u * ne + e], 0u);
        }
        storageBarrier();
        workgroupBarrier();
        for (var i = lid; i < p.entries; i += WG) {
            let e = ids[i];
            if e < ne {
                atomicAdd(&route[e], 1u);
            }
        }
        storageBarrier();
        workgroupBarrier();
        if lid == 0u {
            var off = 0u;
            for (var e = 0u; e < ne; e++) {
                atomicStore(&route[ne + e], off);
                off += atomicLoad(&route[e]);
            }
        }
        storageBarrier();
        workgroupBarrier();
        for (var i = lid; i < p.entries; i += WG) {
            let e = ids[i];
            if e < ne {
                let at = atomicLoad(&route[ne + e]) + atomicAdd(&route[2u * ne + e], 1u);
                atomicStore(&route[3u * ne + at], i);
            }
        }
        return;
    }
    let o = flat_index(wid, nwg, lid);
    let tokens = p.entries / p.k_used;
    if o >= tokens * p.width {
        return;
    }
    let t = o / p.width;
    let c = o % p.width;
    var s = 0.0;
    for (var j = 0u; j < p.k_used; j++) {
        let i = t * p.k_used + j;
        if ids[i] < ne {
            s += weights[i] * d[i * p.width + c];
        }
    }
    out[o] = s;
}
