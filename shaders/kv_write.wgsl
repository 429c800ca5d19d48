// Writes the K and V rows of a step into their caches through flat slot
// indices, in one dispatch: invocations [0, tokens * k_per) write K, the
// rest V. F16 caches hold two values per u32 (pack2x16float: no
// shader-f16 needed), rows of an even width; one invocation per pair. F32
// caches: one per value.
// k_src: `[tokens, k_width]` f32; v_src: `[tokens, v_width]` f32;
// slots: `[tokens]` u32; k_cache: `[slots, k_width]`; v_cache: `[slots, v_width]`.

struct Params {
    tokens: u32,
    k_width: u32,
    v_width: u32,
    _pad0: u32,
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read_write> k_src: array<f32>;
@group(0) @binding(2) var<storage, read_write> v_src: array<f32>;
@group(0) @binding(3) var<storage, read_write> slots: array<u32>;
@group(0) @binding(4) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(5) var<storage, read_write> v_cache: array<u32>;

// Words per cache row of `width` values.
fn per_row(width: u32) -> u32 {
    if F16_CACHE {
        return width / 2u;
    }
    return width;
}

// The cache word of pair (or value) `j` of row `t`, from `src` values.
fn word_k(t: u32, j: u32) -> u32 {
    if F16_CACHE {
        let at = t * p.k_width + 2u * j;
        return pack2x16float(vec2<f32>(k_src[at], k_src[at + 1u]));
    }
    return bitcast<u32>(k_src[t * p.k_width + j]);
}

fn word_v(t: u32, j: u32) -> u32 {
    if F16_CACHE {
        let at = t * p.v_width + 2u * j;
        return pack2x16float(vec2<f32>(v_src[at], v_src[at + 1u]));
    }
    return bitcast<u32>(v_src[t * p.v_width + j]);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {
    let idx = flat_index(wid, nwg, lid);
    let k_per = per_row(p.k_width);
    let v_per = per_row(p.v_width);
    let k_words = p.tokens * k_per;
    if idx < k_words {
        let t = idx / k_per;
        let j = idx % k_per;
        k_cache[slots[t] * k_per + j] = word_k(t, j);
    } else if idx < k_words + p.tokens * v_per {
        let i = idx - k_words;
        let t = i / v_per;
        let j = i % v_per;
        v_cache[slots[t] * v_per + j] = word_v(t, j);
    }
}
