// Row-wise and element-wise ops: RMSNorm, RoPE, SwiGLU, gated pooling, token selection.
#include <cmath>
#include <cstring>
#include <limits>
#include <span>
#include <vector>

#include "backend/cpu/cpu_backend.h"
#include "deepinfer/error.h"
#include "sample/sampler.h"

namespace deepinfer {

void CpuBackend::rms_norm(TensorView out, TensorView x, const float* weight, float eps) {
    const int64_t c = x.dim(-1), rows = x.numel() / c;
    DI_ICHECK(out.numel() == x.numel(), "rms_norm shapes");
    const float* in = x.f32();
    float* o = out.f32();
    pool_.parallel_for(rows, 64, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
            const float* xr = in + r * c;
            float* yr = o + r * c;
            float ss = 0;
            for (int64_t i = 0; i < c; ++i) ss += xr[i] * xr[i];
            const float inv = 1.0f / std::sqrt(ss / static_cast<float>(c) + eps);
            if (weight) {
                for (int64_t i = 0; i < c; ++i) yr[i] = weight[i] * (xr[i] * inv);
            } else {
                for (int64_t i = 0; i < c; ++i) yr[i] = xr[i] * inv;
            }
        }
    });
}

void CpuBackend::rope(TensorView x, const int32_t* positions, const float* inv_freq, int rope_dim,
                      float attention_factor, bool inverse) {
    const int64_t t = x.dim(0), heads = x.dim(1), hd = x.dim(2);
    DI_ICHECK(x.ndim() == 3 && rope_dim <= hd && rope_dim % 2 == 0, "rope on ", x.shape().str());
    const int half = rope_dim / 2;
    float* base = x.f32();
    pool_.parallel_for(t, 16, [&](int64_t b, int64_t e) {
        std::vector<float> cs(half), sn(half);
        for (int64_t r = b; r < e; ++r) {
            const float pos = static_cast<float>(positions[r]);
            for (int i = 0; i < half; ++i) {
                const float angle = pos * inv_freq[i];  // fp32 product, as the reference computes it
                cs[i] = std::cos(angle) * attention_factor;
                sn[i] = std::sin(angle) * attention_factor * (inverse ? -1.0f : 1.0f);
            }
            for (int64_t h = 0; h < heads; ++h) {
                float* v = base + (r * heads + h) * hd + (hd - rope_dim);
                for (int i = 0; i < half; ++i) {
                    const float a = v[2 * i], bb = v[2 * i + 1];
                    v[2 * i] = a * cs[i] - bb * sn[i];
                    v[2 * i + 1] = bb * cs[i] + a * sn[i];
                }
            }
        }
    });
}

void CpuBackend::swiglu(TensorView out, TensorView gate, TensorView up, float limit) {
    const int64_t n = out.numel();
    DI_ICHECK(gate.numel() == n && up.numel() == n, "swiglu shapes");
    const float* g = gate.f32();
    const float* u = up.f32();
    float* o = out.f32();
    const bool clamp = limit > 0;
    pool_.parallel_for(n, 4096, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
            float gi = g[i], ui = u[i];
            if (clamp) {
                gi = std::min(gi, limit);
                ui = std::min(std::max(ui, -limit), limit);
            }
            o[i] = gi / (1.0f + std::exp(-gi)) * ui;
        }
    });
}

void CpuBackend::gated_pool(TensorView out, TensorView kv, TensorView gate) {
    const int64_t entries = kv.dim(0), slots = kv.dim(1), c = kv.dim(2);
    DI_ICHECK(gate.shape() == kv.shape() && out.numel() == entries * c, "gated_pool shapes");
    const float* k = kv.f32();
    const float* g = gate.f32();
    float* o = out.f32();
    pool_.parallel_for(entries, 4, [&](int64_t b, int64_t e) {
        for (int64_t w = b; w < e; ++w) {
            for (int64_t ch = 0; ch < c; ++ch) {
                float m = -std::numeric_limits<float>::infinity();
                for (int64_t s = 0; s < slots; ++s) m = std::max(m, g[(w * slots + s) * c + ch]);
                float denom = 0, acc = 0;
                for (int64_t s = 0; s < slots; ++s) {
                    const float gs = g[(w * slots + s) * c + ch];
                    if (gs == -std::numeric_limits<float>::infinity()) continue;
                    const float p = std::exp(gs - m);
                    denom += p;
                    acc += p * k[(w * slots + s) * c + ch];
                }
                o[w * c + ch] = acc / denom;
            }
        }
    });
}

void CpuBackend::gather_rows(TensorView dst, TensorView rows) {
    const int64_t r = rows.numel(), c = r ? dst.numel() / r : 0;
    const auto* src = rows.as<float* const>();
    float* out = dst.f32();
    for (int64_t i = 0; i < r; ++i) std::memcpy(out + i * c, src[i], c * 4);
}

void CpuBackend::scatter_rows(TensorView rows, TensorView src) {
    const int64_t r = rows.numel(), c = r ? src.numel() / r : 0;
    const auto* dst = rows.as<float* const>();
    const float* in = src.f32();
    for (int64_t i = 0; i < r; ++i) std::memcpy(dst[i], in + i * c, c * 4);
}

void CpuBackend::copy_rows(TensorView dst_rows, TensorView src_rows, TensorView cols) {
    const int64_t r = dst_rows.numel();
    DI_ICHECK(src_rows.numel() == r && cols.numel() == r && cols.dtype() == DType::kI32, "copy_rows: ", r,
              " destinations, ", src_rows.numel(), " sources, ", cols.numel(), " widths");
    const auto* dst = dst_rows.as<float* const>();
    const auto* src = src_rows.as<const float* const>();
    const int32_t* c = cols.as<const int32_t>();
    for (int64_t i = 0; i < r; ++i) {
        DI_ICHECK(c[i] >= 0, "copy_rows: row ", i, " of ", c[i], " floats");
        std::memcpy(dst[i], src[i], static_cast<size_t>(c[i]) * 4);
    }
}

