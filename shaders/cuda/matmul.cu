// Matrix products over the packed weights of quant.cuh (composed after
// common.cuh and quant.cuh): y[t, r] = dot(W[r, :], x[t, :]).
//
// Decode runs on int8 activations: quantize_q8 turns x into int8 quants
// with one scale d per 32 values and, per 16 values, (d, d * sum of the
// quants); with value_j = a * q_j + b a 16-value run contributes
//   d * (a * dot(q, xq) + b * sum(xq)),
// the dot four bytes at a time with DP4A. One warp owns a weight row and
// sweeps it front to back, lane i taking the 32-value items i, i + 32, ...;
// each item is read once for all NT tokens of the launch (several
// sequences share one pass over each weight row).

#define MV_WARPS 4

// x [rows, k] f32 to xq (k / 4 words a row) and xs (k / 16 float2 a row);
// one thread per 32 values (k a multiple of 32: the flat order is the rows').
extern "C" __global__ void quantize_q8(const float* __restrict__ x, u32 blocks, uint4* __restrict__ xq,
                                       float2* __restrict__ xs) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= blocks) return;
    const float4* src = (const float4*)(x + (u64)i * 32);
    float v[32];
    float amax = 0.0f;
#pragma unroll
    for (u32 j = 0; j < 8; j++) {
        const float4 f = src[j];
        v[4 * j] = f.x;
        v[4 * j + 1] = f.y;
        v[4 * j + 2] = f.z;
        v[4 * j + 3] = f.w;
        amax = fmaxf(amax, fmaxf(fmaxf(fabsf(f.x), fabsf(f.y)), fmaxf(fabsf(f.z), fabsf(f.w))));
    }
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    u32 words[8];
    i32 sums[2] = {0, 0};
#pragma unroll
    for (u32 j = 0; j < 8; j++) {
        u32 word = 0;
#pragma unroll
        for (u32 b = 0; b < 4; b++) {
            const i32 q = (i32)roundf(v[4 * j + b] * id);
            sums[j / 4] += q;
            word |= ((u32)q & 0xffu) << (8 * b);
        }
        words[j] = word;
    }
    xq[2 * i] = make_uint4(words[0], words[1], words[2], words[3]);
    xq[2 * i + 1] = make_uint4(words[4], words[5], words[6], words[7]);
    xs[2 * i] = make_float2(d, d * (float)sums[0]);
    xs[2 * i + 1] = make_float2(d, d * (float)sums[1]);
}

// x [rows, k] f32 to int8 as ggml's q8_K (what its K-quant and IQ4_XS dots
// take): per 256 values q = min(127, rint(-127 / max * x)), max the value
// of largest magnitude (the first of equals), d = 1 / (-127 / max); into
// the same xq / xs as quantize_q8 (every 16-value run with the block's d).
// One warp per 256 values, 8 a lane; k a multiple of 256.
extern "C" __global__ void quantize_q8_k(const float* __restrict__ x, u32 blocks, uint4* __restrict__ xq,
                                         float2* __restrict__ xs) {
    const u32 lane = threadIdx.x % WARP;
    const u32 b = blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (b >= blocks) return;
    const float4* src = (const float4*)(x + (u64)b * 256 + lane * 8);
    const float4 f0 = src[0], f1 = src[1];
    const float v[8] = {f0.x, f0.y, f0.z, f0.w, f1.x, f1.y, f1.z, f1.w};
    // The lane's first value of largest magnitude, then the warp's (lowest lane on ties).
    float amax = 0.0f, max = 0.0f;
#pragma unroll
    for (u32 j = 0; j < 8; j++)
        if (fabsf(v[j]) > amax) {
            amax = fabsf(v[j]);
            max = v[j];
        }
    u32 at = lane;
#pragma unroll
    for (int m = WARP / 2; m > 0; m >>= 1) {
        const float oa = SHFL_XOR(amax, m), om = SHFL_XOR(max, m);
        const u32 oat = SHFL_XOR(at, m);
        if (oa > amax || (oa == amax && oat < at)) {
            amax = oa;
            max = om;
            at = oat;
        }
    }
    const float iscale = amax == 0.0f ? 0.0f : -127.0f / max;
    u32 words[2] = {0, 0};
    i32 sum = 0;
#pragma unroll
    for (u32 j = 0; j < 8; j++) {
        const i32 q = min(127, (i32)rintf(iscale * v[j]));
        sum += q;
        words[j / 4] |= ((u32)q & 0xffu) << (8 * (j % 4));
    }
    const float d = amax == 0.0f ? 0.0f : 1.0f / iscale;
    // Lanes 2i and 2i + 1 hold one 16-value run.
    const i32 run = sum + SHFL_XOR(sum, 1);
    u32* q = (u32*)xq + (u64)b * 64 + lane * 2;
    q[0] = words[0];
    q[1] = words[1];
    if ((lane & 1u) == 0) xs[(u64)b * 16 + lane / 2] = make_float2(d, d * (float)run);
}

