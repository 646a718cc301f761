// DeepSeek-V4 parameters. Matrices stay in their stored format (views into the mapped checkpoint,
// dequantized tile by tile when used); small vectors read by every token are fp32 copies.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "core/weight.h"
#include "model/deepseek_v4/config.h"
#include "model/moe.h"

namespace deepinfer {
class Backend;
class Checkpoint;
class WeightLoader;
}

namespace deepinfer::dsv4 {

// Hyper-connection (mHC) mixing parameters of one sublayer, or of the final head collapse.
struct HcWeights {
    Tensor fn;     // [(2 + n) * n, n * D] f32 (head: [n, n * D])
    Tensor base;   // [(2 + n) * n] f32   (head: [n])
    Tensor scale;  // [3] f32             (head: [1])
};

// Gated pooling of token projections into compressed entries.
struct CompressorWeights {
    LinearWeight wkv, wgate;  // [width, D]: width = 2c (CSA: Ca | Cb) or c (HCA)
    Tensor ape;               // [ratio, width] f32 position bias added to the gate
    Tensor norm;              // [c] f32
};

struct IndexerWeights {
    CompressorWeights compressor;  // c = index_head_dim
    LinearWeight wq_b;             // [index_heads * index_head_dim, q_lora_rank]
    LinearWeight weights_proj;     // [index_heads, D]
};

struct LayerWeights {
    HcWeights hc_attn, hc_ffn;
    Tensor attn_norm, ffn_norm;  // [D]
    LinearWeight wq_a;           // [q_lora, D]
    Tensor q_norm;               // [q_lora]
    LinearWeight wq_b;           // [H * d, q_lora]
    LinearWeight wkv;            // [d, D]
    Tensor kv_norm;              // [d]
    LinearWeight wo_a;           // [G * o_lora, H * d / G]
    LinearWeight wo_b;           // [D, G * o_lora]
    Tensor attn_sink;            // [H]
    bool has_compressor = false, has_indexer = false;
    CompressorWeights compressor;
    IndexerWeights indexer;
    MoeWeights moe;
};

struct DeepseekV4Weights {
    LinearWeight embed;  // [V, D]
    LinearWeight head;   // [V, D]
    Tensor norm;         // [D]
    HcWeights hc_head;
    std::vector<LayerWeights> layers;
    size_t stored_bytes = 0;  // bytes of all loaded matrices in their stored format
};

MoeParams moe_params(const DeepseekV4Config& config, int layer);

// `<prefix>fn` [rows, cols], `<prefix>base` [rows], `<prefix>scale` [scales] as fp32.
HcWeights load_hc(WeightLoader& w, const std::string& prefix, int rows, int64_t cols, int scales);

// Moves every weight the forward reads into the backend's memory (no-op on host backends); the copies are
// kept in `storage`, the routing tables (tid2eid, the router bias) in the MoE weights themselves.
void weights_to_backend(Backend& backend, DeepseekV4Weights& weights, std::vector<Tensor>* storage);

// Loads and validates every tensor the config calls for; errors name the file, tensor and expectation.
DeepseekV4Weights load_deepseek_v4_weights(Checkpoint& ckpt, const DeepseekV4Config& config);

}  // namespace deepinfer::dsv4
