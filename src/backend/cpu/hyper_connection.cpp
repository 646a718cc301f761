// Manifold-constrained hyper-connections (mHC): collapse, expand and the final head collapse.
#include <cmath>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace deepinfer {

namespace {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// mix [rows] = (fn . f) * rsqrt(mean(f^2) + eps) for one token's flattened streams f [n * D].
void mix_logits(const float* f, int64_t width, const float* fn, int rows, float norm_eps, float* mix) {
    float ss = 0;
    for (int64_t i = 0; i < width; ++i) ss += f[i] * f[i];
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(width) + norm_eps);
    for (int j = 0; j < rows; ++j) {
        const float* w = fn + j * width;
        float acc = 0;
        for (int64_t i = 0; i < width; ++i) acc += (f[i] * inv) * w[i];
        mix[j] = acc;
    }
}

// pre [n], post [n], comb [n, n] for one token's flattened streams f [n * D].
void hc_coefficients(const float* f, int64_t width, const HcParams& p, float* mix, float* pre, float* post,
                     float* c) {
    const int n = p.n;
    mix_logits(f, width, p.fn, (2 + n) * n, p.norm_eps, mix);
    for (int j = 0; j < n; ++j) {
        pre[j] = sigmoid(mix[j] * p.scale[0] + p.base[j]) + p.hc_eps;
        post[j] = 2.0f * sigmoid(mix[n + j] * p.scale[1] + p.base[n + j]);
    }
    // comb: row-wise softmax, then Sinkhorn normalisation (columns first).
    for (int i = 0; i < n; ++i) {
        float m = -INFINITY;
        for (int k = 0; k < n; ++k) {
            c[i * n + k] = mix[2 * n + i * n + k] * p.scale[2] + p.base[2 * n + i * n + k];
            m = std::max(m, c[i * n + k]);
        }
        float sum = 0;
        for (int k = 0; k < n; ++k) sum += (c[i * n + k] = std::exp(c[i * n + k] - m));
        for (int k = 0; k < n; ++k) c[i * n + k] = c[i * n + k] / sum + p.hc_eps;
    }
    auto normalize_columns = [&] {
        for (int k = 0; k < n; ++k) {
            float sum = 0;
            for (int i = 0; i < n; ++i) sum += c[i * n + k];
            for (int i = 0; i < n; ++i) c[i * n + k] /= sum + p.hc_eps;
        }
    };
    normalize_columns();
    for (int it = 0; it < p.sinkhorn_iters - 1; ++it) {
        for (int i = 0; i < n; ++i) {
            float sum = 0;
            for (int k = 0; k < n; ++k) sum += c[i * n + k];
            for (int k = 0; k < n; ++k) c[i * n + k] /= sum + p.hc_eps;
        }
        normalize_columns();
    }
}

void collapse(const float* f, const float* pre, int n, int64_t d, float* out) {
    for (int64_t i = 0; i < d; ++i) out[i] = 0;
    for (int j = 0; j < n; ++j)
        for (int64_t i = 0; i < d; ++i) out[i] += pre[j] * f[j * d + i];
}

}  // namespace

void CpuBackend::hc_mix(TensorView pre, TensorView post, TensorView comb, TensorView streams, const HcParams& p) {
    const int n = p.n;
    const int64_t t = streams.dim(0), width = n * streams.dim(2);
    DI_ICHECK(streams.dim(1) == n && pre.numel() == t * n && post.numel() == t * n && comb.numel() == t * n * n,
              "hc_mix shapes");
    pool_.parallel_for(t, 4, [&](int64_t b, int64_t e) {
        std::vector<float> mix((2 + n) * n);
        for (int64_t r = b; r < e; ++r)
            hc_coefficients(streams.f32() + r * width, width, p, mix.data(), pre.f32() + r * n, post.f32() + r * n,
                            comb.f32() + r * n * n);
    });
}

void CpuBackend::hc_collapse(TensorView collapsed, TensorView streams, TensorView pre) {
    const int64_t t = streams.dim(0), n = streams.dim(1), d = streams.dim(2);
    DI_ICHECK(collapsed.numel() == t * d && pre.numel() == t * n, "hc_collapse shapes");
    pool_.parallel_for(t, 4, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r)
            collapse(streams.f32() + r * n * d, pre.f32() + r * n, static_cast<int>(n), d, collapsed.f32() + r * d);
    });
}

void CpuBackend::hc_pre(TensorView collapsed, TensorView post, TensorView comb, TensorView streams,
                        const HcParams& p) {
    const int n = p.n;
    const int64_t t = streams.dim(0), d = streams.dim(2), width = n * d;
    DI_ICHECK(streams.dim(1) == n && collapsed.numel() == t * d && post.numel() == t * n && comb.numel() == t * n * n,
              "hc_pre shapes");
    pool_.parallel_for(t, 4, [&](int64_t b, int64_t e) {
        std::vector<float> mix((2 + n) * n), pre(n);
        for (int64_t r = b; r < e; ++r) {
            const float* f = streams.f32() + r * width;
            hc_coefficients(f, width, p, mix.data(), pre.data(), post.f32() + r * n, comb.f32() + r * n * n);
            collapse(f, pre.data(), n, d, collapsed.f32() + r * d);
        }
    });
}

void CpuBackend::hc_post(TensorView out, TensorView y, TensorView post, TensorView comb, TensorView streams) {
    const int64_t t = streams.dim(0), n = streams.dim(1), d = streams.dim(2);
    DI_ICHECK(out.shape() == streams.shape() && y.numel() == t * d, "hc_post shapes");
    const float* s = streams.f32();
    const float* yy = y.f32();
    const float* po = post.f32();
    const float* cb = comb.f32();
    float* o = out.f32();
    pool_.parallel_for(t, 4, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
            for (int64_t k = 0; k < n; ++k) {
                float* ok = o + (r * n + k) * d;
                const float pk = po[r * n + k];
                for (int64_t i = 0; i < d; ++i) ok[i] = pk * yy[r * d + i];
                for (int64_t j = 0; j < n; ++j) {
                    const float cjk = cb[(r * n + j) * n + k];
                    const float* sj = s + (r * n + j) * d;
                    for (int64_t i = 0; i < d; ++i) ok[i] += cjk * sj[i];
                }
            }
        }
    });
}

void CpuBackend::hc_head(TensorView out, TensorView streams, const HcParams& p) {
    const int n = p.n;
    const int64_t t = streams.dim(0), d = streams.dim(2), width = n * d;
    DI_ICHECK(streams.dim(1) == n && out.numel() == t * d, "hc_head shapes");
    const float* s = streams.f32();
    float* o = out.f32();
    pool_.parallel_for(t, 4, [&](int64_t b, int64_t e) {
        std::vector<float> mix(n);
        for (int64_t r = b; r < e; ++r) {
            const float* f = s + r * width;
            mix_logits(f, width, p.fn, n, p.norm_eps, mix.data());
            float* orow = o + r * d;
            for (int64_t i = 0; i < d; ++i) orow[i] = 0;
            for (int j = 0; j < n; ++j) {
                const float pre = sigmoid(mix[j] * p.scale[0] + p.base[j]) + p.hc_eps;
                for (int64_t i = 0; i < d; ++i) orow[i] += pre * f[j * d + i];
            }
        }
    });
}

}  // namespace deepinfer
