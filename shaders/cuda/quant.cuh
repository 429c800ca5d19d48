// The quantized weight formats, read from the packed layout that the GPU
// backends share (src/backend/packed.rs; the WGSL twins are
// shaders/quant/*.wgsl). `w` is the weight buffer as 32-bit words, `base`
// the word where a row starts, `nb` the row's block count (where the split
// scales start). Per format FMT:
//
//   QW8  q8_FMT(w, base, nb, g)    values 8g .. 8g+7 as int8 q, value = a * q + b
//   QW32 q32_FMT(w, base, nb, c)   values 32c .. 32c+31, (a, b) per 16 values
//   void w8_FMT(w, base, nb, g, v) values 8g .. 8g+7 as floats
//
// Float formats (f32, f16, bf16) have w8 only.

struct QW8 {
    u32 q0, q1;  // byte j of q0 (j < 4) / q1 (j - 4): value j's quant
    float a, b;
};

struct QW32 {
    uint4 q0, q1;  // values 0..15 in q0, 16..31 in q1, byte j of word j / 4
    float2 a, b;   // .x for values 0..15, .y for 16..31
};

#define QARGS const u32* __restrict__ w, u32 base, u32 nb, u32 g

// Four words from word o, a multiple of 4: rows start at 16-byte
// boundaries (the CUDA backend packs with a row alignment of 16), so the
// formats whose blocks are multiples of 16 bytes read them in 128-bit loads.
__device__ __forceinline__ uint4 w_vec4(const u32* __restrict__ w, u32 o) {
    return *(const uint4*)(w + o);
}

// The f16 at byte `i` (even) of the weight buffer.
__device__ __forceinline__ float w_f16(const u32* __restrict__ w, u32 i) {
    const u32 word = w[i >> 2];
    return f16_f32((i & 2u) ? (word >> 16) : (word & 0xffffu));
}

// Bit i (i < 4) of h to bit 8i: one bit per byte.
__device__ __forceinline__ u32 bits_to_bytes(u32 h) {
    return (h & 1u) | ((h & 2u) << 7) | ((h & 4u) << 14) | ((h & 8u) << 21);
}

// Bit `bit` of each byte of v, moved to bit 0 of that byte.
__device__ __forceinline__ u32 byte_bits(u32 v, u32 bit) { return (v >> bit) & 0x01010101u; }

// The 16 levels of IQ4_NL / IQ4_XS (kvalues_iq4nl) for the four nibbles
// in the bytes of v: byte permutes of the table held in four words (a
// local array would live in memory), levels 0-7 or 8-15 by bit 3.
__device__ __forceinline__ u32 iq4_levels(u32 v) {
    const u32 t0 = 0xbfad9881u, t1 = 0xf6eaddcfu, t2 = 0x26190d01u, t3 = 0x71594535u;
    const u32 sel = (v & 7u) | ((v >> 4) & 0x70u) | ((v >> 8) & 0x700u) | ((v >> 12) & 0x7000u);
    const u32 lo = __byte_perm(t0, t1, sel), hi = __byte_perm(t2, t3, sel);
    const u32 mask = ((v >> 3) & 0x01010101u) * 0xffu;
    return (lo & ~mask) | (hi & mask);
}

// The 6-bit scale and min of sub-block j of Q4_K / Q5_K (get_scale_min_k4).
__device__ __forceinline__ uint2 scale_min_k4(u32 j, u32 s0, u32 s1, u32 s2) {
    if (j < 4) {
        const u32 sh = 8 * j;
        return make_uint2((s0 >> sh) & 63u, (s1 >> sh) & 63u);
    }
    const u32 sh = 8 * (j - 4);
    const u32 lo = (s2 >> sh) & 0xffu;
    return make_uint2((lo & 0xfu) | (((s0 >> sh) >> 6) & 3u) << 4, (lo >> 4) | (((s1 >> sh) >> 6) & 3u) << 4);
}

