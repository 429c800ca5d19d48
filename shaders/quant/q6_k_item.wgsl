// Q6_K items of the int8 matrix-vector kernel (QItem, quant/common.wgsl)
// in 16-byte loads: w4 is the weight binding again as vec4<u32> (a body
// is 13 of them: 8 of ql, 4 of qh, 1 of scales; the host takes this file
// only where rows start at multiples of 16 bytes). Item c is ql vec4
// j = c % 8 of block c / 8: half h = j / 4 of the block, bytes
// 16 (j % 4) .. of its 64 ql bytes, i.e. part p = (j / 2) % 2 and, in the
// high nibbles, part p + 2, at k = 16 (j % 2) ..; the high bits are
// qh vec4 2 h + j % 2, bits 2 p (and 2 p + 4).

@group(0) @binding(5) var<storage, read> w4: array<vec4<u32>>;

fn quant_item(base: u32, nb: u32, c: u32) -> QItem {
    let b = c >> 3u;
    let body = base / 4u + b * 13u;
    let j = c & 7u;
    let h = j >> 2u;
    let part = (j >> 1u) & 1u;
    let ql = w4[body + j];
    let qh = w4[body + 8u + 2u * h + (j & 1u)];
    let sc = w4[body + 12u];
    let lo = vec4<u32>(0x0f0f0f0fu);
    let hi = vec4<u32>(0x03030303u);
    let q0 = (ql & lo) | (((qh >> vec4<u32>(2u * part)) & hi) << vec4<u32>(4u));
    let q1 = ((ql >> vec4<u32>(4u)) & lo) | (((qh >> vec4<u32>(2u * part + 4u)) & hi) << vec4<u32>(4u));
    // Sub-blocks of 16: s0 for q0, s0 + 4 (two parts on) for q1.
    let s0 = 8u * h + 2u * part + (j & 1u);
    let s1 = s0 + 4u;
    let sc0 = bitcast<i32>(sc[s0 >> 2u] << (24u - 8u * (s0 & 3u))) >> 24u;
    let sc1 = bitcast<i32>(sc[s1 >> 2u] << (24u - 8u * (s1 & 3u))) >> 24u;
    let d = w_f16((base + nb * 52u) * 4u + b * 2u);
    let a = d * vec2<f32>(f32(sc0), f32(sc1));
    return QItem(q0, q1, a, -32.0 * a, vec2<u32>(b * 16u + s0, b * 16u + s1));
}
