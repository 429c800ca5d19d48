// Row and element ops (composed after common.cuh), each the twin of its
// scalar reference in hearth::graph::reference. Element ops take one
// thread per value; row ops one block per row.

#define ROW_BLOCK 256

extern "C" __global__ void add_f32(const float* __restrict__ x, const float* __restrict__ y, float* out, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + y[i];
}

extern "C" __global__ void mul_f32(const float* __restrict__ x, const float* __restrict__ y, float* out, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * y[i];
}

extern "C" __global__ void scale_f32(const float* __restrict__ x, float* out, float s, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] * s;
}

extern "C" __global__ void bias_add_f32(const float* __restrict__ x, const float* __restrict__ bias, float* out,
                                        u32 width, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = x[i] + bias[i % width];
}

extern "C" __global__ void softcap_f32(const float* __restrict__ x, float* out, float cap, u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = cap * tanhf(x[i] / cap);
}

__device__ __forceinline__ float silu_mul(float g, float u) { return g / (1.0f + expf(-g)) * u; }

// ggml's CPU geglu: the GELU input rounded to f16, the result rounded to
// f16 (its table), times up; saturated outside +-10.
__device__ __forceinline__ float gelu_mul(float x, float u) {
    if (x <= -10.0f) return 0.0f;
    if (x >= 10.0f) return x * u;
    const float h = f16_f32(f32_f16(x));
    const float g = 0.5f * h * (1.0f + tanhf(0.7978846f * h * (1.0f + 0.044715f * h * h)));
    return f16_f32(f32_f16(g)) * u;
}

extern "C" __global__ void silu_mul_f32(const float* __restrict__ g, const float* __restrict__ u, float* out,
                                        u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = silu_mul(g[i], u[i]);
}

extern "C" __global__ void gelu_mul_f32(const float* __restrict__ g, const float* __restrict__ u, float* out,
                                        u32 n) {
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = gelu_mul(g[i], u[i]);
}

// y = x / sqrt(mean(x^2) + eps) * w over rows of `width` (Op::RmsNorm);
// one block of ROW_BLOCK threads per row. In place is allowed.
extern "C" __global__ void rms_norm_f32(const float* x, const float* __restrict__ w, float* y, u32 width,
                                        float eps) {
    __shared__ float scratch[32];
    const float* xr = x + (u64)blockIdx.x * width;
    float* yr = y + (u64)blockIdx.x * width;
    float s = 0.0f;
    for (u32 i = threadIdx.x; i < width; i += ROW_BLOCK) s += xr[i] * xr[i];
    const float scale = 1.0f / sqrtf(block_sum(s, scratch, ROW_BLOCK) / (float)width + eps);
    for (u32 i = threadIdx.x; i < width; i += ROW_BLOCK) yr[i] = (xr[i] * scale) * w[i];
}

// s = a + b, then x = rms_norm(s) * w (Prologue::AddRmsNorm without the
// products); one block per row.
extern "C" __global__ void add_rms_norm_f32(const float* a, const float* b, const float* __restrict__ w, float* s,
                                            float* x, u32 width, float eps) {
    __shared__ float scratch[32];
    const u64 r = (u64)blockIdx.x * width;
    float acc = 0.0f;
    for (u32 i = threadIdx.x; i < width; i += ROW_BLOCK) {
        const float v = a[r + i] + b[r + i];
        s[r + i] = v;
        acc += v * v;
    }
    const float scale = 1.0f / sqrtf(block_sum(acc, scratch, ROW_BLOCK) / (float)width + eps);
    for (u32 i = threadIdx.x; i < width; i += ROW_BLOCK) x[r + i] = (s[r + i] * scale) * w[i];
}