__device__ __forceinline__ QW8 make_qw8(u32 q0, u32 q1, float a, float b) {
    QW8 v;
    v.q0 = q0;
    v.q1 = q1;
    v.a = a;
    v.b = b;
    return v;
}

__device__ __forceinline__ QW32 q32_of_q8(QW8 v0, QW8 v1, QW8 v2, QW8 v3) {
    QW32 r;
    r.q0 = make_uint4(v0.q0, v0.q1, v1.q0, v1.q1);
    r.q1 = make_uint4(v2.q0, v2.q1, v3.q0, v3.q1);
    r.a = make_float2(v0.a, v2.a);
    r.b = make_float2(v0.b, v2.b);
    return r;
}

// The four signed bytes of p, dequantized: a * q + b.
__device__ __forceinline__ void deq4(u32 p, float a, float b, float* v) {
#pragma unroll
    for (u32 j = 0; j < 4; j++) v[j] = a * (float)(i32)(signed char)(u8)(p >> (8 * j)) + b;
}

__device__ __forceinline__ void qw8_to_w8(QW8 q, float* v) {
    deq4(q.q0, q.a, q.b, v);
    deq4(q.q1, q.a, q.b, v + 4);
}

// ---- float formats

__device__ __forceinline__ void w8_f32(QARGS, float* v) {
    const u32 o = base + g * 8;
#pragma unroll
    for (u32 j = 0; j < 8; j++) v[j] = bits_f32(w[o + j]);
}

__device__ __forceinline__ void w8_f16(QARGS, float* v) {
    const u32 o = base + g * 4;
#pragma unroll
    for (u32 j = 0; j < 4; j++) {
        const float2 p = f16x2(w[o + j]);
        v[2 * j] = p.x;
        v[2 * j + 1] = p.y;
    }
}

__device__ __forceinline__ void w8_bf16(QARGS, float* v) {
    const u32 o = base + g * 4;
#pragma unroll
    for (u32 j = 0; j < 4; j++) {
        const float2 p = bf16x2(w[o + j]);
        v[2 * j] = p.x;
        v[2 * j + 1] = p.y;
    }
}

// ---- 32-value blocks

// Q4_0: value = d * (q - 8); nb bodies of 4 words (value j < 16 low nibble of
// byte j, j + 16 the high one), then nb f16 scales.
__device__ __forceinline__ QW8 q8_q4_0(QARGS) {
    const u32 b = g >> 2, j = g & 3u;
    const u32 o = base + b * 4 + (j & 1u) * 2, sh = (j >> 1) * 4;
    const float d = w_f16(w, (base + nb * 4) * 4 + b * 2);
    return make_qw8((w[o] >> sh) & 0x0f0f0f0fu, (w[o + 1] >> sh) & 0x0f0f0f0fu, d, -8.0f * d);
}

__device__ __forceinline__ QW32 q32_q4_0(QARGS) {
    const uint4 v = w_vec4(w, base + g * 4);
    const float d = w_f16(w, (base + nb * 4) * 4 + g * 2);
    QW32 r;
    r.q0 = make_uint4(v.x & 0x0f0f0f0fu, v.y & 0x0f0f0f0fu, v.z & 0x0f0f0f0fu, v.w & 0x0f0f0f0fu);
    r.q1 = make_uint4((v.x >> 4) & 0x0f0f0f0fu, (v.y >> 4) & 0x0f0f0f0fu, (v.z >> 4) & 0x0f0f0f0fu,
                      (v.w >> 4) & 0x0f0f0f0fu);
    r.a = make_float2(d, d);
    r.b = make_float2(-8.0f * d, -8.0f * d);
    return r;
}

// Q4_1: value = d * q + m; blocks verbatim, 5 words: d | m, 4 words of nibbles.
__device__ __forceinline__ QW8 q8_q4_1(QARGS) {
    const u32 b = g >> 2, j = g & 3u;
    const u32 blk = base + b * 5;
    const u32 o = blk + 1 + (j & 1u) * 2, sh = (j >> 1) * 4;
    const float2 dm = f16x2(w[blk]);
    return make_qw8((w[o] >> sh) & 0x0f0f0f0fu, (w[o + 1] >> sh) & 0x0f0f0f0fu, dm.x, dm.y);
}

