// Shared by every CUDA kernel file (composed in front of it by the backend,
// hearth_cuda::sources). Written in the subset that also compiles as HIP:
// no headers, `extern "C"` kernels, warp operations through the macros
// below (a HIP build defines them for its wavefronts).

typedef unsigned int u32;
typedef int i32;
typedef unsigned short u16;
typedef unsigned char u8;
typedef unsigned long long u64;

#define WARP 32

#ifdef __HIP_PLATFORM_AMD__
#define SHFL(v, l) __shfl((v), (l), WARP)
#define SHFL_XOR(v, m) __shfl_xor((v), (m), WARP)
#define DP4A(a, b, c) __builtin_amdgcn_sdot4((i32)(a), (i32)(b), (c), false)
#else
#define SHFL(v, l) __shfl_sync(0xffffffffu, (v), (l), WARP)
#define SHFL_XOR(v, m) __shfl_xor_sync(0xffffffffu, (v), (m), WARP)
#define DP4A(a, b, c) __dp4a((i32)(a), (i32)(b), (c))
#endif

// What graph::NON_FINITE_ROW is: the argmax of a row holding a NaN or an infinity.
#define NON_FINITE_ROW 0xffffffffu
#define NEG_INF __int_as_float((i32)0xff800000u)

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int m = WARP / 2; m > 0; m >>= 1) v += SHFL_XOR(v, m);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int m = WARP / 2; m > 0; m >>= 1) v = fmaxf(v, SHFL_XOR(v, m));
    return v;
}

// Sum of `v` over a block of `n` threads (a multiple of WARP, at most
// 32 warps), in every thread; `scratch` holds 32 floats.
__device__ __forceinline__ float block_sum(float v, float* scratch, u32 n) {
    v = warp_sum(v);
    const u32 lane = threadIdx.x % WARP, wid = threadIdx.x / WARP;
    __syncthreads();
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    v = lane < n / WARP ? scratch[lane] : 0.0f;
    return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch, u32 n) {
    v = warp_max(v);
    const u32 lane = threadIdx.x % WARP, wid = threadIdx.x / WARP;
    __syncthreads();
    if (lane == 0) scratch[wid] = v;
    __syncthreads();
    v = lane < n / WARP ? scratch[lane] : NEG_INF;
    return warp_max(v);
}

__device__ __forceinline__ float bits_f32(u32 b) { return __int_as_float((i32)b); }
__device__ __forceinline__ u32 f32_bits(float f) { return (u32)__float_as_int(f); }

// IEEE half (bits) to float, exact for every input.
__device__ __forceinline__ float f16_f32(u32 h) {
    const u32 s = (h & 0x8000u) << 16;
    const u32 e = (h >> 10) & 0x1fu;
    const u32 m = h & 0x3ffu;
    if (e == 0x1fu) return bits_f32(s | 0x7f800000u | (m << 13));
    if (e != 0) return bits_f32(s | ((e + 112u) << 23) | (m << 13));
    // Subnormal (or zero): m * 2^-24.
    const float v = (float)m * 5.9604644775390625e-8f;
    return s ? -v : v;
}

// Float to IEEE half bits, rounding to nearest even (as half::f16::from_f32).
__device__ __forceinline__ u32 f32_f16(float f) {
    const u32 x = f32_bits(f);
    const u32 s = (x >> 16) & 0x8000u;
    const u32 ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) return s | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0u);
    if (ax >= 0x477ff000u) return s | 0x7c00u;  // rounds past the largest half
    if (ax >= 0x38800000u) {                    // normal half
        const u32 m = ax & 0x7fffffu;
        const u32 e = (ax >> 23) - 112u;
        u32 h = (e << 10) | (m >> 13);
        const u32 rest = m & 0x1fffu;
        if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) h += 1u;
        return s | h;
    }
    if (ax < 0x33000000u) return s;             // below half the smallest subnormal
    // Subnormal half: value / 2^-24, rounded to nearest even.
    const u32 e = ax >> 23;
    const u32 m = (ax & 0x7fffffu) | 0x800000u;
    const u32 shift = 126u - e;                 // 14..24
    u32 h = m >> shift;
    const u32 rest = m & ((1u << shift) - 1u);
    const u32 half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (h & 1u))) h += 1u;
    return s | h;
}

// The two halves of a word, value 2i in the low half.
__device__ __forceinline__ float2 f16x2(u32 w) { return make_float2(f16_f32(w & 0xffffu), f16_f32(w >> 16)); }

// The two bf16 of a word (a bf16 is the high half of an f32).
__device__ __forceinline__ float2 bf16x2(u32 w) { return make_float2(bits_f32(w << 16), bits_f32(w & 0xffff0000u)); }

#ifndef __HIP_PLATFORM_AMD__
// PTX helpers of the tensor-core kernels (CUDA only).

// A shared-memory pointer as the 32-bit address ldmatrix and cp.async take.
__device__ __forceinline__ u32 smem_addr(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Two floats as halves (round to nearest), `lo` in the low half.
__device__ __forceinline__ u32 f16x2_of(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}
#endif
