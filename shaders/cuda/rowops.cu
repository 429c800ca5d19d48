// Row ops of the CUDA backend, one block per row. Written in the subset
// that also compiles as HIP: no headers, no warp intrinsics (the
// reductions go through shared memory), `extern "C"` names.

#define HEARTH_BLOCK 256

// Sum of `v` over the block's HEARTH_BLOCK threads, in every thread.
__device__ float block_sum(float v, float* scratch) {
    const unsigned t = threadIdx.x;
    scratch[t] = v;
    __syncthreads();
    for (unsigned s = HEARTH_BLOCK / 2; s > 0; s >>= 1) {
        if (t < s) {
            scratch[t] += scratch[t + s];
        }
        __syncthreads();
    }
    const float sum = scratch[0];
    __syncthreads();
    return sum;
}

// y = x / sqrt(mean(x^2) + eps) * w over rows of `width` (graph::Op::RmsNorm);
// launched with one block of HEARTH_BLOCK threads per row.
extern "C" __global__ void rms_norm_f32(const float* x, const float* w, float* y,
                                        unsigned width, float eps) {
    __shared__ float scratch[HEARTH_BLOCK];
    const float* xr = x + (unsigned long long)blockIdx.x * width;
    float* yr = y + (unsigned long long)blockIdx.x * width;
    float s = 0.0f;
    for (unsigned i = threadIdx.x; i < width; i += HEARTH_BLOCK) {
        s += xr[i] * xr[i];
    }
    const float scale = rsqrtf(block_sum(s, scratch) / (float)width + eps);
    for (unsigned i = threadIdx.x; i < width; i += HEARTH_BLOCK) {
        yr[i] = xr[i] * scale * w[i];
    }
}
