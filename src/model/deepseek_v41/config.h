// DeepSeek-V4.1 hyper-parameters from config.json (the text model under `text_config`, or flattened).
// Differences from V4 that the config carries: compression ratios 0/1/2 with cross-layer sources (only
// kv-source layers own a compressor and compressed cache, only index sources own an indexer, the rest
// reuse the nearest source above them), two-level top-k through a candidate source, Engram n-gram layers,
// FP8 weights in 32x32 blocks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/deepseek_v4/config.h"  // RopeSpec, rope_inv_freq
#include "model/moe.h"

namespace deepinfer::dsv41 {

using dsv4::RopeSpec;

struct EngramConfig {
    std::vector<int> layer_ids;               // layers whose input streams get the n-gram lookup
    std::vector<int64_t> num_embeddings;      // table rows per Engram layer
    int max_ngram = 0;                        // n-grams of sizes 2..max_ngram
    int64_t vocab_size = 0;                   // primes are drawn upward from here
    int n_heads = 0, head_dim = 0;
    int pad_token_id = 0;                     // token id whose compressed id fills blocked lookbacks
    int64_t compressed_vocab_size = 0;        // size of the token map's image
};

struct DeepseekV41Config {
    int64_t vocab_size = 0, hidden_size = 0;
    int num_layers = 0, num_heads = 0, head_dim = 0, q_lora_rank = 0, o_groups = 0, o_lora_rank = 0, window = 0;
    std::vector<int> compress_ratio;   // per layer: 0 (window only), 1 or 2
    std::vector<int> kv_source;        // per layer: the layer whose compressed cache it reads (-1: none)
    std::vector<int> index_source;     // per layer: the layer whose top-k it uses (-1: none)
    std::vector<int> key_owner;        // per index source: the layer whose index keys it scores (-1 otherwise)
    int candidate_source = -1, candidate_topk_blocks = 0, candidate_block_size = 0;
    int index_heads = 0, index_head_dim = 0, index_topk = 0;
    RopeSpec main_rope, compress_rope;
    MoeParams moe;
    int hc_mult = 0, hc_sinkhorn_iters = 0;
    float hc_eps = 1e-6f, rms_eps = 1e-20f;
    EngramConfig engram;
    int64_t max_positions = 0;
    int num_mtp_layers = 0;
    int bos_token_id = -1, pad_token_id = -1, image_token_id = -1;
    std::vector<int> eos_token_ids;
    int fp8_block_rows = 32, fp8_block_cols = 32;
    bool has_vision = false;  // a vision tower is configured (its tensors are not loaded)

    bool is_kv_source(int l) const { return kv_source[l] == l; }
    bool is_index_source(int l) const { return index_source[l] == l; }
    bool owns_index_keys(int l) const { return is_index_source(l) && key_owner[l] == l; }
    int last_kv_source() const;
    const RopeSpec& rope_for_layer(int l) const { return compress_ratio[l] ? compress_rope : main_rope; }
    std::string describe() const;
};

DeepseekV41Config parse_deepseek_v41_config(const std::string& json_text, const std::string& source);

}  // namespace deepinfer::dsv41
