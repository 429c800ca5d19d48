// The items of the int8 matrix-vector kernel (QItem, quant/common.wgsl)
// for a format without a file of its own: item c is quant_q32's chunk c,
// its halves at 16-value positions 2 c and 2 c + 1.

fn quant_item(base: u32, nb: u32, c: u32) -> QItem {
    let v = quant_q32(base, nb, c);
    return QItem(v.q0, v.q1, v.a, v.b, vec2<u32>(2u * c, 2u * c + 1u));
}
