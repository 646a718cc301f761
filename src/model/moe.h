// The DeepSeek mixture-of-experts block, shared by the V4 and V4.1 models: a router (hash routing through
// tid2eid, or the top-k of scores + selection bias), routed experts and a shared expert, all clamped SwiGLU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/weight.h"

namespace deepinfer {

class Backend;
class WeightLoader;

enum class ScoringFunc { kSqrtSoftplus, kSoftmax, kSigmoid };

struct ExpertWeights {
    LinearWeight w1, w2, w3;  // gate [I, D], down [D, I], up [I, D]
};

struct MoeWeights {
    LinearWeight gate;             // [E, D] router
    Tensor bias;                   // [E] f32 selection bias (score routing; zeros when absent)
    std::vector<int32_t> tid2eid;  // [V * k] expert ids (hash routing), else empty
    std::vector<ExpertWeights> experts;
    ExpertWeights shared;
    int shared_inter = 0;
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
};

// Loads `<prefix>gate.*`, `<prefix>experts.E.w{1,2,3}` and `<prefix>shared_experts.w{1,2,3}`. With
// hash_routing, `<prefix>gate.tid2eid` [vocab, k] is required; otherwise `<prefix>gate.bias` is optional.
MoeWeights load_moe(WeightLoader& w, const std::string& prefix, const MoeParams& p, int64_t hidden,
                    bool hash_routing, int64_t vocab);

// out [T, D] = sum_k weight_k * expert_k(xn) + shared(xn), in backend memory; tokens [T] (host) are the token
// ids for hash routing. Each row's routed outputs are summed in ascending expert order, independent of the
// batch. Routing runs on the host from the downloaded router logits.
void moe_forward(Backend& be, const MoeWeights& w, const MoeParams& p, TensorView xn, const int32_t* tokens,
                 TensorView out);

// Moves the matrices into the backend's memory (the router's bias and tid2eid stay on the host, where
// routing runs).
void moe_to_backend(Backend& be, MoeWeights& w, std::vector<Tensor>* storage);

}  // namespace deepinfer
