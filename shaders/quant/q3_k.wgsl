// Q3_K: 256 values per block in 16 sub-blocks of 16,
// value = d * (scale - 32) * (q2 + 4 * h - 4), q2 2 bits, h the high bit.
// Packed row: nb bodies of 27 words (words 0..8 hmask: bit i / 32 of byte
// i % 32; words 8..24 the 2-bit quants laid out as in Q2_K; words 24..27 the
// 12 packed 6-bit scales), then nb f16 scales d.

fn q3_scale_byte(blk: u32, i: u32) -> u32 {
    return (w[blk + 24u + (i >> 2u)] >> (8u * (i & 3u))) & 0xffu;
}

fn quant_q8(base: u32, nb: u32, g: u32) -> QW8 {
    let b = g >> 5u;
    let blk = base + b * 27u;
    let e = (g & 31u) * 8u;
    let r = e & 127u;
    let o = blk + 8u + (e >> 7u) * 8u + ((r & 31u) >> 2u);
    let sh = 2u * (r >> 5u);
    let oh = blk + ((e & 31u) >> 2u);
    let hb = e >> 5u;
    let q = vec2<u32>(
        ((w[o] >> sh) & 0x03030303u) | (byte_bits(w[oh], hb) << 2u),
        ((w[o + 1u] >> sh) & 0x03030303u) | (byte_bits(w[oh + 1u], hb) << 2u),
    );
    let s = e >> 4u;
    var low: u32;
    if s < 8u {
        low = q3_scale_byte(blk, s) & 0xfu;
    } else {
        low = q3_scale_byte(blk, s - 8u) >> 4u;
    }
    let high = (q3_scale_byte(blk, 8u + (s & 3u)) >> (2u * (s >> 2u))) & 3u;
    let d = w_f16((base + nb * 27u) * 4u + b * 2u) * f32(i32(low | (high << 4u)) - 32);
    return QW8(q, d, -4.0 * d);
}