// Softmax of each row (max subtracted); one block per row. In place is allowed.
extern "C" __global__ void softmax_f32(const float* x, float* y, u32 width) {
    __shared__ float scratch[32];
    const float* xr = x + (u64)blockIdx.x * width;
    float* yr = y + (u64)blockIdx.x * width;
    float m = NEG_INF;
    for (u32 i = threadIdx.x; i < width; i += ROW_BLOCK) m = fmaxf(m, xr[i]);
    m = block_max(m, scratch, ROW_BLOCK);
    if (m == NEG_INF) {
        for (u32 i = threadIdx.x; i < width; i += ROW_BLOCK) yr[i] = 0.0f;
        return;
    }
    float s = 0.0f;
    for (u32 i = threadIdx.x; i < width; i += ROW_BLOCK) s += expf(xr[i] - m);
    const float inv = 1.0f / block_sum(s, scratch, ROW_BLOCK);
    for (u32 i = threadIdx.x; i < width; i += ROW_BLOCK) yr[i] = expf(xr[i] - m) * inv;
}

// RoPE of x [rows, heads * head_dim] at positions pos[rows] into out (in
// place allowed): one thread per (row, head, pair). Pairs past n_rot / 2
// copy the unrotated dims. theta = pos * base^(-2i / n_rot) by repeated
// f32 products, as the reference; ff (or null): per-pair divisors.
// mode 0: pairs (2i, 2i + 1) (Norm); 1: (i, i + n_rot / 2) (Neox).
__device__ __forceinline__ void rope_pair(const float* x, float* out, u64 h, u32 i, u32 p, const float* ff,
                                          u32 head_dim, u32 n_rot, float theta_scale, float freq_scale,
                                          u32 mode) {
    const u32 half = n_rot / 2;
    if (i >= half) {
        const u32 j = n_rot + 2 * (i - half);
        if (j < head_dim) {
            out[h + j] = x[h + j];
            if (j + 1 < head_dim) out[h + j + 1] = x[h + j + 1];
        }
        return;
    }
    float theta = (float)p;
    for (u32 j = 0; j < i; j++) theta *= theta_scale;
    const float f = ff ? ff[i] : 1.0f;
    const float t = freq_scale * (theta / f);
    const float c = cosf(t), s = sinf(t);
    const u32 i0 = mode == 0 ? 2 * i : i, i1 = mode == 0 ? 2 * i + 1 : i + half;
    const float a = x[h + i0], b = x[h + i1];
    out[h + i0] = a * c - b * s;
    out[h + i1] = a * s + b * c;
}

extern "C" __global__ void rope_f32(const float* x, const u32* __restrict__ pos, const float* __restrict__ ff,
                                    float* out, u32 heads, u32 head_dim, u32 n_rot, float theta_scale,
                                    float freq_scale, u32 mode, u32 rows) {
    const u32 pairs = head_dim / 2;
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * heads * pairs) return;
    const u32 row = i / (heads * pairs), hd = (i / pairs) % heads;
    rope_pair(x, out, ((u64)row * heads + hd) * head_dim, i % pairs, pos[row], ff, head_dim, n_rot, theta_scale,
              freq_scale, mode);
}

// K and V rows into the caches through slots (Op::KvWrite); f16: whether
// the cache holds halves. One thread per (row, value).
extern "C" __global__ void kv_write(const float* __restrict__ k, const float* __restrict__ v,
                                    const u32* __restrict__ slots, void* kc, void* vc, u32 k_width, u32 v_width,
                                    u32 rows, u32 f16) {
    const u32 width = k_width > v_width ? k_width : v_width;
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * width) return;
    const u32 r = i / width, j = i % width;
    const u64 s = slots[r];
    if (f16) {
        if (j < k_width) ((u16*)kc)[s * k_width + j] = (u16)f32_f16(k[(u64)r * k_width + j]);
        if (j < v_width) ((u16*)vc)[s * v_width + j] = (u16)f32_f16(v[(u64)r * v_width + j]);
    } else {
        if (j < k_width) ((float*)kc)[s * k_width + j] = k[(u64)r * k_width + j];
        if (j < v_width) ((float*)vc)[s * v_width + j] = v[(u64)r * v_width + j];
    }
}