// Q5_0: value = d * (q - 16); bodies of 5 words (fifth bits, then nibbles), then scales.
__device__ __forceinline__ QW8 q8_q5_0(QARGS) {
    const u32 b = g >> 2, j = g & 3u;
    const u32 blk = base + b * 5;
    const u32 o = blk + 1 + (j & 1u) * 2, sh = (j >> 1) * 4;
    const u32 qh = w[blk] >> (8 * j);
    const u32 h0 = bits_to_bytes(qh & 0xfu) << 4, h1 = bits_to_bytes((qh >> 4) & 0xfu) << 4;
    const float d = w_f16(w, (base + nb * 5) * 4 + b * 2);
    return make_qw8(((w[o] >> sh) & 0x0f0f0f0fu) | h0, ((w[o + 1] >> sh) & 0x0f0f0f0fu) | h1, d, -16.0f * d);
}

// Q5_1: value = d * q + m; blocks verbatim, 6 words: d | m, fifth bits, nibbles.
__device__ __forceinline__ QW8 q8_q5_1(QARGS) {
    const u32 b = g >> 2, j = g & 3u;
    const u32 blk = base + b * 6;
    const u32 o = blk + 2 + (j & 1u) * 2, sh = (j >> 1) * 4;
    const u32 qh = w[blk + 1] >> (8 * j);
    const u32 h0 = bits_to_bytes(qh & 0xfu) << 4, h1 = bits_to_bytes((qh >> 4) & 0xfu) << 4;
    const float2 dm = f16x2(w[blk]);
    return make_qw8(((w[o] >> sh) & 0x0f0f0f0fu) | h0, ((w[o + 1] >> sh) & 0x0f0f0f0fu) | h1, dm.x, dm.y);
}

// Q8_0: value = d * q; bodies of 8 words, then scales.
__device__ __forceinline__ QW8 q8_q8_0(QARGS) {
    const u32 b = g >> 2;
    const u32 o = base + b * 8 + (g & 3u) * 2;
    return make_qw8(w[o], w[o + 1], w_f16(w, (base + nb * 8) * 4 + b * 2), 0.0f);
}

__device__ __forceinline__ QW32 q32_q8_0(QARGS) {
    const u32 o = base + g * 8;
    const float d = w_f16(w, (base + nb * 8) * 4 + g * 2);
    QW32 r;
    r.q0 = w_vec4(w, o);
    r.q1 = w_vec4(w, o + 4);
    r.a = make_float2(d, d);
    r.b = make_float2(0.0f, 0.0f);
    return r;
}

// IQ4_NL: value = d * kvalues_iq4nl[q]; nibbles as Q4_0, then scales.
__device__ __forceinline__ QW8 q8_iq4_nl(QARGS) {
    const u32 b = g >> 2, j = g & 3u;
    const u32 o = base + b * 4 + (j & 1u) * 2, sh = (j >> 1) * 4;
    const float d = w_f16(w, (base + nb * 4) * 4 + b * 2);
    return make_qw8(iq4_levels((w[o] >> sh) & 0x0f0f0f0fu), iq4_levels((w[o + 1] >> sh) & 0x0f0f0f0fu), d, 0.0f);
}

// ---- 256-value blocks

// Q2_K: blocks verbatim, 21 words: 16 scale bytes, 64 quant bytes, d | dmin.
__device__ __forceinline__ QW8 q8_q2_k(QARGS) {
    const u32 blk = base + (g >> 5) * 21;
    const u32 e = (g & 31u) * 8, r = e & 127u;
    const u32 o = blk + 4 + (e >> 7) * 8 + ((r & 31u) >> 2), sh = 2 * (r >> 5);
    const u32 s = e >> 4;
    const u32 sc = (w[blk + (s >> 2)] >> (8 * (s & 3u))) & 0xffu;
    const float2 dm = f16x2(w[blk + 20]);
    return make_qw8((w[o] >> sh) & 0x03030303u, (w[o + 1] >> sh) & 0x03030303u, dm.x * (float)(sc & 0xfu),
                    -dm.y * (float)(sc >> 4));
}

