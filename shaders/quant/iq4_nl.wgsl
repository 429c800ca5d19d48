// IQ4_NL: 32 values per block, value = d * kvalues_iq4nl[q], q a nibble.
// Packed row: nb bodies of 4 words (nibbles laid out as in Q4_0), then nb
// f16 scales.

fn quant_q8(base: u32, nb: u32, g: u32) -> QW8 {
    let b = g >> 2u;
    let j = g & 3u;
    let o = base + b * 4u + (j & 1u) * 2u;
    let sh = (j >> 1u) * 4u;
    let q = vec2<u32>(iq4_levels((w[o] >> sh) & 0x0f0f0f0fu), iq4_levels((w[o + 1u] >> sh) & 0x0f0f0f0fu));
    let d = w_f16((base + nb * 4u) * 4u + b * 2u);
    return QW8(q, d, 0.0);
}
