// Q4_K items of the int8 matrix-vector kernel (QItem, quant/common.wgsl)
// in 16-byte loads: w4 is the weight binding again as vec4<u32> (a block
// is 9 of them: the header d | dmin and 12 scale bytes, then 8 of
// nibbles; rows start at multiples of 16 bytes). Item c is nibble vec4
// j = c % 8 of block c / 8: bytes 16 (j % 2) .. of the block's 32-byte
// group j / 2, whose low nibbles are sub-block 2 (j / 2) and high
// nibbles sub-block 2 (j / 2) + 1: values 64 (j / 2) + 16 (j % 2) .. + 15
// and 32 further.

@group(0) @binding(5) var<storage, read> w4: array<vec4<u32>>;

fn quant_item(base: u32, nb: u32, c: u32) -> QItem {
    let blk = base / 4u + (c >> 3u) * 9u;
    let j = c & 7u;
    let hdr = w4[blk];
    let v = w4[blk + 1u + j];
    let s = 2u * (j >> 1u);
    let sm0 = scale_min_k4(s, hdr.y, hdr.z, hdr.w);
    let sm1 = scale_min_k4(s + 1u, hdr.y, hdr.z, hdr.w);
    // d | dmin through `w`: the pipeline layouts are derived from what a
    // kernel reads, and every variant binds `w` (at 1) before w4 (at 5).
    let dm = unpack2x16float(w[4u * blk]);
    let a = dm.x * vec2<f32>(f32(sm0.x), f32(sm1.x));
    let b = -dm.y * vec2<f32>(f32(sm0.y), f32(sm1.y));
    let m = vec4<u32>(0x0f0f0f0fu);
    let at = (c >> 3u) * 16u + 4u * (j >> 1u) + (j & 1u);
    return QItem(v & m, (v >> vec4<u32>(4u)) & m, a, b, vec2<u32>(at, at + 2u));
}
