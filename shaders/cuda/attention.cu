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

// ---- Split attention: one block per (K/V head, row, split of the keys).
//
// The G = n_head / n_head_kv query heads that share a K/V head share its
// loads: a block stages tiles of ATT_TILE keys of K and V in shared memory
// (coalesced rows, through the block table), then warp w takes heads
// w, w + 4, ...: lane (2j + h) scores key j of the tile over the dims
// 2i + h, an online softmax over the tile, and the lanes take the output
// dims lane, lane + 32, ... of p · V. A row's keys are cut into `splits`
// runs (a fixed count, so that a recorded plan holds for every length);
// with one split the block writes the output, else (m, l, acc) partials
// that attention_combine merges.

#define ATT_TILE 16
#define ATT_SPLIT_WARPS 4
// Query values of a block's heads in shared memory: G * head width at most.
#define ATT_MAX_Q 2048
// Keys a split takes at least (short rows stay in one block), and the
// most splits (a warp's lanes in attention_combine).
#define ATT_MIN_SPLIT 32
#define ATT_MAX_SPLITS 32

__device__ __forceinline__ void kv_pair(const void* c, u64 i, u32 f16, float* a, float* b) {
    if (f16) {
        const float2 p = f16x2(((const u32*)c)[i / 2]);
        *a = p.x;
        *b = p.y;
    } else {
        const float2 p = ((const float2*)c)[i / 2];
        *a = p.x;
        *b = p.y;
    }
}

// Where a row's keys are and how the split kernel cuts them: `per` keys a
// split (whole tiles, at least ATT_MIN_SPLIT), `active` splits with keys.
struct RowKeys {
    u32 toff, first_key, keys, per, active;
};

__device__ __forceinline__ RowKeys row_keys(u32 row, const u32* __restrict__ seqs, u32 n_seq, u32 window,
                                            u32 splits) {
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
    RowKeys r;
    r.toff = toff;
    r.first_key = (window > 0 && pos + 1 > window) ? pos + 1 - window : 0;
    r.keys = found ? pos + 1 - r.first_key : 0;
    r.per = max(ATT_MIN_SPLIT, ((r.keys + splits - 1) / splits + ATT_TILE - 1) / ATT_TILE * ATT_TILE);
    r.active = (r.keys + r.per - 1) / r.per;
    return r;
}

