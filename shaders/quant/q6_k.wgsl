// Q6_K: 256 values per block in 16 sub-blocks of 16,
// value = d * sc * (q - 32), q 6 bits, sc a signed byte.
// Packed row: nb bodies of 52 words (words 0..32 ql, 32..48 qh, 48..52 the
// 16 scales), then nb f16 scales d. Value i: c = i / 128, r = i % 128,
// part = r / 32, k = r % 32; low nibble from ql[64c + k + 32 (part & 1)]
// (high nibble when part >= 2), high bits 2 * part of qh[32c + k].

fn quant_q8(base: u32, nb: u32, g: u32) -> QW8 {
    let b = g >> 5u;
    let blk = base + b * 52u;
    let e = (g & 31u) * 8u;
    let c = e >> 7u;
    let part = (e & 127u) >> 5u;
    let k = e & 31u;
    let o = blk + 16u * c + ((k + 32u * (part & 1u)) >> 2u);
    let sh = 4u * (part >> 1u);
    let oh = blk + 32u + 8u * c + (k >> 2u);
    let hs = 2u * part;
    let q = vec2<u32>(
        ((w[o] >> sh) & 0x0f0f0f0fu) | (((w[oh] >> hs) & 0x03030303u) << 4u),
        ((w[o + 1u] >> sh) & 0x0f0f0f0fu) | (((w[oh + 1u] >> hs) & 0x03030303u) << 4u),
    );
    let s = e >> 4u;
    let sc = bitcast<i32>(w[blk + 48u + (s >> 2u)] << (24u - 8u * (s & 3u))) >> 24u;
    let d = w_f16((base + nb * 52u) * 4u + b * 2u) * f32(sc);
    return QW8(q, d, -32.0 * d);
}

// Values 32 * (c % 8) .. of block c / 8: 8 words of low nibbles, 8 of high
// bits, two scales (sub-blocks of 16).
fn quant_q32(base: u32, nb: u32, c: u32) -> QW32 {
    let b = c >> 3u;
    let blk = base + b * 52u;
    let e = (c & 7u) * 32u;
    let half = e >> 7u;
    let part = (e & 127u) >> 5u;
    let o = blk + 16u * half + 8u * (part & 1u);
    let oh = blk + 32u + 8u * half;
    let sh = vec4<u32>(4u * (part >> 1u));
    let hs = vec4<u32>(2u * part);
    let lo = vec4<u32>(0x0f0f0f0fu);
    let hi = vec4<u32>(0x03030303u);
    let q0 = ((w_vec4(o) >> sh) & lo) | (((w_vec4(oh) >> hs) & hi) << vec4<u32>(4u));
    let q1 = ((w_vec4(o + 4u) >> sh) & lo) | (((w_vec4(oh + 4u) >> hs) & hi) << vec4<u32>(4u));
    let s = e >> 4u;
    let sw = w[blk + 48u + (s >> 2u)];
    let sc0 = bitcast<i32>(sw << (24u - 8u * (s & 3u))) >> 24u;
    let sc1 = bitcast<i32>(sw << (16u - 8u * (s & 3u))) >> 24u;
    let d = w_f16((base + nb * 52u) * 4u + b * 2u);
    let a = d * vec2<f32>(f32(sc0), f32(sc1));
    return QW32(q0, q1, a, -32.0 * a);
}
