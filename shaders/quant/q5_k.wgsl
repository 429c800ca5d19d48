// Q5_K: Q4_K plus a fifth bit per value: value = d * sc * q - dmin * m.
// Packed row: the GGUF blocks as they are, 44 words each: word 0 d | dmin,
// words 1..4 scales and mins, words 4..12 qh (bit i / 32 of byte i % 32),
// words 12..44 the low nibbles laid out as in Q4_K.

fn quant_q8(base: u32, nb: u32, g: u32) -> QW8 {
    let blk = base + (g >> 5u) * 44u;
    let e = (g & 31u) * 8u;
    let o = blk + 12u + (e >> 6u) * 8u + ((e & 31u) >> 2u);
    let sh = 4u * ((e & 63u) >> 5u);
    let oh = blk + 4u + ((e & 31u) >> 2u);
    let hb = e >> 5u;
    let q = vec2<u32>(
        ((w[o] >> sh) & 0x0f0f0f0fu) | (byte_bits(w[oh], hb) << 4u),
        ((w[o + 1u] >> sh) & 0x0f0f0f0fu) | (byte_bits(w[oh + 1u], hb) << 4u),
    );
    let sm = scale_min_k4(e >> 5u, w[blk + 1u], w[blk + 2u], w[blk + 3u]);
    let dm = unpack2x16float(w[blk]);
    return QW8(q, dm.x * f32(sm.x), -dm.y * f32(sm.y));
}
