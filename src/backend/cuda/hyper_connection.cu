// Manifold-constrained hyper-connections: coefficients (one block per token), collapse and expand.
#include "backend/cuda/kernels.h"

namespace deepinfer::cuda {

namespace {

constexpr int kMaxMix = 128;  // (2 + n) * n for n <= 9

__device__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// mix[j] = (fn_j . f) * rsqrt(mean(f^2) + eps) for the token's flattened streams f.
__device__ void mix_logits(const float* f, int64_t width, const float* fn, int rows, float norm_eps, float* mix) {
    float ss = 0;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) ss += f[i] * f[i];
    const float inv = 1.0f / sqrtf(block_sum(ss) / static_cast<float>(width) + norm_eps);
    for (int j = 0; j < rows; ++j) {
        float acc = 0;
        for (int64_t i = threadIdx.x; i < width; i += blockDim.x) acc += (f[i] * inv) * fn[j * width + i];
        acc = block_sum(acc);
        if (threadIdx.x == 0) mix[j] = acc;
    }
    __syncthreads();
}

__global__ void hc_mix_kernel(float* __restrict__ pre, float* __restrict__ post, float* __restrict__ comb,
                              const float* __restrict__ streams, int64_t d, HcDesc p) {
    __shared__ float mix[kMaxMix];
    const int n = p.n;
    const int64_t width = n * d;
    mix_logits(streams + blockIdx.x * width, width, p.fn, (2 + n) * n, p.norm_eps, mix);
    if (threadIdx.x != 0) return;
    float* pr = pre + blockIdx.x * n;
    float* po = post + blockIdx.x * n;
    float* c = comb + blockIdx.x * n * n;
    for (int j = 0; j < n; ++j) {
        pr[j] = sigmoid(mix[j] * p.scale[0] + p.base[j]) + p.hc_eps;
        po[j] = 2.0f * sigmoid(mix[n + j] * p.scale[1] + p.base[n + j]);
    }
    for (int i = 0; i < n; ++i) {
        float m = -INFINITY;
        for (int k = 0; k < n; ++k) {
            c[i * n + k] = mix[2 * n + i * n + k] * p.scale[2] + p.base[2 * n + i * n + k];
            m = fmaxf(m, c[i * n + k]);
        }
        float sum = 0;
        for (int k = 0; k < n; ++k) sum += (c[i * n + k] = expf(c[i * n + k] - m));
        for (int k = 0; k < n; ++k) c[i * n + k] = c[i * n + k] / sum + p.hc_eps;
    }
    for (int it = 0; it < p.sinkhorn_iters; ++it) {
        if (it > 0)  // rows, then columns; the first sweep normalises columns only
            for (int i = 0; i < n; ++i) {
                float sum = 0;
                for (int k = 0; k < n; ++k) sum += c[i * n + k];
                for (int k = 0; k < n; ++k) c[i * n + k] /= sum + p.hc_eps;
            }
        for (int k = 0; k < n; ++k) {
            float sum = 0;
            for (int i = 0; i < n; ++i) sum += c[i * n + k];
            for (int i = 0; i < n; ++i) c[i * n + k] /= sum + p.hc_eps;
        }
    }
}

__global__ void hc_head_pre_kernel(float* __restrict__ pre, const float* __restrict__ streams, int64_t d, HcDesc p) {
    __shared__ float mix[kMaxMix];
    const int64_t width = p.n * d;
    mix_logits(streams + blockIdx.x * width, width, p.fn, p.n, p.norm_eps, mix);
    if (threadIdx.x < p.n)
        pre[blockIdx.x * p.n + threadIdx.x] = sigmoid(mix[threadIdx.x] * p.scale[0] + p.base[threadIdx.x]) + p.hc_eps;
}

__global__ void hc_collapse_kernel(float* __restrict__ out, const float* __restrict__ streams,
                                   const float* __restrict__ pre, int64_t rows, int64_t n, int64_t d) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * d) return;
    const int64_t r = i / d, c = i % d;
    float acc = 0;
    for (int64_t j = 0; j < n; ++j) acc += pre[r * n + j] * streams[(r * n + j) * d + c];
    out[i] = acc;
}

__global__ void hc_post_kernel(float* __restrict__ out, const float* __restrict__ y, const float* __restrict__ post,
                               const float* __restrict__ comb, const float* __restrict__ streams, int64_t rows,
                               int64_t n, int64_t d) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * n * d) return;
    const int64_t c = i % d, k = (i / d) % n, r = i / (n * d);
    float acc = post[r * n + k] * y[r * d + c];
    for (int64_t j = 0; j < n; ++j) acc += comb[(r * n + j) * n + k] * streams[(r * n + j) * d + c];
    out[i] = acc;
}

unsigned blocks_for(int64_t n, int threads) { return static_cast<unsigned>((n + threads - 1) / threads); }

}  // namespace

void launch_hc_mix(float* pre, float* post, float* comb, const float* streams, int64_t rows, int64_t d,
                   const HcDesc& p, cudaStream_t stream) {
    DI_ICHECK((2 + p.n) * p.n <= kMaxMix, "hc_mult ", p.n, " is too large for the CUDA kernels");
    if (rows == 0) return;
    hc_mix_kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(pre, post, comb, streams, d, p);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_hc_head_pre(float* pre, const float* streams, int64_t rows, int64_t d, const HcDesc& p,
                        cudaStream_t stream) {
    if (rows == 0) return;
    hc_head_pre_kernel<<<static_cast<unsigned>(rows), 256, 0, stream>>>(pre, streams, d, p);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_hc_collapse(float* out, const float* streams, const float* pre, int64_t rows, int64_t n, int64_t d,
                        cudaStream_t stream) {
    if (rows * d == 0) return;
    hc_collapse_kernel<<<blocks_for(rows * d, 256), 256, 0, stream>>>(out, streams, pre, rows, n, d);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_hc_post(float* out, const float* y, const float* post, const float* comb, const float* streams,
                    int64_t rows, int64_t n, int64_t d, cudaStream_t stream) {
    if (rows * n * d == 0) return;
    hc_post_kernel<<<blocks_for(rows * n * d, 256), 256, 0, stream>>>(out, y, post, comb, streams, rows, n, d);
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace deepinfer::cuda