__device__ __forceinline__ i32 dot16(uint4 q, uint4 x) {
    return DP4A(q.w, x.w, DP4A(q.z, x.z, DP4A(q.y, x.y, DP4A(q.x, x.x, 0))));
}

__device__ __forceinline__ float item_dot(QW32 v, const uint4* __restrict__ xq, const float2* __restrict__ xs,
                                          u32 o) {
    const float2 s0 = xs[o], s1 = xs[o + 1];
    const float i0 = (float)dot16(v.q0, xq[o]);
    const float i1 = (float)dot16(v.q1, xq[o + 1]);
    return v.a.x * s0.x * i0 + v.a.y * s1.x * i1 + v.b.x * s0.y + v.b.y * s1.y;
}

// Launched with MV_WARPS warps a block, grid (ceil(n / MV_WARPS), ceil(m / NT)).
// U items a lane are loaded before any is used (the loads in flight that
// hide the memory latency); 2 (4 measured no faster on an H100).
#define MV_Q8_U(NAME, F, NT, U)                                                                       \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP)                                    \
        NAME(const u32* __restrict__ w, u32 row_words, u32 nb, const uint4* __restrict__ xq,         \
             const float2* __restrict__ xs, float* __restrict__ y, u32 n, u32 k, u32 m, u32 y_stride) { \
        const u32 lane = threadIdx.x % WARP;                                                          \
        const u32 row = blockIdx.x * MV_WARPS + threadIdx.x / WARP;                                   \
        const u32 tok0 = blockIdx.y * NT;                                                             \
        if (row >= n) return;                                                                         \
        const u32 base = row * row_words, items = k / 32, per_tok = k / 16;                           \
        float acc[NT];                                                                                \
        _Pragma("unroll") for (u32 t = 0; t < NT; t++) acc[t] = 0.0f;                                 \
        u32 c = lane;                                                                                 \
        for (; c + (U - 1) * WARP < items; c += U * WARP) {                                           \
            QW32 v[U];                                                                                \
            _Pragma("unroll") for (u32 u = 0; u < U; u++) v[u] = q32_##F(w, base, nb, c + u * WARP);  \
            _Pragma("unroll") for (u32 t = 0; t < NT; t++) {                                          \
                if (tok0 + t < m) {                                                                   \
                    const u32 o = (tok0 + t) * per_tok;                                               \
                    _Pragma("unroll") for (u32 u = 0; u < U; u++) acc[t] += item_dot(v[u], xq, xs, o + 2 * (c + u * WARP)); \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
        for (; c < items; c += WARP) {                                                                \
            const QW32 v = q32_##F(w, base, nb, c);                                                   \
            _Pragma("unroll") for (u32 t = 0; t < NT; t++) {                                          \
                if (tok0 + t < m) acc[t] += item_dot(v, xq, xs, (tok0 + t) * per_tok + 2 * c);        \
            }                                                                                         \
        }                                                                                             \
        _Pragma("unroll") for (u32 t = 0; t < NT; t++) {                                              \
            const float s = warp_sum(acc[t]);                                                         \
            if (lane == 0 && tok0 + t < m) y[(u64)(tok0 + t) * y_stride + row] = s;                   \
        }                                                                                             \
    }
#define MV_Q8(F, NT) MV_Q8_U(mv_q8_##F##_##NT, F, NT, 2)

// f32 activations against dequantized weights (float formats, and exact
// mode): lane i takes the 8-value groups i, i + 32, ...
#define MV_F(F, NT)                                                                                   \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP)                                    \
        mv_f_##F##_##NT(const u32* __restrict__ w, u32 row_words, u32 nb, const float* __restrict__ x, \
                        float* __restrict__ y, u32 n, u32 k, u32 m, u32 y_stride) {                  \
        const u32 lane = threadIdx.x % WARP;                                                          \
        const u32 row = blockIdx.x * MV_WARPS + threadIdx.x / WARP;                                   \
        const u32 tok0 = blockIdx.y * NT;                                                             \
        if (row >= n) return;                                                                         \
        const u32 base = row * row_words, groups = k / 8;                                             \
        float acc[NT];                                                                                \
        _Pragma("unroll") for (u32 t = 0; t < NT; t++) acc[t] = 0.0f;                                 \
        for (u32 g = lane; g < groups; g += WARP) {                                                   \
            float v[8];                                                                               \
            w8_##F(w, base, nb, g, v);                                                                \
            _Pragma("unroll") for (u32 t = 0; t < NT; t++) {                                          \
                if (tok0 + t < m) {                                                                   \
                    const float4* xr = (const float4*)(x + (u64)(tok0 + t) * k + 8 * g);              \
                    const float4 a = xr[0], b = xr[1];                                                \
                    acc[t] += v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x +       \
                              v[5] * b.y + v[6] * b.z + v[7] * b.w;                                   \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
        _Pragma("unroll") for (u32 t = 0; t < NT; t++) {                                              \
            const float s = warp_sum(acc[t]);                                                         \
            if (lane == 0 && tok0 + t < m) y[(u64)(tok0 + t) * y_stride + row] = s;                   \
        }                                                                                             \
    }

// Embedding lookup: out[t, :] = table[ids[t], :]; one thread per 8 values,
// grid (ceil(width / 8 / 128), tokens).
#define GET_ROWS(F)                                                                                    \
    extern "C" __global__ void get_rows_##F(const u32* __restrict__ w, u32 row_words, u32 nb,          \
                                            const u32* __restrict__ ids, float* __restrict__ out,      \
                                            u32 width) {                                               \
        const u32 g = blockIdx.x * blockDim.x + threadIdx.x;                                           \
        if (g >= width / 8) return;                                                                    \
        const u32 t = blockIdx.y;                                                                      \
        float v[8];                                                                                    \
        w8_##F(w, ids[t] * row_words, nb, g, v);                                                       \
        float4* o = (float4*)(out + (u64)t * width + 8 * g);                                           \
        o[0] = make_float4(v[0], v[1], v[2], v[3]);                                                    \
        o[1] = make_float4(v[4], v[5], v[6], v[7]);                                                    \
    }

// The expert products of a MoE layer, f32 activations against dequantized
// weights: pair p (a token's j-th routed expert, p = token * k + j) reads
// x row p / x_div and writes y row p from the rows of expert ids[p]
// (n rows an expert in the stacked weight). Grid (ceil(n / MV_WARPS), pairs).
#define MOE_MV(F)                                                                                     \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP)                                    \
        moe_mv_##F(const u32* __restrict__ w, u32 row_words, u32 nb, const float* __restrict__ x,     \
                   const u32* __restrict__ ids, u32 x_div, float* __restrict__ y, u32 n, u32 k,       \
                   u32 n_expert) {                                                                    \
        const u32 lane = threadIdx.x % WARP;                                                          \
        const u32 row = blockIdx.x * MV_WARPS + threadIdx.x / WARP;                                   \
        const u32 p = blockIdx.y;                                                                     \
        if (row >= n) return;                                                                         \
        const u32 e = ids[p];                                                                         \
        if (e >= n_expert) return;                                                                    \
        const u32 base = (e * n + row) * row_words, groups = k / 8;                                   \
        const float* xr = x + (u64)(p / x_div) * k;                                                   \
        float acc = 0.0f;                                                                             \
        for (u32 g = lane; g < groups; g += WARP) {                                                   \
            float v[8];                                                                               \
            w8_##F(w, base, nb, g, v);                                                                \
            const float4 a = ((const float4*)(xr + 8 * g))[0], b = ((const float4*)(xr + 8 * g))[1]; \
            acc += v[0] * a.x + v[1] * a.y + v[2] * a.z + v[3] * a.w + v[4] * b.x + v[5] * b.y +     \
                   v[6] * b.z + v[7] * b.w;                                                           \
        }                                                                                             \
        acc = warp_sum(acc);                                                                          \
        if (lane == 0) y[(u64)p * n + row] = acc;                                                     \
    }

#define MV_Q8_ALL(F) MV_Q8(F, 1) MV_Q8(F, 2) MV_Q8(F, 4) MV_Q8(F, 8)
#define MV_F_ALL(F) MV_F(F, 1) MV_F(F, 2) MV_F(F, 4) MV_F(F, 8)

QUANT_FORMATS(MV_Q8_ALL)
QUANT_FORMATS(MV_F_ALL)
FLOAT_FORMATS(MV_F_ALL)
QUANT_FORMATS(GET_ROWS)
FLOAT_FORMATS(GET_ROWS)
QUANT_FORMATS(MOE_MV)
FLOAT_FORMATS(MOE_MV)

// out[t, :] = sum_j wts[t * k + j] * y[(t * k + j), :] (the weighted sum
// of a token's expert outputs); one thread per output value.
extern "C" __global__ void moe_combine(const float* __restrict__ y, const float* __restrict__ wts,
                                       float* __restrict__ out, u32 width, u32 k, u32 total) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const u32 t = i / width, c = i % width;
    float s = 0.0f;
    for (u32 j = 0; j < k; j++) s += wts[t * k + j] * y[(u64)(t * k + j) * width + c];
    out[i] = s;
}

// ---- Prefill: int8 tensor-core tiles.
//
// y[t, r] for a tile of MM_BM tokens by MM_BN weight rows, over k in
// chunks of MM_BK values staged in shared memory: the int8 quants of x
// (quantize_q8 / quantize_q8_k) and of the weights (q32_FMT), each 16-value
// run multiplied on the tensor cores (mma m16n8k16, s8 x s8 -> s32) and
// rescaled into f32 accumulators: acc += a_w * d_x * dot + b_w * (d_x * sum x).
// 4 warps in a 2 x 2 grid, each 32 tokens x 32 rows (2 x 4 mma tiles).
// CUDA only (sm_80+): the HIP build leaves these out and multiplies
// batches with the matrix-vector kernels.

#ifndef __HIP_PLATFORM_AMD__

#define MM_BM 64
#define MM_BN 64
#define MM_BK 128
#define MM_RUNS (MM_BK / 16)
// Words of a staged row: MM_BK / 4 and one of padding (no bank conflicts).
#define MM_ROW (MM_BK / 4 + 1)

__device__ __forceinline__ void mma_s8_16x8x16(i32* c, u32 a0, u32 a1, u32 b0) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};"
                 : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
                 : "r"(a0), "r"(a1), "r"(b0));
}

