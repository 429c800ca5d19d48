// Q5_1: 32 values per block, value = d * q + m, q 5 bits.
// Packed row: the GGUF blocks as they are, 6 words each: word 0 d | m,
// word 1 the fifth bits (bit j for value j), words 2..6 low nibbles as in Q4_0.

fn quant_q8(base: u32, nb: u32, g: u32) -> QW8 {
    let b = g >> 2u;
    let j = g & 3u;
    let blk = base + b * 6u;
    let o = blk + 2u + (j & 1u) * 2u;
    let sh = (j >> 1u) * 4u;
    let qh = w[blk + 1u] >> (8u * j);
    let h0 = bits_to_bytes(qh & 0xfu) << 4u;
    let h1 = bits_to_bytes((qh >> 4u) & 0xfu) << 4u;
    let q = vec2<u32>(((w[o] >> sh) & 0x0f0f0f0fu) | h0, ((w[o + 1u] >> sh) & 0x0f0f0f0fu) | h1);
    let dm = unpack2x16float(w[blk]);
    return QW8(q, dm.x, dm.y);
}
