// quant_w8 of a quantized format, from its quant_q8 (composed after the
// format file; see quant/common.wgsl for the interface).

fn quant_w8(base: u32, nb: u32, g: u32) -> W8 {
    return qw8_to_w8(quant_q8(base, nb, g));
}
