// Q8_0: 32 values per block, value = d * q, q a signed byte.
// Packed row: nb bodies of 8 words (the quants), then nb f16 scales.

fn quant_q8(base: u32, nb: u32, g: u32) -> QW8 {
    let b = g >> 2u;
    let o = base + b * 8u + (g & 3u) * 2u;
    let d = w_f16((base + nb * 8u) * 4u + b * 2u);
    return QW8(vec2<u32>(w[o], w[o + 1u]), d, 0.0);
}

// Block c: its 8 words of quants and one scale.
fn quant_q32(base: u32, nb: u32, c: u32) -> QW32 {
    let o = base + c * 8u;
    let d = w_f16((base + nb * 8u) * 4u + c * 2u);
    return QW32(w_vec4(o), w_vec4(o + 4u), vec2<f32>(d), vec2<f32>(0.0));
}