__device__ __forceinline__ u32 q3_scale_byte(const u32* __restrict__ w, u32 blk, u32 i) {
    return (w[blk + 24 + (i >> 2)] >> (8 * (i & 3u))) & 0xffu;
}

// Q3_K: bodies of 27 words (hmask, 2-bit quants as Q2_K, 12 scale bytes), then d.
__device__ __forceinline__ QW8 q8_q3_k(QARGS) {
    const u32 b = g >> 5;
    const u32 blk = base + b * 27;
    const u32 e = (g & 31u) * 8, r = e & 127u;
    const u32 o = blk + 8 + (e >> 7) * 8 + ((r & 31u) >> 2), sh = 2 * (r >> 5);
    const u32 oh = blk + ((e & 31u) >> 2), hb = e >> 5;
    const u32 q0 = ((w[o] >> sh) & 0x03030303u) | (byte_bits(w[oh], hb) << 2);
    const u32 q1 = ((w[o + 1] >> sh) & 0x03030303u) | (byte_bits(w[oh + 1], hb) << 2);
    const u32 s = e >> 4;
    const u32 low = s < 8 ? (q3_scale_byte(w, blk, s) & 0xfu) : (q3_scale_byte(w, blk, s - 8) >> 4);
    const u32 high = (q3_scale_byte(w, blk, 8 + (s & 3u)) >> (2 * (s >> 2))) & 3u;
    const float d = w_f16(w, (base + nb * 27) * 4 + b * 2) * (float)((i32)(low | (high << 4)) - 32);
    return make_qw8(q0, q1, d, -4.0f * d);
}

// Q4_K: blocks verbatim, 36 words: d | dmin, 12 scale bytes, 128 nibble bytes.
__device__ __forceinline__ QW8 q8_q4_k(QARGS) {
    const u32 blk = base + (g >> 5) * 36;
    const u32 e = (g & 31u) * 8;
    const u32 o = blk + 4 + (e >> 6) * 8 + ((e & 31u) >> 2), sh = 4 * ((e & 63u) >> 5);
    const uint2 sm = scale_min_k4(e >> 5, w[blk + 1], w[blk + 2], w[blk + 3]);
    const float2 dm = f16x2(w[blk]);
    return make_qw8((w[o] >> sh) & 0x0f0f0f0fu, (w[o + 1] >> sh) & 0x0f0f0f0fu, dm.x * (float)sm.x,
                    -dm.y * (float)sm.y);
}

__device__ __forceinline__ QW32 q32_q4_k(QARGS) {
    const u32 blk = base + (g >> 3) * 36;
    const u32 s = g & 7u;
    const u32 o = blk + 4 + (s >> 1) * 8, sh = 4 * (s & 1u);
    const uint4 hdr = w_vec4(w, blk);
    const uint2 sm = scale_min_k4(s, hdr.y, hdr.z, hdr.w);
    const float2 dm = f16x2(hdr.x);
    const float a = dm.x * (float)sm.x, b = -dm.y * (float)sm.y;
    const uint4 v0 = w_vec4(w, o), v1 = w_vec4(w, o + 4);
    const u32 m = 0x0f0f0f0fu;
    QW32 r;
    r.q0 = make_uint4((v0.x >> sh) & m, (v0.y >> sh) & m, (v0.z >> sh) & m, (v0.w >> sh) & m);
    r.q1 = make_uint4((v1.x >> sh) & m, (v1.y >> sh) & m, (v1.z >> sh) & m, (v1.w >> sh) & m);
    r.a = make_float2(a, a);
    r.b = make_float2(b, b);
    return r;
}

