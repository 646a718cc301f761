#include "model/deepseek_v41/config.h"

#include <algorithm>
#include <nlohmann/json.hpp>
#include <sstream>

#include "deepinfer/error.h"
#include "model/config_reader.h"

namespace deepinfer::dsv41 {

namespace {

using Json = nlohmann::json;

using Reader = ConfigReader;

// The nearest layer <= l in `sources`, or -1.
int nearest_at_or_below(const std::vector<int64_t>& sources, int l) {
    int best = -1;
    for (int64_t s : sources)
        if (s <= l) best = std::max(best, static_cast<int>(s));
    return best;
}

}  // namespace

DeepseekV41Config parse_deepseek_v41_config(const std::string& json_text, const std::string& source) {
    const Json top = parse_config_object(json_text, source);
    const std::string model_type = top.value("model_type", std::string());
    DI_CHECK(model_type == "deepseek_v41", source, ": model_type is \"", model_type, "\", expected \"deepseek_v41\"");
    // The text model's keys live under text_config in the release; vLLM-style flattened configs hold them
    // at the top level.
    const Json& text = top.contains("text_config") && top["text_config"].is_object() ? top["text_config"] : top;
    Reader r(text, source);
    Reader t(top, source);

    DeepseekV41Config c;
    c.vocab_size = r.integer("vocab_size");
    c.hidden_size = r.integer("hidden_size");
    c.num_layers = static_cast<int>(r.integer("num_hidden_layers"));
    c.num_heads = static_cast<int>(r.integer("num_attention_heads"));
    DI_CHECK(r.integer("num_key_value_heads", 1) == 1, source, ": num_key_value_heads must be 1");
    c.head_dim = static_cast<int>(r.integer("head_dim"));
    c.q_lora_rank = static_cast<int>(r.integer("q_lora_rank"));
    c.o_groups = static_cast<int>(r.integer("o_groups"));
    c.o_lora_rank = static_cast<int>(r.integer("o_lora_rank"));
    c.window = static_cast<int>(r.integer("sliding_window"));
    c.index_heads = static_cast<int>(r.integer("index_n_heads"));
    c.index_head_dim = static_cast<int>(r.integer("index_head_dim"));
    c.index_topk = static_cast<int>(r.integer("index_topk"));
    c.candidate_source = static_cast<int>(r.integer("candidate_source_layer_id", -1));
    c.candidate_topk_blocks = static_cast<int>(r.integer("candidate_topk_blocks", 0));
    c.candidate_block_size = static_cast<int>(r.integer("candidate_block_size", 0));
    c.hc_mult = static_cast<int>(r.integer("hc_mult", 4));
    c.hc_sinkhorn_iters = static_cast<int>(r.integer("hc_sinkhorn_iters", 20));
    c.hc_eps = static_cast<float>(r.number("hc_eps", 1e-6));
    c.rms_eps = static_cast<float>(r.number("rms_norm_eps", 1e-20));
    c.max_positions = r.integer("max_position_embeddings", 0);
    c.num_mtp_layers = static_cast<int>(r.integer("num_nextn_predict_layers", 0));

    c.moe.num_experts = static_cast<int>(r.integer("n_routed_experts"));
    c.moe.experts_per_token = static_cast<int>(r.integer("num_experts_per_tok"));
    c.moe.moe_inter = static_cast<int>(r.integer("moe_intermediate_size"));
    c.moe.n_shared_experts = static_cast<int>(r.integer("n_shared_experts", 1));
    c.moe.routed_scaling = r.number("routed_scaling_factor", 1.0);
    c.moe.swiglu_limit = static_cast<float>(r.number("swiglu_limit", 0.0));
    c.moe.gate_temp = static_cast<float>(r.number("gate_temp", 1.0));
    const std::string scoring = text.value("scoring_func", std::string("sqrtsoftplus"));
    DI_CHECK(scoring == "sqrtsoftplus" || scoring == "softmax" || scoring == "sigmoid", source,
             ": unsupported scoring_func \"", scoring, "\"");
    c.moe.scoring = scoring == "sqrtsoftplus" ? ScoringFunc::kSqrtSoftplus
                    : scoring == "softmax"    ? ScoringFunc::kSoftmax
                                              : ScoringFunc::kSigmoid;

    for (Reader* rd : {&t, &r}) {
        if (rd->has("bos_token_id")) c.bos_token_id = static_cast<int>(rd->integer("bos_token_id"));
        if (rd->has("pad_token_id")) c.pad_token_id = static_cast<int>(rd->integer("pad_token_id"));
        if (rd->has("image_token_id")) c.image_token_id = static_cast<int>(rd->integer("image_token_id"));
        rd->token_ids("eos_token_id", &c.eos_token_ids);
    }
    c.has_vision = top.contains("vision_config") && top["vision_config"].is_object() &&
                   top["vision_config"].value("num_hidden_layers", 1) > 0;
    const Json* quant = top.contains("quantization_config") ? &top["quantization_config"]
                        : text.contains("quantization_config") ? &text["quantization_config"]
                                                               : nullptr;
    if (quant && quant->is_object()) {
        DI_CHECK(quant->value("quant_method", std::string("fp8")) == "fp8", source, ": unsupported quant_method");
        if (quant->contains("weight_block_size")) {
            const Json& b = (*quant)["weight_block_size"];
            DI_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer(), source,
                     ": quantization_config.weight_block_size must be two integers");
            c.fp8_block_rows = b[0].get<int>();
            c.fp8_block_cols = b[1].get<int>();
        }
    }

