// The decode matrix-vector kernels of shaders/cuda/matmul.cu timed alone on
// the Llama-3.1-8B shapes, every variant beside the one the backend runs:
// microseconds a launch and the weight bytes read a second, over copies of
// the weights that together overflow the L2 (each launch reads DRAM, as a
// model's layers do). Each variant's output is checked against the
// backend's kernel on the same random data.
//
//   nvcc -O3 -arch=sm_90 -o /root/mv-bench scripts/mv-bench.cu && /root/mv-bench [filter]
//
// Built and run by scripts/cuda-bench.sh (`mv`) with the toolkit's nvcc.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#define HEARTH_MV_VARIANTS
#include "../shaders/cuda/common.cuh"
#include "../shaders/cuda/quant.cuh"
#include "../shaders/cuda/matmul.cu"

typedef void (*Mv)(const u32*, const u32*, const u32*, u32, u32, u32, u32, u32, const uint4*, const float2*,
                   float*, float*, float*, u32, u32);

struct Kernel {
    std::string name;
    Mv f;
    u32 nt, rows_per_warp;  // rows_per_warp 0: the persistent grid of mv_q8
};

#define K_OLD(F, NT) {"mv_q8_" #F "_" #NT, mv_q8_##F##_##NT, NT, 0},
#define K_NEW(F, NT, R) {"mvr_q8_" #F "_" #NT "_" #R, mvr_q8_##F##_##NT##_##R, NT, R},
#define K_U2(F, R) {"mvr_q8_" #F "_1_" #R "_u2", mvr_q8_##F##_1_##R##_u2, 1, R},
#define K_SET(F)                                                                                      \
    K_OLD(F, 1) K_OLD(F, 4) K_OLD(F, 8) K_NEW(F, 1, 1) K_U2(F, 1) K_NEW(F, 1, 2) K_U2(F, 2)          \
    K_NEW(F, 1, 4) K_NEW(F, 4, 1) K_NEW(F, 4, 2) K_NEW(F, 8, 1) K_NEW(F, 8, 2)

struct Format {
    const char* name;
    u32 block_elems, block_bytes, scale_split;  // scale_split: the f16 d sits after the bodies
    std::vector<Kernel> kernels;
};

static u32 row_bytes(const Format& f, u32 k) {
    const u32 nb = k / f.block_elems;
    return (nb * f.block_bytes + 15) / 16 * 16;
}

static void check(cudaError_t e, const char* what) {
    if (e != cudaSuccess) {
        fprintf(stderr, "mv-bench: %s: %s\n", what, cudaGetErrorString(e));
        exit(1);
    }
}

// Random halfwords that are all finite, small f16s: whichever bytes a format
// reads as a scale, it reads a number.
static std::vector<u16> random_halves(size_t n, std::mt19937& rng) {
    std::vector<u16> v(n);
    for (auto& h : v) {
        const u32 r = rng();
        h = (u16)((r & 0x83ffu) | ((8u + (r >> 16) % 5u) << 10));
    }
    return v;
}

