// Mixture-of-experts routing and the routed experts' products.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "backend/cpu/cpu_backend.h"

namespace deepinfer {

namespace {

float score_fn(ScoringFunc f, float x) {
    switch (f) {
        case ScoringFunc::kSqrtSoftplus: return std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x)));  // torch softplus
        case ScoringFunc::kSigmoid: return 1.0f / (1.0f + std::exp(-x));
        case ScoringFunc::kSoftmax: return x;  // normalised over the row below
    }
    return x;
}

}  // namespace

void CpuBackend::moe_route(TensorView experts, TensorView weights, TensorView logits, const MoeRouting& p) {
    const int64_t T = logits.dim(0), E = logits.dim(1), K = p.k;
    DI_ICHECK(logits.ndim() == 2 && K > 0 && K <= E && experts.numel() == T * K && weights.numel() == T * K,
              "moe_route: logits ", logits.shape().str(), ", k ", K, ", experts ", experts.shape().str(), ", weights ",
              weights.shape().str());
    const bool hash = p.tid2eid != nullptr;
    DI_ICHECK(!hash || p.tokens, "moe_route: hash routing needs token ids");
    int32_t* expert = experts.as<int32_t>();
    float* weight = weights.f32();
    pool_.parallel_for(T, 16, [&](int64_t b, int64_t e) {
        std::vector<float> s(E);
        std::vector<int32_t> order(E), idx(K), es(K);
        std::vector<float> ws(K);
        for (int64_t r = b; r < e; ++r) {
            const float* lg = logits.f32() + r * E;
            for (int64_t i = 0; i < E; ++i) s[i] = score_fn(p.scoring, p.gate_temp == 1.0f ? lg[i] : lg[i] / p.gate_temp);
            if (p.scoring == ScoringFunc::kSoftmax) {
                const float mx = *std::max_element(s.begin(), s.end());
                float sum = 0;
                for (float& v : s) sum += (v = std::exp(v - mx));
                for (float& v : s) v /= sum;
            }
            int32_t* sel = expert + r * K;
            if (hash) {
                DI_CHECK(p.tokens[r] >= 0 && p.tokens[r] < p.vocab, "moe_route: token id ", p.tokens[r],
                         " is outside tid2eid's [0, ", p.vocab, ")");
                std::memcpy(sel, p.tid2eid + static_cast<int64_t>(p.tokens[r]) * K, K * 4);
                for (int64_t k = 0; k < K; ++k)
                    DI_CHECK(sel[k] >= 0 && sel[k] < E, "moe_route: tid2eid holds expert id ", sel[k], " outside [0, ",
                             E, ")");
            } else {
                std::iota(order.begin(), order.end(), 0);
                // NaN ranks as -inf, so the comparison stays a strict weak order whatever the logits hold.
                auto key = [&](int32_t i) {
                    const float v = s[i] + (p.bias ? p.bias[i] : 0.0f);
                    return std::isnan(v) ? -INFINITY : v;
                };
                std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t bb) {
                    const float va = key(a), vb = key(bb);
                    return va > vb || (va == vb && a < bb);
                });
                std::memcpy(sel, order.data(), K * 4);
            }
            float sum = 0;
            for (int64_t k = 0; k < K; ++k) sum += s[sel[k]];
            for (int64_t k = 0; k < K; ++k) weight[r * K + k] = s[sel[k]] / (sum + 1e-20f) * p.routed_scaling;
            // Each row's slots in ascending expert order: that is the order the combine sums them in.
            std::iota(idx.begin(), idx.end(), 0);
            std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t bb) { return sel[a] < sel[bb]; });
            for (int64_t k = 0; k < K; ++k) {
                es[k] = sel[idx[k]];
                ws[k] = weight[r * K + idx[k]];
            }
            std::copy(es.begin(), es.end(), sel);
            std::copy(ws.begin(), ws.end(), weight + r * K);
        }
    });
}

// Each expert runs once over its rows (ascending), gathered into one block: the sgemm sees the same rows in the
// same order as a linear() over the rows routed to that expert.
void CpuBackend::expert_linear(TensorView out, TensorView x, TensorView expert_of_row,
                               const std::vector<LinearWeight>& experts, int rows_per_input) {
    const int64_t R = expert_of_row.numel(), E = static_cast<int64_t>(experts.size());
    DI_ICHECK(E > 0 && rows_per_input > 0 && x.ndim() == 2 && R % rows_per_input == 0 &&
                  x.dim(0) == R / rows_per_input && out.numel() == R * experts[0].rows,
              "expert_linear: x ", x.shape().str(), ", out ", out.shape().str(), ", ", R, " rows, ", rows_per_input,
              " per input");
    const int64_t N = experts[0].rows, Kin = x.dim(1);
    const int32_t* ids = expert_of_row.as<const int32_t>();
    std::vector<std::vector<int64_t>> rows_of(E);
    for (int64_t r = 0; r < R; ++r) {
        DI_CHECK(ids[r] >= 0 && ids[r] < E, "expert_linear: expert id ", ids[r], " outside [0, ", E, ")");
        rows_of[ids[r]].push_back(r);
    }
    for (int64_t e = 0; e < E; ++e) {
        const std::vector<int64_t>& rows = rows_of[e];
        if (rows.empty()) continue;
        const LinearWeight& w = experts[e];
        DI_ICHECK(w.rows == N && w.cols == Kin, "expert_linear: expert ", e, " ", w.name, " is [", w.rows, ", ",
                  w.cols, "], expected [", N, ", ", Kin, "]");
        const int64_t ne = static_cast<int64_t>(rows.size());
        Tensor xe = alloc(DType::kF32, Shape{ne, Kin}), ye = alloc(DType::kF32, Shape{ne, N});
        for (int64_t i = 0; i < ne; ++i)
            std::memcpy(xe.f32() + i * Kin, x.f32() + (rows[i] / rows_per_input) * Kin, Kin * 4);
        gemm_rows(ye.f32(), N, xe.f32(), Kin, ne, w, 0, N);
        for (int64_t i = 0; i < ne; ++i) std::memcpy(out.f32() + rows[i] * N, ye.f32() + i * N, N * 4);
    }
}

}  // namespace deepinfer