    // Layer schedule and sources.
    const std::vector<int64_t> ratios = r.integers("compress_ratios");
    DI_CHECK(ratios.size() >= static_cast<size_t>(c.num_layers), source,
             ": compress_ratios must list at least num_hidden_layers entries");
    const std::vector<int64_t> kv_sources = r.integers("kv_source_layer_ids");
    const std::vector<int64_t> index_sources = r.integers("index_source_layer_ids");
    for (int l = 0; l < c.num_layers; ++l) {
        const int ratio = static_cast<int>(ratios[l]);
        DI_CHECK(ratio == 0 || ratio == 1 || ratio == 2, source, ": compress_ratios[", l, "] = ", ratio,
                 " (DeepSeek-V4.1 uses 0, 1 or 2)");
        c.compress_ratio.push_back(ratio);
    }
    for (int l = 0; l < c.num_layers; ++l) {
        const int ratio = c.compress_ratio[l];
        c.kv_source.push_back(ratio ? nearest_at_or_below(kv_sources, l) : -1);
        c.index_source.push_back(ratio ? nearest_at_or_below(index_sources, l) : -1);
        c.key_owner.push_back(-1);
        if (!ratio) continue;
        DI_CHECK(c.kv_source[l] >= 0 && c.compress_ratio[c.kv_source[l]] == ratio, source, ": layer ", l,
                 " (ratio ", ratio, ") has no kv source layer of the same ratio at or above it");
        DI_CHECK(c.index_source[l] >= 0 && c.compress_ratio[c.index_source[l]] == ratio, source, ": layer ", l,
                 " has no index source layer of the same ratio at or above it");
    }
    for (int64_t s : kv_sources)
        DI_CHECK(s >= 0 && s < c.num_layers && c.compress_ratio[s] > 0, source, ": kv source layer ", s,
                 " must be a compressing layer");
    for (int64_t s : index_sources) {
        DI_CHECK(s >= 0 && s < c.num_layers && c.compress_ratio[s] > 0, source, ": index source layer ", s,
                 " must be a compressing layer");
        // An index source scores the keys of the nearest kv source at or above it.
        c.key_owner[s] = c.kv_source[s];
    }
    if (c.candidate_source >= 0) {
        DI_CHECK(c.candidate_source < c.num_layers && c.is_index_source(c.candidate_source), source,
                 ": candidate_source_layer_id must be an index source layer");
        DI_CHECK(c.candidate_topk_blocks > 0 && c.candidate_block_size > 0, source,
                 ": candidate_topk_blocks and candidate_block_size must be positive");
    }

    // RoPE: window-only layers use the base theta without scaling, compressing layers compress_rope_theta
    // with the YaRN parameters of rope_scaling.
    const int rope_dim = static_cast<int>(r.integer("qk_rope_head_dim"));
    c.main_rope.theta = r.number("rope_theta", 10000.0);
    c.main_rope.dim = rope_dim;
    c.compress_rope.theta = r.number("compress_rope_theta", 160000.0);
    c.compress_rope.dim = rope_dim;
    if (r.has("rope_scaling")) {
        const Json& y = r.at("rope_scaling");
        const std::string type = y.value("rope_type", y.value("type", std::string("default")));
        DI_CHECK(type == "yarn" || type == "default", source, ": unsupported rope_scaling type \"", type, "\"");
        if (type == "yarn") {
            c.compress_rope.yarn = true;
            c.compress_rope.factor = y.value("factor", 1.0);
            c.compress_rope.original_max_positions = y.value("original_max_position_embeddings", 0.0);
            c.compress_rope.beta_fast = y.value("beta_fast", 32.0);
            c.compress_rope.beta_slow = y.value("beta_slow", 1.0);
            DI_CHECK(c.compress_rope.original_max_positions > 0, source,
                     ": rope_scaling needs original_max_position_embeddings");
        }
    }

