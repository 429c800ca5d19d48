// F32: a row is its values, one word each.

fn quant_w8(base: u32, nb: u32, g: u32) -> W8 {
    let o = base + g * 8u;
    return W8(
        vec4<f32>(bitcast<f32>(w[o]), bitcast<f32>(w[o + 1u]), bitcast<f32>(w[o + 2u]), bitcast<f32>(w[o + 3u])),
        vec4<f32>(bitcast<f32>(w[o + 4u]), bitcast<f32>(w[o + 5u]), bitcast<f32>(w[o + 6u]), bitcast<f32>(w[o + 7u])),
    );
}
