// Paged causal attention over the K/V cache (Op::PagedAttention; composed
// after common.cuh). One block of W warps (4, 8 or 16) per (query head,
// token row): warp w takes the keys w, w + W, ... of the row's window
// with an online softmax (lane i holds head dims i, i + 32, ...), and the
// warps' partial results are merged at the end.
//
// seqs [n_seq, 4]: first row, tokens, start position, offset of the
// sequence's block table in `tables`. Key position p of a sequence lives in
// slot tables[off + p / block_size] * block_size + p % block_size.

#define ATT_MAX_DIM 256
#define ATT_PER_LANE (ATT_MAX_DIM / WARP)

__device__ __forceinline__ float kv_at(const void* c, u64 i, u32 f16) {
    return f16 ? f16_f32(((const u16*)c)[i]) : ((const float*)c)[i];
}

template <int ATT_WARPS>
__device__ __forceinline__ void paged_attention_body(const float* __restrict__ q, const void* __restrict__ kc, const void* __restrict__ vc,
                    const u32* __restrict__ seqs, u32 n_seq, const u32* __restrict__ tables,
                    float* __restrict__ out, u32 n_head, u32 n_head_kv, u32 hk, u32 hv, float scale, u32 window,
                    float softcap, u32 block_size, u32 f16, float* sm, float* sl, float (*sacc)[ATT_MAX_DIM]) {
    const u32 h = blockIdx.x, row = blockIdx.y;
    const u32 lane = threadIdx.x % WARP, wid = threadIdx.x / WARP;
    // The row's sequence.
    u32 pos = 0, toff = 0;
    bool found = false;
    for (u32 s = 0; s < n_seq; s++) {
        const u32 first = seqs[4 * s], len = seqs[4 * s + 1];
        if (row >= first && row < first + len) {
            pos = seqs[4 * s + 2] + (row - first);
            toff = seqs[4 * s + 3];
            found = true;
        }
    }
    const u32 kvh = h / (n_head / n_head_kv);
    const u32 k_width = n_head_kv * hk, v_width = n_head_kv * hv;
    float qr[ATT_PER_LANE], acc[ATT_PER_LANE];
    const float* qh = q + ((u64)row * n_head + h) * hk;
#pragma unroll
    for (u32 j = 0; j < ATT_PER_LANE; j++) {
        const u32 d = lane + j * WARP;
        qr[j] = d < hk ? qh[d] : 0.0f;
        acc[j] = 0.0f;
    }
    float m = NEG_INF, l = 0.0f;
    const u32 first_key = (window > 0 && pos + 1 > window) ? pos + 1 - window : 0;
    if (found) {
        for (u32 p = first_key + wid; p <= pos; p += ATT_WARPS) {
            const u64 slot = (u64)tables[toff + p / block_size] * block_size + p % block_size;
            float dot = 0.0f;
#pragma unroll
            for (u32 j = 0; j < ATT_PER_LANE; j++) {
                const u32 d = lane + j * WARP;
                if (d < hk) dot += qr[j] * kv_at(kc, slot * k_width + kvh * hk + d, f16);
            }
            float s = warp_sum(dot) * scale;
            if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
            const float mn = fmaxf(m, s);
            const float corr = m == NEG_INF ? 0.0f : expf(m - mn);
            const float pr = expf(s - mn);
            l = l * corr + pr;
#pragma unroll
            for (u32 j = 0; j < ATT_PER_LANE; j++) {
                const u32 d = lane + j * WARP;
                if (d < hv) acc[j] = acc[j] * corr + pr * kv_at(vc, slot * v_width + kvh * hv + d, f16);
            }
            m = mn;
        }
    }
    if (lane == 0) {
        sm[wid] = m;
        sl[wid] = l;
    }
#pragma unroll
    for (u32 j = 0; j < ATT_PER_LANE; j++) {
        const u32 d = lane + j * WARP;
        if (d < hv) sacc[wid][d] = acc[j];
    }
    __syncthreads();
    float mx = NEG_INF;
    for (u32 w = 0; w < ATT_WARPS; w++) mx = fmaxf(mx, sm[w]);
    float total = 0.0f;
    for (u32 w = 0; w < ATT_WARPS; w++)
        if (sm[w] != NEG_INF) total += sl[w] * expf(sm[w] - mx);
    float* o = out + ((u64)row * n_head + h) * hv;
    for (u32 d = threadIdx.x; d < hv; d += ATT_WARPS * WARP) {
        float v = 0.0f;
        for (u32 w = 0; w < ATT_WARPS; w++)
            if (sm[w] != NEG_INF) v += sacc[w][d] * expf(sm[w] - mx);
        o[d] = total > 0.0f ? v / total : 0.0f;
    }
}

// One kernel per warp count (`paged_attention_W`): more warps take a
// row's keys in more streams at once.
#define PAGED_ATTENTION(W)                                                                              \
    extern "C" __global__ void __launch_bounds__(W * WARP) paged_attention_##W(                          \
        const float* __restrict__ q, const void* __restrict__ kc, const void* __restrict__ vc,          \
        const u32* __restrict__ seqs, u32 n_seq, const u32* __restrict__ tables, float* __restrict__ out, \
        u32 n_head, u32 n_head_kv, u32 hk, u32 hv, float scale, u32 window, float softcap,              \
        u32 block_size, u32 f16) {                                                                      \
        __shared__ float sm[W], sl[W];                                                                  \
        __shared__ float sacc[W][ATT_MAX_DIM];                                                          \
        paged_attention_body<W>(q, kc, vc, seqs, n_seq, tables, out, n_head, n_head_kv, hk, hv, scale,   \
                                window, softcap, block_size, f16, sm, sl, sacc);                        \
    }

PAGED_ATTENTION(4)
PAGED_ATTENTION(8)
PAGED_ATTENTION(16)
