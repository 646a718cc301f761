#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "model/safetensors.h"
#include "model/weight_loader.h"

namespace deepinfer {

namespace {

float score_fn(ScoringFunc f, float x) {
    switch (f) {
        case ScoringFunc::kSqrtSoftplus: return std::sqrt(x > 20.0f ? x : std::log1p(std::exp(x)));  // torch softplus
        case ScoringFunc::kSigmoid: return 1.0f / (1.0f + std::exp(-x));
        case ScoringFunc::kSoftmax: return x;  // normalised over the row by the caller
    }
    return x;
}

ExpertWeights load_expert(WeightLoader& w, const std::string& prefix, int inter, int64_t dim) {
    ExpertWeights e;
    e.w1 = w.linear(prefix + "w1", inter, dim);
    e.w2 = w.linear(prefix + "w2", dim, inter);
    e.w3 = w.linear(prefix + "w3", inter, dim);
    return e;
}

}  // namespace

MoeWeights load_moe(WeightLoader& w, const std::string& prefix, const MoeParams& p, int64_t hidden, bool hash_routing,
                    int64_t vocab) {
    MoeWeights m;
    m.gate = w.linear(prefix + "gate", p.num_experts, hidden);
    if (hash_routing) {
        m.tid2eid = w.i32(prefix + "gate.tid2eid", Shape{vocab, p.experts_per_token});
        for (int32_t e : m.tid2eid)
            DI_CHECK(e >= 0 && e < p.num_experts, w.checkpoint().file_of(w.find(prefix + "gate.tid2eid")),
                     ": tensor '", w.find(prefix + "gate.tid2eid"), "' holds expert id ", e, " outside [0, ",
                     p.num_experts, ")");
    } else {
        m.bias = w.has(prefix + "gate.bias") ? w.f32(prefix + "gate.bias", Shape{p.num_experts})
                                             : Tensor::f32(Shape{p.num_experts});
    }
    for (int e = 0; e < p.num_experts; ++e)
        m.experts.push_back(load_expert(w, prefix + "experts." + std::to_string(e) + ".", p.moe_inter, hidden));
    // The shared expert's width: transformers uses moe_intermediate_size, DeepSeek's code scales it by
    // n_shared_experts. Take whichever the checkpoint holds.
    m.shared_inter = p.moe_inter;
    if (const TensorInfo* t = w.checkpoint().find(w.find(prefix + "shared_experts.w1.weight")))
        if (t->shape.ndim == 2 && t->shape[0] == static_cast<int64_t>(p.moe_inter) * p.n_shared_experts)
            m.shared_inter = p.moe_inter * p.n_shared_experts;
    m.shared = load_expert(w, prefix + "shared_experts.", m.shared_inter, hidden);
    return m;
}

void moe_forward(Backend& be, const MoeWeights& w, const MoeParams& p, TensorView xn, const int32_t* tokens,
                 TensorView out) {
    const int64_t T = xn.dim(0), D = xn.dim(1), E = p.num_experts, K = p.experts_per_token;
    if (T == 0) return;

    // Routing: scores from the router, experts from tid2eid (hash) or the top-k of scores + bias.
    Tensor router = Tensor::f32(Shape{T, E});
    be.linear(router, xn, w.gate);
    std::vector<int32_t> expert(T * K);
    std::vector<float> weight(T * K);
    const bool hash = !w.tid2eid.empty();
    be.pool().parallel_for(T, 16, [&](int64_t b, int64_t e) {
        std::vector<float> s(E);
        std::vector<int32_t> order(E);
        for (int64_t r = b; r < e; ++r) {
            const float* lg = router.f32() + r * E;
            for (int64_t i = 0; i < E; ++i) s[i] = score_fn(p.scoring, p.gate_temp == 1.0f ? lg[i] : lg[i] / p.gate_temp);
            if (p.scoring == ScoringFunc::kSoftmax) {
                const float mx = *std::max_element(s.begin(), s.end());
                float sum = 0;
                for (float& v : s) sum += (v = std::exp(v - mx));
                for (float& v : s) v /= sum;
            }
            int32_t* sel = expert.data() + r * K;
            if (hash) {
                std::memcpy(sel, w.tid2eid.data() + static_cast<int64_t>(tokens[r]) * K, K * 4);
            } else {
                const float* bias = w.bias.f32();
                std::iota(order.begin(), order.end(), 0);
                std::partial_sort(order.begin(), order.begin() + K, order.end(), [&](int32_t a, int32_t bb) {
                    const float va = s[a] + bias[a], vb = s[bb] + bias[bb];
                    return va > vb || (va == vb && a < bb);
                });
                std::memcpy(sel, order.data(), K * 4);
            }
            float sum = 0;
            for (int64_t k = 0; k < K; ++k) sum += s[sel[k]];
            for (int64_t k = 0; k < K; ++k)
                weight[r * K + k] = s[sel[k]] / (sum + 1e-20f) * static_cast<float>(p.routed_scaling);
        }
    });

    // Routed experts: each expert runs once over the rows routed to it; results land per (row, slot).
    Tensor routed = Tensor::f32(Shape{T * K, D});
    std::vector<std::vector<int64_t>> slots_of(E);  // (row * K + slot) entries per expert
    for (int64_t i = 0; i < T * K; ++i) slots_of[expert[i]].push_back(i);
    for (int64_t e = 0; e < E; ++e) {
        const std::vector<int64_t>& slots = slots_of[e];
        if (slots.empty()) continue;
        const int64_t ne = static_cast<int64_t>(slots.size());
        const ExpertWeights& ew = w.experts[e];
        Tensor xe = Tensor::f32(Shape{ne, D}), g = Tensor::f32(Shape{ne, p.moe_inter}),
               u = Tensor::f32(Shape{ne, p.moe_inter}), ye = Tensor::f32(Shape{ne, D});
        for (int64_t i = 0; i < ne; ++i) std::memcpy(xe.f32() + i * D, xn.f32() + (slots[i] / K) * D, D * 4);
        be.linear(g, xe, ew.w1);
        be.linear(u, xe, ew.w3);
        be.swiglu(g, g, u, p.swiglu_limit);
        be.linear(ye, g, ew.w2);
        for (int64_t i = 0; i < ne; ++i) std::memcpy(routed.f32() + slots[i] * D, ye.f32() + i * D, D * 4);
    }

    // Shared expert over every row, then the weighted routed outputs in ascending expert order.
    Tensor g = Tensor::f32(Shape{T, w.shared_inter}), u = Tensor::f32(Shape{T, w.shared_inter});
    be.linear(g, xn, w.shared.w1);
    be.linear(u, xn, w.shared.w3);
    be.swiglu(g, g, u, p.swiglu_limit);
    Tensor shared = Tensor::f32(Shape{T, D});
    be.linear(shared, g, w.shared.w2);
    float* o = out.f32();
    be.pool().parallel_for(T, 16, [&](int64_t b, int64_t e) {
        std::vector<int32_t> slot_order(K);
        for (int64_t r = b; r < e; ++r) {
            std::iota(slot_order.begin(), slot_order.end(), 0);
            std::sort(slot_order.begin(), slot_order.end(),
                      [&](int32_t a, int32_t bb) { return expert[r * K + a] < expert[r * K + bb]; });
            float* orow = o + r * D;
            for (int64_t i = 0; i < D; ++i) orow[i] = 0;
            for (int32_t k : slot_order) {
                const float wk = weight[r * K + k];
                const float* yrow = routed.f32() + (r * K + k) * D;
                for (int64_t i = 0; i < D; ++i) orow[i] += wk * yrow[i];
            }
            const float* srow = shared.f32() + r * D;
            for (int64_t i = 0; i < D; ++i) orow[i] += srow[i];
        }
    });
}

}  // namespace deepinfer