// Op::RopeKvWrite in one launch: RoPE of q into qo and of k into ko (as
// rope_f32), the roped k and v into the caches through slots (as
// kv_write). Threads: rows * (q_heads + kv_heads) * head_dim / 2 pairs,
// then rows * v_width values of v.
extern "C" __global__ void rope_kv_write(const float* q, const float* k, const float* __restrict__ v,
                                         const u32* __restrict__ pos, const u32* __restrict__ slots,
                                         const float* __restrict__ ff, float* qo, float* ko, void* kc, void* vc,
                                         u32 q_heads, u32 kv_heads, u32 head_dim, u32 n_rot, float theta_scale,
                                         float freq_scale, u32 mode, u32 rows, u32 v_width, u32 f16) {
    const u32 pairs = head_dim / 2, heads = q_heads + kv_heads;
    const u32 i = blockIdx.x * blockDim.x + threadIdx.x;
    const u32 n_pairs = rows * heads * pairs;
    if (i >= n_pairs) {
        const u32 j = i - n_pairs;
        if (j >= rows * v_width) return;
        const u64 at = slots[j / v_width] * (u64)v_width + j % v_width;
        if (f16)
            ((u16*)vc)[at] = (u16)f32_f16(v[j]);
        else
            ((float*)vc)[at] = v[j];
        return;
    }
    const u32 row = i / (heads * pairs), hd = (i / pairs) % heads, pr = i % pairs;
    if (hd < q_heads) {
        rope_pair(q, qo, ((u64)row * q_heads + hd) * head_dim, pr, pos[row], ff, head_dim, n_rot, theta_scale,
                  freq_scale, mode);
        return;
    }
    const u32 kh = hd - q_heads;
    const u64 h = ((u64)row * kv_heads + kh) * head_dim;
    rope_pair(k, ko, h, pr, pos[row], ff, head_dim, n_rot, theta_scale, freq_scale, mode);
    // The dims rope_pair wrote, into the cache.
    const u32 half = n_rot / 2;
    u32 d0, d1;
    if (pr < half) {
        d0 = mode == 0 ? 2 * pr : pr;
        d1 = mode == 0 ? 2 * pr + 1 : pr + half;
    } else {
        d0 = n_rot + 2 * (pr - half);
        d1 = d0 + 1;
    }
    const u64 c = slots[row] * (u64)kv_heads * head_dim + (u64)kh * head_dim;
    if (d0 < head_dim) {
        if (f16)
            ((u16*)kc)[c + d0] = (u16)f32_f16(ko[h + d0]);
        else
            ((float*)kc)[c + d0] = ko[h + d0];
    }
    if (d1 < head_dim) {
        if (f16)
            ((u16*)kc)[c + d1] = (u16)f32_f16(ko[h + d1]);
        else
            ((float*)kc)[c + d1] = ko[h + d1];
    }
}

// Whether (v, i) ranks before (bv, bi): larger value, then lower index.
__device__ __forceinline__ bool ranks_before(float v, u32 i, float bv, u32 bi) {
    return v > bv || (v == bv && i < bi);
}

// The best (value, index) of the block, in every thread; `sv`, `si` hold ROW_BLOCK entries.
__device__ __forceinline__ void block_best(float* v, u32* i, float* sv, u32* si) {
    const u32 t = threadIdx.x;
    __syncthreads();
    sv[t] = *v;
    si[t] = *i;
    __syncthreads();
    for (u32 s = ROW_BLOCK / 2; s > 0; s >>= 1) {
        if (t < s && ranks_before(sv[t + s], si[t + s], sv[t], si[t])) {
            sv[t] = sv[t + s];
            si[t] = si[t + s];
        }
        __syncthreads();
    }
    *v = sv[0];
    *i = si[0];
}

