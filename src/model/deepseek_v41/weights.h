// DeepSeek-V4.1 parameters, in the release's names and formats (FP8 32x32, FP4 experts, FP8 Engram tables).
#pragma once

#include <vector>

#include "core/tensor.h"
#include "core/weight.h"
#include "model/deepseek_v41/config.h"
#include "model/deepseek_v4/weights.h"  // HcWeights
#include "model/moe.h"

namespace deepinfer {
class Checkpoint;
}

namespace deepinfer::dsv41 {

using dsv4::HcWeights;

struct EngramWeights {
    LinearWeight table;  // [rows, head_dim] FP8 with one E8M0 scale per 32 values of a row
    LinearWeight wkv;    // [(hc + 1) * D, columns * head_dim]
    Tensor qk_weight;    // [hc, D] f32: q_weight * k_weight
};

struct LayerWeights {
    HcWeights hc_attn, hc_ffn;
    Tensor attn_norm, ffn_norm;   // [D]
    LinearWeight wq_a;            // [q_lora, D]
    Tensor q_norm;                // [q_lora]
    LinearWeight wq_b;            // [H * d, q_lora]
    LinearWeight wkv;             // [d, D]
    Tensor kv_norm;               // [d]
    LinearWeight wo_a, wo_b;      // [G * o_lora, H * d / G], [D, G * o_lora]
    Tensor attn_sink;             // [H]
    // kv sources: the compressor (ratio 2 has a gate) and the index-key projection.
    LinearWeight compressor_wkv, compressor_wgate;  // [d, D]
    Tensor compressor_norm;                         // [d]
    LinearWeight index_wk;                          // [index_head_dim, d]
    Tensor index_k_norm;                            // [index_head_dim]
    // index sources
    LinearWeight index_wq_b;          // [index_heads * index_head_dim, q_lora]
    LinearWeight index_weights_proj;  // [index_heads, D]
    MoeWeights moe;
    bool has_engram = false;
    EngramWeights engram;
};

struct DeepseekV41Weights {
    LinearWeight embed, head;  // [V, D]
    Tensor norm;               // [D]
    std::vector<LayerWeights> layers;
    size_t stored_bytes = 0;
};

DeepseekV41Weights load_deepseek_v41_weights(Checkpoint& ckpt, const DeepseekV41Config& config);

}  // namespace deepinfer::dsv41