// Q5_K: blocks verbatim, 44 words: d | dmin, scales, 32 qh bytes, nibbles as Q4_K.
__device__ __forceinline__ QW8 q8_q5_k(QARGS) {
    const u32 blk = base + (g >> 5) * 44;
    const u32 e = (g & 31u) * 8;
    const u32 o = blk + 12 + (e >> 6) * 8 + ((e & 31u) >> 2), sh = 4 * ((e & 63u) >> 5);
    const u32 oh = blk + 4 + ((e & 31u) >> 2), hb = e >> 5;
    const u32 q0 = ((w[o] >> sh) & 0x0f0f0f0fu) | (byte_bits(w[oh], hb) << 4);
    const u32 q1 = ((w[o + 1] >> sh) & 0x0f0f0f0fu) | (byte_bits(w[oh + 1], hb) << 4);
    const uint2 sm = scale_min_k4(e >> 5, w[blk + 1], w[blk + 2], w[blk + 3]);
    const float2 dm = f16x2(w[blk]);
    return make_qw8(q0, q1, dm.x * (float)sm.x, -dm.y * (float)sm.y);
}

// Q6_K: bodies of 52 words (ql, qh, 16 signed scales), then d.
__device__ __forceinline__ QW8 q8_q6_k(QARGS) {
    const u32 b = g >> 5;
    const u32 blk = base + b * 52;
    const u32 e = (g & 31u) * 8, c = e >> 7, part = (e & 127u) >> 5, k = e & 31u;
    const u32 o = blk + 16 * c + ((k + 32 * (part & 1u)) >> 2), sh = 4 * (part >> 1);
    const u32 oh = blk + 32 + 8 * c + (k >> 2), hs = 2 * part;
    const u32 q0 = ((w[o] >> sh) & 0x0f0f0f0fu) | (((w[oh] >> hs) & 0x03030303u) << 4);
    const u32 q1 = ((w[o + 1] >> sh) & 0x0f0f0f0fu) | (((w[oh + 1] >> hs) & 0x03030303u) << 4);
    const u32 s = e >> 4;
    const i32 sc = ((i32)(w[blk + 48 + (s >> 2)] << (24 - 8 * (s & 3u)))) >> 24;
    const float d = w_f16(w, (base + nb * 52) * 4 + b * 2) * (float)sc;
    return make_qw8(q0, q1, d, -32.0f * d);
}

__device__ __forceinline__ QW32 q32_q6_k(QARGS) {
    const u32 b = g >> 3;
    const u32 blk = base + b * 52;
    const u32 e = (g & 7u) * 32, half = e >> 7, part = (e & 127u) >> 5;
    const u32 o = blk + 16 * half + 8 * (part & 1u), oh = blk + 32 + 8 * half;
    const u32 sh = 4 * (part >> 1), hs = 2 * part;
    const u32 lo = 0x0f0f0f0fu, hi = 0x03030303u;
    const uint4 l0 = w_vec4(w, o), l1 = w_vec4(w, o + 4), h0 = w_vec4(w, oh), h1 = w_vec4(w, oh + 4);
    QW32 r;
    r.q0 = make_uint4(((l0.x >> sh) & lo) | (((h0.x >> hs) & hi) << 4), ((l0.y >> sh) & lo) | (((h0.y >> hs) & hi) << 4),
                      ((l0.z >> sh) & lo) | (((h0.z >> hs) & hi) << 4), ((l0.w >> sh) & lo) | (((h0.w >> hs) & hi) << 4));
    r.q1 = make_uint4(((l1.x >> sh) & lo) | (((h1.x >> hs) & hi) << 4), ((l1.y >> sh) & lo) | (((h1.y >> hs) & hi) << 4),
                      ((l1.z >> sh) & lo) | (((h1.z >> hs) & hi) << 4), ((l1.w >> sh) & lo) | (((h1.w >> hs) & hi) << 4));
    const u32 s = e >> 4;
    const u32 sw = w[blk + 48 + (s >> 2)];
    const i32 sc0 = ((i32)(sw << (24 - 8 * (s & 3u)))) >> 24;
    const i32 sc1 = ((i32)(sw << (16 - 8 * (s & 3u)))) >> 24;
    const float d = w_f16(w, (base + nb * 52) * 4 + b * 2);
    r.a = make_float2(d * (float)sc0, d * (float)sc1);
    r.b = make_float2(-32.0f * r.a.x, -32.0f * r.a.y);
    return r;
}