// Whether every value of the row is finite, in every thread.
__device__ __forceinline__ bool row_finite(const float* xr, u32 width, float* scratch) {
    float bad = 0.0f;
    for (u32 i = threadIdx.x; i < width; i += ROW_BLOCK)
        if (!isfinite(xr[i])) bad = 1.0f;
    return block_max(bad, scratch, ROW_BLOCK) == 0.0f;
}

// Op::Argmax: the lowest index of the largest value of each row, or
// NON_FINITE_ROW; one block per row.
extern "C" __global__ void argmax_f32(const float* __restrict__ x, u32* out, u32 width) {
    __shared__ float sv[ROW_BLOCK];
    __shared__ u32 si[ROW_BLOCK];
    __shared__ float scratch[32];
    const float* xr = x + (u64)blockIdx.x * width;
    if (!row_finite(xr, width, scratch) || width == 0) {
        if (threadIdx.x == 0) out[blockIdx.x] = NON_FINITE_ROW;
        return;
    }
    float bv = NEG_INF;
    u32 bi = 0xffffffffu;
    for (u32 i = threadIdx.x; i < width; i += ROW_BLOCK)
        if (ranks_before(xr[i], i, bv, bi)) {
            bv = xr[i];
            bi = i;
        }
    block_best(&bv, &bi, sv, si);
    if (threadIdx.x == 0) out[blockIdx.x] = bi;
}

