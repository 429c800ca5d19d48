// Writes K or V rows into a cache through flat slot indices. F16 caches
// hold two values per u32 (pack2x16float: no shader-f16 needed), rows of an
// even width; one invocation per pair. F32 caches: one per value.
// src: `[tokens, width]` f32; slots: `[tokens]` u32; cache: `[slots, width]`.

struct Params {
    tokens: u32,
    width: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> src: array<f32>;
@group(0) @binding(2) var<storage, read_write> slots: array<u32>;
@group(0) @binding(3) var<storage, read_write> cache: array<u32>;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = flat_index(wid, nwg, lid);
    if F16_CACHE {
        let per_row = p.width / 2u;
        if idx >= p.tokens * per_row {
            return;
        }
        let t = idx / per_row;
        let j = idx % per_row;
        let v = vec2<f32>(src[t * p.width + 2u * j], src[t * p.width + 2u * j + 1u]);
        cache[slots[t] * per_row + j] = pack2x16float(v);
    } else {
        if idx >= p.tokens * p.width {
            return;
        }
        let t = idx / p.width;
        let j = idx % p.width;
        cache[slots[t] * p.width + j] = bitcast<u32>(src[idx]);
    }
}
