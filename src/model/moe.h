// The DeepSeek mixture-of-experts block, shared by the V4 and V4.1 models: a router (hash routing through
// tid2eid, or the top-k of scores + selection bias), routed experts and a shared expert, all clamped SwiGLU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "core/tensor.h"
#include "core/weight.h"
#include "model/activation_quant.h"

namespace deepinfer {

class WeightLoader;

struct ExpertWeights {
    LinearWeight w1, w2, w3;  // gate [I, D], down [D, I], up [I, D]
};

struct MoeWeights {
    LinearWeight gate;             // [E, D] router
    Tensor bias;                   // [E] f32 selection bias (score routing; zeros when absent), host
    std::vector<int32_t> tid2eid;  // [V * k] expert ids (hash routing), else empty; host
    Tensor bias_d, tid2eid_d;      // their copies in a device backend's memory (moe_to_backend)
    std::vector<LinearWeight> w1, w2, w3;  // routed experts [E] each: gate [I, D], down [D, I], up [I, D]
    ExpertWeights shared;
    int shared_inter = 0;

    ExpertWeights expert(size_t e) const { return {w1[e], w2[e], w3[e]}; }
};

struct MoeParams {
    int num_experts = 0;
    int experts_per_token = 0;
    int moe_inter = 0;
    int n_shared_experts = 1;
    ScoringFunc scoring = ScoringFunc::kSqrtSoftplus;
    double routed_scaling = 1.0;
    float swiglu_limit = 0;   // <= 0: no clamp
    float gate_temp = 1.0f;   // router logits are divided by it before scoring
    ActivationQuant act_quant;  // FP8 activations of the experts (model/activation_quant.h); off by default
};

// Loads `<prefix>gate.*`, `<prefix>experts.E.w{1,2,3}` and `<prefix>shared_experts.w{1,2,3}`. With
// hash_routing, `<prefix>gate.tid2eid` [vocab, k] is required; otherwise `<prefix>gate.bias` is optional.
MoeWeights load_moe(WeightLoader& w, const std::string& prefix, const MoeParams& p, int64_t hidden,
                    bool hash_routing, int64_t vocab);

// Routed slots (tokens x experts per token) up to which a device backend runs the routed experts straight
// from the device-side routing (Backend::routed_experts: the slots grouped by expert on the device, with no host
// synchronisation; on CUDA the fused wgmma kernels where they apply, else expert_linear). Above it (prefill-sized
// steps, ~8 or more rows per expert of 256), it downloads the [T, k] expert ids and runs each touched expert once
// over its rows through grouped_experts_rows, whose GEMMs outrun expert_linear's weight-streaming products once
// experts have that many rows. Batch-invariant mode always takes the second path (a threshold would make a row's
// result depend on the batch size; the products there run on the tensor-core kernel without split-K, whose per-row
// sums do not depend on the other rows). Host backends always take the first path (it computes the same products
// there). Backends whose routed_experts_take_prefill() says so run prefill-sized steps from the device-side routing
// too (CUDA's wgmma experts: the same kernels and tiles as grouped_experts_rows, planned on the device), and the host
// then neither waits for the ids nor groups them.
constexpr int64_t kMoeDeviceSlots = 2048;

// out [T, D] = sum_k weight_k * expert_k(xn) + shared(xn), in backend memory; tokens [T] I32 (backend memory)
// are the token ids for hash routing. Each row's routed outputs are summed in ascending expert order,
// independent of the batch. Routing runs in the backend (moe_route). routed_ids, when given, receives the [T * K]
// expert ids (downloaded: the host waits for the device, so for diagnostics and benchmarks' untimed steps).
void moe_forward(Backend& be, const MoeWeights& w, const MoeParams& p, TensorView xn, TensorView tokens,
                 TensorView out, std::vector<int32_t>* routed_ids = nullptr);

// Moves the matrices, the router's bias and tid2eid into the backend's memory.
void moe_to_backend(Backend& be, MoeWeights& w, std::vector<Tensor>* storage);

}  // namespace deepinfer
