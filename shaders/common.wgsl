// Helpers every kernel may use. The prelude before this file defines WG
// (workgroup size), HAS_F16, HAS_SUBGROUPS, SG_MIN and the kernel's own
// constants.

// Index of a workgroup of a 1-D problem dispatched as a 2-D grid (a
// dimension holds at most 65535 groups): x fastest.
fn group_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y * nwg.x + wid.x;
}

// Index of an invocation of a 1-D problem dispatched as a 2-D grid.
fn flat_index(wid: vec3<u32>, nwg: vec3<u32>, lid: u32) -> u32 {
    return group_index(wid, nwg) * WG + lid;
}

// `x` rounded to the nearest f16 and back (ggml's fp16 activations).
fn f16_round(x: f32) -> f32 {
    return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x;
}

// Element `i` of an array of f16 values packed two to a u32 (low half first).
fn packed_f16_at(word: u32, i: u32) -> f32 {
    let v = unpack2x16float(word);
    return select(v.x, v.y, (i & 1u) == 1u);
}
