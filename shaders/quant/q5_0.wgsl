// Q5_0: 32 values per block, value = d * (q - 16), q 5 bits.
// Packed row: nb bodies of 5 words (word 0: the fifth bits, bit j for value
// j; words 1..5: low nibbles laid out as in Q4_0), then nb f16 scales.

fn quant_q8(base: u32, nb: u32, g: u32) -> QW8 {
    let b = g >> 2u;
    let j = g & 3u;
    let blk = base + b * 5u;
    let o = blk + 1u + (j & 1u) * 2u;
    let sh = (j >> 1u) * 4u;
    let qh = w[blk] >> (8u * j);
    let h0 = bits_to_bytes(qh & 0xfu) << 4u;
    let h1 = bits_to_bytes((qh >> 4u) & 0xfu) << 4u;
    let q = vec2<u32>(((w[o] >> sh) & 0x0f0f0f0fu) | h0, ((w[o + 1u] >> sh) & 0x0f0f0f0fu) | h1);
    let d = w_f16((base + nb * 5u) * 4u + b * 2u);
    return QW8(q, d, -16.0 * d);
}