#define MM_Q8(F)                                                                                       \
    extern "C" __global__ void __launch_bounds__(128)                                                 \
        mm_q8_##F(const u32* __restrict__ w, u32 row_words, u32 nb, const u32* __restrict__ xq,        \
                  const float2* __restrict__ xs, float* __restrict__ y, u32 n, u32 k, u32 m,           \
                  u32 y_stride) {                                                                     \
        __shared__ u32 sx[MM_BM * MM_ROW];                                                            \
        __shared__ u32 sw[MM_BN * MM_ROW];                                                            \
        __shared__ float2 sxs[MM_BM * MM_RUNS];                                                       \
        __shared__ float2 sab[MM_BN * MM_RUNS];                                                       \
        const u32 tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;                            \
        const u32 g = lane >> 2, tg = lane & 3u;                                                      \
        const u32 row0 = blockIdx.x * MM_BN, tok0 = blockIdx.y * MM_BM;                               \
        const u32 wm = (warp >> 1) * 32, wn = (warp & 1u) * 32;                                       \
        float acc[2][4][4];                                                                           \
        _Pragma("unroll") for (u32 i = 0; i < 2; i++)                                                 \
            _Pragma("unroll") for (u32 j = 0; j < 4; j++)                                             \
                _Pragma("unroll") for (u32 e = 0; e < 4; e++) acc[i][j][e] = 0.0f;                    \
        const u32 kw = k / 4, runs_per_tok = k / 16;                                                  \
        for (u32 k0 = 0; k0 < k; k0 += MM_BK) {                                                       \
            /* Activations: MM_BM tokens x MM_BK bytes, and their run scales. */                     \
            for (u32 i = tid; i < MM_BM * (MM_BK / 16); i += 128) {                                   \
                const u32 t = i / (MM_BK / 16), part = i % (MM_BK / 16);                              \
                uint4 v = make_uint4(0, 0, 0, 0);                                                     \
                float2 s = make_float2(0.0f, 0.0f);                                                   \
                if (tok0 + t < m && k0 + part * 16 < k) {                                             \
                    v = *(const uint4*)(xq + (u64)(tok0 + t) * kw + k0 / 4 + part * 4);               \
                    s = xs[(u64)(tok0 + t) * runs_per_tok + k0 / 16 + part];                          \
                }                                                                                     \
                u32* d = sx + t * MM_ROW + part * 4;                                                  \
                d[0] = v.x;                                                                           \
                d[1] = v.y;                                                                           \
                d[2] = v.z;                                                                           \
                d[3] = v.w;                                                                           \
                sxs[t * MM_RUNS + part] = s;                                                          \
            }                                                                                         \
            /* Weights: MM_BN rows x MM_BK / 32 items. */                                            \
            for (u32 i = tid; i < MM_BN * (MM_BK / 32); i += 128) {                                   \
                const u32 r = i % MM_BN, item = i / MM_BN;                                            \
                QW32 v;                                                                               \
                if (row0 + r < n && k0 + item * 32 < k) {                                             \
                    v = q32_##F(w, (row0 + r) * row_words, nb, k0 / 32 + item);                       \
                } else {                                                                              \
                    v.q0 = make_uint4(0, 0, 0, 0);                                                    \
                    v.q1 = v.q0;                                                                      \
                    v.a = make_float2(0.0f, 0.0f);                                                    \
                    v.b = v.a;                                                                        \
                }                                                                                     \
                u32* d = sw + r * MM_ROW + item * 8;                                                  \
                d[0] = v.q0.x;                                                                        \
                d[1] = v.q0.y;                                                                        \
                d[2] = v.q0.z;                                                                        \
                d[3] = v.q0.w;                                                                        \
                d[4] = v.q1.x;                                                                        \
                d[5] = v.q1.y;                                                                        \
                d[6] = v.q1.z;                                                                        \
                d[7] = v.q1.w;                                                                        \
                sab[r * MM_RUNS + 2 * item] = make_float2(v.a.x, v.b.x);                              \
                sab[r * MM_RUNS + 2 * item + 1] = make_float2(v.a.y, v.b.y);                          \
            }                                                                                         \
            __syncthreads();                                                                          \
            _Pragma("unroll 2") for (u32 run = 0; run < MM_RUNS; run++) {                             \
                u32 a[2][2], b[4];                                                                    \
                _Pragma("unroll") for (u32 i = 0; i < 2; i++) {                                       \
                    a[i][0] = sx[(wm + 16 * i + g) * MM_ROW + run * 4 + tg];                          \
                    a[i][1] = sx[(wm + 16 * i + g + 8) * MM_ROW + run * 4 + tg];                      \
                }                                                                                     \
                _Pragma("unroll") for (u32 j = 0; j < 4; j++) b[j] = sw[(wn + 8 * j + g) * MM_ROW + run * 4 + tg]; \
                _Pragma("unroll") for (u32 i = 0; i < 2; i++) {                                       \
                    const float2 x0 = sxs[(wm + 16 * i + g) * MM_RUNS + run];                         \
                    const float2 x1 = sxs[(wm + 16 * i + g + 8) * MM_RUNS + run];                     \
                    _Pragma("unroll") for (u32 j = 0; j < 4; j++) {                                   \
                        i32 c[4] = {0, 0, 0, 0};                                                      \
                        mma_s8_16x8x16(c, a[i][0], a[i][1], b[j]);                                    \
                        const float2 w0 = sab[(wn + 8 * j + 2 * tg) * MM_RUNS + run];                 \
                        const float2 w1 = sab[(wn + 8 * j + 2 * tg + 1) * MM_RUNS + run];             \
                        acc[i][j][0] += w0.x * x0.x * (float)c[0] + w0.y * x0.y;                      \
                        acc[i][j][1] += w1.x * x0.x * (float)c[1] + w1.y * x0.y;                      \
                        acc[i][j][2] += w0.x * x1.x * (float)c[2] + w0.y * x1.y;                      \
                        acc[i][j][3] += w1.x * x1.x * (float)c[3] + w1.y * x1.y;                      \
                    }                                                                                 \
                }                                                                                     \
            }                                                                                         \
            __syncthreads();                                                                          \
        }                                                                                             \
        _Pragma("unroll") for (u32 i = 0; i < 2; i++)                                                 \
            _Pragma("unroll") for (u32 j = 0; j < 4; j++) {                                           \
                const u32 t0 = tok0 + wm + 16 * i + g, r0 = row0 + wn + 8 * j + 2 * tg;               \
                if (t0 < m && r0 < n) y[(u64)t0 * y_stride + r0] = acc[i][j][0];                      \
                if (t0 < m && r0 + 1 < n) y[(u64)t0 * y_stride + r0 + 1] = acc[i][j][1];              \
                if (t0 + 8 < m && r0 < n) y[(u64)(t0 + 8) * y_stride + r0] = acc[i][j][2];            \
                if (t0 + 8 < m && r0 + 1 < n) y[(u64)(t0 + 8) * y_stride + r0 + 1] = acc[i][j][3];    \
            }                                                                                         \
    }

QUANT_FORMATS(MM_Q8)

#endif