extern "C" __global__ void __launch_bounds__(ATT_SPLIT_WARPS * WARP) paged_attention_split(
    const float* __restrict__ q, const void* __restrict__ kc, const void* __restrict__ vc,
    const u32* __restrict__ seqs, u32 n_seq, const u32* __restrict__ tables, float* __restrict__ out,
    float* __restrict__ part, u32 n_head, u32 n_head_kv, u32 hk, u32 hv, float scale, u32 window, float softcap,
    u32 block_size, u32 f16, u32 splits) {
    __shared__ float sk[ATT_TILE][ATT_MAX_DIM + 2];
    __shared__ float sv[ATT_TILE][ATT_MAX_DIM + 2];
    __shared__ float sq[ATT_MAX_Q];
    __shared__ u64 sslot[ATT_TILE];
    const u32 kvh = blockIdx.x, row = blockIdx.y, split = blockIdx.z;
    const u32 tid = threadIdx.x, lane = tid % WARP, wid = tid / WARP;
    const u32 G = n_head / n_head_kv;
    const RowKeys rk = row_keys(row, seqs, n_seq, window, splits);
    // Splits past the keys have nothing to do; with one the block writes
    // the output itself (and attention_combine leaves the row).
    if (split > 0 && split >= rk.active) return;
    const u32 toff = rk.toff, first_key = rk.first_key, keys = rk.keys, per = rk.per;
    const u32 kb = first_key + min(keys, split * per), ke = first_key + min(keys, (split + 1) * per);
    const bool direct = rk.active <= 1;
    const u32 k_width = n_head_kv * hk, v_width = n_head_kv * hv;
    for (u32 i = tid; i < G * hk; i += ATT_SPLIT_WARPS * WARP)
        sq[i] = q[((u64)row * n_head + kvh * G) * hk + i];
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    float acc[2][ATT_PER_LANE];
#pragma unroll
    for (u32 a = 0; a < 2; a++)
#pragma unroll
        for (u32 j = 0; j < ATT_PER_LANE; j++) acc[a][j] = 0.0f;
    const u32 j = lane >> 1, hh = lane & 1u;
    for (u32 t0 = kb; t0 < ke; t0 += ATT_TILE) {
        __syncthreads();
        if (tid < ATT_TILE) {
            const u32 p = t0 + tid;
            sslot[tid] = p < ke ? (u64)tables[toff + p / block_size] * block_size + p % block_size : 0;
        }
        __syncthreads();
        for (u32 i = tid; i < ATT_TILE * (hk / 2); i += ATT_SPLIT_WARPS * WARP) {
            const u32 key = i / (hk / 2), c = 2 * (i % (hk / 2));
            float a = 0.0f, b = 0.0f;
            if (t0 + key < ke) kv_pair(kc, sslot[key] * k_width + kvh * hk + c, f16, &a, &b);
            sk[key][c] = a;
            sk[key][c + 1] = b;
        }
        for (u32 i = tid; i < ATT_TILE * (hv / 2); i += ATT_SPLIT_WARPS * WARP) {
            const u32 key = i / (hv / 2), c = 2 * (i % (hv / 2));
            float a = 0.0f, b = 0.0f;
            if (t0 + key < ke) kv_pair(vc, sslot[key] * v_width + kvh * hv + c, f16, &a, &b);
            sv[key][c] = a;
            sv[key][c + 1] = b;
        }
        __syncthreads();
        const bool live = t0 + j < ke;
#pragma unroll
        for (u32 a = 0; a < 2; a++) {
            const u32 h = wid + a * ATT_SPLIT_WARPS;
            if (h >= G) break;
            const float* qh = sq + h * hk;
            float dot = 0.0f;
            for (u32 d = hh; d < hk; d += 2) dot += qh[d] * sk[j][d];
            dot += SHFL_XOR(dot, 1);
            float s = dot * scale;
            if (softcap > 0.0f) s = softcap * tanhf(s / softcap);
            if (!live) s = NEG_INF;
            const float mn = fmaxf(m[a], warp_max(s));
            const float corr = m[a] == NEG_INF ? 0.0f : expf(m[a] - mn);
            const float p = live ? expf(s - mn) : 0.0f;
            l[a] = l[a] * corr + warp_sum(hh == 0 ? p : 0.0f);
#pragma unroll
            for (u32 e = 0; e < ATT_PER_LANE; e++) acc[a][e] *= corr;
#pragma unroll
            for (u32 key = 0; key < ATT_TILE; key++) {
                const float pk = SHFL(p, 2 * key);
#pragma unroll
                for (u32 e = 0; e < ATT_PER_LANE; e++) {
                    const u32 d = lane + e * WARP;
                    if (d < hv) acc[a][e] += pk * sv[key][d];
                }
            }
            m[a] = mn;
        }
    }
#pragma unroll
    for (u32 a = 0; a < 2; a++) {
        const u32 h = wid + a * ATT_SPLIT_WARPS;
        if (h >= G) break;
        const u32 head = kvh * G + h;
        if (direct) {
            float* o = out + ((u64)row * n_head + head) * hv;
#pragma unroll
            for (u32 e = 0; e < ATT_PER_LANE; e++) {
                const u32 d = lane + e * WARP;
                if (d < hv) o[d] = l[a] > 0.0f ? acc[a][e] / l[a] : 0.0f;
            }
        } else {
            float* pp = part + (((u64)row * n_head + head) * splits + split) * (hv + 2);
            if (lane == 0) {
                pp[0] = m[a];
                pp[1] = l[a];
            }
#pragma unroll
            for (u32 e = 0; e < ATT_PER_LANE; e++) {
                const u32 d = lane + e * WARP;
                if (d < hv) pp[2 + d] = acc[a][e];
            }
        }
    }
}

// The splits' partials of paged_attention_split into the output: one
// block per (query head, row); the first warp weighs the splits (a lane
// each), then a thread per output dim.
extern "C" __global__ void attention_combine(const float* __restrict__ part, float* __restrict__ out,
                                             const u32* __restrict__ seqs, u32 n_seq, u32 window, u32 n_head,
                                             u32 hv, u32 splits) {
    __shared__ float ws[ATT_MAX_SPLITS];
    __shared__ float total;
    const u32 h = blockIdx.x, row = blockIdx.y;
    const u32 active = row_keys(row, seqs, n_seq, window, splits).active;
    if (active <= 1) return;
    const float* pp = part + ((u64)row * n_head + h) * splits * (hv + 2);
    if (threadIdx.x < WARP) {
        const u32 s = threadIdx.x;
        const float m = s < active ? pp[s * (hv + 2)] : NEG_INF;
        const float l = s < active ? pp[s * (hv + 2) + 1] : 0.0f;
        const float mx = warp_max(m);
        const float w = m == NEG_INF ? 0.0f : expf(m - mx);
        const float t = warp_sum(l * w);
        if (s < ATT_MAX_SPLITS) ws[s] = w;
        if (s == 0) total = t;
    }
    __syncthreads();
    float* o = out + ((u64)row * n_head + h) * hv;
    for (u32 d = threadIdx.x; d < hv; d += blockDim.x) {
        float v = 0.0f;
        for (u32 s = 0; s < active; s++) v += pp[s * (hv + 2) + 2 + d] * ws[s];
        o[d] = total > 0.0f ? v / total : 0.0f;
    }
}

