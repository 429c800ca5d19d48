// Matrix products over the packed weights of quant.cuh (composed after
// common.cuh and quant.cuh): y[t, r] = dot(W[r, :], x[t, :]).
//
// Quantized weights multiply int8 activations: quantize_q8 (or a prologue
// fused with it: the RMS norms, the GLU) turns x into int8 quants with,
// per 16 values, (d, d * sum of the quants); with value_j = a * q_j + b a
// 16-value run contributes
//   d * (a * dot(q, xq) + b * sum(xq)),
// the dot four bytes at a time with DP4A (decode) or on the tensor cores
// (prefill tiles). In decode one warp owns a weight row and sweeps it
// front to back, lane i taking the items i, i + 32, ...; each item is read
// once for all NT tokens of the launch (several sequences share one pass
// over each weight row).

#define MV_WARPS 4

// ---- Activation quantizers
//
// A warp quantizes 256 values, 8 a lane (value 8 lane + j of the chunk),
// into xq (the int8 quants, 4 a word, in the values' order) and xs (per
// 16 values, (d, d * sum of the quants)). `at` is the chunk's first value,
// `valid` whether the lane's 8 values exist (whole 32-value blocks are,
// or are not); every lane takes part in the shuffles.

__device__ __forceinline__ void load8(const float* p, float* v) {
    const float4 a = ((const float4*)p)[0], b = ((const float4*)p)[1];
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
}

