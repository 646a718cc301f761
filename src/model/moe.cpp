#include "model/moe.h"

#include <vector>

#include "backend/backend.h"
#include "model/safetensors.h"
#include "model/step_arrays.h"
#include "model/weight_loader.h"

namespace deepinfer {

namespace {

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
    for (int e = 0; e < p.num_experts; ++e) {
        const ExpertWeights x = load_expert(w, prefix + "experts." + std::to_string(e) + ".", p.moe_inter, hidden);
        m.w1.push_back(x.w1);
        m.w2.push_back(x.w2);
        m.w3.push_back(x.w3);
    }
    // The shared expert's width: transformers uses moe_intermediate_size, DeepSeek's code scales it by
    // n_shared_experts. Take whichever the checkpoint holds.
    m.shared_inter = p.moe_inter;
    if (const TensorInfo* t = w.checkpoint().find(w.find(prefix + "shared_experts.w1.weight")))
        if (t->shape.ndim == 2 && t->shape[0] == static_cast<int64_t>(p.moe_inter) * p.n_shared_experts)
            m.shared_inter = p.moe_inter * p.n_shared_experts;
    m.shared = load_expert(w, prefix + "shared_experts.", m.shared_inter, hidden);
    return m;
}

void moe_forward(Backend& be, const MoeWeights& w, const MoeParams& p, TensorView xn, TensorView tokens,
                 TensorView out, std::vector<int32_t>* routed_ids) {
    const int64_t T = xn.dim(0), D = xn.dim(1), E = p.num_experts, K = p.experts_per_token;
    if (T == 0) return;
    const bool host = be.is_host(), hash = !w.tid2eid.empty();

    // Shared expert over every row, on the side queue: it needs no routing, so it runs alongside the router and
    // the routed experts, whose decode kernels leave SMs and HBM bandwidth unused. Its tensors come from the main
    // queue before the fork, and `side`, declared after them, joins the queue before they are freed. With FP8
    // activations too: its quantized products leave xn as it is (Backend::quantized_linears).
    Tensor g = be.alloc(DType::kF32, Shape{T, w.shared_inter}), u = be.alloc(DType::kF32, Shape{T, w.shared_inter});
    Tensor shared = be.alloc(DType::kF32, Shape{T, D});
    const ActivationQuant& aq = p.act_quant;
    SideQueue side(be);
    side.begin();
    aq.linears(be, xn, {{g, &w.shared.w1}, {u, &w.shared.w3}});
    be.swiglu(g, g, u, p.swiglu_limit);
    aq.linear(be, shared, g, w.shared.w2);
    side.end();

    // Routing from the router's logits: experts [T, K] from tid2eid (hash) or the top-k of scores + bias, with
    // their weights, each row's slots in ascending expert order.
    Tensor router = be.alloc(DType::kF32, Shape{T, E});
    be.linear(router, xn, w.gate);
    MoeRouting r;
    r.scoring = p.scoring;
    r.gate_temp = p.gate_temp;
    r.k = static_cast<int>(K);
    r.routed_scaling = static_cast<float>(p.routed_scaling);
    if (hash) {
        DI_ICHECK(host || !w.tid2eid_d.view().empty(), "moe_forward: tid2eid is not in the backend's memory");
        r.tid2eid = host ? w.tid2eid.data() : w.tid2eid_d.as<const int32_t>();
        r.tokens = tokens.as<const int32_t>();
        r.vocab = static_cast<int64_t>(w.tid2eid.size()) / K;
    } else {
        DI_ICHECK(host || !w.bias_d.view().empty(), "moe_forward: the router bias is not in the backend's memory");
        r.bias = host ? w.bias.f32() : w.bias_d.f32();
    }
    Tensor expert = be.alloc(DType::kI32, Shape{T, K}), weight = be.alloc(DType::kF32, Shape{T, K});
    be.moe_route(expert, weight, router, r);
    if (routed_ids) {
        routed_ids->resize(static_cast<size_t>(T * K));
        be.download(routed_ids->data(), expert);
    }

    // Routed experts: their outputs land in the rows' slots of `routed` [T * K, D]. Prefill-sized steps that the
    // backend does not plan on the device (moe.h) need the expert ids on the host: their copy is queued here, and
    // the device runs the shared expert and the router while the host groups the slots.
    Tensor routed = be.alloc(DType::kF32, Shape{T * K, D});
    // FP8 activations quantize the routed experts' inputs too (per 128 columns of x and of the SwiGLU output), as
    // FP8 tensor cores take them; experts whose widths are not whole blocks multiply them as they are.
    const int act_block = aq.expert_block(D, w.w1.empty() ? 0 : w.w1[0].rows);
    const bool on_device =
        host || (!be.batch_invariant() &&
                 (T * K <= kMoeDeviceSlots || be.routed_experts_take_prefill(T * K, w.w1, w.w3, w.w2, act_block)));
    Tensor ids;
    if (!on_device) {
        ids = Tensor(DType::kI32, Shape{T, K});
        be.download_async(ids.view().data(), expert);
    }

    if (on_device) {
        // Slot (t, k) reads token row t; no host synchronisation.
        const TensorView slots = expert.view().reshape(Shape{T * K});
        be.routed_experts(routed, xn, slots, w.w1, w.w3, w.w2, static_cast<int>(K), p.swiglu_limit, act_block);
    } else {
        // Prefill-sized steps: each touched expert runs once over the slots routed to it, on the GEMMs. The slots
        // in expert order (a counting sort), each reading its token row and writing its slot of `routed`
        // (grouped_experts_rows); the row addresses go up in one transfer.
        be.wait_downloads();
        const int32_t* id = ids.as<int32_t>();
        std::vector<int64_t> counts(E), next(E);
        for (int64_t i = 0; i < T * K; ++i) {
            DI_ICHECK(id[i] >= 0 && id[i] < E, "moe_forward: routed to expert ", id[i], " of ", E);
            ++counts[id[i]];
        }
        for (int64_t e = 1; e < E; ++e) next[e] = next[e - 1] + counts[e - 1];
        std::vector<float*> in_rows(T * K), out_rows(T * K);
        for (int64_t i = 0; i < T * K; ++i) {
            const int64_t at = next[id[i]]++;
            in_rows[at] = xn.f32() + (i / K) * D;
            out_rows[at] = routed.f32() + i * D;
        }
        StepArrays arrays(be);
        const StepArrays::Handle in_h = arrays.stage_rows(in_rows), out_h = arrays.stage_rows(out_rows);
        arrays.upload_staged();
        be.grouped_experts_rows(arrays.view(out_h), arrays.view(in_h), D, counts, w.w1, w.w3, w.w2, p.swiglu_limit,
                                act_block);
    }

    // The weighted routed outputs over the shared expert's.
    side.join();
    be.moe_combine(out, routed, weight, shared);
}

void moe_to_backend(Backend& be, MoeWeights& w, std::vector<Tensor>* storage) {
    w.gate = to_backend(be, w.gate, storage);
    for (std::vector<LinearWeight>* ws : {&w.w1, &w.w2, &w.w3})
        for (LinearWeight& lw : *ws) lw = to_backend(be, lw, storage);
    if (!be.is_host()) {
        if (!w.tid2eid.empty())
            w.tid2eid_d = to_backend(be, TensorView(w.tid2eid.data(), DType::kI32,
                                                    Shape{static_cast<int64_t>(w.tid2eid.size())}));
        if (!w.bias.view().empty()) w.bias_d = to_backend(be, w.bias);
    }
    for (LinearWeight* lw : {&w.shared.w1, &w.shared.w2, &w.shared.w3}) *lw = to_backend(be, *lw, storage);
}

}  // namespace deepinfer