// Op::Argmax over wide rows (a vocabulary) in two launches: argmax_part
// takes slice blockIdx.x of `len` values of row blockIdx.y (many blocks
// stream a row at once) and writes its best (value, index, whether every
// value was finite) to part[row * slices + slice]; argmax_final picks
// each row's best of its slices, or NON_FINITE_ROW.
extern "C" __global__ void argmax_part(const float* __restrict__ x, u32* __restrict__ part, u32 width, u32 len) {
    __shared__ float sv[ROW_BLOCK];
    __shared__ u32 si[ROW_BLOCK];
    __shared__ float scratch[32];
    const u32 slice = blockIdx.x, slices = gridDim.x;
    const float* xr = x + (u64)blockIdx.y * width;
    const u32 begin = slice * len, end = min(width, begin + len);
    float bv = NEG_INF, bad = 0.0f;
    u32 bi = 0xffffffffu;
#pragma unroll 4
    for (u32 i = begin + threadIdx.x; i < end; i += ROW_BLOCK) {
        const float v = xr[i];
        if (!isfinite(v)) bad = 1.0f;
        if (ranks_before(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    bad = block_max(bad, scratch, ROW_BLOCK);
    block_best(&bv, &bi, sv, si);
    if (threadIdx.x == 0) {
        u32* o = part + ((u64)blockIdx.y * slices + slice) * 3;
        o[0] = f32_bits(bv);
        o[1] = bi;
        o[2] = bad == 0.0f;
    }
}

extern "C" __global__ void argmax_final(const u32* __restrict__ part, u32* out, u32 slices) {
    const u32* p = part + (u64)blockIdx.x * slices * 3;
    const u32 lane = threadIdx.x;
    float bv = NEG_INF;
    u32 bi = 0xffffffffu, finite = 1;
    for (u32 s = lane; s < slices; s += WARP) {
        const float v = bits_f32(p[3 * s]);
        const u32 i = p[3 * s + 1];
        finite &= p[3 * s + 2];
        if (ranks_before(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
#pragma unroll
    for (int m = WARP / 2; m > 0; m >>= 1) {
        const float ov = SHFL_XOR(bv, m);
        const u32 oi = SHFL_XOR(bi, m), of = SHFL_XOR(finite, m);
        finite &= of;
        if (ranks_before(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    if (lane == 0) out[blockIdx.x] = finite ? bi : NON_FINITE_ROW;
}

// Op::TopK: the k best (index, value) pairs of each row, best first, as
// k rounds of the best entry ranked after the last one taken; a row with
// a non-finite value gives k pairs (NON_FINITE_ROW, NaN). One block a row.
extern "C" __global__ void top_k_f32(const float* __restrict__ x, u32* out, u32 width, u32 k) {
    __shared__ float sv[ROW_BLOCK];
    __shared__ u32 si[ROW_BLOCK];
    __shared__ float scratch[32];
    const float* xr = x + (u64)blockIdx.x * width;
    u32* o = out + (u64)blockIdx.x * k * 2;
    if (!row_finite(xr, width, scratch)) {
        for (u32 j = threadIdx.x; j < k; j += ROW_BLOCK) {
            o[2 * j] = NON_FINITE_ROW;
            o[2 * j + 1] = 0x7fc00000u;
        }
        return;
    }
    float lv = __int_as_float(0x7f800000);  // +inf: everything ranks after it
    u32 li = 0;
    for (u32 r = 0; r < k; r++) {
        float bv = NEG_INF;
        u32 bi = 0xffffffffu;
        for (u32 i = threadIdx.x; i < width; i += ROW_BLOCK) {
            const float v = xr[i];
            if (ranks_before(lv, li, v, i) && ranks_before(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
        block_best(&bv, &bi, sv, si);
        if (threadIdx.x == 0) {
            o[2 * r] = bi;
            o[2 * r + 1] = f32_bits(bv);
        }
        lv = bv;
        li = bi;
    }
}

// The best (value, index) of the block through warp shuffles (two
// barriers), in every thread; `sv`, `si` hold 32 entries.
__device__ __forceinline__ void block_best_fast(float* v, u32* i, float* sv, u32* si) {
    const u32 lane = threadIdx.x % WARP, wid = threadIdx.x / WARP, warps = blockDim.x / WARP;
    float bv = *v;
    u32 bi = *i;
#pragma unroll
    for (int m = WARP / 2; m > 0; m >>= 1) {
        const float ov = SHFL_XOR(bv, m);
        const u32 oi = SHFL_XOR(bi, m);
        if (ranks_before(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    __syncthreads();
    if (lane == 0) {
        sv[wid] = bv;
        si[wid] = bi;
    }
    __syncthreads();
    bv = lane < warps ? sv[lane] : NEG_INF;
    bi = lane < warps ? si[lane] : 0xffffffffu;
#pragma unroll
    for (int m = WARP / 2; m > 0; m >>= 1) {
        const float ov = SHFL_XOR(bv, m);
        const u32 oi = SHFL_XOR(bi, m);
        if (ranks_before(ov, oi, bv, bi)) {
            bv = ov;
            bi = oi;
        }
    }
    *v = bv;
    *i = bi;
}

// Op::TopK over wide rows in two launches, as argmax_part / argmax_final:
// top_k_part takes slice blockIdx.x (`len` values, at most TOPK_SLICE) of
// row blockIdx.y into shared memory and writes its k best pairs (fewer
// values: (NEG_INF, 0xffffffff) after them) and whether every value was
// finite; top_k_final takes each row's k best of its slices' pairs. The k
// best of a row are among the k best of its slices.
#define TOPK_SLICE 4096
extern "C" __global__ void top_k_part(const float* __restrict__ x, u32* __restrict__ part, u32* __restrict__ flags,
                                      u32 width, u32 len, u32 k) {
    __shared__ float vals[TOPK_SLICE];
    __shared__ float sv[32];
    __shared__ u32 si[32];
    __shared__ float scratch[32];
    const u32 slice = blockIdx.x, slices = gridDim.x;
    const float* xr = x + (u64)blockIdx.y * width;
    const u32 begin = slice * len, count = min(width, begin + len) - begin;
    float bad = 0.0f;
    for (u32 j = threadIdx.x; j < count; j += ROW_BLOCK) {
        const float v = xr[begin + j];
        if (!isfinite(v)) bad = 1.0f;
        vals[j] = v;
    }
    bad = block_max(bad, scratch, ROW_BLOCK);
    u32* o = part + ((u64)blockIdx.y * slices + slice) * k * 2;
    float lv = __int_as_float(0x7f800000);
    u32 li = 0;
    for (u32 r = 0; r < k; r++) {
        float bv = NEG_INF;
        u32 bi = 0xffffffffu;
        for (u32 j = threadIdx.x; j < count; j += ROW_BLOCK) {
            const float v = vals[j];
            const u32 i = begin + j;
            if (ranks_before(lv, li, v, i) && ranks_before(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
        block_best_fast(&bv, &bi, sv, si);
        if (threadIdx.x == 0) {
            o[2 * r] = bi;
            o[2 * r + 1] = f32_bits(bv);
        }
        lv = bv;
        li = bi;
    }
    if (threadIdx.x == 0) flags[(u64)blockIdx.y * slices + slice] = bad == 0.0f;
}

extern "C" __global__ void top_k_final(const u32* __restrict__ part, const u32* __restrict__ flags, u32* out,
                                       u32 slices, u32 k) {
    __shared__ float sv[32];
    __shared__ u32 si[32];
    const u32 n = slices * k;
    const u32* c = part + (u64)blockIdx.x * n * 2;
    u32* o = out + (u64)blockIdx.x * k * 2;
    u32 finite = 1;
    for (u32 s = 0; s < slices; s++) finite &= flags[(u64)blockIdx.x * slices + s];
    if (!finite) {
        for (u32 j = threadIdx.x; j < k; j += ROW_BLOCK) {
            o[2 * j] = NON_FINITE_ROW;
            o[2 * j + 1] = 0x7fc00000u;
        }
        return;
    }
    float lv = __int_as_float(0x7f800000);
    u32 li = 0;
    for (u32 r = 0; r < k; r++) {
        float bv = NEG_INF;
        u32 bi = 0xffffffffu;
        for (u32 j = threadIdx.x; j < n; j += ROW_BLOCK) {
            const u32 i = c[2 * j];
            const float v = bits_f32(c[2 * j + 1]);
            if (ranks_before(lv, li, v, i) && ranks_before(v, i, bv, bi)) {
                bv = v;
                bi = i;
            }
        }
        block_best_fast(&bv, &bi, sv, si);
        if (threadIdx.x == 0) {
            o[2 * r] = bi;
            o[2 * r + 1] = f32_bits(bv);
        }
        lv = bv;
        li = bi;
    }
}

// Op::MoeTopK: softmax over the experts, the k most probable (ties: the
// lower index), their probabilities renormalised; one thread per token.
extern "C" __global__ void moe_top_k(const float* __restrict__ logits, u32* ids, float* wts, u32 n_expert, u32 k,
                                     u32 tokens) {
    const u32 t = blockIdx.x * blockDim.x + threadIdx.x;
    if (t >= tokens) return;
    const float* l = logits + (u64)t * n_expert;
    float m = NEG_INF;
    for (u32 e = 0; e < n_expert; e++) m = fmaxf(m, l[e]);
    float sum = 0.0f;
    for (u32 e = 0; e < n_expert; e++) sum += expf(l[e] - m);
    float lv = __int_as_float(0x7f800000);
    u32 li = 0;
    float picked = 0.0f;
    for (u32 j = 0; j < k; j++) {
        float bv = NEG_INF;
        u32 bi = 0xffffffffu;
        for (u32 e = 0; e < n_expert; e++) {
            const float p = expf(l[e] - m) / sum;
            if (ranks_before(lv, li, p, e) && ranks_before(p, e, bv, bi)) {
                bv = p;
                bi = e;
            }
        }
        ids[t * k + j] = bi;
        wts[t * k + j] = bv;
        picked += bv;
        lv = bv;
        li = bi;
    }
    for (u32 j = 0; j < k; j++) wts[t * k + j] /= picked;
}