    c.engram.layer_ids.clear();
    for (int64_t l : r.integers("engram_layer_ids")) c.engram.layer_ids.push_back(static_cast<int>(l));
    if (!c.engram.layer_ids.empty()) {
        c.engram.num_embeddings = r.integers("engram_num_embeddings");
        c.engram.max_ngram = static_cast<int>(r.integer("engram_max_ngram_size"));
        c.engram.vocab_size = r.integer("engram_vocab_size");
        c.engram.n_heads = static_cast<int>(r.integer("engram_n_heads"));
        c.engram.head_dim = static_cast<int>(r.integer("engram_head_dim"));
        c.engram.pad_token_id = static_cast<int>(r.integer("engram_pad_token_id", 2));
        c.engram.compressed_vocab_size = r.integer("engram_compressed_vocab_size", 0);
        DI_CHECK(c.engram.num_embeddings.size() == c.engram.layer_ids.size(), source,
                 ": engram_num_embeddings must have one entry per engram layer");
        DI_CHECK(c.engram.max_ngram >= 2 && c.engram.n_heads > 0 && c.engram.head_dim > 0, source,
                 ": invalid Engram sizes");
        for (int l : c.engram.layer_ids)
            DI_CHECK(l >= 0 && l < c.num_layers, source, ": engram layer ", l, " is out of range");
    }

    auto positive = [&](int64_t v, const char* what) { DI_CHECK(v > 0, source, ": ", what, " must be positive"); };
    positive(c.vocab_size, "vocab_size");
    positive(c.hidden_size, "hidden_size");
    positive(c.num_layers, "num_hidden_layers");
    positive(c.num_heads, "num_attention_heads");
    positive(c.head_dim, "head_dim");
    positive(c.window, "sliding_window");
    positive(c.moe.num_experts, "n_routed_experts");
    positive(c.moe.experts_per_token, "num_experts_per_tok");
    DI_CHECK(c.num_heads % c.o_groups == 0, source, ": num_attention_heads must be a multiple of o_groups");
    DI_CHECK(rope_dim > 0 && rope_dim % 2 == 0 && rope_dim <= c.head_dim && rope_dim <= c.index_head_dim, source,
             ": qk_rope_head_dim must be even and fit head_dim and index_head_dim");
    DI_CHECK(c.head_dim % 32 == 0 && c.index_head_dim % 32 == 0, source,
             ": head_dim and index_head_dim must be multiples of 32 (quantization blocks)");
    return c;
}

int DeepseekV41Config::last_kv_source() const {
    int last = -1;
    for (int l = 0; l < num_layers; ++l)
        if (is_kv_source(l)) last = l;
    return last;
}

std::string DeepseekV41Config::describe() const {
    std::ostringstream o;
    o << "DeepSeek-V4.1: " << num_layers << " layers, hidden " << hidden_size << ", vocab " << vocab_size << "\n"
      << "  attention: " << num_heads << " heads x " << head_dim << ", rope " << main_rope.dim << ", window " << window
      << ", q_lora " << q_lora_rank << ", o_groups " << o_groups << " x " << o_lora_rank << "\n  layers:";
    for (int l = 0; l < num_layers; ++l) {
        o << " " << compress_ratio[l];
        if (is_kv_source(l)) o << "K";
        if (is_index_source(l)) o << "I";
        if (l == candidate_source) o << "C";
        if (std::find(engram.layer_ids.begin(), engram.layer_ids.end(), l) != engram.layer_ids.end()) o << "E";
    }
    o << "\n  moe: " << moe.num_experts << " experts top-" << moe.experts_per_token << " x " << moe.moe_inter
      << "; indexer " << index_heads << " x " << index_head_dim << " top-" << index_topk;
    if (has_vision) o << "\n  (vision tower configured: only the text path is loaded)";
    return o.str();
}

}  // namespace deepinfer::dsv41
