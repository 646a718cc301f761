#include "model/deepseek_v4/config.h"

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>

#include "deepinfer/error.h"
#include "model/config_reader.h"

namespace deepinfer::dsv4 {

namespace {

using Json = nlohmann::json;

using Reader = ConfigReader;

AttnKind attn_kind_from_name(const std::string& name, const std::string& source) {
    if (name == "sliding_attention") return AttnKind::kSliding;
    if (name == "compressed_sparse_attention") return AttnKind::kCsa;
    if (name == "heavily_compressed_attention") return AttnKind::kHca;
    DI_THROW(source, ": unknown layer type \"", name,
             "\" (expected sliding_attention, compressed_sparse_attention or heavily_compressed_attention)");
}

// Fills the layer schedule: attention kind and compression ratio per layer.
void read_layer_schedule(const Reader& r, DeepseekV4Config& c) {
    int64_t csa_rate = 4, hca_rate = 128;
    if (r.has("compress_rates")) {
        const Json& rates = r.at("compress_rates");
        DI_CHECK(rates.is_object(), r.source(), ": \"compress_rates\" must be an object");
        if (rates.contains("compressed_sparse_attention"))
            csa_rate = r.integer_of(rates["compressed_sparse_attention"], "compress_rates.compressed_sparse_attention");
        if (rates.contains("heavily_compressed_attention"))
            hca_rate = r.integer_of(rates["heavily_compressed_attention"], "compress_rates.heavily_compressed_attention");
    }
    csa_rate = r.integer("compress_rate_csa", csa_rate);
    hca_rate = r.integer("compress_rate_hca", hca_rate);
    DI_CHECK(csa_rate > 0 && hca_rate > 0, r.source(), ": compression rates must be positive");

    const int n = c.num_layers;
    if (r.has("layer_types")) {
        const Json& types = r.at("layer_types");
        DI_CHECK(types.is_array() && types.size() >= static_cast<size_t>(n), r.source(),
                 ": \"layer_types\" must list at least num_hidden_layers (", n, ") entries");
        for (int i = 0; i < n; ++i) {
            DI_CHECK(types[i].is_string(), r.source(), ": layer_types[", i, "] must be a string");
            c.attn.push_back(attn_kind_from_name(types[i].get<std::string>(), r.source()));
        }
    } else if (r.has("compress_ratios")) {
        // Release form: one ratio per layer (plus entries for MTP layers, ignored here). Ratio 4 is the
        // overlapping compressor with an indexer (CSA); any other positive ratio is HCA.
        const Json& ratios = r.at("compress_ratios");
        DI_CHECK(ratios.is_array() && ratios.size() >= static_cast<size_t>(n), r.source(),
                 ": \"compress_ratios\" must list at least num_hidden_layers (", n, ") entries");
        for (int i = 0; i < n; ++i) {
            int64_t ratio = r.integer_of(ratios[i], "compress_ratios[]");
            DI_CHECK(ratio >= 0, r.source(), ": compress_ratios[", i, "] is negative");
            c.attn.push_back(ratio == 0 ? AttnKind::kSliding : ratio == 4 ? AttnKind::kCsa : AttnKind::kHca);
            c.compress_ratio.push_back(static_cast<int>(ratio));
        }
        return;
    } else {
        // transformers' default schedule: two HCA layers, then CSA and HCA alternating.
        for (int i = 0; i < n; ++i)
            c.attn.push_back(i < 2 ? AttnKind::kHca : ((i - 2) % 2 ? AttnKind::kCsa : AttnKind::kHca));
    }
    for (AttnKind k : c.attn)
        c.compress_ratio.push_back(k == AttnKind::kSliding ? 0 : static_cast<int>(k == AttnKind::kCsa ? csa_rate : hca_rate));
}

void read_routing(const Reader& r, DeepseekV4Config& c) {
    const int n = c.num_layers;
    if (r.has("mlp_layer_types")) {
        const Json& types = r.at("mlp_layer_types");
        DI_CHECK(types.is_array() && types.size() >= static_cast<size_t>(n), r.source(),
                 ": \"mlp_layer_types\" must list at least num_hidden_layers (", n, ") entries");
        for (int i = 0; i < n; ++i) {
            DI_CHECK(types[i].is_string(), r.source(), ": mlp_layer_types[", i, "] must be a string");
            const std::string t = types[i].get<std::string>();
            DI_CHECK(t == "hash_moe" || t == "moe", r.source(), ": unknown mlp layer type \"", t,
                     "\" (expected hash_moe or moe)");
            c.route.push_back(t == "hash_moe" ? RouteKind::kHash : RouteKind::kScore);
        }
    } else {
        const int64_t hash_layers = r.integer("num_hash_layers", 3);
        DI_CHECK(hash_layers >= 0, r.source(), ": num_hash_layers is negative");
        for (int i = 0; i < n; ++i) c.route.push_back(i < hash_layers ? RouteKind::kHash : RouteKind::kScore);
    }
}

// A RoPE flavour from a rope_parameters sub-dict (nested form) or from flat keys.
RopeSpec read_rope(const Json& p, const Reader& r, double theta_fallback, double partial_fallback, bool nested,
                   const char* label) {
    RopeSpec s;
    const std::string where = r.source() + ": rope_parameters." + label;
    std::string type = "default";
    if (p.is_object()) {
        if (p.contains("rope_type") && p["rope_type"].is_string()) type = p["rope_type"].get<std::string>();
        else if (p.contains("type") && p["type"].is_string()) type = p["type"].get<std::string>();
    }
    auto num = [&](const char* key, double fallback) {
        if (!p.is_object() || !p.contains(key) || p[key].is_null()) return fallback;
        DI_CHECK(p[key].is_number(), where, ".", key, " must be a number");
        return p[key].get<double>();
    };
    s.theta = num("rope_theta", theta_fallback);
    // transformers: a nested sub-dict without partial_rotary_factor rotates the whole head.
    const double partial = nested ? num("partial_rotary_factor", 1.0) : partial_fallback;
    s.dim = static_cast<int>(r.integer("head_dim") * partial);
    DI_CHECK(type == "default" || type == "yarn", where, ": unsupported rope_type \"", type,
             "\" (DeepSeek-V4 uses default or yarn)");
    if (type == "yarn") {
        s.yarn = true;
        DI_CHECK(p.contains("original_max_position_embeddings"), where,
                 ": yarn needs original_max_position_embeddings");
        s.original_max_positions = num("original_max_position_embeddings", 0);
        const double max_pos = static_cast<double>(r.integer("max_position_embeddings", 0));
        s.factor = num("factor", max_pos / s.original_max_positions);
        // transformers' `or` defaults: a zero beta means the default.
        s.beta_fast = num("beta_fast", 0) != 0 ? num("beta_fast", 0) : 32;
        s.beta_slow = num("beta_slow", 0) != 0 ? num("beta_slow", 0) : 1;
        if (p.contains("attention_factor") && !p["attention_factor"].is_null()) {
            s.attention_factor = num("attention_factor", 1.0);
        } else if (!nested) {
            s.attention_factor = 1.0;  // V4 forces 1.0 when it builds the nested form from flat keys
        } else {
            const double mscale = num("mscale", 0), mscale_all = num("mscale_all_dim", 0);
            auto get_mscale = [](double scale, double m) { return scale <= 1 ? 1.0 : 0.1 * m * std::log(scale) + 1.0; };
            s.attention_factor = (mscale != 0 && mscale_all != 0)
                                     ? get_mscale(s.factor, mscale) / get_mscale(s.factor, mscale_all)
                                     : get_mscale(s.factor, 1.0);
        }
    }
    return s;
}

void read_rope_specs(const Reader& r, DeepseekV4Config& c) {
    const double head_dim = static_cast<double>(c.head_dim);
    double partial = 64.0 / 512.0;
    if (r.has("partial_rotary_factor")) partial = r.number("partial_rotary_factor", partial);
    else if (r.has("qk_rope_head_dim")) partial = static_cast<double>(r.integer("qk_rope_head_dim")) / head_dim;
    const double main_theta = r.number("rope_theta", 10000.0);
    const double compress_theta = r.number("compress_rope_theta", 160000.0);

    const Json* params = r.has("rope_parameters") ? &r.at("rope_parameters") : nullptr;
    if (params && params->is_object() && params->contains("main") && (*params)["main"].is_object() &&
        params->contains("compress") && (*params)["compress"].is_object()) {
        c.main_rope = read_rope((*params)["main"], r, main_theta, partial, true, "main");
        c.compress_rope = read_rope((*params)["compress"], r, compress_theta, partial, true, "compress");
        return;
    }
    // Flat form: YaRN keys (rope_parameters or the legacy rope_scaling) apply to the compress flavour only.
    Json flat = Json::object();
    if (params && params->is_object()) flat = *params;
    if (r.has("rope_scaling")) {
        DI_CHECK(r.at("rope_scaling").is_object(), r.source(), ": \"rope_scaling\" must be an object");
        for (auto it = r.at("rope_scaling").begin(); it != r.at("rope_scaling").end(); ++it)
            if (!flat.contains(it.key())) flat[it.key()] = it.value();
    }
    flat.erase("rope_theta");
    c.main_rope = read_rope(Json::object(), r, main_theta, partial, false, "main");
    c.compress_rope = read_rope(flat, r, compress_theta, partial, false, "compress");
}

}  // namespace

DeepseekV4Config parse_deepseek_v4_config(const std::string& json_text, const std::string& source) {
    const Json j = parse_config_object(json_text, source);
    Reader r(j, source);
    const std::string model_type = r.string("model_type", "");
    DI_CHECK(model_type == "deepseek_v4", source, ": model_type is \"", model_type, "\", expected \"deepseek_v4\"");

    DeepseekV4Config c;
    c.vocab_size = r.integer("vocab_size");
    c.hidden_size = r.integer("hidden_size");
    c.num_layers = static_cast<int>(r.integer("num_hidden_layers"));
    c.num_heads = static_cast<int>(r.integer("num_attention_heads"));
    DI_CHECK(r.integer("num_key_value_heads", 1) == 1, source,
             ": num_key_value_heads must be 1 (DeepSeek-V4 shares one K=V head)");
    c.head_dim = static_cast<int>(r.integer("head_dim"));
    c.q_lora_rank = static_cast<int>(r.integer("q_lora_rank"));
    c.o_groups = static_cast<int>(r.integer("o_groups"));
    c.o_lora_rank = static_cast<int>(r.integer("o_lora_rank"));
    c.window = static_cast<int>(r.integer("sliding_window"));
    c.index_heads = static_cast<int>(r.integer("index_n_heads", 64));
    c.index_head_dim = static_cast<int>(r.integer("index_head_dim", 128));
    c.index_topk = static_cast<int>(r.integer("index_topk", 512));
    c.n_routed_experts = static_cast<int>(r.integer("n_routed_experts"));
    c.n_shared_experts = static_cast<int>(r.integer("n_shared_experts", 1));
    c.experts_per_token = static_cast<int>(r.integer("num_experts_per_tok"));
    c.moe_inter = static_cast<int>(r.integer("moe_intermediate_size"));
    c.routed_scaling = r.number("routed_scaling_factor", 1.0);
    c.swiglu_limit = static_cast<float>(r.number("swiglu_limit", 0.0));
    c.hc_mult = static_cast<int>(r.integer("hc_mult", 4));
    c.hc_sinkhorn_iters = static_cast<int>(r.integer("hc_sinkhorn_iters", 20));
    c.hc_eps = static_cast<float>(r.number("hc_eps", 1e-6));
    c.rms_eps = static_cast<float>(r.number("rms_norm_eps", 1e-6));
    c.max_positions = r.integer("max_position_embeddings", 0);
    c.num_mtp_layers = static_cast<int>(r.integer("num_nextn_predict_layers", 0));
    c.tie_word_embeddings = r.boolean("tie_word_embeddings", false);
    c.bos_token_id = static_cast<int>(r.integer("bos_token_id", -1));
    c.expert_dtype = r.string("expert_dtype", "");
    r.token_ids("eos_token_id", &c.eos_token_ids);

    const std::string scoring = r.string("scoring_func", "sqrtsoftplus");
    if (scoring == "sqrtsoftplus") c.scoring = ScoringFunc::kSqrtSoftplus;
    else if (scoring == "softmax") c.scoring = ScoringFunc::kSoftmax;
    else if (scoring == "sigmoid") c.scoring = ScoringFunc::kSigmoid;
    else DI_THROW(source, ": unsupported scoring_func \"", scoring, "\" (sqrtsoftplus, softmax or sigmoid)");

    if (r.has("quantization_config")) {
        const Json& q = r.at("quantization_config");
        DI_CHECK(q.is_object(), source, ": \"quantization_config\" must be an object");
        const std::string method = q.value("quant_method", std::string("fp8"));
        DI_CHECK(method == "fp8", source, ": unsupported quant_method \"", method, "\" (only fp8)");
        const std::string fmt = q.value("fmt", std::string("e4m3"));
        DI_CHECK(fmt == "e4m3", source, ": unsupported fp8 format \"", fmt, "\" (only e4m3)");
        if (q.contains("weight_block_size")) {
            const Json& b = q["weight_block_size"];
            DI_CHECK(b.is_array() && b.size() == 2 && b[0].is_number_integer() && b[1].is_number_integer() &&
                         b[0].get<int>() > 0 && b[1].get<int>() > 0,
                     source, ": quantization_config.weight_block_size must be two positive integers");
            c.fp8_block_rows = b[0].get<int>();
            c.fp8_block_cols = b[1].get<int>();
        }
    }

    auto positive = [&](int64_t v, const char* what) { DI_CHECK(v > 0, source, ": ", what, " must be positive"); };
    positive(c.vocab_size, "vocab_size");
    positive(c.hidden_size, "hidden_size");
    positive(c.num_layers, "num_hidden_layers");
    positive(c.num_heads, "num_attention_heads");
    positive(c.head_dim, "head_dim");
    positive(c.q_lora_rank, "q_lora_rank");
    positive(c.o_groups, "o_groups");
    positive(c.o_lora_rank, "o_lora_rank");
    positive(c.window, "sliding_window");
    positive(c.n_routed_experts, "n_routed_experts");
    positive(c.experts_per_token, "num_experts_per_tok");
    positive(c.moe_inter, "moe_intermediate_size");
    positive(c.hc_mult, "hc_mult");
    positive(c.hc_sinkhorn_iters, "hc_sinkhorn_iters");
    DI_CHECK(c.num_heads % c.o_groups == 0, source, ": num_attention_heads (", c.num_heads,
             ") must be a multiple of o_groups (", c.o_groups, ")");
    DI_CHECK(c.experts_per_token <= c.n_routed_experts, source, ": num_experts_per_tok exceeds n_routed_experts");

    read_layer_schedule(r, c);
    read_routing(r, c);
    read_rope_specs(r, c);
    for (const RopeSpec* rope : {&c.main_rope, &c.compress_rope})
        DI_CHECK(rope->dim > 0 && rope->dim % 2 == 0 && rope->dim <= c.head_dim, source, ": rotary dims (",
                 rope->dim, ") must be even and within head_dim (", c.head_dim, ")");
    bool any_csa = false;
    for (AttnKind k : c.attn) any_csa |= k == AttnKind::kCsa;
    if (any_csa) {
        positive(c.index_heads, "index_n_heads");
        positive(c.index_topk, "index_topk");
        DI_CHECK(c.index_head_dim >= c.compress_rope.dim, source, ": index_head_dim (", c.index_head_dim,
                 ") is smaller than the rotary dims (", c.compress_rope.dim, ")");
    }
    return c;
}

std::vector<float> rope_inv_freq(const RopeSpec& rope) {
    // Mirrors transformers: pos_freqs = base ** (arange(0, dim, 2) / dim) in fp32.
    const int half = rope.dim / 2;
    std::vector<float> inv(half);
    const float base = static_cast<float>(rope.theta);
    std::vector<float> pos_freqs(half);
    for (int i = 0; i < half; ++i)
        pos_freqs[i] = std::pow(base, static_cast<float>(2 * i) / static_cast<float>(rope.dim));
    if (!rope.yarn) {
        for (int i = 0; i < half; ++i) inv[i] = 1.0f / pos_freqs[i];
        return inv;
    }
    auto correction_dim = [&](double rotations) {
        return (rope.dim * std::log(rope.original_max_positions / (rotations * 2 * M_PI))) / (2 * std::log(rope.theta));
    };
    double low = std::max(std::floor(correction_dim(rope.beta_fast)), 0.0);
    double high = std::min(std::ceil(correction_dim(rope.beta_slow)), static_cast<double>(rope.dim - 1));
    if (low == high) high += 0.001;
    const float factor = static_cast<float>(rope.factor);
    for (int i = 0; i < half; ++i) {
        float ramp = (static_cast<float>(i) - static_cast<float>(low)) / static_cast<float>(high - low);
        ramp = std::min(std::max(ramp, 0.0f), 1.0f);
        const float extrapolation = 1.0f - ramp;
        const float inv_extra = 1.0f / pos_freqs[i];
        const float inv_inter = 1.0f / (factor * pos_freqs[i]);
        inv[i] = inv_inter * (1.0f - extrapolation) + inv_extra * extrapolation;
    }
    return inv;
}

std::string DeepseekV4Config::describe() const {
    std::ostringstream o;
    o << "DeepSeek-V4: " << num_layers << " layers, hidden " << hidden_size << ", vocab " << vocab_size << "\n";
    o << "  attention: " << num_heads << " heads x " << head_dim << " (rope main " << main_rope.dim << " theta "
      << main_rope.theta << ", compress " << compress_rope.dim << " theta " << compress_rope.theta
      << (compress_rope.yarn ? " yarn" : "") << "), q_lora " << q_lora_rank << ", window " << window << ", o_groups "
      << o_groups << " x " << o_lora_rank << "\n  layers:";
    for (int i = 0; i < num_layers; ++i) {
        o << " " << (attn[i] == AttnKind::kSliding ? "W" : attn[i] == AttnKind::kCsa ? "C" : "H");
        if (compress_ratio[i]) o << compress_ratio[i];
        o << (route[i] == RouteKind::kHash ? "/hash" : "/moe");
    }
    o << "\n  moe: " << n_routed_experts << " experts top-" << experts_per_token << " x " << moe_inter << ", "
      << n_shared_experts << " shared; indexer " << index_heads << " x " << index_head_dim << " top-" << index_topk
      << "; mHC " << hc_mult << " streams";
    return o.str();
}

}  // namespace deepinfer::dsv4