int main(int argc, char** argv) {
    const char* filter = argc > 1 ? argv[1] : "";
    std::vector<Format> formats = {
        {"q4_k", 256, 144, 0, {K_SET(q4_k)}},
        {"q6_k", 256, 210, 1, {K_SET(q6_k)}},
        {"q4_0", 32, 18, 1, {K_SET(q4_0)}},
        {"q8_0", 32, 34, 1, {K_SET(q8_0)}},
    };
    struct Shape {
        const char* fmt;
        const char* what;
        u32 rows, k;
    };
    const Shape shapes[] = {
        {"q4_k", "q|k|v", 6144, 4096},  {"q4_k", "o", 4096, 4096},         {"q4_k", "gate|up", 28672, 4096},
        {"q4_k", "down", 4096, 14336},  {"q6_k", "down", 4096, 14336},     {"q6_k", "v", 1024, 4096},
        {"q6_k", "output", 128256, 4096}, {"q4_0", "gate|up", 28672, 4096}, {"q4_0", "o", 4096, 4096},
        {"q8_0", "gate|up", 28672, 4096}, {"q8_0", "o", 4096, 4096},
    };
    const u32 batches[] = {1, 4, 8, 16};
    int sms = 0;
    check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), "attribute");
    cudaDeviceProp prop;
    check(cudaGetDeviceProperties(&prop, 0), "properties");
    printf("%s, %d SMs, L2 %d MiB\n", prop.name, sms, prop.l2CacheSize >> 20);
    std::mt19937 rng(1);
    cudaEvent_t ev0, ev1;
    cudaEventCreate(&ev0);
    cudaEventCreate(&ev1);
    for (const Shape& s : shapes) {
        const Format* f = nullptr;
        for (auto& x : formats)
            if (!strcmp(x.name, s.fmt)) f = &x;
        const std::string label = std::string(s.fmt) + " " + s.what;
        if (*filter && label.find(filter) == std::string::npos) continue;
        const u32 rb = row_bytes(*f, s.k);
        const size_t bytes = (size_t)rb * s.rows;
        const size_t copies = std::max<size_t>(2, (size_t(320) << 20) / bytes + 1);
        std::vector<u16> host = random_halves(bytes / 2, rng);
        std::vector<u32*> w(copies);
        for (auto& p : w) {
            check(cudaMalloc(&p, bytes), "weights");
            check(cudaMemcpy(p, host.data(), bytes, cudaMemcpyHostToDevice), "upload");
        }
        const u32 mmax = 16;
        std::vector<u8> xqh((size_t)mmax * s.k);
        for (auto& b : xqh) b = (u8)rng();
        std::vector<float2> xsh((size_t)mmax * s.k / 16);
        std::uniform_real_distribution<float> uni(-1.0f, 1.0f);
        for (auto& v : xsh) v = make_float2(uni(rng) * 0.01f, uni(rng));
        uint4* xq;
        float2* xs;
        float *y, *yref;
        check(cudaMalloc(&xq, xqh.size()), "xq");
        check(cudaMalloc(&xs, xsh.size() * sizeof(float2)), "xs");
        check(cudaMalloc(&y, (size_t)mmax * s.rows * 4), "y");
        check(cudaMalloc(&yref, (size_t)mmax * s.rows * 4), "y");
        cudaMemcpy(xq, xqh.data(), xqh.size(), cudaMemcpyHostToDevice);
        cudaMemcpy(xs, xsh.data(), xsh.size() * sizeof(float2), cudaMemcpyHostToDevice);
        for (u32 m : batches) {
            // The backend's kernel at this batch: NT of tokens_per_launch.
            const u32 nt_old = m == 1 ? 1 : m <= 4 ? 4 : 8;
            bool have_ref = false;
            std::vector<float> ref((size_t)m * s.rows), got((size_t)m * s.rows);
            for (const Kernel& kn : f->kernels) {
                const bool old = kn.rows_per_warp == 0;
                if (old ? kn.nt != nt_old : (kn.nt < m && kn.nt * 2 < m) || (kn.nt >= 2 * m && kn.nt > 1))
                    continue;
                const u32 gy = (m + kn.nt - 1) / kn.nt;
                u32 gx;
                if (old) {
                    int per_sm = 0;
                    cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kn.f, MV_WARPS * WARP, 0);
                    const u32 resident = std::max(1, per_sm * sms);
                    gx = std::min((s.rows + MV_WARPS - 1) / MV_WARPS, std::max(1u, resident / gy));
                } else {
                    gx = (s.rows + MV_WARPS * kn.rows_per_warp - 1) / (MV_WARPS * kn.rows_per_warp);
                }
                auto launch = [&](u32 i, float* out) {
                    kn.f<<<dim3(gx, gy), MV_WARPS * WARP>>>(w[i % copies], w[i % copies], w[i % copies], s.rows,
                                                           s.rows, s.rows, rb / 4, s.k / f->block_elems, xq, xs,
                                                           out, out, out, s.k, m);
                };
                launch(0, old ? yref : y);
                check(cudaDeviceSynchronize(), kn.name.c_str());
                const char* verdict = "ref";
                if (old) {
                    cudaMemcpy(ref.data(), yref, ref.size() * 4, cudaMemcpyDeviceToHost);
                    have_ref = true;
                } else if (have_ref) {
                    cudaMemcpy(got.data(), y, got.size() * 4, cudaMemcpyDeviceToHost);
                    double worst = 0, scale = 0;
                    for (size_t i = 0; i < ref.size(); i++) {
                        worst = std::max(worst, (double)fabsf(got[i] - ref[i]));
                        scale = std::max(scale, (double)fabsf(ref[i]));
                    }
                    verdict = worst <= 1e-4 * scale ? "ok" : "WRONG";
                } else {
                    verdict = "unchecked";
                }
                for (u32 i = 0; i < 10; i++) launch(i, y);
                const u32 reps = 200;
                cudaEventRecord(ev0);
                for (u32 i = 0; i < reps; i++) launch(i, y);
                cudaEventRecord(ev1);
                check(cudaEventSynchronize(ev1), "timing");
                float ms = 0;
                cudaEventElapsedTime(&ms, ev0, ev1);
                const double us = ms * 1e3 / reps;
                printf("%-14s %6ux%-6u m=%-2u %-24s %8.1f us %6.0f GB/s %s\n", label.c_str(), s.rows, s.k, m,
                       kn.name.c_str(), us, bytes / (us * 1e-6) / 1e9, verdict);
            }
        }
        for (auto p : w) cudaFree(p);
        cudaFree(xq);
        cudaFree(xs);
        cudaFree(y);
        cudaFree(yref);
    }
    // Prefill: 512 tokens against the gate|up and o weights of Q4_K,
    // dequantized in the tiles (mm_f16) or once (dequant_f16 + mm_h16).
    const Shape gemms[] = {{"q4_k", "gate|up", 28672, 4096}, {"q4_k", "o", 4096, 4096}, {"q6_k", "down", 4096, 14336}};
    check(cudaFuncSetAttribute(mm_h16, cudaFuncAttributeMaxDynamicSharedMemorySize, MH_SMEM), "smem");
    for (const Shape& s : gemms) {
        if (*filter && strcmp(filter, "gemm")) continue;
        const bool k4 = !strcmp(s.fmt, "q4_k");
        const Format& f = formats[k4 ? 0 : 1];
        const u32 rb = row_bytes(f, s.k), m = 512;
        const size_t bytes = (size_t)rb * s.rows;
        std::vector<u16> host = random_halves(bytes / 2, rng);
        u32* w;
        u16 *xh, *wh;
        float *y0, *y1;
        check(cudaMalloc(&w, bytes), "w");
        cudaMemcpy(w, host.data(), bytes, cudaMemcpyHostToDevice);
        std::vector<u16> xhost = random_halves((size_t)m * s.k, rng);
        check(cudaMalloc(&xh, xhost.size() * 2), "xh");
        cudaMemcpy(xh, xhost.data(), xhost.size() * 2, cudaMemcpyHostToDevice);
        check(cudaMalloc(&wh, (size_t)s.rows * s.k * 2), "wh");
        check(cudaMalloc(&y0, (size_t)m * s.rows * 4), "y");
        check(cudaMalloc(&y1, (size_t)m * s.rows * 4), "y");
        const u32 nb = s.k / f.block_elems;
        auto old = [&]() {
            if (k4)
                mm_f16_q4_k<<<dim3((s.rows + 127) / 128, (m + 127) / 128), 256>>>(w, rb / 4, nb, xh, y0, s.rows, s.k,
                                                                               m, s.rows);
            else
                mm_f16_q6_k<<<dim3((s.rows + 127) / 128, (m + 127) / 128), 256>>>(w, rb / 4, nb, xh, y0, s.rows, s.k,
                                                                               m, s.rows);
        };
        const u64 groups = (u64)s.rows * s.k / 8;
        auto deq = [&]() {
            if (k4)
                dequant_f16_q4_k<<<(groups + 255) / 256, 256>>>(w, rb / 4, nb, (uint4*)wh, s.rows, s.k);
            else
                dequant_f16_q6_k<<<(groups + 255) / 256, 256>>>(w, rb / 4, nb, (uint4*)wh, s.rows, s.k);
        };
        auto gemm = [&]() {
            mm_h16<<<dim3((m + 127) / 128, (s.rows + 127) / 128), 256, MH_SMEM>>>(xh, wh, y1, s.rows, s.k, m, s.rows);
        };
        old();
        deq();
        gemm();
        check(cudaDeviceSynchronize(), "gemm");
        std::vector<float> a((size_t)m * s.rows), b(a.size());
        cudaMemcpy(a.data(), y0, a.size() * 4, cudaMemcpyDeviceToHost);
        cudaMemcpy(b.data(), y1, b.size() * 4, cudaMemcpyDeviceToHost);
        double worst = 0, scale = 0;
        for (size_t i = 0; i < a.size(); i++) {
            worst = std::max(worst, (double)fabsf(a[i] - b[i]));
            scale = std::max(scale, (double)fabsf(a[i]));
        }
        auto time = [&](auto&& fn) {
            for (int i = 0; i < 3; i++) fn();
            cudaEventRecord(ev0);
            for (int i = 0; i < 20; i++) fn();
            cudaEventRecord(ev1);
            cudaEventSynchronize(ev1);
            float ms = 0;
            cudaEventElapsedTime(&ms, ev0, ev1);
            return ms * 1e3 / 20;
        };
        const double flop = 2.0 * m * s.rows * s.k;
        const double t_old = time(old), t_deq = time(deq), t_gemm = time(gemm);
        printf("gemm %s %s %ux%u m=%u: mm_f16 %.1f us (%.0f TFLOPS); dequant %.1f us + mm_h16 %.1f us (%.0f TFLOPS, "
               "%.0f with the dequant); max diff %.2e of %.2e %s\n",
               s.fmt, s.what, s.rows, s.k, m, t_old, flop / t_old * 1e-6, t_deq, t_gemm, flop / t_gemm * 1e-6,
               flop / (t_deq + t_gemm) * 1e-6, worst, scale, worst <= 1e-3 * scale ? "ok" : "WRONG");
        cudaFree(w);
        cudaFree(xh);
        cudaFree(wh);
        cudaFree(y0);
        cudaFree(y1);
    }
    return 0;
}
