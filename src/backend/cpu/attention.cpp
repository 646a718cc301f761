// Sparse shared-KV attention with sinks, and the lightning indexer's scores.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace deepinfer {

void CpuBackend::sparse_attention(TensorView out, TensorView q, TensorView keys, const int32_t* offsets,
                                  const int32_t* indices, const float* sinks, float scale) {
    const int64_t t = q.dim(0), heads = q.dim(1), d = q.dim(2);
    DI_ICHECK(out.shape() == q.shape() && keys.dim(1) == d, "sparse_attention shapes");
    const float* qq = q.f32();
    const float* kk = keys.f32();
    float* o = out.f32();
    const int64_t nkeys = keys.dim(0);
    pool_.parallel_for(t * heads, 8, [&](int64_t b, int64_t e) {
        std::vector<float> logits;
        for (int64_t th = b; th < e; ++th) {
            const int64_t r = th / heads, h = th % heads;
            const float* qv = qq + th * d;
            const int32_t begin = offsets[r], end = offsets[r + 1];
            logits.resize(static_cast<size_t>(end - begin));
            float m = sinks[h];
            for (int32_t i = begin; i < end; ++i) {
                const int32_t key = indices[i];
                DI_ICHECK(key >= 0 && key < nkeys, "attention key ", key, " out of range");
                const float* kv = kk + key * d;
                float dot = 0;
                for (int64_t c = 0; c < d; ++c) dot += qv[c] * kv[c];
                logits[i - begin] = dot * scale;
                m = std::max(m, logits[i - begin]);
            }
            float denom = std::exp(sinks[h] - m);
            float* ov = o + th * d;
            for (int64_t c = 0; c < d; ++c) ov[c] = 0;
            for (int32_t i = begin; i < end; ++i) {
                const float p = std::exp(logits[i - begin] - m);
                denom += p;
                const float* kv = kk + indices[i] * d;
                for (int64_t c = 0; c < d; ++c) ov[c] += p * kv[c];
            }
            const float inv = 1.0f / denom;
            for (int64_t c = 0; c < d; ++c) ov[c] *= inv;
        }
    });
}

void CpuBackend::indexer_scores(TensorView scores, TensorView q, TensorView keys, TensorView weights, float scale) {
    const int64_t t = q.dim(0), heads = q.dim(1), c = q.dim(2), entries = keys.dim(0);
    DI_ICHECK(keys.dim(1) == c && weights.numel() == t * heads && scores.numel() == t * entries,
              "indexer_scores shapes");
    if (t == 0 || entries == 0) return;
    const float* qq = q.f32();
    const float* kk = keys.f32();
    const float* w = weights.f32();
    float* s = scores.f32();
    // Per block of rows and per head: dots = q_h . K^T through sgemm, then relu and the head weight.
    // In batch-invariant mode every row is its own block.
    const int64_t block = batch_invariant_ ? 1 : 16;
    pool_.parallel_for((t + block - 1) / block, 1, [&](int64_t b, int64_t e) {
        std::vector<float> dots(static_cast<size_t>(block * entries));
        for (int64_t blk = b; blk < e; ++blk) {
            const int64_t r0 = blk * block, rows = std::min(block, t - r0);
            std::fill(s + r0 * entries, s + (r0 + rows) * entries, 0.0f);
            for (int64_t h = 0; h < heads; ++h) {
                cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(rows), static_cast<int>(entries),
                            static_cast<int>(c), 1.0f, qq + (r0 * heads + h) * c, static_cast<int>(heads * c), kk,
                            static_cast<int>(c), 0.0f, dots.data(), static_cast<int>(entries));
                for (int64_t r = 0; r < rows; ++r) {
                    const float wh = w[(r0 + r) * heads + h];
                    float* srow = s + (r0 + r) * entries;
                    const float* drow = dots.data() + r * entries;
                    for (int64_t k = 0; k < entries; ++k) srow[k] += std::max(drow[k], 0.0f) * scale * wh;
                }
            }
        }
    });
}

void CpuBackend::indexer_select(TensorView dst, TensorView starts, TensorView scores, TensorView limits, int k,
                                int32_t base) {
    const int64_t t = scores.dim(0), entries = scores.dim(1);
    DI_ICHECK(starts.numel() == t && limits.numel() == t && k >= 0, "indexer_select shapes");
    const float* s = scores.f32();
    const int32_t* start = starts.as<int32_t>();
    const int32_t* limit = limits.as<int32_t>();
    int32_t* out = dst.as<int32_t>();
    const int64_t capacity = dst.numel();
    pool_.parallel_for(t, 4, [&](int64_t b, int64_t e) {
        std::vector<int32_t> order;
        for (int64_t r = b; r < e; ++r) {
            const int64_t n = limit[r], m = std::min<int64_t>(k, n);
            DI_ICHECK(n >= 0 && n <= entries && start[r] >= 0 && start[r] + m <= capacity,
                      "indexer_select: row ", r, " limit ", n, " or start ", start[r], " out of range");
            order.resize(static_cast<size_t>(n));
            std::iota(order.begin(), order.end(), 0);
            if (m < n) {  // the m highest scores, ties to the lower index; then back to index order
                const float* sr = s + r * entries;
                auto key = [&](int32_t i) { return std::isnan(sr[i]) ? -INFINITY : sr[i]; };  // a strict order
                std::nth_element(order.begin(), order.begin() + m, order.end(), [&](int32_t a, int32_t c) {
                    const float ka = key(a), kc = key(c);
                    return ka > kc || (ka == kc && a < c);
                });
                order.resize(static_cast<size_t>(m));
                std::sort(order.begin(), order.end());
            }
            for (int64_t i = 0; i < m; ++i) out[start[r] + i] = base + order[i];
        }
    });
}

}  // namespace deepinfer
