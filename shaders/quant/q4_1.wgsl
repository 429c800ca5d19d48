// Q4_1: 32 values per block, value = d * q + m, q a nibble.
// Packed row: the GGUF blocks as they are, 5 words each: word 0 holds d (low
// half) and m (high half), words 1..5 the nibbles laid out as in Q4_0.

fn quant_q8(base: u32, nb: u32, g: u32) -> QW8 {
    let b = g >> 2u;
    let j = g & 3u;
    let blk = base + b * 5u;
    let o = blk + 1u + (j & 1u) * 2u;
    let sh = (j >> 1u) * 4u;
    let q = vec2<u32>((w[o] >> sh) & 0x0f0f0f0fu, (w[o + 1u] >> sh) & 0x0f0f0f0fu);
    let dm = unpack2x16float(w[blk]);
    return QW8(q, dm.x, dm.y);
}
