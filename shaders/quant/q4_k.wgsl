// Q4_K: 256 values per block in 8 sub-blocks of 32,
// value = d * sc * q - dmin * m, q a nibble, (sc, m) 6 bits each.
// Packed row: the GGUF blocks as they are, 36 words each: word 0 d | dmin,
// words 1..4 the packed scales and mins, words 4..36 the nibbles (value i in
// byte 32 * (i / 64) + i % 32, high nibble when i % 64 >= 32).

fn quant_q8(base: u32, nb: u32, g: u32) -> QW8 {
    let blk = base + (g >> 5u) * 36u;
    let e = (g & 31u) * 8u;
    let o = blk + 4u + (e >> 6u) * 8u + ((e & 31u) >> 2u);
    let sh = 4u * ((e & 63u) >> 5u);
    let q = vec2<u32>((w[o] >> sh) & 0x0f0f0f0fu, (w[o + 1u] >> sh) & 0x0f0f0f0fu);
    let sm = scale_min_k4(e >> 5u, w[blk + 1u], w[blk + 2u], w[blk + 3u]);
    let dm = unpack2x16float(w[blk]);
    return QW8(q, dm.x * f32(sm.x), -dm.y * f32(sm.y));
}

// Sub-block c % 8 of block c / 8: its 32 nibbles are the low (even
// sub-block) or high (odd) halves of 8 words; one scale and min.
fn quant_q32(base: u32, nb: u32, c: u32) -> QW32 {
    let blk = base + (c >> 3u) * 36u;
    let s = c & 7u;
    let o = blk + 4u + (s >> 1u) * 8u;
    let sh = vec4<u32>(4u * (s & 1u));
    let m = vec4<u32>(0x0f0f0f0fu);
    let hdr = w_vec4(blk);
    let sm = scale_min_k4(s, hdr.y, hdr.z, hdr.w);
    let dm = unpack2x16float(hdr.x);
    let a = dm.x * f32(sm.x);
    let b = -dm.y * f32(sm.y);
    return QW32((w_vec4(o) >> sh) & m, (w_vec4(o + 4u) >> sh) & m, vec2<f32>(a), vec2<f32>(b));
}
