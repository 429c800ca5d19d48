// Paged causal attention, flash style: one workgroup per (query row, head)
// walks the keys of its sequence in tiles of WG, reading K/V through the
// block table, with a running max and sum (online softmax). GQA: head h
// reads K/V head h / (n_head / n_head_kv). Optional sliding window and
// score softcap.
// Split-context decode (flash decoding): with SPLITS > 1 the keys are cut
// into spans of `span` positions, one workgroup per (row, head, span), and
// each writes its partial (max, sum, unnormalised values) to `out` laid out
// as `[rows * n_head * splits, 2 + hv]`; attention_merge.wgsl combines them.
// q: `[rows, n_head * hk]` f32; k/v caches: `[slots, n_head_kv * hk|hv]`
// as u32 words (f32 bits, or two f16 when F16_CACHE); seqs: `[n_seq, 4]`
// (first row, tokens, start position, table offset); tables: u32 block ids;
// out: `[rows, n_head * hv]` f32. Each invocation owns VPT output values.

struct Params {
    rows: u32,
    n_head: u32,
    n_head_kv: u32,
    hk: u32,
    hv: u32,
    scale: f32,
    softcap: f32,
    window: u32,
    block_size: u32,
    n_seq: u32,
    splits: u32, // spans per (row, head); 1: no split, `out` is the output
    span: u32,   // positions per span (splits > 1)
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> q: array<f32>;
@group(0) @binding(2) var<storage, read_write> kc: array<u32>;
@group(0) @binding(3) var<storage, read_write> vc: array<u32>;
@group(0) @binding(4) var<storage, read_write> seqs: array<u32>;
@group(0) @binding(5) var<storage, read_write> tables: array<u32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;

var<workgroup> tile_w: array<f32, WG>;
var<workgroup> row_pos: u32;
var<workgroup> row_table: u32;
var<workgroup> tile_slot: array<u32, WG>;

fn cache_at(is_k: bool, i: u32) -> f32 {
    if F16_CACHE {
        if is_k {
            return packed_f16_at(kc[i / 2u], i);
        }
        return packed_f16_at(vc[i / 2u], i);
    }
    if is_k {
        return bitcast<f32>(kc[i]);
    }
    return bitcast<f32>(vc[i]);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let g = group_index(wid, nwg);
    if g >= p.rows * p.n_head * p.splits {
        return;
    }
    let sp = g % p.splits;
    let row = (g / p.splits) / p.n_head;
    let h = (g / p.splits) % p.n_head;
    let kvh = h / (p.n_head / p.n_head_kv);
    // The row's sequence: its position and block table, read by one
    // invocation and made workgroup-uniform (the key loop has barriers).
    if lid == 0u {
        row_pos = 0u;
        row_table = 0u;
        for (var s = 0u; s < p.n_seq; s = s + 1u) {
            let first = seqs[4u * s];
            if row >= first && row < first + seqs[4u * s + 1u] {
                row_pos = seqs[4u * s + 2u] + (row - first);
                row_table = seqs[4u * s + 3u];
            }
        }
    }
    let pos = workgroupUniformLoad(&row_pos);
    let table = workgroupUniformLoad(&row_table);
    var lo = 0u;
    if p.window > 0u && pos + 1u > p.window {
        lo = pos + 1u - p.window;
    }
    // This workgroup's keys: lo ..= last (none when the span starts past pos).
    var last = pos;
    if p.splits > 1u {
        lo = lo + sp * p.span;
        last = min(pos, lo + p.span - 1u);
    }
    let k_width = p.n_head_kv * p.hk;
    let v_width = p.n_head_kv * p.hv;
    let q_base = row * p.n_head * p.hk + h * p.hk;
    var m = -3.4028234663852886e38;
    var l = 0.0;
    var acc: array<f32, VPT>;
    for (var j = 0u; j < VPT; j = j + 1u) {
        acc[j] = 0.0;
    }
    for (var t0 = lo; t0 <= last; t0 = t0 + WG) {
        let t = t0 + lid;
        var score = -3.4028234663852886e38;
        var slot = 0u;
        if t <= last {
            slot = tables[table + t / p.block_size] * p.block_size + t % p.block_size;
            let kb = slot * k_width + kvh * p.hk;
            var d = 0.0;
            if F16_CACHE {
                // A word holds two values (kb and hk are even): one load each.
                for (var e = 0u; e < p.hk; e = e + 2u) {
                    let kv = unpack2x16float(kc[(kb + e) / 2u]);
                    d = d + q[q_base + e] * kv.x + q[q_base + e + 1u] * kv.y;
                }
            } else {
                for (var e = 0u; e < p.hk; e = e + 1u) {
                    d = d + q[q_base + e] * bitcast<f32>(kc[kb + e]);
                }
            }
            score = d * p.scale;
            if p.softcap > 0.0 {
                score = p.softcap * tanh(score / p.softcap);
            }
        }
        let m_new = max(m, wg_max(score, lid));
        let corr = exp(m - m_new);
        var e = 0.0;
        if t <= last {
            e = exp(score - m_new);
        }
        l = l * corr + wg_sum(e, lid);
        m = m_new;
        tile_w[lid] = e;
        tile_slot[lid] = slot;
        workgroupBarrier();
        let n = min(WG, last + 1u - t0);
        for (var j = 0u; j < VPT; j = j + 1u) {
            let dv = lid + j * WG;
            if dv < p.hv {
                var a = acc[j] * corr;
                for (var i = 0u; i < n; i = i + 1u) {
                    a = a + tile_w[i] * cache_at(false, tile_slot[i] * v_width + kvh * p.hv + dv);
                }
                acc[j] = a;
            }
        }
        workgroupBarrier();
    }
    if p.splits > 1u {
        let pb = g * (p.hv + 2u);
        if lid == 0u {
            out[pb] = m;
            out[pb + 1u] = l;
        }
        for (var j = 0u; j < VPT; j = j + 1u) {
            let dv = lid + j * WG;
            if dv < p.hv {
                out[pb + 2u + dv] = acc[j];
            }
        }
        return;
    }
    let o_base = row * p.n_head * p.hv + h * p.hv;
    for (var j = 0u; j < VPT; j = j + 1u) {
        let dv = lid + j * WG;
        if dv < p.hv {
            out[o_base + dv] = acc[j] / l;
        }
    }
}
