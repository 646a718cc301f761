// DeepSeek-V4 hyper-parameters, read from config.json in either of its two forms:
// DeepSeek's release keys (compress_ratios, num_hash_layers, qk_rope_head_dim, rope_scaling, ...) or
// transformers' keys (layer_types, compress_rates, mlp_layer_types, rope_parameters {main, compress}, ...).
// Both forms yield the same DeepseekV4Config; where they overlap, transformers' precedence rules apply.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/moe.h"

namespace deepinfer::dsv4 {

using deepinfer::ScoringFunc;

enum class AttnKind { kSliding, kCsa, kHca };   // window only; + overlapping compressor and indexer; + compressor
enum class RouteKind { kHash, kScore };         // experts from tid2eid[token]; or top-k of router scores

// One RoPE flavour ("main" for window-only layers, "compress" for CSA/HCA layers and the indexer).
struct RopeSpec {
    double theta = 10000.0;
    int dim = 0;                    // rotated dims: the last `dim` of each head, interleaved pairs
    bool yarn = false;
    double factor = 1.0;            // YaRN interpolation factor
    double original_max_positions = 0;
    double beta_fast = 32, beta_slow = 1;
    double attention_factor = 1.0;  // multiplies cos and sin (transformers' attention_scaling)
};

struct DeepseekV4Config {
    int64_t vocab_size = 0;
    int64_t hidden_size = 0;        // D
    int num_layers = 0;
    int num_heads = 0;              // H query heads; one shared K=V head
    int head_dim = 0;               // d
    int q_lora_rank = 0;
    int o_groups = 0;               // G
    int o_lora_rank = 0;
    int window = 0;                 // sliding window W (keys per query, self included)
    std::vector<AttnKind> attn;     // per layer
    std::vector<int> compress_ratio;  // per layer: 0 for window-only layers, else tokens per compressed entry
    std::vector<RouteKind> route;   // per layer
    RopeSpec main_rope, compress_rope;
    int index_heads = 0, index_head_dim = 0, index_topk = 0;
    int n_routed_experts = 0, n_shared_experts = 0, experts_per_token = 0, moe_inter = 0;
    ScoringFunc scoring = ScoringFunc::kSqrtSoftplus;
    double routed_scaling = 1.0;
    float swiglu_limit = 0;         // <= 0: no clamp
    int hc_mult = 0, hc_sinkhorn_iters = 0;
    float hc_eps = 1e-6f, rms_eps = 1e-6f;
    int64_t max_positions = 0;
    int num_mtp_layers = 0;
    bool tie_word_embeddings = false;
    int bos_token_id = -1;
    std::vector<int> eos_token_ids;
    int fp8_block_rows = 128, fp8_block_cols = 128;  // quantization_config.weight_block_size
    std::string expert_dtype;       // "fp4" in releases with packed experts; informational

    const RopeSpec& rope_for_layer(int layer) const {
        return attn[layer] == AttnKind::kSliding ? main_rope : compress_rope;
    }
    // Width of the per-token compressor projection: CSA keeps two series (Ca | Cb).
    int compressor_width(int layer) const { return attn[layer] == AttnKind::kCsa ? 2 * head_dim : head_dim; }
    std::string describe() const;  // one line per field group, for logs and `--verbose`
};

// Parses config.json text; `source` names the file in errors. Throws Error on missing/invalid fields.
DeepseekV4Config parse_deepseek_v4_config(const std::string& json_text, const std::string& source);

// RoPE inverse frequencies, computed as transformers does (fp32 arithmetic): [dim / 2].
std::vector<float> rope_inv_freq(const RopeSpec& rope);

}  // namespace deepinfer::dsv4
