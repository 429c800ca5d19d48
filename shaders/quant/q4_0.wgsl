// Q4_0: 32 values per block, value = d * (q - 8), q a nibble.
// Packed row: nb bodies of 4 words (the 16 nibble bytes: value j < 16 in the
// low nibble of byte j, value j + 16 in the high one), then nb f16 scales.

fn quant_q8(base: u32, nb: u32, g: u32) -> QW8 {
    let b = g >> 2u;
    let j = g & 3u;
    let o = base + b * 4u + (j & 1u) * 2u;
    let sh = (j >> 1u) * 4u;
    let q = vec2<u32>((w[o] >> sh) & 0x0f0f0f0fu, (w[o + 1u] >> sh) & 0x0f0f0f0fu);
    let d = w_f16((base + nb * 4u) * 4u + b * 2u);
    return QW8(q, d, -8.0 * d);
}

// Block c: values 0..15 the low nibbles of its 4 words, 16..31 the high.
fn quant_q32(base: u32, nb: u32, c: u32) -> QW32 {
    let v = w_vec4(base + c * 4u);
    let m = vec4<u32>(0x0f0f0f0fu);
    let d = w_f16((base + nb * 4u) * 4u + c * 2u);
    return QW32(v & m, (v >> vec4<u32>(4u)) & m, vec2<f32>(d), vec2<f32>(-8.0 * d));
}