// ---- Flash attention for prefill (f16 K/V cache, CUDA only).
//
// A block takes FA_ROWS query rows of one sequence that share a K/V head:
// row r of the sequence's rows is token r / G, head r % G of the group,
// so the G heads of a token read each K/V tile once. The block walks the
// keys its rows see in tiles of FA_KEYS, staged by cp.async two tiles
// deep; warp w takes rows 16w ... 16w + 15 on the tensor cores (mma
// m16n8k16, f16 x f16 -> f32): S = Q K^T, an online softmax over S in the
// registers, then O += P V with P as the A operand straight from S's
// accumulators. Tiles past a warp's last position, or before its rows'
// window, are skipped. Blocks are numbered over the sequences in order
// (each sequence ceil(len G / FA_ROWS) of them); the grid has a few
// spare ones, which return.

#ifndef __HIP_PLATFORM_AMD__

#define FA_ROWS 64
#define FA_KEYS 64
#define FA_THREADS 128

// Halves of a staged row of D values: 8 of padding (conflict-free ldmatrix).
#define FA_ROW(D) ((D) + 8)
// Dynamic shared memory of flash_attention_D: Q, and two tiles of K and V.
#define FA_SMEM(D) ((FA_ROWS + 4 * FA_KEYS) * FA_ROW(D) * 2)

__device__ __forceinline__ void mma_f16_16x8x16(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

template <int D>
__device__ __forceinline__ void flash_attention_body(const float* __restrict__ q, const u16* __restrict__ kc,
                                                     const u16* __restrict__ vc, const u32* __restrict__ seqs,
                                                     u32 n_seq, const u32* __restrict__ tables,
                                                     float* __restrict__ out, u32 n_head, u32 n_head_kv,
                                                     float scale, u32 window, float softcap, u32 block_size) {
    extern __shared__ __align__(16) u16 fa_smem[];
    constexpr u32 RW = FA_ROW(D);
    u16* const sq = fa_smem;
    u16* const sk = sq + FA_ROWS * RW;   // [2][FA_KEYS][RW]
    u16* const sv = sk + 2 * FA_KEYS * RW;
    const u32 kvh = blockIdx.x, tid = threadIdx.x, lane = tid % WARP, warp = tid / WARP;
    const u32 G = n_head / n_head_kv;
    // The block's sequence and its first row there.
    u32 y = blockIdx.y, first = 0, len = 0, start = 0, toff = 0;
    bool found = false;
    for (u32 s = 0; s < n_seq && !found; s++) {
        const u32 l = seqs[4 * s + 1], tiles = (l * G + FA_ROWS - 1) / FA_ROWS;
        if (y < tiles) {
            first = seqs[4 * s];
            len = l;
            start = seqs[4 * s + 2];
            toff = seqs[4 * s + 3];
            found = true;
        } else {
            y -= tiles;
        }
    }
    if (!found) return;
    const u32 r0 = y * FA_ROWS, rows = min(FA_ROWS, len * G - r0);
    // Keys of the block: from the first row's window to the last row's position.
    const u32 pos_lo = start + r0 / G, pos_hi = start + (r0 + rows - 1) / G;
    const u32 key_lo = (window > 0 && pos_lo + 1 > window) ? pos_lo + 1 - window : 0;
    const u32 k_width = n_head_kv * D;

    // Q as f16 (rows past the sequence zero).
    for (u32 i = tid; i < FA_ROWS * (D / 8); i += FA_THREADS) {
        const u32 r = i / (D / 8), c = (i % (D / 8)) * 8;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < rows) {
            const u32 lr = r0 + r;
            const float* src = q + ((u64)(first + lr / G) * n_head + kvh * G + lr % G) * D + c;
            const float4 a = *(const float4*)src, b = *(const float4*)(src + 4);
            v = make_uint4(f16x2_of(a.x, a.y), f16x2_of(a.z, a.w), f16x2_of(b.x, b.y), f16x2_of(b.z, b.w));
        }
        *(uint4*)&sq[r * RW + c] = v;
    }
    // Stage the keys kt0 ... kt0 + FA_KEYS - 1 into buffer `buf`; keys past
    // pos_hi repeat pos_hi's (finite values, masked out).
    auto load = [&](u32 kt0, u32 buf) {
        for (u32 i = tid; i < FA_KEYS * (D / 8); i += FA_THREADS) {
            const u32 key = i / (D / 8), c = (i % (D / 8)) * 8;
            const u32 p = min(kt0 + key, pos_hi);
            const u64 slot = (u64)tables[toff + p / block_size] * block_size + p % block_size;
            const u64 off = slot * k_width + kvh * D + c;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                             smem_addr(&sk[(buf * FA_KEYS + key) * RW + c])),
                         "l"(kc + off));
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(
                             smem_addr(&sv[(buf * FA_KEYS + key) * RW + c])),
                         "l"(vc + off));
        }
    };

    // This lane's two rows: g and g + 8 of the warp's 16.
    const u32 g = lane >> 2, t4 = lane & 3u;
    u32 rpos[2], rfirst[2];
    bool rlive[2];
