// quant_q32 of a format without a faster way: four of its quant_q8
// (composed after the format file; see quant/common.wgsl).

fn quant_q32(base: u32, nb: u32, c: u32) -> QW32 {
    let g = 4u * c;
    return q32_of_q8(
        quant_q8(base, nb, g),
        quant_q8(base, nb, g + 1u),
        quant_q8(base, nb, g + 2u),
        quant_q8(base, nb, g + 3u),
    );
}
