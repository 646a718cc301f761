// Sparse shared-KV attention with sinks, and the lightning indexer's scores.
#include "backend/cuda/kernels.h"

namespace deepinfer::cuda {

namespace {

constexpr int kAttnThreads = 128;
constexpr int kMaxPerThread = 8;  // head_dim <= 1024

// One block per (query row, head): an online softmax over the row's key list; the sink joins the denominator.
__global__ void __launch_bounds__(kAttnThreads)
    sparse_attention_kernel(float* __restrict__ out, const float* __restrict__ q, const float* __restrict__ keys,
                            const int32_t* __restrict__ offsets, const int32_t* __restrict__ indices,
                            const float* __restrict__ sinks, int64_t heads, int64_t d, float scale) {
    const int64_t th = blockIdx.x, r = th / heads, h = th % heads;
    const float* qv = q + th * d;
    float qreg[kMaxPerThread], acc[kMaxPerThread];
    int count = 0;
    for (int64_t c = threadIdx.x; c < d; c += kAttnThreads) {
        qreg[count] = qv[c];
        acc[count] = 0;
        ++count;
    }
    float m = -INFINITY, denom = 0;
    for (int32_t i = offsets[r]; i < offsets[r + 1]; ++i) {
        const float* kv = keys + static_cast<int64_t>(indices[i]) * d;
        float dot = 0;
        for (int j = 0; j < count; ++j) dot += qreg[j] * kv[threadIdx.x + j * kAttnThreads];
        const float s = block_sum(dot) * scale;
        const float m_new = fmaxf(m, s);
        const float rescale = expf(m - m_new), p = expf(s - m_new);
        denom = denom * rescale + p;
        for (int j = 0; j < count; ++j) acc[j] = acc[j] * rescale + p * kv[threadIdx.x + j * kAttnThreads];
        m = m_new;
    }
    const float sink = sinks[h];
    const float m_final = fmaxf(m, sink);
    const float rescale = expf(m - m_final);
    denom = denom * rescale + expf(sink - m_final);
    float* ov = out + th * d;
    for (int j = 0; j < count; ++j) ov[threadIdx.x + j * kAttnThreads] = acc[j] * rescale / denom;
}

// scores[r, e] = scale * sum_h weights[r, h] * relu(q[r, h] . keys[e]); one thread per (r, e).
__global__ void indexer_scores_kernel(float* __restrict__ scores, const float* __restrict__ q,
                                      const float* __restrict__ keys, const float* __restrict__ weights, int64_t rows,
                                      int64_t heads, int64_t c, int64_t entries, float scale) {
    const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
    if (i >= rows * entries) return;
    const int64_t r = i / entries, e = i % entries;
    const float* kv = keys + e * c;
    float acc = 0;
    for (int64_t h = 0; h < heads; ++h) {
        const float* qv = q + (r * heads + h) * c;
        float dot = 0;
        for (int64_t k = 0; k < c; ++k) dot += qv[k] * kv[k];
        acc += fmaxf(dot, 0.0f) * scale * weights[r * heads + h];
    }
    scores[i] = acc;
}

}  // namespace

void launch_sparse_attention(float* out, const float* q, const float* keys, const int32_t* offsets,
                             const int32_t* indices, const float* sinks, int64_t rows, int64_t heads, int64_t d,
                             float scale, cudaStream_t stream) {
    DI_ICHECK(d <= kAttnThreads * kMaxPerThread, "head_dim ", d, " is too large for the CUDA attention kernel");
    if (rows * heads == 0) return;
    sparse_attention_kernel<<<static_cast<unsigned>(rows * heads), kAttnThreads, 0, stream>>>(
        out, q, keys, offsets, indices, sinks, heads, d, scale);
    DI_CUDA_LAUNCH_CHECK();
}

void launch_indexer_scores(float* scores, const float* q, const float* keys, const float* weights, int64_t rows,
                           int64_t heads, int64_t c, int64_t entries, float scale, cudaStream_t stream) {
    const int64_t n = rows * entries;
    if (n == 0) return;
    indexer_scores_kernel<<<static_cast<unsigned>((n + 255) / 256), 256, 0, stream>>>(scores, q, keys, weights, rows,
                                                                                       heads, c, entries, scale);
    DI_CUDA_LAUNCH_CHECK();
}

}  // namespace deepinfer::cuda