#pragma unroll
    for (u32 h = 0; h < 2; h++) {
        const u32 r = warp * 16 + g + 8 * h;
        rlive[h] = r < rows;
        rpos[h] = start + (r0 + min(r, rows - 1)) / G;
        rfirst[h] = (window > 0 && rpos[h] + 1 > window) ? rpos[h] + 1 - window : 0;
    }
    // The warp's keys: [its first row's window start, its last row's position].
    const u32 wr_lo = min(warp * 16, rows - 1), wr_hi = min(warp * 16 + 15, rows - 1);
    const u32 wpos_lo = start + (r0 + wr_lo) / G, wpos_hi = start + (r0 + wr_hi) / G;
    const u32 wkey_lo = (window > 0 && wpos_lo + 1 > window) ? wpos_lo + 1 - window : 0;
    const bool wlive = warp * 16 < rows;

    float o[D / 8][4];
#pragma unroll
    for (u32 n = 0; n < D / 8; n++)
#pragma unroll
        for (u32 e = 0; e < 4; e++) o[n][e] = 0.0f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.0f, 0.0f};
    const float log2e = 1.4426950408889634f;

    const u32 tiles = (pos_hi - key_lo) / FA_KEYS + 1;
    load(key_lo, 0);
    asm volatile("cp.async.commit_group;");
    for (u32 t = 0; t < tiles; t++) {
        const u32 kt0 = key_lo + t * FA_KEYS, buf = t & 1u;
        // The other buffer was read in step t - 1, which every warp has
        // left (the barrier at the end of the step).
        if (t + 1 < tiles) load(kt0 + FA_KEYS, buf ^ 1u);
        asm volatile("cp.async.commit_group;");
        asm volatile("cp.async.wait_group 1;");
        __syncthreads();
        if (wlive && kt0 <= wpos_hi && kt0 + FA_KEYS > wkey_lo) {
            const u16* tk = sk + buf * FA_KEYS * RW;
            const u16* tv = sv + buf * FA_KEYS * RW;
            // S = Q K^T over the tile: 8 tiles of 8 keys.
            float s[FA_KEYS / 8][4];
#pragma unroll
            for (u32 j = 0; j < FA_KEYS / 8; j++)
#pragma unroll
                for (u32 e = 0; e < 4; e++) s[j][e] = 0.0f;
#pragma unroll
            for (u32 kk = 0; kk < D; kk += 16) {
                u32 a[4];
                asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                             : "=r"(a[0]), "=r"(a[1]), "=r"(a[2]), "=r"(a[3])
                             : "r"(smem_addr(&sq[(warp * 16 + (lane % 16)) * RW + kk + (lane / 16) * 8])));
#pragma unroll
                for (u32 j = 0; j < FA_KEYS / 8; j += 2) {
                    u32 b[4];
                    const u32 r = 8 * j + (lane % 8) + (lane / 16) * 8, c = kk + ((lane / 8) % 2) * 8;
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                                 : "r"(smem_addr(&tk[r * RW + c])));
                    mma_f16_16x8x16(s[j], a, b[0], b[1]);
                    mma_f16_16x8x16(s[j + 1], a, b[2], b[3]);
                }
            }
            // Scale, cap, mask; the online softmax (base 2) per row.
            float mx[2] = {NEG_INF, NEG_INF};
