// Helpers shared by the quant format files (shaders/quant/<format>.wgsl).
//
// The quant interface. Every format file defines, over the packed weight
// layout of src/backend/packed.rs held in the global `w`
// (`array<u32>`, declared by the kernel file):
//
//   fn quant_w8(base: u32, nb: u32, g: u32) -> W8
//       the 8 values g*8 .. g*8+7 of the row starting at word `base`, as f32;
//       `nb` is the row's block count (where the split scales start).
//   fn quant_q8(base: u32, nb: u32, g: u32) -> QW8     (quantized formats only)
//       the same 8 values as signed bytes q with value = a * q + b.
//   fn quant_q32(base: u32, nb: u32, c: u32) -> QW32   (quantized formats only)
//       the 32 values c*32 .. c*32+31 as signed bytes, with one (a, b) per
//       16 values (every quantized format's scales cover 16 or 32 values);
//       formats without a faster way take it from quant_q8
//       (quant/q32_of_q8.wgsl), and every quantized format its quant_w8
//       (quant/w8_of_q8.wgsl), composed after the format file.
//
// The int8 matrix-vector kernel reads rows through quant_item (QItem
// below), from an item file composed after the format file.
//
// Every format's blocks hold a multiple of 8 values, and 8 consecutive
// values always come from two aligned words, so g never straddles a block.

// Eight weights: values 0..3 in `lo`, 4..7 in `hi`.
struct W8 {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// Eight weights as int8: byte j of q[j / 4] is value j's quant (signed, and
// below 128 for the unsigned formats), value_j = a * q_j + b.
struct QW8 {
    q: vec2<u32>,
    a: f32,
    b: f32,
}

// Thirty-two weights as int8: values 0..15 in q0 (byte j of word j / 4),
// 16..31 in q1; value = a.x * q + b.x for values 0..15, a.y, b.y for 16..31.
struct QW32 {
    q0: vec4<u32>,
    q1: vec4<u32>,
    a: vec2<f32>,
    b: vec2<f32>,
}

// One item of the int8 matrix-vector kernel (matmul_vec_i8.wgsl): 32
// weights as int8 in two runs of 16, q0 at the row's 16-value position
// at.x, q1 at at.y (not always neighbours); value = a.x * q + b.x in q0,
// a.y, b.y in q1. A row has k / 32 items; the format's item file
// (quant/<format>_item.wgsl, or item_q32.wgsl) defines quant_item.
struct QItem {
    q0: vec4<u32>,
    q1: vec4<u32>,
    a: vec2<f32>,
    b: vec2<f32>,
    at: vec2<u32>,
}

// Four consecutive int8 groups as one of 32 values (the (a, b) of groups
// 0 and 2 stand for 0..15 and 16..31: scales never change inside 16 values).
fn q32_of_q8(v0: QW8, v1: QW8, v2: QW8, v3: QW8) -> QW32 {
    return QW32(
        vec4<u32>(v0.q, v1.q),
        vec4<u32>(v2.q, v3.q),
        vec2<f32>(v0.a, v2.a),
        vec2<f32>(v0.b, v2.b),
    );
}

// The four words of `w` from word `o`.
fn w_vec4(o: u32) -> vec4<u32> {
    return vec4<u32>(w[o], w[o + 1u], w[o + 2u], w[o + 3u]);
}

// The four signed bytes of `p`, as f32.
fn i8x4_to_f32(p: u32) -> vec4<f32> {
    let v = vec4<i32>(bitcast<i32>(p));
    return vec4<f32>((v << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
}

// Dequantizes an int8 group: a * q + b.
fn qw8_to_w8(v: QW8) -> W8 {
    return W8(
        fma(vec4<f32>(v.a), i8x4_to_f32(v.q.x), vec4<f32>(v.b)),
        fma(vec4<f32>(v.a), i8x4_to_f32(v.q.y), vec4<f32>(v.b)),
    );
}

// Byte `i` (little-endian) of the weight buffer.
fn w_byte(i: u32) -> u32 {
    return (w[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

// The f16 at byte `i` (even) of the weight buffer, as f32.
fn w_f16(i: u32) -> f32 {
    let pair = unpack2x16float(w[i >> 2u]);
    return select(pair.x, pair.y, (i & 2u) != 0u);
}

// Moves bit i (i < 4) of `h` to bit 8 * i: one bit per byte.
fn bits_to_bytes(h: u32) -> u32 {
    return (h & 1u) | ((h & 2u) << 7u) | ((h & 4u) << 14u) | ((h & 8u) << 21u);
}

// Bit `bit` of each byte of `v`, moved to bit 0 of that byte.
fn byte_bits(v: u32, bit: u32) -> u32 {
    return (v >> bit) & 0x01010101u;
}

// The 16 levels of IQ4_NL / IQ4_XS (kvalues_iq4nl) as packed signed bytes.
const IQ4_LEVELS = array<u32, 4>(0xBFAD9881u, 0xF6EADDCFu, 0x26190D01u, 0x71594535u);

// Maps the 4-bit index in each byte of `v` to its IQ4 level (a signed byte).
fn iq4_levels(v: u32) -> u32 {
    var out = 0u;
    for (var j = 0u; j < 4u; j++) {
        let n = (v >> (8u * j)) & 0xfu;
        out |= ((IQ4_LEVELS[n >> 2u] >> ((n & 3u) * 8u)) & 0xffu) << (8u * j);
    }
    return out;
}

// The 6-bit scale and min of sub-block j (0..8) of Q4_K / Q5_K, whose 12
// packed scale bytes are words s0, s1, s2 (ggml's get_scale_min_k4).
fn scale_min_k4(j: u32, s0: u32, s1: u32, s2: u32) -> vec2<u32> {
    if j < 4u {
        let sh = 8u * j;
        return vec2<u32>((s0 >> sh) & 63u, (s1 >> sh) & 63u);
    }
    let sh = 8u * (j - 4u);
    let lo = (s2 >> sh) & 0xffu;
    let d = (lo & 0xfu) | ((((s0 >> sh) >> 6u) & 3u) << 4u);
    let m = (lo >> 4u) | ((((s1 >> sh) >> 6u) & 3u) << 4u);
    return vec2<u32>(d, m);
}