__device__ __forceinline__ void store8(float* p, const float* v) {
    ((float4*)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
    ((float4*)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
}

// q8_0 / q8_1 rounding (what ggml's other dots take): per 32 values,
// d = max |x| / 127, q = round(x / d); 4 lanes a block.
__device__ __forceinline__ void q8_lane(const float* v, u64 at, bool valid, u32* __restrict__ xq,
                                        float2* __restrict__ xs) {
    const u32 lane = threadIdx.x % WARP;
    float amax = 0.0f;
#pragma unroll
    for (u32 j = 0; j < 8; j++) amax = fmaxf(amax, fabsf(v[j]));
    amax = fmaxf(amax, SHFL_XOR(amax, 1));
    amax = fmaxf(amax, SHFL_XOR(amax, 2));
    const float d = amax / 127.0f;
    const float id = d > 0.0f ? 1.0f / d : 0.0f;
    u32 words[2] = {0, 0};
    i32 sum = 0;
#pragma unroll
    for (u32 j = 0; j < 8; j++) {
        const i32 q = (i32)roundf(v[j] * id);
        sum += q;
        words[j / 4] |= ((u32)q & 0xffu) << (8 * (j % 4));
    }
    const i32 run = sum + SHFL_XOR(sum, 1);
    if (!valid) return;
    const u64 i = at + lane * 8;
    *(uint2*)(xq + i / 4) = make_uint2(words[0], words[1]);
    if ((lane & 1u) == 0) xs[i / 16] = make_float2(d, d * (float)run);
}

// q8_K rounding (ggml's K-quant and IQ4_XS dots): per 256 values
// q = min(127, rint(-127 / max * x)), max the value of largest magnitude
// (the first of equals), d = 1 / (-127 / max); every 16-value run with
// the block's d. The whole chunk must be valid.
__device__ __forceinline__ void q8k_lane(const float* v, u64 at, u32* __restrict__ xq, float2* __restrict__ xs) {
    const u32 lane = threadIdx.x % WARP;
    // The lane's first value of largest magnitude, then the warp's (lowest lane on ties).
    float amax = 0.0f, max = 0.0f;
#pragma unroll
    for (u32 j = 0; j < 8; j++)
        if (fabsf(v[j]) > amax) {
            amax = fabsf(v[j]);
            max = v[j];
        }
    u32 at_lane = lane;
#pragma unroll
    for (int m = WARP / 2; m > 0; m >>= 1) {
        const float oa = SHFL_XOR(amax, m), om = SHFL_XOR(max, m);
        const u32 oat = SHFL_XOR(at_lane, m);
        if (oa > amax || (oa == amax && oat < at_lane)) {
            amax = oa;
            max = om;
            at_lane = oat;
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
    const i32 run = sum + SHFL_XOR(sum, 1);
    const u64 i = at + lane * 8;
    *(uint2*)(xq + i / 4) = make_uint2(words[0], words[1]);
    if ((lane & 1u) == 0) xs[i / 16] = make_float2(d, d * (float)run);
}

// The lane's 8 values of chunk c (of 256) of n, quantized (per_256: q8_K).
__device__ __forceinline__ void quantize_chunk(const float* v, u64 c, u64 n, u32 per_256, u32* xq, float2* xs) {
    const u64 at = c * 256;
    if (per_256)
        q8k_lane(v, at, xq, xs);
    else
        q8_lane(v, at, at + (threadIdx.x % WARP) * 8 < n, xq, xs);
}

// n f32 values at x (a multiple of 32; of 256 with per_256) to int8: one
// warp per 256 values.
extern "C" __global__ void quantize_q8(const float* __restrict__ x, u32 n, u32 per_256, u32* __restrict__ xq,
                                       float2* __restrict__ xs) {
    const u64 c = (u64)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (c * 256 >= n) return;
    const u64 i = c * 256 + (threadIdx.x % WARP) * 8;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (i < n) load8(x + i, v);
    quantize_chunk(v, c, n, per_256, xq, xs);
}

// Prologues of the products fused with the quantizing of their output:
// x = rms_norm(a) * w (rms_norm_q8), s = a + b and x = rms_norm(s) * w
// (add_rms_norm_q8), then x to int8 as quantize_q8. One block of 256
// threads a row of `width` (a multiple of 32; of 256 with per_256): warp
// w takes the 256-value chunks w, w + 8, ..., a lane 8 values of each, so
// rows up to NORM_HELD values stay in registers between the sum of
// squares and the output (wider rows are read again).
#define NORM_SLOTS 4
#define NORM_HELD (NORM_SLOTS * 8 * 256)

template <bool ADD>
__device__ __forceinline__ void norm_q8_row(const float* a, const float* b, const float* __restrict__ w, float* s,
                                            float* x, u32 width, float eps, u32 per_256, u32* __restrict__ xq,
                                            float2* __restrict__ xs) {
    __shared__ float scratch[32];
    const u64 r = (u64)blockIdx.x * width;
    const u32 lane = threadIdx.x % WARP, wid = threadIdx.x / WARP;
    float v[NORM_SLOTS][8];
    float acc = 0.0f;
    for (u32 base = 0; base < width; base += NORM_HELD) {
        // Every load of the pass before any store (s may alias a or b).
        float t[NORM_SLOTS][8];
#pragma unroll
        for (u32 k = 0; k < NORM_SLOTS; k++) {
            const u32 i = base + (wid + 8 * k) * 256 + lane * 8;
#pragma unroll
            for (u32 j = 0; j < 8; j++) v[k][j] = t[k][j] = 0.0f;
            if (i < width) {
                load8(a + r + i, v[k]);
                if (ADD) load8(b + r + i, t[k]);
            }
        }
#pragma unroll
        for (u32 k = 0; k < NORM_SLOTS; k++) {
            const u32 i = base + (wid + 8 * k) * 256 + lane * 8;
#pragma unroll
            for (u32 j = 0; j < 8; j++) {
                if (ADD) v[k][j] += t[k][j];
                acc += v[k][j] * v[k][j];
            }
            if (ADD && i < width) store8(s + r + i, v[k]);
        }
    }
    // block_sum's barrier also makes s visible to the whole block.
    const float scale = 1.0f / sqrtf(block_sum(acc, scratch, 256) / (float)width + eps);
    const float* src = ADD ? s : a;
    for (u32 base = 0; base < width; base += NORM_HELD) {
        float g[NORM_SLOTS][8];
#pragma unroll
        for (u32 k = 0; k < NORM_SLOTS; k++) {
            const u32 i = base + (wid + 8 * k) * 256 + lane * 8;
            if (i < width) {
                if (width > NORM_HELD) load8(src + r + i, v[k]);
                load8(w + i, g[k]);
            }
        }
#pragma unroll
        for (u32 k = 0; k < NORM_SLOTS; k++) {
            const u32 c = base / 256 + wid + 8 * k, i = c * 256 + lane * 8;
            if (c * 256 >= width) break;
            if (i < width) {
#pragma unroll
                for (u32 j = 0; j < 8; j++) v[k][j] = (v[k][j] * scale) * g[k][j];
                store8(x + r + i, v[k]);
            } else {
#pragma unroll
                for (u32 j = 0; j < 8; j++) v[k][j] = 0.0f;
            }
            // Chunks are 256 values of the row: rows of a multiple of 256
            // make them the flat chunks of quantize_q8; other widths take
            // q8 blocks, which never straddle a row.
            if (per_256)
                q8k_lane(v[k], r + c * 256, xq, xs);
            else
                q8_lane(v[k], r + c * 256, i < width, xq, xs);
        }
    }
}

extern "C" __global__ void __launch_bounds__(256) rms_norm_q8(const float* a, const float* __restrict__ w, float* x,
                                                              u32 width, float eps, u32 per_256,
                                                              u32* __restrict__ xq, float2* __restrict__ xs) {
    norm_q8_row<false>(a, nullptr, w, nullptr, x, width, eps, per_256, xq, xs);
}

extern "C" __global__ void __launch_bounds__(256) add_rms_norm_q8(const float* a, const float* b,
                                                                  const float* __restrict__ w, float* s, float* x,
                                                                  u32 width, float eps, u32 per_256,
                                                                  u32* __restrict__ xq, float2* __restrict__ xs) {
    norm_q8_row<true>(a, b, w, s, x, width, eps, per_256, xq, xs);
}

__device__ __forceinline__ float silu_mul_q(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// ggml's CPU geglu (as rowops.cu's gelu_mul).
__device__ __forceinline__ float gelu_mul_q(float x, float u) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x * u;
    const float h = f16_f32(f32_f16(x));
    const float g = 0.5f * h * (1.0f + tanhf(0.7978846f * h * (1.0f + 0.044715f * h * h)));
    return f16_f32(f32_f16(g)) * u;
}

// x = act(g) * u over n values (Prologue::Glu), then x to int8 as
// quantize_q8; one warp per 256 values. gelu: GELU (tanh) else SiLU.
extern "C" __global__ void glu_q8(const float* __restrict__ g, const float* __restrict__ u, float* x, u32 n,
                                  u32 gelu, u32 per_256, u32* __restrict__ xq, float2* __restrict__ xs) {
    const u64 c = (u64)blockIdx.x * (blockDim.x / WARP) + threadIdx.x / WARP;
    if (c * 256 >= n) return;
    const u64 i = c * 256 + (threadIdx.x % WARP) * 8;
    float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    if (i < n) {
        float a[8], b[8];
        load8(g + i, a);
        load8(u + i, b);
#pragma unroll
        for (u32 j = 0; j < 8; j++) v[j] = gelu ? gelu_mul_q(a[j], b[j]) : silu_mul_q(a[j], b[j]);
        store8(x + i, v);
    }
    quantize_chunk(v, c, n, per_256, xq, xs);
}

// ---- Decode: matrix-vector products on int8 activations

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

// Up to three products of one format over the same activations in one
// launch (q | k | v, gate | up): rows [0, e0) of the launch are w0's, rows
// [e0, e1) w1's, [e1, e2) w2's; y_i is [m, rows of w_i].
//
// The grid is as many blocks of MV_WARPS warps as the device holds at
// once (or fewer), grid.y = ceil(m / NT); warp j of the grid takes rows
// j, j + warps, ... in units of U items a lane (QN_F runs of 32 values
// each), and loads the next unit before it multiplies the current one,
// so a warp always has loads in flight (the memory latency hidden behind
// the arithmetic, and no gap between rows).
#define MV_ROW(AT) ((AT) < e0 ? (AT) : (AT) < e1 ? (AT) - e0 : (AT) - e1)
#define MV_W(AT) ((AT) < e0 ? w0 : (AT) < e1 ? w1 : w2)
#define MV_LOAD(F, U, V, AT, IT)                                                                      \
    {                                                                                                 \
        const u32* __restrict__ wp = MV_W(AT);                                                        \
        const u32 rb = MV_ROW(AT) * row_words, c0 = (IT) * (U * WARP) + lane;                         \
        /* Past the row's end a lane loads its last item again (unused): */                          \
        /* unconditional loads stay in registers. */                                                  \
        _Pragma("unroll") for (u32 u = 0; u < U; u++) qn_##F(wp, rb, nb, min(c0 + u * WARP, items - 1), V[u]); \
    }
#define MV_ARGS                                                                                       \
    const u32 *__restrict__ w0, const u32 *__restrict__ w1, const u32 *__restrict__ w2, u32 e0, u32 e1, \
        u32 e2, u32 row_words, u32 nb, const uint4 *__restrict__ xq, const float2 *__restrict__ xs,  \
        float *__restrict__ y0, float *__restrict__ y1, float *__restrict__ y2, u32 k, u32 m
#define MV_DOTS(F, U, V, IT)                                                                          \
    {                                                                                                 \
        const u32 c0 = (IT) * (U * WARP) + lane;                                                      \
        _Pragma("unroll") for (u32 t = 0; t < NTOK; t++) {                                              \
            if (tok0 + t < m) {                                                                       \
                const u32 o = (tok0 + t) * per_tok;                                                   \
                _Pragma("unroll") for (u32 u = 0; u < U; u++) if (c0 + u * WARP < items)              \
                    _Pragma("unroll") for (u32 j = 0; j < QN_##F; j++)                                \
                        acc[t] += item_dot(V[u][j], xq, xs, o + 2 * ((c0 + u * WARP) * QN_##F + j));  \
            }                                                                                         \
        }                                                                                             \
    }
#define MV_STORE(AT)                                                                                  \
    {                                                                                                 \
        float* __restrict__ yp = (AT) < e0 ? y0 : (AT) < e1 ? y1 : y2;                                \
        const u32 n = (AT) < e0 ? e0 : (AT) < e1 ? e1 - e0 : e2 - e1;                                 \
        _Pragma("unroll") for (u32 t = 0; t < NTOK; t++) {                                              \
            const float s = warp_sum(acc[t]);                                                         \
            if (lane == 0 && tok0 + t < m) yp[(u64)(tok0 + t) * n + MV_ROW(AT)] = s;                  \
            acc[t] = 0.0f;                                                                            \
        }                                                                                             \
    }

#define MV_Q8_U(NAME, F, NT, U)                                                                       \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP, 1) NAME(MV_ARGS) {                  \
        constexpr u32 NTOK = NT;                                                                      \
        const u32 lane = threadIdx.x % WARP, warps = gridDim.x * MV_WARPS;                            \
        const u32 tok0 = blockIdx.y * NT;                                                             \
        const u32 items = k / (32 * QN_##F), per_tok = k / 16, iters = (items + U * WARP - 1) / (U * WARP); \
        u32 at = blockIdx.x * MV_WARPS + threadIdx.x / WARP, it = 0;                                  \
        if (at >= e2) return;                                                                         \
        float acc[NT];                                                                                \
        _Pragma("unroll") for (u32 t = 0; t < NT; t++) acc[t] = 0.0f;                                 \
        QW32 v[U][QN_##F];                                                                            \
        MV_LOAD(F, U, v, at, 0)                                                                       \
        for (;;) {                                                                                    \
            u32 nat = at, nit = it + 1;                                                               \
            if (nit == iters) {                                                                       \
                nit = 0;                                                                              \
                nat += warps;                                                                         \
            }                                                                                         \
            const bool more = nat < e2;                                                               \
            QW32 nx[U][QN_##F];                                                                       \
            /* The next unit (the current one again after the last). */                               \
            MV_LOAD(F, U, nx, more ? nat : at, more ? nit : it)                                      \
            MV_DOTS(F, U, v, it)                                                                      \
            if (nit == 0) MV_STORE(at)                                                                \
            if (!more) break;                                                                         \
            _Pragma("unroll") for (u32 u = 0; u < U; u++)                                             \
                _Pragma("unroll") for (u32 j = 0; j < QN_##F; j++) v[u][j] = nx[u][j];                \
            at = nat;                                                                                 \
            it = nit;                                                                                 \
        }                                                                                             \
    }
// One item a lane a unit: with the prefetch, two are in flight.
#define MV_U(F) 1
#define MV_Q8(F, NT) MV_Q8_U(mv_q8_##F##_##NT, F, NT, MV_U(F))

// R rows a warp (mvr): warp j of a grid of every row takes rows R j ..
// R j + R - 1 and sweeps them together, lane i the items i, i + 32, ...,
// U items a step: each activation load serves R rows (the loads of the
// activations, not of the weights, are what the L1 spends its cycles on
// with one row a warp), and R U weight items are in flight a lane.
#define MVR_Q8_U(NAME, F, NT, R, U)                                                                   \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP, 1) NAME(MV_ARGS) {                     \
        constexpr u32 QN = QN_##F;                                                                    \
        const u32 lane = threadIdx.x % WARP, tok0 = blockIdx.y * NT;                                  \
        const u32 items = k / (32 * QN), per_tok = k / 16;                                            \
        const u32 first = (blockIdx.x * MV_WARPS + threadIdx.x / WARP) * R;                           \
        if (first >= e2) return;                                                                      \
        const u32* __restrict__ wr[R];                                                                \
        u32 rb[R];                                                                                    \
        _Pragma("unroll") for (u32 r = 0; r < R; r++) {                                               \
            /* Rows past the end read the last row again (dropped at the store). */                  \
            const u32 at = min(first + r, e2 - 1);                                                    \
            wr[r] = MV_W(at);                                                                         \
            rb[r] = MV_ROW(at) * row_words;                                                           \
        }                                                                                             \
        float acc[R][NT];                                                                             \
        _Pragma("unroll") for (u32 r = 0; r < R; r++)                                                 \
            _Pragma("unroll") for (u32 t = 0; t < NT; t++) acc[r][t] = 0.0f;                          \
        for (u32 c0 = lane; c0 < items; c0 += U * WARP) {                                             \
            QW32 v[U][R][QN];                                                                         \
            _Pragma("unroll") for (u32 u = 0; u < U; u++)                                             \
                _Pragma("unroll") for (u32 r = 0; r < R; r++)                                         \
                    qn_##F(wr[r], rb[r], nb, min(c0 + u * WARP, items - 1), v[u][r]);                 \
            _Pragma("unroll") for (u32 u = 0; u < U; u++) {                                           \
                const u32 c = c0 + u * WARP;                                                          \
                _Pragma("unroll") for (u32 t = 0; t < NT; t++) {                                      \
                    if (c >= items || tok0 + t >= m) continue;                                        \
                    const u32 o = (tok0 + t) * per_tok + 2 * c * QN;                                  \
                    _Pragma("unroll") for (u32 j = 0; j < QN; j++) {                                  \
                        const uint4 x0 = xq[o + 2 * j], x1 = xq[o + 2 * j + 1];                       \
                        const float2 s0 = xs[o + 2 * j], s1 = xs[o + 2 * j + 1];                      \
                        _Pragma("unroll") for (u32 r = 0; r < R; r++) {                               \
                            const QW32 q = v[u][r][j];                                                \
                            acc[r][t] += q.a.x * s0.x * (float)dot16(q.q0, x0) +                      \
                                         q.a.y * s1.x * (float)dot16(q.q1, x1) + q.b.x * s0.y + q.b.y * s1.y; \
                        }                                                                             \
                    }                                                                                 \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
        _Pragma("unroll") for (u32 r = 0; r < R; r++) {                                               \
            const u32 at = first + r;                                                                 \
            if (at >= e2) continue;                                                                   \
            float* __restrict__ yp = at < e0 ? y0 : at < e1 ? y1 : y2;                                \
            const u32 n = at < e0 ? e0 : at < e1 ? e1 - e0 : e2 - e1;                                 \
            _Pragma("unroll") for (u32 t = 0; t < NT; t++) {                                          \
                const float s = warp_sum(acc[r][t]);                                                  \
                if (lane == 0 && tok0 + t < m) yp[(u64)(tok0 + t) * n + MV_ROW(at)] = s;              \
            }                                                                                         \
        }                                                                                             \
    }
#define MVR_Q8(F, NT, R) MVR_Q8_U(mvr_q8_##F##_##NT##_##R, F, NT, R, 1)

// f32 activations against dequantized weights (float formats, and exact
// mode): lane i takes the 8-value groups i, i + 32, ...
#define MV_F(F, NT)                                                                                   \
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP, 1)                                  \
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
    extern "C" __global__ void __launch_bounds__(MV_WARPS * WARP, 1)                                  \
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
#define MVR_ALL(F)                                                                                    \
    MVR_Q8(F, 1, 1) MVR_Q8(F, 1, 2) MVR_Q8(F, 1, 4) MVR_Q8(F, 2, 1) MVR_Q8(F, 2, 2) MVR_Q8(F, 4, 1)      \
    MVR_Q8(F, 4, 2) MVR_Q8(F, 8, 1) MVR_Q8(F, 8, 2)
QUANT_FORMATS(MVR_ALL)
#ifdef HEARTH_MV_VARIANTS
// scripts/mv-bench.cu's: two items a lane a step.
#define MVR_U2(F) MVR_Q8_U(mvr_q8_##F##_1_1_u2, F, 1, 1, 2) MVR_Q8_U(mvr_q8_##F##_1_2_u2, F, 1, 2, 2)
MVR_U2(q4_k) MVR_U2(q6_k) MVR_U2(q4_0) MVR_U2(q8_0)
#endif
QUANT_FORMATS(MV_F_ALL)
FLOAT_FORMATS(MV_F_ALL)
QUANT_FORMATS(GET_ROWS)
FLOAT_FORMATS(GET_ROWS)
QUANT_FORMATS(MOE_MV)
FLOAT_FORMATS(MOE_MV)

// out[t, :] = sum_j wts[t * k + j] * y[(t * k + j), :] (the weighted sum
// of a token's expert outputs) over the pairs whose expert is on this
// device (ids at or past n_expert are computed elsewhere and left out);
// one thread per output value.
extern "C" __global__ void moe_combine(const float* __restrict__ y, const float* __restrict__ wts,
                                       const u32* __restrict__ ids, float* __restrict__ out, u32 width,
                                       u32 k, u32 total, u32 n_expert) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= total) return;
    const u32 t = i / width, c = i % width;
    float s = 0.0f;
    for (u32 j = 0; j < k; j++)
        if (ids[t * k + j] < n_expert) s += wts[t * k + j] * y[(u64)(t * k + j) * width + c];
    out[i] = s;
}

// ---- Prefill: int8 tensor-core tiles.
//
// y[t, r] for a tile of MM_BM tokens by MM_BN weight rows, over k in
// chunks of MM_BK values staged in shared memory: the int8 quants of x
// (quantize_q8 and the fused prologues) and of the weights (q32_FMT), each 16-value
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

// ---- Batched decode: a few tokens on the int8 tensor cores.
//
// y[t, r] for up to MQ_BM (16) tokens by MQ_BN weight rows a block, the
// tokens one mma tile (m16n8k16, s8 x s8 -> s32), so every weight is read
// once for all of them (the matrix-vector kernels take 8 tokens a pass,
// bound by their activation loads). k in stages of MQ_KC values: each
// thread decodes two 32-value items of a row (q32_FMT) into shared memory
// and loads a share of the activations, the next stage's loads in flight
// (registers) while the warps multiply this one; warp w takes the runs
// 4w ... 4w + 3 of a stage for all MQ_BN rows, and the four warps' sums
// meet in shared memory at the end. Split-k (grid.z): each split takes a
// run of stages and, with more than one, writes its partial sums to
// `part` [split][token][row] for mq_reduce.

#define MQ_BM 16
#define MQ_BN 32
#define MQ_KC 256
#define MQ_ITEMS (MQ_KC / 32)
#define MQ_RUNS (MQ_KC / 16)
// Words of a staged row: MQ_KC / 4 and 4 of padding (conflict-free reads).
#define MQ_ROW (MQ_KC / 4 + 4)

// A stage in shared memory; the scales run-major ([run][row], [run][token]),
// so the lanes of a warp read them from distinct banks.
struct MqStage {
    u32 w[MQ_BN * MQ_ROW];
    float2 ab[MQ_RUNS * MQ_BN];
    u32 x[MQ_BM * MQ_ROW];
    float2 xs[MQ_RUNS * MQ_BM];
};

#define MQ_Q8(F)                                                                                       \
    extern "C" __global__ void __launch_bounds__(128)                                                 \
        mq_q8_##F(const u32* __restrict__ w, u32 row_words, u32 nb, const u32* __restrict__ xq,        \
                  const float2* __restrict__ xs, float* __restrict__ y, float* __restrict__ part,      \
                  u32 n, u32 k, u32 m, u32 y_stride, u32 stages_per_split) {                          \
        __shared__ __align__(16) MqStage st[2];                                                       \
        const u32 tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;                            \
        const u32 g = lane >> 2, tg = lane & 3u;                                                      \
        const u32 row0 = blockIdx.x * MQ_BN, tok0 = blockIdx.y * MQ_BM, split = blockIdx.z;          \
        const u32 stages = (k + MQ_KC - 1) / MQ_KC;                                                   \
        const u32 s_begin = split * stages_per_split;                                                 \
        const u32 s_end = min(stages, s_begin + stages_per_split);                                    \
        const u32 kw = k / 4, runs_per_tok = k / 16;                                                  \
        /* Thread tid: items tid and tid + 128 (row i / MQ_ITEMS, item i % MQ_ITEMS: a row's  */     \
        /* items side by side in memory), 16 activation bytes and a pair of run scales twice. */     \
        QW32 wv[2];                                                                                   \
        uint4 xv[2];                                                                                  \
        float4 sv;                                                                                    \
        auto fetch = [&](u32 s) {                                                                     \
            _Pragma("unroll") for (u32 h = 0; h < 2; h++) {                                           \
                const u32 i = tid + 128 * h, r = i / MQ_ITEMS, c = s * MQ_ITEMS + i % MQ_ITEMS;       \
                if (row0 + r < n && c * 32 < k) {                                                     \
                    wv[h] = q32_##F(w, (row0 + r) * row_words, nb, c);                                \
                } else {                                                                              \
                    wv[h].q0 = make_uint4(0, 0, 0, 0);                                                \
                    wv[h].q1 = wv[h].q0;                                                              \
                    wv[h].a = make_float2(0.0f, 0.0f);                                                \
                    wv[h].b = wv[h].a;                                                                \
                }                                                                                     \
                const u32 t = i / (MQ_KC / 16), part16 = i % (MQ_KC / 16);                            \
                const u32 kk = s * MQ_KC + part16 * 16;                                               \
                xv[h] = tok0 + t < m && kk < k ? *(const uint4*)(xq + (u64)(tok0 + t) * kw + kk / 4)  \
                                               : make_uint4(0, 0, 0, 0);                              \
            }                                                                                         \
            const u32 t = tid / (MQ_RUNS / 2), run = s * MQ_RUNS + (tid % (MQ_RUNS / 2)) * 2;         \
            sv = tok0 + t < m && run * 16 < k                                                         \
                     ? *(const float4*)(xs + (u64)(tok0 + t) * runs_per_tok + run)                    \
                     : make_float4(0.0f, 0.0f, 0.0f, 0.0f);                                           \
        };                                                                                            \
        auto stash = [&](MqStage& b) {                                                                \
            _Pragma("unroll") for (u32 h = 0; h < 2; h++) {                                           \
                const u32 i = tid + 128 * h, r = i / MQ_ITEMS, c = i % MQ_ITEMS;                      \
                *(uint4*)&b.w[r * MQ_ROW + c * 8] = wv[h].q0;                                         \
                *(uint4*)&b.w[r * MQ_ROW + c * 8 + 4] = wv[h].q1;                                     \
                b.ab[(2 * c) * MQ_BN + r] = make_float2(wv[h].a.x, wv[h].b.x);                        \
                b.ab[(2 * c + 1) * MQ_BN + r] = make_float2(wv[h].a.y, wv[h].b.y);                    \
                const u32 t = i / (MQ_KC / 16), part16 = i % (MQ_KC / 16);                            \
                *(uint4*)&b.x[t * MQ_ROW + part16 * 4] = xv[h];                                       \
            }                                                                                         \
            const u32 t = tid / (MQ_RUNS / 2), run = (tid % (MQ_RUNS / 2)) * 2;                       \
            b.xs[run * MQ_BM + t] = make_float2(sv.x, sv.y);                                          \
            b.xs[(run + 1) * MQ_BM + t] = make_float2(sv.z, sv.w);                                    \
        };                                                                                            \
        float acc[4][4];                                                                              \
        _Pragma("unroll") for (u32 j = 0; j < 4; j++)                                                 \
            _Pragma("unroll") for (u32 e = 0; e < 4; e++) acc[j][e] = 0.0f;                           \
        if (s_begin < s_end) fetch(s_begin);                                                          \
        for (u32 s = s_begin; s < s_end; s++) {                                                       \
            /* Buffer s % 2 was last read two stages ago; the barrier of the stage between */        \
            /* has every warp past it. */                                                             \
            MqStage& b = st[s & 1u];                                                                  \
            stash(b);                                                                                 \
            __syncthreads();                                                                          \
            if (s + 1 < s_end) fetch(s + 1);                                                          \
            _Pragma("unroll") for (u32 q = 0; q < MQ_RUNS / 4; q++) {                                 \
                const u32 run = warp * (MQ_RUNS / 4) + q;                                             \
                const u32 a0 = b.x[g * MQ_ROW + run * 4 + tg];                                        \
                const u32 a1 = b.x[(g + 8) * MQ_ROW + run * 4 + tg];                                  \
                const float2 x0 = b.xs[run * MQ_BM + g], x1 = b.xs[run * MQ_BM + g + 8];              \
                _Pragma("unroll") for (u32 j = 0; j < 4; j++) {                                       \
                    i32 c[4] = {0, 0, 0, 0};                                                          \
                    mma_s8_16x8x16(c, a0, a1, b.w[(8 * j + g) * MQ_ROW + run * 4 + tg]);              \
                    const float2 w0 = b.ab[run * MQ_BN + 8 * j + 2 * tg];                             \
                    const float2 w1 = b.ab[run * MQ_BN + 8 * j + 2 * tg + 1];                         \
                    acc[j][0] += w0.x * x0.x * (float)c[0] + w0.y * x0.y;                             \
                    acc[j][1] += w1.x * x0.x * (float)c[1] + w1.y * x0.y;                             \
                    acc[j][2] += w0.x * x1.x * (float)c[2] + w0.y * x1.y;                             \
                    acc[j][3] += w1.x * x1.x * (float)c[3] + w1.y * x1.y;                             \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
        /* The warps' sums through shared memory (the stages are done with). */                      \
        __syncthreads();                                                                              \
        float* red = (float*)st;                                                                      \
        _Pragma("unroll") for (u32 j = 0; j < 4; j++)                                                 \
            _Pragma("unroll") for (u32 e = 0; e < 4; e++) red[(warp * 16 + j * 4 + e) * WARP + lane] = acc[j][e]; \
        __syncthreads();                                                                              \
        if (warp == 0) {                                                                              \
            const bool direct = gridDim.z == 1;                                                       \
            _Pragma("unroll") for (u32 j = 0; j < 4; j++)                                             \
                _Pragma("unroll") for (u32 e = 0; e < 4; e++) {                                       \
                    float v = 0.0f;                                                                   \
                    _Pragma("unroll") for (u32 q = 0; q < 4; q++) v += red[(q * 16 + j * 4 + e) * WARP + lane]; \
                    const u32 t = tok0 + g + 8 * (e >> 1), r = row0 + 8 * j + 2 * tg + (e & 1u);      \
                    if (t < m && r < n) {                                                             \
                        if (direct) y[(u64)t * y_stride + r] = v;                                     \
                        else part[((u64)split * m + t) * n + r] = v;                                  \
                    }                                                                                 \
                }                                                                                     \
        }                                                                                             \
    }

QUANT_FORMATS(MQ_Q8)

// y[t, r] = sum over the splits of mq_q8's partial sums.
extern "C" __global__ void mq_reduce(const float* __restrict__ part, float* __restrict__ y, u32 n, u32 m,
                                     u32 y_stride, u32 splits) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n * m) return;
    const u32 t = i / n, r = i % n;
    float v = 0.0f;
    for (u32 s = 0; s < splits; s++) v += part[((u64)s * m + t) * n + r];
    y[(u64)t * y_stride + r] = v;
}

// ---- Prefill on f16 tensor cores.
//
// y[t, r] over tiles of MF_BM tokens by MF_BN weight rows, k in steps of
// MF_BK: the activations as f16 (to_f16), the weights dequantized (w8_FMT)
// to f16 into shared memory, multiplied with mma m16n8k16 (f16 x f16 ->
// f32). No per-run rescaling: the scales are in the dequantized values.
// 8 warps, 2 (tokens) x 4 (rows), each 64 x 32 of the tile. The next
// step's activations (cp.async) and weights (in registers) load while the
// current one multiplies. k a multiple of MF_BK.

#define MF_BM 128
#define MF_BN 128
#define MF_BK 32
// Halves of a staged row: MF_BK and 8 of padding (conflict-free ldmatrix).
#define MF_ROW (MF_BK + 8)

// x [n] f32 to f16 (n a multiple of 8): 8 values a thread.
extern "C" __global__ void to_f16(const float* __restrict__ x, uint4* __restrict__ out, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i * 8 >= n) return;
    float v[8];
    load8(x + (u64)i * 8, v);
    out[i] = make_uint4(f16x2_of(v[0], v[1]), f16x2_of(v[2], v[3]), f16x2_of(v[4], v[5]), f16x2_of(v[6], v[7]));
}

#define MF_F16(F)                                                                                      \
    extern "C" __global__ void __launch_bounds__(256, 1)                                             \
        mm_f16_##F(const u32* __restrict__ w, u32 row_words, u32 nb, const u16* __restrict__ xh,       \
                   float* __restrict__ y, u32 n, u32 k, u32 m, u32 y_stride) {                        \
        __shared__ __align__(16) u16 sa[2][MF_BM * MF_ROW];                                           \
        __shared__ __align__(16) u16 sb[2][MF_BN * MF_ROW];                                           \
        const u32 tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;                            \
        const u32 row0 = blockIdx.x * MF_BN, tok0 = blockIdx.y * MF_BM;                               \
        const u32 wm = (warp >> 2) * 64, wn = (warp & 3u) * 32;                                       \
        float acc[4][4][4];                                                                           \
        _Pragma("unroll") for (u32 i = 0; i < 4; i++)                                                 \
            _Pragma("unroll") for (u32 j = 0; j < 4; j++)                                             \
                _Pragma("unroll") for (u32 e = 0; e < 4; e++) acc[i][j][e] = 0.0f;                    \
        /* Thread tid stages 16-byte pieces tid and tid + 256 of each tile: */                       \
        /* row p / 4, values 8 (p % 4) ... */                                                         \
        const u32 steps = k / MF_BK;                                                                  \
        uint4 wv[2];                                                                                  \
        auto load_a = [&](u32 ks, u32 buf) {                                                          \
            _Pragma("unroll") for (u32 h = 0; h < 2; h++) {                                           \
                const u32 p = tid + h * 256, r = p / 4, c = (p % 4) * 8;                              \
                const bool ok = tok0 + r < m;                                                         \
                const u16* src = xh + (u64)(ok ? tok0 + r : 0) * k + ks * MF_BK + c;                  \
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(&sa[buf][r * MF_ROW + c])), \
                             "l"(src), "r"(ok ? 16 : 0));                                             \
            }                                                                                         \
            asm volatile("cp.async.commit_group;");                                                   \
        };                                                                                            \
        auto load_w = [&](u32 ks) {                                                                   \
            _Pragma("unroll") for (u32 h = 0; h < 2; h++) {                                           \
                const u32 p = tid + h * 256, r = p / 4, g = ks * (MF_BK / 8) + p % 4;                 \
                float v[8] = {0, 0, 0, 0, 0, 0, 0, 0};                                                \
                if (row0 + r < n) w8_##F(w, (row0 + r) * row_words, nb, g, v);                       \
                wv[h] = make_uint4(f16x2_of(v[0], v[1]), f16x2_of(v[2], v[3]), f16x2_of(v[4], v[5]),  \
                                   f16x2_of(v[6], v[7]));                                             \
            }                                                                                         \
        };                                                                                            \
        auto store_w = [&](u32 buf) {                                                                 \
            _Pragma("unroll") for (u32 h = 0; h < 2; h++) {                                           \
                const u32 p = tid + h * 256, r = p / 4, c = (p % 4) * 8;                              \
                *(uint4*)&sb[buf][r * MF_ROW + c] = wv[h];                                            \
            }                                                                                         \
        };                                                                                            \
        load_a(0, 0);                                                                                 \
        load_w(0);                                                                                    \
        store_w(0);                                                                                   \
        asm volatile("cp.async.wait_all;");                                                           \
        __syncthreads();                                                                              \
        for (u32 ks = 0; ks < steps; ks++) {                                                          \
            const u32 cur = ks & 1u;                                                                  \
            if (ks + 1 < steps) {                                                                     \
                load_a(ks + 1, cur ^ 1u);                                                             \
                load_w(ks + 1);                                                                       \
            }                                                                                         \
            _Pragma("unroll") for (u32 kk = 0; kk < MF_BK; kk += 16) {                                \
                u32 a[4][4], b[4][2];                                                                 \
                _Pragma("unroll") for (u32 i = 0; i < 4; i++) {                                       \
                    const u32 r = wm + 16 * i + (lane % 16), c = kk + (lane / 16) * 8;                \
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"   \
                                 : "=r"(a[i][0]), "=r"(a[i][1]), "=r"(a[i][2]), "=r"(a[i][3])         \
                                 : "r"(smem_addr(&sa[cur][r * MF_ROW + c])));                         \
                }                                                                                     \
                _Pragma("unroll") for (u32 j = 0; j < 4; j += 2) {                                    \
                    const u32 r = wn + 8 * j + (lane % 8) + (lane / 16) * 8, c = kk + ((lane / 8) % 2) * 8; \
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"   \
                                 : "=r"(b[j][0]), "=r"(b[j][1]), "=r"(b[j + 1][0]), "=r"(b[j + 1][1]) \
                                 : "r"(smem_addr(&sb[cur][r * MF_ROW + c])));                         \
                }                                                                                     \
                _Pragma("unroll") for (u32 i = 0; i < 4; i++)                                         \
                    _Pragma("unroll") for (u32 j = 0; j < 4; j++)                                     \
                        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, " \
                                     "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"                   \
                                     : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]),    \
                                       "+f"(acc[i][j][3])                                              \
                                     : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]),        \
                                       "r"(b[j][0]), "r"(b[j][1]));                                    \
            }                                                                                         \
            if (ks + 1 < steps) {                                                                     \
                store_w(cur ^ 1u);                                                                    \
                asm volatile("cp.async.wait_all;");                                                   \
            }                                                                                         \
            __syncthreads();                                                                          \
        }                                                                                             \
        const u32 g = lane >> 2, tg = lane & 3u;                                                      \
        _Pragma("unroll") for (u32 i = 0; i < 4; i++)                                                 \
            _Pragma("unroll") for (u32 j = 0; j < 4; j++) {                                           \
                const u32 t0 = tok0 + wm + 16 * i + g, r0 = row0 + wn + 8 * j + 2 * tg;               \
                if (t0 < m && r0 < n) y[(u64)t0 * y_stride + r0] = acc[i][j][0];                      \
                if (t0 < m && r0 + 1 < n) y[(u64)t0 * y_stride + r0 + 1] = acc[i][j][1];              \
                if (t0 + 8 < m && r0 < n) y[(u64)(t0 + 8) * y_stride + r0] = acc[i][j][2];            \
                if (t0 + 8 < m && r0 + 1 < n) y[(u64)(t0 + 8) * y_stride + r0 + 1] = acc[i][j][3];    \
            }                                                                                         \
    }

QUANT_FORMATS(MF_F16)
FLOAT_FORMATS(MF_F16)

// ---- Prefill of many tokens: the weight dequantized to f16 once
//
// dequant_f16_FMT writes a weight as f16 rows ([rows, k], one thread per
// 8 values); mm_h16 then multiplies f16 activations [m, k] against them,
// both operands staged by cp.async through MH_STAGES buffers of shared
// memory (the loads of MH_STAGES - 1 steps in flight behind the current
// one's products), with the warps and fragments of mm_f16. Blocks run
// the token tiles of a weight tile side by side (grid.x the token
// tiles), so a tile of the weight is read from memory about once.

#define MH_STAGES 4
#define MH_ROW MF_ROW
// Dynamic shared memory of mm_h16, in bytes.
#define MH_SMEM (MH_STAGES * (MF_BM + MF_BN) * MH_ROW * 2)

#define DEQUANT_F16(F)                                                                                 \
    extern "C" __global__ void dequant_f16_##F(const u32* __restrict__ w, u32 row_words, u32 nb,        \
                                               uint4* __restrict__ out, u32 rows, u32 k) {              \
        const u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;                                      \
        const u32 groups = k / 8;                                                                      \
        if (i >= (u64)rows * groups) return;                                                           \
        const u32 r = (u32)(i / groups), g = (u32)(i % groups);                                        \
        float v[8];                                                                                    \
        w8_##F(w, r * row_words, nb, g, v);                                                            \
        out[i] = make_uint4(f16x2_of(v[0], v[1]), f16x2_of(v[2], v[3]), f16x2_of(v[4], v[5]),          \
                            f16x2_of(v[6], v[7]));                                                     \
    }

QUANT_FORMATS(DEQUANT_F16)
FLOAT_FORMATS(DEQUANT_F16)

extern "C" __global__ void __launch_bounds__(256, 1)
    mm_h16(const u16* __restrict__ xh, const u16* __restrict__ wh, float* __restrict__ y, u32 n, u32 k, u32 m,
           u32 y_stride) {
    extern __shared__ __align__(16) u16 smem[];
    u16* const sa = smem;
    u16* const sb = smem + MH_STAGES * MF_BM * MH_ROW;
    const u32 tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const u32 tok0 = blockIdx.x * MF_BM, row0 = blockIdx.y * MF_BN;
    const u32 wm = (warp >> 2) * 64, wn = (warp & 3u) * 32;
    float acc[4][4][4];
#pragma unroll
    for (u32 i = 0; i < 4; i++)
#pragma unroll
        for (u32 j = 0; j < 4; j++)
#pragma unroll
            for (u32 e = 0; e < 4; e++) acc[i][j][e] = 0.0f;
    const u32 steps = k / MF_BK;
    // Thread tid stages 16-byte pieces tid and tid + 256 of each tile: row
    // p / 4, values 8 (p % 4) ...; rows past the end read zeros.
    auto load = [&](u32 ks, u32 buf) {
#pragma unroll
        for (u32 h = 0; h < 2; h++) {
            const u32 p = tid + h * 256, r = p / 4, c = (p % 4) * 8;
            const bool ta = tok0 + r < m, tb = row0 + r < n;
            const u16* a = xh + (u64)(ta ? tok0 + r : 0) * k + ks * MF_BK + c;
            const u16* b = wh + (u64)(tb ? row0 + r : 0) * k + ks * MF_BK + c;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(
                             smem_addr(&sa[(buf * MF_BM + r) * MH_ROW + c])),
                         "l"(a), "r"(ta ? 16 : 0));
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(
                             smem_addr(&sb[(buf * MF_BN + r) * MH_ROW + c])),
                         "l"(b), "r"(tb ? 16 : 0));
        }
    };
#pragma unroll
    for (u32 s = 0; s + 1 < MH_STAGES; s++) {
        if (s < steps) load(s, s);
        asm volatile("cp.async.commit_group;");
    }
    for (u32 ks = 0; ks < steps; ks++) {
        // Step ks's group is done (at most MH_STAGES - 2 younger ones
        // pending), and every warp is past step ks - 1, whose buffer the
        // next load takes.
        asm volatile("cp.async.wait_group %0;" ::"n"(MH_STAGES - 2));
        __syncthreads();
        if (ks + MH_STAGES - 1 < steps) load(ks + MH_STAGES - 1, (ks + MH_STAGES - 1) % MH_STAGES);
        asm volatile("cp.async.commit_group;");
        const u32 cur = ks % MH_STAGES;
        const u16* ta = sa + cur * MF_BM * MH_ROW;
        const u16* tb = sb + cur * MF_BN * MH_ROW;
#pragma unroll
        for (u32 kk = 0; kk < MF_BK; kk += 16) {
            u32 a[4][4], b[4][2];
#pragma unroll
            for (u32 i = 0; i < 4; i++) {
                const u32 r = wm + 16 * i + (lane % 16), c = kk + (lane / 16) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                             : "=r"(a[i][0]), "=r"(a[i][1]), "=r"(a[i][2]), "=r"(a[i][3])
                             : "r"(smem_addr(&ta[r * MH_ROW + c])));
            }
#pragma unroll
            for (u32 j = 0; j < 4; j += 2) {
                const u32 r = wn + 8 * j + (lane % 8) + (lane / 16) * 8, c = kk + ((lane / 8) % 2) * 8;
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                             : "=r"(b[j][0]), "=r"(b[j][1]), "=r"(b[j + 1][0]), "=r"(b[j + 1][1])
                             : "r"(smem_addr(&tb[r * MH_ROW + c])));
            }
#pragma unroll
            for (u32 i = 0; i < 4; i++)
#pragma unroll
                for (u32 j = 0; j < 4; j++)
                    asm volatile(
                        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
                        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
                        : "+f"(acc[i][j][0]), "+f"(acc[i][j][1]), "+f"(acc[i][j][2]), "+f"(acc[i][j][3])
                        : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3]), "r"(b[j][0]), "r"(b[j][1]));
        }
    }
    asm volatile("cp.async.wait_all;");
    const u32 g = lane >> 2, tg = lane & 3u;
#pragma unroll
    for (u32 i = 0; i < 4; i++)
#pragma unroll
        for (u32 j = 0; j < 4; j++) {
            const u32 t0 = tok0 + wm + 16 * i + g, r0 = row0 + wn + 8 * j + 2 * tg;
            if (t0 < m && r0 < n) y[(u64)t0 * y_stride + r0] = acc[i][j][0];
            if (t0 < m && r0 + 1 < n) y[(u64)t0 * y_stride + r0 + 1] = acc[i][j][1];
            if (t0 + 8 < m && r0 < n) y[(u64)(t0 + 8) * y_stride + r0] = acc[i][j][2];
            if (t0 + 8 < m && r0 + 1 < n) y[(u64)(t0 + 8) * y_stride + r0 + 1] = acc[i][j][3];
        }
}

#endif

