// F16: a row is its values, two per word (value 2i in the low half).

fn quant_w8(base: u32, nb: u32, g: u32) -> W8 {
    let o = base + g * 4u;
    return W8(
        vec4<f32>(unpack2x16float(w[o]), unpack2x16float(w[o + 1u])),
        vec4<f32>(unpack2x16float(w[o + 2u]), unpack2x16float(w[o + 3u])),
    );
}