// IQ4_XS: blocks verbatim, 34 words: d | scales_h, scales_l, nibbles (4 words a sub-block, as Q4_0).
__device__ __forceinline__ QW8 q8_iq4_xs(QARGS) {
    const u32 blk = base + (g >> 5) * 34;
    const u32 j = g & 31u, ib = j >> 2, jj = j & 3u;
    const u32 o = blk + 2 + ib * 4 + (jj & 1u) * 2, sh = (jj >> 1) * 4;
    const u32 w0 = w[blk];
    const u32 lo = (w[blk + 1] >> (4 * ib)) & 0xfu, hi = (w0 >> (16 + 2 * ib)) & 3u;
    const float d = f16_f32(w0 & 0xffffu) * (float)((i32)(lo | (hi << 4)) - 32);
    return make_qw8(iq4_levels((w[o] >> sh) & 0x0f0f0f0fu), iq4_levels((w[o + 1] >> sh) & 0x0f0f0f0fu), d, 0.0f);
}

// ---- Decode items
//
// QN_FMT runs of 32 values make an item of the matrix-vector kernels, and
// qn_FMT(w, base, nb, c, v) fills v[0 .. QN_FMT) with values
// 32 QN_FMT c ...: a lane loads whole items, so every byte it loads is
// used (a Q4_K item is the 32 bytes whose low and high nibbles are two
// sub-blocks; a Q6_K item half a block, its ql and qh bytes shared by
// four runs). The other formats' items are their q32 runs.

#define QN_q4_k 2
__device__ __forceinline__ void qn_q4_k(QARGS, QW32* v) {
    const u32 blk = base + (g >> 2) * 36, j = g & 3u;
    const uint4 hdr = w_vec4(w, blk);
    const uint4 b0 = w_vec4(w, blk + 4 + 8 * j), b1 = w_vec4(w, blk + 8 + 8 * j);
    const float2 dm = f16x2(hdr.x);
    const u32 m = 0x0f0f0f0fu;
#pragma unroll
    for (u32 h = 0; h < 2; h++) {
        const uint2 sm = scale_min_k4(2 * j + h, hdr.y, hdr.z, hdr.w);
        const float a = dm.x * (float)sm.x, b = -dm.y * (float)sm.y;
        const u32 sh = 4 * h;
        v[h].q0 = make_uint4((b0.x >> sh) & m, (b0.y >> sh) & m, (b0.z >> sh) & m, (b0.w >> sh) & m);
        v[h].q1 = make_uint4((b1.x >> sh) & m, (b1.y >> sh) & m, (b1.z >> sh) & m, (b1.w >> sh) & m);
        v[h].a = make_float2(a, a);
        v[h].b = make_float2(b, b);
    }
}

#define QN_q6_k 4
__device__ __forceinline__ u32 q6_word(u32 l, u32 h, u32 sh, u32 hs) {
    return ((l >> sh) & 0x0f0f0f0fu) | (((h >> hs) & 0x03030303u) << 4);
}

