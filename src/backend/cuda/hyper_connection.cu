// Manifold-constrained hyper-connections: mix coefficients (dot products spread over (token, row) blocks, then
// a per-token finish with Sinkhorn), collapse and expand.
#include "backend/cuda/kernels.h"

namespace deepinfer::cuda {

namespace {

__device__ float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }

// mix[t, j] = (fn_j . f_t) * rsqrt(mean(f_t^2) + eps) for token t's flattened streams f_t [n * D]. One block
// per (t, j): a decode step has a handful of tokens, and one block per token left all but a few
// multiprocessors idle while it walked (2 + n) * n dot products of n * D.
__global__ void mix_logits_kernel(float* __restrict__ mix, const float* __restrict__ streams, int64_t width,
                                  const float* __restrict__ fn, float norm_eps) {
    const int64_t t = blockIdx.x;
    const int j = blockIdx.y, rows = gridDim.y;
    const float* f = streams + t * width;
    float ss = 0;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) ss += f[i] * f[i];
    const float inv = 1.0f / sqrtf(block_sum(ss) / static_cast<float>(width) + norm_eps);
    float acc = 0;
    for (int64_t i = threadIdx.x; i < width; i += blockDim.x) acc += (f[i] * inv) * fn[j * width + i];
    acc = block_sum(acc);
    if (threadIdx.x == 0) mix[t * rows + j] = acc;
}

// From a token's mix logits [(2 + n) * n]: pre and post weights [n] and the Sinkhorn-normalised comb [n, n].
// One thread per token.
__global__ void hc_mix_finish_kernel(float* __restrict__ pre, float* __restrict__ post, float* __restrict__ comb,
                                     const float* __restrict__ mix_all, int64_t tokens, HcDesc p) {
    const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (t >= tokens) return;
    const int n = p.n;
    const float* mix = mix_all + t * (2 + n) * n;
    float* pr = pre + t * n;
    float* po = post + t * n;
    float* c = comb + t * n * n;
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

__global__ void hc_head_finish_kernel(float* __restrict__ pre, const float* __restrict__ mix, int64_t tokens,
                                      HcDesc p) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= tokens * p.n) return;
    const int j = static_cast<int>(i % p.n);
    pre[i] = sigmoid(mix[i] * p.scale[0] + p.base[j]) + p.hc_eps;
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

// Stream-ordered scratch (from the retaining pool, so no driver call); free with cudaFreeAsync on `stream`.
float* scratch_floats(int64_t n, cudaStream_t stream) {
    void* p = nullptr;
    DI_CUDA_CHECK(cudaMallocAsync(&p, static_cast<size_t>(n) * sizeof(float), stream));
    return static_cast<float*>(p);
}

}  // namespace

void launch_hc_mix(float* pre, float* post, float* comb, const float* streams, int64_t rows, int64_t d,
                   const HcDesc& p, cudaStream_t stream) {
    if (rows == 0) return;
    const int mix_rows = (2 + p.n) * p.n;
    float* mix = scratch_floats(rows * mix_rows, stream);
    mix_logits_kernel<<<dim3(static_cast<unsigned>(rows), mix_rows), 256, 0, stream>>>(mix, streams, p.n * d, p.fn,
                                                                                     p.norm_eps);
    DI_CUDA_LAUNCH_CHECK();
    hc_mix_finish_kernel<<<blocks_for(rows, 128), 128, 0, stream>>>(pre, post, comb, mix, rows, p);
    DI_CUDA_LAUNCH_CHECK();
    DI_CUDA_CHECK(cudaFreeAsync(mix, stream));
}

void launch_hc_head_pre(float* pre, const float* streams, int64_t rows, int64_t d, const HcDesc& p,
                        cudaStream_t stream) {
    if (rows == 0) return;
    float* mix = scratch_floats(rows * p.n, stream);
    mix_logits_kernel<<<dim3(static_cast<unsigned>(rows), p.n), 256, 0, stream>>>(mix, streams, p.n * d, p.fn,
                                                                                p.norm_eps);
    DI_CUDA_LAUNCH_CHECK();
    hc_head_finish_kernel<<<blocks_for(rows * p.n, 128), 128, 0, stream>>>(pre, mix, rows, p);
    DI_CUDA_LAUNCH_CHECK();
    DI_CUDA_CHECK(cudaFreeAsync(mix, stream));
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
