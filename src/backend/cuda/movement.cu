// Row gather/scatter through device addresses, element-wise add and scale, the MoE combine.
#include "backend/cuda/kernels.h"

namespace deepinfer::cuda {

namespace {

__global__ void gather_rows_kernel(float* __restrict__ dst, const float* const* __restrict__ rows, int64_t r,
                                   int64_t c) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < r * c) dst[i] = rows[i / c][i % c];
}

__global__ void scatter_rows_kernel(float* const* __restrict__ rows, const float* __restrict__ src, int64_t r,
                                    int64_t c) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < r * c) rows[i / c][i % c] = src[i];
}

__global__ void add_kernel(float* __restrict__ x, const float* __restrict__ y, int64_t n) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] += y[i];
}

__global__ void scale_kernel(float* __restrict__ x, float s, int64_t n) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= s;
}

__global__ void moe_combine_kernel(float* __restrict__ out, const float* __restrict__ routed,
                                   const float* __restrict__ weights, const float* __restrict__ shared, int64_t t,
                                   int64_t k, int64_t d) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= t * d) return;
    const int64_t r = i / d, c = i % d;
    float acc = 0;
    for (int64_t j = 0; j < k; ++j) acc += weights[r * k + j] * routed[(r * k + j) * d + c];
    out[i] = acc + shared[i];
}

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + 255) / 256); }

}  // namespace

void launch_gather_rows(float* dst, const float* const* rows, int64_t r, int64_t c, cudaStream_t stream) {
    if (r * c == 0) return;
    gather_rows_kernel<<<blocks_for(r * c), 256, 0, stream>>>(dst, rows, r, c);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_scatter_rows(float* const* rows, const float* src, int64_t r, int64_t c, cudaStream_t stream) {
    if (r * c == 0) return;
    scatter_rows_kernel<<<blocks_for(r * c), 256, 0, stream>>>(rows, src, r, c);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_add(float* x, const float* y, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    add_kernel<<<blocks_for(n), 256, 0, stream>>>(x, y, n);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_scale(float* x, float s, int64_t n, cudaStream_t stream) {
    if (n == 0) return;
    scale_kernel<<<blocks_for(n), 256, 0, stream>>>(x, s, n);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_moe_combine(float* out, const float* routed, const float* weights, const float* shared, int64_t t,
                        int64_t k, int64_t d, cudaStream_t stream) {
    if (t * d == 0) return;
    moe_combine_kernel<<<blocks_for(t * d), 256, 0, stream>>>(out, routed, weights, shared, t, k, d);
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace deepinfer::cuda