#pragma unroll
            for (u32 j = 0; j < FA_KEYS / 8; j++)
#pragma unroll
                for (u32 e = 0; e < 4; e++) {
                    const u32 h = e / 2, key = kt0 + 8 * j + 2 * t4 + (e & 1u);
                    float v = s[j][e] * scale;
                    if (softcap > 0.0f) v = softcap * tanhf(v / softcap);
                    v *= log2e;
                    if (!rlive[h] || key > rpos[h] || key < rfirst[h]) v = NEG_INF;
                    s[j][e] = v;
                    mx[h] = fmaxf(mx[h], v);
                }
            float corr[2], base[2];
#pragma unroll
            for (u32 h = 0; h < 2; h++) {
                mx[h] = fmaxf(mx[h], SHFL_XOR(mx[h], 1));
                mx[h] = fmaxf(mx[h], SHFL_XOR(mx[h], 2));
                const float mn = fmaxf(m[h], mx[h]);
                corr[h] = m[h] == NEG_INF ? 0.0f : exp2f(m[h] - mn);
                // A row with no key yet keeps every p at 0.
                base[h] = mn == NEG_INF ? 0.0f : mn;
                m[h] = mn;
                l[h] *= corr[h];
            }
#pragma unroll
            for (u32 j = 0; j < FA_KEYS / 8; j++)
#pragma unroll
                for (u32 e = 0; e < 4; e++) {
                    const float p = exp2f(s[j][e] - base[e / 2]);
                    s[j][e] = p;
                    l[e / 2] += p;
                }
#pragma unroll
            for (u32 n = 0; n < D / 8; n++) {
                o[n][0] *= corr[0];
                o[n][1] *= corr[0];
                o[n][2] *= corr[1];
                o[n][3] *= corr[1];
            }
            // O += P V, 16 keys a step: P's A operand from S's accumulators,
            // V's B operand transposed out of the row-major tile.
#pragma unroll
            for (u32 kk = 0; kk < FA_KEYS / 16; kk++) {
                const u32 a[4] = {f16x2_of(s[2 * kk][0], s[2 * kk][1]), f16x2_of(s[2 * kk][2], s[2 * kk][3]),
                                  f16x2_of(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                  f16x2_of(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
                for (u32 n = 0; n < D / 8; n += 2) {
                    u32 b[4];
                    const u32 r = 16 * kk + (lane % 8) + ((lane / 8) % 2) * 8, c = 8 * n + (lane / 16) * 8;
                    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                                 : "=r"(b[0]), "=r"(b[1]), "=r"(b[2]), "=r"(b[3])
                                 : "r"(smem_addr(&tv[r * RW + c])));
                    mma_f16_16x8x16(o[n], a, b[0], b[1]);
                    mma_f16_16x8x16(o[n + 1], a, b[2], b[3]);
                }
            }
        }
        __syncthreads();
    }
    asm volatile("cp.async.wait_all;");
#pragma unroll
    for (u32 h = 0; h < 2; h++) {
        l[h] += SHFL_XOR(l[h], 1);
        l[h] += SHFL_XOR(l[h], 2);
        if (!rlive[h]) continue;
        const u32 lr = r0 + warp * 16 + g + 8 * h;
        float* dst = out + ((u64)(first + lr / G) * n_head + kvh * G + lr % G) * D;
        const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
#pragma unroll
        for (u32 n = 0; n < D / 8; n++)
            *(float2*)&dst[8 * n + 2 * t4] = make_float2(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
    }
}

#define FLASH_ATTENTION(D)                                                                                \
    extern "C" __global__ void __launch_bounds__(FA_THREADS) flash_attention_##D(                         \
        const float* __restrict__ q, const u16* __restrict__ kc, const u16* __restrict__ vc,               \
        const u32* __restrict__ seqs, u32 n_seq, const u32* __restrict__ tables, float* __restrict__ out, \
        u32 n_head, u32 n_head_kv, float scale, u32 window, float softcap, u32 block_size) {              \
        flash_attention_body<D>(q, kc, vc, seqs, n_seq, tables, out, n_head, n_head_kv, scale, window,     \
                                softcap, block_size);                                                     \
    }

FLASH_ATTENTION(64)
FLASH_ATTENTION(128)

#endif
