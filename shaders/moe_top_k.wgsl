// MoE router: softmax over the experts, the K largest (ties: lower id),
// weights renormalised over the chosen. One invocation per token.
// logits: `[tokens, n_expert]` f32; ids: `[tokens, K]` u32; weights: `[tokens, K]` f32.

struct Params {
    tokens: u32,
    n_expert: u32,
    k: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> logits: array<f32>;
@group(0) @binding(2) var<storage, read_write> ids: array<u32>;
@group(0) @binding(3) var<storage, read_write> weights: array<f32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let t = flat_index(wid, nwg, lid);
    if t >= p.tokens {
        return;
    }
    let base = t * p.n_expert;
    var m = -3.4028234663852886e38;
    for (var e = 0u; e < p.n_expert; e = e + 1u) {
        m = max(m, logits[base + e]);
    }
    var s = 0.0;
    for (var e = 0u; e < p.n_expert; e = e + 1u) {
        s = s + exp(logits[base + e] - m);
    }
    // Pick the K largest in order; `prev` / `prev_id` bound the next pick.
    var chosen = 0.0;
    var prev = 3.4028234663852886e38;
    var prev_id = 0xffffffffu;
    for (var j = 0u; j < p.k; j = j + 1u) {
        var best = -3.4028234663852886e38;
        var best_id = 0u;
        var found = false;
        for (var e = 0u; e < p.n_expert; e = e + 1u) {
            let v = exp(logits[base + e] - m) / s;
            let after_prev = v < prev || (v == prev && (prev_id == 0xffffffffu || e > prev_id));
            if after_prev && (!found || v > best) {
                best = v;
                best_id = e;
                found = true;
            }
        }
        ids[t * p.k + j] = best_id;
        weights[t * p.k + j] = best;
        chosen = chosen + best;
        prev = best;
        prev_id = best_id;
    }
    for (var j = 0u; j < p.k; j = j + 1u) {
        weights[t * p.k + j] = weights[t * p.k + j] / chosen;
    }
}
