#include "model/moe.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "backend/backend.h"
#include "core/thread_pool.h"
#include "model/safetensors.h"
#include "model/step_arrays.h"
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
        m.tid2eid = w.i32(prefix + "gate.tid2eid", Shape{vocab, p.experts_per_token}, p.num_experts);
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
    StepArrays arrays(be);

    // Routing on the host from the router's logits: experts from tid2eid (hash) or the top-k of scores + bias.
    Tensor router = be.alloc(DType::kF32, Shape{T, E});
    be.linear(router, xn, w.gate);
    const Tensor logits = to_host(be, router);
    std::vector<int32_t> expert(T * K);
    std::vector<float> weight(T * K);
    const bool hash = !w.tid2eid.empty();
    be.pool().parallel_for(T, 16, [&](int64_t b, int64_t e) {
        std::vector<float> s(E);
        std::vector<int32_t> order(E);
        for (int64_t r = b; r < e; ++r) {
            const float* lg = logits.f32() + r * E;
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
            // Each row's slots in ascending expert order: that is the order the combine sums them in.
            std::vector<int32_t> idx(K);
            std::iota(idx.begin(), idx.end(), 0);
            std::sort(idx.begin(), idx.end(), [&](int32_t a, int32_t bb) { return sel[a] < sel[bb]; });
            std::vector<int32_t> es(K);
            std::vector<float> ws(K);
            for (int64_t k = 0; k < K; ++k) {
                es[k] = sel[idx[k]];
                ws[k] = weight[r * K + idx[k]];
            }
            std::copy(es.begin(), es.end(), sel);
            std::copy(ws.begin(), ws.end(), weight.begin() + r * K);
        }
    });

    // Routed experts: each expert runs once over the rows routed to it; its outputs land in the rows'
    // slots of `routed` [T * K, D].
    Tensor routed = be.alloc(DType::kF32, Shape{T * K, D});
    std::vector<std::vector<int64_t>> slots_of(E);  // (row * K + slot) entries per expert
    for (int64_t i = 0; i < T * K; ++i) slots_of[expert[i]].push_back(i);
    for (int64_t e = 0; e < E; ++e) {
        const std::vector<int64_t>& slots = slots_of[e];
        if (slots.empty()) continue;
        const int64_t ne = static_cast<int64_t>(slots.size());
        std::vector<float*> in_rows(ne), out_rows(ne);
        for (int64_t i = 0; i < ne; ++i) {
            in_rows[i] = xn.f32() + (slots[i] / K) * D;
            out_rows[i] = routed.f32() + slots[i] * D;
        }
        const ExpertWeights& ew = w.experts[e];
        Tensor xe = be.alloc(DType::kF32, Shape{ne, D}), g = be.alloc(DType::kF32, Shape{ne, p.moe_inter}),
               u = be.alloc(DType::kF32, Shape{ne, p.moe_inter}), ye = be.alloc(DType::kF32, Shape{ne, D});
        be.gather_rows(xe, arrays.rows(in_rows));
        be.linear(g, xe, ew.w1);
        be.linear(u, xe, ew.w3);
        be.swiglu(g, g, u, p.swiglu_limit);
        be.linear(ye, g, ew.w2);
        be.scatter_rows(arrays.rows(out_rows), ye);
    }

    // Shared expert over every row, then the weighted routed outputs.
    Tensor g = be.alloc(DType::kF32, Shape{T, w.shared_inter}), u = be.alloc(DType::kF32, Shape{T, w.shared_inter});
    be.linear(g, xn, w.shared.w1);
    be.linear(u, xn, w.shared.w3);
    be.swiglu(g, g, u, p.swiglu_limit);
    Tensor shared = be.alloc(DType::kF32, Shape{T, D});
    be.linear(shared, g, w.shared.w2);
    be.moe_combine(out, routed, arrays.f32(weight), shared);
}

void moe_to_backend(Backend& be, MoeWeights& w, std::vector<Tensor>* storage) {
    w.gate = to_backend(be, w.gate, storage);
    for (ExpertWeights& e : w.experts)
        for (LinearWeight* lw : {&e.w1, &e.w2, &e.w3}) *lw = to_backend(be, *lw, storage);
    for (LinearWeight* lw : {&w.shared.w1, &w.shared.w2, &w.shared.w3}) *lw = to_backend(be, *lw, storage);
}

}  // namespace deepinfer
