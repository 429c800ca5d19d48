// Q2_K: 256 values per block in 16 sub-blocks of 16,
// value = d * (sc & 15) * q - dmin * (sc >> 4), q 2 bits.
// Packed row: the GGUF blocks as they are, 21 words each: words 0..4 the 16
// scale bytes, words 4..20 the quants (value i of half h = i / 128 in byte
// h * 32 + i % 32, bits 2 * ((i % 128) / 32)), word 20 d | dmin.

fn quant_q8(base: u32, nb: u32, g: u32) -> QW8 {
    let blk = base + (g >> 5u) * 21u;
    let e = (g & 31u) * 8u;
    let r = e & 127u;
    let o = blk + 4u + (e >> 7u) * 8u + ((r & 31u) >> 2u);
    let sh = 2u * (r >> 5u);
    let q = vec2<u32>((w[o] >> sh) & 0x03030303u, (w[o + 1u] >> sh) & 0x03030303u);
    let s = e >> 4u;
    let sc = (w[blk + (s >> 2u)] >> (8u * (s & 3u))) & 0xffu;
    let dm = unpack2x16float(w[blk + 20u]);
    return QW8(q, dm.x * f32(sc & 0xfu), -dm.y * f32(sc >> 4u));
}
