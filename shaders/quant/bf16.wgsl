// BF16: a row is its values, two per word (value 2i in the low half); a
// bf16 is the high half of an f32.

fn bf16x2(v: u32) -> vec2<f32> {
    return vec2<f32>(bitcast<f32>(v << 16u), bitcast<f32>(v & 0xffff0000u));
}

fn quant_w8(base: u32, nb: u32, g: u32) -> W8 {
    let o = base + g * 4u;
    return W8(vec4<f32>(bf16x2(w[o]), bf16x2(w[o + 1u])), vec4<f32>(bf16x2(w[o + 2u]), bf16x2(w[o + 3u])));
}