__device__ __forceinline__ void qn_q6_k(QARGS, QW32* v) {
    const u32 b = g >> 1, half = g & 1u;
    const u32 blk = base + b * 52;
    const u32 o = blk + 16 * half, oh = blk + 32 + 8 * half;
    const uint4 l[4] = {w_vec4(w, o), w_vec4(w, o + 4), w_vec4(w, o + 8), w_vec4(w, o + 12)};
    const uint4 h0 = w_vec4(w, oh), h1 = w_vec4(w, oh + 4);
    const uint2 sw = *(const uint2*)(w + blk + 48 + 2 * half);
    const float d = w_f16(w, (base + nb * 52) * 4 + b * 2);
#pragma unroll
    for (u32 p = 0; p < 4; p++) {
        const uint4 l0 = l[2 * (p & 1u)], l1 = l[2 * (p & 1u) + 1];
        const u32 sh = 4 * (p >> 1), hs = 2 * p;
        v[p].q0 = make_uint4(q6_word(l0.x, h0.x, sh, hs), q6_word(l0.y, h0.y, sh, hs), q6_word(l0.z, h0.z, sh, hs),
                             q6_word(l0.w, h0.w, sh, hs));
        v[p].q1 = make_uint4(q6_word(l1.x, h1.x, sh, hs), q6_word(l1.y, h1.y, sh, hs), q6_word(l1.z, h1.z, sh, hs),
                             q6_word(l1.w, h1.w, sh, hs));
        const u32 word = (p >> 1) ? sw.y : sw.x, at = 16 * (p & 1u);
        const i32 sc0 = ((i32)(word << (24 - at))) >> 24, sc1 = ((i32)(word << (16 - at))) >> 24;
        v[p].a = make_float2(d * (float)sc0, d * (float)sc1);
        v[p].b = make_float2(-32.0f * v[p].a.x, -32.0f * v[p].a.y);
    }
}

#define QN_OF_Q32(F)                                                                               \
    __device__ __forceinline__ void qn_##F(QARGS, QW32* v) { v[0] = q32_##F(w, base, nb, g); }
#define QN_q4_0 1
#define QN_q4_1 1
#define QN_q5_0 1
#define QN_q5_1 1
#define QN_q8_0 1
#define QN_q2_k 1
#define QN_q3_k 1
#define QN_q5_k 1
#define QN_iq4_nl 1
#define QN_iq4_xs 1

// quant_q32 and quant_w8 of the formats without their own.
#define Q32_OF_Q8(F)                                                                               \
    __device__ __forceinline__ QW32 q32_##F(QARGS) {                                               \
        return q32_of_q8(q8_##F(w, base, nb, 4 * g), q8_##F(w, base, nb, 4 * g + 1),               \
                         q8_##F(w, base, nb, 4 * g + 2), q8_##F(w, base, nb, 4 * g + 3));          \
    }
#define W8_OF_Q8(F) \
    __device__ __forceinline__ void w8_##F(QARGS, float* v) { qw8_to_w8(q8_##F(w, base, nb, g), v); }

Q32_OF_Q8(q4_1)
Q32_OF_Q8(q5_0)
Q32_OF_Q8(q5_1)
Q32_OF_Q8(iq4_nl)
Q32_OF_Q8(q2_k)
Q32_OF_Q8(q3_k)
Q32_OF_Q8(q5_k)
Q32_OF_Q8(iq4_xs)

QN_OF_Q32(q4_0)
QN_OF_Q32(q4_1)
QN_OF_Q32(q5_0)
QN_OF_Q32(q5_1)
QN_OF_Q32(q8_0)
QN_OF_Q32(q2_k)
QN_OF_Q32(q3_k)
QN_OF_Q32(q5_k)
QN_OF_Q32(iq4_nl)
QN_OF_Q32(iq4_xs)

W8_OF_Q8(q4_0)
W8_OF_Q8(q4_1)
W8_OF_Q8(q5_0)
W8_OF_Q8(q5_1)
W8_OF_Q8(q8_0)
W8_OF_Q8(iq4_nl)
W8_OF_Q8(q2_k)
W8_OF_Q8(q3_k)
W8_OF_Q8(q4_k)
W8_OF_Q8(q5_k)
W8_OF_Q8(q6_k)
W8_OF_Q8(iq4_xs)

// X(name) for every quantized format, and for every float one.
#define QUANT_FORMATS(X) X(q4_0) X(q4_1) X(q5_0) X(q5_1) X(q8_0) X(q2_k) X(q3_k) X(q4_k) X(q5_k) X(q6_k) X(iq4_nl) X(iq4_xs)
#define FLOAT_FORMATS(X) X(f32) X(f16) X(bf16)