void CpuBackend::add(TensorView x, TensorView y) {
    DI_ICHECK(x.numel() == y.numel(), "add shapes");
    float* a = x.f32();
    const float* b = y.f32();
    for (int64_t i = 0; i < x.numel(); ++i) a[i] += b[i];
}

void CpuBackend::scale(TensorView x, float s) {
    float* a = x.f32();
    for (int64_t i = 0; i < x.numel(); ++i) a[i] *= s;
}

void CpuBackend::copy(TensorView dst, TensorView src) {
    DI_ICHECK(dst.nbytes() == src.nbytes(), "copy: ", dst.nbytes(), " bytes from ", src.nbytes());
    std::memmove(dst.data(), src.data(), src.nbytes());
}

void CpuBackend::fill_index_ranges(TensorView dst, TensorView runs) {
    const int64_t rows = runs.numel() / 5, n = dst.numel();
    DI_ICHECK(runs.numel() % 5 == 0, "fill_index_ranges: runs of ", runs.numel(), " values");
    const int32_t* r = runs.as<int32_t>();
    int32_t* out = dst.as<int32_t>();
    for (int64_t q = 0; q < rows; ++q, r += 5) {
        const int64_t at = r[0], na = r[2], nb = r[4];
        DI_ICHECK(at >= 0 && na >= 0 && nb >= 0 && at + na + nb <= n, "fill_index_ranges: row ", q, " writes [", at,
                  ", ", at + na + nb, ") of ", n);
        for (int64_t i = 0; i < na; ++i) out[at + i] = static_cast<int32_t>(r[1] + i);
        for (int64_t j = 0; j < nb; ++j) out[at + na + j] = static_cast<int32_t>(r[3] + j);
    }
}

void CpuBackend::fill_row_addresses(TensorView dst, TensorView runs) {
    const int64_t rows = runs.numel() / 4, n = dst.numel();
    DI_ICHECK(runs.numel() % 4 == 0 && runs.dtype() == DType::kI64 && dst.dtype() == DType::kI64,
              "fill_row_addresses: runs of ", runs.numel(), " values");
    const int64_t* r = runs.as<int64_t>();
    int64_t* out = dst.as<int64_t>();
    for (int64_t q = 0; q < rows; ++q, r += 4) {
        const int64_t at = r[0], address = r[1], count = r[2], stride = r[3];
        DI_ICHECK(at >= 0 && count >= 0 && at + count <= n, "fill_row_addresses: run ", q, " writes [", at, ", ",
                  at + count, ") of ", n);
        for (int64_t i = 0; i < count; ++i) out[at + i] = address + i * stride;
    }
}

void CpuBackend::argmax_rows(TensorView ids, TensorView logits) {
    const int64_t rows = logits.dim(0), v = logits.dim(1);
    DI_ICHECK(ids.numel() == rows && v > 0, "argmax_rows shapes");
    const float* l = logits.f32();
    int32_t* out = ids.as<int32_t>();
    for (int64_t r = 0; r < rows; ++r) {
        const float* row = l + r * v;
        int64_t best = -1;
        for (int64_t i = 0; i < v; ++i)
            if (!std::isnan(row[i]) && (best < 0 || row[i] > row[best])) best = i;
        const bool ok = !std::isnan(row[0]) && best >= 0 && row[best] > -std::numeric_limits<float>::infinity();
        out[r] = ok ? static_cast<int32_t>(best) : -1;
    }
}

void CpuBackend::sample_rows(TensorView ids, TensorView logits, const std::vector<SampleRow>& rows) {
    const int64_t n = logits.dim(0), v = logits.dim(1);
    DI_ICHECK(ids.numel() == n && static_cast<int64_t>(rows.size()) == n && v > 0, "sample_rows shapes");
    int32_t* out = ids.as<int32_t>();
    pool_.parallel_for(n, 1, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
            const SampleRow& o = rows[r];
            const SamplingOptions opts{o.temperature, o.top_k, o.top_p, o.min_p, o.seed};
            try {
                out[r] = sample_token(std::span<const float>(logits.f32() + r * v, static_cast<size_t>(v)), opts,
                                      o.token_index);
            } catch (const Error&) {  // argmax_rows' -1 rows: a NaN first logit, or every logit masked
                out[r] = -1;
            }
        }
    });
}

void CpuBackend::moe_combine(TensorView out, TensorView routed, TensorView weights, TensorView shared) {
    const int64_t t = out.dim(0), d = out.dim(1), k = t ? weights.numel() / t : 0;
    const float* rt = routed.f32();
    const float* w = weights.f32();
    const float* sh = shared.f32();
    float* o = out.f32();
    pool_.parallel_for(t, 16, [&](int64_t b, int64_t e) {
        for (int64_t r = b; r < e; ++r) {
            float* orow = o + r * d;
            for (int64_t i = 0; i < d; ++i) orow[i] = 0;
            for (int64_t j = 0; j < k; ++j) {
                const float wj = w[r * k + j];
                const float* yrow = rt + (r * k + j) * d;
                for (int64_t i = 0; i < d; ++i) orow[i] += wj * yrow[i];
            }
            for (int64_t i = 0; i < d; ++i) orow[i] += sh[r * d + i];
        }
    });
}

}  // namespace deepinfer
