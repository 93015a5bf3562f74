// CUDA kernels of the chunked log-prob op (crates/grpo-candle/src/ops/logprob.rs).
//
// The logits of a block of tokens x vocabulary ids come from a cuBLAS matmul; these kernels do
// the rest of the op in one pass over the block each:
//   grpo_logprob_stats_*: folds the block into each token's running softmax statistics
//                         (max m, s = sum exp(z - m), u = sum exp(z - m) (z - m)) and picks the
//                         target's logit, for the forward.
//   grpo_logprob_grad_*:  turns the block into the gradient of the logits in place,
//                         dz = exp(z - lse) (a - b z) + g [column == target], for the backward.
// Statistics and coefficients are f32 whatever the logits' type.

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <math_constants.h>

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f32(__half x) { return __half2float(x); }

template <typename T> __device__ __forceinline__ T from_f32(float x);
template <> __device__ __forceinline__ float from_f32<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_f32<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_f32<__half>(float x) { return __float2half(x); }

// Block-wide reductions for blockDim.x a multiple of 32, at most 1024.
__device__ __forceinline__ float block_max(float v, float* shared) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    const int warps = blockDim.x >> 5;
    v = (threadIdx.x < warps) ? shared[threadIdx.x] : -CUDART_INF_F;
    if (warp == 0) {
        for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, o));
        if (lane == 0) shared[0] = v;
    }
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

__device__ __forceinline__ float block_sum(float v, float* shared) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    const int warps = blockDim.x >> 5;
    v = (threadIdx.x < warps) ? shared[threadIdx.x] : 0.0f;
    if (warp == 0) {
        for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffff, v, o);
        if (lane == 0) shared[0] = v;
    }
    __syncthreads();
    v = shared[0];
    __syncthreads();
    return v;
}

// One thread block per row of z [rows, cols]; state is [rows, 4] = (m, s, u, z_target).
template <typename T>
__device__ void logprob_stats(const T* z, float* state, const unsigned int* targets, int rows,
                              int cols, int v0) {
    __shared__ float shared[32];
    const int r = blockIdx.x;
    if (r >= rows) return;
    const T* row = z + (size_t)r * cols;
    float mx = -CUDART_INF_F;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) mx = fmaxf(mx, to_f32(row[c]));
    mx = block_max(mx, shared);
    float* st = state + (size_t)r * 4;
    const float m_old = st[0];
    const float m = fmaxf(m_old, mx);
    float s = 0.0f, u = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        const float d = to_f32(row[c]) - m;
        const float e = __expf(d);
        s += e;
        u += e * d;
    }
    s = block_sum(s, shared);
    u = block_sum(u, shared);
    if (threadIdx.x == 0) {
        float s_old = st[1], u_old = st[2];
        if (s_old > 0.0f) {
            // Rescale to the new max: exp(z - m) = exp(z - m_old) c, (z - m) = (z - m_old) + d.
            const float d = m_old - m;
            const float c = __expf(d);
            u_old = c * (u_old + d * s_old);
            s_old = c * s_old;
        }
        st[0] = m;
        st[1] = s_old + s;
        st[2] = u_old + u;
        const long long y = (long long)targets[r] - v0;
        if (y >= 0 && y < cols) st[3] = to_f32(row[y]);
    }
}

// In place over z [rows, cols]; coef is [rows, 4] = (g, a, b, lse).
template <typename T>
__device__ void logprob_grad(T* z, const float* coef, const unsigned int* targets, int rows,
                             int cols, int v0) {
    const size_t n = (size_t)rows * cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / cols;
        const int c = (int)(i - r * cols);
        const float* k = coef + r * 4;
        const float x = to_f32(z[i]);
        float v = __expf(x - k[3]) * (k[1] - k[2] * x);
        if ((long long)targets[r] == (long long)v0 + c) v += k[0];
        z[i] = from_f32<T>(v);
    }
}

#define GRPO_LOGPROB_KERNELS(NAME, T)                                                          \
    extern "C" __global__ void grpo_logprob_stats_##NAME(const T* z, float* state,             \
                                                         const unsigned int* targets,          \
                                                         int rows, int cols, int v0) {         \
        logprob_stats<T>(z, state, targets, rows, cols, v0);                                   \
    }                                                                                          \
    extern "C" __global__ void grpo_logprob_grad_##NAME(T* z, const float* coef,               \
                                                        const unsigned int* targets, int rows, \
                                                        int cols, int v0) {                    \
        logprob_grad<T>(z, coef, targets, rows, cols, v0);                                     \
    }

GRPO_LOGPROB_KERNELS(f32, float)
GRPO_LOGPROB_KERNELS(bf16, __nv_bfloat16)
GRPO_LOGPROB_KERNELS(f16, __half)
