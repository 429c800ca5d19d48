// IQ4_XS: 256 values per block in 8 sub-blocks of 32,
// value = d * (scale - 32) * kvalues_iq4nl[q].
// Packed row: the GGUF blocks as they are, 34 words each: word 0 d (low
// half) | scales_h (high half), word 1 scales_l, words 2..34 the nibbles,
// 4 words per sub-block laid out as in Q4_0.

fn quant_q8(base: u32, nb: u32, g: u32) -> QW8 {
    let blk = base + (g >> 5u) * 34u;
    let j = g & 31u;
    let ib = j >> 2u;
    let jj = j & 3u;
    let o = blk + 2u + ib * 4u + (jj & 1u) * 2u;
    let sh = (jj >> 1u) * 4u;
    let q = vec2<u32>(iq4_levels((w[o] >> sh) & 0x0f0f0f0fu), iq4_levels((w[o + 1u] >> sh) & 0x0f0f0f0fu));
    let w0 = w[blk];
    let lo = (w[blk + 1u] >> (4u * ib)) & 0xfu;
    let hi = (w0 >> (16u + 2u * ib)) & 3u;
    let d = unpack2x16float(w0).x * f32(i32(lo | (hi << 4u)) - 32);
    return QW8(q, d, 0.0);
}
